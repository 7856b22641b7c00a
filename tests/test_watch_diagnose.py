"""The watch diagnosis, a pure function of a recording, on synthetic timelines: one per cause
(it must be found, with a share close to what was built in), the healthy job (no false cause,
start-up and tear-down excluded), and near misses just under each threshold."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from sparkdiag.watch import diagnose as dx
from sparkdiag.watch.diagnose import diagnose
from sparkdiag.watch.model import GpuInfo, GpuTick, Recording, Tick, from_json, load
from sparkdiag.watch.render import headline
from tests.support import ROOT
from tests.support.watch import (
    DT,
    H200,
    HW_SLOWDOWN,
    SW_POWER_CAP,
    SW_THERMAL,
    const,
    during,
    loop,
    names,
    periodic,
    saving,
    share,
    sole_cause,
    stop_then_burst,
    timeline,
    with_stacks,
)

# ---- healthy: no false cause --------------------------------------------------------------------


def test_healthy_training_loop_gets_no_cause() -> None:
    """A GPU-bound bf16 loop: utilization ~99 % with a dip now and then (logging), tensor pipes
    busy, the main thread spin-waiting at 100 % of a core, the power cap active, small writes
    (a log), and a long start-up and tear-down with the GPU idle and the host reading."""
    rec = timeline(
        util=lambda i: 0.85 if i % 20 == 0 else 0.99,
        write=lambda i: 5e7 if i % 40 == 0 else 1e5,  # a log flush, GPU busy meanwhile
        warmup=12,
        teardown=6,
    )
    d = diagnose(rec)
    assert d.verdict == "healthy", d.causes
    assert d.causes == ()
    assert d.window == (12 * DT, (12 + 80) * DT)  # start-up and tear-down left out
    assert d.gpu_busy is not None and d.gpu_busy > 0.95
    assert any("power cap" in note for note in d.notes)  # said, but not a cause
    assert d.healthy_actions and "nothing to fix" in d.healthy_actions[0]
    assert d.spans == ()


def test_healthy_without_gpm_gets_no_cause_and_says_what_it_skipped() -> None:
    d = diagnose(timeline(sm=None, tensor=None))
    assert d.verdict == "healthy"
    assert any("no GPM" in s for s in d.skipped)


# ---- one timeline per cause ---------------------------------------------------------------------


def test_input_starved() -> None:
    """A data loader too slow for the GPU: busy one tick, idle the next two, the main thread
    waiting on the loader's queue (10 % of a core), the loader reading."""
    rec = timeline(
        util=lambda i: 0.98 if i % 3 == 0 else 0.05,
        sm=lambda i: 0.9 if i % 3 == 0 else 0.02,
        thread=const(0.10),
        read=const(8e7),
    )
    d = diagnose(rec)
    assert d.verdict == "input-starved"
    evidence = " ".join(sole_cause(d, "input-starved", (2 / 3) * 0.95, within=0.04).evidence)
    assert "idle gaps" in evidence and "the job read 80.0 MB/s" in evidence
    assert any("num_workers" in a for a in d.causes[0].actions)
    assert {s[2] for s in d.spans} == {"input-starved"}


def test_cpu_bound_launcher() -> None:
    """Tiny kernels: the GPU is "utilized" half the time but its SMs are 4 % active; the
    launching thread is pinned at 99 % of a core."""
    rec = timeline(util=const(0.5), sm=const(0.04), tensor=const(0.0), thread=const(0.99))
    d = diagnose(rec)
    assert d.verdict == "cpu-bound-launcher"
    assert share(d, "cpu-bound-launcher") == pytest.approx(0.96, abs=0.02)
    assert "low-tensor-activity" not in names(d)  # the GPU is barely busy: not a math problem
    assert "'python3' at 99 %" in d.causes[0].evidence[0]
    assert any("CUDA graph" in a for a in d.causes[0].actions)


def test_cpu_bound_launcher_without_gpm_uses_utilization() -> None:
    rec = timeline(util=const(0.3), sm=None, tensor=None, thread=const(1.0))
    d = diagnose(rec)
    assert d.verdict == "cpu-bound-launcher"
    assert share(d, "cpu-bound-launcher") == pytest.approx(0.7, abs=0.02)


