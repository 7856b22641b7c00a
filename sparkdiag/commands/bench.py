"""``sparkdiag bench``: a longer mamf-style sweep over shape ranges, with CSV and JSON output."""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import click

from sparkdiag import terminal
from sparkdiag.errors import Exit, SparkdiagError, UsageError
from sparkdiag.flags import file_option, settings_from, settings_options, worker_options
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.probe.runner import run_worker
from sparkdiag.probe.worker import throughput_unit

CSV_COLUMNS = (
    "dtype", "shape", "status", "peak_tflops", "delivered_tflops", "median_ms", "total_ms",
    "iters", "max_rel_error", "reason",
)  # fmt: skip


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


def _range(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    return None if value is None else parse_range(value)


@click.command()
@worker_options("--dtype", "--small", "--device", dtypes=("bf16",))
@click.option(
    "--m",
    "m_range",
    default="1024:16384:1024",
    show_default=True,
    callback=_range,
    help="M sizes: N, list or START:STOP:STEP.",
)
@click.option(
    "--n", "n_range", default=None, callback=_range,
    help="N sizes (default: the same as M, square shapes).",
)  # fmt: skip
@click.option(
    "--k", "k_range", default=None, callback=_range,
    help="K sizes (default: the same as M, square shapes).",
)  # fmt: skip
@worker_options("--iters", "--warmup", iters=50, warmup=10)
@file_option("--csv", "csv_path", "Write every result to this CSV file.")
@file_option("--json", "json_path", "Write the worker documents to this JSON file.")
@settings_options("bench")
def bench(
    dtypes: list[str], small: bool, device: str | None, m_range: list[int],
    n_range: list[int] | None, k_range: list[int] | None, iters: int, warmup: int,
    csv_path: Path | None, json_path: Path | None, **given: Any,
) -> None:  # fmt: skip
    """A longer mamf-style sweep: the best achievable matmul throughput over a range of shapes.

    Square shapes by default (M=N=K from --m); give --n and --k for the full grid (it grows as
    their product). Runs in one worker subprocess, with a progress bar; the GPU is not checked
    for other users (this is a benchmark you start on purpose). Prints the best shape per dtype
    (the MAMF) and the median over the sweep.

    Exit status: 0 swept; 2 usage error; 3 the worker failed or timed out (what it measured
    before is still written and printed).
    """
    settings = settings_from("bench", given)
    ms = m_range
    if n_range is None and k_range is None:
        shapes = [f"{m}x{m}x{m}" for m in ms]
    else:
        ns = n_range or ms
        ks = k_range or ms
        shapes = [f"{m}x{n}x{k}" for m in ms for n in ns for k in ks]
    if len(shapes) * len(dtypes) > 5000:
        raise UsageError(f"{len(shapes) * len(dtypes)} kernels is too many; narrow the ranges")
    timeout = settings.probe_timeout
    request = WorkerRequest(
        device=device,
        dtypes=tuple(dtypes),
        shapes=tuple(shapes),
        small=small,
        probe_when="always",
        bandwidth=False,
        transfers=False,
        progress=True,
        iters=iters,
        warmup=warmup,
        budget_seconds=max(timeout, 1.0),
    )
    total = len(shapes) * len(dtypes) + (len(shapes) if "bf16" in dtypes else 0)
    with click.progressbar(length=total, label="sweeping", file=sys.stderr, show_pos=True) as bar:
        cycle = run_worker(
            request=request, timeout=timeout, on_progress=lambda _item: bar.update(1)
        )
    doc = cycle.document
    results = [r for r in doc.results if r.beta == 0] if doc else []
    if json_path and doc is not None:
        json_path.write_text(json.dumps(dict(doc.raw), indent=1))
    if csv_path:
        with csv_path.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(CSV_COLUMNS)
            for r in results:
                writer.writerow(
                    [r.dtype, r.shape, r.status, r.peak, r.delivered, r.median_ms, r.total_ms,
                     r.iters, r.max_rel_error, r.reason]
                )  # fmt: skip
    if cycle.result in ("error", "timeout") and not results:
        raise SparkdiagError(f"sweep failed: {cycle.reason}")
    width = terminal.width()
    if doc is not None:
        sw = doc.software
        click.echo(terminal.fill(f"{sw.gpu_name or sw.device}: torch {sw.torch}, CUDA {sw.cuda}",
                                 width, "", "    "))  # fmt: skip
    for dtype in dtypes:
        ok = [r for r in results if r.dtype == dtype and r.peak is not None]
        if not ok:
            reasons = {r.reason for r in results if r.dtype == dtype}
            why = "; ".join(str(x) for x in reasons)
            click.echo(terminal.fill(f"{dtype}: no result ({why})", width, "", "    "))
            continue
        # mamf-finder's figure is per iteration: the peak (median iteration) is comparable
        best = max(ok, key=lambda r: r.peak or 0.0)
        median = statistics.median(r.peak or 0.0 for r in ok)
        unit = throughput_unit(dtype)
        click.echo(terminal.fill(f"{dtype}: best {best.peak:.1f} {unit} at {best.shape} (MAMF); "
                                 f"median {median:.1f} over {len(ok)} shapes", width, "",
                                 "    "))  # fmt: skip
    if cycle.result in ("error", "timeout"):
        click.echo(f"warning: {cycle.reason}", err=True)
        sys.exit(Exit.FAILED)
