"""The hot probe (sparkdiag.scheduling.hot_probe): when it runs, what it records and exports,
and the int4 ratio's cool baseline that only cool periodic cycles teach."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sparkdiag.baseline.keeper import StoreKeeper
from sparkdiag.baseline.store import BaselineStore
from sparkdiag.exporter.hot import HotProbeCollector
from sparkdiag.probe.launchers import FixtureLauncher
from sparkdiag.probe.runner import ProbeCycle
from sparkdiag.scheduling.hot_probe import HotLimits, HotProbeScheduler, heat
from sparkdiag.scheduling.probe_state import ProbeState
from sparkdiag.scheduling.scheduler import GpuLocks, ProbeScheduler
from sparkdiag.snapshot import GpuSample, Snapshot
from tests.support import fixture_snapshot as snapshot
from tests.support.e2e import hot_document, probe_document, write_probe_fixture

UUID = "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"
HEAT = {"max_memory_temperature_celsius": 91.0, "clock_event_reasons_seen": 0x20}
LIMITS = HotLimits(memory_celsius=80.0, gpu_celsius=85.0, interval=120.0, min_interval=60.0)


def _gpu(base: GpuSample, memory: float | None, gpu: float = 50.0, reasons: int = 0) -> GpuSample:
    temps = {"gpu": gpu} if memory is None else {"gpu": gpu, "memory": memory}
    return replace(base, temperature_celsius=temps, clock_event_reasons=reasons)


def test_heat_uses_memory_where_it_has_a_sensor_else_the_gpu(tmp_path: Path) -> None:
    base = snapshot("h200-idle", tmp_path).gpus[0]
    assert heat(_gpu(base, 79.0), LIMITS) == (False, False)
    assert heat(_gpu(base, 80.0), LIMITS) == (True, False)
    assert heat(_gpu(base, 60.0, reasons=0x40), LIMITS) == (False, True)
    assert heat(_gpu(base, 60.0, reasons=0x4), LIMITS) == (False, False)  # power cap: not heat
    assert heat(_gpu(base, None, gpu=86.0), LIMITS) == (True, False)  # GB10: no memory sensor
    assert heat(_gpu(base, 70.0, gpu=95.0), LIMITS) == (False, False)  # memory decides


class Calls:
    def __init__(self, cycles: FixtureLauncher) -> None:
        self.inner = cycles
        self.gpus: list[GpuSample] = []

    def __call__(self, gpu: GpuSample, on_start: Any) -> ProbeCycle:
        self.gpus.append(gpu)
        on_start(777)
        return self.inner(gpu, on_start)


def _scheduler(
    tmp_path: Path, snaps: list[Snapshot], clock: list[float], store: StoreKeeper | None = None
) -> tuple[HotProbeScheduler, Calls, ProbeState]:
    fixture = write_probe_fixture(tmp_path / "hot.json", [hot_document(UUID, {"int4": 0.5}, HEAT)])
    calls = Calls(FixtureLauncher(fixture, suite="hot"))
    state = ProbeState()
    sched = HotProbeScheduler(
        calls,
        state,
        store,
        "native",
        lambda: snaps[-1],
        LIMITS,
        GpuLocks(),
        clock=lambda: clock[0],
    )
    return sched, calls, state


def test_triggers_threshold_rate_thermal_and_the_rate_limit(tmp_path: Path) -> None:
    base = snapshot("h200-idle", tmp_path)
    cool = replace(base, gpus=(_gpu(base.gpus[0], 60.0),))
    hot = replace(base, gpus=(_gpu(base.gpus[0], 88.0),))
    hot_thermal = replace(base, gpus=(_gpu(base.gpus[0], 88.0, reasons=0x20),))
    snaps, clock = [cool], [1000.0]
    sched, calls, state = _scheduler(tmp_path, snaps, clock)

    assert sched.run_once() == []  # cool: nothing
    snaps.append(hot)
    (first,) = sched.run_once()
    assert first.trigger == "threshold" and first.result == "ok"
    clock[0] += 30
    assert sched.run_once() == []  # still hot, but the hot interval has not passed
    snaps.append(hot_thermal)
    assert sched.run_once() == []  # a thermal reason turns on, but within the minimum interval
    clock[0] += 31  # 61 s after the first: the rate limit no longer holds
    assert sched.run_once() == []  # the thermal reason was seen (and rate-limited) already
    clock[0] += 60  # 121 s: the hot interval has passed
    (again,) = sched.run_once()
    assert again.trigger == "hot_rate"
    snaps.append(cool)
    clock[0] += 500
    assert sched.run_once() == []  # cooled down
    assert len(calls.gpus) == 2
    view = state.view()
    assert view.hot_runs[("0", UUID, "native", "threshold", "ok")] == 1
    assert view.hot_runs[("0", UUID, "native", "hot_rate", "ok")] == 1
    assert sched.excluded_pids() == frozenset()  # 777 while it ran, not after


def test_a_busy_gpu_is_probed_and_marked_busy_and_a_running_probe_is_not_joined(
    tmp_path: Path,
) -> None:
    base = snapshot("h200-idle", tmp_path)
    busy = replace(base, gpus=(replace(_gpu(base.gpus[0], 90.0), compute_pids=(4242,)),))
    snaps, clock = [busy], [0.0]
    sched, calls, _state = _scheduler(tmp_path, snaps, clock)
    lock = sched.locks.get(UUID)
    with lock:  # the periodic probe holds the GPU
        assert sched.run_once() == []
    (record,) = sched.run_once()  # the trigger comes again once the GPU is free
    assert record.busy is True and record.trigger == "threshold"
    assert len(calls.gpus) == 1


def test_the_ratio_baseline_is_learned_cool_and_read_by_the_hot_probe(tmp_path: Path) -> None:
    """Three cool periodic cycles teach int4/bf16 and int4/fp16; a hot periodic cycle does not;
    the hot probe finds int4 at half of it and exports that."""
    store = BaselineStore(tmp_path / "b.sqlite")
    keeper = StoreKeeper(lambda: store)
    cool_docs = [probe_document(UUID, jitter) for jitter in (1.0, 0.99, 1.01)]
    hot_cycle = probe_document(UUID, scale={"int4": 0.3}, conditions=HEAT)
    fixture = write_probe_fixture(tmp_path / "periodic.json", [*cool_docs, hot_cycle])
    base = snapshot("h200-idle", tmp_path)
    periodic = ProbeScheduler(
        FixtureLauncher(fixture), ProbeState(), keeper, "native", lambda: base, 300.0
    )
    records = [periodic.run_cycle()[0] for _ in range(4)]
    learned = {r.versus: r.baseline for r in records[2].ratios}
    assert learned["bf16"] is not None and learned["bf16"].runs == 3
    expected = records[0].ratios[0].value
    assert learned["bf16"].tflops == pytest.approx(expected, rel=0.02)
    # the hot periodic cycle measured int4 at 0.3 but taught nothing
    assert {r.versus: r.baseline.runs for r in records[3].ratios if r.baseline} == {
        "bf16": 3,
        "fp16": 3,
    }

    hot = replace(base, gpus=(_gpu(base.gpus[0], 91.0, reasons=0x20),))
    snaps, clock = [hot], [0.0]
    sched, _calls, state = _scheduler(tmp_path, snaps, clock, keeper)
    (record,) = sched.run_once()
    assert {r.versus: round(r.efficiency or 0, 2) for r in record.ratios} == {
        "bf16": 0.5,
        "fp16": 0.5,
    }
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HotProbeCollector(state.view))  # type: ignore[arg-type]
    labels = {
        "gpu": "0",
        "uuid": UUID,
        "versus": "bf16",
        "shape": "1x8192x8192",
        "context": "native",
    }
    assert registry.get_sample_value(
        "sparkdiag_hot_probe_int4_ratio_efficiency", labels
    ) == pytest.approx(0.5, abs=0.01)
    gpu = {"gpu": "0", "uuid": UUID, "context": "native"}
    assert registry.get_sample_value("sparkdiag_hot_probe_busy", gpu) == 0.0
    assert (
        registry.get_sample_value(
            "sparkdiag_hot_probe_temperature_celsius", {**gpu, "sensor": "memory"}
        )
        == 91.0
    )
    assert (
        registry.get_sample_value(
            "sparkdiag_hot_probe_clock_event_active", {**gpu, "reason": "sw_thermal_slowdown"}
        )
        == 1.0
    )
    assert record.trigger == "thermal_reason"  # the reason and the heat came together
    runs = {**gpu, "trigger": "thermal_reason", "result": "ok"}
    assert registry.get_sample_value("sparkdiag_hot_probe_runs_total", runs) == 1.0
    store.close()


def test_a_fixture_without_the_suite_is_refused(tmp_path: Path) -> None:
    fixture = write_probe_fixture(tmp_path / "p.json", [probe_document(UUID)])
    with pytest.raises(ValueError, match="no cycle of the hot suite"):
        FixtureLauncher(fixture, suite="hot")
    doc = json.loads(fixture.read_text())
    assert FixtureLauncher(fixture).cycles[0].suite == doc["cycles"][0]["suite"] == "default"


def test_the_thread_judges_each_published_snapshot_and_nothing_in_between(
    tmp_path: Path,
) -> None:
    base = snapshot("h200-idle", tmp_path)
    hot = replace(base, gpus=(_gpu(base.gpus[0], 88.0),))
    snaps, clock = [base], [1000.0]
    sched, calls, _ = _scheduler(tmp_path, snaps, clock)
    judged = threading.Event()
    judgements: list[int] = []
    run_once = sched.run_once

    def counting() -> Any:
        judgements.append(1)
        try:
            return run_once()
        finally:
            judged.set()

    sched.run_once = counting  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(target=sched.run, args=(stop,), daemon=True)
    thread.start()
    time.sleep(0.3)
    assert judgements == []  # no snapshot published: it sleeps, no timer of its own
    snaps.append(hot)
    sched.published(hot)
    assert judged.wait(5)
    assert judgements == [1] and len(calls.gpus) == 1  # the hot GPU probed once
    stop.set()
    sched.interrupt()
    thread.join(5)
    assert not thread.is_alive() and judgements == [1]
