"""The daemon's probe scheduler on fixtures: busy skips, own-worker exclusion, recording."""

from __future__ import annotations

import random
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from sparkdiag.baseline.keeper import StoreKeeper
from sparkdiag.baseline.store import BaselineStore
from sparkdiag.probe.launchers import ContainerLauncher, FixtureLauncher
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.probe.runner import ProbeCycle
from sparkdiag.scheduling.probe_state import ProbeState
from sparkdiag.scheduling.scheduler import ProbeScheduler
from sparkdiag.snapshot import GpuSample, Snapshot
from sparkdiag.sources.nvml.fixture import FixtureBackend
from sparkdiag.sources.nvml.gpu import GpuSource
from sparkdiag.telemetry.poller import Poller
from tests.support import NVML, PROBE
from tests.support import fixture_snapshot as snapshot


class Recorder:
    """A launcher that records its calls and answers with the recorded H200 document."""

    def __init__(self) -> None:
        self.calls: list[GpuSample] = []
        self.inner = FixtureLauncher(PROBE / "h200-default.json")

    def __call__(self, gpu: GpuSample, on_start: Any) -> ProbeCycle:
        self.calls.append(gpu)
        on_start(4242)
        return self.inner(gpu, on_start)


def make(
    snap: Snapshot, launcher: Any, store: BaselineStore | None = None, **kw: Any
) -> ProbeScheduler:
    keeper = None if store is None else StoreKeeper(lambda: store)
    return ProbeScheduler(launcher, ProbeState(), keeper, "native", lambda: snap, 300.0, **kw)


def test_idle_gpu_is_probed_and_recorded(tmp_path: Path) -> None:
    launcher = Recorder()
    with BaselineStore(tmp_path / "b.sqlite") as store:
        sched = make(snapshot("h200-idle", tmp_path), launcher, store)
        (record,) = sched.run_cycle()
        assert record.result == "ok" and len(launcher.calls) == 1
        assert record.uuid == "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"
        assert record.busy_seconds == pytest.approx(1.939, abs=0.01)
        assert record.max_temperature_celsius["memory"] == 52.0
        bf16 = next(
            f for f in record.figures if (f.dtype, f.kind, f.beta) == ("bf16", "compute", 0)
        )
        assert bf16.delivered == pytest.approx(725.47, abs=0.01)  # as recorded on the H200
        assert bf16.peak == pytest.approx(722.64, abs=0.01)
        assert bf16.baseline is None  # learning: fewer than 3 healthy runs
        sched.run_cycle()
        (third,) = sched.run_cycle()
        bf16 = next(f for f in third.figures if (f.dtype, f.kind, f.beta) == ("bf16", "compute", 0))
        assert bf16.baseline is not None and bf16.efficiency == pytest.approx(1.0)
    view = sched.state.view()
    assert view.runs[("0", record.uuid, "native", "ok")] == 3
    assert sched.excluded_pids() == frozenset()  # cleared once the worker ended


def test_busy_gpu_is_skipped_without_starting_a_worker(tmp_path: Path) -> None:
    launcher = Recorder()
    busy = snapshot("h200-load", tmp_path)  # pid 547 computing, utilization 99 %
    (record,) = make(busy, launcher).run_cycle()
    assert record.result == "skipped_busy"
    assert "pid 547" in (record.reason or "")
    assert launcher.calls == []


def test_utilization_alone_makes_it_busy(tmp_path: Path) -> None:
    snap = snapshot("h200-idle", tmp_path, {"utilization": {"gpu": 35, "memory": 5}})
    (record,) = make(snap, Recorder()).run_cycle()
    assert record.result == "skipped_busy" and "utilization 35%" in (record.reason or "")


def test_always_mode_probes_a_busy_gpu(tmp_path: Path) -> None:
    launcher = Recorder()
    (record,) = make(snapshot("h200-load", tmp_path), launcher, when="always").run_cycle()
    assert record.result == "ok" and len(launcher.calls) == 1


def test_own_worker_is_not_another_process(tmp_path: Path) -> None:
    load = snapshot("h200-load", tmp_path)
    own = Snapshot(**{**load.__dict__, "excluded_pids": frozenset({547})})
    sched = make(own, Recorder())
    gpu = own.gpus[0]
    # utilization is still 99 %: busy for that reason, not because of pid 547
    reason = sched.busy_reason(gpu, own)
    assert reason is not None and "pid" not in reason and "utilization" in reason


def test_lost_gpu_is_not_probed(tmp_path: Path) -> None:
    source = GpuSource(FixtureBackend(NVML / "h200-scripted.json"))
    assert source.start()
    poller = Poller(source, None, None, None)
    for _ in range(12):
        snap = poller.poll_once()
    assert not snap.gpus[0].up
    launcher = Recorder()
    assert make(snap, launcher).run_cycle() == []
    assert launcher.calls == []


def test_jitter_and_stop(tmp_path: Path) -> None:
    sched = make(snapshot("h200-idle", tmp_path), Recorder(), rng=random.Random(1), first_delay=0)
    delays = [sched.next_delay() for _ in range(100)]
    assert all(300.0 <= d <= 330.0 for d in delays) and len(set(delays)) > 90
    stop = threading.Event()
    thread = threading.Thread(target=sched.run, args=(stop,))
    thread.start()
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()


@pytest.mark.worker
def test_container_launcher_delivers_the_worker_on_stdin(tmp_path: Path) -> None:
    """A stand-in container (this interpreter under env -i) reading the worker from stdin."""
    launcher = ContainerLauncher(
        ["env", "-i", "PATH=/usr/bin:/bin", sys.executable, "-"],
        timeout=120,
        request=WorkerRequest(small=True, dtypes=("bf16",), bandwidth=False),
    )
    assert launcher.command[-1] == sys.executable  # the trailing "-" is the runner's
    snap = snapshot("h200-idle", tmp_path)
    # the fixture GPU is cuda:0, which a CPU-only torch has not got: the worker must say so
    state = ProbeState()
    sched = ProbeScheduler(launcher, state, None, "container", lambda: snap, 300.0)
    (record,) = sched.run_cycle()
    assert record.context == "container"
    assert record.result == "error"
    assert record.software.get("torch")  # the worker ran and reported its torch
    # diagnosed as sparkdiag compare diagnoses it (one container path for both)
    assert "CPU-only build" in (record.reason or ""), record.reason


def test_a_probe_fixture_of_another_gpu_model_is_said_once_per_gpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An H200 probe fixture beside a GB10 NVML fixture is judged against the GB10's references
    (the newcomer review: figures 7x the reference, nothing said); a warning names both, once
    per GPU, and a fixture of the same model says nothing."""
    launch = FixtureLauncher(PROBE / "h200-default.json")
    gb10 = snapshot("gb10-idle", tmp_path).gpus[0]
    with caplog.at_level("WARNING", logger="sparkdiag.probe.launchers"):
        launch(gb10, lambda _pid: None)
        launch(gb10, lambda _pid: None)
        launch(snapshot("h200-idle", tmp_path).gpus[0], lambda _pid: None)
    (said,) = [r.getMessage() for r in caplog.records]
    assert "recorded on NVIDIA H200, replayed for GPU 0 (NVIDIA GB10)" in said
