"""A long watch holds a bounded number of ticks: neighbours merged in pairs (watch/compact.py),
with the diagnosis of every recorded job the same after a halving."""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from sparkdiag.watch import compact
from sparkdiag.watch.diagnose import diagnose
from sparkdiag.watch.job import Followed, follow
from sparkdiag.watch.model import (
    GpuTick,
    HostTick,
    JobTick,
    OtherProcess,
    ProcessLoad,
    Recording,
    StackTime,
    Tick,
    load,
)
from sparkdiag.watch.sampler import TOP_PROCESSES
from tests.support import ROOT

RECORDINGS = sorted(
    p
    for folder in (ROOT / "docs" / "device", ROOT / "tests" / "fixtures" / "watch")
    for p in folder.rglob("*.recording.json")
)


def _gpu(**changes: Any) -> GpuTick:
    """A GPU tick with every field set to something other than its default."""
    base = GpuTick(
        index=0,
        utilization=0.5,
        samples=((0.1, 0.4), (0.2, 0.6)),
        sm_activity=0.4,
        tensor_activity=0.3,
        dram_activity=0.2,
        sm_occupancy=0.1,
        sm_clock_hz=1.5e9,
        sm_clock_max_hz=1.98e9,
        reasons=0x1,
        temperature=50.0,
        memory_temperature=60.0,
        power_w=300.0,
        power_limit_w=700.0,
        pcie_tx=1e9,
        pcie_rx=2e9,
        job_on_gpu=True,
        memory_utilization=0.3,
        job_memory_bytes=4e9,
        job_sm=0.5,
        others=(OtherProcess(7, 0.2, 1e9),),
        others_seen=1,
        others_seen_pids=(7,),
        others_unseen=0,
    )
    return replace(base, **changes)


def _tick(t: float, dt: float, gpu: GpuTick, **job: Any) -> Tick:
    return Tick(
        t=t,
        dt=dt,
        gpus=(gpu,),
        job=JobTick(
            processes=2,
            threads=10,
            cpu_cores=1.0,
            gpu_thread=0.5,
            gpu_thread_name="python",
            other_cpu_cores=0.5,
            read_bps=1e6,
            write_bps=2e6,
            loads=(ProcessLoad(1, "python", 1.0, 1e6, True),),
            gpu_thread_id=1,
            writing=("ckpt.pt",),
            reading=("data.bin",),
            **job,
        ),
        host=HostTick(0.1, 0.05, 0.2, 0.3, 1e3, 8e9),
        stacks=(StackTime(0, 0, 0.25, 1),),
    )


def test_every_figure_of_a_tick_is_merged_none_dropped() -> None:
    """Every field of every part of a tick comes out of a merge set (none left at its default):
    a field added to the model without a rule in compact.py fails here."""
    merged = compact.merge(_tick(1.0, 0.5, _gpu()), _tick(1.5, 0.5, _gpu(reasons=0x4)))
    for part in (merged.gpus[0], merged.job, merged.host, merged):
        for f in dataclasses.fields(part):
            default = f.default if f.default is not dataclasses.MISSING else None
            if f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            value = getattr(part, f.name)
            assert value != default or f.name == "index", (type(part).__name__, f.name)


def test_how_each_kind_of_figure_merges() -> None:
    a = _tick(
        1.0,
        1.0,
        _gpu(utilization=0.2, temperature=80.0, reasons=0x1, power_limit_w=600.0, job_sm=None),
    )
    b = _tick(
        4.0,
        3.0,
        _gpu(utilization=0.6, temperature=70.0, reasons=0x40, power_limit_w=700.0, job_sm=0.8),
    )
    m = compact.merge(a, b)
    g = m.gpus[0]
    assert (m.t, m.dt) == (4.0, 4.0)
    assert g.utilization == pytest.approx((0.2 * 1 + 0.6 * 3) / 4)  # weighted by length
    assert g.temperature == 80.0  # the hotter reading
    assert g.reasons == 0x41  # every reason either tick saw, with its share of the time
    assert g.reasons_held == ((0x1, 0.25), (0x40, 0.75))
    assert g.power_limit_w == 700.0  # the later tick's
    assert g.job_sm == 0.8  # one side without: the other's
    assert len(g.samples) == 2  # every other one of the pair's four
    assert m.host.available_bytes == 8e9 and m.host.io_stall == pytest.approx(0.2)
    assert m.stacks == (StackTime(0, 0, 0.5, 2),)  # seconds and visits added up


