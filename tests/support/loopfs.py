"""A real filesystem on a loop device, made for a test and removed after it, and the cgroup v1
blkio throttle that makes it slow, for the storage probe's tests.

The backing file lives in the test's temporary directory; the loop device runs with
``--direct-io=on`` so that the probe's O_DIRECT reads and writes reach the backing file's disk
rather than its page cache. The throttle is a cgroup under ``/sys/fs/cgroup/blkio`` with
``blkio.throttle.{read,write}_bps_device`` for the loop device's major:minor; a command runs in
it through ``sh -c 'echo $$ > cgroup.procs; exec ...'``. Where this cannot be done (not root, no
losetup or mkfs.ext4, no loop device, no blkio controller) the test is skipped and says why.
Everything made is removed however the test ends: unmounted, detached, the cgroup deleted.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

BLKIO = Path("/sys/fs/cgroup/blkio")
_COUNTER = itertools.count()


@dataclass(frozen=True)
class LoopFs:
    """A mounted filesystem: its mount point, the loop device and its major:minor."""

    mountpoint: Path
    device: str  # /dev/loopN
    majmin: str  # "7:3"

    @property
    def name(self) -> str:
        return os.path.basename(self.device)


def _run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


def require_loop() -> None:
    if os.geteuid() != 0:
        pytest.skip("loop devices need root")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (util-linux, e2fsprogs)")


@contextlib.contextmanager
def loop_filesystem(directory: Path, megabytes: int = 512, options: str = "") -> Iterator[LoopFs]:
    """An ext4 filesystem of ``megabytes`` on a loop device, mounted under ``directory``."""
    require_loop()
    image = directory / "disk.img"
    mountpoint = directory / "mnt"
    mountpoint.mkdir()
    with image.open("wb") as fh:
        fh.truncate(megabytes << 20)
    try:
        device = _run("losetup", "--find", "--show", "--direct-io=on", str(image))
    except RuntimeError as exc:
        pytest.skip(f"no loop device here: {exc}")
    try:
        _run("mkfs.ext4", "-q", "-F", "-m", "0", device)
        _run("mount", *(("-o", options) if options else ()), device, str(mountpoint))
        majmin = Path(f"/sys/class/block/{os.path.basename(device)}/dev").read_text().strip()
        try:
            yield LoopFs(mountpoint, device, majmin)
        finally:
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)
    finally:
        subprocess.run(["losetup", "-d", device], capture_output=True, check=False)


@contextlib.contextmanager
def blkio_throttle(majmin: str, bytes_per_second: int) -> Iterator[Path]:
    """A blkio cgroup that holds reads and writes of ``majmin`` to ``bytes_per_second``."""
    if not (BLKIO / "blkio.throttle.read_bps_device").exists():
        pytest.skip("no cgroup v1 blkio controller at /sys/fs/cgroup/blkio (io.max not tried)")
    group = BLKIO / f"sparkdiag-test-{os.getpid()}-{next(_COUNTER)}"
    group.mkdir()
    try:
        for kind in ("read", "write"):
            (group / f"blkio.throttle.{kind}_bps_device").write_text(f"{majmin} {bytes_per_second}")
        yield group
    finally:
        # the command that ran in it has exited; an empty cgroup can be removed
        with contextlib.suppress(OSError):
            group.rmdir()


def in_cgroup(group: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside ``group`` (the shell moves itself there, then execs)."""
    return ["sh", "-c", f'echo $$ > "{group}/cgroup.procs" && exec "$@"', "sh", *argv]
