"""The daemon's probe scheduler: a cycle every interval (with jitter), one GPU after another.

Never steals the GPU: with ``when="idle"`` a GPU that the latest telemetry shows busy (a compute
process other than sparkdiag's own worker, or utilization above the threshold) is skipped
without starting a worker, and the worker checks again before and between its kernels.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sparkdiag.baseline.evaluate import GemmFigure, RatioFigure, evaluate_cycle
from sparkdiag.baseline.keeper import StoreKeeper
from sparkdiag.config import DEFAULTS
from sparkdiag.probe.launchers import Launcher
from sparkdiag.probe.runner import ProbeCycle
from sparkdiag.scheduling.probe_state import CycleRecord, ProbeState, ProbeView
from sparkdiag.snapshot import GpuSample, Snapshot
from sparkdiag.telemetry.busy import busy

log = logging.getLogger(__name__)


class GpuLocks:
    """One lock per GPU (by uuid): a probe worker (periodic, container or hot) has the GPU to
    itself, so that no probe's figures share it with another probe's."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, uuid: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(uuid, threading.Lock())


class RunningWorkers:
    """The pids of a scheduler's workers running now, which the busy rule must not count as
    other compute processes; ``run`` launches one and tracks its pid until it ends."""

    def __init__(self) -> None:
        self._pids: set[int] = set()
        self._lock = threading.Lock()

    def pids(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._pids)

    def run(self, launcher: Launcher, gpu: GpuSample) -> ProbeCycle:
        mine: set[int] = set()

        def started(pid: int) -> None:
            with self._lock:
                mine.add(pid)
                self._pids.add(pid)

        try:
            return launcher(gpu, started)
        finally:
            with self._lock:
                self._pids -= mine


def peer_values(
    view: ProbeView, uuid: str, gpu_name: str, context: str, software: tuple[str, str, str]
) -> dict[tuple[str, str, int], list[float]]:
    """The healthy figures of this GPU's peers in the daemon: the other GPUs of the same name,
    context and probe software (driver, torch, cuda), from their last successful cycles."""
    values: dict[tuple[str, str, int], list[float]] = {}
    for (_gpu, other, ctx), record in sorted(view.last_success.items()):
        if other == uuid or ctx != context or record.gpu_name != gpu_name or not gpu_name:
            continue
        theirs = tuple(str(record.software.get(k) or "") for k in ("driver", "torch", "cuda"))
        if theirs != software:
            continue
        for fig in record.figures:
            if fig.counts_toward_baseline and fig.delivered is not None:
                values.setdefault((fig.dtype, fig.shape, fig.beta), []).append(fig.delivered)
    return values


def record_cycle(
    cycle: ProbeCycle,
    base: tuple[str, str, str],
    gpu_name: str,
    keeper: StoreKeeper | None,
    learn: bool,
    cool_below: float,
    peers: ProbeView | None = None,
    **extra: Any,
) -> CycleRecord:
    """A finished cycle as the daemon keeps it: figures and int4 ratios against their baselines
    (taught by the cycle with ``learn`` when its result is ok; the ratios only when it ran cool:
    memory below ``cool_below`` °C). ``peers``: the probe state whose other GPUs a learning
    baseline is held against (baseline/learning.py). A store that fails is reported to
    ``keeper`` and never loses the measurement. ``extra`` goes into the record (a hot probe's
    trigger, busy)."""
    uuid, context = base[1], base[2]
    doc = cycle.document
    if doc is None:
        return CycleRecord(
            *base,
            result=cycle.result,
            reason=cycle.reason,
            finished_at=time.time(),
            busy_seconds=None,
            gpu_name=gpu_name,
            **extra,
        )
    memory = doc.conditions.max_memory_temperature_celsius
    cool = memory is None or memory < cool_below
    figures: tuple[GemmFigure, ...] = ()
    ratios: tuple[RatioFigure, ...] = ()
    # Only an ok cycle teaches: one classified error (a kernel that failed its correctness check,
    # a worker that crashed after some kernels) is compared with the baselines but never learned
    # from, as ``sparkdiag probe`` has always done. Found in a review: the daemon learned from
    # error cycles, so a GPU whose kernel gave wrong results taught it its slow figures.
    teach = learn and cycle.result == "ok"
    if cycle.result in ("ok", "error"):
        store = keeper.store() if keeper is not None else None
        values = None
        if peers is not None and teach:
            values = peer_values(peers, uuid, gpu_name, context, doc.software.identity())
        # recorded whole or not at all; a store that fails to take the cycle (a full disk, a
        # lock held past its timeout) is compared with what it still reads
        done = evaluate_cycle(doc, uuid, gpu_name, context, store, teach, values, cool)
        figures, ratios = tuple(done.figures), tuple(done.ratios)
        if keeper is not None and store is not None and teach:
            if done.not_recorded is None:
                keeper.succeeded()
            else:
                keeper.failed("write", done.not_recorded)
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
        ratios=ratios,
        gpu_name=gpu_name,
        **extra,
    )


