"""Where the job writes and reads, and what its stores can do: the sampling side of the storage
evidence (:mod:`.store_evidence` reads it from the recording).

While it samples, in a tick in which the job wrote at least ``WRITE_MIN`` bytes/s (a
checkpoint's burst) or read at least ``READ_MIN``, the files its busy processes (at least
``PROCESS_MIN`` each) hold open are listed (``/proc/PID/fd``: opened for writing, or for
reading) into the tick (:func:`heavy_files`). At the end each of their directories is placed on
its mount (:func:`locate_places`: ``sparkdiag storage``'s own reading, ``storage/target.py``,
where the job shares watch's mount namespace; else the job's own ``/proc/PID/mountinfo``), and
the latest figures of ``sparkdiag storage`` per mount point are read from ``storage.json`` in
the state directory (:func:`read_stores`). All of it is kept in the recording, so that
``--replay`` says the same.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from sparkdiag.errors import SparkdiagError
from sparkdiag.sources.host import procfs
from sparkdiag.sources.host.mounts import find_mount, read_mounts
from sparkdiag.storage.state import read_state, state_path
from sparkdiag.storage.target import locate
from sparkdiag.watch.model import Place, StoreSpeed

WRITE_MIN = 50e6  # bytes/s: diagnose's WRITE_BURST_MIN, the least a checkpoint's burst writes
READ_MIN = 100e6  # bytes/s: evidence's READ_HEAVY
PROCESS_MIN = 1e6  # bytes/s of one process before its open files are looked at
FILES_MAX = 8  # paths kept per tick and direction


def heavy_files(
    rootfs: Path, write_by: dict[int, float], read_by: dict[int, float]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The files held open for writing and for reading by the processes that wrote (read) at
    least ``PROCESS_MIN`` in a tick in which the job wrote ``WRITE_MIN`` (read ``READ_MIN``)."""

    def files(rates: dict[int, float], floor: float, writing: bool) -> tuple[str, ...]:
        if sum(rates.values()) < floor:
            return ()
        found: list[str] = []
        for pid in sorted(rates, key=lambda p: -rates[p]):
            if rates[pid] < PROCESS_MIN:
                break
            for f in procfs.open_files(rootfs, pid):
                if f.writing == writing and f.path not in found:
                    found.append(f.path)
        return tuple(found[:FILES_MAX])

    return files(write_by, WRITE_MIN, True), files(read_by, READ_MIN, False)


def _same_namespace(rootfs: Path, pid: int) -> bool:
    """The job sees the mounts watch sees (its paths can be followed from here)."""
    if rootfs != Path("/"):
        return False
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
    except OSError:
        return True  # no namespaces to tell apart (or not ours to read): take the paths as ours


def locate_places(rootfs: Path, sysfs: Path, pid: int, paths: Iterable[str]) -> tuple[Place, ...]:
    """Each directory of ``paths`` (as the job ``pid`` sees them) on its mount."""
    directories = sorted({os.path.dirname(p) or "/" for p in paths})
    if not directories:
        return ()
    same = _same_namespace(rootfs, pid)
    mounts = [] if same else read_mounts(rootfs, pid)
    places = []
    for directory in directories:
        if same:
            target = locate(Path(directory), sysfs, rootfs)
            mount, kind = target.mount, target.kind
        else:
            mount = find_mount(mounts, directory)
            kind = mount.kind if mount is not None else ""
        if mount is None:
            places.append(Place(directory))
            continue
        places.append(Place(directory, mount.mountpoint, mount.fstype, mount.source, kind))
    return tuple(places)


def read_stores(state_dir: Path | None) -> tuple[tuple[StoreSpeed, ...], str]:
    """The latest figures of ``sparkdiag storage`` per mount point (its host path), and one
    line where ``storage.json`` could not be read ("" when it is fine or absent)."""
    try:
        probes = read_state(state_path(state_dir))
    except (SparkdiagError, OSError) as exc:
        return (), f"the storage probe's figures: {exc}; the store's speed is not compared"
    stores = []
    for p in probes or ():
        speed = {f.direction: f.bytes_per_second for f in p.figures if f.path == "host"}
        stores.append(
            StoreSpeed(
                p.mountpoint, p.device, p.kind, p.finished_at, speed.get("write"), speed.get("read")
            )
        )
    return tuple(stores), ""
