"""Host memory and memory pressure read from procfs, under a configurable root (``--path.rootfs``)::

    ROOT/proc/meminfo          MemTotal, MemAvailable, MemFree, Cached, SReclaimable, the file
                               LRU lists, Dirty, Writeback, Mapped, Shmem, Unevictable (kB)
    ROOT/proc/vmstat           pswpin: pages swapped in since boot
    ROOT/proc/pressure/memory  PSI: "some avg10=0.00 avg60=0.00 avg300=0.00 total=0" and "full ..."

On a unified-memory machine (GB10) this memory is also the GPU's: the page cache competes with
CUDA allocations and sustained pressure has wedged hosts, so these are GPU health signals there.
Point the root at a fake tree (``tests/fixtures/rootfs/dgx-spark``) to run without the machine.
A file that is missing or garbled leaves its readings out; only a root that does not exist
raises (a mistyped ``--path.rootfs`` shows as a failed collector, not as an empty machine).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from sparkdiag.snapshot import HostSample, MemoryPressure
from sparkdiag.sources.files import KIB as KIB_BYTES
from sparkdiag.sources.files import read_text_limited

KIB = 1024.0
_PSI_LINE = re.compile(r"^(some|full)\s+(.*)$")
_PSI_FIELD = re.compile(r"^(avg10|avg60|avg300|total)=(\d+(?:\.\d+)?)$")
_WINDOWS = {"avg10": "10s", "avg60": "60s", "avg300": "300s"}


def read_proc_file(path: Path) -> str | None:
    """A small procfs text file (bounded read); None when missing or unreadable."""
    try:
        return read_text_limited(path, 256 * KIB_BYTES, "ascii")
    except OSError:
        return None


def meminfo_bytes(text: str) -> dict[str, float]:
    """Every ``/proc/meminfo`` field given in kB, as bytes (``MemTotal``, ``SwapFree`` ...)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[name.strip()] = float(fields[0]) * KIB
    return out


