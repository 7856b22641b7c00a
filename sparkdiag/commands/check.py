"""``sparkdiag check``: is this machine fit to benchmark right now, and if not, what to fix.

Registered in :mod:`sparkdiag.cli` with ``main.add_command(check)``. Tests inject what would
otherwise come from the machine (the probe launcher, the installed torch, the kernel log) as
the click context object: ``CliRunner().invoke(check, args, obj=Sources(...))``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from sparkdiag import terminal
from sparkdiag.check.catalog import run_checks
from sparkdiag.check.gather import Sources, gather
from sparkdiag.check.model import run_exit_code
from sparkdiag.check.report import render_json, table
from sparkdiag.check.stall_checks import STALL_INTERVAL, STALL_SAMPLES
from sparkdiag.commands.common import setup_logging
from sparkdiag.flags import path_option, settings_from, settings_options
from sparkdiag.probe.launchers import FixtureLauncher
from sparkdiag.snapshot import GpuSample


def _progress(gpus: Sequence[GpuSample], timeout: float) -> None:
    if not sys.stderr.isatty():
        return
    names = sorted({g.identity.name for g in gpus})
    if len(gpus) == 1:
        what = f"GPU {gpus[0].identity.index} ({names[0]})"
    else:
        what = f"{len(gpus)} GPUs ({', '.join(names)}) at once"
    click.echo(
        terminal.fill(f"probing {what}, up to {timeout:g} s…", terminal.width(sys.stderr)), err=True
    )


@click.command("check")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead of a table.")
@click.option(
    "--quick",
    is_flag=True,
    # it said "takes well under 3 s" (found in a review): a busy GPU is sampled for the stall
    # check, 3 s, whatever --quick says
    help="Skip everything that loads the GPU (the probe, the SM clock and int4 checks): a "
    f"second or so, {STALL_SAMPLES * STALL_INTERVAL:g} s more where a GPU is busy (the stall check "
    "samples it).",
)
@click.option(
    "--expect-gpus",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Fail unless N GPUs are visible (and NVML itself loads).",
)
@path_option(
    "--storage",
    "storage_dir",
    metavar="DIR",
    help="Also measure DIR's read and write speed against its drive and baseline (the "
    "checkpoint or data set directory). WRITES a test file of --storage.size (O_TMPFILE, "
    "gone however it ends).",
)
@settings_options("check")
@click.pass_context
def check(
    ctx: click.Context,
    /,
    as_json: bool,
    quick: bool,
    expect_gpus: int | None,
    storage_dir: Path | None,
    **given: Any,
) -> int:
    """Check whether this machine is fit to benchmark right now.

    Runs small independent checks: NVML and driver, CUDA/torch versions, GPUs visible, the
    GPU idle, GPU and memory temperatures, clock event reasons, PCIe links (GPU, NIC, NVMe),
    ECC, row remapping and XID events, persistence/compute/MIG modes, container, CPU
    governor, unified-memory headroom; then a short GEMM probe on every idle GPU (all GPUs at
    once, about a second of GPU time each) against its stored baseline and the published
    reference for its model, the SM clock and PCIe link under that load, and int4 against
    bf16/fp16 at the decode shape; the NVMe drives' SMART health and temperature; with
    --storage DIR, DIR's read and write speed. Each check says pass, warn, fail or skip, what
    it measured, and what to do. Without a GPU the GPU checks are skipped (one row says why),
    the host checks still run, and the run judges nothing: it exits 1, "status": "skip" in
    --json. Every check: docs/check.md.

    \b
    Exit status:
      0  every check passed (skipped checks do not count)
      1  at least one warning and no failure, or nothing judged (no GPU was
         checked)
      2  the check could not run: a bad flag or value, an unreadable fixture
      3  at least one check failed
    """
    started = time.monotonic()
    settings = settings_from("check", given)
    setup_logging(settings.log_level)
    sources = ctx.find_object(Sources) or Sources()
    if settings.probe_fixture is not None:
        sources = replace(sources, launcher=FixtureLauncher(settings.probe_fixture))
    context = gather(
        settings,
        quick=quick,
        expect_gpus=expect_gpus,
        sources=sources,
        on_probe=lambda gpus: _progress(gpus, settings.probe_timeout),
        on_peer=lambda line: click.echo(line, err=True) if sys.stderr.isatty() else None,
        storage=storage_dir,
    )
    results = run_checks(context)
    duration = time.monotonic() - started
    if as_json:
        click.echo(render_json(results, duration, quick), nl=False)
    else:
        colour = not os.environ.get("NO_COLOR")
        click.echo(table(results, duration, colour=colour), nl=False, color=None)
    return run_exit_code(results)
