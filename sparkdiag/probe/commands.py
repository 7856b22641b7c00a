"""``sparkdiag probe``, ``bench`` and ``baseline``: the probe from a terminal."""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from sparkdiag.probe.baseline import BaselineStore, BaselineStoreError, open_store
from sparkdiag.probe.evaluate import GemmFigure, evaluate
from sparkdiag.probe.runner import ProbeCycle, run_worker
from sparkdiag.probe.scheduler import FixtureLauncher
from sparkdiag.telemetry.snapshot import GpuIdentity, GpuSample

DTYPES = ("bf16", "fp16", "tf32", "fp8", "int8", "int4", "nvfp4")
EXIT_OK, EXIT_NOT_RUN, EXIT_FAILED = 0, 1, 3


@dataclass(frozen=True)
class GpuRun:
    identity: GpuIdentity | None
    cycle: ProbeCycle
    figures: list[GemmFigure]


def _store(state_dir: Path | None, create: bool = True) -> BaselineStore:
    try:
        return open_store(state_dir, create)
    except BaselineStoreError as exc:
        raise click.ClickException(str(exc)) from None


def _identities(nvml_fixture: Path | None) -> tuple[list[GpuSample], str | None]:
    """The GPUs NVML sees (one poll, for their uuid, name and busy state)."""
    from sparkdiag.sources.backends import make_backend
    from sparkdiag.sources.fixture import FixtureError
    from sparkdiag.sources.gpu import GpuSource

    try:
        source = GpuSource(make_backend(nvml_fixture))
    except FixtureError as exc:
        raise click.BadParameter(str(exc), param_hint="--nvml-fixture") from None
    if not source.start():
        return [], source.unavailable_reason
    try:
        source.backend.advance()
        return [g for g in source.read() if g.up], None
    finally:
        source.stop()


def _context(rootfs: Path) -> str:
    from sparkdiag.sources.context import detect_context

    return detect_context(rootfs).context


def _progress_printer(label: str) -> Callable[[dict[str, Any]], None] | None:
    if not sys.stderr.isatty():
        return None

    def show(item: dict[str, Any]) -> None:
        tflops = item.get("tflops")
        figure = (
            f"{tflops:9.1f}" if isinstance(tflops, (int, float)) else f"{item.get('status'):>9}"
        )
        click.echo(
            f"\r{label} [{item['done']}/{item['total']}] {item['dtype']:5} {item['shape']:>18}"
            f" {figure}   ",
            err=True,
            nl=item["done"] == item["total"],
        )

    return show


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _tflops(value: float | None) -> str:
    """Throughput with three significant digits below 100 (CPU and decode figures are small)."""
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 100 else f"{value:.3g}"


def render_probe_table(runs: list[GpuRun]) -> str:
    out = io.StringIO()
    for run in runs:
        ident = run.identity
        doc = run.cycle.document or {}
        head = f"GPU {ident.index} {ident.name} {ident.uuid}" if ident else "default device"
        sw = doc.get("software") or {}
        out.write(
            f"{head}: {run.cycle.result}"
            + (f" ({run.cycle.reason})" if run.cycle.reason else "")
            + "\n"
        )
        if sw:
            out.write(
                f"  torch {sw.get('torch')}, CUDA {sw.get('cuda')}, cuBLAS {sw.get('cublas')}, "
                f"driver {sw.get('driver')}, {sw.get('gpu_name') or sw.get('device')}\n"
            )
        if not run.figures:
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
                f.dtype, f.shape, f.kind, _tflops(f.tflops),
                _tflops(f.baseline.tflops if f.baseline else None),
                _fmt(f.efficiency, ".2f"),
                f"{ref.tflops:g} {ref.kind}" if ref and f.kind == "compute" else "-",
                _fmt(f.reference_efficiency, ".2f"),
                note[:60],
            ))  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            cells = [
                c.rjust(w) if 3 <= i <= 7 else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=False))
            ]
            out.write("  " + "  ".join(cells) + "  " + r[-1] + "\n")
        bw = doc.get("bandwidth") or {}
        if bw.get("status") == "ok":
            out.write(
                f"  memory copy bandwidth: {bw['bytes_per_second'] / 1e12:.2f} TB/s (read+write)\n"
            )
        cond = doc.get("conditions") or {}
        if cond.get("samples"):
            from sparkdiag.sources.gpu import decode_reasons

            reasons = decode_reasons(int(cond.get("clock_event_reasons_seen") or 0))
            gpu_t = _fmt(cond.get("max_gpu_temperature_celsius"), ".0f")
            mem_t = _fmt(cond.get("max_memory_temperature_celsius"), ".0f")
            sm = cond.get("mean_sm_clock_hertz")
            sm_mhz = _fmt(None if sm is None else sm / 1e6, ".0f")
            power = _fmt(cond.get("mean_power_watts"), ".0f")
            out.write(
                f"  during the probe: GPU max {gpu_t} °C, memory max {mem_t} °C, SM clock mean "
                f"{sm_mhz} MHz, power mean {power} W, reasons: {', '.join(reasons) or 'none'}\n"
            )
        if doc.get("gpu_busy_seconds") is not None:
            out.write(f"  GPU-busy time of the cycle: {doc['gpu_busy_seconds']:.2f} s\n")
        decode = _int4_ratio(run.figures)
        if decode:
            out.write(f"  {decode}\n")
    return out.getvalue()


