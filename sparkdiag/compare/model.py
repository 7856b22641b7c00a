"""The comparison's data: each side, each cycle, each kernel row, and building them from documents.

For every (dtype, shape, beta) both sides' figures are kept per round; the ratio is
median(container) / median(native), its spread the smallest and largest per-round ratio (round i
of the container against round i of native), and the gap ``1 - ratio`` (positive: the container is
slower). The software identity of each side (torch, CUDA, cuBLAS, driver, ...) comes from each
worker document, so a slower library can be told from a slower environment.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from sparkdiag.errors import Exit
from sparkdiag.probe.diagnosis import Failure, Role
from sparkdiag.probe.document import Software, WorkerDocument
from sparkdiag.probe.worker.contract import throughput_unit
from sparkdiag.sources.nvml.gpu import decode_reasons

SCHEMA = "sparkdiag-compare/1"
DEFAULT_MAX_GAP = 0.15
DEFAULT_ROUNDS = 3
DEFAULT_WARMUP_ROUNDS = 1

# Components of the worker's ``software`` block, in the order they are shown.
IDENTITY_KEYS = tuple(f.name for f in fields(Software))
# Libraries that by themselves can make the same kernel faster or slower.
LIBRARY_KEYS = ("torch", "cuda", "cublas")
# What names the GPU a side ran on.
GPU_KEYS = ("gpu_uuid", "gpu_name", "compute_capability")


BANDWIDTH = "bandwidth"  # the copy bandwidth row's dtype


@dataclass(frozen=True)
class Side:
    """One side as it ran: its command, software identity and the GPU conditions it saw.

    software: the worker's ``software`` block (torch, cuda, cublas, driver, python, gpu_name,
    compute_capability, gpu_uuid, device), from the first measured document; empty when none.
    conditions: ``max_gpu_temperature_celsius`` (highest over the measured rounds),
    ``mean_sm_clock_hertz`` (median of the rounds' means), ``clock_event_reasons`` (names of
    every NVML clock event reason seen); None where NVML did not say (CPU, no NVML).
    """

    role: Role
    command: tuple[str, ...]
    software: Mapping[str, Any]
    conditions: Mapping[str, Any]


@dataclass(frozen=True)
class Cycle:
    """One worker run: ``label`` is "warm-up 1" or "round 2/3"; figures by :attr:`Row.key`."""

    label: str
    warmup: bool
    round: int  # 1-based, counted separately for warm-up and measured rounds
    side: Role
    result: str  # the runner's: ok, timeout, error, unsupported, skipped_busy
    reason: str | None
    returncode: int | None
    wall_seconds: float
    figures: Mapping[str, float]


@dataclass(frozen=True)
class Difference:
    component: str
    native: Any
    container: Any


@dataclass(frozen=True)
class Row:
    """One kernel on both sides. Figures are TFLOPS (TOPS for int8/int4, GB/s for bandwidth).

    ``native`` and ``container`` hold one figure per measured round (None where that round
    did not measure it); the status is ``ok`` when every round measured it, else the first other
    status seen (``unsupported``, ``error``, ``absent``) with its reason.
    """

    dtype: str
    shape: str
    kind: str
    beta: int
    unit: str
    native: tuple[float | None, ...]
    container: tuple[float | None, ...]
    native_status: str
    container_status: str
    native_reason: str | None
    container_reason: str | None
    # how each side timed it over the rounds (graph, events), where the worker says
    native_timing: frozenset[str] = frozenset()
    container_timing: frozenset[str] = frozenset()

    @property
    def timed_apart(self) -> bool:
        """Whether the sides timed it differently: a CUDA graph on one and launches timed as
        they went on the other read as a gap of the container's CPU (found in a review)."""
        return bool(self.native_timing and self.container_timing) and (
            self.native_timing != self.container_timing
        )

    @property
    def key(self) -> str:
        return row_key(self.dtype, self.shape, self.beta)

    @property
    def native_median(self) -> float | None:
        return _median(self.native)

    @property
    def container_median(self) -> float | None:
        return _median(self.container)

    @property
    def ratio(self) -> float | None:
        """median(container) / median(native); None unless both sides measured it."""
        n, c = self.native_median, self.container_median
        if n is None or c is None or n <= 0:
            return None
        return c / n

    @property
    def round_ratios(self) -> tuple[float, ...]:
        return tuple(
            c / n
            for n, c in zip(self.native, self.container, strict=False)
            if n is not None and c is not None and n > 0
        )

    @property
    def ratio_min(self) -> float | None:
        return min(self.round_ratios) if self.round_ratios else None

    @property
    def ratio_max(self) -> float | None:
        return max(self.round_ratios) if self.round_ratios else None

    @property
    def gap(self) -> float | None:
        """1 - ratio: 0.2 means the container delivers 20 % less than native."""
        ratio = self.ratio
        return None if ratio is None else 1.0 - ratio

    def noisy(self, max_gap: float) -> bool:
        """True when the per-round ratios fall on both sides of the threshold."""
        low, high = self.ratio_min, self.ratio_max
        return low is not None and high is not None and low < 1.0 - max_gap < high

    def verdict(self, max_gap: float) -> str:
        """ok, slower (gap above max_gap), faster (container ahead by more), n/a."""
        gap = self.gap
        if gap is None:
            return "n/a"
        if gap > max_gap:
            return "slower"
        if gap < -max_gap:
            return "faster"
        return "ok"

    def note(self) -> str | None:
        """Why the row has no ratio, in one line."""
        if self.ratio is not None:
            return None
        if self.native_status == self.container_status == "unsupported":
            return f"unsupported on both sides: {self.native_reason or self.container_reason}"
        parts = []
        for role, status, reason in (
            ("native", self.native_status, self.native_reason),
            ("container", self.container_status, self.container_reason),
        ):
            if status != "ok":
                parts.append(f"{role} {status}" + (f": {reason}" if reason else ""))
        return "; ".join(parts) or None


