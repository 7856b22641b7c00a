"""The evidence for each cause the diagnosis found, and for input starvation the advice in the
order the evidence suggests. Pure functions of the :class:`~sparkdiag.watch.views.View` ticks
the rules in :mod:`.diagnose` gave to each cause."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sparkdiag.sources.nvml.gpu import decode_reasons
from sparkdiag.watch.causes import ACTIONS, Cause, fine_pct, mean, pct, rate
from sparkdiag.watch.model import LOADER_NAMES, Recording
from sparkdiag.watch.views import POWER_CAP, UNHEALTHY_MASK, View

HOT_THREAD = 0.85
TINY_KERNELS = 0.50  # SM activity over utilization: the SMs at most half occupied
IDLE_MIN = 0.10
LOADER_BUSY = 0.80  # of a core: a loader process that never waits
LOADER_WORKING = 0.30  # of a core: a loader process that does some of the work
SPARE_CPUS = 2.0  # idle CPUs the job may use before more workers are worth trying first
IO_WAIT = 0.10  # PSI io "some": tasks waiting on storage this share of the time
READ_HEAVY = 100e6  # bytes/s read by the job while the GPU waited
# Below this the job read next to nothing: the host's I/O pressure (PSI outside a cgroup of the
# job's own) cannot be told to be the job's input (a neighbour writing, another test); reads
# through mmap and a read still blocked are not counted, so it is not ruled out either
READ_SOME = 1e6
PCIE_HEAVY = 1e9  # bytes/s host to device while the GPU waited
THROTTLE_MIN = 0.05  # of the busy ticks
MEMORY_MIN = 0.05
TENSOR_LOW = 0.10
LOW_TENSOR_SHARE = 0.50
LOW_TENSOR_BUSY_MIN = 0.20
# s: a tick this long (one a long watch merged, or a long --interval) averages a write burst with
# the quiet around it, so a rate read from it is a lower bound and says over what it was averaged
COARSE_TICK = 2.0

WORKERS = (
    "give the data loader more workers: DataLoader(num_workers={workers}, "
    "persistent_workers=True) and a larger prefetch_factor{why}"
)
GPU_PREP = (
    "decode and augment on the GPU (torchvision.transforms.v2 on CUDA tensors, NVIDIA DALI), "
    "or do less per sample on the CPU: resize the dataset once, cache decoded samples"
)
PINNED = (
    "copy batches from pinned memory without waiting: pin_memory=True and "
    ".to(device, non_blocking=True), so the copy overlaps the step"
)
STORE = (
    "read faster: keep the dataset on local NVMe or in memory (the page cache) rather than a "
    "network share, and pack small files into shards (WebDataset, tar, LMDB)"
)
IN_WORKERS = (
    "prepare batches in worker processes: DataLoader(num_workers=4 or more, "
    "persistent_workers=True) instead of in the training thread"
)
FIND_WAIT = (
    "find what the job waits for: py-spy dump --pid PID shows where the training thread and "
    "its loaders are blocked (a remote read, a lock, a queue nobody fills, a sleep)"
)
PREFETCH = (
    "hide the latency: more loader workers (DataLoader num_workers) and a larger "
    "prefetch_factor keep several batches in flight while each one waits"
)
MORE_CPUS = (
    "give the job more CPUs (the loaders use every CPU it may run on), or fewer, cheaper transforms"
)


@dataclass(frozen=True)
class Context:
    """What every evidence builder may use: the recording, the window's ticks, the smoothed
    busiest-GPU-thread figures, the GPUs' power idle and while the job computed."""

    rec: Recording
    gpus: tuple[int, ...]
    win: list[View]
    threads: list[float | None]
    start: float
    end: float
    idle_power: float | None
    busy_power: float | None


def averaged(seconds: float) -> str:
    """What to write after a rate read from ticks ``seconds`` long: over how long it was
    averaged, where that hides a burst's own rate (``COARSE_TICK``); nothing for short ticks."""
    return f" (averaged over {seconds:.1f} s)" if seconds >= COARSE_TICK else ""


def runs(indexes: Sequence[int] | set[int]) -> list[list[int]]:
    """Consecutive indexes grouped."""
    out: list[list[int]] = []
    for i in sorted(indexes):
        if out and i == out[-1][-1] + 1:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _seconds(ctx: Context, idx: Sequence[int]) -> float:
    return sum(ctx.win[i].dt for i in idx)


