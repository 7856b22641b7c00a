"""The machine as its firmware names it: DMI (SMBIOS) strings read from sysfs, under a
configurable root (``--path.sysfs``)::

    /sys/class/dmi/id/sys_vendor     "NVIDIA"              (dmidecode -s system-manufacturer)
    /sys/class/dmi/id/product_name   "NVIDIA_DGX_Spark"    (dmidecode -s system-product-name)
    /sys/class/dmi/id/board_name     "P4242"               (dmidecode -s baseboard-product-name)

These three are readable without privileges (the serial numbers beside them are not, and are
never read). A machine without DMI (many Arm boards, a container without /sys/class/dmi) has no
platform identity; nothing here raises for a missing or unreadable file.
"""

from __future__ import annotations

from pathlib import Path

from sparkdiag.snapshot import PlatformIdentity

_FILES = {"vendor": "sys_vendor", "product": "product_name", "board": "board_name"}


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", errors="replace").strip()
    except OSError:
        return ""


def read_platform(sysfs: Path) -> PlatformIdentity | None:
    """The DMI vendor, product and board name under ``sysfs`` (``SYSFS/class/dmi/id``).

    Unit: none (firmware strings, stripped). Same reading as
    ``cat /sys/class/dmi/id/{sys_vendor,product_name,board_name}``.

    Returns None when the directory is missing or none of the three is readable; a single
    missing file is ``""`` (the ASUS Ascent GX10's board name, for one, is not publicly known).
    """
    base = sysfs / "class" / "dmi" / "id"
    if not base.is_dir():
        return None
    values = {field: _read(base / name) for field, name in _FILES.items()}
    if not any(values.values()):
        return None
    return PlatformIdentity(**values)
