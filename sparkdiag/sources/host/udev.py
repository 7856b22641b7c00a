"""PCI device enumeration through libudev (pyudev); the only module that imports pyudev.

Link values are read from sysfs by :mod:`sparkdiag.sources.host.sysfs`; udev only answers which PCI
devices exist, the way the kernel's device model lists them.
"""

from __future__ import annotations

from pathlib import Path

import pyudev


def list_pci_device_paths() -> list[Path]:
    """Return the sysfs directory of every device in the ``pci`` subsystem, as libudev lists them.

    Paths look like ``/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0``; the last component is
    the PCI address. Same list as ``udevadm trigger --dry-run --verbose --subsystem-match=pci``
    (or ``ls -d /sys/bus/pci/devices/*`` resolved with ``readlink -f``).

    Raises whatever pyudev raises when libudev cannot be loaded (``ImportError``, ``OSError``);
    the caller falls back to listing the directory.
    """
    context = pyudev.Context()
    return [Path(str(device.sys_path)) for device in context.list_devices(subsystem="pci")]