@dataclass(frozen=True)
class Comparison:
    """The outcome of :func:`compare`; ``exit_code(max_gap)`` is the command's exit status."""

    native: Side
    container: Side
    rows: tuple[Row, ...]
    cycles: tuple[Cycle, ...]
    failures: tuple[Failure, ...]
    rounds: int
    warmup_rounds: int
    worker_args: tuple[str, ...]
    container_args: tuple[str, ...]
    interrupted: str | None = None  # the stop signal that cut it short, if one did

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    @property
    def measured_rows(self) -> tuple[Row, ...]:
        """The rows measured on both sides, which the verdict reads; none where kernels were
        asked for and none of them was measured on both sides: the copy bandwidth alone is no
        verdict on a GEMM comparison (a side that measured no kernel was judged on it, exit 1)."""
        both = tuple(r for r in self.rows if r.ratio is not None)
        kernels = [r for r in self.rows if r.dtype != BANDWIDTH]
        if kernels and not any(r.ratio is not None for r in kernels):
            return ()
        return both

    @property
    def worst_row(self) -> Row | None:
        rows = self.measured_rows
        return max(rows, key=lambda r: r.gap or 0.0) if rows else None

    @property
    def worst_gap(self) -> float | None:
        """The largest gap over every kernel measured on both sides (None when there is none)."""
        row = self.worst_row
        return None if row is None else row.gap

    @property
    def differences(self) -> tuple[Difference, ...]:
        """Software components whose value differs between the sides (both must be known)."""
        if not self.native.software or not self.container.software:
            return ()
        out = []
        for key in IDENTITY_KEYS:
            a, b = self.native.software.get(key), self.container.software.get(key)
            if a != b:
                out.append(Difference(key, a, b))
        return tuple(out)

    @property
    def library_differences(self) -> tuple[Difference, ...]:
        return tuple(d for d in self.differences if d.component in LIBRARY_KEYS)

    @property
    def other_gpu(self) -> tuple[Difference, ...]:
        """What says the sides ran on different GPUs (uuid, name, compute capability): their
        figures are not a comparison of environments, whatever the gap. It read OK at a gap
        within --max-gap, a container on another GPU model included (found in a review)."""
        return tuple(d for d in self.differences if d.component in GPU_KEYS)

    @property
    def failed_rows(self) -> tuple[Row, ...]:
        """Kernels that failed (status error) on a side in some round: a kernel that crashed in
        the container dropped out of the verdict, which read OK, or was judged from the rounds
        it survived (found in a review)."""
        return tuple(r for r in self.rows if "error" in (r.native_status, r.container_status))

    def timed_apart(self, max_gap: float) -> list[str]:
        """The rows past ``max_gap`` that the two sides timed differently (graph, events)."""
        return [r.key for r in self.measured_rows if (r.gap or 0.0) > max_gap and r.timed_apart]

    def verdict(self, max_gap: float) -> str:
        """failed, not-comparable (different GPUs), no-data, gap or ok."""
        if self.failures or self.failed_rows:
            return "failed"
        if self.other_gpu:
            return "not-comparable"
        gap = self.worst_gap
        if gap is None:
            return "no-data"
        return "gap" if gap > max_gap else "ok"

    def exit_code(self, max_gap: float) -> int:
        """The command's exit status (:class:`sparkdiag.errors.Exit`): OK when every measured gap
        is within ``max_gap``, ATTENTION when the worst exceeds it, FAILED when a side failed to
        run, a kernel failed on a side, the sides ran on different GPUs, or nothing was measured
        on both sides, INTERRUPTED when a stop signal cut it short
        (the pairs measured before are reported all the same)."""
        if self.interrupted:
            return Exit.INTERRUPTED
        verdict = self.verdict(max_gap)
        if verdict in ("failed", "no-data", "not-comparable"):
            return Exit.FAILED
        return Exit.ATTENTION if verdict == "gap" else Exit.OK


