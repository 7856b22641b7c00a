"""Why a job is slow: a pure function of a :class:`~sparkdiag.watch.model.Recording`.

The diagnosis looks at the *active window*: from the first tick at which the job's GPUs were at
least ``BUSY_START`` utilized to the last (start-up and tear-down, CUDA initialisation, loading
a model, are no fault of the loop); where no tick reaches ``BUSY_START``, from the first to the
last tick in which the job held the GPU, kept it at least ``LAUNCH_BUSY_MIN`` busy and ran a
thread hot (a launch-bound loop of tiny kernels). Inside it, each tick's idle GPU time is given
to at most one cause, in this order:

checkpoint stalls   the job wrote in a burst (at least ``WRITE_BURST_MIN`` bytes/s and
                    ``WRITE_BURST_FACTOR`` times its median rate) in this tick or the next or
                    previous one, or a burst was followed by this tick with the GPU stopped
                    (``CHECKPOINT_IDLE``) and tasks waiting on I/O (PSI ``CHECKPOINT_IO_STALL``)
                    for at most ``CHECKPOINT_TAIL_SECONDS``: a checkpoint fills the page cache
                    in a burst, then waits in fsync writing nothing more; and the ticks right
                    before a burst with the GPU stopped (``CHECKPOINT_IDLE``), for at most
                    ``CHECKPOINT_LEAD_SECONDS``: the state copied to the host and serialised
                    (torch.save keeps a core busy while the GPU waits), which is the
                    checkpoint's, not a launcher's
CPU-bound launcher  a thread of the processes that hold the GPU ran at ``HOT_THREAD`` of a core
                    or more (mean of the tick and its two neighbours, which smooths the CPU
                    clock's 10 ms granularity) while the GPU worked less than
                    ``LAUNCH_ACTIVITY_MAX`` (GPM SM
                    activity where the GPU has GPM, else utilization); the lost time is what
                    the GPU did not work
input-starved       the GPU was idle at least ``IDLE_MIN`` of the tick while the job's GPU
                    threads were not busy: it waited on a data loader or on I/O

and, independently of idle time:

throttled           a thermal, hardware-slowdown or power-brake clock reason while the GPU was
                    busy; the lost time is the clock's shortfall from the median unthrottled
                    busy clock (the power cap is reported as a note: it is the GPU at its limit)
memory pressure     memory PSI ("some" stall time of the host, or of the job's cgroup)
low tensor activity the GPU busy (activity >= 0.5) with tensor pipes under ``TENSOR_LOW``, for at
                    least ``LOW_TENSOR_SHARE`` of its busy time (GPM only)

A share is that cause's lost time over the window's length. Causes below their threshold
(``REPORT_MIN`` and the rules above) are not reported; a job with none is healthy. Shares of
different causes may overlap (a throttled tick can also be memory-stalled).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sparkdiag.sources.gpu import UNHEALTHY_REASONS, decode_reasons, reasons_mask
from sparkdiag.watch.model import GpuTick, Recording

BUSY_START = 0.20
LAUNCH_BUSY_MIN = 0.05  # a launch-bound loop that never reaches BUSY_START: see _window
IDLE_MIN = 0.10
HOT_THREAD = 0.85
LAUNCH_ACTIVITY_MAX = 0.60
WRITE_BURST_MIN = 50e6
WRITE_BURST_FACTOR = 4.0
CHECKPOINT_IDLE = 0.90
CHECKPOINT_IO_STALL = 0.02
CHECKPOINT_TAIL_SECONDS = 30.0
CHECKPOINT_LEAD_SECONDS = 30.0
TENSOR_LOW = 0.10
LOW_TENSOR_SHARE = 0.50
LOW_TENSOR_BUSY_MIN = 0.20
REPORT_MIN = 0.10  # input-starved, launcher, checkpoint
THROTTLE_MIN = 0.05  # of the busy ticks
MEMORY_MIN = 0.05
UNHEALTHY_MASK = reasons_mask(UNHEALTHY_REASONS)
POWER_CAP = reasons_mask({"sw_power_cap"})

ACTIONS: dict[str, tuple[str, ...]] = {
    "input-starved": (
        "give the data loader more workers (DataLoader num_workers), with pin_memory=True, "
        "persistent_workers=True and a larger prefetch_factor",
        "cache the dataset in memory or on local NVMe; decode and augment on the GPU (DALI, "
        "torchvision.transforms.v2 on CUDA tensors)",
        "overlap the host-to-device copy with compute (non_blocking=True from pinned memory)",
    ),
    "cpu-bound-launcher": (
        "launch fewer, larger kernels: a larger batch, torch.compile to fuse small operations",
        "capture the step in a CUDA graph (torch.compile(mode='reduce-overhead') or "
        "torch.cuda.graphs) so the CPU no longer launches each kernel",
        "remove host syncs from the loop (.item(), .cpu(), printing tensors every step)",
    ),
    "checkpoint-stalls": (
        "checkpoint asynchronously (torch.distributed.checkpoint.async_save, or copy the state "
        "to pinned CPU memory and write it from a background thread)",
        "checkpoint less often, and to fast local storage (NVMe) rather than a network share",
    ),
    "throttled": (
        "check cooling and airflow (fans, intakes, inlet temperature) and the power supply; "
        "run sparkdiag check and nvidia-smi -q -d PERFORMANCE,TEMPERATURE",
        "compare the temperatures with the slowdown threshold; on a DGX Spark give it free "
        "space around it",
    ),
    "memory-pressure": (
        "use less host memory (smaller batches or prefetch queues, fewer loader workers) and "
        "keep swap out of the training path",
        "on unified memory (DGX Spark) the page cache competes with CUDA: drop caches before "
        "the run (sync; echo 3 | sudo tee /proc/sys/vm/drop_caches)",
    ),
    "low-tensor-activity": (
        "put the math on tensor cores: torch.set_float32_matmul_precision('high') (TF32) or "
        "train in bf16 with torch.autocast",
        "keep matrix dimensions multiples of 8 (16 for fp8) so the fast kernels apply",
    ),
}
TITLES = {
    "input-starved": "input-starved",
    "cpu-bound-launcher": "CPU-bound launcher",
    "checkpoint-stalls": "checkpoint stalls",
    "throttled": "throttled",
    "memory-pressure": "memory pressure",
    "low-tensor-activity": "low tensor activity",
}


@dataclass(frozen=True)
class Cause:
    name: str  # a key of ACTIONS
    share: float  # lost time over the window, 0..1
    evidence: tuple[str, ...]
    actions: tuple[str, ...]


@dataclass(frozen=True)
class Diagnosis:
    """verdict: "healthy", the name of the largest cause, "gpu-unused" (the job's GPUs never
    became busy) or "no-gpu" (nothing was sampled on a GPU: only host causes are assessed)."""

    verdict: str
    causes: tuple[Cause, ...]
    window: tuple[float, float]  # seconds since the start of the recording
    gpus: tuple[int, ...]  # the GPUs diagnosed (those the job ran on)
    gpu_busy: float | None  # mean utilization over the window
    tensor_activity: float | None  # mean over the window's busy ticks (GPM)
    notes: tuple[str, ...]
    skipped: tuple[str, ...]
    healthy_actions: tuple[str, ...] = ()
    # when each tick-attributed cause struck: (start, end, cause), contiguous ticks merged
    spans: tuple[tuple[float, float, str], ...] = ()


@dataclass(frozen=True)
class _View:
    """One tick over the job's GPUs: means, the reasons of any, the hottest temperature."""

    t: float
    dt: float
    util: float
    eff: float  # GPM SM activity, else utilization
    tensor: float | None
    clock: float | None
    clock_max: float | None
    reasons: int
    temperature: float | None
    gpu_thread: float | None
    gpu_thread_name: str
    write: float | None
    read: float | None
    io_stall: float | None
    on_gpu: bool = False  # a process of the job is among the GPUs' compute processes


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _pct(x: float) -> str:
    return f"{x * 100:.0f} %"