def idle_gaps(rec: Recording, gpus: tuple[int, ...], start: float, end: float) -> list[float]:
    """Lengths of the stretches the driver's samples show the GPUs idle (under 10 %)."""
    samples = sorted(
        (t, v)
        for tick in rec.ticks
        for g in tick.gpus
        if g.index in gpus
        for t, v in g.samples
        if start <= t <= end
    )
    gaps: list[float] = []
    began: float | None = None
    for t, v in samples:
        if v < IDLE_MIN and began is None:
            began = t
        elif v >= IDLE_MIN and began is not None:
            gaps.append(t - began)
            began = None
    return [g for g in gaps if g > 0]


# -- input-starved ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Loaders:
    """The job's processes that do not hold the GPU, over the starved ticks."""

    names: tuple[str, ...]
    cpus: tuple[float, ...]  # median CPU of each, in cores, busiest first
    reads: float | None  # median of their reads together, bytes/s

    @property
    def busy(self) -> int:
        return sum(c >= LOADER_BUSY for c in self.cpus)

    @property
    def working(self) -> int:
        return sum(c >= LOADER_WORKING for c in self.cpus)


def _loaders(ticks: Sequence[View]) -> _Loaders:
    known = any(p.on_gpu for v in ticks for p in v.loads)
    per_pid: dict[int, list[float]] = {}
    names: dict[int, str] = {}
    reads: list[float] = []
    for v in ticks:
        mine = [p for p in v.loads if (not p.on_gpu if known else p.name.startswith(LOADER_NAMES))]
        for p in mine:
            per_pid.setdefault(p.pid, []).append(p.cpu_cores)
            names[p.pid] = p.name
        reads.append(sum(p.read_bps or 0.0 for p in mine))
    n = max(1, len(ticks))
    # a process seen in fewer than half the ticks (a short-lived helper) is not a loader
    kept = {pid: cpus + [0.0] * (n - len(cpus)) for pid, cpus in per_pid.items()}
    kept = {pid: c for pid, c in kept.items() if len(per_pid[pid]) >= n / 2}
    order = sorted(kept, key=lambda pid: -statistics.median(kept[pid]))
    return _Loaders(
        names=tuple(sorted({names[pid] for pid in order})),
        cpus=tuple(statistics.median(kept[pid]) for pid in order),
        reads=statistics.median(reads) if reads and kept else None,
    )


def median_read(ctx: Context, idx: list[int]) -> float | None:
    """The job's reads over the ticks ``idx``, bytes/s (median)."""
    return _median([ctx.win[i].read for i in idx])


