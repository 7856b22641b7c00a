"""Synthetic watch recordings for the diagnosis tests: :func:`timeline` builds one from a
function per series (tick index -> value), with the job's start-up and tear-down around it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sparkdiag.watch.diagnose import Diagnosis
from sparkdiag.watch.model import (
    GpuInfo,
    GpuTick,
    HostTick,
    JobTick,
    ProcessLoad,
    Recording,
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


C_0_99 = const(0.99)
C_0_90 = const(0.90)
C_0_70 = const(0.70)
C_1755_0 = const(1755.0)
C_62_0 = const(62.0)
C_1_0 = const(1.0)
C_2e5 = const(2e5)
C_1e6 = const(1e6)
C_0_0 = const(0.0)
C_0_30 = const(0.30)
C_650_0 = const(650.0)
C_1_2 = const(1.2)


def timeline(
    n: int = 80,
    util: F = C_0_99,
    sm: F | None = C_0_90,
    tensor: F | None = C_0_70,
    clock: F = C_1755_0,
    reasons: Callable[[int], int] = lambda i: SW_POWER_CAP,
    temperature: F = C_62_0,
    thread: F = C_1_0,  # the training loop's main thread spin-waits on the GPU
    write: F = C_2e5,
    read: F = C_1e6,
    memory_stall: F = C_0_0,
    io_stall: F = C_0_0,
    swap: F = C_0_0,
    dram: F | None = C_0_30,
    memory_util: F = C_0_30,
    power: F = C_650_0,
    power_limit: float | None = 700.0,
    idle_power: float = 80.0,
    loads: Callable[[int], tuple[ProcessLoad, ...]] = lambda i: (),
    cpu: F = C_1_2,
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
        u = util(i) if active else 0.0
        t = (k + 1) * DT
        gpu = GpuTick(
            index=0,
            utilization=u,
            samples=(
                tuple((t - DT + j * DT / 3, u) for j in range(3))
                if samples and u is not None
                else ()
            ),
            sm_activity=(sm(i) if active else 0.0) if sm is not None else None,
            tensor_activity=(tensor(i) if active else 0.0) if tensor is not None else None,
            dram_activity=(dram(i) if active else 0.0) if dram is not None else None,
            memory_utilization=memory_util(i) if active else 0.0,
            sm_clock_hz=(clock(i) if active else 345.0) * MHZ,  # type: ignore[operator]
            sm_clock_max_hz=1980 * MHZ,
            reasons=reasons(i) if active else 0x1,
            temperature=temperature(i) if active else 40.0,
            power_w=power(i) if active else idle_power,
            power_limit_w=power_limit,
            job_on_gpu=on_gpu,
            job_memory_bytes=7.6e9 if on_gpu else None,
        )
        job = JobTick(
            processes=1,
            threads=30,
            cpu_cores=cpu(i) if active else 1.2,
            gpu_thread=thread(i) if active else 1.0,
            gpu_thread_name="python3",
            other_cpu_cores=0.0,
            read_bps=read(i) if active else 5e7,
            write_bps=write(i) if active else 0.0,
            loads=loads(i) if active else (),
        )
        host = HostTick(
            memory_stall=memory_stall(i) if active else 0.0,
            memory_full=0.0,
            io_stall=io_stall(i) if active else 0.0,
            cpu_stall=0.0,
            swap_bps=swap(i) if active else 0.0,
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
