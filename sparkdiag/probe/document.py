"""The probe worker's JSON document, parsed once into frozen dataclasses.

The worker (``worker/``) prints one JSON document per cycle (schema ``contract.SCHEMA``); every
reader (the runner's classification, the daemon's scheduler, ``evaluate``, ``probe``, ``check``,
``compare``) reads these dataclasses, never the raw keys. Parsing never trusts the input: a
document comes from a subprocess that may be another version of the worker, a container image or
garbage, so a wrong-typed value becomes ``None`` (or the entry is dropped), and only a document
that is not the worker's at all raises :class:`DocumentError`.

The schema string and the progress prefix come from the worker module itself, whose top level
imports only the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from sparkdiag.jsonvalues import as_float, as_int, as_map, as_str
from sparkdiag.probe.worker.contract import PROGRESS_PREFIX, SCHEMA

__all__ = [
    "PROGRESS_PREFIX",
    "SCHEMA",
    "Bandwidth",
    "BusyRecord",
    "Conditions",
    "DocumentError",
    "KernelResult",
    "Progress",
    "Soak",
    "SoakWindow",
    "Software",
    "Transfer",
    "WorkerDocument",
    "find_document",
    "parse_document",
    "parse_progress",
]


class DocumentError(ValueError):
    """The input is not a worker document of this schema."""


@dataclass(frozen=True)
class Software:
    """What ran the worker: versions and the device. Every field may be None (unknown)."""

    torch: str | None = None
    cuda: str | None = None
    cublas: str | None = None
    driver: str | None = None
    python: str | None = None
    gpu_name: str | None = None
    compute_capability: str | None = None
    gpu_uuid: str | None = None
    device: str | None = None

    @classmethod
    def parse(cls, raw: Any) -> Software:
        block = as_map(raw)
        return cls(**{f.name: as_str(block.get(f.name)) for f in fields(cls)})

    def identity(self) -> tuple[str, str, str]:
        """(driver, torch, cuda), empty strings where unknown: what a baseline is learned under."""
        return (self.driver or "", self.torch or "", self.cuda or "")

    def as_dict(self) -> dict[str, str | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class KernelResult:
    """One kernel; throughput in TFLOPS (tera-operations per second for integer dtypes).

    delivered: the work of the timed back-to-back iterations over their total elapsed time,
        gaps included (what a user of a shared GPU gets; efficiency and baselines use it)
    peak: the work of one iteration over the median iteration time (comparable with mamf-finder)
    """

    dtype: str
    shape: str  # MxNxK
    kind: str  # compute, llm, decode
    beta: int  # 1: C += A @ B (kept apart from beta=0)
    status: str  # ok, unsupported, error
    reason: str | None
    delivered: float | None
    peak: float | None = None
    total_ms: float | None = None
    median_ms: float | None = None
    min_ms: float | None = None
    gaps_ms: float | None = None
    queued_ahead: bool | None = None
    iters: int = 0
    max_rel_error: float | None = None
    error_bound: float | None = None
    timing: str | None = None  # graph (CUDA graph replays) or events (launches timed as they go)

    @classmethod
    def parse(cls, raw: Any) -> KernelResult | None:
        if not isinstance(raw, Mapping):
            return None
        dtype, shape = as_str(raw.get("dtype")), as_str(raw.get("shape"))
        if not dtype or not shape:
            return None
        status = as_str(raw.get("status")) or "error"
        return cls(
            dtype=dtype,
            shape=shape,
            kind=as_str(raw.get("kind")) or "",
            beta=as_int(raw.get("beta")) or 0,
            status=status,
            reason=as_str(raw.get("reason")),
            delivered=_positive(raw.get("delivered")) if status == "ok" else None,
            peak=_positive(raw.get("peak")) if status == "ok" else None,
            total_ms=as_float(raw.get("total_ms")),
            median_ms=as_float(raw.get("median_ms")),
            min_ms=as_float(raw.get("min_ms")),
            gaps_ms=as_float(raw.get("gaps_ms")),
            queued_ahead=raw.get("queued_ahead")
            if isinstance(raw.get("queued_ahead"), bool)
            else None,
            iters=as_int(raw.get("iters")) or 0,
            max_rel_error=as_float(raw.get("max_rel_error")),
            error_bound=as_float(raw.get("error_bound")),
            timing=as_str(raw.get("timing")),
        )

    @property
    def label(self) -> str:
        """``bf16 8192x8192x8192``, with `` beta=1`` for the accumulate runs."""
        return f"{self.dtype} {self.shape}" + (f" beta={self.beta}" if self.beta else "")


def _positive(value: Any) -> float | None:
    number = as_float(value)
    return number if number is not None and number > 0 else None


@dataclass(frozen=True)
class Bandwidth:
    """Device memory copy, bytes read plus written per second: delivered (total time of the
    back-to-back copies) and peak (median copy)."""

    status: str
    reason: str | None
    delivered: float | None
    peak: float | None = None

    @classmethod
    def parse(cls, raw: Any) -> Bandwidth | None:
        if not isinstance(raw, Mapping):
            return None
        status = as_str(raw.get("status")) or "error"
        ok = status == "ok"
        delivered = _positive(raw.get("delivered")) if ok else None
        peak = _positive(raw.get("peak")) if ok else None
        return cls(status, as_str(raw.get("reason")), delivered, peak)


@dataclass(frozen=True)
class Transfer:
    """Host-device copies of one kind: ``delivered`` bytes per second over all the copies."""

    direction: str  # h2d, d2h
    memory: str  # pinned, pageable
    size_bytes: int
    copies: int
    status: str
    reason: str | None
    delivered: float | None

    @classmethod
    def parse(cls, raw: Any) -> Transfer | None:
        if not isinstance(raw, Mapping):
            return None
        direction, memory = as_str(raw.get("direction")), as_str(raw.get("memory"))
        size = as_int(raw.get("size_bytes"))
        if direction is None or memory is None or size is None or size <= 0:
            return None
        status = as_str(raw.get("status")) or "error"
        return cls(
            direction=direction,
            memory=memory,
            size_bytes=size,
            copies=as_int(raw.get("copies")) or 0,
            status=status,
            reason=as_str(raw.get("reason")),
            delivered=_positive(raw.get("delivered")) if status == "ok" else None,
        )

    @property
    def label(self) -> str:
        """``h2d pinned 64KiB``."""
        size = self.size_bytes
        shown = f"{size >> 20}MiB" if size >= 1 << 20 else f"{size >> 10}KiB"
        return f"{self.direction} {self.memory} {shown}"


@dataclass(frozen=True)
class Conditions:
    """What NVML showed while the kernels ran (None where the worker had no NVML)."""

    max_gpu_temperature_celsius: float | None = None
    max_memory_temperature_celsius: float | None = None
    clock_event_reasons_seen: int | None = None  # NVML bitmask, OR of every sample
    mean_sm_clock_hertz: float | None = None
    min_sm_clock_hertz: float | None = None
    mean_memory_clock_hertz: float | None = None
    mean_power_watts: float | None = None
    max_power_watts: float | None = None
    samples: int = 0

    @classmethod
    def parse(cls, raw: Any) -> Conditions:
        block = as_map(raw)
        values: dict[str, Any] = {
            f.name: as_float(block.get(f.name))
            for f in fields(cls)
            if f.name not in ("clock_event_reasons_seen", "samples")
        }
        return cls(
            **values,
            clock_event_reasons_seen=as_int(block.get("clock_event_reasons_seen")),
            samples=as_int(block.get("samples")) or 0,
        )

    def temperatures(self) -> dict[str, float]:
        """{"gpu": max °C, "memory": max °C}, the sensors that were read."""
        pairs = (
            ("gpu", self.max_gpu_temperature_celsius),
            ("memory", self.max_memory_temperature_celsius),
        )
        return {sensor: value for sensor, value in pairs if value is not None}

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class BusyRecord:
    """What the worker saw of other users of the GPU."""

    other_pids: tuple[int, ...] = ()
    utilization: float | None = None
    nvml: bool = False

    @classmethod
    def parse(cls, raw: Any) -> BusyRecord:
        block = as_map(raw)
        pids = block.get("other_pids")
        return cls(
            other_pids=tuple(p for p in pids if as_int(p) is not None)
            if isinstance(pids, list)
            else (),
            utilization=as_float(block.get("utilization")),
            nvml=block.get("nvml") is True,
        )


def _ratios(raw: Any) -> dict[str, float]:
    """{"int4/bf16": 1.6, ...}: the ratios that were measured (positive, finite)."""
    return {k: v for k, r in as_map(raw).items() if isinstance(k, str) and (v := _positive(r))}


@dataclass(frozen=True)
class SoakWindow:
    """One measurement window of a soak: the kernels, their int4 ratios and the conditions."""

    index: int
    phase: str  # cold (before the load), load
    elapsed_seconds: float
    results: tuple[KernelResult, ...]
    ratios: Mapping[str, float]
    conditions: Conditions
    load_conditions: Conditions | None
    load_delivered: float | None  # TFLOPS of the sustained load since the window before

    @classmethod
    def parse(cls, raw: Any) -> SoakWindow | None:
        if not isinstance(raw, Mapping):
            return None
        index, elapsed = as_int(raw.get("index")), as_float(raw.get("elapsed_seconds"))
        if index is None or elapsed is None:
            return None
        results = raw.get("results")
        load = raw.get("load_conditions")
        return cls(
            index=index,
            phase=as_str(raw.get("phase")) or "load",
            elapsed_seconds=elapsed,
            results=_results(results),
            ratios=_ratios(raw.get("ratios")),
            conditions=Conditions.parse(raw.get("conditions")),
            load_conditions=Conditions.parse(load) if isinstance(load, Mapping) else None,
            load_delivered=_positive(raw.get("load_delivered")),
        )


@dataclass(frozen=True)
class Soak:
    """A soak run: its windows, and why it stopped (completed, threshold, hw_thermal_slowdown,
    hw_slowdown, interrupted, error)."""

    windows: tuple[SoakWindow, ...]
    stopped: str | None
    reason: str | None
    elapsed_seconds: float | None
    thresholds: Mapping[str, float]

    @classmethod
    def parse(cls, raw: Any) -> Soak | None:
        if not isinstance(raw, Mapping):
            return None
        windows = raw.get("windows")
        parsed = [SoakWindow.parse(w) for w in windows] if isinstance(windows, list) else []
        return cls(
            windows=tuple(w for w in parsed if w is not None),
            stopped=as_str(raw.get("stopped")),
            reason=as_str(raw.get("reason")),
            elapsed_seconds=as_float(raw.get("elapsed_seconds")),
            thresholds=_ratios(raw.get("thresholds")),
        )


def _results(raw: Any) -> tuple[KernelResult, ...]:
    items = raw if isinstance(raw, list) else []
    return tuple(r for r in map(KernelResult.parse, items) if r is not None)


@dataclass(frozen=True)
class WorkerDocument:
    """One cycle of the worker. ``raw`` is the JSON object as printed (for ``--json`` output)."""

    status: str  # ok, error, unsupported, skipped_busy (the worker's own view)
    reason: str | None
    software: Software = field(default_factory=Software)
    suite: str | None = None  # default, hot, check, soak
    results: tuple[KernelResult, ...] = ()
    ratios: Mapping[str, float] = field(default_factory=dict)  # int4/bf16, int4/fp16 (decode)
    bandwidth: Bandwidth | None = None
    transfers: tuple[Transfer, ...] = ()
    soak: Soak | None = None
    conditions: Conditions = field(default_factory=Conditions)
    busy: BusyRecord = field(default_factory=BusyRecord)
    gpu_busy_seconds: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def measured(self) -> tuple[KernelResult, ...]:
        """The results that measured a figure."""
        return tuple(r for r in self.results if r.delivered is not None)

    def failed(self) -> tuple[str, ...]:
        """Labels of the kernels (and the copy) that failed: an error, not "unsupported"."""
        names = [r.label for r in self.results if r.status == "error"]
        if self.bandwidth is not None and self.bandwidth.status == "error":
            names.append("bandwidth")
        return tuple(names)

    def all_unsupported(self) -> bool:
        items = [r.status for r in self.results]
        if self.bandwidth is not None:
            items.append(self.bandwidth.status)
        return bool(items) and all(s == "unsupported" for s in items)

    def has_items(self) -> bool:
        """Something was measured: a kernel, the copy, or a soak's window."""
        soaked = self.soak is not None and bool(self.soak.windows)
        return bool(self.results) or self.bandwidth is not None or soaked