def input_cause(ctx: Context, idx: list[int], share: float) -> Cause:
    """Input starvation: who does the work the GPU waits for, and what to try first."""
    ticks = [ctx.win[i] for i in idx]
    evidence = [
        f"the GPU waited {pct(share)} of the time it would otherwise have worked "
        f"(idle {pct(mean([1.0 - v.util for v in ticks]) or 0.0)} during "
        f"{_seconds(ctx, idx):.1f} s)"
    ]
    gaps = idle_gaps(ctx.rec, ctx.gpus, ctx.start, ctx.end)
    if gaps:
        evidence.append(
            f"{len(gaps)} idle gaps in the driver's samples, median {statistics.median(gaps):.2f} s"
        )
    loaders = _loaders(ticks)
    thread = _median([ctx.threads[i] for i in idx])
    names = [v.gpu_thread_name for v in ticks if v.gpu_thread_name]
    name = statistics.mode(names) if names else "?"
    main_hot = thread is not None and thread >= HOT_THREAD
    if loaders.cpus:
        shown = ", ".join(pct(c) for c in loaders.cpus[:6]) + (
            ", ..." if len(loaders.cpus) > 6 else ""
        )
        evidence.append(
            f"{len(loaders.cpus)} loader process{'es' if len(loaders.cpus) > 1 else ''} "
            f"({', '.join(loaders.names)}) at {shown} of a core (median) meanwhile"
            + (": each busy all the time" if loaders.busy == len(loaders.cpus) else "")
        )
    if thread is not None:
        evidence.append(
            f"the GPU's busiest thread {name!r} at {pct(thread)} of a core: "
            + (
                "it prepares the data (or runs other host code) itself between steps"
                if main_hot
                else "waiting for its batches"
            )
        )
    reads = _median([v.read for v in ticks])
    io = _median([v.io_stall for v in ticks])
    # the host's pressure while the job itself read next to nothing: not the job's reads that
    # anyone counted, so the advice starts from what it waits for (which names a remote read)
    others_io = ctx.rec.pressure_scope != "cgroup" and reads is not None and reads < READ_SOME
    if reads is not None:
        psi = f"PSI of {psi_of(ctx.rec)}, not the job's reads" if others_io else "PSI"
        evidence.append(
            f"the job read {rate(reads)} (median)"
            + (
                ""
                if not io or io < 0.01
                else f", tasks stalled on I/O {pct(io)} of the time ({psi})"
            )
        )
    cpu = _median([v.cpu_cores for v in ticks])
    spare = None
    if cpu is not None and ctx.rec.job_cpus:
        spare = ctx.rec.job_cpus - cpu
        pressure = _median([v.cpu_stall for v in ticks])
        evidence.append(
            f"the job used {cpu:.1f} of the {ctx.rec.job_cpus} CPUs it may run on"
            + ("" if not pressure else f"; tasks waited for a CPU {pct(pressure)} of the time")
        )
    rx = _median([v.pcie_rx for v in ticks])

    storage = (io is not None and io >= IO_WAIT and not others_io) or (
        reads is not None and reads >= READ_HEAVY and not loaders.busy and not main_hot
    )
    if storage:
        actions = [STORE, PREFETCH, PINNED]
    elif loaders.working:
        n = len(loaders.cpus)
        # the loaders feed the GPU (1 - share) of what it could take: that many times more
        needed = math.ceil(loaders.working / max(1.0 - share, 0.02))
        workers, why = f"{2 * n}", f" (the GPU would keep up with about {needed} like these)"
        if spare is not None and spare >= SPARE_CPUS:
            workers = f"{min(needed, n + int(spare))}"
            why = (
                f" ({spare:.0f} of the {ctx.rec.job_cpus} CPUs the job may use were idle; the "
                f"GPU would keep up with about {needed} workers like these)"
            )
        more = WORKERS.format(workers=workers, why=why)
        if spare is not None and spare < SPARE_CPUS:
            actions = [GPU_PREP, MORE_CPUS, PINNED]
        else:
            actions = [more, GPU_PREP, PINNED]
    elif main_hot:
        actions = (
            [PINNED, IN_WORKERS, GPU_PREP]
            if (rx or 0) >= PCIE_HEAVY
            else [IN_WORKERS, GPU_PREP, PINNED]
        )
    else:
        evidence.append("nobody in the job was busy meanwhile: it waited on something else")
        actions = [FIND_WAIT, PREFETCH, STORE]
    return Cause("input-starved", share, tuple(evidence), tuple(actions))


# -- the stalled kernel, few SMs, the launcher, checkpoints -----------------------------------


def stalled_cause(ctx: Context, idx: list[int], share: float) -> Cause:
    ticks = [ctx.win[i] for i in idx]
    util = _median([v.util for v in ticks]) or 0.0
    seconds = _seconds(ctx, idx)
    if any(v.sm is not None for v in ticks):
        what = (
            f"SM activity {fine_pct(_median([v.sm for v in ticks]) or 0.0)}, DRAM "
            f"{fine_pct(_median([v.dram for v in ticks]) or 0.0)}, tensor pipes "
            f"{fine_pct(_median([v.tensor for v in ticks]) or 0.0)} (GPM)"
        )
    else:
        what = (
            f"memory utilization {fine_pct(_median([v.memory_util for v in ticks]) or 0.0)} "
            "(no GPM here: SM and tensor activity not measured)"
        )
    evidence = [
        f"the GPU read busy {pct(util)} (NVML utilization) for {seconds:.1f} s while {what}: "
        "a kernel resident and doing no work"
    ]
    power = _median([v.power for v in ticks])
    if power is not None:
        limit = _median([v.power_limit for v in ticks])
        line = f"power {power:.0f} W" + ("" if limit is None else f" of {limit:.0f}")
        others = []
        if ctx.busy_power is not None:
            others.append(f"{ctx.busy_power:.0f} W while the job computed")
        if ctx.idle_power is not None:
            others.append(f"{ctx.idle_power:.0f} W idle")
        evidence.append(line + (f", against {' and '.join(others)}" if others else ""))
    thread = _median([ctx.threads[i] for i in idx])
    if thread is not None and thread >= HOT_THREAD:
        names = [v.gpu_thread_name for v in ticks if v.gpu_thread_name]
        name = statistics.mode(names) if names else "?"
        evidence.append(
            f"the job's thread {name!r} at {pct(thread)} of a core meanwhile: a host thread "
            "spinning while it waits for the GPU (a synchronize), not launching"
        )
    stretches = runs(idx)
    longest = max(sum(ctx.win[i].dt for i in r) for r in stretches)
    evidence.append(
        f"one stretch of {longest:.1f} s"
        if len(stretches) == 1
        else f"{len(stretches)} stretches, the longest {longest:.1f} s"
    )
    return Cause("stalled-kernel", share, tuple(evidence), ACTIONS["stalled-kernel"])