class HeldLog:
    """Logs a baseline held out of learning once when the hold starts, and once when it ends."""

    def __init__(self) -> None:
        self._held: set[tuple[str, str, str, int]] = set()

    def update(self, index: int, record: CycleRecord) -> None:
        if record.result != "ok":
            # a cycle that teaches nothing (record_cycle) is never vetted against the peers, so
            # it says nothing of whether a hold has ended
            return
        for fig in record.figures:
            key = (record.uuid, fig.dtype, fig.shape, fig.beta)
            kernel = f"{fig.dtype} {fig.shape}" + (f" beta={fig.beta}" if fig.beta else "")
            if fig.held is not None and key not in self._held:
                self._held.add(key)
                log.warning(
                    "GPU %d (%s) %s: %.4g delivered is %s; not learned as its baseline (held "
                    "until it comes back up: fix the GPU, or pin a baseline with sparkdiag "
                    "baseline pin)",
                    index,
                    record.uuid,
                    kernel,
                    fig.held.delivered,
                    fig.held.describe(),
                )
            elif fig.held is None and fig.delivered is not None and key in self._held:
                self._held.discard(key)
                log.info(
                    "GPU %d (%s) %s: no longer held; runs teach its baseline again",
                    index,
                    record.uuid,
                    kernel,
                )


@dataclass(eq=False)
class ProbeLoop:
    """What the periodic and the hot probe share: the launcher, where records go (the probe
    state, the baseline store), the probe context, the latest telemetry, one lock per GPU and
    the workers running now. ``name`` is the thread's: ``prefix`` and the context."""

    prefix: ClassVar[str] = "probe"
    launcher: Launcher
    state: ProbeState
    store: StoreKeeper | None
    context: str
    latest: Callable[[], Snapshot | None]
    workers: RunningWorkers = field(init=False, default_factory=RunningWorkers)
    name: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.name = f"{self.prefix}-{self.context}"

    def excluded_pids(self) -> frozenset[int]:
        """The probe workers running now: not counted as other compute processes."""
        return self.workers.pids()


