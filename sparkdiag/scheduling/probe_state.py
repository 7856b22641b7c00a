"""What the daemon remembers of its probe cycles, for the exporter: thread-safe, copied out."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the figures' module (the store, the worker's document) loads with a probe
    from sparkdiag.baseline.evaluate import GemmFigure, RatioFigure

RESULTS = ("ok", "skipped_busy", "timeout", "error", "unsupported")


@dataclass(frozen=True)
class CycleRecord:
    """One finished probe cycle on one GPU, in one context (native or container)."""

    gpu: str  # NVML index as a string
    uuid: str
    context: str
    result: str
    reason: str | None
    finished_at: float
    busy_seconds: float | None  # GPU-busy time the cycle cost
    figures: tuple[GemmFigure, ...] = ()
    bandwidth_bytes_per_second: float | None = None
    max_temperature_celsius: Mapping[str, float] = field(default_factory=dict)  # gpu, memory
    clock_event_reasons_seen: int | None = None
    mean_sm_clock_hertz: float | None = None
    mean_power_watts: float | None = None
    software: Mapping[str, Any] = field(default_factory=dict)
    ratios: tuple[RatioFigure, ...] = ()  # int4 over bf16/fp16 at the decode shape
    trigger: str | None = None  # hot probes: threshold, thermal_reason, hot_rate
    busy: bool | None = None  # hot probes: another process or high utilization as it started
    gpu_name: str = ""  # NVML name ("NVIDIA H200"): GPUs of one name in a node are peers


@dataclass(frozen=True)
class ProbeView:
    """A consistent copy of the probe state at one instant."""

    intervals: Mapping[str, float]  # context -> configured interval, seconds
    runs: Mapping[tuple[str, str, str, str], int]  # (gpu, uuid, context, result) -> count
    last: Mapping[tuple[str, str, str], CycleRecord]  # (gpu, uuid, context) -> last cycle
    last_success: Mapping[tuple[str, str, str], CycleRecord]
    hot_runs: Mapping[tuple[str, str, str, str, str], int] = field(default_factory=dict)
    # (gpu, uuid, context, trigger, result) -> count
    hot_last: Mapping[tuple[str, str, str], CycleRecord] = field(default_factory=dict)


class ProbeState:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._intervals: dict[str, float] = {}
        self._runs: dict[tuple[str, str, str, str], int] = {}
        self._last: dict[tuple[str, str, str], CycleRecord] = {}
        self._last_success: dict[tuple[str, str, str], CycleRecord] = {}
        self._hot_runs: dict[tuple[str, str, str, str, str], int] = {}
        self._hot_last: dict[tuple[str, str, str], CycleRecord] = {}
        self._absent: set[tuple[str, str]] = set()  # (gpu, uuid) not listed at the last look
        self._look: float | None = None  # the snapshot of that look

    def set_interval(self, context: str, seconds: float) -> None:
        with self._lock:
            self._intervals[context] = seconds

    def record(self, cycle: CycleRecord) -> None:
        key = (cycle.gpu, cycle.uuid, cycle.context)
        with self._lock:
            run_key = (*key, cycle.result)
            self._runs[run_key] = self._runs.get(run_key, 0) + 1
            self._last[key] = cycle
            if cycle.result == "ok":
                self._last_success[key] = cycle

    def record_hot(self, cycle: CycleRecord) -> None:
        """A hot probe: counted by trigger and result; the last ok one is kept."""
        key = (cycle.gpu, cycle.uuid, cycle.context)
        with self._lock:
            run_key = (*key, cycle.trigger or "", cycle.result)
            self._hot_runs[run_key] = self._hot_runs.get(run_key, 0) + 1
            if cycle.result == "ok":
                self._hot_last[key] = cycle

    def keep_gpus(self, listed: set[tuple[str, str]], look: float) -> None:
        """Forget the GPUs (index, uuid) that NVML has not listed at two looks in a row: their
        ``sparkdiag_gemm_*`` series kept their last figures for ever, and counted as peers'
        (found in a review). One look is not enough: a GPU's probe history is not lost to one
        odd answer. ``look`` names the snapshot (its time): the schedulers of the native and
        container probes share this state, and one snapshot seen by both is one look."""
        with self._lock:
            if look == self._look:
                return
            self._look = look
            seen = {(key[0], key[1]) for key in (*self._last, *self._hot_last, *self._runs)}
            gone = self._absent & (seen - listed)
            self._absent = seen - listed - gone
            if not gone:
                return
            tables: tuple[dict[Any, Any], ...] = (self._runs, self._last, self._last_success)
            tables += (self._hot_runs, self._hot_last)
            for table in tables:
                for key in [k for k in table if (k[0], k[1]) in gone]:
                    del table[key]

    def view(self) -> ProbeView:
        with self._lock:
            return ProbeView(
                intervals=MappingProxyType(dict(self._intervals)),
                runs=MappingProxyType(dict(self._runs)),
                last=MappingProxyType(dict(self._last)),
                last_success=MappingProxyType(dict(self._last_success)),
                hot_runs=MappingProxyType(dict(self._hot_runs)),
                hot_last=MappingProxyType(dict(self._hot_last)),
            )
