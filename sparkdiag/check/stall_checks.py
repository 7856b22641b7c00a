"""A stalled GPU: busy by NVML while nothing moves (the ``SparkdiagGpuStalled`` signature,
:mod:`sparkdiag.telemetry.stall`), judged over a few seconds of samples.

A GPU that reads below 90 % utilization at the first poll is not sampled (it cannot be stalled),
so an idle machine's ``check`` pays nothing for this. A busy one is polled
:data:`STALL_SAMPLES` more times :data:`STALL_INTERVAL` seconds apart: GPM answers for the time
between two polls, so the samples after the first are the ones judged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from sparkdiag.check.gpu_checks import each_gpu
from sparkdiag.check.model import CheckContext, CheckResult
from sparkdiag.check.model import gpu_index as _idx
from sparkdiag.snapshot import GpuSample, Snapshot
from sparkdiag.sources.nvml.driver import NvmlHung
from sparkdiag.telemetry.stall import ACTION, BUSY_UTILIZATION, stall_signature

STALL_SAMPLES = 5
STALL_INTERVAL = 0.6


def sample_busy_gpus(
    first: Snapshot,
    poll: Callable[[], Snapshot],
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, tuple[GpuSample, ...]]:
    """GPU index -> samples of the GPUs busy (utilization >= 0.9) at the first poll ({} when
    none is, without polling again). A poll that NVML did not answer (:class:`NvmlHung`) ends
    the sampling with the samples taken so far kept (a GPU stalled in 4 samples of 5 before
    the hang was reported as not sampled: a review); ``poll`` says why (its ``lost``)."""
    busy = {
        g.identity.index
        for g in first.gpus
        if g.up and g.utilization_ratio.get("gpu", 0.0) >= BUSY_UTILIZATION
    }
    samples: dict[int, list[GpuSample]] = {index: [] for index in busy}
    for _ in range(STALL_SAMPLES if busy else 0):
        sleep(STALL_INTERVAL)
        try:
            snapshot = poll()
        except NvmlHung:
            break
        for g in snapshot.gpus:
            if g.identity.index in samples:
                samples[g.identity.index].append(g)
    return {index: tuple(found) for index, found in samples.items()}


def _stall(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """A GPU at >= 90 % utilization whose SMs, DRAM and tensor pipes do nothing fails."""
    util = gpu.utilization_ratio.get("gpu")
    if util is None:
        return CheckResult(
            "stall", "skip", "NVML reports no utilization for this GPU", gpu=_idx(gpu)
        )
    samples: Mapping[int, tuple[GpuSample, ...]] = ctx.stall_samples
    taken = samples.get(gpu.identity.index)
    if not taken and ctx.nvml_lost is not None and util >= BUSY_UTILIZATION:
        return CheckResult(
            "stall",
            "skip",
            f"busy, not sampled: {ctx.nvml_lost}",
            gpu=_idx(gpu),
            data={"see": "nvml"},
        )
    if not taken:
        return CheckResult(
            "stall",
            "pass",
            f"not stalled: utilization {util:.0%}",
            gpu=_idx(gpu),
            data={"utilization": util},
        )
    stalls = [s for s in map(stall_signature, taken) if s is not None]
    judged = [
        s for s in taken if s.up and (s.activity_ratio or s.identity.memory_model == "unified")
    ]
    seconds = len(taken) * STALL_INTERVAL
    data = {"samples": len(taken), "stalled": len(stalls), "seconds": seconds}
    if not judged:
        return CheckResult(
            "stall",
            "skip",
            f"busy (utilization {util:.0%}); without GPM activity sparkdiag does not judge a stall "
            "on a dedicated-memory GPU",
            gpu=_idx(gpu),
            data=data,
        )
    if stalls and len(stalls) == len(taken):
        return CheckResult(
            "stall",
            "fail",
            f"stalled for {seconds:.0f} s: {stalls[-1].describe()}: a kernel waits (a hung "
            "collective or a spin), it does not work",
            ACTION,
            _idx(gpu),
            {**data, "basis": stalls[-1].basis},
        )
    if stalls:
        return CheckResult(
            "stall",
            "warn",
            f"the stall signature in {len(stalls)} of {len(taken)} samples over {seconds:.0f} s "
            f"({stalls[-1].describe()})",
            "run sparkdiag check again; if it holds, " + ACTION,
            _idx(gpu),
            data,
        )
    last = taken[-1]
    moving = ", ".join(f"{k} {v:.0%}" for k, v in sorted(last.activity_ratio.items()))
    found = f"busy and working over {seconds:.0f} s" + (f" ({moving})" if moving else "")
    return CheckResult("stall", "pass", found, gpu=_idx(gpu), data=data)


check_stall = each_gpu("stall", _stall)
