"""``sparkdiag check``: is this machine fit to benchmark right now, and if not, what to fix.

Registered in :mod:`sparkdiag.cli` with ``main.add_command(check)``. Tests inject what would
otherwise come from the machine (the probe launcher, the installed torch, the kernel log) as
the click context object: ``CliRunner().invoke(check, args, obj=Sources(...))``.

A driver that hangs does not hang check: NVML's start and first poll, and each poll after it
(the stall sampling, the polls beside the probe), are waited for at most ``--nvml-timeout``
seconds (:func:`sparkdiag.telemetry.build.first_poll`, ``BoundedPoll``), the ``nvml`` row then
fails, and the process ends as any other run does (the thread still stuck in the driver is a
daemon thread, which the interpreter does not wait for). With
``--json`` a run that is interrupted, or fails, still prints its document (``"interrupted":
true``, or ``"error"``) before the group ends it as it would have.
"""

from __future__ import annotations

import contextlib
import json
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
from sparkdiag.check.model import CheckResult, run_exit_code
from sparkdiag.check.report import document, render_json, table
from sparkdiag.check.stall_checks import STALL_INTERVAL, STALL_SAMPLES
from sparkdiag.commands.common import setup_logging
from sparkdiag.errors import Exit, SparkdiagError
from sparkdiag.flags import FiniteRange, path_option, settings_from, settings_options
from sparkdiag.probe.launchers import FixtureLauncher
from sparkdiag.snapshot import GpuSample
from sparkdiag.sources.nvml.driver import ANSWER_SECONDS, GivenUp, given_up, hung_reason

HUNG_ACTION = (
    "the NVIDIA driver does not answer: look for NVRM and Xid lines in sudo dmesg, and see "
    "whether nvidia-smi answers (it hangs too when the driver does); a driver stuck in the "
    "kernel usually takes a reboot"
)


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
@click.option(
    "--nvml-timeout",
    type=FiniteRange(min=0, min_open=True),
    default=ANSWER_SECONDS,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for NVML to start and answer a poll (the first, and each after "
    "it). Past it the driver is taken as hung: the nvml row fails (NVML did not answer in "
    "SECONDS s), NVML is asked nothing more, the host checks still run, and check exits 3.",
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
    nvml_timeout: float,
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
      3  at least one check failed (NVML that did not answer within
         --nvml-timeout is one)
    130  interrupted (Ctrl-C, SIGTERM)
    With --json, a run interrupted or ended by an error still prints its
    document: "interrupted": true (or the "error"), no check listed, its
    "exit_code" the status above.
    """
    started = time.monotonic()
    settings = settings_from("check", given)
    setup_logging(settings.log_level)
    sources = ctx.find_object(Sources) or Sources()
    if settings.probe_fixture is not None:
        sources = replace(sources, launcher=FixtureLauncher(settings.probe_fixture))
    earlier = len(given_up())
    try:
        context = gather(
            settings,
            quick=quick,
            expect_gpus=expect_gpus,
            sources=sources,
            on_probe=lambda gpus: _progress(gpus, settings.probe_timeout),
            on_peer=lambda line: click.echo(line, err=True) if sys.stderr.isatty() else None,
            storage=storage_dir,
            nvml_timeout=nvml_timeout,
        )
        results = run_checks(context)
    except KeyboardInterrupt as exc:  # SIGINT, SIGTERM or SIGHUP: the group exits 130
        if as_json:
            signal_name = getattr(exc, "signal_name", "SIGINT")
            _unfinished(started, quick, {"interrupted": True, "signal": signal_name})
        raise
    except SparkdiagError as exc:  # the group says it on stderr and exits with its status
        if as_json:
            _unfinished(started, quick, {"error": exc.line()}, exc.exit_code)
        raise
    except Exception as exc:  # a sparkdiag bug: its traceback follows, exit 1
        if as_json:
            _unfinished(started, quick, {"error": f"{type(exc).__name__}: {exc}"}, 1)
        raise
    hung = given_up()[earlier:]
    if hung:
        results = _nvml_hung(results, hung[0])
    duration = time.monotonic() - started
    if as_json:
        click.echo(render_json(results, duration, quick), nl=False)
    else:
        colour = not os.environ.get("NO_COLOR")
        click.echo(table(results, duration, colour=colour), nl=False, color=None)
    # the thread still stuck in the driver is a daemon thread in a foreign call (the GIL
    # released): the group ends the process as for any other run, without waiting for it
    return run_exit_code(results)


def _nvml_hung(results: Sequence[CheckResult], hung: GivenUp) -> list[CheckResult]:
    """The ``nvml`` row of a driver that did not answer within ``--nvml-timeout``: a failure,
    with what to look at. The catalogue's check sees only NVML down (the reason is the hung
    one), and skips where sysfs shows no NVIDIA GPU on the bus ("no NVIDIA driver here"), which
    a driver that hangs belies. The rows that refer to it stay as they are."""
    row = CheckResult(
        "nvml",
        "fail",
        f"{hung_reason(hung.seconds)} ({hung.what})",
        HUNG_ACTION,
        data={"timeout_seconds": hung.seconds, "waited_for": hung.what},
    )
    if not any(r.name == "nvml" for r in results):
        return [row, *results]
    return [row if r.name == "nvml" else r for r in results]


def _unfinished(
    started: float, quick: bool, marker: dict[str, Any], status: int = Exit.INTERRUPTED
) -> None:
    """``--json`` of a run that did not finish: the document with the checks finished (none:
    they run once everything is gathered), its ``exit_code`` the status the group ends the
    process with, and ``marker`` (``interrupted`` and the signal, or the ``error``). A standard
    output that cannot be written leaves the ending as it was."""
    doc = document([], time.monotonic() - started, quick)
    doc.update(exit_code=int(status), **marker)
    with contextlib.suppress(OSError):
        click.echo(json.dumps(doc, indent=2, default=str))
