"""Turn one worker document into figures compared with the baseline and the reference.

Shared by the daemon's scheduler, ``sparkdiag probe`` and ``sparkdiag check``: one place decides
which runs are healthy enough to teach a baseline, and how efficiency is computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkdiag.baseline.learning import Held, PeerValues, below_peers, below_reference
from sparkdiag.baseline.model import METHOD, Baseline, BaselineKey, BaselineStoreError
from sparkdiag.baseline.reference import Reference, lookup
from sparkdiag.baseline.store import BaselineStore
from sparkdiag.probe.document import WorkerDocument
from sparkdiag.sources.nvml.gpu import UNHEALTHY_REASONS, reasons_mask

# Clock event reasons that make a run unfit to learn a baseline from.
UNHEALTHY_MASK = reasons_mask(UNHEALTHY_REASONS)


@dataclass(frozen=True)
class GemmFigure:
    """One kernel's result: throughput (TFLOPS, or TOPS for integer dtypes) and comparisons.

    delivered: total time of the back-to-back iterations, gaps included: what efficiency,
        baselines and alerts use (``sparkdiag_gemm_tflops``)
    peak: from the median iteration, comparable with mamf-finder (``sparkdiag_gemm_peak_tflops``)
    counts_toward_baseline: the run may teach the baseline (whether or not this one was asked to
        record): it was measured, no heat, hardware slowdown or power-brake reason was active
        during the cycle, the worker saw no other compute process on the GPU
        (``doc.busy.other_pids``), and it was not held out (baseline.learning: a compute shape
        below MIN_REFERENCE_FRACTION of the published MAMF, or, while the baseline is learned,
        far below its peers and the reference). It says nothing of the figure against its
        baseline. Named ``healthy`` before, which read as the kernel's health.

        Contention: before, this flag said nothing of it, and a figure at half its baseline
        beside another process counted. Found in a review: a baseline is the median of the first
        counted runs, then frozen (baseline.store), so a probe that measures a shared GPU
        (``probe.when always``, the container probe) could freeze what the GPU delivers beside a
        job (0.40-0.71 of idle, docs/probe.md; a run at 0.62 of idle passed the reference floor)
        and judge every later slow run against it. Such a run is still compared and reported;
        it only does not teach. ``other_pids`` holds what the worker read from NVML's compute
        (and MPS) process lists, less its own and the excluded pids: a display server holds a
        graphics context, which NVML lists apart and the worker never reads, so a GPU that
        drives a desktop still learns its baselines.
    """

    dtype: str
    shape: str
    kind: str  # compute, llm, decode
    beta: int
    status: str  # ok, unsupported, error
    reason: str | None
    delivered: float | None
    peak: float | None
    baseline: Baseline | None
    reference: Reference | None
    counts_toward_baseline: bool
    # Learning (baseline/learning.py): ``learning`` while the baseline is not yet frozen nor
    # pinned (known only when the cycle was recorded); ``held`` when this run was kept out of it.
    learning: bool = False
    held: Held | None = None

    @property
    def efficiency(self) -> float | None:
        """Delivered throughput over the baseline (1.0 = as healthy)."""
        if self.delivered is None or self.baseline is None:
            return None
        return self.delivered / self.baseline.tflops

    @property
    def reference_efficiency(self) -> float | None:
        """Delivered throughput over the published reference: the compute cube with beta=0
        only, as the reference floor (learning.mamf_floor) takes it; a beta=1 run (C += A @ B,
        which also reads and writes C) was set against the beta=0 MAMF (found in a review)."""
        if self.delivered is None or self.reference is None or self.kind != "compute":
            return None
        if self.beta != 0:
            return None
        return self.delivered / self.reference.tflops


def conditions_unhealthy(doc: WorkerDocument) -> bool:
    seen = doc.conditions.clock_event_reasons_seen
    return bool(seen is not None and seen & UNHEALTHY_MASK)


def baseline_dtype(dtype: str, beta: int) -> str:
    """Baselines of the accumulate (beta=1) runs are kept apart from the plain ones."""
    return dtype if beta == 0 else f"{dtype}:beta{beta}"


def store_key(
    doc: WorkerDocument, uuid: str, dtype: str, shape: str, context: str, method: str
) -> BaselineKey:
    """The baseline store's key of a figure of ``doc``: the GPU, the store's dtype and the
    shape, the context, the probe software that measured it (driver, torch, CUDA), the method."""
    return BaselineKey(uuid, dtype, shape, context, *doc.software.identity(), method)


def evaluate(
    doc: WorkerDocument,
    uuid: str,
    gpu_name: str,
    context: str,
    store: BaselineStore | None,
    record: bool = True,
    peers: PeerValues | None = None,
) -> list[GemmFigure]:
    """Every result of ``doc`` with its baseline and reference; records ok runs when asked.

    ``peers``: the healthy figures of this GPU's peers in the daemon, per (dtype, shape, beta);
    while a baseline is learned, a run far below them and the reference is held out of it
    (:mod:`sparkdiag.baseline.learning`)."""
    hot = conditions_unhealthy(doc)
    # another compute process seen on the GPU by the worker: its figures are compared, never
    # learned (GemmFigure.counts_toward_baseline says why; found in a review)
    shared = bool(doc.busy.other_pids)
    figures: list[GemmFigure] = []
    for result in doc.results:
        dtype, kind, beta, tflops = result.dtype, result.kind, result.beta, result.delivered
        reference = lookup(gpu_name, dtype) if gpu_name else None
        counts = tflops is not None and not hot and not shared
        held = None
        if counts and tflops is not None:
            held = below_reference(tflops, kind, beta, reference)
            counts = held is None
        learning = False
        baseline: Baseline | None = None
        if store is not None and uuid and tflops is not None:
            key = store_key(doc, uuid, baseline_dtype(dtype, beta), result.shape, context, METHOD)
            if record:
                conditions = doc.conditions.as_dict()
                if counts and peers is not None and store.learning(store.get(key)):
                    held = below_peers(
                        tflops, kind, beta, reference, peers.get((dtype, result.shape, beta), ())
                    )
                    counts = held is None
                if held is not None:
                    conditions["held"] = held.as_dict()
                baseline = store.record_run(key, tflops, counts, conditions=conditions)
                learning = store.learning(baseline)
            else:
                baseline = store.get(key)
        figures.append(
            GemmFigure(
                dtype=dtype,
                shape=result.shape,
                kind=kind,
                beta=beta,
                status=result.status,
                reason=result.reason,
                delivered=tflops,
                peak=result.peak,
                baseline=baseline,
                reference=reference,
                counts_toward_baseline=counts,
                learning=learning,
                held=held,
            )
        )
    return figures


# Ratios are kept in the baseline store beside the figures, under their own "dtype", and with
# the method they are measured by: the median iteration (worker.decode_ratios), so ratios learned
# from delivered figures before 2026-12-01 are never compared with them.
RATIO_PREFIX = "ratio:"
RATIO_METHOD = "median"


@dataclass(frozen=True)
class RatioFigure:
    """int4 over a 16-bit dtype (``versus``) at the decode shape, from one cycle.

    value: int4's throughput over the other's from their median iterations, measured in the
        same cycle (the hot suite times them in interleaved rounds): contention leaves the median
        of a decode kernel alone, the heat that collapses 4-bit GEMMs lowers int4's
    baseline: the same ratio as learned on a cool GPU (the regular probe's cycles)
    """

    versus: str
    shape: str
    value: float
    baseline: Baseline | None

    @property
    def efficiency(self) -> float | None:
        """The ratio over its cool baseline (1.0: int4 holds up as when cool)."""
        return None if self.baseline is None else self.value / self.baseline.tflops


def evaluate_ratios(
    doc: WorkerDocument,
    uuid: str,
    context: str,
    store: BaselineStore | None,
    record: bool,
    cool: bool,
) -> list[RatioFigure]:
    """The document's int4 ratios with their cool baselines; with ``record``, a cycle that ran
    ``cool`` (no unhealthy reason, memory below the hot threshold) teaches them."""
    int4 = next((r for r in doc.results if r.dtype == "int4" and r.kind == "decode"), None)
    if int4 is None:
        return []
    figures = []
    for name, value in sorted(doc.ratios.items()):
        numerator, _, versus = name.partition("/")
        if numerator != "int4" or not versus:
            continue
        baseline: Baseline | None = None
        if store is not None and uuid:
            key = store_key(doc, uuid, RATIO_PREFIX + name, int4.shape, context, RATIO_METHOD)
            if record:
                healthy = cool and not conditions_unhealthy(doc)
                baseline = store.record_run(key, value, healthy)
            else:
                baseline = store.get(key)
        figures.append(RatioFigure(versus, int4.shape, value, baseline))
    return figures


@dataclass(frozen=True)
class CycleFigures:
    """One cycle's figures and int4 ratios against their baselines; ``not_recorded``: why the
    cycle was not recorded though asked to be (None when it was, or was not asked)."""

    figures: list[GemmFigure]
    ratios: list[RatioFigure] = field(default_factory=list)
    not_recorded: BaselineStoreError | None = None


def evaluate_cycle(
    doc: WorkerDocument,
    uuid: str,
    gpu_name: str,
    context: str,
    store: BaselineStore | None,
    record: bool,
    peers: PeerValues | None = None,
    cool: bool | None = None,
) -> CycleFigures:
    """The figures of one cycle (and with ``cool`` given, its int4 ratios, taught only by a cool
    cycle), recorded whole when ``record``: one transaction, so that a store that fails to take
    them (full, locked past its timeout, read-only, damaged) keeps nothing of the cycle. The
    measurement is never lost: the figures are then compared with what the store still reads,
    and with nothing when it cannot be read either. ``sparkdiag probe`` and the daemon's
    schedulers share it."""
    failed: BaselineStoreError | None = None
    if store is not None and record:
        try:
            with store.cycle():
                figures = evaluate(doc, uuid, gpu_name, context, store, True, peers)
                ratios = _ratios(doc, uuid, context, store, True, cool)
            return CycleFigures(figures, ratios)
        except BaselineStoreError as exc:
            failed = exc
    try:
        figures = evaluate(doc, uuid, gpu_name, context, store, record=False)
        ratios = _ratios(doc, uuid, context, store, False, cool)
    except BaselineStoreError:
        figures = evaluate(doc, uuid, gpu_name, context, None, record=False)
        ratios = _ratios(doc, uuid, context, None, False, cool)
    return CycleFigures(figures, ratios, failed)


def _ratios(
    doc: WorkerDocument,
    uuid: str,
    context: str,
    store: BaselineStore | None,
    record: bool,
    cool: bool | None,
) -> list[RatioFigure]:
    return [] if cool is None else evaluate_ratios(doc, uuid, context, store, record, cool)