def _int4_ratio(figures: list[GemmFigure]) -> str | None:
    by = {(f.dtype, f.shape): f for f in figures if f.kind == "decode" and f.beta == 0}
    for (dtype, shape), f in by.items():
        if dtype != "int4" or f.tflops is None:
            continue
        for other in ("bf16", "fp16"):
            o = by.get((other, shape))
            if o is not None and o.tflops:
                return f"int4 / {other} at decode shape {shape}: {f.tflops / o.tflops:.2f}x"
    return None


def _figure_json(f: GemmFigure) -> dict[str, Any]:
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


@click.command()
@click.option(
    "--dtype",
    "dtypes",
    multiple=True,
    type=click.Choice(DTYPES),
    help="Only these dtypes (repeatable). Default: all the GPU supports.",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    metavar="MxNxK",
    help="Only these shapes (repeatable). Default: the suite sized to the GPU.",
)
@click.option(
    "--gpu", "gpus", multiple=True, type=int, help="NVML index (repeatable); default all."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
@click.option(
    "--probe-when",
    type=click.Choice(["idle", "always"]),
    default="idle",
    show_default=True,
    help="idle: skip a GPU another process computes on; always: measure anyway.",
)
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds per GPU.")
@click.option(
    "--record/--no-record",
    default=True,
    show_default=True,
    help="Record the results in the baseline store (teaches a new baseline).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the baselines are (default as the daemon's).",
)
@click.option(
    "--nvml-fixture",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Take the GPUs from a recorded NVML fixture.",
)
@click.option(
    "--probe-fixture",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Replay recorded worker documents instead of running the worker.",
)
@click.option(
    "--path.rootfs",
    "rootfs",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/"),
    help="Root to detect the execution context under.",
)
@click.option("--small", is_flag=True, help="Tiny shapes (a smoke test; CPU).")
def probe(
    dtypes: tuple[str, ...], shapes: tuple[str, ...], gpus: tuple[int, ...], as_json: bool,
    probe_when: str, timeout: float, record: bool, state_dir: Path | None,
    nvml_fixture: Path | None, probe_fixture: Path | None, rootfs: Path, small: bool,
) -> None:  # fmt: skip
    """Run one probe cycle now and compare it with the baseline and the reference.

    Measures every dtype and shape of the suite (or those chosen) on each GPU in a worker
    subprocess, and prints throughput, the stored baseline, efficiency, and the published
    reference for the GPU model.

    Exit status: 0 measured; 1 skipped (GPU busy) or nothing supported; 2 usage error;
    3 the worker failed or timed out.
    """
    for shape in shapes:
        _check_shape(shape)
    samples, why = _identities(nvml_fixture)
    if gpus:
        samples = [g for g in samples if g.identity.index in gpus]
        if not samples:
            raise click.BadParameter(
                f"no GPU with index {', '.join(map(str, gpus))}", param_hint="--gpu"
            )
    context = _context(rootfs)
    args = ["--probe-when", probe_when, "--progress"]
    for d in dtypes:
        args += ["--dtype", d]
    for s in shapes:
        args += ["--shape", s]
    if small:
        args.append("--small")
    fixture = FixtureLauncher(probe_fixture) if probe_fixture else None
    store = _store(state_dir) if record or state_dir else None
    runs: list[GpuRun] = []
    targets: list[GpuSample | None] = list(samples) if samples else [None]
    if not samples and why and not as_json:
        click.echo(
            f"NVML unavailable ({why}): probing the default torch device, no baseline", err=True
        )
    try:
        for gpu in targets:
            label = f"GPU {gpu.identity.index}" if gpu else "probe"
            if fixture is not None:
                cycle = fixture(gpu, lambda _pid: None) if gpu else fixture(None, lambda _pid: None)  # type: ignore[arg-type]
            else:
                env = dict(os.environ)
                worker_args = list(args)
                if gpu is not None:
                    env["CUDA_VISIBLE_DEVICES"] = gpu.identity.uuid
                    worker_args = ["--device", "cuda:0", *worker_args]
                show = None if as_json else _progress_printer(label)
                cycle = run_worker(args=worker_args, timeout=timeout, env=env, on_progress=show)
            figures: list[GemmFigure] = []
            if cycle.document and cycle.result in ("ok", "error", "skipped_busy"):
                uuid = gpu.identity.uuid if gpu else ""
                name = (
                    gpu.identity.name
                    if gpu
                    else str((cycle.document.get("software") or {}).get("gpu_name") or "")
                )
                learn = record and cycle.result == "ok"
                target = store if gpu else None
                figures = evaluate(cycle.document, uuid, name, context, target, record=learn)
            runs.append(GpuRun(gpu.identity if gpu else None, cycle, figures))
    finally:
        if store is not None:
            store.close()
    if as_json:
        doc = {
            "schema": "sparkdiag-probe-report/1",
            "context": context,
            "gpus": [
                {
                    "gpu": r.identity.index if r.identity else None,
                    "uuid": r.identity.uuid if r.identity else None,
                    "name": r.identity.name if r.identity else None,
                    "result": r.cycle.result,
                    "reason": r.cycle.reason,
                    "figures": [_figure_json(f) for f in r.figures],
                    "worker": r.cycle.document,
                    "stderr_tail": r.cycle.stderr_tail
                    if r.cycle.result in ("error", "timeout")
                    else "",
                }
                for r in runs
            ],
        }
        click.echo(json.dumps(doc, indent=1))
    else:
        click.echo(render_probe_table(runs), nl=False)
    results = {r.cycle.result for r in runs}
    if results & {"error", "timeout"}:
        sys.exit(EXIT_FAILED)
    if results <= {"ok"}:
        sys.exit(EXIT_OK)
    sys.exit(EXIT_NOT_RUN)


def _check_shape(shape: str) -> tuple[int, int, int]:
    parts = shape.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise click.BadParameter(
            f"{shape!r} is not MxNxK (for example 4096x11008x4096)", param_hint="--shape"
        )
    return int(parts[0]), int(parts[1]), int(parts[2])


def parse_range(text: str) -> list[int]:
    """``4096``, ``1024,2048,4096`` or ``START:STOP:STEP`` (inclusive) -> sizes."""
    try:
        if ":" in text:
            start, stop, step = (int(p) for p in text.split(":"))
            if step <= 0 or start <= 0 or stop < start:
                raise ValueError
            return list(range(start, stop + 1, step))
        values = [int(p) for p in text.split(",")]
        if not values or min(values) <= 0:
            raise ValueError
        return values
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: give N, N,N,... or START:STOP:STEP with positive integers"
        ) from None


