"""The storage probe's results as frozen dataclasses: the measuring program's document parsed
once (:func:`parse_document`), and a figure with what it is compared with.

A figure is one direction (``read``, ``write``) along one ``path``: ``host`` (the drive into or
from host memory: what :mod:`sparkdiag.storage.measure` measures), ``gpu`` (on into GPU memory)
and ``gds`` (GPUDirect Storage). Only ``host`` is measured so far; the other two are named here so
that the metric labels, the baselines and the state file already take them, and nothing reports
a figure that was not measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkdiag.jsonvalues import as_float, as_int, as_map, as_str
from sparkdiag.storage.measure import SCHEMA

DIRECTIONS = ("read", "write")
PATHS = ("host", "gpu", "gds")


@dataclass(frozen=True)
class Throughput:
    """Sequential throughput in one direction along one path: bytes moved in seconds."""

    direction: str
    path: str
    bytes: int
    seconds: float

    @property
    def bytes_per_second(self) -> float | None:
        return self.bytes / self.seconds if self.seconds > 0 and self.bytes > 0 else None


@dataclass(frozen=True)
class Latency:
    """Random reads of ``block`` bytes, one at a time: how many, over how long, and the 50th
    and 99th percentile and the slowest, in seconds."""

    ops: int
    seconds: float
    block: int
    p50: float
    p99: float
    max: float
    sum: float | None = None  # the reads' latencies added up (a summary's _sum)


@dataclass(frozen=True)
class ProbeDocument:
    """What the measuring program printed (schema ``sparkdiag-storage/1``).

    status: ``ok``, ``refused`` (nothing written: the reason says why) or ``error``
    tmpfile: the test file was an ``O_TMPFILE`` (False: a named file unlinked before writing)
    size, block, threads: the test file's bytes, the block and the threads it was moved with
    bytes_written: what the probe wrote (its cost to the drive's endurance)
    """

    status: str
    reason: str | None
    directory: str = ""
    tmpfile: bool = True
    size: int = 0
    block: int = 0
    threads: int = 0
    throughput: tuple[Throughput, ...] = ()
    flush_seconds: float | None = None
    random_read: Latency | None = None
    bytes_written: int = 0
    started_at: float = 0.0
    finished_at: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def figure(self, direction: str, path: str = "host") -> Throughput | None:
        return next(
            (t for t in self.throughput if t.direction == direction and t.path == path), None
        )


class DocumentError(ValueError):
    """The measuring program printed something that is not its document."""


def parse_document(doc: Any) -> ProbeDocument:
    """A decoded JSON document as a :class:`ProbeDocument`; DocumentError when it is none."""
    raw = as_map(doc)
    status = as_str(raw.get("status"))
    if raw.get("schema") != SCHEMA or status not in ("ok", "refused", "error"):
        raise DocumentError(f"not a storage probe document (schema {SCHEMA})")
    throughput = []
    for direction in DIRECTIONS:
        phase = as_map(raw.get(direction))
        moved, seconds = as_int(phase.get("bytes")), as_float(phase.get("seconds"))
        if moved is not None and seconds is not None:
            throughput.append(Throughput(direction, "host", moved, seconds))
    rnd = as_map(raw.get("random_read"))
    values = [as_float(rnd.get(k)) for k in ("seconds", "p50", "p99", "max")]
    ops, block = as_int(rnd.get("ops")), as_int(rnd.get("block"))
    latency = None
    if ops and block and all(v is not None for v in values):
        seconds, p50, p99, slowest = (float(v or 0.0) for v in values)
        latency = Latency(ops, seconds, block, p50, p99, slowest, as_float(rnd.get("sum")))
    notes = raw.get("notes")
    return ProbeDocument(
        status=status or "error",
        reason=as_str(raw.get("reason")),
        directory=as_str(raw.get("directory")) or "",
        tmpfile=raw.get("tmpfile") is not False,
        size=as_int(raw.get("size")) or 0,
        block=as_int(raw.get("block")) or 0,
        threads=as_int(raw.get("threads")) or 0,
        throughput=tuple(throughput),
        flush_seconds=as_float(raw.get("flush_seconds")),
        random_read=latency,
        bytes_written=as_int(raw.get("bytes_written")) or 0,
        started_at=as_float(raw.get("started_at")) or 0.0,
        finished_at=as_float(raw.get("finished_at")) or 0.0,
        notes=tuple(n for n in (notes if isinstance(notes, list) else []) if isinstance(n, str)),
    )
