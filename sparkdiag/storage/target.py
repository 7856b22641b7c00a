"""Where a directory's data lives: its mount, the block devices under it, the drives' NVMe
controllers and PCIe links, and so the ceiling its figures are held against.

``findmnt -T DIR`` and ``lsblk -s`` in one: the mount comes from ``ROOT/proc/self/mountinfo``
(``--path.rootfs``), the rest from sysfs (``--path.sysfs``). A network share, a tmpfs, a ZFS
dataset or a loop device is named as such; their ceilings are not a local drive's link. A
kernel's pseudo-filesystem (proc, sysfs, devtmpfs, cgroup ...) holds no data of a drive and no
file of a user's: :func:`refusal` says why the probe does not start there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sparkdiag.snapshot import NvmeController, PcieLink
from sparkdiag.sources.host.blockdev import BlockChain, block_chain, named_chain
from sparkdiag.sources.host.mounts import Mount, directory_device, find_mount, read_mounts
from sparkdiag.sources.host.nvme import read_controller
from sparkdiag.sources.host.sysfs import read_link
from sparkdiag.storage.ceiling import Rated, describe_link, links_bytes_per_second, rated

# The kernel's pseudo-filesystems: views of its state (proc, sysfs, cgroup ...), device nodes
# (devtmpfs, devpts) or its interfaces (bpf, tracefs ...). No drive is under them, and a test
# file there is either refused by the kernel (proc and sysfs: creating a file fails with ENOENT
# or EACCES, which read as "removed" or "permission denied") or written into memory beside the
# device nodes (devtmpfs takes O_DIRECT and an O_TMPFILE on Linux 6.18). A tmpfs is not here:
# it holds users' files (/dev/shm, /tmp), is measured, and is named memory (see kind).
PSEUDO_FSTYPES = frozenset(
    {
        "proc",
        "sysfs",
        "devtmpfs",
        "devpts",
        "cgroup",
        "cgroup2",
        "debugfs",
        "tracefs",
        "securityfs",
        "pstore",
        "efivarfs",
        "bpf",
        "configfs",
        "fusectl",
        "mqueue",
        "binfmt_misc",
        "selinuxfs",
        "autofs",
        "rpc_pipefs",
        "nsfs",
        "nfsd",
    }
)


@dataclass(frozen=True)
class StorageTarget:
    """The directory and what is under it.

    directory: the path with symlinks resolved
    mount: the mount holding it (None: mountinfo unreadable)
    chain: the block devices under the filesystem (None: none, or sysfs does not know them)
    links: the PCIe links of the drives at the bottom of the chain
    nvme: their NVMe controllers (identity and temperatures; no health log)
    """

    directory: str
    mount: Mount | None
    chain: BlockChain | None
    links: tuple[PcieLink, ...] = ()
    nvme: tuple[NvmeController, ...] = ()

    @property
    def mountpoint(self) -> str:
        return self.mount.mountpoint if self.mount is not None else ""

    @property
    def device(self) -> str:
        """The ``device`` label: the block device the filesystem is on (``nvme0n1p2``), else the
        mount's source (``nas:/export``, ``tmpfs``), else ""."""
        if self.chain is not None:
            return self.chain.device
        return self.mount.source if self.mount is not None else ""

    @property
    def kind(self) -> str:
        """``network``, ``memory``, ``zfs``, or the chain's kind (``nvme``, ``dm``, ``loop``...);
        ``unknown`` where neither says."""
        if self.mount is not None and self.mount.kind != "local":
            return self.mount.kind
        if self.mount is not None and self.mount.fstype == "zfs":
            return "zfs"
        return self.chain.kind if self.chain is not None else "unknown"

    @property
    def ceiling(self) -> float | None:
        """Bytes per second the drives' links carry (one direction); None where unknown."""
        return (
            links_bytes_per_second(self.links) if self.kind not in ("network", "memory") else None
        )

    @property
    def rated(self) -> Rated | None:
        models = {c.model for c in self.nvme if c.model}
        found = [r for m in models if (r := rated(m)) is not None]
        return found[0] if len(found) == 1 and len(self.nvme) == 1 else None

    def describe(self) -> str:
        """One line: ``/data on /dev/nvme0n1p2 (ext4): nvme0 SAMSUNG ..., Gen5 x4``; on a loop
        device ``/mnt (ext4 on /dev/loop0): loop0 loop on /var/disk.img``. What is not known is
        left out."""
        if self.mount is None:
            return f"{self.directory} (mount unknown)"
        head = f"{self.mount.mountpoint} ({self.mount.fstype} on {self.mount.source})"
        if self.kind == "network":
            return f"{head}: a network share, no local drive"
        if self.kind == "memory":
            return f"{head}: memory, no drive"
        parts = []
        if self.chain is not None and len(self.chain.layers) > 1:
            parts.append(" over ".join(self.chain.layers[:-1]))
        for controller in self.nvme:
            link = next((k for k in self.links if k.address == controller.pci_address), None)
            drive = f"{controller.name} {controller.model}".strip()
            parts.append(drive + (f", {describe_link(link)}" if link is not None else ""))
        if not self.nvme and self.chain is not None and self.chain.disks:
            parts.append(", ".join(self.chain.disks) + f" ({self.chain.kind})")
        elif not self.nvme and self.chain is not None and self.chain.layers:
            # no disk under it (a loop device: its file; a dm device sysfs shows nothing
            # under): its bottom layer says what it is; an empty disk name read ":  (loop)"
            parts.append(self.chain.layers[-1])
        return head + (": " + "; ".join(parts) if parts else "")


def refusal(target: StorageTarget) -> str | None:
    """Why the probe does not start on ``target`` (a kernel's pseudo-filesystem), or None."""
    mount = target.mount
    if mount is None or mount.fstype not in PSEUDO_FSTYPES:
        return None
    at = "" if mount.mountpoint == target.directory else f" (mounted at {mount.mountpoint})"
    return (
        f"{target.directory} is on {mount.fstype}{at}, a pseudo-filesystem of the kernel: no "
        "drive is under it; give a directory on a drive's filesystem (where the data is)"
    )


def locate(directory: Path, sysfs: Path = Path("/sys"), rootfs: Path = Path("/")) -> StorageTarget:
    """Resolve ``directory`` to its mount and drives. Never raises: what cannot be read is
    left out (the probe itself refuses a directory that is not one)."""
    real = os.path.realpath(directory)
    device = directory_device(real)
    mount = find_mount(read_mounts(rootfs), real, device)
    chain = None
    if mount is not None and mount.kind == "local":
        if device is not None and device[0] != 0:
            chain = block_chain(sysfs, *device)
        if chain is None and mount.source.startswith("/dev/"):  # btrfs: an anonymous st_dev
            chain = named_chain(
                sysfs, os.path.basename(os.path.realpath(rootfs / mount.source[1:]))
            )
    links: list[PcieLink] = []
    controllers: list[NvmeController] = []
    if chain is not None:
        for name in chain.controllers:
            controller = read_controller(sysfs, name)
            if controller is not None:
                controllers.append(controller)
        for address in chain.pci_addresses:
            link = read_link(sysfs / "bus" / "pci" / "devices" / address)
            if link is not None:
                links.append(link)
    return StorageTarget(real, mount, chain, tuple(links), tuple(controllers))