def test_checkpoint_stalls() -> None:
    """Every 20 ticks (10 s) the job writes 1.5 GB/s for 4 ticks with the GPU idle."""
    d = diagnose(saving(periodic(8, 12), thread=0.4))
    assert d.verdict == "checkpoint-stalls"
    evidence = " ".join(sole_cause(d, "checkpoint-stalls", 0.2 * 0.98, within=0.03).evidence)
    assert "4 write bursts" in evidence and "1.5 GB/s" in evidence and "every 10.0 s" in evidence


def test_checkpoint_stalls_include_the_fsync_after_the_burst() -> None:
    """The job fills the page cache in one tick, then waits 2.5 s in fsync writing nothing,
    tasks stalled on I/O: the whole idle gap is the checkpoint's, none of it input-starved."""
    rec = stop_then_burst(
        0.02, 0.01, thread=0.05, burst=8, io_stall=during(periodic(9, 14), 0.6, 0.0)
    )
    cause = sole_cause(diagnose(rec), "checkpoint-stalls", 24 * 0.98 / 80)
    assert "stalled on I/O 50 %" in " ".join(cause.evidence)  # 5 of 6 ticks at 60 %


def test_checkpoint_stalls_include_the_serialisation_before_the_burst() -> None:
    """torch.save first copies the state to the host and pickles it, one core at 100 % and
    the GPU stopped for 2.5 s, then writes it in one burst: as on the H200 (2026-12-01, the
    checkpoint job of watch_jobs.py), the whole stop is the checkpoint's, not a launcher's."""
    # the thread at 100 %: serialising, then the main loop's spin-wait
    rec = stop_then_burst(0.03, 0.01, thread=1.0, burst=13)
    sole_cause(diagnose(rec), "checkpoint-stalls", 24 * 0.97 / 80)


def test_a_launcher_stop_far_from_any_write_stays_a_launcher() -> None:
    """The same stop with the GPU working a little (a launcher starving it: tiny kernels, SMs
    2 % active at 30 % utilization) before a burst does not extend the checkpoint backwards:
    only a fully stopped GPU does."""
    rec = stop_then_burst(0.3, 0.02, thread=1.0, burst=14)
    d = diagnose(rec)
    assert "cpu-bound-launcher" in names(d), [(c.name, c.share) for c in d.causes]


def test_a_log_burst_in_a_starved_loop_does_not_turn_it_into_checkpoint_stalls() -> None:
    """Starved at 70 % idle per tick, with one 100 MB/s log flush: only the flush's ticks may
    count as writing; the rest stays input-starvation."""
    rec = timeline(
        util=const(0.3),
        sm=const(0.28),
        thread=const(0.2),
        write=lambda i: 1e8 if i == 20 else 1e5,
        io_stall=const(0.01),
    )
    d = diagnose(rec)
    assert d.verdict == "input-starved"
    assert "checkpoint-stalls" not in names(d)


def test_throttled() -> None:
    """Software thermal slowdown for the second half, SM clock 1100 against 1755 MHz."""
    hot = lambda i: i >= 40  # noqa: E731
    rec = timeline(
        clock=during(hot, 1100.0, 1755.0),
        reasons=during(hot, SW_THERMAL | SW_POWER_CAP, SW_POWER_CAP),
        temperature=during(hot, 88.0, 70.0),
    )
    d = diagnose(rec)
    assert d.verdict == "throttled"
    assert share(d, "throttled") == pytest.approx(0.5 * (1 - 1100 / 1755), abs=0.01)
    evidence = " ".join(d.causes[0].evidence)
    assert "sw_thermal_slowdown active 50 %" in evidence
    assert "1100 MHz" in evidence and "1755 MHz" in evidence and "88 °C" in evidence


def test_memory_pressure() -> None:
    rec = timeline(memory_stall=const(0.22), swap=const(3e7))
    evidence = " ".join(sole_cause(diagnose(rec), "memory-pressure", 0.22, within=1e-9).evidence)
    assert "PSI some" in evidence and "swapping 30.0 MB/s" in evidence


@pytest.mark.parametrize(
    ("scope", "whose"),
    [
        ("cgroup", "the job's cgroup"),
        ("shared-cgroup", "a cgroup the job shares with other processes"),
        ("host", "the whole host"),
    ],
)
def test_memory_pressure_says_whose_tasks_stalled(scope: str, whose: str) -> None:
    rec = replace(timeline(memory_stall=const(0.22)), pressure_scope=scope)
    evidence = " ".join(sole_cause(diagnose(rec), "memory-pressure", 0.22, within=1e-9).evidence)
    assert f"tasks of {whose} stalled on memory 22 % of the time" in evidence


