"""``sparkdiag check``: is this machine fit to benchmark right now, and if not, what to fix.

Registered in :mod:`sparkdiag.cli` with ``main.add_command(check)``. Tests inject what would
otherwise come from the machine (the probe launcher, the installed torch, the kernel log) as
the click context object: ``CliRunner().invoke(check, args, obj=Sources(...))``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import click

from sparkdiag.check.catalog import run_checks
from sparkdiag.check.gather import Sources, gather
from sparkdiag.check.model import EXIT_USAGE, exit_code
from sparkdiag.check.report import render_json, table
from sparkdiag.flags import settings_from, settings_options
from sparkdiag.probe.launchers import FixtureLauncher
from sparkdiag.snapshot import GpuSample
from sparkdiag.sources.fixture import FixtureError


class CheckUsageError(click.UsageError):
    """Bad usage: exit status 3, so that 2 keeps meaning "a check failed"."""

    exit_code = EXIT_USAGE


class CheckCommand(click.Command):
    """A click command whose usage errors (bad flags, bad values) exit 3, not click's 2."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise CheckUsageError(exc.format_message(), exc.ctx) from None


def _progress(gpus: Sequence[GpuSample], timeout: float) -> None:
    if not sys.stderr.isatty():
        return
    names = sorted({g.identity.name for g in gpus})
    if len(gpus) == 1:
        what = f"GPU {gpus[0].identity.index} ({names[0]})"
    else:
        what = f"{len(gpus)} GPUs ({', '.join(names)}) at once"
    click.echo(f"probing {what}, up to {timeout:g} s…", err=True)


@click.command("check", cls=CheckCommand)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead of a table.")
@click.option(
    "--quick",
    is_flag=True,
    help="Skip everything that loads the GPU (the probe, the SM clock and int4 checks); "
    "takes well under 3 s.",
)
@click.option(
    "--expect-gpus",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Fail unless N GPUs are visible (and NVML itself loads).",
)
@settings_options("check")
@click.pass_context
def check(
    ctx: click.Context,
    /,
    as_json: bool,
    quick: bool,
    expect_gpus: int | None,
    **given: Any,
) -> None:
    """Check whether this machine is fit to benchmark right now.

    Runs small independent checks: NVML and driver, CUDA/torch versions, GPUs visible, the
    GPU idle, GPU and memory temperatures, clock event reasons, PCIe links (GPU, NIC, NVMe),
    ECC, row remapping and XID events, persistence/compute/MIG modes, container, CPU
    governor, unified-memory headroom; then a short GEMM probe on every idle GPU (all GPUs at
    once, about a second of GPU time each) against its stored baseline and the published
    reference for its model, the SM clock and PCIe link under that load, and int4 against
    bf16/fp16 at the decode shape. Each check says pass, warn, fail or skip, what it
    measured, and what to do. Without a GPU, the GPU checks are
    skipped and the host checks still run.

    \b
    Exit status:
      0  every check passed (skipped checks do not count)
      1  at least one warning, no failure
      2  at least one failure
      3  the check could not run (bad flag or value, unreadable fixture)
    """
    started = time.monotonic()
    settings = settings_from("check", given, error=CheckUsageError)
    _setup_logging(settings.log_level)
    sources = ctx.find_object(Sources) or Sources()
    if settings.probe_fixture is not None:
        try:
            sources = replace(sources, launcher=FixtureLauncher(settings.probe_fixture))
        except ValueError as exc:
            raise CheckUsageError(f"--probe.fixture: {exc}") from None
    try:
        context = gather(
            settings,
            quick=quick,
            expect_gpus=expect_gpus,
            sources=sources,
            on_probe=lambda gpus: _progress(gpus, settings.probe_timeout),
            on_peer=lambda line: click.echo(line, err=True) if sys.stderr.isatty() else None,
        )
    except FixtureError as exc:
        raise CheckUsageError(f"--nvml-fixture: {exc}") from None
    results = run_checks(context)
    duration = time.monotonic() - started
    if as_json:
        click.echo(render_json(results, duration, quick), nl=False)
    else:
        colour = not os.environ.get("NO_COLOR")
        click.echo(table(results, duration, colour=colour), nl=False, color=None)
    ctx.exit(exit_code([r.status for r in results]))


def _setup_logging(level: str) -> None:
    """Quiet by default: every problem a log line would mention is a row of the report."""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