def _rate(bps: float) -> str:
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} B/s"


def job_gpus(rec: Recording) -> tuple[int, ...]:
    """The GPUs the job ran on; where that is unknown, those that were busy at some tick, else
    every GPU."""
    on = sorted({g.index for t in rec.ticks for g in t.gpus if g.job_on_gpu})
    if on:
        return tuple(on)
    busy = sorted(
        {
            g.index
            for t in rec.ticks
            for g in t.gpus
            if g.utilization is not None and g.utilization >= BUSY_START
        }
    )
    return tuple(busy) if busy else tuple(g.index for g in rec.gpus)


def _views(rec: Recording, gpus: tuple[int, ...]) -> list[_View]:
    views = []
    for tick in rec.ticks:
        mine: list[GpuTick] = [g for g in tick.gpus if g.index in gpus]
        util = _mean([g.utilization for g in mine])
        if util is None:
            continue
        sm = _mean([g.sm_activity for g in mine])
        reasons = 0
        for g in mine:
            reasons |= g.reasons or 0
        temps = [g.temperature for g in mine if g.temperature is not None]
        views.append(
            _View(
                t=tick.t,
                dt=tick.dt,
                util=util,
                eff=util if sm is None else sm,
                tensor=_mean([g.tensor_activity for g in mine]),
                clock=_mean([g.sm_clock_hz for g in mine]),
                clock_max=_mean([g.sm_clock_max_hz for g in mine]),
                reasons=reasons,
                temperature=max(temps) if temps else None,
                gpu_thread=tick.job.gpu_thread,
                gpu_thread_name=tick.job.gpu_thread_name,
                write=tick.job.write_bps,
                read=tick.job.read_bps,
                io_stall=tick.host.io_stall,
                on_gpu=any(g.job_on_gpu for g in mine),
            )
        )
    return views