def test_memory_pressure_on_unified_memory_says_the_gpu_shares_it() -> None:
    gb10 = GpuInfo(0, "NVIDIA GB10", "GPU-gb10", "unified")
    d = diagnose(timeline(memory_stall=const(0.3), gpus=(gb10,)))
    assert "unified memory" in " ".join(d.causes[0].evidence)
    assert any("drop caches" in a for a in d.causes[0].actions)


def test_low_tensor_activity() -> None:
    """fp32 matmuls without TF32: SMs 95 % active, tensor pipes idle."""
    rec = timeline(sm=const(0.95), tensor=const(0.0))
    d = diagnose(rec)
    assert d.verdict == "low-tensor-activity"
    assert share(d, "low-tensor-activity") == pytest.approx(1.0)
    assert any("TF32" in a or "float32_matmul_precision" in a for a in d.causes[0].actions)


def test_two_causes_are_both_reported_largest_first() -> None:
    rec = timeline(
        util=lambda i: 0.98 if i % 2 == 0 else 0.05,
        thread=const(0.1),
        memory_stall=const(0.12),
    )
    d = diagnose(rec)
    assert names(d) == ["input-starved", "memory-pressure"]


# ---- near misses --------------------------------------------------------------------------------


def test_short_idle_dips_below_the_threshold_are_not_input_starvation() -> None:
    # one tick in 12 at 5 %: 0.95 / 12 = 7.9 % of the time lost, under the 10 % threshold
    d = diagnose(timeline(util=lambda i: 0.05 if i % 12 == 0 else 0.99, thread=const(0.1)))
    assert d.verdict == "healthy"


def test_a_hot_thread_with_a_busy_gpu_is_not_a_launcher() -> None:
    d = diagnose(timeline(util=const(0.97), sm=const(0.65), thread=const(1.0)))
    assert "cpu-bound-launcher" not in names(d)


def test_writes_while_the_gpu_works_are_not_checkpoint_stalls() -> None:
    d = diagnose(timeline(write=lambda i: 2e9 if i % 20 == 0 else 1e5))
    assert d.verdict == "healthy"


def test_power_cap_alone_is_not_throttling() -> None:
    d = diagnose(timeline(clock=const(1425.0), reasons=const(SW_POWER_CAP)))  # type: ignore[arg-type]
    assert d.verdict == "healthy"


def test_brief_hardware_slowdown_under_the_threshold_is_not_reported() -> None:
    # 3 ticks of 80 (3.75 %) below THROTTLE_MIN
    d = diagnose(timeline(reasons=lambda i: HW_SLOWDOWN if i < 3 else 0))
    assert "throttled" not in names(d)


def test_light_memory_pressure_is_not_reported() -> None:
    assert diagnose(timeline(memory_stall=const(0.04))).verdict == "healthy"


def test_moderate_tensor_activity_is_not_low() -> None:
    assert diagnose(timeline(sm=const(0.9), tensor=const(0.15))).verdict == "healthy"


def test_low_tensor_needs_most_of_the_busy_time() -> None:
    # tensor idle 40 % of the busy time: under LOW_TENSOR_SHARE
    d = diagnose(timeline(tensor=lambda i: 0.0 if i % 5 < 2 else 0.6))
    assert "low-tensor-activity" not in names(d)


# ---- edge cases ---------------------------------------------------------------------------------


def test_gpu_unused_only_when_the_job_never_touched_it() -> None:
    """No process of the job on the GPU, no memory held, no kernel: "gpu-unused". The same job
    holding the GPU with kernels 2 % of the time is diagnosed (a thread at 100 % of a core
    running big kernels now and then: input it prepares itself)."""
    d = diagnose(timeline(util=0.0, sm=0.0, tensor=0.0, on_gpu=False))
    assert d.verdict == "gpu-unused"
    assert "never touched GPU 0" in d.notes[0] and "CUDA_VISIBLE_DEVICES" in d.notes[0]
    held = diagnose(timeline(util=const(0.02), sm=const(0.018), tensor=const(0.01)))
    assert held.verdict == "data-prep-in-loop"
    assert share(held, "data-prep-in-loop") == pytest.approx(0.98, abs=0.01)


