"""``sparkdiag probe``: one probe cycle now, compared with the baseline and the reference."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from sparkdiag import terminal
from sparkdiag.baseline.evaluate import GemmFigure, evaluate_cycle
from sparkdiag.baseline.model import BaselineStoreDamaged, BaselineStoreError
from sparkdiag.baseline.opening import DAMAGED_ACTION
from sparkdiag.baseline.store import DEFAULT_FILENAME, BaselineStore, open_store
from sparkdiag.baseline.verdict import NOISE_BAND, SLOWER_BELOW, judge
from sparkdiag.commands.common import (
    check_shapes,
    gpus_seen,
    require_torch,
    setup_logging,
    worker_request,
)
from sparkdiag.commands.probe_table import (
    GpuRun,
    KernelProgress,
    figure_json,
    kernel_label,
    render_probe_table,
    verdict_text,
)
from sparkdiag.config import Settings
from sparkdiag.errors import Exit, UsageError
from sparkdiag.flags import gpu_option, settings_from, settings_options, worker_options
from sparkdiag.probe.document import WorkerDocument
from sparkdiag.probe.launchers import FixtureLauncher
from sparkdiag.probe.runner import NO_TORCH_PREFIX, ProbeCycle, run_worker, torch_install_hint
from sparkdiag.snapshot import GpuSample
from sparkdiag.statedir import StateDirError, state_file


def _context(rootfs: Path) -> str:
    from sparkdiag.sources.host.context import detect_context

    return detect_context(rootfs).context


# /2: each figure's "healthy" became "counts_toward_baseline" (what it always meant: the run may
# teach the baseline; it read true on a figure at 0.45 of its baseline beside another process).
REPORT_SCHEMA = "sparkdiag-probe-report/2"
# a cycle whose every kernel is unsupported on its device (fp8 on a CPU) measured nothing: its
# result is "unsupported", as the worker's own when not even the memory copy ran (exit 1)
NOTHING_MEASURED = "no requested kernel is supported here"


def _open_store(settings: Settings, record: bool) -> tuple[BaselineStore | None, str, str]:
    """The baseline store to compare with (and, with ``record``, to teach), why a GPU's figures
    have no baseline when it is not there, and why the cycle will not be recorded though
    ``record`` asks for it. A store that cannot be written (a read-only or full state
    directory, a damaged file, one of a newer sparkdiag) never costs the measurement: it is
    compared with what can be read and the results are not recorded. With --no-record an
    existing store is read, none is created."""
    not_recorded = ""
    if record:
        try:
            return open_store(settings.state_dir, create=True), "", ""
        except BaselineStoreDamaged as exc:  # nothing of it is trusted: read it no further
            return None, "the baseline store is damaged", exc.message
        except BaselineStoreError as exc:
            not_recorded = exc.message
    try:
        path = state_file(settings.state_dir, DEFAULT_FILENAME)
    except StateDirError as exc:
        return None, f"the baseline store cannot be read ({exc.message})", not_recorded
    if not path.exists():  # nothing learned yet: the usual "no baseline" verdict
        return None, "", not_recorded
    try:
        return open_store(settings.state_dir, create=False), "", not_recorded
    except BaselineStoreError as exc:
        return None, f"the baseline store cannot be read ({exc.message})", not_recorded


def _evaluate(
    doc: WorkerDocument,
    uuid: str,
    name: str,
    context: str,
    store: BaselineStore | None,
    record: bool,
) -> tuple[list[GemmFigure], str]:
    """The figures of one cycle, recorded whole when ``record`` (baseline.evaluate:
    evaluate_cycle, which the daemon shares), and why they were not recorded ("" when they
    were, or were not asked to be)."""
    done = evaluate_cycle(doc, uuid, name, context, store, record)
    return done.figures, done.not_recorded.message if done.not_recorded else ""


def _beside(doc: WorkerDocument | None, rootfs: Path | None) -> str:
    """Who else used the GPU while the worker ran, from its own record: ``pid 4242 (python3)``;
    without ``rootfs`` (a document replayed from ``--probe.fixture``, whose pids are another
    machine's) the pids alone."""
    from sparkdiag.sources.host.procfs import process_names

    pids = list(doc.busy.other_pids) if doc is not None else []
    if not pids:
        return ""
    names = process_names(rootfs, pids) if rootfs is not None else {}
    shown = [f"pid {p} ({names[p]})" if p in names else f"pid {p}" for p in pids[:3]]
    more = f" and {len(pids) - 3} more" if len(pids) > 3 else ""
    return ", ".join(shown) + more


@click.command()
@worker_options(
    "--dtype",
    "--small",
    "--shape",
    "--device",
    shown={
        "--device": "each GPU in turn; without NVML, torch's default device (cuda:0, or cpu "
        "without CUDA)"
    },
)
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
    default=None,
    help="Record the results in the baseline store (teaches a new baseline); --no-record "
    "still compares with the stored baselines. [default: record; with --probe.fixture, "
    "no-record: a replayed cycle teaches a real store nothing unless --record asks]",
)
@settings_options("probe")
def probe(
    dtypes: list[str],
    shapes: list[str],
    small: bool,
    device: str | None,
    gpus: tuple[int, ...] | None,
    as_json: bool,
    record: bool | None,
    **given: Any,
) -> Exit:
    """Run one probe cycle now and compare it with the baseline and the reference.

    Measures every dtype and shape of the suite (or those chosen) on each GPU in a worker
    subprocess, and prints throughput, the stored baseline, efficiency, and the published
    reference for the GPU model. Then a verdict per GPU: slower than its baseline when a
    kernel delivers less than 0.90 of it (the probe's noise band: 10 %, three
    times the 3.5 % spread of a short probe on an idle H200, docs/probe.md), naming any other
    process that used the GPU meanwhile; as fast; or not judged (no baseline yet).

    --device cpu (or cuda:N) runs one cycle on that torch device, without NVML and without a
    baseline (a smoke test: --device cpu --small takes seconds). Without NVML the probe runs
    on torch's default device the same way.

    A --shape that a dtype named in --dtype cannot run (int4 needs K divisible by 128, its
    group size) is refused before the worker starts; for the suite's dtypes (or --dtype all)
    that kernel is reported unsupported.

    A baseline store that cannot take the cycle (a read-only, full or missing state directory,
    a damaged file, a write lock held by another process) costs no measurement: the cycle is
    compared with what the store still reads (nothing of a damaged file), and one line says it
    was not recorded, why, and what to do.

    \b
    Exit status:
      0  measured, and no GPU slower than its baseline (or no baseline to
         compare with)
      1  a GPU slower than its baseline by more than the noise band, skipped
         (GPU busy), or nothing supported (no kernel measured)
      2  usage error
      3  the worker failed or timed out, or torch is not installed
    130  interrupted (Ctrl-C or SIGTERM)
    """
    settings = settings_from("probe", given)
    setup_logging(settings.log_level)
    if record is None:
        # a replayed cycle (a demonstration, a test) recorded its figures into the user's store
        # by default, under a real GPU's identity where NVML was real (found in a review)
        record = settings.probe_fixture is None
    if device is not None and gpus is not None:
        raise UsageError("give --device or --gpu, not both")
    check_shapes(dtypes, shapes, "--shape")
    if settings.probe_fixture is None:
        require_torch("probe")
    if device is None:
        samples, why = gpus_seen(settings.nvml_fixture, gpus)
    else:  # one cycle on that device: no GPU identity, so no baseline either
        samples, why = [], None
    context = _context(settings.rootfs)
    request = worker_request(
        settings,
        device,
        dtypes,
        shapes,
        small,
        busy_utilization=settings.probe_busy_utilization,
        progress=True,
    )
    fixture = FixtureLauncher(settings.probe_fixture) if settings.probe_fixture else None
    store, no_store, not_recorded = _open_store(settings, record) if samples else (None, "", "")
    runs: list[GpuRun] = []
    targets: list[GpuSample | None] = list(samples) if samples else [None]
    if not samples and why and not as_json:
        line = f"NVML unavailable ({why}): probing torch's default device, without a baseline"
        click.echo(terminal.fill(line, terminal.width(sys.stderr)), err=True)
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
                show = None if as_json else KernelProgress(label)
                try:
                    cycle = run_worker(
                        request=run_request,
                        timeout=settings.probe_timeout,
                        env=env,
                        on_progress=show,
                    )
                finally:
                    if show is not None:
                        show.close()
            figures: list[GemmFigure] = []
            doc = cycle.document
            if doc is not None and cycle.result in ("ok", "error", "skipped_busy"):
                uuid = gpu.identity.uuid if gpu else ""
                name = gpu.identity.name if gpu else (doc.software.gpu_name or "")
                learn = record and not not_recorded and cycle.result == "ok"
                target = store if gpu else None
                figures, failed = _evaluate(doc, uuid, name, context, target, learn)
                not_recorded = not_recorded or failed
            if cycle.result == "ok" and doc is not None and not doc.measured():
                # every kernel unsupported here (the memory copy may have run): nothing measured
                cycle = dataclasses.replace(cycle, result="unsupported", reason=NOTHING_MEASURED)
            # a replayed document's pids are not this machine's: CI named a recording's pid 4242
            # "kworker/1:3-cgroup_pidlist_destroy", a kernel thread that had that pid here
            beside = _beside(doc, settings.rootfs if settings.probe_fixture is None else None)
            verdict = judge(figures, _no_baseline(gpu, no_store, beside)) if figures else None
            runs.append(GpuRun(gpu.identity if gpu else None, cycle, figures, verdict, beside))
    finally:
        if store is not None:
            store.close()
    if as_json:
        report = {
            "schema": REPORT_SCHEMA,
            "context": context,
            "not_recorded": _not_recorded_line(not_recorded) if not_recorded else None,
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
                    "verdict": verdict_json(r),
                }
                for r in runs
            ],
        }
        click.echo(json.dumps(report, indent=1))
    else:
        click.echo(render_probe_table(runs), nl=False)
    if not_recorded and not as_json:
        click.echo(terminal.fill(_not_recorded_line(not_recorded), terminal.width(sys.stderr)),
                   err=True)  # fmt: skip
    no_torch = [r.cycle.reason for r in runs if (r.cycle.reason or "").startswith(NO_TORCH_PREFIX)]
    if no_torch and not as_json:  # the worker's Python is not this one (a fixture, a container)
        click.echo(f"{no_torch[0]}: {torch_install_hint()}", err=True)
    results = {r.cycle.result for r in runs}
    if results & {"error", "timeout"}:
        return Exit.FAILED
    slower = any(r.verdict is not None and r.verdict.status == "slower" for r in runs)
    return Exit.OK if results <= {"ok"} and not slower else Exit.ATTENTION


