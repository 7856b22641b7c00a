"""The daemon's probe scheduler on fixtures: busy skips, own-worker exclusion, recording."""

from __future__ import annotations

import dataclasses
import json
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
from tests.support import NVML, PROBE, scaled_cycle, without_gpu
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
@without_gpu
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


# -- found in a review: what teaches a baseline, and which telemetry the busy rule reads ----------


def replayed(out: Path, *docs: dict[str, Any]) -> FixtureLauncher:
    """A launcher that replays ``docs`` in turn, one per cycle (the last one repeating)."""
    out.write_text(json.dumps({"format": "sparkdiag-probe-fixture/1", "cycles": list(docs)}))
    return FixtureLauncher(out)


def figure(record: Any, dtype: str, shape: str, beta: int = 0) -> Any:
    return next(f for f in record.figures if (f.dtype, f.shape, f.beta) == (dtype, shape, beta))


LLM = ("bf16", "4096x11008x4096")  # a kernel each of these cycles measured


def test_an_error_cycle_is_compared_but_never_teaches(tmp_path: Path) -> None:
    """Found in a review: the daemon learned baselines from cycles it classed ``error`` (here a
    bf16 kernel that failed its correctness check, the others at 0.6 of idle), where ``sparkdiag
    probe`` learns from ``ok`` cycles only. One idle cycle and two such error cycles froze
    0.6 of idle as the baseline (the median of the first three)."""
    idle = json.loads((PROBE / "h200-default.json").read_text())
    wrong = json.loads(scaled_cycle(tmp_path / "slow.json", 0.6).read_text())
    wrong["results"][0].update(
        status="error", reason="result mismatch: max rel error 0.31 > bound 0.02", delivered=None
    )
    launcher = replayed(tmp_path / "cycles.json", idle, wrong, wrong, idle, idle, wrong)
    with BaselineStore(tmp_path / "b.sqlite") as store:
        sched = make(snapshot("h200-idle", tmp_path), launcher, store)
        records = [sched.run_cycle()[0] for _ in range(3)]
        assert [r.result for r in records] == ["ok", "error", "error"]
        assert figure(records[-1], *LLM).delivered is not None  # measured, and reported
        assert figure(records[-1], *LLM).baseline is None  # one ok cycle: nothing learned yet
        sched.run_cycle()
        (learned,) = sched.run_cycle()  # the third ok cycle: the baseline is idle's figure
        idle_llm = figure(learned, *LLM).delivered
        assert figure(learned, *LLM).baseline.tflops == pytest.approx(idle_llm)
        (late,) = sched.run_cycle()  # an error cycle once it is learned: compared with it
        assert late.result == "error"
        assert figure(late, *LLM).baseline.tflops == pytest.approx(idle_llm)
        assert figure(late, *LLM).efficiency == pytest.approx(0.6)


def test_a_run_beside_another_compute_process_is_compared_but_never_teaches(
    tmp_path: Path,
) -> None:
    """Found in a review: a run in which the worker saw another compute process on the GPU
    (``busy.other_pids``; measured with ``probe.when always``, as the container probe always
    is) taught the baseline. Three such runs at 0.62 of idle passed the reference floor and
    froze 0.62 of idle as the baseline; now they are compared and reported, and the idle runs
    after them teach it."""
    beside = json.loads(scaled_cycle(tmp_path / "beside.json", 0.62, [547]).read_text())
    idle = json.loads((PROBE / "h200-default.json").read_text())
    launcher = replayed(tmp_path / "cycles.json", beside, beside, beside, idle, idle, idle, beside)
    busy = snapshot("h200-load", tmp_path)  # pid 547 computing, as the worker saw
    with BaselineStore(tmp_path / "b.sqlite") as store:
        sched = make(busy, launcher, store, when="always")
        for _ in range(3):
            (record,) = sched.run_cycle()
            assert record.result == "ok"
            assert all(not f.counts_toward_baseline for f in record.figures)
            assert figure(record, *LLM).delivered is not None
            assert figure(record, *LLM).baseline is None
        for _ in range(3):
            (learned,) = sched.run_cycle()
        idle_llm = figure(learned, *LLM).delivered
        assert figure(learned, *LLM).baseline.tflops == pytest.approx(idle_llm)
        (late,) = sched.run_cycle()  # beside the process again: compared with idle's baseline
        assert figure(late, *LLM).efficiency == pytest.approx(0.62)
        assert figure(late, *LLM).baseline.tflops == pytest.approx(idle_llm)


def test_each_gpu_is_judged_busy_by_the_latest_telemetry_before_its_worker(
    tmp_path: Path,
) -> None:
    """Found in a review: the periodic cycle applied the busy rule to the snapshot read when it
    began, so GPUs probed later were judged by telemetry several worker timeouts old; a job
    that started on every GPU while GPU 0 was probed was measured on the other seven (the
    container probe's worker, told ``probe_when="always"``, does not check for itself)."""
    idle = snapshot("h200-x8", tmp_path)
    busy = dataclasses.replace(
        idle, gpus=tuple(dataclasses.replace(g, compute_pids=(547,)) for g in idle.gpus)
    )
    current = [idle]
    inner = Recorder()

    def launcher(gpu: GpuSample, on_start: Any) -> ProbeCycle:
        current[0] = busy  # the poller publishes: job 547 runs on every GPU now
        return inner(gpu, on_start)

    sched = ProbeScheduler(launcher, ProbeState(), None, "container", lambda: current[0], 300.0)
    records = sched.run_cycle()
    assert [r.result for r in records] == ["ok"] + ["skipped_busy"] * 7
    assert all("pid 547" in (r.reason or "") for r in records[1:])
    assert [g.identity.index for g in inner.calls] == [0]


