"""The latest ``sparkdiag soak`` per GPU: its age and whether throughput held when hot.

It reads ``soak.json`` in the state directory (never the GPU): pass when every kernel held at
least 0.9 of its cold throughput, fail when a kernel gave a wrong result (or failed) in a
window, warn when one fell below (or the soak failed, or stopped on a hardware slowdown), skip
when no soak was run yet or the last one was interrupted before a fall was seen (what held for
seconds is no pass). A ``--device cpu`` test soak is shown as what
it is, a smoke test that ran (skip): a CPU measures its own noise, not heat, so it never warns
about cooling.
"""

from __future__ import annotations

from typing import Any

from sparkdiag.check.model import CheckContext, CheckResult, no_gpu_skip, state_action
from sparkdiag.check.thermal_checks import THERMAL_ACTION
from sparkdiag.soak.render import SENSOR_WORDS, fraction
from sparkdiag.soak.state import GpuState, KernelState
from sparkdiag.soak.verdict import FALL_FRACTION

NAME = "soak"
RUN_SOAK = "run 'sparkdiag soak' (10 minutes by default) on an idle machine"
FELL_ACTION = (
    "these kernels lose throughput as the GPU heats up: check cooling, airflow and fans, and "
    "compare with the thermal-int4 reports; 'sparkdiag soak --plot DIR' shows where it falls"
)


# a kernel that computed a wrong result under load (found in a review: it read unsupported)
WRONG_ACTION = (
    "a kernel gave wrong results (or failed) under load: look for XID errors (sudo dmesg | grep "
    "-i xid) and ECC errors (nvidia-smi -q -d ECC), run the soak again ('sparkdiag soak --json "
    "FILE' keeps each window's error); a GPU that repeats it needs service"
)


def age(seconds: float) -> str:
    """``just now``, ``12 min ago``, ``5 h ago``, ``3 days ago``."""
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def _celsius(value: float | None, sensor: str | None) -> str:
    if value is None:
        return ""
    return f" at {value:.0f} °C {SENSOR_WORDS.get(sensor or '', sensor or '')}".rstrip()


def _fell(k: KernelState, sensor: str | None) -> str:
    shown = fraction(k.fell_fraction) if k.fell_fraction is not None else "?"
    return f"{k.label} fell to {shown} of cold{_celsius(k.fell_celsius, sensor)}"


def _judge(g: GpuState, now: float, gpu: str | None) -> CheckResult:
    when = f"soak {age(now - g.finished_at)}"
    ran = f" after {g.elapsed_seconds:.0f} s" if g.elapsed_seconds is not None else ""
    hot = ""
    if g.max_celsius is not None:
        hot = f", {SENSOR_WORDS.get(g.sensor or '', g.sensor)} up to {g.max_celsius:.0f} °C"
    head = f"{when} ({g.stopped}{ran}{hot})"
    data: dict[str, Any] = {
        "finished_at": g.finished_at,
        "age_seconds": now - g.finished_at,
        "stopped": g.stopped,
        "reason": g.reason,
        "sensor": g.sensor,
        "max_celsius": g.max_celsius,
        "degraded": [k.label for k in g.degraded],
        "failed": [k.label for k in g.failed],
        "lowest_fraction": {k.label: k.lowest_fraction for k in g.judged},
    }
    if g.stopped == "error":
        return CheckResult(
            NAME,
            "warn",
            f"{when} failed: {g.reason or 'no reason given'}",
            f"{RUN_SOAK} again; --json FILE keeps the worker's error output",
            gpu,
            data,
        )
    if g.failed:
        wrong = ", ".join(k.label for k in g.failed)
        finding = f"{head}: wrong or failed results: {wrong}"
        return CheckResult(NAME, "fail", finding, WRONG_ACTION, gpu, data)
    if g.degraded:
        fell = "; ".join(_fell(k, g.sensor) for k in g.degraded)
        return CheckResult(NAME, "warn", f"{head}: {fell}", FELL_ACTION, gpu, data)
    if g.stopped in ("hw_thermal_slowdown", "hw_slowdown"):
        return CheckResult(
            NAME,
            "warn",
            f"{head}: stopped by a hardware slowdown ({g.reason})",
            THERMAL_ACTION,
            gpu,
            data,
        )
    if not g.judged:
        return CheckResult(
            NAME,
            "skip",
            f"{head}: measured nothing to judge ({g.reason or g.stopped})",
            f"{RUN_SOAK}, and let it run",
            gpu,
            data,
        )
    if g.stopped == "interrupted":  # a fall it saw warns above; what held so far is no pass
        return CheckResult(
            NAME,
            "skip",
            f"{head}: interrupted before the GPU was hot for long; no kernel fell so far",
            f"{RUN_SOAK}, and let it run",
            gpu,
            data,
        )
    low = min(g.judged, key=lambda k: k.lowest_fraction or 0.0)
    lowest = f"{low.lowest_fraction:.2f}" if low.lowest_fraction is not None else "?"
    return CheckResult(
        NAME,
        "pass",
        f"{head}: {len(g.judged)} kernels held {FALL_FRACTION:g} of cold (lowest {lowest}, "
        f"{low.label})",
        gpu=gpu,
        data=data,
    )


