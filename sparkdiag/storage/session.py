"""One storage probe from start to verdict: locate the directory, run the measuring program,
count what else moved through the device meanwhile, compare with the baseline, keep the result.

``sparkdiag storage``, ``check --storage`` and the daemon's periodic probe all go through
:func:`probe_directory`, so that they measure, judge and record the same way.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from sparkdiag.baseline.model import BaselineStoreError
from sparkdiag.baseline.store import BaselineStore, open_store
from sparkdiag.config import Settings
from sparkdiag.errors import Exit, SparkdiagError
from sparkdiag.sources.host.blockdev import io_bytes
from sparkdiag.sources.host.meminfo import meminfo_bytes, read_proc_file
from sparkdiag.storage.evaluate import StorageReport, device_read, evaluate, other_io
from sparkdiag.storage.measure import SMALLEST_SIZE
from sparkdiag.storage.run import (
    GPU_SHARE,
    GpuRequest,
    ProbeRequest,
    Progress,
    StorageProbeError,
    run_probe,
)
from sparkdiag.storage.state import record_report, state_path
from sparkdiag.storage.target import StorageTarget, locate, refusal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Where:
    """The roots every reading is taken under, and the state directory. ``cgroupfs`` is where
    the cgroup hierarchies are mounted (``memory/`` under it for cgroup v1)."""

    sysfs: Path = Path("/sys")
    rootfs: Path = Path("/")
    state_dir: Path | None = None
    cgroupfs: Path = Path("/sys/fs/cgroup")


def request_for(directory: Path, settings: Settings) -> ProbeRequest:
    """The probe ``sparkdiag storage`` and the daemon run: ``storage.size`` and
    ``storage.duration``, and with ``storage.gpu`` the path into that GPU, read by the probe
    worker in ``probe.python`` (this Python by default) for 35 % of the duration."""
    gpu = None
    if settings.storage_gpu is not None:
        gpu = GpuRequest(
            settings.storage_gpu, GPU_SHARE * settings.storage_duration, settings.storage_gds,
            settings.probe_python or (sys.executable,),
        )  # fmt: skip
    return ProbeRequest(
        directory, size=settings.storage_size, seconds=settings.storage_duration, gpu=gpu
    )


def _store(where: Where, record: bool) -> tuple[BaselineStore | None, str | None]:
    try:
        return open_store(where.state_dir, create=record), None
    except BaselineStoreError as exc:
        return None, exc.message


def probe_directory(
    request: ProbeRequest,
    where: Where = Where(),
    record: bool = True,
    on_progress: Callable[[Progress], None] | None = None,
    on_start: Callable[[StorageTarget], None] | None = None,
) -> StorageReport:
    """Measure ``request.directory`` and judge it. With ``record`` the figures go into the
    baseline store (teaching it when healthy) and ``storage.json`` (not a run whose reads came
    from a cache: its figures are not the drive's, and the file is what the metrics export);
    without, the store is only read. Where recording was asked for and failed, the report's
    store_note says ``not recorded: WHY``, once. Raises StorageProbeError when the probe refuses
    or fails (nothing is recorded); a kernel's pseudo-filesystem (/proc, /sys, /dev) is refused
    before the program starts, a test file a tmpfs could not hold in memory too."""
    target = locate(request.directory, where.sysfs, where.rootfs)
    # a path that is no directory (a device such as /dev/null, a file) is left to the program,
    # whose refusal names what it is; a directory, or a link to one, on a pseudo-filesystem is
    # refused here whatever else is wrong with it
    why = refusal(target) if _is_dir(Path(request.directory)) else None
    if why is None:
        why = _beyond_memory(target, request.size, where.rootfs, where.cgroupfs)
    if why is not None:
        raise StorageProbeError(f"refused: {why}", exit_code=Exit.USAGE)
    if on_start is not None:
        on_start(target)
    device = target.chain.device if target.chain is not None else None
    before = io_bytes(where.sysfs, device) if device else None
    doc = run_probe(request, on_progress)
    after = io_bytes(where.sysfs, device) if device else None
    store, note = _store(where, record)
    if record and note is not None:  # asked to record, and the store cannot be had
        note = f"not recorded: {note}"
    try:
        read = device_read(before, after) if _sees_every_read(target, where.sysfs) else None
        report = evaluate(target, doc, store, record, other_io(doc, before, after), note, read)
    finally:
        if store is not None:
            store.close()
    if record and not report.cached:
        try:
            record_report(state_path(where.state_dir), report)
        except (SparkdiagError, OSError) as exc:
            log.warning("storage result not kept: %s", exc)
            if store is not None:  # else the note says why already: the same state directory
                why = exc.message if isinstance(exc, SparkdiagError) else str(exc)
                report = replace(report, store_note=f"not recorded in storage.json: {why}")
    return report


def _sees_every_read(target: StorageTarget, sysfs: Path) -> bool:
    """Whether the read counter of ``target``'s device counts every read of its filesystem, so
    that a device that read less than the probe tells a cache (storage/evaluate.py): not so on a
    btrfs over several devices, whose mirror or stripe may serve the reads from another one
    (``/sys/fs/btrfs/UUID/devices``), nor on a btrfs whose devices cannot be told."""
    mount, chain = target.mount, target.chain
    if chain is None or mount is None or mount.fstype != "btrfs":
        return True
    try:
        found = [
            d for d in (sysfs / "fs" / "btrfs").glob("*/devices") if (d / chain.device).exists()
        ]
        return len(found) == 1 and len(list(found[0].iterdir())) == 1
    except OSError:
        return False


# What a test file on a memory filesystem must leave of the memory available: its size is
# a cap, not memory that exists (a 64 GiB tmpfs on a 23 GiB machine took a 40 GiB test file)
MEMORY_MARGIN = 1 << 30


def _beyond_memory(
    target: StorageTarget, size: int, rootfs: Path, cgroupfs: Path = Path("/sys/fs/cgroup")
) -> str | None:
    """Why a test file of ``size`` does not go on ``target``'s memory filesystem (tmpfs,
    ramfs): it would take more than the memory available less ``MEMORY_MARGIN``, the smaller of
    /proc/meminfo's MemAvailable and what this process's memory cgroup may still charge
    (:func:`cgroup_headroom`: a tmpfs's pages are charged to the cgroup of who writes them, and
    a probe past its limit was OOM-killed with no word, exit 137); None elsewhere, or where
    neither can be read (the program's free-space check stands)."""
    mount = target.mount
    if mount is None or mount.kind != "memory":
        return None
    text = read_proc_file(rootfs / "proc" / "meminfo")
    available = meminfo_bytes(text or "").get("MemAvailable")
    limit = cgroup_headroom(rootfs, cgroupfs)
    of = "of memory available (whatever its size says)"
    if limit is not None and (available is None or limit.headroom < available):
        available, of = limit.headroom, f"this process's memory cgroup may still use ({limit})"
    if available is None or size + MEMORY_MARGIN <= available:
        return None
    advice = "give a smaller --storage.size"
    if available < SMALLEST_SIZE + MEMORY_MARGIN:
        advice = (
            f"not even the smallest ({_amount(SMALLEST_SIZE)}, --storage.size's minimum) would "
            "fit: measure it where more memory is available"
        )
    return (
        f"{target.directory} is on {mount.fstype}, held in memory: a {_amount(size)} test file "
        f"would leave less than {MEMORY_MARGIN >> 30} GiB of the {_amount(max(available, 0))} "
        f"{of}; {advice}"
    )


def _amount(value: float) -> str:
    """``3.0 GiB``; under 1 GiB ``768 MiB``."""
    return f"{value / (1 << 30):.1f} GiB" if value >= 1 << 30 else f"{value / (1 << 20):.0f} MiB"


# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit number
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class CgroupLimit:
    """The memory cgroup level that leaves the least: bytes it may still charge (its limit
    less its usage, the inactive page cache that reclaim would free not counted as used), the
    file its limit is in and the limit."""

    headroom: int
    path: Path
    limit: int

    def __str__(self) -> str:
        return f"{self.path} is {_amount(self.limit)}"


def cgroup_headroom(rootfs: Path, cgroupfs: Path) -> CgroupLimit | None:
    """What this process's memory cgroup, and every one above it, may still charge: the
    smallest of their limits less their usage. cgroup v2: ``memory.max`` (``max``: none) less
    ``memory.current``, in ``CGROUPFS/PATH`` for the ``0::PATH`` line of
    ``ROOT/proc/self/cgroup``; v1: ``memory.limit_in_bytes`` less ``memory.usage_in_bytes`` in
    ``CGROUPFS/memory/PATH`` for its ``memory`` line (preferred where both are there, as in a
    hybrid layout). The inactive page cache (``memory.stat``) is not counted as used: reclaim
    frees it first. A path not under the mount (a container without its own cgroup namespace)
    is read at the mount's root. None where no level has a limit or none can be read."""
    text = read_proc_file(rootfs / "proc" / "self" / "cgroup")
    v1 = v2 = None
    for line in (text or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            v1 = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
    if v1 is not None and (cgroupfs / "memory").is_dir():
        base, path = cgroupfs / "memory", v1
        files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    elif v2 is not None:
        base, path = cgroupfs, v2
        files = ("memory.max", "memory.current", "inactive_file")
    else:
        return None
    level = base / path.strip("/")
    if ".." in Path(path).parts or not level.is_dir():
        level = base
    found: CgroupLimit | None = None
    while True:
        limit, usage = _cgroup_number(level / files[0]), _cgroup_number(level / files[1])
        if limit is not None and limit < _V1_UNLIMITED and usage is not None:
            stat = read_proc_file(level / "memory.stat") or ""
            inactive = next(
                (int(f[1]) for f in (ln.split() for ln in stat.splitlines())
                 if len(f) == 2 and f[0] == files[2] and f[1].isdigit()), 0,
            )  # fmt: skip
            headroom = limit - max(0, usage - inactive)
            if found is None or headroom < found.headroom:
                found = CgroupLimit(headroom, level / files[0], limit)
        if level == base or level.parent == level:
            return found
        level = level.parent


def _cgroup_number(path: Path) -> int | None:
    """A cgroup file's one number; None for ``max``, a missing file or anything else."""
    text = (read_proc_file(path) or "").strip()
    return int(text) if text.isdigit() else None


def _is_dir(path: Path) -> bool:
    """Whether ``path`` is a directory, False where it cannot be looked at (a parent that
    cannot be entered): the program then refuses it and says why."""
    try:
        return path.is_dir()
    except OSError:
        return False
