"""The stalled-GPU signature (``SparkdiagGpuStalled``): NVML says the GPU is busy, nothing moves.

NVML's utilization counts the time a kernel is resident, not work done. A kernel that waits
(a hung NCCL collective, a spin on a flag) keeps it at 100 % while the SMs, DRAM and tensor
pipes do nothing: on the lent H200 a spinning kernel (``torch.cuda._sleep``) read utilization
1.0 with GPM SM activity 0.0076, DRAM 4e-6, tensor 0, at 123 W of 700 (80 W idle).

The rule (METRICS.md, 2026-12-01), where GPM answers: utilization >= 0.9, SM activity < 0.3,
DRAM activity < 0.01 and no tensor activity (exactly 0).

Where GPM is absent, only on a unified-memory GPU (GB10: DGX Spark and its OEM siblings), from
the public reports of wedged collectives there: utilization >= 0.9 while the GPU draws under
30 W (eugr/spark-vllm-docker#260: ~96 % at 16-27 W, "idle wattage", against ~45 W average
healthy and ~46 W in a long prefill, and the reporter's own threshold "below ~30 W";
vllm-project/vllm#41725: ~96 % at ~20 W), with the SM clock at least half its default
applications clock. The clock condition keeps the GB10's low-power states out (the USB-PD slow
state drew 19.5 W under load at 799 MHz, Blackwellboy/model-serving-minefield#55; the ~30 W
power-safety mode runs near 610 MHz): those are real work held slow, ``SparkdiagGpuSlowState``'s
case, not a kernel that waits. A dedicated-memory GPU without GPM (before Hopper) is not judged:
no public evidence gives a power level that separates a spin from light work there.

``prometheus/sparkdiag-rules.yml`` holds the same rule in PromQL; ``check`` samples it for a
few seconds; :class:`StallLog` logs each episode once in the daemon.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sparkdiag.snapshot import GpuSample, Snapshot

log = logging.getLogger(__name__)

BUSY_UTILIZATION = 0.9
SM_ACTIVITY_BELOW = 0.3
DRAM_ACTIVITY_BELOW = 0.01
FALLBACK_POWER_BELOW_WATTS = 30.0
FALLBACK_CLOCK_FRACTION = 0.5
ACTION = (
    "find the process that holds the GPU (nvidia-smi, or sparkdiag_gpu_process_* with "
    "--process-metrics), dump its stacks (py-spy dump --pid PID; for a collective also "
    "NCCL_DEBUG=INFO and the peers' logs) and restart it; on a DGX Spark, hung NCCL collectives "
    "were cured by the DGX OS NCCL in place of a pip-installed one (vllm-project/vllm#41725)"
)


@dataclass(frozen=True)
class Stall:
    """Why a sample matches the signature. ``basis``: "gpm" or "power" (the GB10 fallback)."""

    basis: str
    utilization: float
    sm: float | None = None
    dram: float | None = None
    tensor: float | None = None
    power_watts: float | None = None

    def describe(self) -> str:
        if self.basis == "gpm":
            return (
                f"utilization {self.utilization:.0%} while SM activity is {_pct(self.sm)}, "
                f"DRAM {_pct(self.dram)} and tensor {_pct(self.tensor)} (GPM)"
            )
        return (
            f"utilization {self.utilization:.0%} at {self.power_watts:.0f} W with the clock up "
            "(no GPM here: a unified-memory GPU under 30 W)"
        )


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value * 100:.3g}%"


def _reference_clock(gpu: GpuSample) -> float | None:
    """The default applications clock (SM, else graphics), as the rule reads it."""
    clocks = gpu.clock_default_applications_hertz
    return clocks.get("sm") or clocks.get("graphics")


def stall_signature(gpu: GpuSample) -> Stall | None:
    """The signature in one sample of one GPU, or None (not busy, working, or not judged)."""
    if not gpu.up:
        return None
    util = gpu.utilization_ratio.get("gpu")
    if util is None or util < BUSY_UTILIZATION:
        return None
    act = gpu.activity_ratio
    if act:
        if not {"sm", "dram", "tensor"} <= act.keys():
            return None
        if (
            act["sm"] < SM_ACTIVITY_BELOW
            and act["dram"] < DRAM_ACTIVITY_BELOW
            and act["tensor"] == 0
        ):
            return Stall("gpm", util, act["sm"], act["dram"], act["tensor"], gpu.power_watts)
        return None
    if gpu.identity.memory_model != "unified":
        return None
    power, clock, reference = gpu.power_watts, gpu.clock_hertz.get("sm"), _reference_clock(gpu)
    if power is None or power >= FALLBACK_POWER_BELOW_WATTS:
        return None
    if clock is None or reference is None or clock < FALLBACK_CLOCK_FRACTION * reference:
        return None
    return Stall("power", util, power_watts=power)


class StallLog:
    """A poll listener that logs each stall episode of each GPU once: a warning when the
    signature has held for ``after`` seconds, and a line when it has been gone as long (so a
    flapping reading is one episode, not a line per poll)."""

    def __init__(self, after: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.after = after
        self.clock = clock
        self._since: dict[int, float] = {}
        self._last_seen: dict[int, float] = {}
        self._logged: set[int] = set()

    def __call__(self, snap: Snapshot) -> None:
        now = self.clock()
        for gpu in snap.gpus:
            index = gpu.identity.index
            stall = stall_signature(gpu)
            if stall is not None:
                since = self._since.setdefault(index, now)
                self._last_seen[index] = now
                if index not in self._logged and now - since >= self.after:
                    self._logged.add(index)
                    log.warning(
                        "GPU %d (%s): stalled for %.0f s: %s: a kernel waits (a hung collective "
                        "or a spin), it does not work. To do: %s",
                        index,
                        gpu.identity.uuid,
                        now - since,
                        stall.describe(),
                        ACTION,
                    )
            elif index in self._since and now - self._last_seen[index] >= self.after:
                if index in self._logged:
                    log.info(
                        "GPU %d (%s): no longer stalled (the episode lasted %.0f s)",
                        index,
                        gpu.identity.uuid,
                        self._last_seen[index] - self._since[index],
                    )
                self._logged.discard(index)
                del self._since[index], self._last_seen[index]