def _not_recorded_line(why: str) -> str:
    """One line: the results were measured and shown but not kept, why, and what to do."""
    if why.endswith(DAMAGED_ACTION):  # the message says what to do
        return f"results not recorded in the baseline store: {why}"
    return (
        f"results not recorded in the baseline store: {why}; fix the state directory "
        "(--state-dir) or the file, or pass --no-record"
    )


def _no_baseline(gpu: GpuSample | None, no_store: str, beside: str = "") -> str:
    """Why a run's figures have no baseline to be judged against. Beside another compute
    process the run teaches none (baseline.evaluate), which "the probe learns one from its
    runs" left unsaid."""
    if gpu is None:
        return (
            "a run on a torch device (--device, or without NVML) has no GPU identity to keep a "
            "baseline for: a smoke test of the worker"
        )
    if no_store:
        return no_store
    if beside:
        return (
            "no baseline stored for these kernels yet, and this run teaches none: another "
            "process used the GPU (a baseline is learned from runs on an idle GPU); run it "
            "again when the GPU is idle"
        )
    return (
        "no baseline stored for these kernels yet: the probe learns one from its runs "
        "(--record), then shows it and eff (delivered over baseline)"
    )


def verdict_json(run: GpuRun) -> dict[str, Any] | None:
    """A run's verdict in ``--json``: status, the noise band, the kernels below it."""
    v = run.verdict
    if v is None:
        return None
    return {
        "status": v.status,
        "noise_band": NOISE_BAND,
        "slower_below": SLOWER_BELOW,
        "judged": len(v.judged),
        "slower": [kernel_label(f) for f in v.slower],
        "lowest_efficiency": v.lowest.efficiency if v.lowest else None,
        "why_not": v.why_not,
        "beside": run.beside or None,
        "text": verdict_text(v, run.beside),
    }