def _smoothed(values: list[float | None]) -> list[float | None]:
    """Each value as the mean of itself and its neighbours (None where it is None)."""
    out: list[float | None] = []
    for i, value in enumerate(values):
        out.append(None if value is None else _mean(values[max(0, i - 1) : i + 2]))
    return out


def _window(views: list[_View]) -> tuple[int, int] | None:
    """First and last index of the active window, or None when the job never used its GPUs.

    A launch-bound loop of tiny kernels may keep the GPU under ``BUSY_START`` all along (on the
    H200, 1-element additions at 89 000 kernels a second read 17-18 % utilization): where no
    tick reaches it, the window is the ticks in which the job held the GPU, kept it at least
    ``LAUNCH_BUSY_MIN`` busy and one of its threads was hot (``HOT_THREAD``)."""
    busy = [i for i, v in enumerate(views) if v.util >= BUSY_START]
    if busy:
        return busy[0], busy[-1]
    threads = _smoothed([v.gpu_thread for v in views])
    driving = [
        i
        for i, v in enumerate(views)
        if v.on_gpu and v.util >= LAUNCH_BUSY_MIN and (threads[i] or 0.0) >= HOT_THREAD
    ]
    return (driving[0], driving[-1]) if driving else None


def _write_bursts(views: list[_View]) -> set[int]:
    """Indexes of the ticks in which the job wrote in a burst."""
    writes = [v.write for v in views if v.write is not None]
    if not writes:
        return set()
    floor = max(WRITE_BURST_MIN, WRITE_BURST_FACTOR * statistics.median(writes))
    return {i for i, v in enumerate(views) if v.write is not None and v.write >= floor}


def _checkpoint_ticks(views: list[_View], bursts: set[int]) -> set[int]:
    """The burst ticks with their neighbours; before each burst the ticks in which the GPU was
    already stopped (``CHECKPOINT_IDLE``), for up to ``CHECKPOINT_LEAD_SECONDS``: the state
    copied to the host and serialised before it is written; and after each burst the ticks in
    which the GPU stays stopped while tasks wait on I/O (PSI; where PSI is missing, on the GPU
    alone), for up to ``CHECKPOINT_TAIL_SECONDS``: a checkpoint fills the page cache in a burst
    and then waits in fsync or close, writing nothing more."""
    marked = {j for i in bursts for j in (i - 1, i, i + 1) if 0 <= j < len(views)}
    for i in sorted(bursts):
        lead = 0.0
        for j in range(i - 1, -1, -1):
            v = views[j]
            if 1.0 - v.util < CHECKPOINT_IDLE or lead >= CHECKPOINT_LEAD_SECONDS:
                break
            marked.add(j)
            lead += v.dt
    for i in sorted(bursts):
        tail = 0.0
        for j in range(i + 1, len(views)):
            v = views[j]
            waiting = v.io_stall is None or v.io_stall >= CHECKPOINT_IO_STALL
            if 1.0 - v.util < CHECKPOINT_IDLE or not waiting or tail >= CHECKPOINT_TAIL_SECONDS:
                break
            marked.add(j)
            tail += v.dt
    return marked


