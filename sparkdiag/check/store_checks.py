"""sparkdiag's own state: the baseline store that the probe compares with."""

from __future__ import annotations

from sparkdiag.check.model import (
    CheckContext,
    CheckResult,
    elsewhere_action,
    no_gpu_skip,
    state_action,
)

NAME = "baseline-store"


def check_baseline_store(ctx: CheckContext) -> list[CheckResult]:
    """The store opens, passes SQLite's integrity check and holds baselines (pass); none yet, no
    file or an empty one (skip: nothing of this machine's own to compare with); unusable: full
    disk, damaged or unreadable file (warn: the probe then compares with published references
    only, and the daemon learns nothing)."""
    report = ctx.baseline_store
    if report is None:
        return [CheckResult(NAME, "skip", "the baseline store was not looked at")]
    data = {
        "state": report.state,
        "path": str(report.path) if report.path else None,
        "baselines": report.baselines,
    }
    if report.state == "ok" and report.baselines:
        return [CheckResult(NAME, "pass", f"{report.detail} in {report.path}", data=data)]
    if report.state in ("absent", "ok") and not ctx.gpus_up():  # nothing to learn one from here
        return [no_gpu_skip(NAME, ctx.snapshot, **data)]
    if report.state in ("absent", "ok"):
        what = report.detail if report.state == "absent" else f"no baselines yet in {report.path}"
        learn = (
            "run 'sparkdiag serve' (or 'sparkdiag probe') on the healthy machine to learn baselines"
        )
        return [
            CheckResult(
                NAME,
                "skip",
                f"{what}: the probe compares with published figures only",
                elsewhere_action(ctx, "its baselines") or learn,
                data=data,
            )
        ]
    if "newer than the" in report.detail:  # a store another sparkdiag wrote: keep it
        action = (
            "run the sparkdiag that wrote it (upgrade this one); moving it aside loses its "
            "baselines"
        )
    else:
        action = state_action(
            report.detail,
            "check free space and permissions of the state directory; a damaged file: move it "
            "aside (sparkdiag learns new baselines) and restart sparkdiag",
        )
    finding = f"baseline store unusable: {report.detail}"
    return [CheckResult(NAME, "warn", finding, action, data=data)]
