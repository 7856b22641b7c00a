"""The probe's terminal table and JSON figures, shared by ``sparkdiag probe`` (and ``soak``)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import click

from sparkdiag.probe.document import Progress
from sparkdiag.probe.evaluate import GemmFigure
from sparkdiag.probe.runner import ProbeCycle
from sparkdiag.sources.gpu import decode_reasons
from sparkdiag.telemetry.snapshot import GpuIdentity


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
        figure = f"{r.tflops:9.1f}" if r.tflops is not None else f"{r.status:>9}"
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
            ("dtype", "shape", "kind", "TFLOPS", "baseline", "eff", "reference", "ref eff", "note")
        ]
        for f in run.figures:
            ref = f.reference
            note = f.reason or ("" if f.status == "ok" else f.status)
            if f.beta:
                note = ("beta=1 (C += A@B) " + note).strip()
            rows.append((
                f.dtype, f.shape, f.kind, tflops(f.tflops),
                tflops(f.baseline.tflops if f.baseline else None),
                fmt(f.efficiency, ".2f"),
                f"{ref.tflops:g} {ref.kind}" if ref and f.kind == "compute" else "-",
                fmt(f.reference_efficiency, ".2f"),
                note[:60],
            ))  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            cells = [
                c.rjust(w) if 3 <= i <= 7 else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=False))
            ]
            out.write("  " + "  ".join(cells) + "  " + r[-1] + "\n")
        bw = doc.bandwidth
        if bw is not None and bw.bytes_per_second is not None:
            out.write(
                f"  memory copy bandwidth: {bw.bytes_per_second / 1e12:.2f} TB/s (read+write)\n"
            )
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
        if dtype != "int4" or f.tflops is None:
            continue
        for other in ("bf16", "fp16"):
            o = by.get((other, shape))
            if o is not None and o.tflops:
                return f"int4 / {other} at decode shape {shape}: {f.tflops / o.tflops:.2f}x"
    return None


def figure_json(f: GemmFigure) -> dict[str, Any]:
    return {
        "dtype": f.dtype, "shape": f.shape, "kind": f.kind, "beta": f.beta, "status": f.status,
        "reason": f.reason, "tflops": f.tflops,
        "baseline_tflops": f.baseline.tflops if f.baseline else None,
        "baseline_source": f.baseline.source if f.baseline else None,
        "efficiency": f.efficiency,
        "reference": None if f.reference is None else {
            "tflops": f.reference.tflops, "kind": f.reference.kind,
            "gpu_model": f.reference.gpu_model, "source": f.reference.source,
        },
        "reference_efficiency": f.reference_efficiency,
        "healthy": f.healthy,
    }  # fmt: skip