def test_a_job_that_never_touched_its_gpu_keeps_that_verdict_beside_memory_pressure() -> None:
    """Host memory pressure (maybe another process's) is a cause below the verdict, not the
    verdict: the GPU the job never touched is what the user has to fix first."""
    d = diagnose(timeline(util=0.0, sm=0.0, tensor=0.0, on_gpu=False, memory_stall=const(0.22)))
    assert d.verdict == "gpu-unused"
    assert names(d) == ["memory-pressure"]
    assert "never touched GPU 0" in d.notes[0]
    assert headline(d) == "the job never touched its GPU: only the host was assessed (below)"


def test_a_job_holding_the_gpu_without_a_kernel_is_diagnosed_over_those_ticks() -> None:
    """CUDA initialised, memory held, then the job waits (its first batch never comes)."""
    d = diagnose(timeline(util=0.0, sm=0.0, tensor=0.0, thread=const(0.02), warmup=4))
    assert d.verdict == "input-starved"
    assert d.window == (0.0, (4 + 80) * DT)  # every tick in which the job held the GPU
    assert "nobody in the job was busy" in " ".join(d.causes[0].evidence)


def test_launch_loop_that_never_reaches_the_busy_threshold() -> None:
    """Tiny kernels launched as fast as one thread can: the GPU 15 % utilized, SMs nearly idle.
    With the thread hot that is a launcher; with it cool, nothing drives the GPU."""
    d = diagnose(timeline(util=const(0.15), sm=const(0.001), tensor=const(0.0)))
    assert d.verdict == "cpu-bound-launcher" and d.causes[0].share >= 0.9
    cool = diagnose(
        timeline(util=const(0.15), sm=const(0.001), tensor=const(0.0), thread=const(0.3))
    )
    assert cool.verdict == "input-starved"  # the job held the GPU: it waited for something
    assert share(cool, "input-starved") == pytest.approx(0.85, abs=0.01)


def test_no_gpu_sampled_assesses_memory_only() -> None:
    rec = timeline(gpus=())
    d = diagnose(rec)
    assert d.verdict == "no-gpu"
    assert any("no GPU was sampled" in s for s in d.skipped)
    d = diagnose(timeline(gpus=(), memory_stall=const(0.3)))
    assert d.verdict == "memory-pressure"


def test_diagnosis_looks_at_the_gpu_the_job_runs_on() -> None:
    base = timeline(util=lambda i: 0.98 if i % 2 == 0 else 0.05, thread=const(0.1))
    idle_neighbour = GpuTick(index=1, utilization=0.0, sm_activity=0.0, tensor_activity=0.0)
    ticks = tuple(
        Tick(t=t.t, dt=t.dt, gpus=(*t.gpus, idle_neighbour), job=t.job, host=t.host)
        for t in base.ticks
    )
    rec = Recording(
        started_at=base.started_at,
        interval=DT,
        job=base.job,
        gpus=(H200, GpuInfo(1, "NVIDIA H200", "GPU-other", "dedicated")),
        ticks=ticks,
    )
    d = diagnose(rec)
    assert d.gpus == (0,)
    assert d.verdict == "input-starved"


def _with_a_stray_context(base: Recording, stray: int, training: int) -> Recording:
    """``base`` (its GPU 0) on GPU ``training``, beside GPU ``stray`` idle all the time with
    the job holding 520 MB there (a CUDA context: torch.cuda.synchronize() with no device)."""
    ticks = []
    for t in base.ticks:
        (g,) = t.gpus
        idle = GpuTick(index=stray, utilization=0.0, sm_activity=0.0, tensor_activity=0.0,
                       sm_clock_hz=345e6, power_w=75.0, power_limit_w=700.0,
                       job_on_gpu=g.job_on_gpu, job_memory_bytes=5.2e8)  # fmt: skip
        gpus = sorted((replace(g, index=training), idle), key=lambda x: x.index)
        ticks.append(replace(t, gpus=tuple(gpus)))
    infos = (GpuInfo(0, "NVIDIA H200", "GPU-a", "dedicated"),
             GpuInfo(1, "NVIDIA H200", "GPU-b", "dedicated"))  # fmt: skip
    return replace(base, gpus=infos, ticks=tuple(ticks))