def _cpu_run(g: GpuState, now: float) -> CheckResult:
    """A ``--device cpu`` test soak: what ran, no verdict."""
    ran = f" after {g.elapsed_seconds:.0f} s" if g.elapsed_seconds is not None else ""
    measured = [k for k in g.kernels if k.lowest_fraction is not None]
    what = f"{len(measured)} kernels ran" if measured else "measured nothing"
    if g.stopped == "error":
        what = f"failed: {g.reason or 'no reason given'}"
    data = {
        "finished_at": g.finished_at,
        "age_seconds": now - g.finished_at,
        "stopped": g.stopped,
        "reason": g.reason,
        "thermal": False,
    }
    return CheckResult(
        NAME,
        "skip",
        f"CPU test soak {age(now - g.finished_at)} ({g.stopped}{ran}): {what}; a CPU soak "
        "(--device cpu) is a smoke test with no thermal verdict",
        data=data,
    )


def check_soak(ctx: CheckContext) -> list[CheckResult]:
    """Per GPU, the latest ``sparkdiag soak`` (``soak.json`` in the state directory) and its
    age: every kernel held at least 0.9 of its cold throughput passes; a kernel that gave a
    wrong result (or failed) in a window fails; one fell below, the soak failed or stopped on a
    hardware slowdown warns; none yet, or a CPU test soak, skips."""
    report = ctx.soak
    if report is None:
        return [CheckResult(NAME, "skip", "the soak state was not looked at")]
    if report.state == "absent" and not ctx.gpus_up():  # nothing to soak here
        return [no_gpu_skip(NAME, ctx.snapshot)]
    if report.state == "absent":
        return [
            CheckResult(
                NAME,
                "skip",
                report.detail,
                f"{RUN_SOAK} to see whether throughput holds when the GPU is hot",
            )
        ]
    if report.state == "unusable" or report.soak is None:
        return [
            CheckResult(
                NAME,
                "warn",
                f"soak state unusable: {report.detail}",
                state_action(
                    report.detail,
                    "check the state directory's permissions; a damaged file: remove it and run "
                    "'sparkdiag soak' again",
                ),
            )
        ]
    now = ctx.snapshot.timestamp
    by_uuid = {g.identity.uuid: g for g in ctx.snapshot.gpus}
    results = []
    for entry in report.soak.gpus:
        if entry.is_cpu:
            results.append(_cpu_run(entry, now))
            continue
        seen = by_uuid.pop(entry.uuid, None) if entry.uuid else None
        gpu = str(seen.identity.index) if seen is not None else entry.gpu
        results.append(_judge(entry, now, gpu))
    for sample in by_uuid.values():
        if sample.up:
            index = str(sample.identity.index)
            results.append(CheckResult(NAME, "skip", "no soak of this GPU yet", RUN_SOAK, index))
    return results