def vmstat_counters(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """The named counters of ``/proc/vmstat`` (``pswpin``, ``pswpout`` ...) that it has."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] in names and fields[1].isdigit():
            out[fields[0]] = float(fields[1])
    return out


def parse_meminfo(text: str) -> dict[str, float]:
    """Host memory in bytes from ``/proc/meminfo`` text: ``total``, ``available``, ``free`` and
    ``cached`` (Cached + SReclaimable, as ``free`` and psutil count the page cache).

    Unit: bytes. Same reading as ``free -b`` (total, free, available; buff/cache less Buffers).
    A field the text lacks is left out; ``cached`` needs ``Cached``.
    """
    fields = meminfo_bytes(text)
    out: dict[str, float] = {}
    for key, name in (("total", "MemTotal"), ("available", "MemAvailable"), ("free", "MemFree")):
        if name in fields:
            out[key] = fields[name]
    if "Cached" in fields:
        out["cached"] = fields["Cached"] + fields.get("SReclaimable", 0.0)
    return out


# The /proc/meminfo fields obtainable() needs (all in kB, every kernel since 2.6.28).
_OBTAINABLE_FIELDS = ("MemFree", "Active(file)", "Inactive(file)", "Dirty", "Writeback", "Mapped")


def obtainable(fields: Mapping[str, float]) -> tuple[float | None, dict[str, float]]:
    r"""Memory a new allocation can get now, and the page cache's parts, from
    :func:`meminfo_bytes` fields.

    obtainable = MemFree + max(0, Active(file) + Inactive(file) - Dirty - Writeback - Mapped)

    The file LRU lists (``Active(file)``, ``Inactive(file)``) hold the page cache the kernel can
    drop; of those, dirty pages and pages under writeback must reach the disk first, and mapped
    pages (``Mapped``: a process's mmap of a file, such as a model loaded with safetensors'
    mmap) are in use and come back only by unmapping them. Tmpfs and shared memory
    (``Shmem``), ``Unevictable`` and ``Mlocked`` pages are not on the file lists at all, so
    they are never counted. ``Mapped`` also counts mapped shared memory, which is not on the
    file lists, so the figure errs low, never high. Unlike the kernel's ``MemAvailable`` it
    leaves out reclaimable slab and the dirty and mapped part of the cache: a CUDA allocation
    on a unified-memory GPU (GB10) has failed with NV_ERR_NO_MEMORY while the page cache held
    the memory (tobias-weiss.org, "Taming OOM on DGX Spark"; sovgrid.org, "Five DGX Spark
    disasters": an OOM at 95 GB until ``echo 3 > /proc/sys/vm/drop_caches``).

    Unit: bytes. Same reading as ``awk '/^(MemFree|Active\(file\)|Inactive\(file\)|Dirty|
    Writeback|Mapped):/' /proc/meminfo``. (None, parts) when a field is missing; the parts
    hold what could be read: ``total`` (Cached + Buffers), ``reclaimable``, ``dirty``
    (Dirty + Writeback), ``mapped``, ``shmem``, ``unevictable``.
    """
    parts: dict[str, float] = {}
    if "Cached" in fields:
        parts["total"] = fields["Cached"] + fields.get("Buffers", 0.0)
    for key, name in (("mapped", "Mapped"), ("shmem", "Shmem"), ("unevictable", "Unevictable")):
        if name in fields:
            parts[key] = fields[name]
    if "Dirty" in fields:
        parts["dirty"] = fields["Dirty"] + fields.get("Writeback", 0.0)
    if any(name not in fields for name in _OBTAINABLE_FIELDS):
        return None, parts
    lru = fields["Active(file)"] + fields["Inactive(file)"]
    reclaimable = max(0.0, lru - fields["Dirty"] - fields["Writeback"] - fields["Mapped"])
    parts["reclaimable"] = reclaimable
    return fields["MemFree"] + reclaimable, parts


def parse_swap_in(text: str) -> float | None:
    """Pages swapped in since boot: ``pswpin`` of ``/proc/vmstat``.

    Unit: pages (the kernel's page size). Same reading as ``grep pswpin /proc/vmstat``;
    ``vmstat 1``'s ``si`` column is its rate. None when the field is missing.
    """
    return vmstat_counters(text, ("pswpin",)).get("pswpin")


def parse_pressure(text: str) -> MemoryPressure | None:
    """PSI of ``/proc/pressure/memory``: for ``some`` (at least one task stalled on memory) and
    ``full`` (every non-idle task stalled), the share of the last 10, 60 and 300 s, and the total
    stall time since boot.

    Units: ratios 0..1 (the kernel prints percent), seconds (it prints microseconds). Same
    reading as ``cat /proc/pressure/memory``. None when no line parses (a kernel without PSI,
    or PSI disabled with ``psi=0``: the file is then missing or unreadable).
    """
    averages: dict[str, dict[str, float]] = {}
    stalled: dict[str, float] = {}
    for line in text.splitlines():
        match = _PSI_LINE.match(line.strip())
        if match is None:
            continue
        kind = match.group(1)
        for field in match.group(2).split():
            parsed = _PSI_FIELD.match(field)
            if parsed is None:
                continue
            name, value = parsed.group(1), float(parsed.group(2))
            if name == "total":
                stalled[kind] = value / 1e6
            else:
                averages.setdefault(kind, {})[_WINDOWS[name]] = value / 100.0
    if not averages and not stalled:
        return None
    return MemoryPressure(averages=averages, stalled_seconds=stalled)


def read_host_memory(rootfs: Path) -> HostSample:
    """Host memory, swap-in counter and memory pressure under ``rootfs`` (see the module).

    Units: bytes, pages, ratios 0..1 and seconds. Same readings as ``free -b``,
    ``grep pswpin /proc/vmstat`` and ``cat /proc/pressure/memory``. Raises FileNotFoundError
    when ``rootfs`` is not a directory.
    """
    if not rootfs.is_dir():
        raise FileNotFoundError(f"rootfs {rootfs} is not a directory")
    proc = rootfs / "proc"
    meminfo = read_proc_file(proc / "meminfo")
    vmstat = read_proc_file(proc / "vmstat")
    pressure = read_proc_file(proc / "pressure" / "memory")
    got, cache = obtainable(meminfo_bytes(meminfo)) if meminfo is not None else (None, {})
    return HostSample(
        memory_bytes=parse_meminfo(meminfo) if meminfo is not None else {},
        swap_in_pages=parse_swap_in(vmstat) if vmstat is not None else None,
        pressure=parse_pressure(pressure) if pressure is not None else None,
        obtainable_bytes=got,
        page_cache_bytes=cache,
    )


def memory_total() -> int | None:
    """Host MemTotal in bytes (``grep MemTotal /proc/meminfo``; the figure psutil's
    ``virtual_memory().total`` reads on Linux), read without importing psutil: the daemon needs
    it once, at start, and psutil would cost it about 1 MiB of RSS (docs/daemon-cost.md)."""
    text = read_proc_file(Path("/proc/meminfo"))
    total = meminfo_bytes(text).get("MemTotal") if text is not None else None
    return int(total) if total else None