def few_sms_cause(ctx: Context, idx: list[int], share: float) -> Cause:
    ticks = [ctx.win[i] for i in idx]
    length = max(ctx.end - ctx.start, 1e-9)
    evidence = (
        f"kernels ran {pct(_median([v.util for v in ticks]) or 0.0)} of the time but kept SMs "
        f"only {pct(_median([v.sm for v in ticks]) or 0.0)} active, while DRAM was "
        f"{pct(_median([v.dram for v in ticks]) or 0.0)} and tensor pipes "
        f"{pct(_median([v.tensor for v in ticks]) or 0.0)} busy (GPM), during "
        f"{_seconds(ctx, idx):.1f} s ({pct(_seconds(ctx, idx) / length)} of the window)",
        "the GPU is not waiting for the CPU (a kernel is always running): each kernel is too "
        "small to fill it (a small batch), or runs on a few SMs (a serial kernel)",
    )
    return Cause("few-sms", share, evidence, ACTIONS["few-sms"], lost=False)


def launcher_cause(ctx: Context, idx: list[int], share: float) -> Cause:
    ticks = [ctx.win[i] for i in idx]
    names = [v.gpu_thread_name for v in ticks if v.gpu_thread_name]
    name = statistics.mode(names) if names else "?"
    cpu = statistics.median([v.gpu_thread or 0.0 for v in ticks])
    eff = statistics.median([v.eff for v in ticks])
    util = statistics.median([v.util for v in ticks])
    evidence = [
        f"thread {name!r} at {pct(cpu)} of a core during {len(ticks)} ticks",
        f"meanwhile the GPU worked {pct(eff)} of the time (utilization {pct(util)})",
    ]
    if all(v.sm is None for v in ticks):
        evidence.append(
            "no GPM here: a thread launching tiny kernels and one preparing data between "
            "steps cannot be told apart (both keep the GPU waiting)"
        )
    else:
        busy = [min(1.0, v.sm / v.util) for v in ticks if v.sm is not None and v.util > 0]
        filled = statistics.median(busy) if busy else 0.0
        evidence.append(
            "the kernels barely occupy the SMs while they run: tiny kernels"
            if filled < TINY_KERNELS
            else f"the kernels keep {pct(filled)} of the SMs active while they run: the time "
            "lost is the gaps between them"
        )
    return Cause("cpu-bound-launcher", share, tuple(evidence), ACTIONS["cpu-bound-launcher"])


def checkpoint_cause(ctx: Context, bursts: set[int], idx: list[int], share: float) -> Cause:
    win = ctx.win
    bursts_in_order = runs(bursts)
    top = max(bursts, key=lambda i: win[i].write or 0.0)
    peak = win[top].write or 0.0
    idle = mean([1.0 - win[i].util for i in idx]) or 0.0
    n = len(bursts_in_order)
    evidence = [
        f"{n} write burst{'s' if n > 1 else ''}, peak {rate(peak)}{averaged(win[top].dt)}, "
        f"{'each ' if n > 1 else ''}with the GPU idle around it "
        f"({pct(idle)} idle during {_seconds(ctx, idx):.1f} s)",
        f"{pct(share)} of the time lost while the job wrote and waited for its writes",
    ]
    io = mean([win[i].io_stall for i in idx])
    if io:
        evidence.append(f"tasks stalled on I/O {pct(io)} of that time (PSI of {psi_of(ctx.rec)})")
    if len(bursts_in_order) >= 2:
        starts = [win[r[0]].t for r in bursts_in_order]
        period = statistics.median(b - a for a, b in itertools.pairwise(starts))
        evidence.append(f"one every {period:.1f} s")
    return Cause("checkpoint-stalls", share, tuple(evidence), ACTIONS["checkpoint-stalls"])


# -- causes judged over the whole window ------------------------------------------------------


