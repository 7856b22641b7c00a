"""Process facts read from procfs, under a configurable root (``--path.rootfs``).

Every path is ``ROOT/proc/PID/...``, so a fake tree can stand in for the machine; nothing here
raises for a process that has gone or a file that cannot be read.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from sparkdiag.sources.files import KIB, read_text_limited


def process_names(rootfs: Path, pids: Iterable[int]) -> dict[int, str]:
    """pid -> command name, for the pids whose ``ROOT/proc/PID/comm`` is readable here.

    Unit: none (the kernel's command name, at most 15 characters). Same reading as
    ``cat /proc/PID/comm`` (or ``ps -o comm= -p PID``). Pids that have exited, that this
    process may not see (another PID namespace), or whose name is empty are left out.
    """
    names: dict[int, str] = {}
    for pid in pids:
        try:
            text = read_text_limited(rootfs / "proc" / str(pid) / "comm", 4 * KIB)
        except OSError:
            continue
        if text.strip():
            names[pid] = text.strip()
    return names
