"""Why the two measured sides of a comparison differ (libraries, another process, throttling,
the environment), with what to do about it. Why a side could not be measured at all is
:mod:`sparkdiag.probe.diagnosis`, shared with the daemon's container probe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkdiag.compare.model import Comparison
from sparkdiag.sources.nvml.gpu import THROTTLE_REASONS

# A side whose mean SM clock is below this fraction of the other's ran throttled.
CLOCK_DROP = 0.95


def _caveats(comparison: Comparison) -> str:
    """What an OK verdict rests on that it may not bear: both sides on the CPU (native's torch
    without CUDA compares CPU GEMMs, not the GPU), or one measured round (no spread to tell
    noise from a gap). Both read as a plain OK, exit 0 (found in a review)."""
    said = []
    asked = "--device" in comparison.worker_args  # --device cpu: the CPU is what was asked
    if comparison.native.software.get("device") == "cpu" and not asked:
        said.append(
            "both sides ran on the CPU: native's torch has no CUDA, so this compares CPU "
            "GEMMs, not the GPU (--native-python a Python whose torch has CUDA)"
        )
    if comparison.rounds < 2:
        said.append("one measured round: no spread to tell noise from a gap (--rounds 3)")
    return "".join(f"; but {line}" for line in said)


def explain(comparison: Comparison, max_gap: float) -> str:
    """Why the sides differ (or fail), as far as the two documents can tell."""
    if comparison.failures:
        return comparison.failures[0].message
    if comparison.failed_rows:
        row = comparison.failed_rows[0]
        more = len(comparison.failed_rows) - 1
        said = "; ".join(
            f"{role}: {reason or status}"
            for role, status, reason in (
                ("native", row.native_status, row.native_reason),
                ("container", row.container_status, row.container_reason),
            )
            if status == "error"
        )
        return (
            f"a kernel failed: {row.key} ({said})"
            + (f" (and {more} more)" if more else "")
            + "; a kernel that fails on one side is no figure to compare: read that side's "
            "error, and run the probe there alone (sparkdiag probe, natively or in the image)"
        )
    if comparison.other_gpu:
        shown = ", ".join(
            f"{d.component} {d.native} vs {d.container}" for d in comparison.other_gpu
        )
        return (
            f"not comparable: the sides ran on different GPUs ({shown}); give both the same one "
            "(--device cuda:N natively, the same device to the container)"
        )
    worst = comparison.worst_row
    if worst is None or worst.gap is None:
        return "no kernel was measured on both sides; see each row's note"
    libs = comparison.library_differences
    lib_text = ", ".join(f"{d.component} {d.native} vs {d.container}" for d in libs)
    if worst.gap <= max_gap:
        text = f"within {max_gap:.0%}: the container delivers what native does"
        if libs:
            text += f" (with different libraries: {lib_text})"
        return text + _caveats(comparison)
    reasons: list[str] = []
    timed = comparison.timed_apart(max_gap)
    if timed:
        reasons.append(
            f"the sides timed {', '.join(timed)} differently (CUDA graph replays on one, "
            "launches timed as they went on the other, which counts their gaps): the gap may "
            "be the timing method's; read each side's stderr for why graph capture failed"
        )
    uuid_diff = [d for d in comparison.differences if d.component == "gpu_uuid"]
    if uuid_diff:
        reasons.append(
            "the sides probed different GPUs: pass the same one to both "
            "(--device cuda:N natively, the same device to the container)"
        )
    if libs:
        reasons.append(
            f"the sides run different libraries ({lib_text}): the gap may come from them "
            "rather than from the container; to measure the environment alone, install "
            "natively the torch/CUDA/cuBLAS the image has, and compare again"
        )
    shared = _sharing_text(comparison.native.conditions, comparison.container.conditions)
    if shared:
        reasons.append(shared)
    throttled = _throttle_text(comparison.native.conditions, comparison.container.conditions)
    if throttled and not shared:
        reasons.append(throttled)
    if not reasons:
        slow = [r for r in comparison.measured_rows if (r.gap or 0.0) > max_gap]
        if slow and all(r.kind == "decode" for r in slow):
            reasons.append(
                "same libraries and GPU, and only the small-M (decode) shapes are slower: "
                "kernel launches are CPU-bound there, so the container's CPU side is the "
                "bottleneck (CPU quota or cpuset, cgroup throttling, seccomp, emulation)"
            )
        elif slow and all(r.kind == "bandwidth" for r in slow):
            reasons.append(
                "same libraries and GPU, and only memory bandwidth is lower: look at the "
                "container's memory placement and limits (NUMA binding, --memory, --shm-size)"
            )
        else:
            reasons.append(
                "same libraries, same GPU, no throttling seen: the slowdown comes from the "
                "container environment itself (runtime options, CPU/memory limits, "
                "--ipc/--shm-size, a virtualised or MPS-shared GPU path)"
            )
    return "; ".join(reasons)


def _sharing_text(native: Mapping[str, Any], container: Mapping[str, Any]) -> str | None:
    """A line when other processes computed on the GPU during the container's rounds only."""
    extra = sorted(set(container.get("other_pids") or ()) - set(native.get("other_pids") or ()))
    if not extra:
        return None
    return (
        f"another process computed on the GPU during the container's rounds (pid "
        f"{', '.join(map(str, extra))}): the two sides did not have the GPU alike; stop it and "
        "compare again (leave --probe.when at idle to have such rounds skipped)"
    )


def _throttle_text(native: Mapping[str, Any], container: Mapping[str, Any]) -> str | None:
    """A line when the container's rounds ran at clearly lower clocks or throttled."""
    parts = []
    n_clock, c_clock = native.get("mean_sm_clock_hertz"), container.get("mean_sm_clock_hertz")
    if (
        isinstance(n_clock, float)
        and isinstance(c_clock, float)
        and 0 < c_clock < CLOCK_DROP * n_clock
    ):
        parts.append(
            f"the container's rounds ran at a lower SM clock "
            f"({c_clock / 1e6:.0f} vs {n_clock / 1e6:.0f} MHz)"
        )
    n_reasons = set(native.get("clock_event_reasons") or ())
    c_reasons = set(container.get("clock_event_reasons") or ())
    new = sorted((c_reasons - n_reasons) & THROTTLE_REASONS)
    if new:
        parts.append("only the container's rounds saw " + ", ".join(new))
    if not parts:
        return None
    return (
        " and ".join(parts)
        + ": the GPU throttled (heat or power), which is not the container's doing; let it cool, "
        "and compare again"
    )
