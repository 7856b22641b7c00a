"""sparkdiag's own state: the baseline store that the probe compares with."""

from __future__ import annotations

from sparkdiag.check.model import CheckContext, CheckResult, no_gpu_skip

NAME = "baseline-store"


def check_baseline_store(ctx: CheckContext) -> list[CheckResult]:
    """The store opens and passes SQLite's integrity check (pass); none yet (skip); unusable:
    full disk, damaged or unreadable file (warn: the probe then compares with published
    references only, and the daemon learns nothing)."""
    report = ctx.baseline_store
    if report is None:
        return [CheckResult(NAME, "skip", "the baseline store was not looked at")]
    data = {
        "state": report.state,
        "path": str(report.path) if report.path else None,
        "baselines": report.baselines,
    }
    if report.state == "ok":
        return [CheckResult(NAME, "pass", f"{report.detail} in {report.path}", data=data)]
    if report.state == "absent" and not ctx.gpus_up():  # nothing to learn one from here
        return [no_gpu_skip(NAME, ctx.snapshot, **data)]
    if report.state == "absent":
        return [
            CheckResult(
                NAME,
                "skip",
                f"{report.detail}: the probe compares with published figures only",
                "run 'sparkdiag serve' (or 'sparkdiag probe') on the healthy machine to learn "
                "baselines",
                data=data,
            )
        ]
    return [
        CheckResult(
            NAME,
            "warn",
            f"baseline store unusable: {report.detail}",
            "check free space and permissions of the state directory; a damaged file: move it "
            "aside (sparkdiag learns new baselines) and restart sparkdiag",
            data=data,
        )
    ]
