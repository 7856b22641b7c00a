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
from sparkdiag.storage.evaluate import StorageReport, evaluate, other_io
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
    """The roots every reading is taken under, and the state directory."""

    sysfs: Path = Path("/sys")
    rootfs: Path = Path("/")
    state_dir: Path | None = None


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
    baseline store (teaching it when healthy) and ``storage.json``; without, the store is only
    read. Raises StorageProbeError when the probe refuses or fails (nothing is recorded); a
    kernel's pseudo-filesystem (/proc, /sys, /dev) is refused before the program starts."""
    target = locate(request.directory, where.sysfs, where.rootfs)
    # a path that is no directory (a device such as /dev/null, a file) is left to the program,
    # whose refusal names what it is; a directory, or a link to one, on a pseudo-filesystem is
    # refused here whatever else is wrong with it
    why = refusal(target) if _is_dir(Path(request.directory)) else None
    if why is None:
        why = _beyond_memory(target, request.size, where.rootfs)
    if why is not None:
        raise StorageProbeError(f"refused: {why}", exit_code=Exit.USAGE)
    if on_start is not None:
        on_start(target)
    device = target.chain.device if target.chain is not None else None
    before = io_bytes(where.sysfs, device) if device else None
    doc = run_probe(request, on_progress)
    after = io_bytes(where.sysfs, device) if device else None
    store, note = _store(where, record)
    try:
        report = evaluate(target, doc, store, record, other_io(doc, before, after), note)
    finally:
        if store is not None:
            store.close()
    if record:
        try:
            record_report(state_path(where.state_dir), report)
        except (SparkdiagError, OSError) as exc:
            log.warning("storage result not kept: %s", exc)
            report = replace(report, store_note=f"{report.store_note or ''} {exc}".strip())
    return report


# What a test file on a memory filesystem must leave of the memory available: its size is
# a cap, not memory that exists (a 64 GiB tmpfs on a 23 GiB machine took a 40 GiB test file)
MEMORY_MARGIN = 1 << 30


def _beyond_memory(target: StorageTarget, size: int, rootfs: Path) -> str | None:
    """Why a test file of ``size`` does not go on ``target``'s memory filesystem (tmpfs,
    ramfs): it would take more than the memory available less ``MEMORY_MARGIN``; None
    elsewhere, or where /proc/meminfo cannot be read (the program's free-space check stands)."""
    mount = target.mount
    if mount is None or mount.kind != "memory":
        return None
    text = read_proc_file(rootfs / "proc" / "meminfo")
    available = meminfo_bytes(text or "").get("MemAvailable")
    if available is None or size + MEMORY_MARGIN <= available:
        return None
    return (
        f"{target.directory} is on {mount.fstype}, held in memory: a {size / (1 << 30):.1f} GiB "
        f"test file would leave less than {MEMORY_MARGIN >> 30} GiB of the "
        f"{available / (1 << 30):.1f} GiB of memory available (whatever its size says); give a "
        "smaller --storage.size"
    )


def _is_dir(path: Path) -> bool:
    """Whether ``path`` is a directory, False where it cannot be looked at (a parent that
    cannot be entered): the program then refuses it and says why."""
    try:
        return path.is_dir()
    except OSError:
        return False