@pytest.mark.parametrize(("stray", "training"), [(0, 1), (1, 0)])
def test_a_gpu_the_job_only_holds_memory_on_is_noted_not_averaged_in(
    stray: int, training: int
) -> None:
    """A stray context on one GPU while the job trains on the other: it was averaged into
    "GPU busy" (a healthy loop at 99 % read 50 %) and its idle time read as a cause (the H200's
    ResNet-50 with a stray context: "data prep in the loop, 58 % lost")."""
    d = diagnose(_with_a_stray_context(timeline(), stray, training))
    assert d.gpus == (training,) and d.verdict == "healthy", d.causes
    assert d.gpu_busy == pytest.approx(0.99)
    (note,) = [n for n in d.notes if "ran no kernel" in n]
    assert note.startswith(f"GPU {stray} (520.0 MB of memory): the job held it but ran no kernel")
    starved = timeline(util=lambda i: 0.98 if i % 3 == 0 else 0.05, thread=const(0.1))
    d = diagnose(_with_a_stray_context(starved, stray, training))
    assert d.gpus == (training,)
    assert sole_cause(d, "input-starved", (2 / 3) * 0.95, within=0.04)
    # the job held both and ran no kernel on either: both are diagnosed, nothing left out
    idle = timeline(util=0.0, sm=0.0, tensor=0.0, thread=const(0.02))
    d = diagnose(_with_a_stray_context(idle, stray, training))
    assert d.gpus == (0, 1) and not [n for n in d.notes if "ran no kernel" in n]


@pytest.mark.parametrize(("ticks", "dt"), [(1, 0.5), (3, 0.5), (2, 1.5), (1, 0.1)])
def test_a_window_under_three_ticks_or_two_seconds_is_too_short_to_diagnose(
    ticks: int, dt: float
) -> None:
    """One 0.1 s tick of the starved fixture read "input-starved, 96 % lost"; a healthy
    ResNet-50 cut to its first tick in the loop "healthy, GPU busy 7 %, nothing to fix": the
    figures measured, and no cause."""
    rec = timeline(n=ticks, util=0.04, sm=0.02, thread=0.1, warmup=2, teardown=2)
    rec = replace(rec, ticks=tuple(replace(t, t=(k + 1) * dt, dt=dt)
                                   for k, t in enumerate(rec.ticks)))  # fmt: skip
    d = diagnose(rec)
    assert d.verdict == "too-short" and d.causes == () and d.spans == ()
    assert d.window == pytest.approx((2 * dt, (2 + ticks) * dt))
    assert d.gpu_busy == pytest.approx(0.04)
    (line,) = d.healthy_actions
    plural = "s" if ticks > 1 else ""
    assert line.startswith(f"measured over {ticks * dt:.1f} s ({ticks} tick{plural}): GPU busy 4 %")
    assert "no cause is named" in line and "nothing to fix" not in line
    enough = timeline(n=4, util=0.04, sm=0.02, thread=0.1, warmup=2, teardown=2)
    assert diagnose(enough).verdict == "input-starved"  # 4 ticks of 0.5 s: 2 s


def test_a_recording_cut_to_the_first_tick_of_its_loop_is_too_short() -> None:
    rec = load(ROOT / "docs/device/2026-12-04/healthy/resnet.recording.json")
    d = diagnose(replace(rec, ticks=rec.ticks[:40]))
    assert d.verdict == "too-short" and d.causes == ()
    assert "GPU busy 7 %" in d.healthy_actions[0]


def test_idle_time_no_cause_took_is_not_attributed_not_nothing_to_fix() -> None:
    """The GPU idle 20 % of every tick while the training thread, at half a core, launched: the
    launcher's time beside a thread that is not hot goes to no cause, so nothing is reported,
    but 20 % of the time was lost: "not attributed", never "nothing to fix"."""
    rec = timeline(util=const(0.8), sm=const(0.75), thread=const(0.5))
    d = diagnose(with_stacks(rec, lambda i: [(loop(40, "y = x @ w"), 1.0)]))
    assert d.verdict == "healthy" and d.causes == ()
    assert d.unattributed == pytest.approx(0.2, abs=0.01)
    (line,) = d.healthy_actions
    assert "nothing to fix" not in line and "not attributed" in line
    assert headline(d) == (
        "no cause found, but 20 % of the time the GPU would otherwise have worked was lost and "
        "not attributed"
    )
    fine = diagnose(timeline())
    assert fine.unattributed == pytest.approx(0.0, abs=0.01)
    assert "nothing to fix" in fine.healthy_actions[0]
    assert headline(fine) == "healthy: no cause of lost GPU time found"