def row_key(dtype: str, shape: str, beta: int) -> str:
    """``bf16 8192x8192x8192``, with `` beta=1`` for the accumulate runs."""
    return f"{dtype} {shape}" + (f" beta={beta}" if beta else "")


def figures(doc: WorkerDocument | None) -> dict[str, float]:
    """Every measured figure of a document, by row key (bandwidth in GB/s)."""
    if doc is None:
        return {}
    out = {r.label: r.delivered for r in doc.results if r.delivered is not None}
    if doc.bandwidth is not None and doc.bandwidth.delivered is not None:
        out[row_key(BANDWIDTH, "copy", 0)] = doc.bandwidth.delivered / 1e9
    return out


@dataclass
class _Entry:
    dtype: str
    shape: str
    kind: str
    beta: int
    unit: str
    timing: str | None = None


def _entries(doc: WorkerDocument) -> dict[str, tuple[_Entry, str, str | None, float | None]]:
    """key -> (entry, status, reason, figure) for one document."""
    out: dict[str, tuple[_Entry, str, str | None, float | None]] = {}
    for r in doc.results:
        entry = _Entry(r.dtype, r.shape, r.kind, r.beta, throughput_unit(r.dtype), r.timing)
        figure = r.delivered if r.status == "ok" else None
        out[r.label] = (entry, r.status, r.reason, figure)
    bw = doc.bandwidth
    if bw is not None:
        entry = _Entry(BANDWIDTH, "copy", "bandwidth", 0, "GB/s")
        figure = bw.delivered / 1e9 if bw.delivered is not None else None
        out[row_key(BANDWIDTH, "copy", 0)] = (entry, bw.status, bw.reason, figure)
    return out


def build_rows(
    native_docs: Sequence[WorkerDocument], container_docs: Sequence[WorkerDocument]
) -> tuple[Row, ...]:
    native = [_entries(d) for d in native_docs]
    container = [_entries(d) for d in container_docs]
    order: dict[str, _Entry] = {}
    for per_round in (*native, *container):
        for key, (entry, *_rest) in per_round.items():
            order.setdefault(key, entry)

    def side(per_rounds: list[dict[str, Any]], key: str) -> tuple[list[float | None], str, Any]:
        values: list[float | None] = []
        status, reason = "ok", None
        for per_round in per_rounds:
            item = per_round.get(key)
            if item is None:
                values.append(None)
                if status == "ok":
                    status, reason = "absent", "not in this side's results"
                continue
            _entry, st, why, figure = item
            values.append(figure if st == "ok" else None)
            if st != "ok" and status == "ok":
                status, reason = st, why
        return values, status, reason

    def timings(per_rounds: list[dict[str, Any]], key: str) -> frozenset[str]:
        return frozenset(
            item[0].timing for r in per_rounds if (item := r.get(key)) and item[0].timing
        )

    rows = []
    for key, entry in order.items():
        n_values, n_status, n_reason = side(native, key)
        c_values, c_status, c_reason = side(container, key)
        rows.append(
            Row(
                dtype=entry.dtype,
                shape=entry.shape,
                kind=entry.kind,
                beta=entry.beta,
                unit=entry.unit,
                native=tuple(n_values),
                container=tuple(c_values),
                native_status=n_status,
                container_status=c_status,
                native_reason=n_reason,
                container_reason=c_reason,
                native_timing=timings(native, key),
                container_timing=timings(container, key),
            )
        )
    return tuple(rows)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def build_side(
    role: Role,
    command: tuple[str, ...],
    docs: Sequence[WorkerDocument],
    first: WorkerDocument | None,
) -> Side:
    """A side's identity from its first measured document (else its first document at all)."""
    source = docs[0] if docs else first
    software = source.software.as_dict() if source is not None else {}
    temps = [t for d in docs if (t := d.conditions.max_gpu_temperature_celsius) is not None]
    clocks = [c for d in docs if (c := d.conditions.mean_sm_clock_hertz) is not None]
    masks = [m for d in docs if (m := d.conditions.clock_event_reasons_seen) is not None]
    others = {p for d in docs for p in d.busy.other_pids}
    mask = None
    if masks:
        mask = 0
        for m in masks:
            mask |= m
    return Side(
        role=role,
        command=command,
        software=software,
        conditions={
            "max_gpu_temperature_celsius": max(temps) if temps else None,
            "mean_sm_clock_hertz": statistics.median(clocks) if clocks else None,
            "clock_event_reasons": None if mask is None else decode_reasons(mask),
            "other_pids": sorted(others),
        },
    )
