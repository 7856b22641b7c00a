"""Host PCIe links read from sysfs, under a configurable root (node_exporter's ``--path.sysfs``).

NVML reports the link of NVIDIA GPUs only, and on a GB10 (DGX Spark) its answer for the
integrated GPU is a meaningless Gen1 x1. The links that matter there (the ConnectX-7's two
Gen5 x4 endpoints, the NVMe) are read here, from the kernel's PCI attributes::

    /sys/bus/pci/devices/ADDR/{current,max}_link_speed   "32.0 GT/s PCIe"
    /sys/bus/pci/devices/ADDR/{current,max}_link_width   "4"
    /sys/bus/pci/devices/ADDR/class                      "0x020000"
    /sys/bus/pci/devices/ADDR/driver -> ../../../bus/pci/drivers/mlx5_core

Point the root at a fake tree (``tests/fixtures/sysfs/dgx-spark``) to run without the hardware.
Nothing here raises for one bad file: an unreadable or garbled attribute is ``None``.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

from sparkdiag.snapshot import PcieLink
from sparkdiag.sources.files import KIB, read_text_limited

log = logging.getLogger(__name__)

_LINK_FILES = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")

# "32.0 GT/s PCIe" (kernel >= 4.19 appends " PCIe"), "2.5 GT/s", "5 GT/s" (older kernels).
_SPEED_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s\b")

# PCI base class (top byte of the 24-bit class code) -> METRICS.md ``class`` label.
_BASE_CLASS = {0x02: "network", 0x03: "display", 0x06: "bridge"}
_MASS_STORAGE = 0x01
_NVM_SUBCLASS = 0x08  # 0x0108xx: non-volatile memory controller (NVMe)


def parse_link_speed(text: str) -> float | None:
    """Parse a sysfs link speed into transfers per second (``"32.0 GT/s PCIe"`` -> ``32e9``).

    Unit: transfers/s. Same reading as ``cat /sys/bus/pci/devices/ADDR/current_link_speed``
    (or ``max_link_speed``), or ``lspci -vv -s ADDR`` ("LnkSta: Speed 32GT/s").
    Returns ``None`` for ``"Unknown"`` (link down or not reported), empty or garbled text.
    """
    match = _SPEED_RE.match(text)
    if match is None:
        return None
    gigatransfers = float(match.group(1))
    if gigatransfers <= 0:
        return None
    return gigatransfers * 1e9


# The widest link PCIe defines is x32: a larger "width" is no reading (a garbled or hostile
# file; ``99999999999999999999999`` was exported as a width of 1e+23 and passed check as "(max)").
MAX_LINK_WIDTH = 32


def _parse_width(text: str | None) -> int | None:
    """Lane count from ``"4"``; ``None`` when unreadable, not a plain non-negative integer, or
    wider than PCIe's widest link (:data:`MAX_LINK_WIDTH`)."""
    if text is None:
        return None
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 3:
        return None
    width = int(text)
    return width if width <= MAX_LINK_WIDTH else None


def classify(pci_class_hex: str) -> str:
    """Map the sysfs ``class`` code to the ``class`` label of ``sparkdiag_pcie_link_*``.

    Unit: none (a label value: ``network``, ``nvme``, ``display``, ``bridge`` or ``other``).
    Same reading as ``cat /sys/bus/pci/devices/ADDR/class`` (``0x020000``: base class 0x02
    network, 0x0108 NVMe, 0x03 display/3D, 0x06 bridge) or ``lspci -n -s ADDR``.
    Unparsable text gives ``other``.
    """
    try:
        code = int(pci_class_hex.strip(), 16)
    except ValueError:
        return "other"
    if not 0 <= code <= 0xFFFFFF:
        return "other"
    base, subclass = code >> 16, (code >> 8) & 0xFF
    if base == _MASS_STORAGE and subclass == _NVM_SUBCLASS:
        return "nvme"
    return _BASE_CLASS.get(base, "other")


def read_attr(path: Path) -> str | None:
    """One sysfs attribute, stripped; ``None`` when it is missing, unreadable or not a file."""
    try:
        return read_text_limited(path, 4 * KIB, "ascii").strip()
    except OSError as exc:
        log.debug("cannot read %s: %s", path, exc)
        return None


def _driver_name(device_dir: Path) -> str:
    """Basename of the ``driver`` symlink; ``""`` when no driver is bound."""
    try:
        return os.path.basename(os.readlink(device_dir / "driver"))
    except OSError:
        return ""


def read_link(device_dir: Path) -> PcieLink | None:
    """Read one PCI device's link from its sysfs directory (the address is the directory name).

    Units: speeds in transfers/s (32 GT/s -> ``32e9``), widths in lanes. Same readings as
    ``cat /sys/bus/pci/devices/ADDR/{current,max}_link_{speed,width} .../class`` and
    ``basename $(readlink /sys/bus/pci/devices/ADDR/driver)``.

    Returns ``None`` for a device with none of the four link files (conventional PCI, no
    PCIe capability) and for a bridge port whose current width is 0 (empty slot or link
    down). An endpoint at width 0 is kept: a device that is present with no trained link is a
    real fault. A single unreadable or garbled file yields ``None`` for that field only.
    """
    if not any(os.path.lexists(device_dir / name) for name in _LINK_FILES):
        return None
    current_speed = read_attr(device_dir / "current_link_speed")
    max_speed = read_attr(device_dir / "max_link_speed")
    class_code = read_attr(device_dir / "class")
    link = PcieLink(
        address=device_dir.name,
        device_class=classify(class_code) if class_code is not None else "other",
        driver=_driver_name(device_dir),
        current_speed_tps=parse_link_speed(current_speed) if current_speed is not None else None,
        max_speed_tps=parse_link_speed(max_speed) if max_speed is not None else None,
        current_width=_parse_width(read_attr(device_dir / "current_link_width")),
        max_width=_parse_width(read_attr(device_dir / "max_link_width")),
    )
    if link.device_class == "bridge" and link.current_width == 0:
        return None
    return link


