"""The daemon's probe scheduler: a cycle every interval (with jitter), one GPU after another.

Never steals the GPU: with ``when="idle"`` a GPU that the latest telemetry shows busy (a compute
process other than sparkdiag's own worker, or utilization above the threshold) is skipped
without starting a worker, and the worker checks again before and between its kernels.
"""

from __future__ import annotations

import importlib.util
import logging
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from sparkdiag.config import ConfigError, Settings
from sparkdiag.probe.baseline import BaselineStoreError, open_store
from sparkdiag.probe.evaluate import evaluate
from sparkdiag.probe.launchers import ContainerLauncher, FixtureLauncher, Launcher, WorkerLauncher
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.probe.runner import ProbeCycle
from sparkdiag.probe.state import CycleRecord, ProbeState
from sparkdiag.probe.store_health import StoreKeeper
from sparkdiag.telemetry.busy import busy
from sparkdiag.telemetry.poller import Poller
from sparkdiag.telemetry.snapshot import GpuSample, Snapshot

log = logging.getLogger(__name__)


class ProbeScheduler:
    def __init__(
        self,
        launcher: Launcher,
        state: ProbeState,
        store: StoreKeeper | None,
        context: str,
        latest: Callable[[], Snapshot | None],
        interval: float,
        jitter: float = 0.1,
        when: str = "idle",
        busy_utilization: float = 0.1,
        first_delay: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.launcher = launcher
        self.state = state
        self.store = store
        self.context = context
        self.latest = latest
        self.interval = interval
        self.jitter = jitter
        self.when = when
        self.busy_utilization = busy_utilization
        self.first_delay = min(interval, 30.0) if first_delay is None else first_delay
        self.rng = rng or random.Random()
        self._pids: set[int] = set()
        self._pids_lock = threading.Lock()
        state.set_interval(context, interval)

    def excluded_pids(self) -> frozenset[int]:
        """The probe workers running now: not counted as other compute processes."""
        with self._pids_lock:
            return frozenset(self._pids)

    def busy_reason(self, gpu: GpuSample, snapshot: Snapshot) -> str | None:
        """Why the GPU counts as busy in the latest telemetry, or None when it is idle."""
        evidence = busy(gpu, snapshot.excluded_pids, self.busy_utilization)
        if evidence is None:
            return None
        if evidence.other_pids:
            return f"other compute process(es) on the GPU: {evidence.describe()}"
        return f"GPU {evidence.describe()} above {self.busy_utilization:.0%}"

    def run_cycle(self) -> list[CycleRecord]:
        snapshot = self.latest()
        if snapshot is None:
            return []
        records = []
        for gpu in snapshot.gpus:
            if not gpu.up:
                continue
            records.append(self._probe(gpu, snapshot))
        return records

    def _probe(self, gpu: GpuSample, snapshot: Snapshot) -> CycleRecord:
        ident = gpu.identity
        base = (str(ident.index), ident.uuid, self.context)
        if self.when == "idle":
            busy = self.busy_reason(gpu, snapshot)
            if busy is not None:
                record = CycleRecord(*base, result="skipped_busy", reason=busy,
                                     finished_at=time.time(), busy_seconds=None)  # fmt: skip
                self.state.record(record)
                log.info("probe GPU %d skipped: %s", ident.index, busy)
                return record

        def started(pid: int) -> None:
            with self._pids_lock:
                self._pids.add(pid)

        try:
            cycle = self.launcher(gpu, started)
        finally:
            with self._pids_lock:
                self._pids.clear()
        record = self._record(cycle, base, ident.name)
        self.state.record(record)
        level = logging.INFO if cycle.result in ("ok", "skipped_busy") else logging.WARNING
        log.log(level, "probe GPU %d: %s%s", ident.index, cycle.result,
                f" ({cycle.reason})" if cycle.reason else "")  # fmt: skip
        return record

    def _record(self, cycle: ProbeCycle, base: tuple[str, str, str], gpu_name: str) -> CycleRecord:
        doc = cycle.document
        figures: tuple[Any, ...] = ()
        if doc is not None and cycle.result in ("ok", "error"):
            keeper = self.store
            store = keeper.store() if keeper is not None else None
            try:
                figures = tuple(evaluate(doc, base[1], gpu_name, self.context, store, record=True))
                if keeper is not None and store is not None:
                    keeper.succeeded()
            except BaselineStoreError as exc:  # a full disk must not lose the measurement
                if keeper is not None:
                    keeper.failed("write", exc)
                figures = tuple(evaluate(doc, base[1], gpu_name, self.context, None))
        if doc is None:
            return CycleRecord(*base, result=cycle.result, reason=cycle.reason,
                               finished_at=time.time(), busy_seconds=None)  # fmt: skip
        conditions = doc.conditions
        bandwidth = doc.bandwidth
        return CycleRecord(
            *base,
            result=cycle.result,
            reason=cycle.reason,
            finished_at=doc.finished_at or time.time(),
            busy_seconds=doc.gpu_busy_seconds,
            figures=figures,
            bandwidth_bytes_per_second=bandwidth.delivered if bandwidth else None,
            max_temperature_celsius=conditions.temperatures(),
            clock_event_reasons_seen=conditions.clock_event_reasons_seen,
            mean_sm_clock_hertz=conditions.mean_sm_clock_hertz,
            mean_power_watts=conditions.mean_power_watts,
            software=doc.software.as_dict(),
        )

    def next_delay(self) -> float:
        return self.interval * (1.0 + self.rng.uniform(0.0, self.jitter))

    def run(self, stop: threading.Event) -> None:
        delay = self.first_delay
        while not stop.wait(delay):
            try:
                self.run_cycle()
            except Exception:
                log.exception("probe cycle failed")
            delay = self.next_delay()


def build_schedulers(settings: Settings, poller: Poller, state: ProbeState) -> list[ProbeScheduler]:
    """The daemon's probe schedulers (native, and container when configured), each with one
    log line saying why it does not run. A bad probe setting raises ConfigError."""
    native = _native(settings, poller, state)
    container = _container(settings, poller, state, native.store if native else None)
    return [s for s in (native, container) if s is not None]


def _native(settings: Settings, poller: Poller, state: ProbeState) -> ProbeScheduler | None:
    """The probe scheduler, or None (with one log line saying why) when probing cannot run."""
    if not settings.probe_enabled:
        return None
    if not poller.gpu.identities:
        log.warning("no GPU: GEMM probes skipped")
        return None
    launcher: Launcher
    if settings.probe_fixture is not None:
        try:
            launcher = FixtureLauncher(settings.probe_fixture)
        except ValueError as exc:
            raise ConfigError(f"probe.fixture: {exc}") from None
    else:
        python = settings.probe_python or (sys.executable,)
        if settings.probe_python is None and importlib.util.find_spec("torch") is None:
            log.warning(
                "torch is not installed for %s: GEMM probes skipped "
                "(install them with: pip install 'sparkdiag[probe]')",
                sys.executable,
            )
            return None
        request = WorkerRequest(
            probe_when=settings.probe_when, busy_utilization=settings.probe_busy_utilization
        )
        launcher = WorkerLauncher(python, settings.probe_timeout, request)
    store = _store(settings)
    context = poller.context.context if poller.context else "native"
    return ProbeScheduler(
        launcher,
        state,
        store,
        context,
        lambda: poller.latest,
        settings.probe_interval,
        when=settings.probe_when,
        busy_utilization=settings.probe_busy_utilization,
        first_delay=settings.probe_first_delay,
    )


def _container(
    settings: Settings, poller: Poller, state: ProbeState, store: StoreKeeper | None
) -> ProbeScheduler | None:
    """The container probe (``probe.container-command``), labelled context="container";
    it shares the native probe's baseline store, or opens one when that probe does not run."""
    if not settings.probe_enabled or not settings.probe_container_command:
        return None
    if not poller.gpu.identities:
        return None
    if store is None:
        store = _store(settings)
    try:
        launcher = ContainerLauncher(
            settings.probe_container_command, settings.probe_timeout, WorkerRequest()
        )
    except ValueError as exc:
        raise ConfigError(f"probe.container-command: {exc}") from None
    return ProbeScheduler(
        launcher,
        state,
        store,
        "container",
        lambda: poller.latest,
        settings.probe_container_interval,
        when=settings.probe_when,
        busy_utilization=settings.probe_busy_utilization,
        first_delay=settings.probe_first_delay + 60.0,  # after the native cycle, not beside it
    )


def _store(settings: Settings) -> StoreKeeper:
    """The baseline database in the state directory, kept with its health (store_health.py)."""
    return StoreKeeper(lambda: open_store(settings.state_dir, create=True))
