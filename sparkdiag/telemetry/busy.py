"""The one rule for "is this GPU busy?", shared by the daemon's probe scheduler and ``check``.

A GPU is busy when NVML lists a compute process on it that is not sparkdiag's own (its probe
worker, the checking process), or when its utilization is above the threshold (another
container or VM whose processes this PID namespace cannot see). The probe worker applies the
same rule again from inside its own process, just before and during its kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sparkdiag.snapshot import GpuSample


@dataclass(frozen=True)
class Busy:
    """Evidence that a GPU is busy.

    other_pids: compute processes on the GPU that are not sparkdiag's own (may be empty)
    utilization: NVML GPU utilization, 0..1, when it is above the threshold, else None
    """

    other_pids: tuple[int, ...]
    utilization: float | None

    def describe(self, name_pid: Callable[[int], str] | None = None) -> str:
        """One line: "pid 601 (python3), pid 602" or "utilization 99%"."""
        if self.other_pids:
            shown = ", ".join((name_pid or _plain)(p) for p in self.other_pids[:3])
            more = f" and {len(self.other_pids) - 3} more" if len(self.other_pids) > 3 else ""
            return shown + more
        return f"utilization {self.utilization:.0%}" if self.utilization is not None else "busy"


def _plain(pid: int) -> str:
    return f"pid {pid}"


def other_pids(gpu: GpuSample, own: frozenset[int]) -> tuple[int, ...]:
    """Compute processes on ``gpu`` that are not in ``own``; () when the list is unsupported."""
    return tuple(p for p in gpu.compute_pids or () if p not in own)


def busy(gpu: GpuSample, own: frozenset[int], threshold: float) -> Busy | None:
    """Why ``gpu`` counts as busy, or None when it is idle (``own``: sparkdiag's own pids)."""
    others = other_pids(gpu, own)
    util = gpu.utilization_ratio.get("gpu")
    high = util if util is not None and util > threshold else None
    if others or high is not None:
        return Busy(others, high)
    return None