NVIDIA_VENDOR = 0x10DE
# PCI class codes (class and subclass) of a GPU: VGA-compatible and 3D controllers.
GPU_CLASSES = frozenset({0x0300, 0x0302})


def is_nvidia_gpu(device_dir: Path) -> bool:
    """Whether a PCI function is an NVIDIA GPU: vendor 0x10de and class 0x0300xx or 0x0302xx.

    Same reading as ``cat /sys/bus/pci/devices/ADDR/{vendor,class}`` or
    ``lspci -d 10de: -n`` (classes 0300 and 0302). NVIDIA's bridges (a GB10's root ports,
    10de:22ce, class 0x0604) and NVSwitches (class 0x0680) are not GPUs.
    """
    vendor, class_code = read_attr(device_dir / "vendor"), read_attr(device_dir / "class")
    try:
        return (
            vendor is not None
            and class_code is not None
            and int(vendor, 16) == NVIDIA_VENDOR
            and int(class_code, 16) >> 8 in GPU_CLASSES
        )
    except ValueError:
        return False


def _is_real_sysfs(root: Path) -> bool:
    try:
        return root.resolve() == Path("/sys").resolve()
    except (OSError, RuntimeError):  # RuntimeError: symlink loop on Python < 3.13
        return False


class PcieSource:
    """Every PCI device that reports a link, read from sysfs under ``sysfs_root``.

    On the real ``/sys`` the device list comes from libudev
    (:func:`sparkdiag.sources.host.udev.list_pci_device_paths`), falling back to listing
    ``/sys/bus/pci/devices`` when pyudev fails or lists nothing; under any other root (a
    fixture tree) the directory is listed. Each device's files are read the same way in both.
    """

    def __init__(self, sysfs_root: Path = Path("/sys")) -> None:
        self.enumerate_every = 300.0  # seconds between device enumerations
        self._cached_dirs: list[Path] | None = None
        self._enumerated_at = 0.0
        self.sysfs_root = sysfs_root
        self._use_udev = _is_real_sysfs(sysfs_root)

    def read(self) -> tuple[PcieLink, ...]:
        """All links, sorted by PCI address.

        Units: transfers/s and lanes (see :func:`read_link`). Same reading as
        ``grep . /sys/bus/pci/devices/*/{current,max}_link_{speed,width}``
        or ``lspci -vv | grep -E 'LnkCap|LnkSta'``.

        Returns an empty tuple when the root has no ``bus/pci/devices`` (no PCI bus, or a
        sandbox); raises ``FileNotFoundError`` when ``sysfs_root`` itself does not exist, so a
        mistyped fixture path shows up as a failed collector instead of an empty machine.
        """
        by_address: dict[str, PcieLink] = {}
        for device_dir in self._device_dirs():
            link = read_link(device_dir)
            if link is not None:
                by_address[link.address] = link
        return tuple(by_address[address] for address in sorted(by_address))

    def gpu_functions(self) -> tuple[str, ...]:
        """PCI addresses of the NVIDIA GPU functions on the bus (:func:`is_nvidia_gpu`), sorted,
        whatever NVML says of them: a GPU the driver failed to bring up, or lost, is still
        listed here. Same reading as ``lspci -D -d 10de: | grep -E '(VGA|3D) controller'``.
        Raises as :meth:`read` does."""
        return tuple(sorted(d.name for d in self._device_dirs() if is_nvidia_gpu(d)))

    def _device_dirs(self) -> list[Path]:
        """The PCI device directories, enumerated again at most every :attr:`enumerate_every`
        seconds: devices come and go rarely (hotplug), their links are read on every call."""
        now = time.monotonic()
        if self._cached_dirs is None or now - self._enumerated_at >= self.enumerate_every:
            self._cached_dirs = self._enumerate()
            self._enumerated_at = now
        return self._cached_dirs

    def _enumerate(self) -> list[Path]:
        if self._use_udev:
            try:
                from sparkdiag.sources.host import udev

                paths = udev.list_pci_device_paths()
            except Exception as exc:  # libudev missing or broken: list the directory instead
                log.debug("pyudev enumeration failed, listing sysfs instead: %s", exc)
            else:
                if paths:
                    return paths
        return self._list_bus_dir()

    def _list_bus_dir(self) -> list[Path]:
        if not self.sysfs_root.is_dir():
            raise FileNotFoundError(f"sysfs root {self.sysfs_root} is not a directory")
        try:
            return sorted((self.sysfs_root / "bus" / "pci" / "devices").iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []
