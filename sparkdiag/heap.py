"""Freed heap handed back to the kernel: glibc's ``malloc_trim(0)``.

glibc keeps memory that was freed below the top of its heap resident, for later allocations.
NVML's initialisation allocates some 10 MiB it frees again at once (on the lent H200, 2026-12-04:
49.1 MiB resident after ``nvmlInit`` and one query, 39.1 after ``malloc_trim``), and in the
daemon later allocations sit above it, so it stays resident for the daemon's life. The daemon
trims once its start-up is done and after each library scan (the scan's answer is parsed and
dropped): work that happens a few times a day, not per poll.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)


def trim() -> bool:
    """``malloc_trim(0)``; False where the C library has none (musl) or nothing was released."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    released = bool(malloc_trim(0))
    log.debug("malloc_trim: %s", "memory released" if released else "nothing to release")
    return released
