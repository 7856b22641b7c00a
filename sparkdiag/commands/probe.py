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
from sparkdiag.baseline.store import BaselineStore, BaselineStoreError, open_store
from sparkdiag.commands.probe_table import (
    GpuRun,
    figure_json,
    progress_printer,
    render_probe_table,
)
from sparkdiag.flags import settings_from, settings_options, worker_options
from sparkdiag.probe.launchers import FixtureLauncher
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.probe.runner import ProbeCycle, run_worker
from sparkdiag.snapshot import GpuSample

EXIT_OK, EXIT_NOT_RUN, EXIT_FAILED = 0, 1, 3


def store_or_exit(state_dir: Path | None, create: bool = True) -> BaselineStore:
    """The baseline store, or a one-line error (exit 1)."""
    try:
        return open_store(state_dir, create)
    except BaselineStoreError as exc:
        raise click.ClickException(str(exc)) from None


def gpus_seen(nvml_fixture: Path | None) -> tuple[list[GpuSample], str | None]:
    """The GPUs NVML sees (one poll, for their uuid, name and busy state); why not, if none."""
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


@click.command()
@worker_options(device=False)
@click.option(
    "--gpu", "gpus", multiple=True, type=int, help="NVML index (repeatable); default all."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
@click.option(
    "--record/--no-record",
    default=True,
    show_default=True,
    help="Record the results in the baseline store (teaches a new baseline).",
)
@settings_options("probe")
def probe(
    dtypes: list[str], shapes: list[str], small: bool, gpus: tuple[int, ...], as_json: bool,
    record: bool, **given: Any,
) -> None:  # fmt: skip
    """Run one probe cycle now and compare it with the baseline and the reference.

    Measures every dtype and shape of the suite (or those chosen) on each GPU in a worker
    subprocess, and prints throughput, the stored baseline, efficiency, and the published
    reference for the GPU model.

    Exit status: 0 measured; 1 skipped (GPU busy) or nothing supported; 2 usage error;
    3 the worker failed or timed out.
    """
    settings = settings_from("probe", given)
    samples, why = gpus_seen(settings.nvml_fixture)
    if gpus:
        samples = [g for g in samples if g.identity.index in gpus]
        if not samples:
            raise click.BadParameter(
                f"no GPU with index {', '.join(map(str, gpus))}", param_hint="--gpu"
            )
    context = _context(settings.rootfs)
    request = WorkerRequest(
        dtypes=tuple(dtypes),
        shapes=tuple(shapes),
        small=small,
        probe_when=settings.probe_when,
        busy_utilization=settings.probe_busy_utilization,
        progress=True,
    )
    try:
        fixture = FixtureLauncher(settings.probe_fixture) if settings.probe_fixture else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--probe.fixture") from None
    store = store_or_exit(settings.state_dir) if record or settings.state_dir else None
    runs: list[GpuRun] = []
    targets: list[GpuSample | None] = list(samples) if samples else [None]
    if not samples and why and not as_json:
        click.echo(
            f"NVML unavailable ({why}): probing the default torch device, no baseline", err=True
        )
    try:
        for gpu in targets:
            label = f"GPU {gpu.identity.index}" if gpu else "probe"
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
            "schema": "sparkdiag-probe-report/1",
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
    results = {r.cycle.result for r in runs}
    if results & {"error", "timeout"}:
        sys.exit(EXIT_FAILED)
    if results <= {"ok"}:
        sys.exit(EXIT_OK)
    sys.exit(EXIT_NOT_RUN)