@click.command()
@click.option(
    "--dtype",
    "dtypes",
    multiple=True,
    type=click.Choice(DTYPES),
    default=("bf16",),
    show_default=True,
    help="Dtypes to sweep (repeatable).",
)
@click.option(
    "--m",
    "m_range",
    default="1024:16384:1024",
    show_default=True,
    help="M sizes: N, list or START:STOP:STEP.",
)
@click.option(
    "--n", "n_range", default=None, help="N sizes (default: the same as M, square shapes)."
)
@click.option(
    "--k", "k_range", default=None, help="K sizes (default: the same as M, square shapes)."
)
@click.option(
    "--iters", type=int, default=50, show_default=True, help="Timed iterations per shape."
)
@click.option(
    "--warmup", type=int, default=10, show_default=True, help="Warm-up iterations per shape."
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write every result to this CSV file.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the worker documents to this JSON file.",
)
@click.option(
    "--timeout", type=float, default=1800.0, show_default=True, help="Seconds for the whole sweep."
)
@click.option("--device", default=None, help="cuda:N or cpu (default: the first CUDA device).")
def bench(
    dtypes: tuple[str, ...], m_range: str, n_range: str | None, k_range: str | None, iters: int,
    warmup: int, csv_path: Path | None, json_path: Path | None, timeout: float, device: str | None,
) -> None:  # fmt: skip
    """A longer mamf-style sweep: the best achievable matmul throughput over a range of shapes.

    Square shapes by default (M=N=K from --m); give --n and --k for the full grid (it grows as
    their product). Runs in one worker subprocess, with a progress bar; the GPU is not checked
    for other users (this is a benchmark you start on purpose). Prints the best shape per dtype
    (the MAMF) and the median over the sweep.
    """
    ms = parse_range(m_range)
    if n_range is None and k_range is None:
        shapes = [f"{m}x{m}x{m}" for m in ms]
    else:
        ns = parse_range(n_range) if n_range else ms
        ks = parse_range(k_range) if k_range else ms
        shapes = [f"{m}x{n}x{k}" for m in ms for n in ns for k in ks]
    if len(shapes) * len(dtypes) > 5000:
        raise click.BadParameter(
            f"{len(shapes) * len(dtypes)} kernels is too many; narrow the ranges"
        )
    args = ["--probe-when", "always", "--no-bandwidth", "--progress", "--iters", str(iters),
            "--warmup", str(warmup), "--budget-seconds", str(max(timeout, 1.0))]  # fmt: skip
    if device:
        args += ["--device", device]
    for d in dtypes:
        args += ["--dtype", d]
    for s in shapes:
        args += ["--shape", s]
    total = len(shapes) * len(dtypes) + (len(shapes) if "bf16" in dtypes else 0)
    with click.progressbar(length=total, label="sweeping", file=sys.stderr, show_pos=True) as bar:
        cycle = run_worker(args=args, timeout=timeout, on_progress=lambda item: bar.update(1))
    doc = cycle.document or {}
    results = [r for r in doc.get("results") or [] if r.get("beta", 0) == 0]
    if json_path:
        json_path.write_text(json.dumps(doc, indent=1))
    if csv_path:
        with csv_path.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(
                [
                    "dtype",
                    "shape",
                    "status",
                    "tflops",
                    "median_ms",
                    "iters",
                    "max_rel_error",
                    "reason",
                ]
            )
            for r in results:
                writer.writerow(
                    [
                        r.get(k)
                        for k in (
                            "dtype",
                            "shape",
                            "status",
                            "tflops",
                            "median_ms",
                            "iters",
                            "max_rel_error",
                            "reason",
                        )
                    ]
                )
    if cycle.result in ("error", "timeout") and not results:
        raise click.ClickException(f"sweep failed: {cycle.reason}")
    sw = doc.get("software") or {}
    click.echo(
        f"{sw.get('gpu_name') or sw.get('device')}: torch {sw.get('torch')}, CUDA {sw.get('cuda')}"
    )
    for dtype in dtypes:
        ok = [r for r in results if r["dtype"] == dtype and r.get("status") == "ok"]
        if not ok:
            reasons = {r.get("reason") for r in results if r["dtype"] == dtype}
            click.echo(f"{dtype}: no result ({'; '.join(str(x) for x in reasons)})")
            continue
        best = max(ok, key=lambda r: r["tflops"])
        median = statistics.median(r["tflops"] for r in ok)
        click.echo(f"{dtype}: best {best['tflops']:.1f} TFLOPS at {best['shape']} (MAMF); "
                   f"median {median:.1f} over {len(ok)} shapes")  # fmt: skip
    if cycle.result in ("error", "timeout"):
        click.echo(f"warning: {cycle.reason}", err=True)
        sys.exit(EXIT_FAILED)


