"""Timing: one batch of back-to-back iterations (CUDA events, or perf_counter on CPU), a CUDA
graph replay, the prequeue hold (LaunchModel), the spin-up, and the figures and iteration counts
taken from them (see the package's docstring: "Delivered and peak", "Spread")."""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sparkdiag.probe.worker.contract import MAX_ITERS, MIN_ITERS
from sparkdiag.probe.worker.dtypes import DeviceInfo

# A decode batch with a floor is captured as this fraction of its iterations and replayed until
# it lasts the floor times the margin (see time_graph).
GRAPH_CHUNKS = 8
GRAPH_FLOOR_MARGIN = 1.1
LEAD_FLOOR_MS = 0.2
LAUNCH_PROBE_ITERS = 16  # iterations over which the CPU's enqueue time is measured


def choose_iters(
    fixed: int | None,
    warm_ms: Sequence[float],
    share_seconds: float,
    spent_seconds: float,
    min_iters: int = MIN_ITERS,
    max_iters: int = MAX_ITERS,
    min_batch_ms: float = 0.0,
    rounds: int = 1,
) -> int:
    """Timed iterations for one kernel: what fits in its share of the budget (at the warm-up's
    median iteration), and at least enough for each of ``rounds`` batches to last
    ``min_batch_ms`` at its fastest (both within the bounds). The warm-up runs while the
    clocks still rise: its median read up to 19 % slower than the timed iterations (fp8 at the
    LLM shape on a lent H100, a 25.3 ms batch planned for 30), so the floor is planned from
    the fastest warm-up iteration."""
    if fixed is not None:
        return fixed
    tail = list(warm_ms[1:]) or list(warm_ms)
    if not tail:
        return min_iters
    per_iter = statistics.median(tail) / 1e3
    if per_iter <= 0:
        return max_iters
    n = int((share_seconds - spent_seconds) / per_iter)
    fastest = min((t for t in tail if t > 0), default=per_iter * 1e3) / 1e3  # 0 ms: no reading
    if min_batch_ms > 0:
        n = max(n, max(1, rounds) * math.ceil(min_batch_ms / 1e3 / fastest))
    return max(min_iters, min(max_iters, n))


def min_batch_ms(args: argparse.Namespace, info: DeviceInfo) -> float:
    """The batch floor in effect: ``--min-batch-ms`` on a GPU, none on CPU (no time slices)."""
    return float(args.min_batch_ms) if info.is_cuda else 0.0


def rotated(items: Sequence[int], shift: int) -> list[int]:
    """``items`` rotated left by ``shift`` (the order of one interleaved round)."""
    if not items:
        return []
    shift %= len(items)
    return list(items[shift:]) + list(items[:shift])


def split_rounds(count: int, rounds: int) -> list[int]:
    """``count`` iterations over ``rounds`` rounds, as evenly as possible, none empty."""
    rounds = max(1, min(rounds, count))
    base, extra = divmod(count, rounds)
    return [base + (1 if r < extra else 0) for r in range(rounds)]


def spin_up(info: DeviceInfo, milliseconds: float) -> float:
    """Run untimed bf16 matmuls for about ``milliseconds`` of GPU time; return the seconds spent.

    An idle GPU sits at a low clock; the first kernels of a cycle would otherwise be timed while
    it ramps up, which spreads the figures from one cycle to the next.
    """
    torch = info.torch
    a = torch.randn(4096, 4096, device=info.device, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=info.device, dtype=torch.bfloat16)
    spent = 0.0
    batch = 8
    while spent < milliseconds:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            torch.mm(a, b)
        end.record()
        torch.cuda.synchronize()
        spent += float(start.elapsed_time(end))
        batch = min(batch * 2, 256)
    del a, b
    return spent / 1e3


@dataclass
class Batch:
    """One batch of back-to-back iterations of one kernel.

    iter_ms: per-iteration milliseconds (CUDA events around each iteration; perf_counter on CPU)
    total_ms: from just before the first iteration to just after the last, gaps included
    queued_ahead: CUDA only: the CPU had enqueued the whole batch before the GPU reached its
        first iteration, so no gap in it is the CPU's launch overhead; None when unknown
    """

    iter_ms: list[float]
    total_ms: float
    queued_ahead: bool | None = None

    @property
    def gaps_ms(self) -> float:
        return self.total_ms - math.fsum(self.iter_ms)


@dataclass
class LaunchModel:
    """How long the GPU is held before a batch so that the CPU can enqueue all of it first.

    A sleep kernel holds the stream while the CPU enqueues the batch; then the iterations run
    back to back and the total time measures the GPU, not Python's launch overhead. For no
    iteration to wait on the CPU the sleep must last count * (cpu - gpu), cpu being the CPU
    time to enqueue one iteration (two events and the kernel) and gpu the kernel's own time:
    cpu is measured on the first iterations of every batch (``launch_us`` until then), gpu is
    the previous batch's median. ``margin`` covers the CPU's jitter; ``max_lead_ms`` caps the
    sleep (``queued_ahead`` in the result says whether it was enough).
    """

    launch_us: float
    max_lead_ms: float
    gpu_us: float = 0.0
    margin: float = 1.5

    def lead_ms(self, count: int) -> float:
        per_iteration_us = max(0.0, self.launch_us * self.margin - self.gpu_us)
        return min(self.max_lead_ms, count * per_iteration_us / 1e3 + LEAD_FLOOR_MS)

    def observe(self, launch_us: float | None, gpu_us: float | None) -> None:
        if launch_us is not None and launch_us > 0:
            self.launch_us = launch_us
        if gpu_us is not None and gpu_us > 0:
            self.gpu_us = gpu_us


