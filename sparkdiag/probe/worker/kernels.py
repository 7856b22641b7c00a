"""A kernel through its life (KernelRun: set up and checked once against a float64 reference,
warmed up, timed in batches), and a group of kernels timed together in interleaved rounds."""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
from collections.abc import Iterator, Sequence
from typing import Any

from sparkdiag.probe.worker.contract import DTYPES, PEAK_BATCH_ITERS, shape_label, shape_problem
from sparkdiag.probe.worker.dtypes import (
    DeviceInfo,
    KernelSpec,
    Prepared,
    classify_exception,
    classify_kernel_exception,
    gate,
    prepare,
)
from sparkdiag.probe.worker.log import log
from sparkdiag.probe.worker.nvml import BusyState
from sparkdiag.probe.worker.plan import Budget
from sparkdiag.probe.worker.timing import (
    Batch,
    LaunchModel,
    choose_iters,
    figures,
    min_batch_ms,
    rotated,
    split_rounds,
    time_batch,
    time_graph,
)

MAX_ROTATION_BYTES = 2 * 1024**3
REF_ROWS = 64
MAX_WARMUP_ITERS = 500


def within_bound(error: float | None, bound: float) -> bool:
    """True when the error is a finite number no larger than the bound (NaN fails)."""
    return error is not None and math.isfinite(error) and error <= bound


def max_row_relative_error(torch: Any, out: Any, ref: Any) -> float:
    """Largest per-row ||out_i - ref_i|| / ||ref_i|| in float64; inf when non-finite."""
    out = out.to(torch.float64)
    ref = ref.to(torch.float64)
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    if not bool(torch.isfinite(out).all()):
        return math.inf
    diff = torch.linalg.vector_norm(out - ref, dim=-1)
    scale = torch.linalg.vector_norm(ref, dim=-1).clamp_min(1e-30)
    value = float((diff / scale).max())
    return value if math.isfinite(value) else math.inf


