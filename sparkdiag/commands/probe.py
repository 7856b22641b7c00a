"""``sparkdiag probe``: one probe cycle now, compared with the baseline and the reference."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from sparkdiag.baseline.evaluate import GemmFigure, evaluate
from sparkdiag.baseline.store import open_store
from sparkdiag.commands.common import gpus_seen, setup_logging, worker_request
from sparkdiag.commands.probe_table import (
    GpuRun,
    figure_json,
    progress_printer,
    render_probe_table,
)
from sparkdiag.errors import Exit, SparkdiagError, UsageError
from sparkdiag.flags import gpu_option, settings_from, settings_options, worker_options
from sparkdiag.probe.launchers import FixtureLauncher
from sparkdiag.probe.runner import NO_TORCH_PREFIX, ProbeCycle, run_worker, torch_install_hint
from sparkdiag.snapshot import GpuSample


def _context(rootfs: Path) -> str:
    from sparkdiag.sources.context import detect_context

    return detect_context(rootfs).context


# /2: each figure's "healthy" became "counts_toward_baseline" (what it always meant: the run may
# teach the baseline; it read true on a figure at 0.45 of its baseline beside another process).
REPORT_SCHEMA = "sparkdiag-probe-report/2"


def _require_torch() -> None:
    """The worker imports torch: without it, one line that says how to install it (as check
    does), instead of a table of "torch None, CUDA None"."""
    from sparkdiag.sources.packages import read_torch

    torch = read_torch()
    if torch.version is None:
        raise SparkdiagError(
            f"torch is not installed for {torch.python}, and the probe needs it: "
            + torch_install_hint(torch.python)
        )


@click.command()
@worker_options("--dtype", "--small", "--shape", "--device")
@gpu_option("The GPUs to probe, one after another.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=f"Print one JSON document ({REPORT_SCHEMA}) instead of tables; a figure's "
    "counts_toward_baseline says whether the run may teach the baseline (no heat or power "
    "reason during the cycle), not whether the figure is as fast as its baseline.",
)
@click.option(
    "--record/--no-record",
    default=True,
    show_default=True,
    help="Record the results in the baseline store (teaches a new baseline).",
)
@settings_options("probe")
def probe(
    dtypes: list[str], shapes: list[str], small: bool, device: str | None,
    gpus: tuple[int, ...] | None, as_json: bool, record: bool, **given: Any,
) -> None:  # fmt: skip
    """Run one probe cycle now and compare it with the baseline and the reference.

    Measures every dtype and shape of the suite (or those chosen) on each GPU in a worker
    subprocess, and prints throughput, the stored baseline, efficiency, and the published
    reference for the GPU model.

    --device cpu (or cuda:N) runs one cycle on that torch device, without NVML and without a
    baseline (a smoke test: --device cpu --small takes seconds).

    Exit status: 0 measured; 1 skipped (GPU busy) or nothing supported; 2 usage error;
    3 the worker failed or timed out, or torch is not installed.
    """
    settings = settings_from("probe", given)
    setup_logging(settings.log_level)
    if device is not None and gpus is not None:
        raise UsageError("give --device or --gpu, not both")
    if settings.probe_fixture is None:
        _require_torch()
    if device is None:
        samples, why = gpus_seen(settings.nvml_fixture, gpus)
    else:  # one cycle on that device: no GPU identity, so no baseline either
        samples, why = [], None
    context = _context(settings.rootfs)
    request = worker_request(
        settings, device, dtypes, shapes, small,
        busy_utilization=settings.probe_busy_utilization, progress=True,
    )  # fmt: skip
    fixture = FixtureLauncher(settings.probe_fixture) if settings.probe_fixture else None
    wants_store = device is None and (record or settings.state_dir is not None)
    store = open_store(settings.state_dir, create=True) if wants_store else None
    runs: list[GpuRun] = []
    targets: list[GpuSample | None] = list(samples) if samples else [None]
    if not samples and why and not as_json:
        click.echo(
            f"NVML unavailable ({why}): probing the default torch device, no baseline", err=True
        )
    try:
        for gpu in targets:
            label = f"GPU {gpu.identity.index}" if gpu else (device or "probe")
            cycle: ProbeCycle
            if fixture is not None:
                cycle = fixture(gpu, lambda _pid: None)
            else:
                env = dict(os.environ)
                run_request = request
                if gpu is not None:
                    env["CUDA_VISIBLE_DEVICES"] = gpu.identity.uuid
                    run_request = dataclasses.replace(request, device="cuda:0")
                show = progress_printer(label, not as_json and sys.stderr.isatty())
                cycle = run_worker(
                    request=run_request, timeout=settings.probe_timeout, env=env, on_progress=show
                )
            figures: list[GemmFigure] = []
            doc = cycle.document
            if doc is not None and cycle.result in ("ok", "error", "skipped_busy"):
                uuid = gpu.identity.uuid if gpu else ""
                name = gpu.identity.name if gpu else (doc.software.gpu_name or "")
                learn = record and cycle.result == "ok"
                target = store if gpu else None
                figures = evaluate(doc, uuid, name, context, target, record=learn)
            runs.append(GpuRun(gpu.identity if gpu else None, cycle, figures))
    finally:
        if store is not None:
            store.close()
    if as_json:
        report = {
            "schema": REPORT_SCHEMA,
            "context": context,
            "gpus": [
                {
                    "gpu": r.identity.index if r.identity else None,
                    "uuid": r.identity.uuid if r.identity else None,
                    "name": r.identity.name if r.identity else None,
                    "result": r.cycle.result,
                    "reason": r.cycle.reason,
                    "figures": [figure_json(f) for f in r.figures],
                    "worker": dict(r.cycle.document.raw) if r.cycle.document else None,
                    "stderr_tail": r.cycle.stderr_tail
                    if r.cycle.result in ("error", "timeout")
                    else "",
                }
                for r in runs
            ],
        }
        click.echo(json.dumps(report, indent=1))
    else:
        click.echo(render_probe_table(runs), nl=False)
    no_torch = [r.cycle.reason for r in runs if (r.cycle.reason or "").startswith(NO_TORCH_PREFIX)]
    if no_torch and not as_json:  # the worker's Python is not this one (a fixture, a container)
        click.echo(f"{no_torch[0]}: {torch_install_hint()}", err=True)
    results = {r.cycle.result for r in runs}
    if results & {"error", "timeout"}:
        sys.exit(Exit.FAILED)
    sys.exit(Exit.OK if results <= {"ok"} else Exit.ATTENTION)
