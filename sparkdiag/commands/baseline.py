"""``sparkdiag baseline show|pin|reset``: the learned baselines the probe is compared with."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from sparkdiag import terminal
from sparkdiag.baseline.model import METHOD, BaselineKey, Learning
from sparkdiag.baseline.store import DEFAULT_FILENAME, BaselineStore, open_store
from sparkdiag.errors import UsageError
from sparkdiag.flags import FiniteRange, settings_from, settings_options
from sparkdiag.probe.worker.contract import throughput_unit
from sparkdiag.statedir import StateDirError, state_file


@click.group()
def baseline() -> None:
    """Show, pin or reset the healthy baselines the probe is compared with.

    Exit status: 0 done (show: also when none was learned yet); 2 a usage error (no filter for
    reset, filters that match no baseline or several for pin); 3 the baseline store cannot be
    opened (pin and reset: none learned yet; permissions).
    """


def _not_learned_yet(state_dir: Path | None) -> Path | None:
    """The store's path when there is none yet (a fresh machine), else None (it exists, or the
    state directory cannot be found: open_store says why)."""
    try:
        path = state_file(state_dir, DEFAULT_FILENAME)
    except StateDirError:  # open_store says why
        return None
    return None if path.exists() else path


def _matches(
    key: BaselineKey, uuid: str | None, dtype: str | None, shape: str | None, context: str | None
) -> bool:
    return (
        (uuid is None or key.gpu_uuid.startswith(uuid))
        and (dtype is None or key.dtype == dtype)
        and (shape is None or key.shape == shape)
        and (context is None or key.context == context)
    )


def _filtered(
    store: BaselineStore,
    uuid: str | None,
    dtype: str | None,
    shape: str | None,
    context: str | None,
) -> list[Any]:
    return [b for b in store.list() if _matches(b.key, uuid, dtype, shape, context)]


def _software(key: BaselineKey) -> str:
    """The software a figure was measured with, and its method where it is not today's: two
    identities that differ in the method alone (ratios and the GEMM figures of before 2026-12
    were medians) printed the same line."""
    method = "" if key.method == METHOD else f" method={key.method}"
    return f"driver={key.driver} torch={key.torch} cuda={key.cuda}{method}"


def _learning_row(kernel: Learning, runs_needed: int) -> dict[str, Any]:
    """A kernel still learning as a row of ``show --json``: a baseline's keys, with no figure
    yet (``tflops`` null, ``source`` "learning"), ``runs`` its healthy runs so far (as a
    learned baseline's are the healthy runs it was learned from), its first and latest run as
    ``created_at`` and ``updated_at``, and ``runs_needed``, the healthy runs that learn it."""
    return {
        **kernel.key.__dict__,
        "tflops": None,
        "source": "learning",
        "runs": kernel.healthy_runs,
        "created_at": kernel.first_at,
        "updated_at": kernel.last_at,
        "note": "",
        "runs_needed": runs_needed,
    }


_FILTERS = [
    click.option("--uuid", default=None, help="GPU uuid (a prefix is enough)."),
    click.option("--dtype", default=None, help="dtype, e.g. bf16 (bf16:beta1 for accumulate)."),
    click.option("--shape", default=None, help="MxNxK."),
    click.option("--context", type=click.Choice(["native", "container"]), default=None),
]


def _with_filters(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_FILTERS):
        fn = option(fn)
    return settings_options("baseline")(fn)


@baseline.command("show")
@_with_filters
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--learning",
    "with_learning",
    is_flag=True,
    help="Also list the kernels still learning (no baseline yet), with their healthy runs so "
    'far; with --json as rows whose source is "learning".',
)
def baseline_show(
    uuid: str | None,
    dtype: str | None,
    shape: str | None,
    context: str | None,
    as_json: bool,
    with_learning: bool,
    **given: Any,
) -> None:
    """List baselines (every software identity: old ones are kept).

    --json prints one array, a row per baseline; with --learning, a row per kernel still
    learning after them (docs/probe.md, "baseline show").

    Exit status: 0 listed, also when none was learned yet (no store) or none matches; 2 a usage
    error (a bad flag); 3 the baseline store cannot be opened (the state directory cannot be
    found, permissions, a file that is not a baseline store, a damaged one).
    """
    state_dir = settings_from("baseline", given).state_dir
    missing = _not_learned_yet(state_dir)
    if missing is not None:  # a fresh machine: as an empty store, not an error
        if as_json:
            click.echo("[]")
        else:
            click.echo(
                f"no baselines yet ({missing} does not exist): 'sparkdiag probe' or the "
                "daemon learns them"
            )
        return
    with open_store(state_dir, create=False) as store:
        rows = _filtered(store, uuid, dtype, shape, context)
        learning = store.learning_kernels() if with_learning or not rows else []
        min_runs = store.min_runs
    # the rows without --learning stay as they were: a script that reads every row as a
    # baseline (its tflops, or the first bf16 row as learned) must not take a kernel that is
    # still learning for one
    listed = (
        [k for k in learning if _matches(k.key, uuid, dtype, shape, context)]
        if with_learning
        else []
    )
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        **b.key.__dict__,
                        "tflops": b.tflops,
                        "source": b.source,
                        "runs": b.runs,
                        "created_at": b.created_at,
                        "updated_at": b.updated_at,
                        "note": b.note,
                    }
                    for b in rows
                ]
                + [_learning_row(k, min_runs) for k in listed],
                indent=1,
            )
        )
        return
    if not rows and not listed:
        filtered = any(f is not None for f in (uuid, dtype, shape, context))
        if filtered:
            click.echo("no baselines match")
        elif learning:
            click.echo(
                f"no baselines yet: {len(learning)} kernel(s) still learning (a kernel's "
                f"baseline is learned once it has {min_runs} healthy runs); 'sparkdiag probe' "
                "again, or the daemon, teaches them"
            )
        else:
            click.echo("no baselines yet: 'sparkdiag probe' or the daemon learns them")
        return
    width = terminal.width()
    for b in rows:
        k = b.key
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(b.updated_at))
        note = f"  # {b.note}" if b.note else ""
        unit = "" if k.dtype.startswith("ratio:") else f" {throughput_unit(k.dtype)}"
        line = (
            f"{k.gpu_uuid[:12]}.. {k.dtype:10} {k.shape:>18} {k.context:9} {b.tflops:9.1f}{unit} "
            f"{b.source:7} runs={b.runs} {_software(k)} {when}{note}"
        )
        # the key and the figure on the first line; the software and the dates wrap under it
        click.echo(terminal.fill(line, width, "", "    ") if len(line) > width else line)
    for kernel in listed:
        k = kernel.key
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(kernel.last_at))
        line = (
            f"{k.gpu_uuid[:12]}.. {k.dtype:10} {k.shape:>18} {k.context:9} learning: "
            f"{kernel.healthy_runs} of {min_runs} healthy runs {_software(k)} {when}"
        )
        click.echo(terminal.fill(line, width, "", "    ") if len(line) > width else line)


@baseline.command("pin")
@_with_filters
@click.option(
    "--tflops",
    type=FiniteRange(min=0, min_open=True, max=1e6),
    default=None,
    help="Value to pin (more than 0, at most 1,000,000); default: keep the current value.",
)
@click.option("--note", default="", help="Why (shown by show).")
@click.option("--all", "all_matches", is_flag=True, help="Pin every matching baseline.")
def baseline_pin(
    uuid: str | None,
    dtype: str | None,
    shape: str | None,
    context: str | None,
    tflops: float | None,
    note: str,
    all_matches: bool,
    **given: Any,
) -> None:
    """Pin baselines: later runs never move a pinned baseline.

    Exit status: 0 pinned; 2 a usage error (no baseline matches the filters, or several do
    without --all); 3 the baseline store cannot be opened (none learned yet, permissions, a
    damaged file).
    """
    with open_store(settings_from("baseline", given).state_dir, create=False, write=True) as store:
        rows = _filtered(store, uuid, dtype, shape, context)
        if not rows:
            raise UsageError("no baseline matches; run 'sparkdiag probe' first")
        if len(rows) > 1 and not all_matches:
            raise UsageError(f"{len(rows)} baselines match; narrow the filters or pass --all")
        for b in rows:
            pinned = store.pin(b.key, tflops if tflops is not None else b.tflops, note)
            k = pinned.key
            click.echo(f"pinned {k.dtype} {k.shape} {k.context} at {pinned.tflops:.1f}")


@baseline.command("reset")
@_with_filters
@click.option("--all", "all_matches", is_flag=True, help="Required when no filter is given.")
def baseline_reset(
    uuid: str | None,
    dtype: str | None,
    shape: str | None,
    context: str | None,
    all_matches: bool,
    **given: Any,
) -> None:
    """Forget baselines and their runs, so that they are learned again from the next runs.

    Exit status: 0 done, also when no baseline matched ("removed 0 baseline(s)"); 2 a usage
    error (no filter and no --all); 3 the baseline store cannot be opened (none learned yet,
    permissions, a damaged file).
    """
    if not (uuid or dtype or shape or context or all_matches):
        raise UsageError("give --uuid/--dtype/--shape/--context, or --all to reset everything")
    with open_store(settings_from("baseline", given).state_dir, create=False, write=True) as store:
        keys = [b.key for b in _filtered(store, uuid, dtype, shape, context)]
        removed = 0
        for key in keys:
            removed += store.reset(key.gpu_uuid, key.dtype, key.shape)
    click.echo(f"removed {removed} baseline(s)")
