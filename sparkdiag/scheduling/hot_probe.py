"""The hot probe: a short measurement when the GPU runs hot, even while it is busy.

The periodic probe runs on an idle GPU every few minutes; memory cools within seconds after a
job stops, so it almost never sees a hot GPU, and the thermal-int4 collapse (4-bit GEMMs falling
apart when memory runs above about 85 °C) would go unseen. The hot probe runs the worker's
``hot`` suite (int4, bf16, fp16, fp8/nvfp4 at decode and LLM shapes, about 100 ms of GPU time,
no spin-up, measured even beside other work) when a GPU:

* becomes hot: memory at or above ``probe.hot-memory-celsius`` (80 °C), or, where memory has no
  sensor (GB10), the GPU at or above ``probe.hot-gpu-celsius`` (trigger ``threshold``);
* has a thermal clock event reason turn on (trigger ``thermal_reason``);
* stays hot, every ``probe.hot-interval`` seconds (trigger ``hot_rate``);

and never more often than once per ``probe.hot-min-interval`` per GPU. It judges each new
snapshot once: the poller's listener (:meth:`HotProbeScheduler.published`) wakes its thread,
which sleeps otherwise (no timer of its own). The quantity it is judged
by is int4 over bf16/fp16 at the decode shape, from their median iterations, timed back to back
in interleaved rounds: contention leaves a decode kernel's median iteration alone (it runs whole
inside a time slice), heat slows every int4 iteration. The ratio is compared with
the same ratio learned on a cool GPU (:func:`sparkdiag.baseline.evaluate.evaluate_ratios`, taught by
the periodic probe's cool cycles); a hot probe never teaches a baseline.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from sparkdiag.config import DEFAULTS
from sparkdiag.scheduling.probe_state import CycleRecord
from sparkdiag.scheduling.scheduler import GpuLocks, ProbeLoop, record_cycle
from sparkdiag.snapshot import GpuSample, Snapshot
from sparkdiag.sources.nvml.gpu import THERMAL_REASONS, reasons_mask
from sparkdiag.telemetry.busy import busy

log = logging.getLogger(__name__)

TRIGGERS = ("threshold", "thermal_reason", "hot_rate")
THERMAL_MASK = reasons_mask(THERMAL_REASONS)


@dataclass(frozen=True)
class HotLimits:
    """When a GPU counts as hot, and how often it is probed then (seconds); the defaults are the
    settings' (config.OPTIONS: probe.hot-memory-celsius, ...)."""

    memory_celsius: float = DEFAULTS["probe_hot_memory_celsius"]
    gpu_celsius: float = DEFAULTS["probe_hot_gpu_celsius"]
    interval: float = DEFAULTS["probe_hot_interval"]
    min_interval: float = DEFAULTS["probe_hot_min_interval"]
    busy_utilization: float = DEFAULTS["probe_busy_utilization"]


def heat(gpu: GpuSample, limits: HotLimits) -> tuple[bool, bool]:
    """(hot by temperature, a thermal clock event reason active) for one poll of ``gpu``."""
    memory = gpu.temperature_celsius.get("memory")
    if memory is not None:
        hot = memory >= limits.memory_celsius
    else:
        core = gpu.temperature_celsius.get("gpu")
        hot = core is not None and core >= limits.gpu_celsius
    thermal = bool((gpu.clock_event_reasons or 0) & THERMAL_MASK)
    return hot, thermal


@dataclass
class _Heat:
    hot: bool = False
    thermal: bool = False
    last_run: float = -math.inf


@dataclass(eq=False)
class HotProbeScheduler(ProbeLoop):
    """Watches the latest telemetry of every GPU and runs the hot probe when one is due."""

    prefix: ClassVar[str] = "hot-probe"
    limits: HotLimits
    locks: GpuLocks
    clock: Callable[[], float] = time.monotonic
    _heat: dict[str, _Heat] = field(init=False, default_factory=dict)
    _wake: threading.Event = field(init=False, default_factory=threading.Event)

    def published(self, _snapshot: object = None) -> None:
        """A new snapshot is the latest (the poller's listener): judge it in the thread."""
        self._wake.set()

    def interrupt(self) -> None:
        """Wake the thread so that it sees its stop event (the daemon, stopping)."""
        self._wake.set()

    def due(self, gpu: GpuSample, now: float) -> str | None:
        """The trigger that makes a hot probe of ``gpu`` due now, or None (updates its heat)."""
        hot, thermal = heat(gpu, self.limits)
        past = self._heat.setdefault(gpu.identity.uuid, _Heat())
        trigger = None
        if thermal and not past.thermal:
            trigger = "thermal_reason"
        elif hot and not past.hot:
            trigger = "threshold"
        elif (hot or thermal) and now - past.last_run >= self.limits.interval:
            trigger = "hot_rate"
        past.hot, past.thermal = hot, thermal
        if trigger is not None and now - past.last_run < self.limits.min_interval:
            return None  # rate-limited; a GPU that stays hot gets its hot_rate probe later
        return trigger

    def run_once(self) -> list[CycleRecord]:
        snapshot = self.latest()
        if snapshot is None:
            return []
        records = []
        now = self.clock()
        for gpu in snapshot.gpus:
            if not gpu.up:
                continue
            trigger = self.due(gpu, now)
            if trigger is None:
                continue
            lock = self.locks.get(gpu.identity.uuid)
            if not lock.acquire(blocking=False):
                # the periodic probe runs on it right now: its figures must not share the GPU
                # with ours; the trigger comes again at the next check
                heat_now = self._heat[gpu.identity.uuid]
                heat_now.hot = heat_now.thermal = False
                continue
            try:
                records.append(self._probe(gpu, snapshot, trigger))
            finally:
                lock.release()
            self._heat[gpu.identity.uuid].last_run = self.clock()
        return records

    def _probe(self, gpu: GpuSample, snapshot: Snapshot, trigger: str) -> CycleRecord:
        ident = gpu.identity
        evidence = busy(gpu, snapshot.excluded_pids, self.limits.busy_utilization)

        cycle = self.workers.run(self.launcher, gpu)
        base = (str(ident.index), ident.uuid, self.context)
        record = record_cycle(
            cycle,
            base,
            ident.name,
            self.store,
            learn=False,
            cool_below=self.limits.memory_celsius,
            trigger=trigger,
            busy=evidence is not None,
        )
        self.state.record_hot(record)
        ratios = ", ".join(f"int4/{r.versus} {r.value:.2f}" for r in record.ratios) or "no ratio"
        temps = ", ".join(f"{k} {v:.0f} °C" for k, v in record.max_temperature_celsius.items())
        level = logging.INFO if cycle.result == "ok" else logging.WARNING
        log.log(
            level,
            "hot probe GPU %d (%s%s): %s, %s%s",
            ident.index,
            trigger,
            ", busy" if evidence else "",
            cycle.result,
            ratios,
            f", {temps}" if temps else "",
        )
        return record

    def run(self, stop: threading.Event) -> None:
        """Judge each snapshot :meth:`published` (probing when due) until ``stop`` is set and
        :meth:`interrupt` called."""
        while not stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if stop.is_set():
                return
            try:
                self.run_once()
            except Exception:
                log.exception("hot probe failed")