def test_processes_merge_by_pid_with_none_where_absent() -> None:
    """A process in one tick only used nothing in the other: its CPU and SM over the merged
    tick are its use times its share of the time; the busiest are kept, as the sampler keeps
    them."""
    loads_a = tuple(ProcessLoad(pid, f"w{pid}", 0.1 * pid) for pid in range(1, 7))
    loads_b = tuple(ProcessLoad(pid, f"w{pid}", 0.1 * pid) for pid in range(4, 12))
    a = _tick(1.0, 1.0, _gpu(others=(OtherProcess(7, 0.6, 1e9),)))
    b = _tick(2.0, 1.0, _gpu(others=(OtherProcess(8, 0.2, 2e9),)))
    a = replace(a, job=replace(a.job, loads=loads_a))
    b = replace(b, job=replace(b.job, loads=loads_b))
    m = compact.merge(a, b)
    others = {p.pid: p for p in m.gpus[0].others}
    assert others[7].sm == pytest.approx(0.3) and others[8].sm == pytest.approx(0.1)
    assert others[7].memory_bytes == 1e9
    loads = {p.pid: p.cpu_cores for p in m.job.loads}
    assert len(m.job.loads) == TOP_PROCESSES
    assert loads[11] == pytest.approx(0.55)  # only in b: half of its 1.1 cores
    assert loads[5] == pytest.approx(0.5)  # in both
    assert 1 not in loads and 2 not in loads  # the idlest left out
    assert [p.cpu_cores for p in m.job.loads] == sorted(loads.values(), reverse=True)


def test_halve_keeps_the_time_covered_and_an_odd_last_tick() -> None:
    ticks = [_tick(0.5 * (i + 1), 0.5, _gpu()) for i in range(7)]
    halved = compact.halve(ticks)
    assert len(halved) == 4
    assert [t.t for t in halved] == [1.0, 2.0, 3.0, 3.5]
    assert sum(t.dt for t in halved) == pytest.approx(sum(t.dt for t in ticks))
    assert halved[-1] is ticks[-1]


class _Clocked:
    """A sampler whose ticks cover the time since its last one, by the real clock."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.covered = 0.0
        self.folds: list[int] = []  # how many ticks there were at each fold of the stacks

    def tick(self) -> Tick:
        now = time.monotonic()
        dt, self.last = now - self.last, now
        self.covered += dt
        return Tick(t=self.covered, dt=dt)

    def fold_stacks(self, ticks: list[Tick]) -> list[Tick]:
        self.folds.append(len(ticks))
        return ticks


def _follow(sampler: _Clocked, seconds: float) -> tuple[Followed, list[int]]:
    """``seconds`` of ticks every 2 ms, at most 16 held; what the live line was told."""
    counts: list[int] = []
    followed = follow(
        cast(Any, sampler),
        lambda: False,
        0.002,
        seconds,
        threading.Event(),
        on_tick=lambda tick, n: counts.append(n),
        max_ticks=16,
    )
    return followed, counts


def test_follow_halves_at_the_bound_and_doubles_its_interval() -> None:
    sampler = _Clocked()
    followed, counts = _follow(sampler, 0.6)
    assert counts == list(range(1, len(counts) + 1))  # the live line counts every tick taken
    assert followed.ended_by == "duration"
    assert followed.halved >= 2
    assert followed.interval == pytest.approx(0.002 * 2**followed.halved)
    assert 1 <= len(followed.ticks) < 16
    primed = sampler.covered - sum(t.dt for t in followed.ticks)  # the dropped first tick
    assert primed == pytest.approx(followed.ticks[0].t - followed.ticks[0].dt, abs=1e-9)


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_halved_recording_gets_the_same_verdict(path: Path) -> None:
    """Every watch recorded on the lent H200 (and the CPU dry runs), its ticks merged in pairs
    once: the same verdict, and the same first cause within 10 points of its share."""
    rec = load(path)
    before = diagnose(rec)
    after = diagnose(replace(rec, ticks=tuple(compact.halve(rec.ticks)), interval=rec.interval * 2))
    assert after.verdict == before.verdict
    if before.causes:
        assert after.causes[0].name == before.causes[0].name
        assert after.causes[0].share == pytest.approx(before.causes[0].share, abs=0.1)


def test_follow_lets_go_of_the_stacks_every_so_many_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stacks read so far go into the ticks every FOLD_TICKS first intervals, and always
    before the ticks are halved (a halving merges the stacks the ticks hold)."""
    from sparkdiag.watch import job

    monkeypatch.setattr(job, "FOLD_TICKS", 5)
    sampler = _Clocked()
    _, counts = _follow(sampler, 0.3)
    assert 16 in sampler.folds  # before the first halving
    assert len(sampler.folds) >= len(counts) // 5


