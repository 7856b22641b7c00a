"""The daemon's periodic storage probe: OFF by default (``storage.enabled``), because it writes.

When on, ``storage.first-delay`` seconds after start and then every ``storage.interval`` seconds
it writes ``storage.size`` bytes into ``storage.directory`` (the state directory by default) and
reads them back (on into GPU ``storage.gpu`` where set), through the same
:func:`~sparkdiag.storage.session.probe_directory` as ``sparkdiag storage``, records the figures
(baseline store, ``storage.json``, which the storage collector exports) and logs one line. A cycle
is skipped while a GPU is busy (the GEMM probe's rule, :mod:`sparkdiag.telemetry.busy`): the
probe's writes and reads would compete with a training job's checkpoints and data loading, and
the job's I/O would make the drive look slow. It says at start, in the log, that it writes.
Off, the daemon starts no storage thread and does no storage I/O at all
(tests/test_storage_daemon_io.py: no byte written by the daemon over a run).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sparkdiag.config import Settings
from sparkdiag.errors import SparkdiagError
from sparkdiag.snapshot import Snapshot
from sparkdiag.statedir import state_directory
from sparkdiag.storage.render import label, rate, size
from sparkdiag.storage.run import ProbeRequest
from sparkdiag.storage.session import Where, probe_directory, request_for
from sparkdiag.telemetry.busy import busy

log = logging.getLogger(__name__)

BUSY_RETRY = 600.0  # seconds until a cycle skipped as busy is tried again


@dataclass(eq=False)
class StoragePeriodic:
    """The loop; ``run(stop)`` in a thread of its own. ``snapshot`` gives the latest poll."""

    settings: Settings
    snapshot: Callable[[], Snapshot | None]
    name: str = "storage-probe"

    def request(self) -> ProbeRequest:
        directory = self.settings.storage_directory or self.settings.state_dir or state_directory()
        return request_for(directory, self.settings)

    def busy_reason(self) -> str | None:
        snap = self.snapshot()
        if snap is None:
            return None
        for gpu in snap.gpus:
            why = busy(gpu, snap.excluded_pids, self.settings.probe_busy_utilization)
            if why is not None:
                return f"GPU {gpu.identity.index} busy ({why.describe()})"
        return None

    def once(self) -> str:
        """One cycle: its log line (measured, skipped or failed)."""
        why = self.busy_reason()
        if why is not None:
            return f"storage probe skipped: {why}"
        request = self.request()
        settings = self.settings
        where = Where(settings.sysfs, settings.rootfs, settings.state_dir)
        try:
            report = probe_directory(request, where, record=True)
        except SparkdiagError as exc:
            return f"storage probe of {request.directory} failed: {exc.message}"
        figures = ", ".join(f"{label(f)} {rate(f.value)}" for f in report.figures)
        return (
            f"storage probe of {report.target.directory} ({report.target.device}): {figures}; "
            f"{report.verdict}; wrote {size(report.document.bytes_written)}"
        )

    def run(self, stop: threading.Event) -> None:
        request = self.request()
        gpu = "" if request.gpu is None else f", on into GPU {request.gpu.index} (storage.gpu)"
        log.info(
            "periodic storage probe on (storage.enabled): every %.0f s it WRITES %s into %s and "
            "reads it back%s (skipped while a GPU is busy)",
            self.settings.storage_interval,
            size(request.size),
            request.directory,
            gpu,
        )
        delay = self.settings.storage_first_delay
        while not stop.wait(delay):
            line = self.once()
            skipped = line.startswith("storage probe skipped")
            (log.debug if skipped else log.info)("%s", line)
            delay = min(BUSY_RETRY, self.settings.storage_interval) if skipped else (
                self.settings.storage_interval
            )  # fmt: skip
