"""Host memory and I/O pressure: pressure stall information (PSI), available memory and swap.

Read under configurable roots (``--path.rootfs`` for ``/proc``, ``--path.sysfs`` for the cgroup
tree), so a fake tree can stand in for the machine; nothing here raises for a file that is
missing (a kernel without PSI, a cgroup v1 host) or unreadable: the value is left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


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
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def parse_psi(text: str) -> dict[str, float]:
    """``{"some": seconds, "full": seconds}`` from a PSI file (its ``total=`` microseconds)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for item in rest.split():
            key, _, value = item.partition("=")
            if key == "total" and value.isdigit() and kind in ("some", "full"):
                out[kind] = int(value) / 1e6
    return out


_MEMINFO = {
    "MemTotal": "total",
    "MemAvailable": "available",
    "SwapTotal": "swap_total",
    "SwapFree": "swap_free",
}


def parse_meminfo(text: str) -> dict[str, float]:
    """Bytes of the fields sparkdiag uses from ``/proc/meminfo`` (its kB are KiB)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        name = _MEMINFO.get(key)
        fields = rest.split()
        if name and fields and fields[0].isdigit():
            out[name] = int(fields[0]) * 1024.0
    return out


def parse_vmstat(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in ("pswpin", "pswpout") and value.strip().isdigit():
            out[key[4:]] = float(value)
    return out


def read_pressure(rootfs: Path, sysfs: Path, cgroup: str | None = None) -> PressureSample:
    """PSI of the cgroup ``cgroup`` (a cgroup v2 path, read under ``SYSFS/fs/cgroup``) where
    it has PSI files, else the host's (``ROOT/proc/pressure``); memory and swap of the host."""
    stalls: dict[str, float] = {}
    scope = "host"
    if cgroup is not None:
        base = sysfs / "fs" / "cgroup" / cgroup.lstrip("/")
        for resource in ("memory", "io", "cpu"):
            for kind, value in parse_psi(_read(base / f"{resource}.pressure")).items():
                stalls[f"{resource}_{kind}"] = value
        if stalls:
            scope = "cgroup"
    if not stalls:
        for resource in ("memory", "io", "cpu"):
            for kind, value in parse_psi(_read(rootfs / "proc" / "pressure" / resource)).items():
                stalls[f"{resource}_{kind}"] = value
    return PressureSample(
        stall_seconds=stalls,
        memory_bytes=parse_meminfo(_read(rootfs / "proc" / "meminfo")),
        swapped_pages=parse_vmstat(_read(rootfs / "proc" / "vmstat")),
        scope=scope,
    )