def test_thresholds_are_documented_in_the_module() -> None:
    doc = dx.__doc__ or ""
    names = ("WINDOW_LEVEL", "IDLE_MIN", "HOT_THREAD", "LAUNCH_ACTIVITY_MAX", "TENSOR_LOW",
             "STALL_UTIL", "STALL_SM", "STALL_DRAM", "FEW_SM_MAX", "TINY_KERNELS")  # fmt: skip
    for name in names:
        assert name in doc


def test_recording_round_trips_through_json(tmp_path: Path) -> None:
    rec = timeline(util=lambda i: 0.98 if i % 3 == 0 else 0.05, thread=const(0.1), warmup=3)
    path = tmp_path / "run.json"
    rec.save(path)
    again = load(path)
    assert again == rec
    assert diagnose(again) == diagnose(rec)
    assert from_json(rec.to_json()) == rec


@pytest.mark.parametrize(
    "name",
    [
        "2026-12-05/h200/watch/compile-recompile",  # 449 kB: frames, threads, deep stacks
        "2026-12-05/compact/checkpoint.bounded",  # places, ranks, skipped
        "2026-12-03/rerun/cotenant",  # tenants
    ],
)
def test_a_recording_s_json_is_what_asdict_makes_of_it(name: str) -> None:
    """to_json walks the dataclasses itself (asdict deep-copied every number: 0.108 s for the
    largest recording, 0.017 s now); it must make the same object, tuples and named tuples
    kept, and so the same file. A StoreSpeed is added, as no device recording has one."""
    import dataclasses
    import json

    from sparkdiag.watch.model import SCHEMA, StoreSpeed

    rec = load(ROOT / "docs" / "device" / f"{name}.recording.json")
    rec = dataclasses.replace(rec, stores=(StoreSpeed("/data", "nvme0n1", "local", 5.0, 2e9),))
    made, expected = rec.to_json(), {"schema": SCHEMA, **dataclasses.asdict(rec)}
    assert made == expected and repr(made) == repr(expected)
    assert json.dumps(made) == json.dumps(expected)


def test_the_counts_of_other_processes_round_trip_and_a_bad_pid_is_refused() -> None:
    """``others_seen``, ``others_seen_pids`` and ``others_unseen`` (optional: a recording
    without them loads with None and ()) come back from JSON; a pid that is no whole number is
    a RecordingError naming the field."""
    from dataclasses import replace

    from sparkdiag.watch.model import RecordingError

    rec = timeline(util=const(0.99))
    marked = replace(
        rec,
        ticks=tuple(
            replace(t, gpus=tuple(
                replace(g, others_seen=1, others_seen_pids=(4321,), others_unseen=0)
                for g in t.gpus
            ))
            for t in rec.ticks
        ),
    )  # fmt: skip
    assert from_json(marked.to_json()) == marked
    doc = marked.to_json()
    doc["ticks"][0]["gpus"][0]["others_seen_pids"] = ["x"]
    with pytest.raises(RecordingError, match="others_seen_pids"):
        from_json(doc)


@pytest.mark.parametrize("seed", range(20))
def test_noisy_healthy_loops_get_no_false_cause(seed: int) -> None:
    """Healthy loops with the noise a real one has: utilization 93-100 %, SM and tensor
    activity that wander, the spin-waiting main thread between 90 and 100 % of a core, log
    writes and reads, a trace of memory pressure, the power cap on and off."""
    import random

    rng = random.Random(seed)
    n = 120
    util = [rng.uniform(0.93, 1.0) for _ in range(n)]
    sm = [rng.uniform(0.75, 0.95) for _ in range(n)]
    tensor = [rng.uniform(0.4, 0.85) for _ in range(n)]
    thread = [rng.uniform(0.9, 1.0) for _ in range(n)]
    write = [rng.choice([0.0, 1e4, 2e6, 3e7]) for _ in range(n)]
    read = [rng.uniform(0, 5e7) for _ in range(n)]
    stall = [rng.uniform(0, 0.03) for _ in range(n)]
    capped = [rng.random() < 0.6 for _ in range(n)]
    rec = timeline(
        n=n,
        util=lambda i: util[i],
        sm=lambda i: sm[i],
        tensor=lambda i: tensor[i],
        thread=lambda i: thread[i],
        write=lambda i: write[i],
        read=lambda i: read[i],
        memory_stall=lambda i: stall[i],
        reasons=lambda i: SW_POWER_CAP if capped[i] else 0,
        clock=lambda i: 1500.0 if capped[i] else 1755.0,
        warmup=rng.randint(0, 15),
        teardown=rng.randint(0, 8),
    )
    d = diagnose(rec)
    assert d.verdict == "healthy", [(c.name, round(c.share, 3)) for c in d.causes]