@dataclass(eq=False)
class ProbeScheduler(ProbeLoop):
    interval: float
    jitter: float = 0.1
    when: str = DEFAULTS["probe_when"]
    busy_utilization: float = DEFAULTS["probe_busy_utilization"]
    first_delay: float | None = None
    rng: random.Random = field(default_factory=random.Random)
    cool_below: float = DEFAULTS["probe_hot_memory_celsius"]
    locks: GpuLocks = field(default_factory=GpuLocks)
    holds: HeldLog = field(init=False, default_factory=HeldLog)
    # set by run(): once it is, no GPU of a cycle under way starts a worker, and a cycle the
    # stop killed is not recorded (a SIGTERM during a cycle started the next GPU's worker 4 ms
    # later, and recorded the killed one as an error: found in a review)
    stopping: threading.Event = field(init=False, default_factory=threading.Event)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.first_delay is None:
            self.first_delay = min(self.interval, 30.0)
        self.state.set_interval(self.context, self.interval)

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
        if snapshot.nvml_up:  # GPUs NVML no longer lists lose their probe series
            listed = {(str(g.identity.index), g.identity.uuid) for g in snapshot.gpus}
            self.state.keep_gpus(listed, snapshot.timestamp)
        records = []
        for gpu in snapshot.gpus:
            if self.stopping.is_set():
                break
            if not gpu.up:
                continue
            record = self._probe(gpu, snapshot)
            if record is not None:
                records.append(record)
        return records

    def _fresh(self, gpu: GpuSample, cycle_snapshot: Snapshot) -> tuple[GpuSample, Snapshot] | None:
        """``gpu`` and its snapshot as the latest telemetry has them now; None when that GPU is
        gone or down since the cycle began.

        Found in a review: the busy rule was applied to the snapshot read once when the cycle
        began, so a GPU probed after others was judged by telemetry up to several worker
        timeouts old, and a job that started meanwhile was measured (the container probe's
        worker, told ``probe_when="always"``, does not check for itself)."""
        snapshot = self.latest() or cycle_snapshot
        now = next((g for g in snapshot.gpus if g.identity.uuid == gpu.identity.uuid), None)
        if now is None or not now.up:
            return None
        return now, snapshot

    def _probe(self, gpu: GpuSample, cycle_snapshot: Snapshot) -> CycleRecord | None:
        ident = gpu.identity
        base = (str(ident.index), ident.uuid, self.context)
        # The GPU's lock first (a hot probe may hold it), then the latest telemetry: what the busy
        # rule judges is what is on the GPU just before the worker starts.
        with self.locks.get(ident.uuid):
            fresh = self._fresh(gpu, cycle_snapshot)
            if fresh is None:
                log.info("probe GPU %d not probed: gone or down since the cycle began", ident.index)
                return None
            gpu, snapshot = fresh
            why = self.busy_reason(gpu, snapshot) if self.when == "idle" else None
            if why is not None:
                return self._skipped(base, ident.index, why)
            if self.stopping.is_set():
                return None
            cycle = self.workers.run(self.launcher, gpu)
        if self.stopping.is_set():
            log.info("probe GPU %d: stopped with the daemon", ident.index)
            return None
        record = record_cycle(
            cycle,
            base,
            ident.name,
            self.store,
            learn=True,
            cool_below=self.cool_below,
            peers=self.state.view(),
        )
        self.state.record(record)
        self.holds.update(ident.index, record)
        level = logging.INFO if cycle.result in ("ok", "skipped_busy") else logging.WARNING
        log.log(
            level,
            "probe GPU %d: %s%s",
            ident.index,
            cycle.result,
            f" ({cycle.reason})" if cycle.reason else "",
        )
        return record

    def _skipped(self, base: tuple[str, str, str], index: int, why: str) -> CycleRecord:
        record = CycleRecord(
            *base, result="skipped_busy", reason=why, finished_at=time.time(), busy_seconds=None
        )
        self.state.record(record)
        log.info("probe GPU %d skipped: %s", index, why)
        return record

    def next_delay(self) -> float:
        return self.interval * (1.0 + self.rng.uniform(0.0, self.jitter))

    def run(self, stop: threading.Event) -> None:
        """Cycles until ``stop``; the store's retention runs at start and after cycles (at most
        every ``keeper.MAINTAIN_EVERY`` seconds), so its size stays bounded."""
        self.stopping = stop
        self._maintain(force=True)
        delay = self.first_delay
        while not stop.wait(delay):
            try:
                self.run_cycle()
            except Exception:
                log.exception("probe cycle failed")
            self._maintain()
            delay = self.next_delay()

    def _maintain(self, force: bool = False) -> None:
        if self.store is None:
            return
        try:
            self.store.maintain(force)
        except Exception:
            log.exception("baseline store maintenance failed")
