"""The probe's terminal table and JSON figures, shared by ``sparkdiag probe`` (and ``soak``)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import click

from sparkdiag.baseline.evaluate import GemmFigure
from sparkdiag.probe.document import Progress, WorkerDocument
from sparkdiag.probe.runner import ProbeCycle
from sparkdiag.snapshot import GpuIdentity
from sparkdiag.sources.gpu import decode_reasons

# Small pageable copies this many times slower than pinned ones are worth saying (GB10 owners
# reported about 50x with many small host-to-device copies from pageable memory).
SLOW_PAGEABLE_RATIO = 10.0


@dataclass(frozen=True)
class GpuRun:
    identity: GpuIdentity | None
    cycle: ProbeCycle
    figures: list[GemmFigure]


def progress_printer(label: str, enabled: bool) -> Any:
    """A progress callback that rewrites one stderr line per kernel (None when not wanted)."""
    if not enabled:
        return None

    def show(item: Progress) -> None:
        r = item.result
        if r is None:  # a soak window: not a kernel of the suite
            return
        figure = f"{r.delivered:9.1f}" if r.delivered is not None else f"{r.status:>9}"
        click.echo(
            f"\r{label} [{item.done}/{item.total}] {r.dtype:5} {r.shape:>18} {figure}   ",
            err=True,
            nl=item.done == item.total,
        )

    return show


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def tflops(value: float | None) -> str:
    """Throughput with three significant digits below 100 (CPU and decode figures are small)."""
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 100 else f"{value:.3g}"


def render_probe_table(runs: list[GpuRun]) -> str:
    out = io.StringIO()
    for run in runs:
        ident = run.identity
        doc = run.cycle.document
        head = f"GPU {ident.index} {ident.name} {ident.uuid}" if ident else "default device"
        out.write(
            f"{head}: {run.cycle.result}"
            + (f" ({run.cycle.reason})" if run.cycle.reason else "")
            + "\n"
        )
        if doc is not None:
            sw = doc.software
            out.write(
                f"  torch {sw.torch}, CUDA {sw.cuda}, cuBLAS {sw.cublas}, "
                f"driver {sw.driver}, {sw.gpu_name or sw.device}\n"
            )
        if not run.figures or doc is None:
            continue
        rows = [
            ("dtype", "shape", "kind", "delivered", "peak", "baseline", "eff", "reference",
             "ref eff", "note")
        ]  # fmt: skip
        for f in run.figures:
            ref = f.reference
            note = f.reason or ("" if f.status == "ok" else f.status)
            if f.beta:
                note = ("beta=1 (C += A@B) " + note).strip()
            rows.append((
                f.dtype, f.shape, f.kind, tflops(f.delivered), tflops(f.peak),
                tflops(f.baseline.tflops if f.baseline else None),
                fmt(f.efficiency, ".2f"),
                ref.label if ref and f.kind == "compute" else "-",
                fmt(f.reference_efficiency, ".2f"),
                note[:60],
            ))  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            cells = [
                c.rjust(w) if 3 <= i <= 8 else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=False))
            ]
            out.write("  " + "  ".join(cells) + "  " + r[-1] + "\n")
        bw = doc.bandwidth
        if bw is not None and bw.delivered is not None:
            peak = f", peak {bw.peak / 1e12:.2f}" if bw.peak is not None else ""
            out.write(
                f"  memory copy bandwidth: {bw.delivered / 1e12:.2f} TB/s delivered{peak} "
                "(read+write)\n"
            )
        for line in transfer_lines(doc):
            out.write(f"  {line}\n")
        cond = doc.conditions
        if cond.samples:
            reasons = decode_reasons(cond.clock_event_reasons_seen or 0)
            sm = cond.mean_sm_clock_hertz
            out.write(
                f"  during the probe: GPU max {fmt(cond.max_gpu_temperature_celsius, '.0f')} °C, "
                f"memory max {fmt(cond.max_memory_temperature_celsius, '.0f')} °C, SM clock mean "
                f"{fmt(None if sm is None else sm / 1e6, '.0f')} MHz, power mean "
                f"{fmt(cond.mean_power_watts, '.0f')} W, reasons: {', '.join(reasons) or 'none'}\n"
            )
        if doc.gpu_busy_seconds is not None:
            out.write(f"  GPU-busy time of the cycle: {doc.gpu_busy_seconds:.2f} s\n")
        decode = int4_ratio(run.figures)
        if decode:
            out.write(f"  {decode}\n")
    return out.getvalue()


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
        "dtype": f.dtype, "shape": f.shape, "kind": f.kind, "beta": f.beta, "status": f.status,
        "reason": f.reason, "delivered_tflops": f.delivered, "peak_tflops": f.peak,
        "baseline_tflops": f.baseline.tflops if f.baseline else None,
        "baseline_source": f.baseline.source if f.baseline else None,
        "efficiency": f.efficiency,
        "reference": None if f.reference is None else {
            "tflops": f.reference.tflops, "kind": f.reference.kind,
            "gpu_model": f.reference.gpu_model, "source": f.reference.source,
        },
        "reference_efficiency": f.reference_efficiency,
        "counts_toward_baseline": f.counts_toward_baseline,
    }  # fmt: skip


def transfer_lines(doc: WorkerDocument) -> list[str]:
    """The host-device copies, one line per memory kind: GB/s each way, small and large."""
    measured = [t for t in doc.transfers if t.delivered is not None]
    if not measured:
        return []
    lines = ["host-device copies (GB/s, h2d / d2h):"]
    for memory in ("pinned", "pageable"):
        parts = []
        for size in sorted({t.size_bytes for t in measured if t.memory == memory}):
            rates = {t.direction: t.delivered for t in measured
                     if t.memory == memory and t.size_bytes == size}  # fmt: skip
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
