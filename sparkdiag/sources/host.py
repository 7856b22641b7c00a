"""Host readings through psutil: the only module that imports ``psutil``."""

from __future__ import annotations

import os

import psutil

from sparkdiag.telemetry.snapshot import HostSample


def memory_total() -> int | None:
    """Host MemTotal in bytes (``grep MemTotal /proc/meminfo``)."""
    try:
        return int(psutil.virtual_memory().total)
    except (OSError, RuntimeError):
        return None


def read_host() -> HostSample:
    """Host memory in bytes (``free -b``): total, available, free, and page cache (``cached``).

    On a unified-memory machine (GB10) this memory is also the GPU's, so available memory and
    page cache are GPU health signals there.
    """
    vm = psutil.virtual_memory()
    values = {"total": float(vm.total), "available": float(vm.available), "free": float(vm.free)}
    cached = getattr(vm, "cached", None)
    if cached is not None:
        values["cached"] = float(cached)
    return HostSample(memory_bytes=values)


def process_resources(pid: int | None = None) -> tuple[float, float]:
    """(resident set size in bytes, CPU seconds user+system) of a process (``ps -o rss,time``)."""
    proc = psutil.Process(pid or os.getpid())
    times = proc.cpu_times()
    return float(proc.memory_info().rss), float(times.user + times.system)
