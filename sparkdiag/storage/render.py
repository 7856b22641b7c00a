"""A storage report as text that fits the terminal (``sparkdiag storage`` without ``--json``).

Figures are in decimal units (GB/s = 1e9 bytes per second, as drive makers and the PCIe link
figures give them); latencies in µs or ms.
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkdiag import terminal
from sparkdiag.snapshot import NvmeController
from sparkdiag.storage.evaluate import SLOW_RATIO, Figure, StorageReport
from sparkdiag.storage.model import GpuRun

# How a baseline is learned (baseline/storage_store.py, the GEMM rules): said in the text and
# the help alike. It said "the median of the first 3 healthy runs" while runs 4 and 5 moved it
LEARNING = (
    "the baseline is the median of the first healthy runs, set at 3 and frozen at 5; a run "
    "judged slow against it, or beside other I/O, is not learned from"
)

# The first column of a figure's row: what moved where.
LABELS = {("write", "host"): "write", ("read", "host"): "read", ("read", "gpu"): "read to GPU",
          ("read", "gds"): "read by GDS"}  # fmt: skip


def rate(value: float | None) -> str:
    """``8.12 GB/s``, ``412 MB/s``; ``-`` for None."""
    if value is None:
        return "-"
    if value >= 1e9:
        return f"{value / 1e9:.3g} GB/s"
    return f"{value / 1e6:.3g} MB/s"


def ratio(value: float) -> str:
    """A figure over its baseline: ``0.93``; under 0.01 with the digits it needs (``0.002``),
    and ``<0.001`` below that: a drive at 0.2 % of its baseline read ``(0.00)`` before."""
    if value >= 0.01:
        return f"{value:.2f}"
    return f"{value:.1g}" if value >= 0.001 else "<0.001"


def size(value: float) -> str:
    """``1.0 GiB``, ``256 MiB`` (binary: the test file's size as it was asked for)."""
    if value >= 1 << 30:
        return f"{value / (1 << 30):.3g} GiB"
    return f"{value / (1 << 20):.3g} MiB"


def seconds(value: float) -> str:
    """``72 µs``, ``1.4 ms``."""
    return f"{value * 1e6:.0f} µs" if value < 1e-3 else f"{value * 1e3:.3g} ms"


def temperatures(before: Sequence[NvmeController], after: Sequence[NvmeController]) -> list[str]:
    """``nvme0 38 -> 47 °C during the probe (warning 82 °C)`` per drive with a composite sensor."""
    lines = []
    ends = {c.name: c for c in after}
    for start in before:
        first = start.temperature_celsius.get("composite")
        end = ends.get(start.name)
        last = end.temperature_celsius.get("composite") if end is not None else None
        if first is None or last is None:
            continue
        warn = start.threshold_celsius.get("warning")
        note = f" (warning {warn:.0f} °C)" if warn is not None else ""
        lines.append(f"{start.name} {first:.0f} -> {last:.0f} °C during the probe{note}")
    return lines


def text(report: StorageReport, width: int, drive_lines: Sequence[str] = ()) -> str:
    """The report: where, each figure against its baseline and ceiling, latency, verdict, cost."""
    target, doc = report.target, report.document
    lines = terminal.wrap(target.describe(), width)
    ceiling = target.ceiling
    rows = []
    for figure in report.figures:
        base = figure.baseline
        versus = "learning"
        if base is not None and figure.ratio is not None:
            versus = f"{rate(base.bytes_per_second)} ({ratio(figure.ratio)})"
        link = "-" if ceiling is None or figure.value is None else (
            f"{figure.value / ceiling:.0%} of {rate(ceiling)}"
        )  # fmt: skip
        rows.append([label(figure), rate(figure.value), versus, link])
        pinned = doc.gpu.stage("pinned") if doc.gpu is not None else None
        if (
            figure.throughput.path == "host"
            and figure.throughput.direction == "read"
            and (pinned is not None and pinned.bytes_per_second is not None)
        ):
            rows.append(["read, pinned", rate(pinned.bytes_per_second), "-", "-"])
    lines += terminal.table(
        ["", "sequential", "baseline", "link"], rows, width, right={1}, indent="  "
    )
    if doc.gpu is not None:
        lines += [f"  {line}" for line in gpu_lines(doc.gpu, width - 2)]
    if doc.random_read is not None:
        rnd = doc.random_read
        lines += terminal.wrap(
            f"4 KiB random reads: p50 {seconds(rnd.p50)}, p99 {seconds(rnd.p99)} "
            f"({rnd.ops} reads, one at a time)", width, "  ",
        )  # fmt: skip
    rated = target.rated
    if rated is not None:
        lines += terminal.wrap(
            f"rated: {rated.name} {rate(rated.read)} read, {rate(rated.write)} write", width, "  "
        )
    lines += [f"  {line}" for line in drive_lines]
    lines += terminal.wrap(_verdict(report), width)
    kept = "O_TMPFILE" if doc.tmpfile else "a named file unlinked before writing"
    lines += terminal.wrap(
        f"cost: wrote {size(doc.bytes_written)} in {doc.finished_at - doc.started_at:.1f} s; "
        f"the test file was {kept} and is gone", width,
    )  # fmt: skip
    for note in (*doc.notes, *((report.store_note,) if report.store_note else ())):
        lines += terminal.wrap(f"note: {note}", width)
    return "\n".join(lines) + "\n"


def label(figure: Figure) -> str:
    """``read by GDS (compat)`` for a cuFile read in a compatibility mode: never GDS alone."""
    t = figure.throughput
    text = LABELS.get((t.direction, t.path), f"{t.direction} {t.path}")
    return f"{text} (compat)" if t.mode == "compat" else text


def gpu_lines(run: GpuRun, width: int) -> list[str]:
    """Where the GPU path went and what it skipped or could not do, and the mode of its cuFile
    reads: a compatibility mode is said in words (POSIX reads, not GPUDirect Storage)."""
    where = " ".join(x for x in (run.device, f"({run.gpu_name})" if run.gpu_name else "") if x)
    lines: list[str] = []
    if run.status == "skipped_busy":
        return terminal.wrap(f"path into the GPU skipped: {run.reason or 'the GPU is busy'}", width)
    if run.status == "skipped":  # the write did not finish in its time: no whole file to read
        return terminal.wrap(f"path into the GPU skipped: {run.reason or 'not run'}", width)
    if run.status == "error" and not run.stages:
        return terminal.wrap(f"path into the GPU failed: {run.reason or 'no reason given'}", width)
    if run.status == "unsupported" and all(s.status != "ok" for s in run.stages):
        return terminal.wrap(f"path into the GPU skipped: {run.reason}", width)
    pages = {"huge": "huge pages", "small": "4 KiB pages", "torch": "torch's allocator"}
    lines += terminal.wrap(
        f"path into {where or 'the GPU'}; pinned buffers in "
        f"{pages.get(run.pages or '', 'host memory')}", width,
    )  # fmt: skip
    for stage in run.stages:
        if stage.status != "ok":
            lines += terminal.wrap(f"{stage.path} {stage.status}: {stage.reason}", width, "  ")
        elif stage.checked is False:
            lines += terminal.wrap(f"{stage.path}: the data that arrived was WRONG", width, "  ")
        if stage.path == "gds" and stage.status == "ok":
            said = (
                f"gds ran in a compatibility mode, not GPUDirect Storage: {stage.mode_reason}"
                if stage.mode == "compat" else f"gds: GPUDirect Storage, {stage.mode_reason}"
            )  # fmt: skip
            lines += terminal.wrap(said, width, "  ")
    return lines


def _verdict(report: StorageReport) -> str:
    verdict = report.verdict
    if verdict == "cached":
        return f"CACHED: {report.verdict_reason}"
    if verdict == "slow":
        slow = [label(f) for f in report.figures if f.verdict == "slow"]
        return (
            f"SLOW: {' and '.join(slow)} under {SLOW_RATIO} of the baseline learned on this "
            "machine: check the drive's temperature and health (sparkdiag check), what else "
            "uses it, and its filesystem's free space"
        )
    if verdict == "learning":
        if not report.recorded and report.record_asked:
            return "no baseline yet, and this run was not recorded (the note says why)"
        if not report.recorded:
            return (
                "no baseline yet: run 'sparkdiag storage DIR' on the healthy machine to learn one"
            )
        if report.other_io_bytes and not report.learned_from:
            return (
                f"learning: this run was not learned from ({size(report.other_io_bytes)} of "
                "other I/O on the device while it ran)"
            )
        return f"learning: {LEARNING}"
    return f"fit: every figure at least {SLOW_RATIO} of its baseline"
