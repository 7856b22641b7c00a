"""Host buffers in transparent huge pages, for the two storage readers: the worker's storage room
and the host storage probe (``storage/measure.py``, which imports this room).

A block read into 4 KiB pages may reach the device as up to 256 segments, and past the queue's
``max_segments`` it is split into two requests; in one 2 MiB huge page it is one physically
contiguous piece (docs/storage.md, "fio, the reference"). Standard library only.
"""

from __future__ import annotations

import ctypes
import mmap

HUGE_PAGE = 2 * 1024 * 1024  # a transparent huge page (PMD) on x86-64 and 4 KiB-page arm64


def huge_span(size: int) -> int:
    """``size`` rounded up to whole huge pages."""
    return -(-size // HUGE_PAGE) * HUGE_PAGE


def map_address(area: mmap.mmap) -> int:
    """Where a map starts in memory."""
    pointer = ctypes.c_char.from_buffer(area)
    try:
        return ctypes.addressof(pointer)
    finally:
        del pointer  # releases the export, so that the map can close


def huge_area(size: int) -> tuple[mmap.mmap, int]:
    """An anonymous private map holding ``size`` bytes from a huge-page boundary, advised to lie
    in transparent huge pages where the kernel has them: the map, and the offset in it where the
    aligned bytes start (the map is one huge page longer than they need)."""
    span = huge_span(size)
    area = mmap.mmap(-1, span + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    skip = -map_address(area) % HUGE_PAGE
    if hasattr(mmap, "MADV_HUGEPAGE"):
        area.madvise(mmap.MADV_HUGEPAGE, skip, span)
    return area, skip


def in_huge_pages(areas: list[mmap.mmap], size: int) -> bool:
    """Whether the maps of ``areas`` (each from :func:`huge_area` for ``size`` bytes, faulted in)
    lie wholly in transparent huge pages, by ``AnonHugePages`` in /proc/self/smaps."""
    addresses = [map_address(a) for a in areas]
    found: dict[int, int] = {}
    start = end = -1
    try:
        with open("/proc/self/smaps", encoding="ascii", errors="replace") as fh:
            for line in fh:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    low, high = head.split("-")
                    start, end = int(low, 16), int(high, 16)
                elif head == "AnonHugePages:" and any(start <= a < end for a in addresses):
                    found[start] = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return False
    return sum(found.values()) >= huge_span(size) * len(areas)