def throttle_cause(win: list[View], length: float, notes: list[str]) -> Cause | None:
    busy = [v for v in win if v.util >= 0.5]
    if not busy:
        return None
    # the shares of the busy ticks in which the reasons were set: 1 or 0 per tick as sampled,
    # the share of its time for a tick a long watch merged (views.View.throttled)
    throttled = [v for v in busy if v.reasons & UNHEALTHY_MASK]
    capped = [v for v in busy if v.reasons & POWER_CAP and not v.reasons & UNHEALTHY_MASK]
    throttled_share = sum(v.throttled for v in throttled) / len(busy)
    capped_share = sum(v.capped for v in capped) / len(busy)
    clean = [v.clock for v in busy if not v.reasons & UNHEALTHY_MASK and v.clock is not None]
    maxima = [v.clock_max for v in busy if v.clock_max is not None]
    reference = statistics.median(clean) if clean else (max(maxima) if maxima else None)
    if capped and capped_share >= THROTTLE_MIN:
        clock = mean([v.clock for v in capped])
        notes.append(
            f"power cap (sw_power_cap) active {pct(capped_share)} of the busy time"
            + ("" if clock is None else f", SM clock {clock / 1e6:.0f} MHz")
            + ": the GPU at its power limit, not a fault"
        )
    if not throttled or throttled_share < THROTTLE_MIN:
        return None
    lost = 0.0
    for v in throttled:
        if reference and v.clock is not None:
            lost += v.dt * max(0.0, 1.0 - v.clock / reference)
    share = lost / length
    names = sorted({n for v in throttled for n in decode_reasons(v.reasons & UNHEALTHY_MASK)})
    clock = mean([v.clock for v in throttled])
    temps = [v.temperature for v in throttled if v.temperature is not None]
    evidence = [f"{', '.join(names)} active {pct(throttled_share)} of the busy time"]
    if clock is not None and reference:
        evidence.append(
            f"SM clock {clock / 1e6:.0f} MHz then, against {reference / 1e6:.0f} MHz otherwise"
        )
    if temps:
        evidence.append(f"GPU up to {max(temps):.0f} °C")
    return Cause("throttled", share, tuple(evidence), ACTIONS["throttled"])


def psi_of(rec: Recording) -> str:
    """Whose stalls the recording's PSI counted (:attr:`HostSampler.pressure_scope`)."""
    return {
        "cgroup": "the job's cgroup",
        "shared-cgroup": "a cgroup the job shares with other processes",
    }.get(rec.pressure_scope, "the whole host")


def memory_cause(rec: Recording, start: float, end: float) -> Cause | None:
    ticks = [t for t in rec.ticks if start < t.t <= end + 1e-9]
    stalls = [(t.dt, t.host.memory_stall) for t in ticks if t.host.memory_stall is not None]
    if not stalls:
        return None
    total = sum(dt for dt, _ in stalls)
    share = sum(dt * s for dt, s in stalls) / total if total else 0.0
    if share < MEMORY_MIN:
        return None
    evidence = [f"tasks of {psi_of(rec)} stalled on memory {pct(share)} of the time (PSI some)"]
    full = mean([t.host.memory_full for t in ticks])
    if full:
        evidence.append(f"every task stalled {pct(full)} of the time (PSI full)")
    swap = mean([t.host.swap_bps for t in ticks])
    if swap:
        evidence.append(f"swapping {rate(swap)} on average")
    available = [t.host.available_bytes for t in ticks if t.host.available_bytes is not None]
    if available:
        evidence.append(f"available memory down to {min(available) / 2**30:.1f} GiB")
    if any(g.memory_model == "unified" for g in rec.gpus):
        evidence.append("the GPU shares this memory (unified memory)")
    return Cause("memory-pressure", share, tuple(evidence), ACTIONS["memory-pressure"])


def low_tensor_cause(busy: list[View], length: float) -> Cause | None:
    busy_time = sum(v.dt for v in busy)
    if busy_time < LOW_TENSOR_BUSY_MIN * length:
        return None
    low = [v for v in busy if v.tensor is not None and v.tensor < TENSOR_LOW]
    low_time = sum(v.dt for v in low)
    if low_time < LOW_TENSOR_SHARE * busy_time:
        return None
    tensor = mean([v.tensor for v in low]) or 0.0
    sm = mean([v.eff for v in low]) or 0.0
    evidence = (
        f"tensor pipes {pct(tensor)} busy during {pct(low_time / busy_time)} of the GPU's "
        f"busy time, while SMs were {pct(sm)} active",
        "the math runs on the CUDA cores (fp32 without TF32, or operations without a "
        "tensor-core kernel)",
    )
    return Cause(
        "low-tensor-activity",
        low_time / length,
        evidence,
        ACTIONS["low-tensor-activity"],
        lost=False,
    )