def test_a_gpu_lost_since_the_cycle_began_is_not_probed(tmp_path: Path) -> None:
    """The latest telemetry, read just before each GPU's worker, also says whether the GPU is
    still there: one lost meanwhile is left alone (as a cycle that began without it would)."""
    idle = snapshot("h200-x8", tmp_path)
    lost = dataclasses.replace(
        idle, gpus=tuple(dataclasses.replace(g, up=g.identity.index != 3) for g in idle.gpus)
    )
    current = [idle]
    inner = Recorder()

    def launcher(gpu: GpuSample, on_start: Any) -> ProbeCycle:
        current[0] = lost
        return inner(gpu, on_start)

    sched = ProbeScheduler(launcher, ProbeState(), None, "native", lambda: current[0], 300.0)
    records = sched.run_cycle()
    assert [r.gpu for r in records] == ["0", "1", "2", "4", "5", "6", "7"]
    assert all(r.result == "ok" for r in records)


def test_a_gpu_nvml_no_longer_lists_loses_its_probe_series(tmp_path: Path) -> None:
    """A GPU gone from NVML's list kept its last sparkdiag_gemm_* figures for ever, counted as
    a peer's (found in a review): absent at two looks in a row, it is forgotten; one look
    keeps it, though the native and container schedulers both saw it (a review of the fix)."""
    from sparkdiag.exporter.probe import ProbeCollector

    full, missing = snapshot("h200-x8", tmp_path), snapshot("h200-x8-one-missing", tmp_path)
    assert len(full.gpus) == 8 and len(missing.gpus) == 7
    snap, state = [full], ProbeState()
    launcher = FixtureLauncher(PROBE / "h200-default.json")
    sched = ProbeScheduler(launcher, state, None, "native", lambda: snap[0], 300.0)

    def gpus() -> set[str]:
        families = {f.name: f for f in ProbeCollector(state.view).families(state.view())}
        return {s.labels["gpu"] for s in families["sparkdiag_gemm_tflops"].samples}

    container = ProbeScheduler(launcher, state, None, "container", lambda: snap[0], 300.0)
    sched.run_cycle()
    snap[0] = missing
    sched.run_cycle()
    container.run_cycle()  # the same snapshot, seen by the other context's scheduler
    assert len(gpus()) == 8  # one look: kept
    snap[0] = dataclasses.replace(missing, timestamp=missing.timestamp + 1.0)  # the next poll
    sched.run_cycle()
    listed = {(str(g.identity.index), g.identity.uuid) for g in missing.gpus}
    assert gpus() == {index for index, _ in listed}
    assert {(key[0], key[1]) for key in state.view().runs} == listed


def test_a_stop_during_a_cycle_starts_no_other_gpus_worker(tmp_path: Path) -> None:
    """A SIGTERM during a probe cycle: the daemon killed the running worker and the cycle went
    on to the next GPU, whose worker started 4 ms after the stop, and the killed cycle was
    recorded as an error (found in a review). Now the cycle stops, recording nothing."""
    snap, state = snapshot("h200-x8", tmp_path), ProbeState()
    stop, started = threading.Event(), []

    def launcher(gpu: GpuSample, on_start: Any) -> ProbeCycle:
        started.append(gpu.identity.index)
        stop.set()  # the daemon is told to stop while this worker runs; it is killed
        return ProbeCycle("error", "worker killed by SIGKILL", None, "", -9, 0.1, 4242)

    sched = ProbeScheduler(launcher, state, None, "native", lambda: snap, 300.0, first_delay=0.0)
    sched.stopping = stop
    assert sched.run_cycle() == []
    assert started == [0] and state.view().runs == {}


def test_a_container_worker_on_another_gpu_is_an_error(tmp_path: Path) -> None:
    """A container that sees only some GPUs numbers them from 0: cuda:N there was another GPU,
    whose figures went into this GPU's series (found in a review)."""
    from sparkdiag.probe.document import parse_document
    from sparkdiag.probe.launchers import other_gpu

    doc = json.loads((PROBE / "h200-default.json").read_text())
    ran_on = doc["software"]["gpu_uuid"]
    cycle = ProbeCycle("ok", None, parse_document(doc), "", 0, 2.0, 4242)
    assert other_gpu(cycle, ran_on) is cycle
    wrong = other_gpu(cycle, "GPU-00000000-0000-0000-0000-000000000003")
    assert wrong.result == "error" and wrong.reason is not None
    assert wrong.reason.startswith(f"the container's worker ran on {ran_on}, not on GPU-0000")
    assert "--gpus all" in wrong.reason
