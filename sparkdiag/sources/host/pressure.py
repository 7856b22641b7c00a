"""Host memory and I/O pressure: pressure stall information (PSI), available memory and swap.

Read under configurable roots (``--path.rootfs`` for ``/proc``, ``--path.sysfs`` for the cgroup
tree), so a fake tree can stand in for the machine; nothing here raises for a file that is
missing (a kernel without PSI, a cgroup v1 host) or unreadable: the value is left out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sparkdiag.sources.host.meminfo import (
    meminfo_bytes,
    parse_pressure,
    read_proc_file,
    vmstat_counters,
)


@dataclass(frozen=True)
class PressureSample:
    """Cumulative counters at one instant; :mod:`sparkdiag.watch` turns deltas into rates.

    stall_seconds: ``"memory_some"``, ``"memory_full"``, ``"io_some"``, ``"io_full"``,
      ``"cpu_some"``: seconds during which some (or all non-idle) tasks were stalled on that
      resource since boot (``cat /proc/pressure/memory``: ``total=`` in microseconds).
    memory_bytes: ``"total"``, ``"available"``, ``"swap_total"``, ``"swap_free"``
      (``grep -E 'Mem|Swap' /proc/meminfo``).
    swapped_pages: ``"in"``, ``"out"``: pages swapped since boot (``grep pswp /proc/vmstat``).
    scope: ``"cgroup"`` when the stall times are the job's cgroup's, ``"host"`` otherwise.
    """

    stall_seconds: dict[str, float] = field(default_factory=dict)
    memory_bytes: dict[str, float] = field(default_factory=dict)
    swapped_pages: dict[str, float] = field(default_factory=dict)
    scope: str = "host"


def _read(path: Path) -> str:
    return read_proc_file(path) or ""


def _stalls(text: str) -> dict[str, float]:
    """``{"some": seconds, "full": seconds}`` stalled since boot, from a PSI file."""
    parsed = parse_pressure(text)
    return dict(parsed.stalled_seconds) if parsed is not None else {}


_MEMINFO = {
    "MemTotal": "total",
    "MemAvailable": "available",
    "SwapTotal": "swap_total",
    "SwapFree": "swap_free",
}


# The most cgroup directories read for the processes of one (a job's cgroup has a handful)
MAX_CGROUPS = 256


def cgroup_processes(sysfs: Path, cgroup: str) -> frozenset[int] | None:
    """Every process in the cgroup ``cgroup`` and the cgroups below it: whose stalls its PSI
    counts (``cat cgroup.procs`` in each, ``systemd-cgls``); None where its own list cannot be
    read. At most :data:`MAX_CGROUPS` directories are read."""
    base = sysfs / "fs" / "cgroup" / cgroup.lstrip("/")
    own = read_proc_file(base / "cgroup.procs")
    if own is None:
        return None
    pids = {int(p) for p in own.split() if p.isdigit()}
    read = 1
    for top, dirs, _files in os.walk(base):
        for name in dirs:
            if read >= MAX_CGROUPS:
                return frozenset(pids)
            text = read_proc_file(Path(top) / name / "cgroup.procs") or ""
            pids.update(int(p) for p in text.split() if p.isdigit())
            read += 1
    return frozenset(pids)


def read_pressure(rootfs: Path, sysfs: Path, cgroup: str | None = None) -> PressureSample:
    """PSI of the cgroup ``cgroup`` (a cgroup v2 path, read under ``SYSFS/fs/cgroup``) where
    it has PSI files, else the host's (``ROOT/proc/pressure``); memory and swap of the host."""
    stalls: dict[str, float] = {}
    scope = "host"
    if cgroup is not None:
        base = sysfs / "fs" / "cgroup" / cgroup.lstrip("/")
        for resource in ("memory", "io", "cpu"):
            for kind, value in _stalls(_read(base / f"{resource}.pressure")).items():
                stalls[f"{resource}_{kind}"] = value
        if stalls:
            scope = "cgroup"
    if not stalls:
        for resource in ("memory", "io", "cpu"):
            for kind, value in _stalls(_read(rootfs / "proc" / "pressure" / resource)).items():
                stalls[f"{resource}_{kind}"] = value
    return PressureSample(
        stall_seconds=stalls,
        memory_bytes={
            _MEMINFO[k]: v
            for k, v in meminfo_bytes(_read(rootfs / "proc" / "meminfo")).items()
            if k in _MEMINFO
        },
        swapped_pages={
            k[4:]: v
            for k, v in vmstat_counters(
                _read(rootfs / "proc" / "vmstat"), ("pswpin", "pswpout")
            ).items()
        },
        scope=scope,
    )
