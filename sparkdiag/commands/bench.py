"""``sparkdiag bench``: a longer mamf-style sweep over shape ranges, with CSV and JSON output."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import click

from sparkdiag import terminal
from sparkdiag.commands.common import (
    check_output_path,
    check_shapes,
    gpus_seen,
    is_stdout,
    no_gpu,
    one_stdout,
    require_torch,
    worker_request,
)
from sparkdiag.errors import Exit, SparkdiagError, UsageError
from sparkdiag.flags import file_option, settings_from, settings_options, worker_options
from sparkdiag.lifecycle import Interrupted
from sparkdiag.probe.document import KernelResult, Progress
from sparkdiag.probe.runner import run_worker
from sparkdiag.probe.worker.contract import MAX_DIM, parse_shape, throughput_unit
from sparkdiag.probe.worker.contract import UsageError as ContractUsageError

CSV_COLUMNS = (
    "dtype",
    "shape",
    "status",
    "peak_tflops",
    "delivered_tflops",
    "median_ms",
    "total_ms",
    "iters",
    "max_rel_error",
    "reason",
    # last, so that a reader by position keeps its columns: what peak_ and delivered_tflops
    # are counted in, TOPS for the integer dtypes (found in a review: they read as TFLOPS)
    "unit",
)
M_RANGE = "1024:16384:1024"  # mamf-finder's square sweep
SMALL_M_RANGE = "128:512:128"  # --small: four cubes a CPU sweeps in seconds
MAX_KERNELS = 5000  # a sweep of more is a typo, and would take days
PARTIAL_SCHEMA = "sparkdiag-bench-partial/1"  # --json after Ctrl-C: the kernels measured


def parse_range(text: str) -> list[int]:
    """``4096``, ``1024,2048,4096`` or ``START:STOP:STEP`` (inclusive) -> sizes."""
    sizes: Sequence[int]
    try:
        if ":" in text:
            start, stop, step = (int(p) for p in text.split(":"))
            if step <= 0 or start <= 0 or stop < start:
                raise ValueError
            sizes = range(start, stop + 1, step)  # counted below before it is listed
        else:
            sizes = [int(p) for p in text.split(",")]
            if min(sizes) <= 0:
                raise ValueError
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: give N, N,N,... or START:STOP:STEP with positive integers"
        ) from None
    if len(sizes) > MAX_KERNELS:  # before a list of a hundred million is made
        raise click.BadParameter(
            f"{text!r} is {len(sizes)} sizes; at most {MAX_KERNELS} kernels run"
        )
    if max(sizes) > MAX_DIM:
        raise click.BadParameter(f"{text!r}: a size is at most {MAX_DIM}")
    return list(sizes)


def _range(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    return None if value is None else parse_range(value)


class _Sweep:
    """The kernels measured so far (from the worker's progress lines, so that Ctrl-C keeps
    them), shown on a terminal as one status line (:class:`terminal.StatusLine`: a bar, the
    count, the seconds since the start and the latest kernel, cut to the terminal's width) and
    as one line per kernel elsewhere. The count and the total are the worker's own: a pass that
    does not run is never counted. No ETA: a sweep's kernels grow as the cube of M, so the time
    per kernel so far says little of the time left."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.done = 0
        self.results: list[KernelResult] = []
        self.line = terminal.StatusLine(sys.stderr if stream is None else stream, every=0.0)
        self.started = time.monotonic()

    def __enter__(self) -> _Sweep:
        return self

    def __exit__(self, *exc: object) -> None:
        self.line.clear()

    def __call__(self, item: Progress) -> None:
        if item.result is None:
            return
        self.results.append(item.result)
        self.total = max(item.total, item.done)
        self.done = item.done
        r = item.result
        figure = f"{r.peak:.3g} {throughput_unit(r.dtype)}" if r.peak is not None else r.status
        latest = f"{r.dtype} {r.shape}: {figure}"
        if not self.line.enabled:
            click.echo(f"bench [{self.done}/{self.total}] {latest}", err=True)
            return
        now = time.monotonic()
        bar = terminal.bar(self.done, self.total)
        self.line.show(
            f"bench {bar} {self.done}/{self.total}, {now - self.started:.0f} s · {latest}", now
        )


def _csv_text(results: Sequence[KernelResult]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for r in results:
        writer.writerow(
            [
                r.dtype,
                r.shape,
                r.status,
                r.peak,
                r.delivered,
                r.median_ms,
                r.total_ms,
                r.iters,
                r.max_rel_error,
                r.reason,
                throughput_unit(r.dtype),
            ]
        )
    return out.getvalue()


class _Outputs:
    """The files bench writes, written after the sweep: a file that cannot be written (the
    check before the sweep cannot foresee everything: a full disk, a folder removed meanwhile)
    is one line on standard error after the results, and exit 1; ``-`` is standard output,
    printed instead of the text."""

    def __init__(self, csv_path: Path | None, json_path: Path | None) -> None:
        self.csv_path, self.json_path = csv_path, json_path
        self.failures: list[str] = []
        self.stdout: str | None = None

    def write(self, results: Sequence[KernelResult], body: Any | None) -> None:
        if self.csv_path is not None:
            self._put(self.csv_path, _csv_text(results))
        if self.json_path is not None and body is not None:
            self._put(self.json_path, json.dumps(body, indent=1) + "\n")

    def _put(self, path: Path, text: str) -> None:
        if is_stdout(path):
            self.stdout = text
            return
        try:
            with path.open("w", newline="") as fh:
                fh.write(text)
        except OSError as exc:
            self.failures.append(f"cannot write {path}: {exc.strerror or exc}")

    def report(self) -> Exit:
        """Standard output's document (when ``-``), then the failures; ATTENTION after one."""
        if self.stdout is not None:
            click.echo(self.stdout, nl=False)
        for line in self.failures:
            click.echo(f"sparkdiag bench: {line}", err=True)
        return Exit.ATTENTION if self.failures else Exit.OK


def _figure(value: float | None) -> str:
    """Three significant digits below 100 (CPU figures are small: 0.193, not 0.2)."""
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 100 else f"{value:.3g}"


def _no_result(dtype: str, results: Sequence[KernelResult]) -> str:
    """``fp8: no result (fp8 needs compute capability 8.9+)``: each reason once, the status
    where a result gave none (it printed "None")."""
    reasons = dict.fromkeys(r.reason or r.status for r in results if r.dtype == dtype)
    return f"{dtype}: no result ({'; '.join(reasons) or 'not run'})"


def _summary(dtypes: Sequence[str], results: Sequence[KernelResult], device: str) -> None:
    """Per dtype the best shape and the median over the sweep; the best is this GPU's MAMF (the
    maximum achievable matmul throughput, as mamf-finder names it) on a GPU, and only the best
    of the shapes tried on a CPU."""
    width = terminal.width()
    for dtype in dtypes:
        ok = [r for r in results if r.dtype == dtype and r.peak is not None]
        if not ok:
            click.echo(terminal.fill(_no_result(dtype, results), width, "", "    "))
            continue
        # mamf-finder's figure is per iteration: the peak (median iteration) is comparable
        best = max(ok, key=lambda r: r.peak or 0.0)
        median = statistics.median(r.peak or 0.0 for r in ok)
        unit = throughput_unit(dtype)
        on = "CPU" if device == "cpu" else device
        what = "this GPU's MAMF" if device.startswith("cuda") else f"the best on the {on}"
        line = (
            f"{dtype}: best {_figure(best.peak)} {unit} at {best.shape} ({what}); "
            f"median {_figure(median)} over {len(ok)} shapes"
        )
        click.echo(terminal.fill(line, width, "", "    "))


def _partial(
    sweep: _Sweep,
    results: Sequence[KernelResult],
    interrupted: str | None = None,
    failed: str | None = None,
) -> dict[str, Any]:
    """The JSON of a sweep that did not finish (Ctrl-C, or a worker that died or timed out):
    the kernels its progress lines reported."""
    body: dict[str, Any] = {"schema": PARTIAL_SCHEMA}
    if interrupted is not None:
        body["interrupted"] = interrupted
    if failed is not None:
        body["failed"] = failed
    body.update(
        done=sweep.done, total=sweep.total, results=[dataclasses.asdict(r) for r in results]
    )
    return body


def _interrupted(
    sweep: _Sweep, dtypes: Sequence[str], outputs: _Outputs, device: str, signal_name: str
) -> Exit:
    """Ctrl-C or SIGTERM: write and print the kernels measured so far; INTERRUPTED."""
    results = [r for r in sweep.results if r.beta == 0]
    outputs.write(results, _partial(sweep, results, interrupted=signal_name))
    click.echo(f"interrupted after {sweep.done} of {sweep.total} kernels", err=True)
    if outputs.stdout is None:
        _summary(dtypes, results, device)
    outputs.report()
    return Exit.INTERRUPTED


@click.command()
@worker_options(
    "--dtype",
    "--small",
    "--device",
    dtypes=("bf16",),
    shown={"--device": "cuda, CUDA's first device"},
)
@click.option(
    "--m",
    "m_range",
    default=None,
    callback=_range,
    help=f"M sizes: N, list or START:STOP:STEP. [default: {M_RANGE}; {SMALL_M_RANGE} with "
    "--small or --device cpu]",
)
@click.option(
    "--n",
    "n_range",
    default=None,
    callback=_range,
    help="N sizes (default: the same as M, square shapes).",
)
@click.option(
    "--k",
    "k_range",
    default=None,
    callback=_range,
    help="K sizes (default: the same as M, square shapes).",
)
@worker_options("--iters", "--warmup", iters=50, warmup=10)
@file_option(
    "--csv", "csv_path", "Write every result to this CSV file; - prints it instead of the text."
)
@file_option(
    "--json",
    "json_path",
    "Write the worker's document to this JSON file; - prints it instead of the text.",
)
@settings_options("bench")
def bench(
    dtypes: list[str],
    small: bool,
    device: str | None,
    m_range: list[int] | None,
    n_range: list[int] | None,
    k_range: list[int] | None,
    iters: int,
    warmup: int,
    csv_path: Path | None,
    json_path: Path | None,
    **given: Any,
) -> Exit:
    """A longer mamf-style sweep: the best achievable matmul throughput over a range of shapes.

    Square shapes by default (M=N=K from --m); give --n and --k for the full grid (it grows as
    their product). Runs in one worker subprocess on the GPU (CUDA's first device), with a
    progress line; the GPU is not checked for other users (this is a benchmark you start on
    purpose). Prints the best shape per dtype (this GPU's MAMF) and the median over the sweep.

    Without a GPU bench refuses (exit 1), as soak does, rather than sweep GPU-sized shapes on
    the CPU for hours: --device cpu --small sweeps small cubes (128 to 512, seconds on a CPU;
    --device cpu alone takes the same cubes unless --m is given), a smoke test. Ctrl-C stops
    the sweep: the kernels measured so far are written (--csv, --json) and printed.
    --csv - or --json - prints that document on standard output instead of the text.

    \b
    Exit status:
      0    swept: every dtype measured
      1    no GPU (NVML sees none; give --device cpu), torch cannot use the
           device, a dtype measured nothing (unsupported here: its line says
           why), or an output file could not be written (said after the
           results)
      2    usage error (output paths are checked before the sweep: each is
           created, or opened, and left as it was)
      3    torch is not installed, or the worker failed or timed out (what it
           measured before is still written and printed)
      130  interrupted
    """
    settings = settings_from("bench", given)
    check_output_path(csv_path, "--csv")
    check_output_path(json_path, "--json")
    outputs = _Outputs(csv_path, json_path)
    one_stdout(csv_path, json_path)
    # a CPU sweeps the small cubes too: the worker sizes everything small there, and 16384³ on
    # a CPU would take hours
    tiny = small or device == "cpu"
    ms = m_range if m_range is not None else parse_range(SMALL_M_RANGE if tiny else M_RANGE)
    ns, ks = (ms, ms) if n_range is None and k_range is None else (n_range or ms, k_range or ms)
    cubes = n_range is None and k_range is None
    count = len(ms) * (1 if cubes else len(ns) * len(ks)) * len(dtypes)
    if count > MAX_KERNELS:  # before the shapes are listed
        raise UsageError(f"{count} kernels is too many (at most {MAX_KERNELS}); narrow the ranges")
    if cubes:
        shapes = [f"{m}x{m}x{m}" for m in ms]
    else:
        shapes = [f"{m}x{n}x{k}" for m in ms for n in ns for k in ks]
    # usage errors first, as probe gives them: before torch and the GPU are looked for
    flag = "--k" if k_range is not None else "--m"
    try:
        for shape in shapes:
            parse_shape(shape)  # a side or the matrices too large
    except ContractUsageError as exc:
        raise UsageError(str(exc), flag=flag) from None
    check_shapes(dtypes, shapes, flag)
    require_torch("bench")
    if device is None:  # the GPU, or a refusal: never a quiet sweep of GPU shapes on the CPU
        samples, why = gpus_seen(settings.nvml_fixture)
        if not samples:
            raise no_gpu("bench", why, "--device cpu --small sweeps small cubes on the CPU")
        device = "cuda"
    timeout = settings.probe_timeout
    request = worker_request(
        settings,
        device,
        dtypes,
        shapes,
        small,
        probe_when="always",
        bandwidth=False,
        transfers=False,
        progress=True,
        iters=iters,
        warmup=warmup,
        budget_seconds=max(timeout, 1.0),
    )
    # explicit shapes: one pass per shape and dtype, no beta=1 variant (worker.plan_suite)
    sweep = _Sweep(len(shapes) * len(dtypes))
    started = time.monotonic()
    try:
        with sweep:
            cycle = run_worker(request=request, timeout=timeout, on_progress=sweep)
    except KeyboardInterrupt as stop:  # the worker's group is already killed (run_worker)
        name = stop.signal_name if isinstance(stop, Interrupted) else "SIGINT"
        return _interrupted(sweep, dtypes, outputs, device, name)
    doc = cycle.document
    results = [r for r in doc.results if r.beta == 0] if doc else []
    body: dict[str, Any] | None = dict(doc.raw) if doc is not None else None
    partial = doc is None and cycle.result in ("error", "timeout") and bool(sweep.results)
    if partial:
        # the worker died or timed out before its document: what its progress lines reported
        # is kept, as after Ctrl-C (it used to be lost: a CSV of its header alone, no JSON)
        results = [r for r in sweep.results if r.beta == 0]
        body = _partial(sweep, results, failed=cycle.reason or cycle.result)
    outputs.write(results, body)
    if cycle.result in ("error", "timeout") and not results:
        outputs.report()
        raise SparkdiagError(f"sweep failed: {cycle.reason}")
    if cycle.result == "unsupported" and not results:
        outputs.report()
        raise SparkdiagError(f"nothing swept: {cycle.reason}", exit_code=Exit.ATTENTION)
    if outputs.stdout is None:
        if doc is not None:
            sw = doc.software
            what = sw.gpu_name or ("CPU" if sw.device == "cpu" else sw.device)
            known = [f"torch {sw.torch}"] + ([f"CUDA {sw.cuda}"] if sw.cuda else [])
            click.echo(terminal.fill(f"{what}: {', '.join(known)}", terminal.width(), "", "    "))
        measured = sum(r.peak is not None for r in results)
        counted = "" if measured == len(results) else f" ({measured} measured)"
        of = f" of {sweep.total}" if partial else ""
        took = time.monotonic() - started
        click.echo(f"swept {len(results)}{of} kernels{counted} in {took:.1f} s")
        _summary(dtypes, results, device)
    files = outputs.report()
    if cycle.result in ("error", "timeout"):
        after = f"the sweep stopped after {sweep.done} of {sweep.total} kernels: "
        after = after if partial else ""
        click.echo(f"warning: {after}{cycle.reason}", err=True)
        return Exit.FAILED
    if files != Exit.OK:
        return files
    unmeasured = [
        d for d in dtypes if not any(r.dtype == d and r.peak is not None for r in results)
    ]
    if unmeasured:  # its line says why (unsupported here)
        if outputs.stdout is not None:  # the summary was not printed: the exit 1 unexplained
            for dtype in unmeasured:
                click.echo(_no_result(dtype, results), err=True)
        return Exit.ATTENTION
    return Exit.OK