class _FakeTime:
    """A clock that moves only when waited on (follow's monotonic and stop)."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.now += seconds
        return False

    def is_set(self) -> bool:
        return False


def test_the_stacks_are_let_go_of_as_often_in_time_after_halvings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fold comes every FOLD_TICKS first intervals of time, not every FOLD_TICKS ticks
    taken: counted in ticks, after k halvings the stretches piled up 2^k times longer (some 2.3
    hours between folds after a day's watch, 18 hours after a week's)."""
    from sparkdiag.watch import job

    monkeypatch.setattr(job, "FOLD_TICKS", 8)
    clock = _FakeTime()
    folds: list[float] = []

    class Sampler:
        last = 0.0

        def tick(self) -> Tick:
            dt, self.last = clock.now - self.last, clock.now
            return Tick(t=clock.now, dt=dt)

        def fold_stacks(self, ticks: list[Tick]) -> list[Tick]:
            folds.append(clock.now)
            return ticks

    followed = follow(
        cast(Any, Sampler()), lambda: False, 1.0, 60.0, cast(Any, clock),
        monotonic=clock.monotonic, max_ticks=16,
    )  # fmt: skip
    assert followed.halved == 2 and followed.interval == 4.0
    gaps = [b - a for a, b in zip([0.0, *folds], folds, strict=False)]
    assert max(gaps) <= 8.0 + 1e-9, gaps
    assert folds[-1] >= 48.0


def test_a_rate_read_from_merged_ticks_says_over_how_long_it_was_averaged() -> None:
    """The same checkpointing job watched on the lent H200 (scripts/device/watch_compact.sh),
    plainly and with its ticks merged to 4 s: a write burst's peak read from a 4 s tick is the
    burst averaged with the quiet around it, and the evidence says so; the plain watch's 0.5 s
    ticks say nothing of the kind."""
    folder = ROOT / "docs" / "device" / "2026-12-05" / "compact"
    plain = diagnose(load(folder / "checkpoint.plain.recording.json"))
    bounded = diagnose(load(folder / "checkpoint.bounded.recording.json"))
    assert plain.causes[0].name == bounded.causes[0].name == "checkpoint-stalls"
    assert not any("averaged over" in line for line in plain.causes[0].evidence)
    merged = [line for line in bounded.causes[0].evidence if "averaged over 4.0 s" in line]
    assert any(line.startswith("6 write bursts, peak ") for line in merged)
    assert any(line.startswith("it wrote at ") for line in merged)


@pytest.mark.parametrize(("seen", "throttled"), [(0.03, False), (0.08, True)])
def test_a_reason_read_in_a_few_ticks_keeps_its_share_through_halvings(
    seen: float, throttled: bool, tmp_path: Path
) -> None:
    """A busy GPU whose thermal slowdown was read in 3 % (8 %) of 4,096 ticks: under the
    throttle rule's 5 % (over it) as sampled, and after each of four halvings, with the same
    share of the busy time and of the time lost; merging the bits alone counted a reason read
    once as held through the whole merged tick (6, 12, 24, 41 % after one to four halvings).
    The shares go through a recording and back."""
    import random

    from sparkdiag.sources.nvml.gpu import reasons_mask
    from sparkdiag.watch.model import GpuInfo, Recording

    slow = reasons_mask({"sw_thermal_slowdown"})
    rng = random.Random(0)
    ticks = []
    for i in range(4096):
        hot = rng.random() < seen
        gpu = GpuTick(
            index=0, utilization=0.97, job_on_gpu=True, sm_clock_hz=1.5e9 if hot else 1.98e9,
            sm_clock_max_hz=1.98e9, reasons=slow if hot else 0, temperature=80.0,
            sm_activity=0.9, tensor_activity=0.6,
        )  # fmt: skip
        job = JobTick(processes=1, threads=4, cpu_cores=1.0, gpu_thread=0.6)
        ticks.append(Tick(t=0.5 * (i + 1), dt=0.5, gpus=(gpu,), job=job))
    rec = Recording(
        started_at=0.0, interval=0.5, job="train",
        gpus=(GpuInfo(0, "H200", "u", "dedicated"),), ticks=tuple(ticks),
    )  # fmt: skip
    first = diagnose(rec)
    for _ in range(4):
        rec = replace(rec, ticks=tuple(compact.halve(rec.ticks)), interval=rec.interval * 2)
        rec.save(tmp_path / "r.json")
        rec = load(tmp_path / "r.json")
        found = [c for c in diagnose(rec).causes if c.name == "throttled"]
        assert bool(found) == throttled
        if found:
            before = next(c for c in first.causes if c.name == "throttled")
            assert found[0].evidence[0] == before.evidence[0]
            assert found[0].share == pytest.approx(before.share, rel=0.01)
    assert rec.ticks[0].dt == 8.0


