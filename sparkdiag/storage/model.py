"""The storage probe's results as frozen dataclasses: the measuring program's document parsed
once (:func:`parse_document`), and a figure with what it is compared with.

A figure is one direction (``read``, ``write``) along one ``path``: ``host`` (the drive into or
from host memory: what :mod:`sparkdiag.storage.measure` measures), ``gpu`` (read on through
pinned host memory into GPU memory) and ``gds`` (read by cuFile straight into GPU memory), the
last two measured by the probe worker's storage mode (probe/worker/storage.py) when the probe
was asked for the path into a GPU. A ``gds`` figure carries its ``mode``: ``gds`` (GPUDirect
Storage) or ``compat`` (a compatibility mode: POSIX reads through a bounce buffer), never one for
the other. The worker's ``pinned`` stage (into pinned host memory, no copy) is kept with the GPU
run, not as a figure: the metric contract's paths are host, gpu and gds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkdiag.jsonvalues import as_float, as_int, as_map, as_str

DIRECTIONS = ("read", "write")
PATHS = ("host", "gpu", "gds")
GPU_STAGES = ("pinned", "gpu", "gds")


@dataclass(frozen=True)
class Throughput:
    """Sequential throughput in one direction along one path: bytes moved in seconds; ``mode``
    for a ``gds`` read (``gds`` or ``compat``), else None."""

    direction: str
    path: str
    bytes: int
    seconds: float
    mode: str | None = None

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
class GpuStage:
    """One stage of the worker's reads into the GPU.

    path: ``pinned``, ``gpu`` or ``gds``; status: ``ok``, ``unsupported`` (reason says why) or
    ``error``; mode and mode_reason: for ``gds``, ``gds`` or ``compat`` and why; checked: the
    first block arrived intact (None: not checked); kvikio: its version
    """

    path: str
    status: str
    reason: str | None = None
    bytes: int = 0
    seconds: float | None = None
    mode: str | None = None
    mode_reason: str | None = None
    checked: bool | None = None
    kvikio: str | None = None

    @property
    def bytes_per_second(self) -> float | None:
        ok = self.status == "ok" and self.seconds and self.bytes > 0
        return self.bytes / self.seconds if ok and self.seconds else None


@dataclass(frozen=True)
class GpuRun:
    """The worker's run of the path into the GPU: its status (``ok``, ``unsupported``,
    ``error``, ``skipped_busy``; ``skipped`` from the measuring program where the write did
    not finish in its time, so there was no whole file to read) and reason, the device, the
    host buffers' pages and the stages."""

    status: str
    reason: str | None
    device: str | None = None
    gpu_name: str | None = None
    torch: str | None = None
    pages: str | None = None
    stages: tuple[GpuStage, ...] = ()

    def stage(self, path: str) -> GpuStage | None:
        return next((s for s in self.stages if s.path == path), None)


@dataclass(frozen=True)
class ProbeDocument:
    """What the measuring program printed (schema ``sparkdiag-storage/1``).

    status: ``ok``, ``refused`` (nothing written: the reason says why) or ``error``
    tmpfile: the test file was an ``O_TMPFILE`` (False: a named file unlinked before writing)
    size, block, threads: the test file's bytes, the block and the threads it was moved with
    pages: what the buffers lay in (``huge`` pages or ``small``; None: an older program)
    bytes_written: what the probe wrote (its cost to the drive's endurance)
    gpu: the path into the GPU (None: not asked for)
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
    pages: str | None = None
    gpu: GpuRun | None = None

    def figure(self, direction: str, path: str = "host") -> Throughput | None:
        return next(
            (t for t in self.throughput if t.direction == direction and t.path == path), None
        )

    @property
    def host_read_bytes(self) -> int:
        """What the probe itself read back into host memory: sequential and random reads."""
        read = sum(t.bytes for t in self.throughput if t.direction == "read" and t.path == "host")
        if self.random_read is not None:
            read += self.random_read.ops * self.random_read.block
        return read

    @property
    def read_bytes(self) -> int:
        """Every byte the probe read from the device: sequential, random, and into the GPU."""
        read = self.host_read_bytes
        if self.gpu is not None:
            read += sum(s.bytes for s in self.gpu.stages)
        return read


class DocumentError(ValueError):
    """The measuring program printed something that is not its document."""


def parse_document(doc: Any) -> ProbeDocument:
    """A decoded JSON document as a :class:`ProbeDocument`; DocumentError when it is none."""
    from sparkdiag.storage.measure import SCHEMA  # the program's module, for its documents only

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
    gpu = None if raw.get("gpu") is None else parse_gpu(raw.get("gpu"))
    if gpu is not None:
        for stage in gpu.stages:
            if stage.path in PATHS and stage.bytes_per_second is not None:
                mode = (stage.mode or "compat") if stage.path == "gds" else None  # never assumed
                throughput.append(
                    Throughput("read", stage.path, stage.bytes, stage.seconds or 0.0, mode)
                )
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
        pages=as_str(raw.get("pages")),
        gpu=gpu,
    )


def parse_gpu(raw: Any) -> GpuRun:
    """The worker's document (or the program's word on why there is none) as a GpuRun."""
    doc = as_map(raw)
    software, section = as_map(doc.get("software")), as_map(doc.get("storage"))
    stages = []
    listed = section.get("stages")
    for entry in listed if isinstance(listed, list) else []:
        item = as_map(entry)
        path, status = as_str(item.get("path")), as_str(item.get("status"))
        if path not in GPU_STAGES or status is None:
            continue
        mode = as_str(item.get("mode"))
        checked = item.get("checked")
        stages.append(GpuStage(
            path, status, as_str(item.get("reason")), as_int(item.get("bytes")) or 0,
            as_float(item.get("seconds")), mode if mode in ("gds", "compat") else None,
            as_str(item.get("mode_reason")), checked if isinstance(checked, bool) else None,
            as_str(item.get("kvikio")),
        ))  # fmt: skip
    return GpuRun(
        status=as_str(doc.get("status")) or "error",
        reason=as_str(doc.get("reason")),
        device=as_str(software.get("device")),
        gpu_name=as_str(software.get("gpu_name")),
        torch=as_str(software.get("torch")),
        pages=as_str(section.get("pages")),
        stages=tuple(stages),
    )
