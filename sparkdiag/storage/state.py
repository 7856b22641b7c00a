"""The latest storage probe per mount point, kept in ``storage.json`` in the state directory.

``sparkdiag storage``, ``check --storage`` (only when it records) and the daemon's periodic probe
write it (atomically); the daemon exports it (``sparkdiag_storage_*``,
:mod:`sparkdiag.exporter.storage`). A probe replaces its mount point's entry and keeps each
figure's value before it as ``previous``, which the ``SparkdiagStorageSlow`` rule reads (the last
two probes under 0.7 of the baseline). Reading never trusts the file: a damaged one is an error
naming its path, a value of the wrong type is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkdiag.errors import SparkdiagError
from sparkdiag.jsonvalues import as_float, as_map, as_str
from sparkdiag.statedir import (
    read_json_state,
    state_file,
    update_json_state,
)
from sparkdiag.storage.model import DIRECTIONS, PATHS

if TYPE_CHECKING:  # the daemon's exporter reads this file without the store (SQLite)
    from sparkdiag.storage.evaluate import StorageReport

FILENAME = "storage.json"
SCHEMA = "sparkdiag-storage-state/1"
MAX_BYTES = 1 << 20
MAX_MOUNTS = 64  # a state file never grows past this many mount points (oldest dropped)


class StorageStateError(SparkdiagError):
    """storage.json cannot be read or written (the message names the file)."""


@dataclass(frozen=True)
class KeptFigure:
    """One figure of the latest probe: bytes/s now, at the probe before (None: none), and the
    baseline it was compared with (None: learning)."""

    direction: str
    path: str
    bytes_per_second: float
    previous: float | None
    baseline: float | None


@dataclass(frozen=True)
class KeptProbe:
    """The latest probe of one mount point."""

    mountpoint: str
    device: str
    kind: str
    directory: str
    finished_at: float
    figures: tuple[KeptFigure, ...]
    latency: Mapping[str, float]  # "0.5", "0.99" -> seconds
    bytes_written: float | None = None
    seconds: float | None = None
    latency_count: float | None = None  # the 4 KiB reads timed
    latency_sum: float | None = None  # their latencies added up, seconds


def state_path(state_dir: Path | None) -> Path:
    """``storage.json`` in ``state_dir`` (default: the state directory)."""
    return state_file(state_dir, FILENAME)


def read_state(path: Path) -> tuple[KeptProbe, ...] | None:
    """The kept probes, or None when there is no file; StorageStateError when it is unusable."""
    doc = read_json_state(path, MAX_BYTES, "a storage state file", SCHEMA, StorageStateError)
    if doc is None:
        return None
    mounts = doc.get("mounts")
    parsed = (_probe(m) for m in (mounts if isinstance(mounts, list) else []))
    return tuple(p for p in parsed if p is not None)


def _probe(raw: Any) -> KeptProbe | None:
    item = as_map(raw)
    mountpoint, finished = as_str(item.get("mountpoint")), as_float(item.get("finished_at"))
    if not mountpoint or finished is None:
        return None
    figures = []
    listed = item.get("figures")
    for entry in listed if isinstance(listed, list) else []:
        fig = as_map(entry)
        direction, path = as_str(fig.get("direction")), as_str(fig.get("path"))
        value = as_float(fig.get("bytes_per_second"))
        if direction in DIRECTIONS and path in PATHS and value is not None and value > 0:
            figures.append(
                KeptFigure(
                    direction,
                    path,
                    value,
                    as_float(fig.get("previous")),
                    as_float(fig.get("baseline")),
                )
            )
    latency = {q: v for q, raw_v in as_map(item.get("latency")).items()
               if q in ("0.5", "0.99") and (v := as_float(raw_v)) is not None}  # fmt: skip
    return KeptProbe(
        mountpoint=mountpoint,
        device=as_str(item.get("device")) or "",
        kind=as_str(item.get("kind")) or "",
        directory=as_str(item.get("directory")) or mountpoint,
        finished_at=finished,
        figures=tuple(figures),
        latency=latency,
        bytes_written=as_float(item.get("bytes_written")),
        seconds=as_float(item.get("seconds")),
        latency_count=as_float(item.get("latency_count")),
        latency_sum=as_float(item.get("latency_sum")),
    )


def kept(report: StorageReport, before: KeptProbe | None) -> KeptProbe:
    """What the file keeps of a report; each figure's previous value comes from ``before``. A
    ``gds`` read in a compatibility mode is not kept: the file is what the metrics export, and
    ``path="gds"`` there means GPUDirect Storage (the report and its JSON still show it)."""
    old = {(f.direction, f.path): f.bytes_per_second for f in before.figures} if before else {}
    doc = report.document
    figures = tuple(
        KeptFigure(
            f.throughput.direction, f.throughput.path, value,
            old.get((f.throughput.direction, f.throughput.path)),
            f.baseline.bytes_per_second if f.baseline else None,
        )
        for f in report.figures
        if (value := f.value) is not None and f.throughput.mode != "compat"
    )  # fmt: skip
    latency = {} if doc.random_read is None else {
        "0.5": doc.random_read.p50, "0.99": doc.random_read.p99
    }  # fmt: skip
    target, rnd = report.target, doc.random_read
    return KeptProbe(
        target.mountpoint or target.directory, target.device, target.kind, target.directory,
        doc.finished_at, figures, latency, float(doc.bytes_written),
        doc.finished_at - doc.started_at,
        float(rnd.ops) if rnd is not None else None, rnd.sum if rnd is not None else None,
    )  # fmt: skip


def record_report(path: Path, report: StorageReport) -> KeptProbe:
    """Replace the report's mount point in the file (keeping the others) and write it."""
    mountpoint = report.target.mountpoint or report.target.directory

    def change() -> tuple[dict[str, Any], KeptProbe]:
        try:
            old = read_state(path) or ()
        except StorageStateError:
            old = ()  # a damaged file is replaced by this probe
        before = next((p for p in old if p.mountpoint == mountpoint), None)
        new = kept(report, before)
        probes = sorted([*(p for p in old if p.mountpoint != mountpoint), new],
                        key=lambda p: p.finished_at)[-MAX_MOUNTS:]  # fmt: skip
        mounts = [_json(p) for p in sorted(probes, key=lambda p: p.mountpoint)]
        return {"schema": SCHEMA, "mounts": mounts}, new

    return update_json_state(path, change, StorageStateError)  # other mount points are kept


def _json(probe: KeptProbe) -> dict[str, Any]:
    return {
        "mountpoint": probe.mountpoint, "device": probe.device, "kind": probe.kind,
        "directory": probe.directory, "finished_at": probe.finished_at,
        "figures": [
            {"direction": f.direction, "path": f.path, "bytes_per_second": f.bytes_per_second,
             "previous": f.previous, "baseline": f.baseline} for f in probe.figures
        ],
        "latency": dict(probe.latency), "latency_count": probe.latency_count,
        "latency_sum": probe.latency_sum, "bytes_written": probe.bytes_written,
        "seconds": probe.seconds,
    }  # fmt: skip
