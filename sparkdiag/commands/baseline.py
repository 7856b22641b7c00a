"""``sparkdiag baseline show|pin|reset``: the learned baselines the probe is compared with."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from sparkdiag import terminal
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


def _learning_kernels(store: BaselineStore) -> int:
    """Kernels with runs recorded and no baseline yet (still learning)."""
    learned = {b.key for b in store.list()}
    return len({run.key for run in store.latest_runs()} - learned)


def _filtered(
    store: BaselineStore,
    uuid: str | None,
    dtype: str | None,
    shape: str | None,
    context: str | None,
) -> list[Any]:
    return [
        b
        for b in store.list()
        if (uuid is None or b.key.gpu_uuid.startswith(uuid))
        and (dtype is None or b.key.dtype == dtype)
        and (shape is None or b.key.shape == shape)
        and (context is None or b.key.context == context)
    ]


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
def baseline_show(
    uuid: str | None,
    dtype: str | None,
    shape: str | None,
    context: str | None,
    as_json: bool,
    **given: Any,
) -> None:
    """List baselines (every software identity: old ones are kept).

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
        learning = _learning_kernels(store) if not rows else 0
        min_runs = store.min_runs
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
                ],
                indent=1,
            )
        )
        return
    if not rows:
        filtered = any(f is not None for f in (uuid, dtype, shape, context))
        if filtered:
            click.echo("no baselines match")
        elif learning:
            click.echo(
                f"no baselines yet: {learning} kernel(s) still learning (a kernel's baseline is "
                f"learned once it has {min_runs} healthy runs); 'sparkdiag probe' again, or the "
                "daemon, teaches them"
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
            f"{b.source:7} runs={b.runs} driver={k.driver} torch={k.torch} cuda={k.cuda} "
            f"{when}{note}"
        )
        # the key and the figure on the first line; the software and the dates wrap under it
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
