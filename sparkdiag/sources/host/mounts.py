"""The mount a directory lives on, from ``ROOT/proc/self/mountinfo`` (``--path.rootfs``).

One line of mountinfo (proc(5))::

    36 35 259:2 / /data rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
    ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER-OPTIONS

Mount points escape space, tab, newline and backslash as octal (``\\040``). Same reading as
``findmnt -T DIR`` (or ``df DIR``). Pure text parsing: the file is read by the caller.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from sparkdiag.sources.files import MIB, read_text_limited

# Filesystems whose data travels over a network (or a hypervisor's share): their speed is the
# network's or the server's, and no local drive is their ceiling.
NETWORK_FSTYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "lustre",
        "9p",
        "afs",
        "virtiofs",
        "beegfs",
        "gpfs",
        "wekafs",
        "orangefs",
        "ocfs2",
        "gfs2",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.juicefs",
        "fuse.gcsfuse",
        "fuse.rclone",
        "fuse.glusterfs",
        "fuse.ceph",
        "fuse.lxcfs",
    }
)
MEMORY_FSTYPES = frozenset({"tmpfs", "ramfs", "hugetlbfs"})
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One mount: where, what kind, from what (``findmnt -T DIR -o TARGET,FSTYPE,SOURCE``).

    major, minor: the device number the kernel gives the filesystem (0 for btrfs subvolumes,
    network and memory filesystems, whose numbers name no block device)
    read_only: this mount or its filesystem is read-only (``ro`` in either's options)
    filesystem_read_only: the filesystem itself is (``ro`` in the super options): a read-only
        bind mount of a writable filesystem is ``read_only`` but not this
    """

    mountpoint: str
    fstype: str
    source: str
    major: int
    minor: int
    read_only: bool
    filesystem_read_only: bool = False

    @property
    def kind(self) -> str:
        """``network``, ``memory`` or ``local`` (a filesystem on a block device, or unknown)."""
        if self.fstype in NETWORK_FSTYPES or self.fstype.startswith("fuse.sshfs"):
            return "network"
        if self.fstype in MEMORY_FSTYPES:
            return "memory"
        return "local"


def _unescape(text: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> list[Mount]:
    """Every well-formed line of a mountinfo file, in the file's order; others are skipped."""
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, tail_fields = head.split(), tail.split()
        if not sep or len(fields) < 6 or len(tail_fields) < 2:
            continue
        major, _, minor = fields[2].partition(":")
        if not (major.isdigit() and minor.isdigit()):
            continue
        super_options = set(tail_fields[2].split(",") if len(tail_fields) > 2 else ())
        options = set(fields[5].split(",")) | super_options
        mounts.append(
            Mount(
                mountpoint=_unescape(fields[4]),
                fstype=tail_fields[0],
                source=_unescape(tail_fields[1]),
                major=int(major),
                minor=int(minor),
                read_only="ro" in options,
                filesystem_read_only="ro" in super_options,
            )
        )
    return mounts


def _under(path: str, mountpoint: str) -> bool:
    return mountpoint == "/" or path == mountpoint or path.startswith(mountpoint.rstrip("/") + "/")


def find_mount(
    mounts: list[Mount], path: str, device: tuple[int, int] | None = None
) -> Mount | None:
    """The mount that holds ``path`` (absolute, symlinks resolved): the one with the longest
    mount point above it, the later of equal ones (it shadows the earlier). With ``device``
    (the ``st_dev`` of the path as major, minor) a mount of that device wins over others, so
    that a bind mount or an over-mount is not mistaken for the filesystem that holds the path.
    """
    path = os.path.normpath(path)
    above = [m for m in mounts if _under(path, m.mountpoint)]
    if device is not None:
        same = [m for m in above if (m.major, m.minor) == device]
        above = same or above
    best: Mount | None = None
    for mount in above:
        if best is None or len(mount.mountpoint) >= len(best.mountpoint):
            best = mount
    return best


def read_mounts(rootfs: Path, pid: int | None = None) -> list[Mount]:
    """The mounts of ``ROOT/proc/self/mountinfo`` (with ``pid``, that process's: the mounts as
    it sees them, in its own mount namespace); [] when it cannot be read."""
    who = "self" if pid is None else str(pid)
    try:
        return parse_mountinfo(read_text_limited(rootfs / "proc" / who / "mountinfo", 4 * MIB))
    except OSError:
        return []


def directory_device(path: str) -> tuple[int, int] | None:
    """The device number (major, minor) of the filesystem that holds ``path`` (``stat -c %d``,
    split); None when it cannot be looked at."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return None
    return os.major(dev), os.minor(dev)
