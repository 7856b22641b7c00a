"""CPU frequency governors read from sysfs, under a configurable root (``--path.sysfs``).

Each CPU's governor is ``/sys/devices/system/cpu/cpuN/cpufreq/scaling_governor``. Point the root
at a fake tree to run without the machine; nothing here raises for a missing or unreadable file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from sparkdiag.sources.files import KIB, read_text_limited

_CPU_DIR = re.compile(r"^cpu(\d+)$")


def read_governors(sysfs: Path) -> tuple[dict[str, str] | None, str]:
    """cpu name -> cpufreq governor name, read under ``sysfs``, in CPU order.

    Unit: none (governor names: ``performance``, ``schedutil``, ``powersave`` ...). Same reading
    as ``grep . /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor`` (or
    ``cpupower frequency-info -p``).

    Returns (governors, ""), or (None, reason) when no CPU has a cpufreq governor (a VM without
    cpufreq, or frequency scaling owned by the firmware) or the CPU list cannot be read. A CPU
    whose governor file is missing, unreadable or empty is left out.
    """
    base = sysfs / "devices" / "system" / "cpu"
    try:
        names = sorted(
            (n for n in os.listdir(base) if _CPU_DIR.match(n)),
            key=lambda n: int(n[3:]),
        )
    except OSError as exc:
        return None, f"no CPU list under {base} ({exc.strerror or exc})"
    governors: dict[str, str] = {}
    for name in names:
        try:
            text = read_text_limited(base / name / "cpufreq" / "scaling_governor", 4 * KIB)
        except OSError:
            continue
        if text.strip():
            governors[name] = text.strip()
    if not governors:
        return None, f"no cpufreq governor under {base} (a VM, or the firmware owns scaling)"
    return governors, ""
