"""The probe's terminal table and JSON figures, shared by ``sparkdiag probe`` (and ``soak``)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from sparkdiag import terminal
from sparkdiag.baseline.evaluate import GemmFigure
from sparkdiag.baseline.verdict import NOISE_BAND, SLOWER_BELOW, CycleVerdict
from sparkdiag.probe.document import Progress, WorkerDocument
from sparkdiag.probe.runner import ProbeCycle
from sparkdiag.probe.worker.contract import throughput_unit
from sparkdiag.snapshot import GpuIdentity
from sparkdiag.sources.nvml.gpu import decode_reasons

# Small pageable copies this many times slower than pinned ones are worth saying (GB10 owners
# reported about 50x with many small host-to-device copies from pageable memory).
SLOW_PAGEABLE_RATIO = 10.0


@dataclass(frozen=True)
class GpuRun:
    """One GPU's cycle (``identity`` None: a run on a torch device, with no NVML identity), its
    figures, its verdict against the baselines, and who else used the GPU meanwhile
    (``beside``: ``pid 4242 (python3)``, from the worker's own record)."""

    identity: GpuIdentity | None
    cycle: ProbeCycle
    figures: list[GemmFigure]
    verdict: CycleVerdict | None = None
    beside: str = ""


class KernelProgress:
    """``probe``'s progress on a terminal: one status line (:class:`terminal.StatusLine`, cut to
    the terminal's width) naming the latest kernel, erased by :meth:`close` before the table."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.line = terminal.StatusLine(sys.stderr if stream is None else stream, every=0.0)

    def __call__(self, item: Progress) -> None:
        r = item.result
        if r is None:  # a soak window: not a kernel of the suite
            return
        figure = tflops(r.delivered) if r.delivered is not None else r.status
        bar = terminal.bar(item.done, item.total)
        self.line.show(
            f"{self.label} {bar} {item.done}/{item.total} · {r.dtype} {r.shape}: {figure}",
            time.monotonic(),
        )

    def close(self) -> None:
        self.line.clear()


def device_head(doc: WorkerDocument | None) -> str:
    """What a run without a GPU identity ran on: ``CPU (torch device cpu)``."""
    device = doc.software.device if doc is not None else None
    if device == "cpu":
        return "CPU (torch device cpu)"
    return f"torch device {device}" if device else "torch's default device"


def on_cpu(doc: WorkerDocument | None) -> bool:
    return doc is not None and doc.software.device == "cpu"


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def tflops(value: float | None) -> str:
    """Throughput with three significant digits below 100 (CPU and decode figures are small)."""
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 100 else f"{value:.3g}"


def render_probe_table(runs: list[GpuRun], width: int | None = None) -> str:
    """Per GPU: its head line, the software, one row per kernel within ``width`` columns (the
    terminal's by default) with the figures' unit, the notes in full below the table, then
    the bandwidth, the copies and the conditions during the probe."""
    width = terminal.width() if width is None else width
    lines: list[str] = []
    for run in runs:
        ident = run.identity
        doc = run.cycle.document
        head = f"GPU {ident.index} {ident.name} {ident.uuid}" if ident else device_head(doc)
        reason = f" ({run.cycle.reason})" if run.cycle.reason else ""
        lines += terminal.wrap(f"{head}: {run.cycle.result}{reason}", width, "", "    ")
        if doc is not None:
            sw = doc.software
            known = [
                ("torch", sw.torch),
                ("CUDA", sw.cuda),
                ("cuBLAS", sw.cublas),
                ("driver", sw.driver),
            ]
            shown = [f"{name} {value}" for name, value in known if value is not None]
            if sw.gpu_name or (sw.device and sw.device != "cpu"):  # the head names the CPU
                shown.append(sw.gpu_name or str(sw.device))
            lines += terminal.wrap(", ".join(shown), width, "  ", "    ")
        if not run.figures or doc is None:
            continue
        lines += figure_table(run.figures, width, cpu=on_cpu(doc))
        bw = doc.bandwidth
        if bw is not None and bw.delivered is not None:
            peak = f", peak {bw.peak / 1e12:.2f}" if bw.peak is not None else ""
            lines += terminal.wrap(
                f"memory copy bandwidth: {bw.delivered / 1e12:.2f} TB/s delivered{peak} "
                "(read+write)",
                width,
                "  ",
                "    ",
            )
        for line in transfer_lines(doc):
            deeper = "  " * (1 + (len(line) - len(line.lstrip(" "))) // 2)
            lines += terminal.wrap(line.strip(), width, "  " + deeper[2:], deeper + "    ")
        cond = doc.conditions
        if cond.samples:
            reasons = decode_reasons(cond.clock_event_reasons_seen or 0)
            sm = cond.mean_sm_clock_hertz
            lines += terminal.wrap(
                f"during the probe: GPU max {fmt(cond.max_gpu_temperature_celsius, '.0f')} °C, "
                f"memory max {fmt(cond.max_memory_temperature_celsius, '.0f')} °C, SM clock mean "
                f"{fmt(None if sm is None else sm / 1e6, '.0f')} MHz, power mean "
                f"{fmt(cond.mean_power_watts, '.0f')} W, reasons: {', '.join(reasons) or 'none'}",
                width,
                "  ",
                "    ",
            )
        if doc.gpu_busy_seconds is not None:
            busy = "CPU" if on_cpu(doc) else "GPU"
            lines.append(f"  {busy}-busy time of the cycle: {doc.gpu_busy_seconds:.2f} s")
        decode = int4_ratio(run.figures)
        if decode:
            lines += terminal.wrap(decode, width, "  ", "    ")
        if run.verdict is not None:
            lines += terminal.wrap(verdict_text(run.verdict, run.beside), width, "", "    ")
    return "".join(line + "\n" for line in lines)


def verdict_text(v: CycleVerdict, beside: str = "") -> str:
    """``verdict: slower than its baseline: 19 of 19 kernels below 0.90 of it ...``."""
    meanwhile = f"; while {beside} used the GPU" if beside else ""
    low = v.lowest
    if v.status == "not judged" or low is None:
        return f"verdict: not judged: {v.why_not}{meanwhile}"
    lowest = f"the lowest {kernel_label(low)} at {low.efficiency or 0.0:.2f}"
    band = f"the probe's {NOISE_BAND * 100:.0f} % noise band"
    if v.status == "slower":
        return (
            f"verdict: slower than its baseline: {len(v.slower)} of {len(v.judged)} kernels "
            f"below {SLOWER_BELOW:.2f} of it, past {band}; {lowest}{meanwhile}"
        )
    return (
        f"verdict: as fast as its baseline, within {band}: {len(v.judged)} kernels at "
        f"{SLOWER_BELOW:.2f} of it or above ({lowest}){meanwhile}"
    )


def kernel_label(f: GemmFigure) -> str:
    return f"{f.dtype} {f.shape}" + (f" beta={f.beta}" if f.beta else "")


TABLE_HEADER = (
    "dtype",
    "shape",
    "kind",
    "unit",
    "delivered",
    "peak",
    "baseline",
    "eff",
    "ref",
    "of ref",
    "note",
)
_RIGHT = {4, 5, 6, 7, 8, 9}


def figure_table(figures: list[GemmFigure], width: int, cpu: bool = False) -> list[str]:
    """One row per kernel; a note is a number in the row and its whole text below the table
    (one number per distinct text); the baseline columns are left out while no kernel has a
    baseline (the verdict below the GPU's lines says why); where a peak reads below its
    delivered figure the table says why (on a ``cpu`` or a GPU), and the references' kinds are
    named below."""
    notes: dict[str, int] = {}
    rows = []
    for f in figures:
        ref = f.reference if f.kind == "compute" else None
        note = f.reason or ("" if f.status == "ok" else f.status)
        if f.beta:
            note = ("beta=1: C += A@B, the accumulating GEMM. " + note).strip()
        mark = f"[{notes.setdefault(note, len(notes) + 1)}]" if note else ""
        rows.append(
            [
                f.dtype,
                f.shape,
                f.kind,
                throughput_unit(f.dtype),
                tflops(f.delivered),
                tflops(f.peak),
                tflops(f.baseline.tflops if f.baseline else None),
                fmt(f.efficiency, ".2f"),
                "-" if ref is None else f"{ref.tflops:g}",
                fmt(f.reference_efficiency, ".2f"),
                mark,
            ]
        )
    header = list(TABLE_HEADER)
    learned = any(f.baseline is not None for f in figures)
    if not learned:  # two columns of dashes: say it once instead
        header = header[:6] + header[8:]
        rows = [r[:6] + r[8:] for r in rows]
    right = _RIGHT if learned else {4, 5, 6, 7}
    lines = terminal.table(header, rows, width, right=right, indent="  ")
    for note, number in notes.items():
        lines += terminal.wrap(note, width, f"  [{number}] ")
    below = [f for f in figures if f.peak is not None and f.delivered and f.peak < f.delivered]
    if below:
        counted = f"{len(below)} row{'s' if len(below) != 1 else ''}"
        why = _PEAK_BELOW.format(n=counted) + ("" if cpu else _PEAK_BELOW_GPU)
        lines += terminal.wrap(why, width, "  ")
    named: dict[str, str] = {}  # dtype -> its reference's one name (Reference.label)
    for f in figures:
        if f.reference is not None and f.kind == "compute":
            named.setdefault(f.dtype, f.reference.label)
    if named:
        model = next(f.reference.gpu_model for f in figures if f.reference is not None)
        kinds = sorted({REFERENCE_KINDS[f.reference.kind] for f in figures if f.reference})
        lines += terminal.wrap(
            f"ref: the published {model} figure at compute shapes: "
            + ", ".join(f"{dtype} {label}" for dtype, label in named.items())
            + f" ({'; '.join(kinds)})",
            width,
            "  ",
        )
    return lines


# Why a peak (the median iteration) can read below delivered (the batch's total time): the worker
# times them as probe/worker.py says ("Delivered and peak"); on the H200 idle decode batches
# delivered 1.01-1.14x their peak.
_PEAK_BELOW = (
    "peak below delivered ({n}): delivered is the batch's mean iteration (its total "
    "time), peak its median one; the mean is the faster where a few iterations ran fast"
)
_PEAK_BELOW_GPU = (
    "; a decode kernel's peak comes from a short batch with events around each iteration, "
    "which reads low beside its batch replayed as a CUDA graph"
)


REFERENCE_KINDS = {
    "mamf": "MAMF: the best measured by mamf-finder",
    "datasheet_dense": "datasheet: the dense peak",
}


def int4_ratio(figures: list[GemmFigure]) -> str | None:
    by = {(f.dtype, f.shape): f for f in figures if f.kind == "decode" and f.beta == 0}
    for (dtype, shape), f in by.items():
        if dtype != "int4" or f.delivered is None:
            continue
        for other in ("bf16", "fp16"):
            o = by.get((other, shape))
            if o is not None and o.delivered:
                delivered = f"{f.delivered / o.delivered:.2f}x"
                if not (f.peak and o.peak):
                    return f"int4 / {other} at decode shape {shape}: {delivered} delivered"
                # the hot probe, soak and alert compare the median iterations' ratio
                return (
                    f"int4 / {other} at decode shape {shape}: {f.peak / o.peak:.2f}x from the "
                    f"median iterations ({delivered} delivered)"
                )
    return None


def figure_json(f: GemmFigure) -> dict[str, Any]:
    return {
        "dtype": f.dtype,
        "shape": f.shape,
        "kind": f.kind,
        "beta": f.beta,
        "status": f.status,
        "reason": f.reason,
        "delivered_tflops": f.delivered,
        "peak_tflops": f.peak,
        "baseline_tflops": f.baseline.tflops if f.baseline else None,
        "baseline_source": f.baseline.source if f.baseline else None,
        "efficiency": f.efficiency,
        "reference": None
        if f.reference is None
        else {
            "tflops": f.reference.tflops,
            "kind": f.reference.kind,
            "gpu_model": f.reference.gpu_model,
            "source": f.reference.source,
        },
        "reference_efficiency": f.reference_efficiency,
        "counts_toward_baseline": f.counts_toward_baseline,
    }


def transfer_lines(doc: WorkerDocument) -> list[str]:
    """The host-device copies, one line per memory kind: GB/s each way, small and large."""
    measured = [t for t in doc.transfers if t.delivered is not None]
    if not measured:
        return []
    lines = ["host-device copies (GB/s, h2d / d2h):"]
    for memory in ("pinned", "pageable"):
        parts = []
        for size in sorted({t.size_bytes for t in measured if t.memory == memory}):
            rates = {
                t.direction: t.delivered
                for t in measured
                if t.memory == memory and t.size_bytes == size
            }
            shown = " / ".join(
                "-" if rates.get(d) is None else f"{(rates[d] or 0) / 1e9:.1f}"
                for d in ("h2d", "d2h")
            )
            label = next(t.label for t in measured if t.size_bytes == size).split()[-1]
            parts.append(f"{label} {shown}")
        if parts:
            lines.append(f"  {memory}: " + ", ".join(parts))
    small = {(t.memory, t.direction): t.delivered for t in measured if t.size_bytes < 1 << 20}
    for direction in ("h2d", "d2h"):
        pinned, pageable = small.get(("pinned", direction)), small.get(("pageable", direction))
        if pinned and pageable and pinned / pageable >= SLOW_PAGEABLE_RATIO:
            lines.append(
                f"  small pageable {direction} copies are {pinned / pageable:.0f}x slower than "
                "pinned: pin the host buffers of many small copies (pin_memory=True)"
            )
    return lines
