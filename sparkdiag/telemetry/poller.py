"""The poller: samples every source on an interval into an immutable :class:`Snapshot`.

Scrapes read :attr:`Poller.latest` (one reference read, no lock) and never wait on hardware. Events
that happen between polls (XID errors) are counted here, so that none is lost between scrapes,
and grouped into incidents per GPU and tier (:mod:`sparkdiag.sources.nvml.xid`).

Polls nobody reads are spaced out (:meth:`Poller.next_poll`): given ``pace``, the window in
which a scrape is expected (the daemon's render cache tells it), polls come every ``interval``
inside that window and every ``idle_interval`` outside it; the polls stay on the grid of
``interval``, so the two polls before an expected scrape are as close to it as before.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType

from sparkdiag.config import DEFAULTS
from sparkdiag.snapshot import (
    CollectorStatus,
    ExecutionContext,
    GpuSample,
    HostSample,
    NvmeController,
    PcieLink,
    PlatformIdentity,
    Snapshot,
    XidCounts,
)
from sparkdiag.sources.nvml import xid
from sparkdiag.sources.nvml.api import EVENT_XID_CRITICAL
from sparkdiag.sources.nvml.driver import NvmlHung
from sparkdiag.sources.nvml.gpu import GpuSource

log = logging.getLogger(__name__)

# runs a poll's NVML part (Poller.poll_once's ``bound``)
Bound = Callable[[Callable[[], tuple[GpuSample, ...]]], tuple[GpuSample, ...]]


@dataclass(eq=False)
class Poller:
    """Owns the sources; :meth:`poll_once` builds a new snapshot, :meth:`run` loops it."""

    gpu: GpuSource
    read_pcie: Callable[[], tuple[PcieLink, ...]] | None
    read_host: Callable[[], HostSample] | None
    context: ExecutionContext | None
    interval: float = DEFAULTS["poll_interval"]
    pcie_interval: float = DEFAULTS["pcie_interval"]
    idle_interval: float = DEFAULTS["idle_poll_interval"]
    # (from, to) in time.monotonic() seconds: when a scrape may read the next poll; None: always
    pace: Callable[[float], tuple[float, float]] | None = None
    excluded_pids: Callable[[], frozenset[int]] = frozenset
    clock: Callable[[], float] = time.time
    platform: PlatformIdentity | None = None
    read_gpu_functions: Callable[[], tuple[str, ...] | None] | None = None
    # NVMe controllers (sysfs temperatures; the health log refreshed by the source itself in a
    # thread of its own), read on the PCIe links' tier
    read_nvme: Callable[[], tuple[NvmeController, ...]] | None = None
    # what the polls keep between them
    latest: Snapshot | None = field(init=False, default=None)
    # when the latest snapshot was published, on the monotonic clock: how /healthz ages it (a
    # wall-clock step back left a hung poller healthy for the size of the step: a review)
    published_at: float | None = field(init=False, default=None)
    poll_count: int = field(init=False, default=0)
    _gpu_functions: tuple[str, ...] | None = field(init=False, default=None)
    _incidents: dict[tuple[int, str], int] = field(init=False, default_factory=dict)
    _incident_last: dict[tuple[int, str], float] = field(init=False, default_factory=dict)
    _xid_counts: dict[tuple[int, int], int] = field(init=False, default_factory=dict)
    _xid_last: dict[int, float] = field(init=False, default_factory=dict)
    _xid_last_code: dict[int, int] = field(init=False, default_factory=dict)
    _pcie: tuple[PcieLink, ...] = field(init=False, default=())
    _pcie_status: CollectorStatus = field(init=False, default=CollectorStatus(True, 0.0))
    _pcie_read_at: float = field(init=False, default=float("-inf"))
    _listeners: list[Callable[[Snapshot], object]] = field(init=False, default_factory=list)
    _nvme: tuple[NvmeController, ...] | None = field(init=False, default=None)
    _nvme_status: CollectorStatus = field(init=False, default=CollectorStatus(True, 0.0))
    _nvme_read_at: float = field(init=False, default=float("-inf"))

    def _read_gpus(self) -> tuple[GpuSample, ...]:
        self.gpu.backend.advance()
        gpus = self.gpu.read()
        self._count_events()
        return gpus

    def add_listener(self, fn: Callable[[Snapshot], object]) -> None:
        """Call ``fn(snapshot)`` after every poll (the watchdog, the probe scheduler)."""
        self._listeners.append(fn)

    def poll_once(self, bound: Bound | None = None) -> Snapshot:
        """A new snapshot. ``bound`` runs the NVML part of the poll (the GPUs' readings and
        events) and may raise :class:`NvmlHung`, which passes up: check's later polls are
        waited for so (:class:`sparkdiag.telemetry.build.BoundedPoll`), while the host's
        readings, which may be slow without NVML hanging (an NVMe tool, sysfs), are not."""
        self.poll_count += 1
        statuses: dict[str, CollectorStatus] = {}

        gpus: tuple[GpuSample, ...] = ()
        start = time.perf_counter()
        try:
            gpus = self._read_gpus() if bound is None else bound(self._read_gpus)
            statuses["nvml"] = CollectorStatus(
                self.gpu.nvml_up, time.perf_counter() - start, self.gpu.unavailable_reason
            )
        except NvmlHung:
            raise
        except Exception as exc:  # a bug or an unexpected library error must not stop the daemon
            log.exception("NVML poll failed")
            statuses["nvml"] = CollectorStatus(False, time.perf_counter() - start, repr(exc))

        now_mono = time.monotonic()
        if self.read_pcie is not None and now_mono - self._pcie_read_at >= self.pcie_interval:
            start = time.perf_counter()
            try:
                self._pcie = self.read_pcie()
                if self.read_gpu_functions is not None:
                    self._gpu_functions = self.read_gpu_functions()
                self._pcie_status = CollectorStatus(True, time.perf_counter() - start)
            except Exception as exc:
                # The last links read stay exported (a transient sysfs error should not make
                # every link series vanish); the pcie collector reports the failure.
                log.warning("reading PCIe links failed: %s", exc)
                self._pcie_status = CollectorStatus(False, time.perf_counter() - start, repr(exc))
            self._pcie_read_at = now_mono
        if self.read_pcie is not None:
            statuses["pcie"] = self._pcie_status

        if self.read_nvme is not None:
            statuses["nvme"] = self._poll_nvme(now_mono)

        host: HostSample | None = None
        if self.read_host is not None:
            start = time.perf_counter()
            try:
                host = self.read_host()
                statuses["host"] = CollectorStatus(True, time.perf_counter() - start)
            except Exception as exc:
                log.warning("reading host memory failed: %s", exc)
                statuses["host"] = CollectorStatus(False, time.perf_counter() - start, repr(exc))

        snapshot = Snapshot(
            timestamp=self.clock(),
            poll=self.poll_count,
            nvml_up=self.gpu.nvml_up,
            driver_version=self.gpu.driver_version,
            gpus=gpus,
            xid=XidCounts(
                counts=MappingProxyType(dict(self._xid_counts)),
                last_timestamp=MappingProxyType(dict(self._xid_last)),
                last_code=MappingProxyType(dict(self._xid_last_code)),
                incidents=MappingProxyType(dict(self._incidents)),
                incident_last=MappingProxyType(dict(self._incident_last)),
            ),
            pcie_links=self._pcie,
            context=self.context,
            host=host,
            collectors=MappingProxyType(statuses),
            excluded_pids=self.excluded_pids(),
            platform=self.platform,
            gpu_pci_devices=self._gpu_functions,
            nvme=self._nvme,
        )
        self.latest = snapshot
        self.published_at = time.monotonic()
        for fn in self._listeners:
            try:
                fn(snapshot)
            except Exception:
                log.exception("poll listener failed")
        return snapshot

    def _poll_nvme(self, now_mono: float) -> CollectorStatus:
        """The NVMe controllers, at most every ``pcie_interval`` seconds; on a failure the last
        reading stays exported and the status says why."""
        assert self.read_nvme is not None
        if now_mono - self._nvme_read_at >= self.pcie_interval:
            self._nvme_read_at = now_mono
            start = time.perf_counter()
            try:
                self._nvme = self.read_nvme()
                self._nvme_status = CollectorStatus(True, time.perf_counter() - start)
            except Exception as exc:
                log.warning("reading NVMe drives failed: %s", exc)
                self._nvme_status = CollectorStatus(False, time.perf_counter() - start, repr(exc))
        return self._nvme_status

    def _count_events(self) -> None:
        for event in self.gpu.events():
            if event.event_type & EVENT_XID_CRITICAL:
                key = (event.gpu, event.data)
                self._xid_counts[key] = self._xid_counts.get(key, 0) + 1
                self._xid_last[event.gpu] = event.timestamp
                self._xid_last_code[event.gpu] = event.data
                info = xid.describe(event.data)
                incident = (event.gpu, info.tier)
                if event.timestamp - self._incident_last.get(incident, float("-inf")) >= (
                    xid.INCIDENT_GAP_SECONDS
                ):
                    self._incidents[incident] = self._incidents.get(incident, 0) + 1
                self._incident_last[incident] = event.timestamp
                log.warning(
                    "GPU %d: XID %d (%s, %s): %s",
                    event.gpu,
                    event.data,
                    info.meaning,
                    info.tier,
                    info.action(event.gpu),
                )

    def run(self, stop: threading.Event, initial_delay: float = 0.0) -> None:
        """Poll until ``stop`` is set, at :meth:`next_poll`. Never drifts, never bursts.

        ``initial_delay``: seconds before the first poll (the daemon, which has just polled
        once before it reported READY, waits one interval)."""
        next_at = time.monotonic() + initial_delay
        if stop.wait(initial_delay):
            return
        while not stop.is_set():
            self.poll_once()
            next_at = self.next_poll(next_at, time.monotonic())
            stop.wait(next_at - time.monotonic())

    def next_poll(self, last: float, now: float) -> float:
        """When the poll after the one due at ``last`` is due (monotonic seconds; ``now`` is
        after that poll): ``interval`` later; a poll that overran skips the missed ticks
        instead of bursting. With ``pace``, ticks outside the window a scrape is expected in
        are skipped, up to ``idle_interval`` after ``last``."""
        step = self.interval
        ticks = 1 if now < last + step else math.floor((now - last) / step) + 1
        at = last + ticks * step
        if self.pace is None or self.idle_interval <= step:
            return at
        start, end = self.pace(step)
        latest = last + self.idle_interval
        while at + step <= latest and not start <= at <= end:
            at += step
        return at