@click.group()
def baseline() -> None:
    """Show, pin or reset the healthy baselines the probe is compared with."""


def _filtered(store: BaselineStore, uuid: str | None, dtype: str | None, shape: str | None,
              context: str | None) -> list[Any]:  # fmt: skip
    return [
        b for b in store.list()
        if (uuid is None or b.key.gpu_uuid.startswith(uuid))
        and (dtype is None or b.key.dtype == dtype)
        and (shape is None or b.key.shape == shape)
        and (context is None or b.key.context == context)
    ]  # fmt: skip


_FILTERS = [
    click.option("--uuid", default=None, help="GPU uuid (a prefix is enough)."),
    click.option("--dtype", default=None, help="dtype, e.g. bf16 (bf16:beta1 for accumulate)."),
    click.option("--shape", default=None, help="MxNxK."),
    click.option("--context", type=click.Choice(["native", "container"]), default=None),
    click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None),
]


def _with_filters(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_FILTERS):
        fn = option(fn)
    return fn


@baseline.command("show")
@_with_filters
@click.option("--json", "as_json", is_flag=True)
def baseline_show(uuid: str | None, dtype: str | None, shape: str | None, context: str | None,
                  state_dir: Path | None, as_json: bool) -> None:  # fmt: skip
    """List baselines (every software identity: old ones are kept)."""
    with _store(state_dir, create=False) as store:
        rows = _filtered(store, uuid, dtype, shape, context)
    if as_json:
        click.echo(json.dumps([
            {**b.key.__dict__, "tflops": b.tflops, "source": b.source, "runs": b.runs,
             "created_at": b.created_at, "updated_at": b.updated_at, "note": b.note}
            for b in rows
        ], indent=1))  # fmt: skip
        return
    if not rows:
        click.echo("no baselines match")
        return
    for b in rows:
        k = b.key
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(b.updated_at))
        note = f"  # {b.note}" if b.note else ""
        click.echo(
            f"{k.gpu_uuid[:12]}.. {k.dtype:10} {k.shape:>18} {k.context:9} {b.tflops:9.1f} "
            f"{b.source:7} runs={b.runs} driver={k.driver} torch={k.torch} cuda={k.cuda} "
            f"{when}{note}"
        )