def sleep_cycles(milliseconds: float, clock_hz: float) -> int:
    """Cycles for torch.cuda._sleep to hold the GPU at least ``milliseconds`` at ``clock_hz``.

    The sleep counts SM cycles; at a lower clock than ``clock_hz`` it lasts longer, never
    shorter, so ``clock_hz`` should be the highest clock the GPU may run at.
    """
    return max(0, int(milliseconds * 1e-3 * clock_hz))


def time_batch(
    info: DeviceInfo,
    fn: Callable[..., Any],
    sets: Sequence[tuple[Any, ...]],
    count: int,
    start: int = 0,
    launch: LaunchModel | None = None,
) -> Batch:
    """Run ``count`` iterations back to back, rotating through ``sets`` from ``start``.

    On CPU every iteration is timed with perf_counter and the total encloses them all. On a GPU
    CUDA events are recorded around every iteration; the total runs from the first iteration's
    start event to the last one's end event, so it counts every gap between iterations (time
    slices another process took, for one). With ``launch`` the GPU is first held by a sleep
    kernel while the CPU enqueues the batch (see LaunchModel). The garbage collector is paused
    while the batch is enqueued.
    """
    torch = info.torch
    if count <= 0:
        return Batch([], 0.0, None)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        if not info.is_cuda:
            out = []
            first = time.perf_counter()
            for i in range(count):
                args = sets[(start + i) % len(sets)]
                t0 = time.perf_counter()
                fn(*args)
                out.append((time.perf_counter() - t0) * 1e3)
            total = (time.perf_counter() - first) * 1e3
            return Batch(out, total, None)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        held: Any = None
        if launch is not None and launch.max_lead_ms > 0 and hasattr(torch.cuda, "_sleep"):
            held = torch.cuda.Event(enable_timing=True)
            held.record()
            torch.cuda._sleep(sleep_cycles(launch.lead_ms(count), info.max_clock_hz))
        probe = min(count, LAUNCH_PROBE_ITERS)
        t0 = time.perf_counter()
        t_probe = t0
        for i in range(count):
            args = sets[(start + i) % len(sets)]
            starts[i].record()
            fn(*args)
            ends[i].record()
            if i + 1 == probe:
                t_probe = time.perf_counter()
        enqueued_ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
    finally:
        if gc_was_enabled:
            gc.enable()
    iter_ms = [float(starts[i].elapsed_time(ends[i])) for i in range(count)]
    total = float(starts[0].elapsed_time(ends[-1]))
    ahead: bool | None = None
    if held is not None:
        ahead = enqueued_ms <= float(held.elapsed_time(starts[0]))
    if launch is not None:
        launch.observe((t_probe - t0) * 1e6 / probe, statistics.median(iter_ms) * 1e3)
    return Batch(iter_ms, total, ahead)


def time_graph(
    info: DeviceInfo,
    fn: Callable[..., Any],
    sets: Sequence[tuple[Any, ...]],
    count: int,
    start: int,
    floor_ms: float = 0.0,
) -> tuple[float, int, float]:
    """One continuous run of CUDA graph replays of at least ``count`` iterations (rotating
    through ``sets`` from ``start``), between two events: the batch with no launch gap of the
    CPU's in it. Returns (its milliseconds, its iterations, GPU milliseconds spent in all).

    Without ``floor_ms`` the whole batch is captured and replayed once. With it the graph holds
    an eighth of the batch (at least one pass over ``sets``), one replay times it (after one
    untimed: the first ran slower), and the run replays it as often as ``count`` and 1.1 x the
    floor need: a replay runs faster than the event-timed iterations ``count`` was planned from
    (on the H200, decode batches planned for 30 ms took 26.4-29.9 ms as a single replay,
    2026-12-01).

    Capturing costs CPU time only; the replays run the iterations back to back whatever their
    launch cost, and a time slice another process takes still falls inside the total. Raises
    whatever torch raises when the kernel cannot be captured.
    """
    torch = info.torch
    chunk = count
    if floor_ms > 0:
        chunk = min(count, max(len(sets), math.ceil(count / GRAPH_CHUNKS)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(chunk):
            fn(*sets[(start + i) % len(sets)])
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    def replay(times: int) -> float:
        begin.record()
        for _ in range(times):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return float(begin.elapsed_time(end))

    try:
        reps = math.ceil(count / max(chunk, 1))
        spent = 0.0
        if floor_ms > 0 and chunk > 0:
            # the graph's first replay, untimed: it ran slower than the ones after it (on an
            # H100, tf32 decode planned from it fell 2.4 % short of the floor, 2026-12-05)
            spent += replay(1)
            once = replay(1)
            spent += once
            reps = max(reps, math.ceil(GRAPH_FLOOR_MARGIN * floor_ms / max(once, 1e-3)))
        total = replay(reps)
        return total, reps * chunk, spent + total
    finally:
        graph.reset()


def figures(
    work: float, iter_ms: Sequence[float], total_ms: float, count: int | None = None
) -> tuple[float, float]:
    """(delivered, peak) in work units per second.

    delivered: the work of all ``count`` iterations (default: those of ``iter_ms``) over their
    total elapsed time, gaps included (what a user of a shared or time-sliced GPU gets); peak:
    the work of one iteration over the median of ``iter_ms`` (comparable with mamf-finder).
    Both nan when there is no timing.
    """
    if not iter_ms or total_ms <= 0:
        return math.nan, math.nan
    median_ms = statistics.median(iter_ms)
    delivered = work * (len(iter_ms) if count is None else count) / (total_ms / 1e3)
    peak = work / (median_ms / 1e3) if median_ms > 0 else math.nan
    return delivered, peak