def _neighbour_then_job(before: int, starting: int, running: int) -> list[Tick]:
    """Ticks of 0.5 s on a GPU another process (pid 7) keeps 98 % busy: ``before`` ticks in which
    the job is not on it yet (the neighbour's alone: NVML lists only pid 7, whose per-process
    samples the sampler reads only where the job is there too), ``starting`` in which the job
    runs 2 % of the time beside it, then ``running`` in which the job runs 50 % and pid 7 48 %."""

    def gpu(job: float | None, other: float | None) -> GpuTick:
        return GpuTick(
            index=0, utilization=0.98 if job is None else job + (other or 0.0),
            job_on_gpu=job is not None, job_sm=job,
            others=() if other is None else (OtherProcess(7, other, 1e9),),
            others_seen=1, others_seen_pids=(7,), others_unseen=0,
        )  # fmt: skip

    gpus = [gpu(None, None)] * before + [gpu(0.02, 0.96)] * starting + [gpu(0.5, 0.48)] * running
    job = JobTick(processes=1, threads=4, cpu_cores=1.0, gpu_thread=0.9)
    return [Tick(t=0.5 * (i + 1), dt=0.5, gpus=(g,), job=job) for i, g in enumerate(gpus)]


def test_a_tick_the_neighbour_had_alone_stays_its_own_when_merged_with_the_jobs() -> None:
    """NVML's per-process samples are read only where the job is on the GPU: a tick the other
    process had alone holds no sample of it, and the diagnosis gives it the whole utilization
    (views.theirs). Merged with the job's first tick there, that utilization stays the other
    process's: taken as none of it (the merged tick the job's), the job read 49 % of the GPU in
    the tick it started in, against the 2 % it ran there."""
    from sparkdiag.watch.views import views

    ticks = _neighbour_then_job(before=1, starting=1, running=0)
    merged = compact.merge(ticks[0], ticks[1])
    rec = Recording(started_at=0.0, interval=1.0, job="j", gpus=(), ticks=(merged,))
    (v,) = views(rec, (0,))
    assert v.others == pytest.approx((0.98 + 0.96) / 2)
    assert v.util == pytest.approx(0.01)
    (other,) = merged.gpus[0].others
    assert other.pid == 7 and other.memory_bytes == 1e9
    assert other.sm == pytest.approx(0.97)
    # two ticks the neighbour had alone stay as the sampler writes such a tick: no samples
    alone = compact.merge(ticks[0], ticks[0]).gpus[0]
    assert alone.others == () and not alone.job_on_gpu


def test_a_neighbour_the_jobs_tick_does_not_show_keeps_a_share_of_the_tick_it_had() -> None:
    """Two other processes (7 and 8) had the GPU alone at 80 %; the job's next tick shows only
    pid 7 (20 %). The lone tick's 80 % is shared over both, pid 8 at the mean share of those
    shown: given 0 (the first version), pid 8 read as a tenant that used nothing and pid 7 took
    it all (found in a review). The total is the same either way."""
    lone, beside = _neighbour_then_job(before=1, starting=1, running=0)
    lone = replace(lone, gpus=(replace(lone.gpus[0], utilization=0.8, others_seen_pids=(7, 8)),))
    beside = replace(beside, gpus=(replace(beside.gpus[0], others=(OtherProcess(7, 0.2, 1e9),)),))
    merged = {o.pid: o.sm for o in compact.merge(lone, beside).gpus[0].others}
    assert merged == pytest.approx({7: (0.4 + 0.2) / 2, 8: 0.4 / 2})
    assert sum(merged.values()) == pytest.approx((0.8 + 0.2) / 2)


def test_a_job_that_started_beside_a_neighbour_keeps_its_window_when_halved() -> None:
    """The job starts (2 % of the GPU) at an odd tick, so that a pair merges the neighbour's
    last tick alone with the job's first: the halved recording opens its window where the whole
    one does and reads the same co-tenant share: with the neighbour's utilization taken as none
    of it, the merged tick read the job at 49 %, the window opened at 5 s instead of 15.5 s, over
    the job's 2 %, and the share rose from 0.49 to 0.64 (the lent H100's co-tenant recording of
    2026-12-05: from 0.43 to 0.59, the window open 11.5 s early)."""
    from sparkdiag.watch.model import GpuInfo

    rec = Recording(
        started_at=0.0, interval=0.5, job="train", gpus=(GpuInfo(0, "H100", "u", "dedicated"),),
        ticks=tuple(_neighbour_then_job(before=11, starting=20, running=40)),
    )  # fmt: skip
    halved = replace(rec, ticks=tuple(compact.halve(rec.ticks)), interval=1.0)
    before, after = diagnose(rec), diagnose(halved)
    assert before.verdict == after.verdict == "co-tenant"
    assert after.window[0] == pytest.approx(before.window[0], abs=1.0)
    assert after.causes[0].share == pytest.approx(before.causes[0].share, abs=0.02)
