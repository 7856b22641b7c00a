"""A probe's figures held against the drive's ceiling and the baseline learned on this machine.

One rule, shared by ``sparkdiag storage``, ``check --storage``, the daemon and the alert
``SparkdiagStorageSlow``: a figure under :data:`SLOW_RATIO` of its baseline is slow. A figure
teaches the baseline only when it was healthy: nothing else moved more than
:data:`OTHER_IO_SHARE` of the probe's own bytes through the device while it ran (another job's
reads would make the drive look slow, and a learned baseline is frozen), the reads reached the
device (:func:`from_cache`), and it was not judged slow against the baseline it already has (a
slow run pulled the median of runs 4 and 5 down before).

Where the device's counters show that it read under :data:`CACHED_SHARE` of what the probe read
back, the reads came from a cache: the filesystem did not honour ``O_DIRECT`` (ext4 mounted
``data=journal`` buffers it without a word; it read "2048 MiB at 5.31 GB/s, p50 1.4 µs" with
0 MiB read from the device, verdict fit). Such a run's verdict is ``cached``: none of its
figures is the drive's, none is judged or learned from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from sparkdiag.baseline.storage_store import StorageBaseline, StorageKey
from sparkdiag.baseline.store import BaselineStore
from sparkdiag.storage.model import GpuRun, ProbeDocument, Throughput
from sparkdiag.storage.target import StorageTarget

SLOW_RATIO = 0.7  # METRICS.md: SparkdiagStorageSlow, under 0.7 of the baseline
OTHER_IO_SHARE = 0.10
CACHED_SHARE = 0.5  # the device read under half of what the probe read back: a cache gave it
Verdict = Literal["fit", "slow", "learning", "cached"]


def method(doc: ProbeDocument, throughput: Throughput | None = None) -> str:
    """How a figure was measured, part of its baseline key: ``o_direct:1048576x8`` into or from
    host memory, ``pinned:1048576x8`` on into the GPU, ``cufile-gds:...`` or
    ``cufile-compat:...`` by cuFile (so that a compatibility-mode figure never teaches or is
    judged by a GPUDirect one)."""
    shape = f"{doc.block}x{doc.threads}"
    if throughput is None or throughput.path == "host":
        return f"o_direct:{shape}"
    if throughput.path == "gpu":
        return f"pinned:{shape}"
    return f"cufile-{throughput.mode or 'compat'}:{shape}"


@dataclass(frozen=True)
class Figure:
    """One throughput with its baseline (None while learned) and the link's ceiling; cached:
    the run's reads came from a cache (its verdict is ``cached``); learned_from: it went into
    the baseline store as a healthy run."""

    throughput: Throughput
    baseline: StorageBaseline | None
    ceiling: float | None
    rated: float | None
    cached: bool = False
    learned_from: bool = False

    @property
    def value(self) -> float | None:
        return self.throughput.bytes_per_second

    @property
    def ratio(self) -> float | None:
        if self.value is None or self.baseline is None:
            return None
        return self.value / self.baseline.bytes_per_second

    @property
    def verdict(self) -> Verdict:
        if self.cached:
            return "cached"
        ratio = self.ratio
        if ratio is None:
            return "learning"
        return "slow" if ratio < SLOW_RATIO else "fit"

    def as_json(self) -> dict[str, Any]:
        return {
            "direction": self.throughput.direction,
            "path": self.throughput.path,
            "mode": self.throughput.mode,
            "bytes": self.throughput.bytes,
            "seconds": self.throughput.seconds,
            "bytes_per_second": self.value,
            "baseline_bytes_per_second": self.baseline.bytes_per_second if self.baseline else None,
            "baseline_source": self.baseline.source if self.baseline else None,
            "baseline_runs": self.baseline.runs if self.baseline else None,
            "ratio": self.ratio,
            "ceiling_bytes_per_second": self.ceiling,
            "rated_bytes_per_second": self.rated,
            "verdict": self.verdict,
            "learned_from": self.learned_from,
        }


@dataclass(frozen=True)
class StorageReport:
    """One probe of one directory, judged.

    other_io_bytes: bytes something else moved through the device while the probe ran (None:
        the device's counters could not be read)
    recorded: the figures were kept in the baseline store; learned_from: and one at least
        taught the baseline (healthy)
    store_note: why the figures were not recorded (``not recorded: ...``) or the store not
        read, or None
    device_read_bytes: bytes the device read while the probe ran (None: its counters could not
        be read, it has none (tmpfs, a network share) or does not see every read (a btrfs over
        several devices))
    record_asked: recording was asked for (``sparkdiag storage``, the daemon; not ``check``)
    """

    target: StorageTarget
    document: ProbeDocument
    figures: tuple[Figure, ...]
    other_io_bytes: int | None = None
    recorded: bool = False
    learned_from: bool = False
    store_note: str | None = None
    device_read_bytes: int | None = None
    record_asked: bool = False

    def figure(self, direction: str, path: str = "host") -> Figure | None:
        return next(
            (f for f in self.figures
             if f.throughput.direction == direction and f.throughput.path == path), None
        )  # fmt: skip

    @property
    def cached(self) -> bool:
        """The reads came from a cache, not the device (:func:`from_cache`)."""
        return from_cache(self.document, self.device_read_bytes)

    @property
    def verdict(self) -> Verdict:
        if self.cached:
            return "cached"
        verdicts = {f.verdict for f in self.figures}
        return "slow" if "slow" in verdicts else "learning" if "learning" in verdicts else "fit"

    @property
    def verdict_reason(self) -> str | None:
        """Why the verdict is ``cached`` (one line), else None."""
        if not self.cached:
            return None
        device = self.target.device or "the device"
        return (
            f"the reads came from a cache, not the drive: {device} read "
            f"{_mib(self.device_read_bytes or 0)} while the probe read back "
            f"{_mib(self.document.host_read_bytes)} (the filesystem did not honour O_DIRECT, as "
            "ext4 mounted data=journal does not); these figures are not the drive's, and teach "
            "no baseline"
        )

    def as_json(self) -> dict[str, Any]:
        doc, target = self.document, self.target
        latency = doc.random_read
        return {
            "directory": target.directory,
            "mountpoint": target.mountpoint,
            "device": target.device,
            "fstype": target.mount.fstype if target.mount else None,
            "kind": target.kind,
            "drives": [
                {
                    "controller": c.name,
                    "model": c.model,
                    "firmware": c.firmware,
                    "pci_address": c.pci_address,
                }
                for c in target.nvme
            ],
            "layers": list(target.chain.layers) if target.chain else [],
            "ceiling_bytes_per_second": target.ceiling,
            "verdict": self.verdict,
            "verdict_reason": self.verdict_reason,
            "figures": [f.as_json() for f in self.figures],
            "random_read": None
            if latency is None
            else {
                "ops": latency.ops,
                "block": latency.block,
                "p50_seconds": latency.p50,
                "p99_seconds": latency.p99,
                "max_seconds": latency.max,
            },
            "gpu": None if doc.gpu is None else gpu_json(doc.gpu),
            "size": doc.size,
            "block": doc.block,
            "threads": doc.threads,
            "pages": doc.pages,
            "tmpfile": doc.tmpfile,
            "bytes_written": doc.bytes_written,
            "seconds": doc.finished_at - doc.started_at,
            "flush_seconds": doc.flush_seconds,
            "finished_at": doc.finished_at,
            "other_io_bytes": self.other_io_bytes,
            "device_read_bytes": self.device_read_bytes,
            "recorded": self.recorded,
            "learned_from": self.learned_from,
            "store_note": self.store_note,
            "notes": list(doc.notes),
        }


def gpu_json(run: GpuRun) -> dict[str, Any]:
    """The path into the GPU as ``--json`` gives it: every stage, measured or not."""
    return {
        "status": run.status, "reason": run.reason, "device": run.device,
        "gpu_name": run.gpu_name, "torch": run.torch, "pages": run.pages,
        "stages": [
            {"path": s.path, "status": s.status, "reason": s.reason, "bytes": s.bytes,
             "seconds": s.seconds, "bytes_per_second": s.bytes_per_second, "mode": s.mode,
             "mode_reason": s.mode_reason, "checked": s.checked, "kvikio": s.kvikio}
            for s in run.stages
        ],
    }  # fmt: skip


def _mib(value: int) -> str:
    return f"{value / (1 << 20):.0f} MiB"


def device_read(before: tuple[int, int] | None, after: tuple[int, int] | None) -> int | None:
    """Bytes the device read between two readings of its counters (``io_bytes``); None where
    either is missing, or where the device counted no write either: the probe's write and its
    fdatasync always reach a device that counts, so one that counted nothing counts nothing."""
    if before is None or after is None:
        return None
    read, written = after[0] - before[0], after[1] - before[1]
    return read if read >= 0 and written > 0 else None


def from_cache(doc: ProbeDocument, device_read_bytes: int | None) -> bool:
    """Whether the device read under :data:`CACHED_SHARE` of what the probe read back into
    host memory: the reads came from a cache (False where the counters are unknown)."""
    ours = doc.host_read_bytes
    return device_read_bytes is not None and ours > 0 and device_read_bytes < CACHED_SHARE * ours


def other_io(
    doc: ProbeDocument, before: tuple[int, int] | None, after: tuple[int, int] | None
) -> int | None:
    """Bytes the device moved during the probe beyond the probe's own reads and writes."""
    if before is None or after is None:
        return None
    read, written = after[0] - before[0], after[1] - before[1]
    return max(0, read - doc.read_bytes) + max(0, written - doc.bytes_written)


def keys(target: StorageTarget, doc: ProbeDocument) -> dict[tuple[str, str], StorageKey]:
    """The baseline key of each figure of ``doc``: (direction, path) -> key."""
    drive = ",".join(sorted({c.model for c in target.nvme if c.model}))
    return {
        (t.direction, t.path): StorageKey(
            drive, target.mountpoint or target.directory, target.device or "unknown",
            t.direction, t.path, method(doc, t),
        )
        for t in doc.throughput
    }  # fmt: skip


def evaluate(
    target: StorageTarget,
    doc: ProbeDocument,
    store: BaselineStore | None,
    record: bool,
    other_io_bytes: int | None = None,
    store_note: str | None = None,
    device_read_bytes: int | None = None,
) -> StorageReport:
    """Each figure with its baseline; with ``record`` (and a store) the figures are kept, and
    each teaches the baseline when it was healthy: no other I/O on the device, reads that
    reached it (``device_read_bytes``, :func:`from_cache`), and not slow against the baseline
    it already has."""
    ours = doc.bytes_written + doc.read_bytes
    quiet = other_io_bytes is None or other_io_bytes <= OTHER_IO_SHARE * max(ours, 1)
    cached = from_cache(doc, device_read_bytes)
    rated = target.rated
    figures = []
    recorded = False
    for (direction, _path), key in keys(target, doc).items():
        throughput = doc.figure(direction, _path)
        assert throughput is not None
        ceiling = target.ceiling
        rated_value = None if rated is None else rated.read if direction == "read" else rated.write
        figure = Figure(throughput, None, ceiling, rated_value, cached)
        if store is not None:
            # Judged against what was known before this run; the first baseline a run completes
            # is its own median with the runs before it.
            figure = replace(figure, baseline=store.storage_baseline(key))
            value = throughput.bytes_per_second
            if record and value is not None:
                healthy = quiet and not cached and replace(figure, cached=False).verdict != "slow"
                after = store.record_storage(key, value, healthy, doc.finished_at or None)
                figure = replace(figure, baseline=figure.baseline or after, learned_from=healthy)
                recorded = True
        figures.append(figure)
    return StorageReport(
        target,
        doc,
        tuple(figures),
        other_io_bytes,
        recorded,
        learned_from=any(f.learned_from for f in figures),
        store_note=store_note,
        device_read_bytes=device_read_bytes,
        record_asked=record,
    )