def parse_document(raw: Any) -> WorkerDocument:
    """A decoded JSON value as a worker document; DocumentError when it is not one."""
    if not isinstance(raw, Mapping):
        raise DocumentError("not a JSON object")
    if raw.get("schema") != SCHEMA:
        raise DocumentError(f"schema {str(raw.get('schema'))[:40]!r} is not {SCHEMA!r}")
    transfers = raw.get("transfers")
    return WorkerDocument(
        status=as_str(raw.get("status")) or "error",
        reason=as_str(raw.get("reason")),
        software=Software.parse(raw.get("software")),
        suite=as_str(raw.get("suite")),
        results=_results(raw.get("results")),
        ratios=_ratios(raw.get("ratios")),
        bandwidth=Bandwidth.parse(raw.get("bandwidth")),
        transfers=tuple(
            t for t in map(Transfer.parse, transfers if isinstance(transfers, list) else []) if t
        ),
        soak=Soak.parse(raw.get("soak")),
        conditions=Conditions.parse(raw.get("conditions")),
        busy=BusyRecord.parse(raw.get("busy")),
        gpu_busy_seconds=as_float(raw.get("gpu_busy_seconds")),
        started_at=as_float(raw.get("started_at")),
        finished_at=as_float(raw.get("finished_at")),
        raw=raw,
    )


