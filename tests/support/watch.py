"""Synthetic watch recordings for the diagnosis tests: :func:`timeline` builds one from a
function per series (tick index -> value) or one value for every tick, with the job's start-up
and tear-down around it; :class:`PollGate`, a real job for ``sparkdiag watch`` that ends at a
poll of the scripted NVML fixture."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest

from sparkdiag.sources.nvml.fixture import FixtureBackend
from sparkdiag.watch import diagnose as diagnosis
from sparkdiag.watch import render
from sparkdiag.watch.causes import Cause
from sparkdiag.watch.diagnose import Diagnosis
from sparkdiag.watch.model import (
    GpuInfo,
    GpuTick,
    HostTick,
    JobTick,
    OtherProcess,
    ProcessInfo,
    ProcessLoad,
    Recording,
    StackFrame,
    StackTime,
    ThreadInfo,
    Tick,
)

DT = 0.5
SW_POWER_CAP = 0x4
SW_THERMAL = 0x20
HW_SLOWDOWN = 0x8
H200 = GpuInfo(0, "NVIDIA H200", "GPU-test", "dedicated")
MHZ = 1e6

F = Callable[[int], float | None]
T = TypeVar("T")


def const(value: float | None) -> F:
    return lambda i: value


Series = F | float | None  # a function of the tick index, or one value for every tick


def _at(series: Series, idle: float | None, i: int, active: bool) -> float | None:
    """``series`` at tick ``i`` while the job runs (``active``), ``idle`` before and after."""
    if not active:
        return idle
    return series(i) if callable(series) else series


def timeline(
    n: int = 80,
    util: Series = 0.99,
    sm: Series = 0.90,
    tensor: Series = 0.70,
    clock: Series = 1755.0,
    reasons: Callable[[int], int] = lambda i: SW_POWER_CAP,
    temperature: Series = 62.0,
    thread: Series = 1.0,  # the training loop's main thread spin-waits on the GPU
    write: Series = 2e5,
    read: Series = 1e6,
    memory_stall: Series = 0.0,
    io_stall: Series = 0.0,
    swap: Series = 0.0,
    dram: Series = 0.30,
    memory_util: Series = 0.30,
    power: Series = 650.0,
    power_limit: float | None = 700.0,
    idle_power: float = 80.0,
    loads: Callable[[int], tuple[ProcessLoad, ...]] = lambda i: (),
    cpu: Series = 1.2,
    warmup: int = 0,
    teardown: int = 0,
    samples: bool = True,
    gpus: tuple[GpuInfo, ...] = (H200,),
    on_gpu: bool = True,
    job_cpus: int | None = None,
) -> Recording:
    """``n`` ticks of ``DT`` seconds; ``warmup`` idle ticks before and ``teardown`` after (CUDA
    initialisation, loading, saving the result: the GPU idle, the host busy). With ``on_gpu``
    the job is among the GPU's compute processes, holding 7.6 GB, from the first tick on."""
    ticks = []
    total = warmup + n + teardown
    for k in range(total):
        i = k - warmup
        active = 0 <= i < n

        at = functools.partial(_at, i=i, active=active)
        u = at(util, 0.0)
        t = (k + 1) * DT
        gpu = GpuTick(
            index=0,
            utilization=u,
            samples=(
                tuple((t - DT + j * DT / 3, u) for j in range(3))
                if samples and u is not None
                else ()
            ),
            sm_activity=None if sm is None else at(sm, 0.0),
            tensor_activity=None if tensor is None else at(tensor, 0.0),
            dram_activity=None if dram is None else at(dram, 0.0),
            memory_utilization=at(memory_util, 0.0),
            sm_clock_hz=at(clock, 345.0) * MHZ,  # type: ignore[operator]
            sm_clock_max_hz=1980 * MHZ,
            reasons=reasons(i) if active else 0x1,
            temperature=at(temperature, 40.0),
            power_w=at(power, idle_power),
            power_limit_w=power_limit,
            job_on_gpu=on_gpu,
            job_memory_bytes=7.6e9 if on_gpu else None,
        )
        job = JobTick(
            processes=1,
            threads=30,
            cpu_cores=at(cpu, 1.2),
            gpu_thread=at(thread, 1.0),
            gpu_thread_name="python3",
            other_cpu_cores=0.0,
            read_bps=at(read, 5e7),
            write_bps=at(write, 0.0),
            loads=loads(i) if active else (),
        )
        host = HostTick(
            memory_stall=at(memory_stall, 0.0),
            memory_full=0.0,
            io_stall=at(io_stall, 0.0),
            cpu_stall=0.0,
            swap_bps=at(swap, 0.0),
            available_bytes=100e9,
        )
        ticks.append(Tick(t=t, dt=DT, gpus=(gpu,) if gpus else (), job=job, host=host))
    return Recording(
        started_at=1.7e9,
        interval=DT,
        job="python3 train.py",
        gpus=gpus,
        ticks=tuple(ticks),
        job_cpus=job_cpus,
    )