@baseline.command("pin")
@_with_filters
@click.option(
    "--tflops", type=float, default=None, help="Value to pin; default: keep the current value."
)
@click.option("--note", default="", help="Why (shown by show).")
@click.option("--all", "all_matches", is_flag=True, help="Pin every matching baseline.")
def baseline_pin(
    uuid: str | None,
    dtype: str | None,
    shape: str | None,
    context: str | None,
    state_dir: Path | None,
    tflops: float | None,
    note: str,
    all_matches: bool,
) -> None:
    """Pin baselines: later runs never move a pinned baseline."""
    with _store(state_dir, create=False) as store:
        rows = _filtered(store, uuid, dtype, shape, context)
        if not rows:
            raise click.ClickException("no baseline matches; run 'sparkdiag probe' first")
        if len(rows) > 1 and not all_matches:
            raise click.ClickException(
                f"{len(rows)} baselines match; narrow the filters or pass --all"
            )
        for b in rows:
            pinned = store.pin(b.key, tflops if tflops is not None else b.tflops, note)
            k = pinned.key
            click.echo(f"pinned {k.dtype} {k.shape} {k.context} at {pinned.tflops:.1f}")


@baseline.command("reset")
@_with_filters
@click.option("--all", "all_matches", is_flag=True, help="Required when no filter is given.")
def baseline_reset(uuid: str | None, dtype: str | None, shape: str | None, context: str | None,
                   state_dir: Path | None, all_matches: bool) -> None:  # fmt: skip
    """Forget baselines and their runs, so that they are learned again from the next runs."""
    if not (uuid or dtype or shape or context or all_matches):
        raise click.UsageError(
            "give --uuid/--dtype/--shape/--context, or --all to reset everything"
        )
    with _store(state_dir, create=False) as store:
        keys = [b.key for b in _filtered(store, uuid, dtype, shape, context)]
        removed = 0
        for key in keys:
            removed += store.reset(key.gpu_uuid, key.dtype, key.shape)
    click.echo(f"removed {removed} baseline(s)")
