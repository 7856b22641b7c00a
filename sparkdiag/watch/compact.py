"""Two neighbouring ticks as one, so that a long watch holds a bounded number of them.

``watch`` keeps every tick in memory until the job ends (2.3 KiB each, the median of the
recordings of real jobs loaded: 16 MiB an hour at the default 0.5 s, some 390 MiB for a day's
training run; ``benchmarks/watch_memory.py``) and writes them all to ``--record``, which
``--replay`` reads up to 64 MiB. When a watch reaches :data:`MAX_TICKS` ticks, :func:`halve`
merges each pair of neighbours into one tick twice as long and the sampling interval doubles
from then on, so the ticks stay evenly spaced, as the diagnosis expects, and their number
stays between half of and the bound, whatever the job's length.

How each figure of a pair becomes one (``a`` the earlier tick, ``b`` the later):

* rates and fractions over the tick (utilization, GPM activities, clocks, power, PCIe rates,
  CPU, reads and writes, pressure stalls, swap): the mean weighted by each tick's length; where
  one side has none, the other's;
* readings that are worse when higher (temperatures, GPU memory held, process and thread counts,
  the other processes seen): the larger, so that a hot or crowded moment is not averaged away;
  free memory: the smaller;
* the clock event reasons: every reason either tick saw, with the share of the merged time each
  was read set (``reasons_held``: a reason read once is not held through every tick it is merged
  into); the power limit and the maximum SM clock: the later tick's;
* the driver's utilization samples: every other one of the pair's, so that a merged tick holds
  about as many as one tick did (the idle stretches they show are found at half the resolution);
* the job's processes and the other processes on a GPU, by pid: CPU and SM use averaged over the
  merged tick (absent from one tick: none there), reads likewise, memory the larger, the
  busiest kept as the sampler keeps them. A GPU's tick that was the other processes' alone
  (``views.theirs``: the job not on it, every process on it one this namespace shows; the
  sampler reads no per-process samples there and the diagnosis gives them the whole of its
  utilization) brings that utilization to the merge as theirs, shared over their pids as the
  other tick shares it (else evenly): merged with a tick of the job's, whose presence makes
  the merged tick the job's, the neighbour's use there had counted as none and its kernels as
  the job's (a co-tenant's recording read the job at 51 % in the merged tick it started in,
  at 2 % in the next, and its window opened 11.5 s early);
* the Python stacks: the seconds (and the visits) of each thread and stack added up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from sparkdiag.watch.model import (
    GpuTick,
    HostTick,
    JobTick,
    OtherProcess,
    ProcessLoad,
    StackTime,
    Tick,
    set_bits,
)
from sparkdiag.watch.sampler import OTHERS_KEPT, TOP_PROCESSES
from sparkdiag.watch.views import theirs

# A day at the default 0.5 s is 172,800 ticks; at 2.3 KiB each this bound keeps watch under
# about 37 MiB of ticks and a recording near 16 MB (--replay reads up to 64 MiB).
MAX_TICKS = 16384

T = TypeVar("T")


def halve(ticks: Sequence[Tick]) -> list[Tick]:
    """Each pair of neighbouring ticks as one; an odd last tick is kept as it is."""
    merged = [merge(ticks[i], ticks[i + 1]) for i in range(0, len(ticks) - 1, 2)]
    if len(ticks) % 2:
        merged.append(ticks[-1])
    return merged


def merge(a: Tick, b: Tick) -> Tick:
    """The tick ``a`` followed by ``b`` as one tick ending where ``b`` ends."""
    w = (a.dt, b.dt)
    by_index = {g.index: g for g in a.gpus}
    gpus = []
    for g in b.gpus:
        earlier = by_index.pop(g.index, None)
        gpus.append(g if earlier is None else _gpu(earlier, g, w))
    gpus.extend(by_index.values())  # a GPU the later tick did not sample
    return Tick(
        t=b.t,
        dt=a.dt + b.dt,
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        job=_job(a.job, b.job, w),
        host=_host(a.host, b.host, w),
        stacks=_stacks(a.stacks, b.stacks),
    )


def _mean(x: float | None, y: float | None, w: tuple[float, float]) -> float | None:
    if x is None:
        return y
    if y is None:
        return x
    total = w[0] + w[1]
    return (x * w[0] + y * w[1]) / total if total > 0 else (x + y) / 2


def _pick(x: T | None, y: T | None, choose: Callable[[T, T], T]) -> T | None:
    if x is None:
        return y
    if y is None:
        return x
    return choose(x, y)


def _gpu(a: GpuTick, b: GpuTick, w: tuple[float, float]) -> GpuTick:
    def mean(name: str) -> float | None:
        return _mean(getattr(a, name), getattr(b, name), w)

    def most(name: str) -> float | None:
        return _pick(getattr(a, name), getattr(b, name), max)

    return GpuTick(
        index=b.index,
        utilization=mean("utilization"),
        samples=(a.samples + b.samples)[::2],
        sm_activity=mean("sm_activity"),
        tensor_activity=mean("tensor_activity"),
        dram_activity=mean("dram_activity"),
        sm_occupancy=mean("sm_occupancy"),
        sm_clock_hz=mean("sm_clock_hz"),
        sm_clock_max_hz=_pick(a.sm_clock_max_hz, b.sm_clock_max_hz, lambda x, y: y),
        reasons=_pick(a.reasons, b.reasons, lambda x, y: x | y),
        reasons_held=_reasons_held(a, b, w),
        temperature=most("temperature"),
        memory_temperature=most("memory_temperature"),
        power_w=mean("power_w"),
        power_limit_w=_pick(a.power_limit_w, b.power_limit_w, lambda x, y: y),
        pcie_tx=mean("pcie_tx"),
        pcie_rx=mean("pcie_rx"),
        job_on_gpu=a.job_on_gpu or b.job_on_gpu,
        memory_utilization=mean("memory_utilization"),
        job_memory_bytes=most("job_memory_bytes"),
        job_sm=mean("job_sm"),
        others=_others(_seen_others(a, b), _seen_others(b, a), w),
        others_seen=_pick(a.others_seen, b.others_seen, max),
        others_seen_pids=tuple(sorted(set(a.others_seen_pids) | set(b.others_seen_pids)))[
            :OTHERS_KEPT
        ],
        others_unseen=_pick(a.others_unseen, b.others_unseen, max),
    )


def _reasons_held(a: GpuTick, b: GpuTick, w: tuple[float, float]) -> tuple[tuple[int, float], ...]:
    """Each reason's share of the merged time, from the shares of the two ticks (an OR of the
    bits alone would count a reason read once as held through every tick it is merged into)."""
    total = w[0] + w[1]
    weights = (w[0] / total, w[1] / total) if total > 0 else (0.5, 0.5)
    held = []
    for bit in set_bits((a.reasons or 0) | (b.reasons or 0)):
        share = weights[0] * a.reasons_share(bit) + weights[1] * b.reasons_share(bit)
        if share < 1.0:
            held.append((bit, share))
    return tuple(held)


def _by_pid(
    a: Iterable[T], b: Iterable[T], pid: Callable[[T], int]
) -> list[tuple[T | None, T | None]]:
    """Pairs (in a, in b) of the same pid, in the order first seen."""
    earlier = {pid(x): x for x in a}
    pairs: list[tuple[T | None, T | None]] = []
    for y in b:
        pairs.append((earlier.pop(pid(y), None), y))
    pairs.extend((x, None) for x in earlier.values())
    return pairs


def _share(x: float | None, y: float | None, w: tuple[float, float]) -> float | None:
    """A use over the merged tick where a process absent from one tick used nothing there."""
    if x is None and y is None:
        return None
    total = w[0] + w[1]
    used = (x or 0.0) * w[0] + (y or 0.0) * w[1]
    return used / total if total > 0 else used


def _seen_others(g: GpuTick, beside: GpuTick) -> tuple[OtherProcess, ...]:
    """The other processes of ``g`` as the diagnosis reads them, where ``beside`` (the other
    tick of the pair) is not theirs alone and the merged tick will not be either: a tick that was
    (:func:`.views.theirs`, no per-process samples read) is its whole utilization theirs, shared
    over the pids it saw as ``beside`` shares it, else evenly."""
    pids = g.others_seen_pids
    if not theirs(g) or theirs(beside) or g.others or g.utilization is None or not pids:
        return g.others
    known = {o.pid: o.sm for o in beside.others if o.sm is not None and o.pid in pids}
    # a pid the other tick does not show gets the mean share of those it does (none known:
    # even shares): at 0 it read as a tenant that used nothing while the GPU was theirs
    usual = sum(known.values()) / len(known) if known else 1.0
    weights = [known.get(pid, usual) for pid in pids]
    if sum(weights) <= 0:
        weights = [1.0] * len(pids)
    total = sum(weights)
    return tuple(
        OtherProcess(pid=pid, sm=g.utilization * weight / total, memory_bytes=None)
        for pid, weight in zip(pids, weights, strict=True)
    )


def _others(
    a: tuple[OtherProcess, ...], b: tuple[OtherProcess, ...], w: tuple[float, float]
) -> tuple[OtherProcess, ...]:
    merged = []
    for x, y in _by_pid(a, b, lambda p: p.pid):
        either = y or x
        assert either is not None
        merged.append(
            OtherProcess(
                pid=either.pid,
                sm=_share(x.sm if x else None, y.sm if y else None, w),
                memory_bytes=_pick(
                    x.memory_bytes if x else None, y.memory_bytes if y else None, max
                ),
            )
        )
    return tuple(merged)


def _job(a: JobTick, b: JobTick, w: tuple[float, float]) -> JobTick:
    busiest = b if (b.gpu_thread or 0.0) >= (a.gpu_thread or 0.0) else a
    loads = []
    for x, y in _by_pid(a.loads, b.loads, lambda p: p.pid):
        either = y or x
        assert either is not None
        loads.append(
            ProcessLoad(
                pid=either.pid,
                name=either.name,
                cpu_cores=_share(x.cpu_cores if x else None, y.cpu_cores if y else None, w) or 0.0,
                read_bps=_share(x.read_bps if x else None, y.read_bps if y else None, w),
                on_gpu=bool((x and x.on_gpu) or (y and y.on_gpu)),
            )
        )
    loads.sort(key=lambda p: -p.cpu_cores)
    return JobTick(
        processes=max(a.processes, b.processes),
        threads=max(a.threads, b.threads),
        cpu_cores=_mean(a.cpu_cores, b.cpu_cores, w),
        gpu_thread=_mean(a.gpu_thread, b.gpu_thread, w),
        gpu_thread_name=busiest.gpu_thread_name,
        other_cpu_cores=_mean(a.other_cpu_cores, b.other_cpu_cores, w),
        read_bps=_mean(a.read_bps, b.read_bps, w),
        write_bps=_mean(a.write_bps, b.write_bps, w),
        loads=tuple(loads[:TOP_PROCESSES]),
        gpu_thread_id=busiest.gpu_thread_id,
        writing=tuple(dict.fromkeys(a.writing + b.writing)),
        reading=tuple(dict.fromkeys(a.reading + b.reading)),
    )


def _host(a: HostTick, b: HostTick, w: tuple[float, float]) -> HostTick:
    return HostTick(
        memory_stall=_mean(a.memory_stall, b.memory_stall, w),
        memory_full=_mean(a.memory_full, b.memory_full, w),
        io_stall=_mean(a.io_stall, b.io_stall, w),
        cpu_stall=_mean(a.cpu_stall, b.cpu_stall, w),
        swap_bps=_mean(a.swap_bps, b.swap_bps, w),
        available_bytes=_pick(a.available_bytes, b.available_bytes, min),
    )


def _stacks(a: tuple[StackTime, ...], b: tuple[StackTime, ...]) -> tuple[StackTime, ...]:
    total: dict[tuple[int, int], StackTime] = {}
    for s in a + b:
        key = (s.thread, s.stack)
        kept = total.get(key)
        total[key] = (
            s
            if kept is None
            else StackTime(s.thread, s.stack, kept.seconds + s.seconds, kept.visits + s.visits)
        )
    return tuple(total.values())