def periodic(start: int, stop: int, period: int = 20) -> Callable[[int], bool]:
    """True on ticks ``start`` to ``stop`` - 1 of every ``period``."""
    return lambda i: start <= i % period < stop


def during(ticks: Callable[[int], bool], inside: T, outside: T) -> Callable[[int], T]:
    """``inside`` on the ticks where ``ticks`` holds, ``outside`` on the others."""
    return lambda i: inside if ticks(i) else outside


def stop_then_burst(util: float, sm: float, thread: float, burst: int, **series: F) -> Recording:
    """A busy job whose GPU falls to ``util`` and ``sm`` on ticks 8-13 of every 20 (a 3 s stop
    every 10 s), its main thread at ``thread`` meanwhile, and that writes 2.4 GB/s on the one
    tick ``burst`` of every 20; ``series`` as :func:`timeline`'s."""
    stop = periodic(8, 14)
    return timeline(
        util=during(stop, util, 0.99),
        sm=during(stop, sm, 0.9),
        thread=during(stop, thread, 1.0),
        write=during(periodic(burst, burst + 1), 2.4e9, 1e5),
        **series,
    )


def names(d: Diagnosis) -> list[str]:
    return [c.name for c in d.causes]


def sole_cause(d: Diagnosis, name: str, about: float | None = None, within: float = 0.01) -> Cause:
    """The one cause of ``d``, which must be ``name`` (at a share of ``about`` ± ``within``)."""
    assert names(d) == [name], [(c.name, round(c.share, 3)) for c in d.causes]
    cause = d.causes[0]
    if about is not None:
        assert cause.share == pytest.approx(about, abs=within)
    return cause


def share(d: Diagnosis, name: str) -> float:
    (cause,) = [c for c in d.causes if c.name == name]
    return cause.share


def saving(ticks: Callable[[int], bool], thread: float) -> Recording:
    """A busy job that stops on ``ticks`` (GPU 2 %, SMs 1 %) writing 1.5 GB/s, its main thread
    at ``thread`` meanwhile."""
    return timeline(
        util=during(ticks, 0.02, 0.99),
        sm=during(ticks, 0.01, 0.9),
        thread=during(ticks, thread, 1.0),
        write=during(ticks, 1.5e9, 1e5),
    )


# ---- stacks --------------------------------------------------------------------------------------

SITE = "/usr/lib/python3/dist-packages/"  # where a library's frames live
Stack = tuple[StackFrame, ...]


def frame(function: str, file: str, line: int = 1, text: str = "") -> StackFrame:
    """A frame; ``file`` relative to the site packages when it starts with a package name
    (``torch/serialization.py``), else the job's own (``/job/train.py``)."""
    return StackFrame(function, file if file.startswith(("/", "<")) else SITE + file, line, text)


def loop(line: int, text: str, *deeper: StackFrame) -> Stack:
    """The training loop at ``/job/train.py:line`` (``text``), then ``deeper`` frames."""
    return (frame("<module>", "/job/train.py", 3, "main()"),
            frame("main", "/job/train.py", line, text), *deeper)  # fmt: skip


def with_stacks(
    rec: Recording,
    at: Callable[[int], Sequence[tuple[Stack, float]]],
    warmup: int = 0,
    threads: tuple[ThreadInfo, ...] = (ThreadInfo(4242, 4242, "MainThread", "python3"),),
    thread: Callable[[int], int] = lambda i: 0,
) -> Recording:
    """``rec`` with the training thread's stacks: ``at(i)`` gives, for the active tick ``i``
    (0 is the first after ``warmup``), each stack and the share of the tick spent in it (one
    visit where the tick before was not in it); ``thread(i)`` the index of the thread."""
    return with_threads(
        rec, lambda i: [(thread(i), stack, share) for stack, share in at(i)], warmup, threads
    )


