"""The probe worker's JSON document, parsed once into frozen dataclasses.

The worker (``worker.py``) prints one JSON document per cycle (schema ``worker.SCHEMA``); every
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
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from sparkdiag.probe.worker import PROGRESS_PREFIX, SCHEMA

__all__ = [
    "PROGRESS_PREFIX",
    "SCHEMA",
    "Bandwidth",
    "BusyRecord",
    "Conditions",
    "DocumentError",
    "KernelResult",
    "Progress",
    "Software",
    "WorkerDocument",
    "find_document",
    "parse_document",
    "parse_progress",
]


class DocumentError(ValueError):
    """The input is not a worker document of this schema."""


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


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
        block = _map(raw)
        return cls(**{f.name: _str(block.get(f.name)) for f in fields(cls)})

    def identity(self) -> tuple[str, str, str]:
        """(driver, torch, cuda), empty strings where unknown: what a baseline is learned under."""
        return (self.driver or "", self.torch or "", self.cuda or "")

    def as_dict(self) -> dict[str, str | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class KernelResult:
    """One kernel: throughput in TFLOPS (tera-operations per second for integer dtypes)."""

    dtype: str
    shape: str  # MxNxK
    kind: str  # compute, llm, decode
    beta: int  # 1: C += A @ B (kept apart from beta=0)
    status: str  # ok, unsupported, error
    reason: str | None
    tflops: float | None
    median_ms: float | None = None
    min_ms: float | None = None
    iters: int = 0
    max_rel_error: float | None = None
    error_bound: float | None = None

    @classmethod
    def parse(cls, raw: Any) -> KernelResult | None:
        if not isinstance(raw, Mapping):
            return None
        dtype, shape = _str(raw.get("dtype")), _str(raw.get("shape"))
        if not dtype or not shape:
            return None
        status = _str(raw.get("status")) or "error"
        return cls(
            dtype=dtype,
            shape=shape,
            kind=_str(raw.get("kind")) or "",
            beta=_int(raw.get("beta")) or 0,
            status=status,
            reason=_str(raw.get("reason")),
            tflops=_positive(raw.get("tflops")) if status == "ok" else None,
            median_ms=_float(raw.get("median_ms")),
            min_ms=_float(raw.get("min_ms")),
            iters=_int(raw.get("iters")) or 0,
            max_rel_error=_float(raw.get("max_rel_error")),
            error_bound=_float(raw.get("error_bound")),
        )

    @property
    def label(self) -> str:
        """``bf16 8192x8192x8192``, with `` beta=1`` for the accumulate runs."""
        return f"{self.dtype} {self.shape}" + (f" beta={self.beta}" if self.beta else "")


def _positive(value: Any) -> float | None:
    number = _float(value)
    return number if number is not None and number > 0 else None


@dataclass(frozen=True)
class Bandwidth:
    """Device memory copy: bytes read plus written per second."""

    status: str
    reason: str | None
    bytes_per_second: float | None

    @classmethod
    def parse(cls, raw: Any) -> Bandwidth | None:
        if not isinstance(raw, Mapping):
            return None
        status = _str(raw.get("status")) or "error"
        value = _positive(raw.get("bytes_per_second")) if status == "ok" else None
        return cls(status, _str(raw.get("reason")), value)


@dataclass(frozen=True)
class Conditions:
    """What NVML showed while the kernels ran (None where the worker had no NVML)."""

    max_gpu_temperature_celsius: float | None = None
    max_memory_temperature_celsius: float | None = None
    clock_event_reasons_seen: int | None = None  # NVML bitmask, OR of every sample
    mean_sm_clock_hertz: float | None = None
    mean_power_watts: float | None = None
    samples: int = 0

    @classmethod
    def parse(cls, raw: Any) -> Conditions:
        block = _map(raw)
        return cls(
            max_gpu_temperature_celsius=_float(block.get("max_gpu_temperature_celsius")),
            max_memory_temperature_celsius=_float(block.get("max_memory_temperature_celsius")),
            clock_event_reasons_seen=_int(block.get("clock_event_reasons_seen")),
            mean_sm_clock_hertz=_float(block.get("mean_sm_clock_hertz")),
            mean_power_watts=_float(block.get("mean_power_watts")),
            samples=_int(block.get("samples")) or 0,
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
        block = _map(raw)
        pids = block.get("other_pids")
        return cls(
            other_pids=tuple(p for p in pids if _int(p) is not None)
            if isinstance(pids, list)
            else (),
            utilization=_float(block.get("utilization")),
            nvml=block.get("nvml") is True,
        )


@dataclass(frozen=True)
class WorkerDocument:
    """One cycle of the worker. ``raw`` is the JSON object as printed (for ``--json`` output)."""

    status: str  # ok, error, unsupported, skipped_busy (the worker's own view)
    reason: str | None
    software: Software = field(default_factory=Software)
    results: tuple[KernelResult, ...] = ()
    bandwidth: Bandwidth | None = None
    conditions: Conditions = field(default_factory=Conditions)
    busy: BusyRecord = field(default_factory=BusyRecord)
    gpu_busy_seconds: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def measured(self) -> tuple[KernelResult, ...]:
        """The results that measured a figure."""
        return tuple(r for r in self.results if r.tflops is not None)

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
        return bool(self.results) or self.bandwidth is not None


def parse_document(raw: Any) -> WorkerDocument:
    """A decoded JSON value as a worker document; DocumentError when it is not one."""
    if not isinstance(raw, Mapping):
        raise DocumentError("not a JSON object")
    if raw.get("schema") != SCHEMA:
        raise DocumentError(f"schema {str(raw.get('schema'))[:40]!r} is not {SCHEMA!r}")
    results = raw.get("results")
    return WorkerDocument(
        status=_str(raw.get("status")) or "error",
        reason=_str(raw.get("reason")),
        software=Software.parse(raw.get("software")),
        results=tuple(
            r for r in map(KernelResult.parse, results if isinstance(results, list) else []) if r
        ),
        bandwidth=Bandwidth.parse(raw.get("bandwidth")),
        conditions=Conditions.parse(raw.get("conditions")),
        busy=BusyRecord.parse(raw.get("busy")),
        gpu_busy_seconds=_float(raw.get("gpu_busy_seconds")),
        started_at=_float(raw.get("started_at")),
        finished_at=_float(raw.get("finished_at")),
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
    """One ``--progress`` line: a kernel finished, ``done`` of ``total``."""

    done: int
    total: int
    result: KernelResult


def parse_progress(line: str) -> Progress | None:
    """A worker's stderr line as progress, or None when it is not one."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        item = json.loads(line[len(PROGRESS_PREFIX) :])
    except (ValueError, RecursionError):
        return None
    result = KernelResult.parse(item)
    if result is None:
        return None
    done, total = _int(item.get("done")), _int(item.get("total"))
    if done is None or total is None:
        return None
    return Progress(done, total, result)
