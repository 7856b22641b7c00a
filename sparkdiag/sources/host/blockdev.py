"""From a filesystem's device number to the drives under it, read from sysfs (``--path.sysfs``).

The kernel's block devices in sysfs::

    /sys/dev/block/259:2 -> ../../devices/pci0000:00/.../0000:3d:00.0/nvme/nvme0/nvme0n1/nvme0n1p2
    /sys/class/block/NAME/partition          present on a partition (its disk is the parent)
    /sys/class/block/dm-0/dm/{name,uuid}     device mapper (LVM, dm-crypt, dm-delay...)
    /sys/class/block/md0/md/level            software RAID
    /sys/class/block/dm-0/slaves/*           the devices under a dm or md device
    /sys/class/block/loop0/loop/backing_file a loop device's file
    /sys/class/block/NAME/stat               I/O counters (sectors of 512 bytes, fields 3 and 7)
    /sys/class/nvme/nvme0/device -> ../../../0000:3d:00.0   an NVMe controller's PCI function

Same readings as ``lsblk -s -o NAME,TYPE,MAJ:MIN`` and ``readlink -f /sys/dev/block/MAJ:MIN``.
A native-multipath NVMe namespace (``/sys/devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1``)
names its paths in ``multipath/`` (``nvme0c0n1``: controller 0). Nothing here raises for a
missing or unreadable file: what cannot be read is left out.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from sparkdiag.sources.host.sysfs import read_attr

_PCI = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_NVME_CONTROLLER = re.compile(r"/nvme/(nvme\d+)(?:/|$)")
_PATH_CONTROLLER = re.compile(r"^nvme\d+c(\d+)n\d+$")  # nvme0c0n1: a multipath path
_DM_KINDS = (("CRYPT-", "crypt"), ("LVM-", "lvm"), ("mpath-", "multipath"), ("part", "partition"))
_MAX_DEPTH = 8  # dm over md over partitions: more than this is a loop in a hostile tree


@dataclass(frozen=True)
class BlockChain:
    """What a filesystem's block device is made of (``lsblk -s``).

    device: the block device the filesystem is on (``nvme0n1p2``, ``dm-0``, ``loop0``)
    kind: what that device is: ``nvme``, ``sata``, ``scsi``, ``virtio``, ``usb``, ``mmc``,
        ``loop``, ``dm``, ``md`` or ``other``
    disks: the whole disks at the bottom of the chain (``nvme0n1``, ``sda``)
    controllers: their NVMe controllers (``nvme0``)
    pci_addresses: the PCI functions the disks hang off (an NVMe drive's own function)
    layers: how the chain is built, top first (``dm-0 crypt``, ``nvme0n1p3 partition``)
    backing_file: a loop device's file, as the kernel names it
    """

    device: str
    kind: str
    disks: tuple[str, ...] = ()
    controllers: tuple[str, ...] = ()
    pci_addresses: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()
    backing_file: str | None = None


def _real(path: Path) -> Path | None:
    try:
        real = Path(os.path.realpath(path))
    except (OSError, RuntimeError):
        return None
    return real if real.is_dir() else None


def block_chain(sysfs: Path, major: int, minor: int) -> BlockChain | None:
    """The chain under the block device ``major:minor``; None when sysfs does not know it
    (a network or memory filesystem's anonymous device, or no sysfs here)."""
    real = _real(sysfs / "dev" / "block" / f"{major}:{minor}")
    return None if real is None else _chain(sysfs, real, 0)


def named_chain(sysfs: Path, name: str) -> BlockChain | None:
    """The chain under the block device called ``name`` (``nvme0n1p2``); None when unknown."""
    if not name or "/" in name or name in (".", ".."):
        return None
    real = _real(sysfs / "class" / "block" / name)
    return None if real is None else _chain(sysfs, real, 0)


def _merge(top: BlockChain, below: list[BlockChain]) -> BlockChain:
    def union(field: str) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for chain in below:
            seen.update(dict.fromkeys(getattr(chain, field)))
        return tuple(seen)

    layers = [*top.layers, *(layer for chain in below for layer in chain.layers)]
    return replace(
        top,
        disks=union("disks"),
        controllers=union("controllers"),
        pci_addresses=union("pci_addresses"),
        layers=tuple(layers),
    )


def _slaves(sysfs: Path, real: Path, depth: int) -> list[BlockChain]:
    try:
        names = sorted(entry.name for entry in (real / "slaves").iterdir())
    except OSError:
        return []
    chains = []
    for name in names:
        under = _real(sysfs / "class" / "block" / name)
        if under is not None:
            chains.append(_chain(sysfs, under, depth + 1))
    return chains


def _chain(sysfs: Path, real: Path, depth: int) -> BlockChain:
    name = real.name
    if depth > _MAX_DEPTH:
        return BlockChain(name, "other", layers=(f"{name} (chain too deep)",))
    if (real / "partition").exists():
        disk = _chain(sysfs, real.parent, depth + 1)
        return replace(disk, device=name, layers=(f"{name} partition", *disk.layers))
    if (real / "dm").is_dir():
        uuid = read_attr(real / "dm" / "uuid") or ""
        what = next((kind for prefix, kind in _DM_KINDS if uuid.startswith(prefix)), "dm")
        label = read_attr(real / "dm" / "name")
        top = BlockChain(name, "dm", layers=(f"{name} {what}" + (f" ({label})" if label else ""),))
        return _merge(top, _slaves(sysfs, real, depth))
    if (real / "md").is_dir():
        level = read_attr(real / "md" / "level") or "md"
        return _merge(
            BlockChain(name, "md", layers=(f"{name} {level}",)), _slaves(sysfs, real, depth)
        )
    if (real / "loop").is_dir():
        backing = read_attr(real / "loop" / "backing_file")
        layer = f"{name} loop" + (f" on {backing}" if backing else "")
        return BlockChain(name, "loop", layers=(layer,), backing_file=backing)
    return _disk(sysfs, real)


def _disk(sysfs: Path, real: Path) -> BlockChain:
    name, text = real.name, str(real)
    controllers: tuple[str, ...] = ()
    found = _NVME_CONTROLLER.search(text)
    if found:
        controllers = (found.group(1),)
    elif (real / "multipath").is_dir():
        try:
            paths = sorted(entry.name for entry in (real / "multipath").iterdir())
        except OSError:
            paths = []
        controllers = tuple(
            f"nvme{m.group(1)}" for m in map(_PATH_CONTROLLER.match, paths) if m is not None
        )
    if controllers or name.startswith("nvme"):
        kind = "nvme"
    elif "/virtio" in text:
        kind = "virtio"
    elif re.search(r"/ata\d+/", text):
        kind = "sata"
    elif "/usb" in text:
        kind = "usb"
    elif name.startswith("mmcblk"):
        kind = "mmc"
    elif re.search(r"/host\d+/", text):
        kind = "scsi"
    else:
        kind = "other"
    pcis = tuple(dict.fromkeys(a for c in controllers if (a := controller_pci(sysfs, c))))
    if not pcis:
        on_path = [part for part in real.parts if _PCI.match(part)]
        pcis = (on_path[-1],) if on_path else ()
    return BlockChain(name, kind, (name,), controllers, pcis, (f"{name} {kind} disk",))


def controller_pci(sysfs: Path, controller: str) -> str | None:
    """The PCI address of an NVMe controller (``nvme0`` -> ``0000:3d:00.0``); None for one on
    another transport (NVMe over fabrics) or one sysfs does not show.
    ``basename $(readlink -f /sys/class/nvme/nvme0/device)``."""
    real = _real(sysfs / "class" / "nvme" / controller / "device")
    if real is not None and _PCI.match(real.name):
        return real.name
    address = read_attr(sysfs / "class" / "nvme" / controller / "address")
    return address if address and _PCI.match(address) else None


def io_bytes(sysfs: Path, name: str) -> tuple[int, int] | None:
    """Bytes read and written through block device ``name`` since boot (``stat`` fields 3 and
    7 are 512-byte sectors, whatever the device's block size); None when unreadable.
    ``awk '{print $3*512, $7*512}' /sys/class/block/NAME/stat``."""
    text = read_attr(sysfs / "class" / "block" / name / "stat")
    fields = text.split() if text else []
    if len(fields) < 7 or not (fields[2].isdigit() and fields[6].isdigit()):
        return None
    return int(fields[2]) * 512, int(fields[6]) * 512