def with_threads(
    rec: Recording,
    at: Callable[[int], Sequence[tuple[int, Stack, float]]],
    warmup: int = 0,
    threads: tuple[ThreadInfo, ...] = (ThreadInfo(4242, 4242, "MainThread", "python3"),),
) -> Recording:
    """``rec`` with the stacks of several threads: ``at(i)`` gives, for the active tick ``i``,
    (thread index, stack, share of the tick) for each; a visit where the thread was not in
    that stack in the last tick it was seen in (as py-spy's stretches: a tick without the
    thread is no change of stack)."""
    frames: dict[StackFrame, int] = {}
    stacks: dict[tuple[int, ...], int] = {}
    ticks = []
    before: dict[int, set[int]] = {}  # a thread's stacks in the last tick it was seen
    for k, tick in enumerate(rec.ticks):
        i = k - warmup
        times = []
        for index, stack, share in at(i):
            ids = tuple(frames.setdefault(f, len(frames)) for f in stack)
            n = stacks.setdefault(ids, len(stacks))
            times.append(StackTime(index, n, share * tick.dt, int(n not in before.get(index, ()))))
        for t in times:
            before[t.thread] = {u.stack for u in times if u.thread == t.thread}
        ticks.append(replace(tick, stacks=tuple(times)))
    return replace(
        rec,
        ticks=tuple(ticks),
        frames=tuple(frames),
        stacks=tuple(stacks),
        threads=threads,
        stack_sampler="py-spy 0.4.3, 20 samples a second per process, non-blocking",
    )


def others(rec: Recording, sm: Callable[[int], float | None], warmup: int = 0,
           pid: int = 777, memory: float = 12e9) -> Recording:  # fmt: skip
    """``rec`` with another process on GPU 0 taking ``sm(i)`` of active tick ``i``, the device's
    utilization raised by as much (at most 1)."""
    ticks = []
    for k, tick in enumerate(rec.ticks):
        i = k - warmup
        gpus = []
        for g in tick.gpus:
            took = sm(i) if i >= 0 else None
            if took is None or not g.job_on_gpu:
                gpus.append(g)
                continue
            util = min(1.0, (g.utilization or 0.0) + took)
            gpus.append(replace(g, utilization=util, others=(OtherProcess(pid, took, memory),),
                                samples=tuple((t, util) for t, _ in g.samples)))  # fmt: skip
        ticks.append(replace(tick, gpus=tuple(gpus)))
    who = ProcessInfo(pid, "python3", "alice", "c0ffee" * 10 + "abcd", "")
    return replace(rec, ticks=tuple(ticks), tenants=(who,))


# ---- a real job that ends at a poll of the scripted fixture -------------------------------------

SHORT_WINDOW = 0.3  # seconds: the shortest window diagnosed under :func:`short_window`


def short_window(monkeypatch: pytest.MonkeyPatch, seconds: float = SHORT_WINDOW) -> None:
    """A window of ``seconds`` (and still ``MIN_WINDOW_TICKS`` ticks) diagnosed, where 2 s are
    needed (``MIN_WINDOW_SECONDS``), for ``sparkdiag watch`` run in this process by a test that
    is not about that rule: its job polled at 0.1 s, not kept for 2.5-3 s of waiting. The rule
    keeps its real value in its own tests (test_a_job_too_short_to_diagnose_...,
    test_a_window_under_three_ticks_or_two_seconds_...). The report's line on the rule says the
    value in force (render holds its own name for it, bound when first imported: here, before
    any patch)."""
    for module in (diagnosis, render):
        monkeypatch.setattr(module, "MIN_WINDOW_SECONDS", seconds)


class PollGate:
    """A real job for ``sparkdiag watch`` run in this process (``invoke_cli``) that ends once the
    NVML fixture has answered ``polls`` polls (the first, which primes the counters and is
    dropped, included), however slowly this machine ticks: the scripted phases are counted in
    polls (watch-throttled changes at poll 10), so a job of fixed length saw fewer of them on a
    loaded machine and waited for nothing on an idle one. :attr:`sleeper` waits in ``cat`` on a
    FIFO (no CPU, no reads, like ``sleep``); :attr:`spinner` keeps a core busy until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, directory: Path, polls: int) -> None:
        self.fifo = directory / "release"
        self.flag = directory / "released"
        os.mkfifo(self.fifo)
        self.polls = polls
        self.waits_in_fifo = False
        gate = self
        advance = FixtureBackend.advance

        def counted(backend: FixtureBackend) -> None:
            advance(backend)
            if backend.poll == gate.polls:
                gate.release()

        monkeypatch.setattr(FixtureBackend, "advance", counted)

    @property
    def sleeper(self) -> list[str]:
        self.waits_in_fifo = True
        return ["cat", str(self.fifo)]

    @property
    def spinner(self) -> list[str]:
        spin = f"import os\nwhile not os.path.exists({str(self.flag)!r}): pass\n"
        return [sys.executable, "-c", spin]

    def release(self) -> None:
        self.flag.touch()
        if self.waits_in_fifo:
            # opening the FIFO waits until the job has it open; closing it ends the job's read
            os.close(os.open(self.fifo, os.O_WRONLY))