def find_document(stdout: bytes) -> WorkerDocument | None:
    """The worker's document in its standard output, or None when there is none.

    Container images may print a banner on stdout before the interpreter starts (NGC images
    do); the worker prints its document last, on one line, so when the whole output is not the
    document the last line that parses as one is taken.
    """
    text = stdout.decode("utf-8", "replace").strip()
    if not text:
        return None
    for candidate in (text, *reversed(text.splitlines())):
        candidate = candidate.strip()
        if not candidate.startswith("{"):
            continue
        try:
            return parse_document(json.loads(candidate))
        except (ValueError, RecursionError):  # JSONDecodeError and DocumentError are ValueErrors
            continue
    return None


@dataclass(frozen=True)
class Progress:
    """One progress line: a kernel finished (``done`` of ``total``, ``result``), or a soak's
    measurement window ended (``window``)."""

    done: int = 0
    total: int = 0
    result: KernelResult | None = None
    window: SoakWindow | None = None


def parse_progress(line: str) -> Progress | None:
    """A worker's stderr line as progress, or None when it is not one."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        item = json.loads(line[len(PROGRESS_PREFIX) :])
    except (ValueError, RecursionError):
        return None
    if not isinstance(item, Mapping):
        return None
    if "soak_window" in item:
        window = SoakWindow.parse(item["soak_window"])
        return None if window is None else Progress(window=window)
    result = KernelResult.parse(item)
    done, total = as_int(item.get("done")), as_int(item.get("total"))
    if result is None or done is None or total is None:
        return None
    return Progress(done, total, result)