def test_checkpoints_so_frequent_that_most_ticks_write_are_still_bursts() -> None:
    """A Trainer saving every few steps: 3 ticks of every 5 write 1.5 GB/s with the GPU
    stopped. Against the median of every tick (a checkpoint's own rate) none would be a burst;
    against the rate while the GPU works, each is."""
    d = diagnose(saving(periodic(0, 3, period=5), thread=1.0))
    assert names(d) == ["checkpoint-stalls"], [(c.name, round(c.share, 3)) for c in d.causes]
    assert share(d, "checkpoint-stalls") == pytest.approx(0.6 * (1 - 0.02 / 0.99), abs=0.03)


def test_a_finalising_interpreter_after_the_last_step_is_not_the_loop() -> None:
    """The CPU dry run's torch.compile job, recorded on this machine: after its last step the
    training thread stayed busy about a second with no Python frame at all (py-spy read empty
    stacks: the interpreter finalising) while the scripted GPU idled. Those ticks read as
    data-prep-in-loop at 18 % beside recompiling at 41 %, and under two busy loops the
    finalisation grew until data prep came first. Empty stacks at the window's ends are not
    the job's loop: the window closes at the last tick with a Python frame."""
    from sparkdiag.watch import threads

    rec = load(Path("tests/fixtures/watch/cpu-dry-run/compile-recompile.recording.json"))
    d = diagnose(rec)
    assert [c.name for c in d.causes] == ["recompiling"], d.causes
    readings = threads.read_recording(rec)
    empty = [i for i, t in enumerate(rec.ticks) if threads.without_python(readings, rec, i)]
    assert empty, "the recording's last ticks read empty stacks"
    ends = [i for i, t in enumerate(rec.ticks) if t.t <= d.window[1]]
    assert ends[-1] < empty[0] and all(i > ends[-1] for i in empty)


def _leaves(doc: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """The path of every number, string, flag and null in a JSON document."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _leaves(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc[:3]) for p in _leaves(v, (*path, i))]
    return [path]


def test_a_recording_with_any_field_of_the_wrong_type_is_refused_or_diagnosed() -> None:
    """Each scalar of a real recording replaced by a value of another JSON type: the replay is
    a RecordingError naming the field (exit 2) or a diagnosis, never a TypeError from inside
    diagnose (25 of 300 such changes were a traceback: the bad-input review)."""
    import copy
    import json

    from sparkdiag.watch.model import RecordingError
    from sparkdiag.watch.render import to_json

    path = Path(__file__).parent / "fixtures/watch/cpu-dry-run/launch-bound.recording.json"
    doc = json.loads(path.read_text())
    leaves = _leaves(doc)
    assert len(leaves) > 100
    refused = 0
    for where in leaves:
        for other in ("x", "nan", "1e999", 1.5, True, [1], {"a": 1}, None):
            # the document with that one leaf changed: the objects and lists on the way to it
            # copied, the rest shared with ``doc`` (a deep copy of the whole each time took
            # two thirds of the test's time); that nothing changed ``doc`` is checked below
            changed = copy.copy(doc)
            holder = changed
            for key in where[:-1]:
                holder[key] = copy.copy(holder[key])
                holder = holder[key]
            if type(holder[where[-1]]) is type(other):
                continue
            holder[where[-1]] = other
            try:
                rec = from_json(changed)
            except RecordingError:
                refused += 1
                continue
            text = to_json(rec, diagnose(rec))  # must not raise, nor write NaN (no JSON)
            assert not re.search(r"\b(NaN|Infinity)\b", text), where  # no JSON
    assert refused > 0
    assert doc == json.loads(path.read_text())  # each change was made to its own copy alone
