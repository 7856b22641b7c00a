"""Host readings: the only module that imports ``psutil`` (for a process's resources).

Host memory for the exporter and the checks is read from procfs under ``--path.rootfs``
(:mod:`sparkdiag.sources.host.meminfo`), so that a fixture root can stand in for the machine.
"""

from __future__ import annotations

import os
from pathlib import Path

from sparkdiag.sources.host.meminfo import meminfo_bytes, read_proc_file


def memory_total() -> int | None:
    """Host MemTotal in bytes (``grep MemTotal /proc/meminfo``; the figure psutil's
    ``virtual_memory().total`` reads on Linux), read without importing psutil: the daemon needs
    it once, at start, and psutil would cost it about 1 MiB of RSS (docs/daemon-cost.md)."""
    text = read_proc_file(Path("/proc/meminfo"))
    total = meminfo_bytes(text).get("MemTotal") if text is not None else None
    return int(total) if total else None


def process_resources(pid: int | None = None) -> tuple[float, float]:
    """(resident set size in bytes, CPU seconds user+system) of a process (``ps -o rss,time``)."""
    import psutil

    proc = psutil.Process(pid or os.getpid())
    times = proc.cpu_times()
    return float(proc.memory_info().rss), float(times.user + times.system)