def _runs(indexes: set[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for i in sorted(indexes):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _idle_gaps(rec: Recording, gpus: tuple[int, ...], start: float, end: float) -> list[float]:
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


def diagnose(rec: Recording) -> Diagnosis:
    """The diagnosis of a recording (see the module docstring for the rules)."""
    gpus = job_gpus(rec)
    views = _views(rec, gpus)
    skipped = list(rec.skipped)
    if not views:
        host = _memory_cause(rec, 0.0, rec.ticks[-1].t if rec.ticks else 0.0)
        return Diagnosis(
            verdict=host.name if host else "no-gpu",
            causes=(host,) if host else (),
            window=(0.0, rec.ticks[-1].t if rec.ticks else 0.0),
            gpus=(),
            gpu_busy=None,
            tensor_activity=None,
            notes=(),
            skipped=(
                *skipped,
                "no GPU was sampled: input, launcher, checkpoint, throttling and tensor "
                "causes are not assessed",
            ),
        )
    found = _window(views)
    if found is None:
        return Diagnosis(
            verdict="gpu-unused",
            causes=(),
            window=(views[0].t - views[0].dt, views[-1].t),
            gpus=gpus,
            gpu_busy=_mean([v.util for v in views]),
            tensor_activity=None,
            notes=(
                f"GPU {', '.join(map(str, gpus))} never reached {_pct(BUSY_START)} utilization: "
                "check that the job runs on this GPU (device placement, CUDA_VISIBLE_DEVICES)",
            ),
            skipped=tuple(skipped),
        )
    first, last = found
    win = views[first : last + 1]
    start, end = win[0].t - win[0].dt, win[-1].t
    length = max(end - start, 1e-9)
    bursts = _write_bursts(win)
    stalled = _checkpoint_ticks(win, bursts)
    loss = {"input-starved": 0.0, "cpu-bound-launcher": 0.0, "checkpoint-stalls": 0.0}
    launcher_ticks: list[_View] = []
    labels: list[tuple[float, float, str]] = []
    threads = _smoothed([v.gpu_thread for v in win])
    for i, v in enumerate(win):
        idle = max(0.0, 1.0 - v.util)
        hot = threads[i] is not None and (threads[i] or 0.0) >= HOT_THREAD
        label = None
        if i in stalled and idle >= IDLE_MIN:
            label = "checkpoint-stalls"
            loss[label] += v.dt * idle
        elif hot and v.eff < LAUNCH_ACTIVITY_MAX:
            label = "cpu-bound-launcher"
            loss[label] += v.dt * (1.0 - v.eff)
            launcher_ticks.append(v)
        elif idle >= IDLE_MIN:
            label = "input-starved"
            loss[label] += v.dt * idle
        if v.reasons & UNHEALTHY_MASK and v.util >= 0.5:
            labels.append((v.t - v.dt, v.t, "throttled"))
        if label:
            labels.append((v.t - v.dt, v.t, label))

    causes: list[Cause] = []
    share = {k: val / length for k, val in loss.items()}
    if share["input-starved"] >= REPORT_MIN:
        causes.append(_input_cause(rec, gpus, win, start, end, share["input-starved"]))
    if share["cpu-bound-launcher"] >= REPORT_MIN:
        causes.append(_launcher_cause(launcher_ticks, share["cpu-bound-launcher"]))
    if share["checkpoint-stalls"] >= REPORT_MIN:
        causes.append(_checkpoint_cause(win, bursts, stalled, share["checkpoint-stalls"]))
    notes: list[str] = []
    throttled = _throttle_cause(win, length, notes)
    if throttled:
        causes.append(throttled)
    memory = _memory_cause(rec, start, end)
    if memory:
        causes.append(memory)
    busy = [v for v in win if v.eff >= 0.5]
    tensor_values = [v.tensor for v in busy if v.tensor is not None]
    tensor_mean = sum(tensor_values) / len(tensor_values) if tensor_values else None
    if any(v.tensor is not None for v in win):
        low = _low_tensor_cause(busy, length)
        if low:
            causes.append(low)
    else:
        skipped.append(
            "tensor and SM activity: no GPM on this GPU (before Hopper, or not exposed); "
            "low tensor activity not assessed, the launcher rule uses utilization"
        )
    causes.sort(key=lambda c: -c.share)
    busy_share = _mean([v.util for v in win])
    healthy_actions: tuple[str, ...] = ()
    if not causes:
        healthy_actions = (
            f"nothing to fix: the GPU was busy {_pct(busy_share or 0)} of the time"
            + ("" if tensor_mean is None else f", tensor pipes {_pct(tensor_mean)}")
            + "; to go faster, scale the batch or the model, or compare with sparkdiag probe",
        )
    return Diagnosis(
        verdict=causes[0].name if causes else "healthy",
        causes=tuple(causes),
        window=(start, end),
        gpus=gpus,
        gpu_busy=busy_share,
        tensor_activity=tensor_mean,
        notes=tuple(notes),
        skipped=tuple(skipped),
        healthy_actions=healthy_actions,
        spans=_merge([span for span in labels if span[2] in {c.name for c in causes}]),
    )


def _merge(spans: list[tuple[float, float, str]]) -> tuple[tuple[float, float, str], ...]:
    merged: list[tuple[float, float, str]] = []
    for start, end, name in sorted(spans, key=lambda s: (s[2], s[0])):
        if merged and merged[-1][2] == name and start <= merged[-1][1] + 1e-6:
            merged[-1] = (merged[-1][0], end, name)
        else:
            merged.append((start, end, name))
    return tuple(sorted(merged))


def _input_cause(
    rec: Recording,
    gpus: tuple[int, ...],
    win: list[_View],
    start: float,
    end: float,
    share: float,
) -> Cause:
    idle = [v for v in win if 1.0 - v.util >= IDLE_MIN]
    evidence = [f"GPU idle {_pct(share)} of the time while the job's GPU threads waited"]
    gaps = _idle_gaps(rec, gpus, start, end)
    if gaps:
        evidence.append(
            f"{len(gaps)} idle gaps in the driver's samples, median {statistics.median(gaps):.2f} s"
        )
    threads = [v.gpu_thread for v in idle if v.gpu_thread is not None]
    if threads:
        evidence.append(f"busiest GPU thread meanwhile: {_pct(max(threads))} of a core")
    reads = [v.read for v in idle if v.read is not None]
    if reads:
        evidence.append(f"reads meanwhile: {_rate(statistics.median(reads))} (median)")
    return Cause("input-starved", share, tuple(evidence), ACTIONS["input-starved"])


def _launcher_cause(ticks: list[_View], share: float) -> Cause:
    names = [v.gpu_thread_name for v in ticks if v.gpu_thread_name]
    name = statistics.mode(names) if names else "?"
    cpu = statistics.median([v.gpu_thread or 0.0 for v in ticks])
    eff = statistics.median([v.eff for v in ticks])
    util = statistics.median([v.util for v in ticks])
    evidence = (
        f"thread {name!r} at {_pct(cpu)} of a core during {len(ticks)} ticks",
        f"meanwhile the GPU worked {_pct(eff)} of the time (utilization {_pct(util)})",
    )
    return Cause("cpu-bound-launcher", share, evidence, ACTIONS["cpu-bound-launcher"])


def _checkpoint_cause(win: list[_View], bursts: set[int], stalled: set[int], share: float) -> Cause:
    runs = _runs(bursts)
    peak = max((win[i].write or 0.0) for i in bursts)
    idle_ticks = [i for i in stalled if 1.0 - win[i].util >= IDLE_MIN]
    idle = _mean([1.0 - win[i].util for i in idle_ticks]) or 0.0
    evidence = [
        f"{len(runs)} write bursts, peak {_rate(peak)}, each with the GPU idle around it "
        f"({_pct(idle)} idle during {sum(win[i].dt for i in idle_ticks):.1f} s)",
        f"{_pct(share)} of the time lost while the job wrote and waited for its writes",
    ]
    io = _mean([win[i].io_stall for i in idle_ticks])
    if io:
        evidence.append(f"tasks stalled on I/O {_pct(io)} of that time (PSI)")
    if len(runs) >= 2:
        starts = [win[r[0]].t for r in runs]
        period = statistics.median(b - a for a, b in itertools.pairwise(starts))
        evidence.append(f"one every {period:.1f} s")
    return Cause("checkpoint-stalls", share, tuple(evidence), ACTIONS["checkpoint-stalls"])


def _throttle_cause(win: list[_View], length: float, notes: list[str]) -> Cause | None:
    busy = [v for v in win if v.util >= 0.5]
    if not busy:
        return None
    throttled = [v for v in busy if v.reasons & UNHEALTHY_MASK]
    capped = [v for v in busy if v.reasons & POWER_CAP and not v.reasons & UNHEALTHY_MASK]
    clean = [v.clock for v in busy if not v.reasons & UNHEALTHY_MASK and v.clock is not None]
    maxima = [v.clock_max for v in busy if v.clock_max is not None]
    reference = statistics.median(clean) if clean else (max(maxima) if maxima else None)
    if capped and len(capped) / len(busy) >= THROTTLE_MIN:
        clock = _mean([v.clock for v in capped])
        notes.append(
            f"power cap (sw_power_cap) active {_pct(len(capped) / len(busy))} of the busy time"
            + ("" if clock is None else f", SM clock {clock / 1e6:.0f} MHz")
            + ": the GPU at its power limit, not a fault"
        )
    if not throttled or len(throttled) / len(busy) < THROTTLE_MIN:
        return None
    lost = 0.0
    for v in throttled:
        if reference and v.clock is not None:
            lost += v.dt * max(0.0, 1.0 - v.clock / reference)
    share = lost / length
    names = sorted({n for v in throttled for n in decode_reasons(v.reasons & UNHEALTHY_MASK)})
    clock = _mean([v.clock for v in throttled])
    temps = [v.temperature for v in throttled if v.temperature is not None]
    evidence = [f"{', '.join(names)} active {_pct(len(throttled) / len(busy))} of the busy time"]
    if clock is not None and reference:
        evidence.append(
            f"SM clock {clock / 1e6:.0f} MHz then, against {reference / 1e6:.0f} MHz otherwise"
        )
    if temps:
        evidence.append(f"GPU up to {max(temps):.0f} °C")
    return Cause("throttled", share, tuple(evidence), ACTIONS["throttled"])


def _memory_cause(rec: Recording, start: float, end: float) -> Cause | None:
    ticks = [t for t in rec.ticks if start < t.t <= end + 1e-9]
    stalls = [(t.dt, t.host.memory_stall) for t in ticks if t.host.memory_stall is not None]
    if not stalls:
        return None
    total = sum(dt for dt, _ in stalls)
    share = sum(dt * s for dt, s in stalls) / total if total else 0.0
    if share < MEMORY_MIN:
        return None
    scope = "the job's cgroup" if rec.pressure_scope == "cgroup" else "the host"
    evidence = [f"tasks of {scope} stalled on memory {_pct(share)} of the time (PSI some)"]
    full = _mean([t.host.memory_full for t in ticks])
    if full:
        evidence.append(f"every task stalled {_pct(full)} of the time (PSI full)")
    swap = _mean([t.host.swap_bps for t in ticks])
    if swap:
        evidence.append(f"swapping {_rate(swap)} on average")
    available = [t.host.available_bytes for t in ticks if t.host.available_bytes is not None]
    if available:
        evidence.append(f"available memory down to {min(available) / 2**30:.1f} GiB")
    if any(g.memory_model == "unified" for g in rec.gpus):
        evidence.append("the GPU shares this memory (unified memory)")
    return Cause("memory-pressure", share, tuple(evidence), ACTIONS["memory-pressure"])


def _low_tensor_cause(busy: list[_View], length: float) -> Cause | None:
    busy_time = sum(v.dt for v in busy)
    if busy_time < LOW_TENSOR_BUSY_MIN * length:
        return None
    low = [v for v in busy if v.tensor is not None and v.tensor < TENSOR_LOW]
    low_time = sum(v.dt for v in low)
    if low_time < LOW_TENSOR_SHARE * busy_time:
        return None
    tensor = _mean([v.tensor for v in low]) or 0.0
    sm = _mean([v.eff for v in low]) or 0.0
    evidence = (
        f"tensor pipes {_pct(tensor)} busy during {_pct(low_time / busy_time)} of the GPU's "
        f"busy time, while SMs were {_pct(sm)} active",
        "the math runs on the CUDA cores (fp32 without TF32, or operations without a "
        "tensor-core kernel)",
    )
    return Cause("low-tensor-activity", low_time / length, evidence, ACTIONS["low-tensor-activity"])