def rotation_sets(set_bytes: int, l2_bytes: int) -> int:
    """Buffer sets to rotate so that together they are at least twice the L2."""
    if set_bytes <= 0:
        return 2
    n = max(2, math.ceil(2 * l2_bytes / set_bytes))
    return max(1, min(n, 64, MAX_ROTATION_BYTES // set_bytes))


def _rows(torch: Any, m: int, device: str) -> Any:
    count = min(m, REF_ROWS)
    idx = torch.linspace(0, m - 1, count).round().long().unique()
    return idx.to(device)


def _result(spec: KernelSpec, m: int, status: str, reason: str | None) -> dict[str, Any]:
    """A kernel's entry in the document; the figures stay None unless it was timed.

    delivered: TFLOPS (TOPS for integer dtypes) over the timed batch's total time, gaps included
    peak: TFLOPS (TOPS) from the median iteration time
    total_ms: the timed batches' total elapsed time; gaps_ms: the part of it between iterations
    queued_ahead: every timed batch was enqueued before the GPU began it (CUDA), else None
    batches: how many back-to-back batches the timed iterations ran in (rounds)
    timing: "events" (per-iteration CUDA events; perf_counter on CPU) or "graph" (delivered
        from CUDA graph replays, peak and the median from a short event-timed batch beside
        each; gaps_ms and queued_ahead then None)
    """
    return {
        "dtype": spec.dtype,
        "shape": shape_label(m, spec.n, spec.k),
        "kind": spec.kind,
        "beta": spec.beta,
        "status": status,
        "reason": reason,
        "delivered": None,
        "peak": None,
        "total_ms": None,
        "median_ms": None,
        "min_ms": None,
        "gaps_ms": None,
        "queued_ahead": None,
        "iters": 0,
        "batches": 0,
        "timing": None,
        "warmup": 0,
        "buffer_sets": 0,
        "max_rel_error": None,
        "error_bound": DTYPES[spec.dtype].error_bound,
    }


class BusyDuringRun(Exception):
    pass


def _check_busy(busy: BusyState, args: argparse.Namespace) -> None:
    why_busy = busy.check_during()
    if why_busy and args.probe_when == "idle":
        raise BusyDuringRun(why_busy)


class KernelRun:
    """One kernel through its life: set up and checked once, warmed up, timed in batches.

    Every batch's GPU time is charged to ``budget.busy``. ``summary()`` gives the kernel's
    document entry; ``release()`` drops its buffers.
    """

    def __init__(
        self, info: DeviceInfo, spec: KernelSpec, args: argparse.Namespace, budget: Budget
    ) -> None:
        self.info = info
        self.spec = spec
        self.args = args
        self.budget = budget
        self.table = DTYPES[spec.dtype]
        self.m = spec.m_candidates[0]
        self.result = _result(spec, self.m, "ok", None)
        self.prepared: Prepared | None = None
        self.sets: list[tuple[Any, ...]] = []
        self.launch = LaunchModel(args.launch_us, args.max_prequeue_ms)
        self.position = 0
        self.warm_ms: list[float] = []
        self.iter_ms: list[float] = []
        self.total_ms = 0.0
        self.batches = 0
        self.ahead: list[bool] = []
        self.timed = 0  # iterations in total_ms (the graph's, not the peak batch's)
        self.graphed = 0  # timed batches replayed as a CUDA graph
        # decode kernels on a GPU are timed as graph replays until one fails to capture
        self.graph = bool(getattr(args, "graphs", False)) and info.is_cuda and spec.kind == "decode"

    @property
    def ready(self) -> bool:
        return self.prepared is not None and self.result["status"] == "ok"

    @property
    def work(self) -> float:
        """Operations of one iteration: 2 M N K."""
        return 2.0 * self.m * self.spec.n * self.spec.k

    @contextlib.contextmanager
    def _precision(self) -> Iterator[None]:
        torch = self.info.torch
        needed = self.table.matmul_precision
        if needed is None:
            yield
            return
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(needed)
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(before)

    def _fail(self, status: str, reason: str | None) -> bool:
        self.result = _result(self.spec, self.m, status, reason)
        self.release()
        return False

    def setup(self) -> bool:
        """Gate, the first M the kernel accepts, a correctness check, rotation sets.

        Returns True when the kernel is ready to time; otherwise the result says why not.
        """
        info, spec, torch = self.info, self.spec, self.info.torch
        reason = gate(info, spec.dtype) or shape_problem(spec.dtype, spec.n, spec.k)
        if reason is not None:
            return self._fail("unsupported", reason)
        try:
            with self._precision():
                out: Any = None
                last_exc: BaseException | None = None
                for m in spec.m_candidates:
                    self.m = m
                    try:
                        self.prepared = prepare(info, spec, m)
                        self.sets = [self.prepared.make_set()]
                        out = self.prepared.fn(*self.sets[0])
                        if info.is_cuda:
                            torch.cuda.synchronize()
                        last_exc = None
                        break
                    except Exception as exc:
                        last_exc = exc
                        self.prepared, self.sets, out = None, [], None
                if last_exc is not None or self.prepared is None:
                    failure = last_exc or RuntimeError("no candidate M")
                    return self._fail(*classify_kernel_exception(spec.dtype, failure))
                self.result = _result(spec, self.m, "ok", None)
                rows = _rows(torch, self.m, info.device)
                err = max_row_relative_error(
                    torch, out[rows], self.prepared.reference(self.sets[0], rows)
                )
                self.prepared.release()
                del out
                bound = self.table.error_bound
                if not within_bound(err, bound):
                    self._fail(
                        "error",
                        f"wrong result: max row relative error {err:.3g} exceeds bound {bound:.3g}",
                    )
                    self.result["max_rel_error"] = err
                    return False
                self.result["max_rel_error"] = err
                if spec.kind == "decode" and info.is_cuda:
                    set_bytes = sum(t.numel() * t.element_size() for t in self.sets[0])
                    for _ in range(rotation_sets(set_bytes, info.l2_bytes) - 1):
                        self.sets.append(self.prepared.make_set())
                self.result["buffer_sets"] = len(self.sets)
                return True
        except Exception as exc:
            return self._fail(*classify_exception(exc))

    def _batch(self, count: int) -> Batch:
        assert self.prepared is not None
        with self._precision():
            batch = time_batch(
                self.info, self.prepared.fn, self.sets, count, self.position, self.launch
            )
        self.position = (self.position + count) % len(self.sets)
        self.budget.busy += batch.total_ms / 1e3
        return batch

    def warm_up(self, count: int, floor_ms: float) -> None:
        """``count`` iterations, then more until the warm-up lasted ``floor_ms`` (GPU only)."""
        spent = 0.0
        if count > 0:
            batch = self._batch(count)
            self.warm_ms += batch.iter_ms
            spent += batch.total_ms
        while self.info.is_cuda and spent < floor_ms and len(self.warm_ms) < MAX_WARMUP_ITERS:
            per = statistics.median(self.warm_ms) if self.warm_ms else 0.0
            more = 1 if per <= 0 else max(1, int((floor_ms - spent) / max(per, 1e-3)))
            more = min(more, MAX_WARMUP_ITERS - len(self.warm_ms))
            batch = self._batch(more)
            self.warm_ms += batch.iter_ms
            spent += batch.total_ms

    def measure(self, count: int) -> None:
        """One timed batch of ``count`` back-to-back iterations, added to the kernel's figures:
        a CUDA graph replay and a short event-timed batch for the median (decode kernels on a
        GPU), else one event-timed batch."""
        if self.graph and count > 0:
            graphed = self._graph_batch(count)
            if graphed is not None:
                total, iters = graphed
                peak = self._batch(min(count, PEAK_BATCH_ITERS))
                self.iter_ms += peak.iter_ms
                self.total_ms += total
                self.timed += iters
                self.batches += 1
                self.graphed += 1
                return
        batch = self._batch(count)
        self.iter_ms += batch.iter_ms
        self.total_ms += batch.total_ms
        self.timed += len(batch.iter_ms)
        self.batches += 1
        if batch.queued_ahead is not None:
            self.ahead.append(batch.queued_ahead)

    def _graph_batch(self, count: int) -> tuple[float, int] | None:
        """The graph replays' milliseconds and iterations, or None (and events from now on)
        when the kernel cannot be captured."""
        assert self.prepared is not None
        try:
            with self._precision():
                total, iters, spent = time_graph(
                    self.info,
                    self.prepared.fn,
                    self.sets,
                    count,
                    self.position,
                    min_batch_ms(self.args, self.info),
                )
        except Exception as exc:
            self.graph = False
            log(f"{self.spec.dtype} {self.spec.kind}: no CUDA graph ({exc}); timed with events")
            with contextlib.suppress(Exception):
                self.info.torch.cuda.synchronize()
            return None
        self.position = (self.position + count) % len(self.sets)
        self.budget.busy += spent / 1e3
        return total, iters

    def reset_timing(self) -> None:
        """Forget the warm-up and timed iterations (a soak measures the kernel again)."""
        self.warm_ms, self.iter_ms, self.ahead = [], [], []
        self.total_ms = 0.0
        self.batches = self.timed = self.graphed = 0

    def summary(self) -> dict[str, Any]:
        result = dict(self.result)
        if result["status"] != "ok" or not self.iter_ms:
            return result
        delivered, peak = figures(self.work, self.iter_ms, self.total_ms, self.timed)
        graphed = self.graphed > 0
        result.update(
            delivered=delivered / 1e12,
            peak=peak / 1e12,
            total_ms=self.total_ms,
            median_ms=statistics.median(self.iter_ms),
            min_ms=min(self.iter_ms),
            gaps_ms=None if graphed else self.total_ms - math.fsum(self.iter_ms),
            queued_ahead=all(self.ahead) if self.ahead and not graphed else None,
            iters=self.timed,
            batches=self.batches,
            timing="graph" if graphed else "events",
            warmup=len(self.warm_ms),
        )
        return result

    def release(self) -> None:
        self.sets.clear()
        if self.prepared is not None:
            self.prepared.release()
        self.prepared = None


def time_runs(
    runs: Sequence[KernelRun],
    live: list[int],
    args: argparse.Namespace,
    budget: Budget,
    rounds: int,
    plans: dict[int, list[int]] | None = None,
) -> dict[int, list[int]]:
    """Warm up every live run, then time them all in interleaved rounds.

    Without ``plans`` the iteration counts are shared out of ``budget`` once every warm-up is
    paid, and split into ``rounds`` batches; each round runs the kernels in a rotated order, so
    that no kernel always follows the same one. A run that fails is dropped from ``live``.
    Returns the plans used (per run, the iterations of each round), to repeat them.
    """
    for i in list(live):
        try:
            runs[i].warm_up(args.warmup, args.warmup_ms.get(runs[i].spec.kind, 0.0))
        except Exception as exc:
            runs[i]._fail(*classify_exception(exc))
            live.remove(i)
    if plans is None:
        shares = {i: budget.share(args.kind_weights.get(runs[i].spec.kind, 1.0)) for i in live}
        plans = {
            i: split_rounds(
                choose_iters(
                    args.iters,
                    runs[i].warm_ms,
                    shares[i],
                    0.0,
                    args.min_iters,
                    args.max_iters,
                    min_batch_ms(args, runs[i].info),
                    rounds,
                ),
                rounds,
            )
            for i in live
        }
    todo = {i: plan for i, plan in plans.items() if i in live}
    for r in range(max((len(plan) for plan in todo.values()), default=0)):
        for i in rotated(live, r):
            if i in todo and r < len(todo[i]):
                try:
                    runs[i].measure(todo[i][r])
                except Exception as exc:
                    runs[i]._fail(*classify_exception(exc))
                    live.remove(i)
                    del todo[i]
    return plans


def run_group(
    info: DeviceInfo,
    specs: Sequence[KernelSpec],
    args: argparse.Namespace,
    budget: Budget,
    busy: BusyState,
    rounds: int = 1,
) -> list[dict[str, Any]]:
    """Set up and check every kernel of the group, warm each up, then time them all
    (time_runs); the group's kernels are charged to ``budget`` and settled in it."""
    runs = [KernelRun(info, spec, args, budget) for spec in specs]
    settled: set[int] = set()

    def settle(i: int) -> None:
        if i not in settled:
            settled.add(i)
            budget.done(args.kind_weights.get(runs[i].spec.kind, 1.0))

    try:
        live: list[int] = []
        for i, run in enumerate(runs):
            spec = run.spec
            log(f"{spec.dtype} {spec.kind} {spec.m_candidates[0]}x{spec.n}x{spec.k}")
            if run.setup():
                live.append(i)
            else:
                settle(i)  # its share goes to the kernels that run
        if live:
            _check_busy(busy, args)
            time_runs(runs, live, args, budget, rounds)
            _check_busy(busy, args)
        return [run.summary() for run in runs]
    finally:
        for i, run in enumerate(runs):
            settle(i)
            run.release()
        if info.is_cuda:
            info.torch.cuda.empty_cache()


def run_kernel(
    info: DeviceInfo, spec: KernelSpec, args: argparse.Namespace, budget: Budget, busy: BusyState
) -> dict[str, Any]:
    """Set up, check, warm up and time one kernel in one back-to-back batch."""
    return run_group(info, [spec], args, budget, busy, rounds=1)[0]
