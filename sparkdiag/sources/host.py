"""Host readings through psutil: the only module that imports ``psutil``.

Host memory for the exporter and the checks is read from procfs under ``--path.rootfs``
(:mod:`sparkdiag.sources.meminfo`), so that a fixture root can stand in for the machine.
"""

from __future__ import annotations

import os

import psutil


def memory_total() -> int | None:
    """Host MemTotal in bytes (``grep MemTotal /proc/meminfo``)."""
    try:
        return int(psutil.virtual_memory().total)
    except (OSError, RuntimeError):
        return None


def process_resources(pid: int | None = None) -> tuple[float, float]:
    """(resident set size in bytes, CPU seconds user+system) of a process (``ps -o rss,time``)."""
    proc = psutil.Process(pid or os.getpid())
    times = proc.cpu_times()
    return float(proc.memory_info().rss), float(times.user + times.system)
