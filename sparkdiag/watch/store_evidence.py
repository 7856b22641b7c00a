"""Where a checkpoint went and where the input came from, and what those stores can do: the
files the job held open in its heavy ticks, their mounts and ``sparkdiag storage``'s figures,
as the recording keeps them (:mod:`.places`). Pure functions, like the rest of the diagnosis.

A checkpoint's rate is the bytes written from each burst to the end of the stop that holds it,
over those seconds (the write and the wait for it to reach the store: fsync, close); the input's
the job's reads over the starved ticks. A store measured at least ``FASTER`` times the one used
is named beside it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from sparkdiag.watch.causes import rate
from sparkdiag.watch.evidence import Context, averaged, runs
from sparkdiag.watch.model import Place, StoreSpeed

FASTER = 1.5  # another store this many times faster is worth naming
SLOW_KINDS = ("network",)


def age(seconds: float) -> str:
    """How long before the watch a probe ran: ``40 s``, ``12 min``, ``5 h``, ``3 d``."""
    if seconds < 0:
        return "after this watch began"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} before this watch"
    return f"{seconds:.0f} s before this watch"


def _places(ctx: Context, paths: Sequence[str]) -> list[tuple[Place, list[str]]]:
    """The places of ``paths`` (most files first) with the files' names."""
    by_dir = {p.directory: p for p in ctx.rec.places}
    found: dict[str, list[str]] = {}
    for path in paths:
        place = by_dir.get(os.path.dirname(path) or "/")
        if place is not None and place.mountpoint:
            found.setdefault(place.mountpoint, []).append(path)
    first: dict[str, Place] = {}
    for place in ctx.rec.places:
        first.setdefault(place.mountpoint, place)
    return sorted(((first[m], names) for m, names in found.items()), key=lambda pn: -len(pn[1]))


def _where(place: Place) -> str:
    what = f"{place.mountpoint} ({place.fstype} on {place.source}"
    if place.kind == "network":
        return what + ", a network share)"
    if place.kind == "memory":
        return what + ", memory)"
    return what + (f", {place.kind})" if place.kind and place.kind != "unknown" else ")")


def _store(ctx: Context, mountpoint: str) -> StoreSpeed | None:
    return next((s for s in ctx.rec.stores if s.mountpoint == mountpoint), None)


def _speed(store: StoreSpeed, writing: bool) -> float | None:
    return store.write_bps if writing else store.read_bps


def _faster(ctx: Context, place: Place, writing: bool, than: float | None) -> StoreSpeed | None:
    """The fastest other measured store, not a network share or memory, at least ``FASTER``
    times ``than`` (any, where the store used was not measured)."""
    best: StoreSpeed | None = None
    for s in ctx.rec.stores:
        speed = _speed(s, writing)
        if s.mountpoint == place.mountpoint or speed is None or s.kind in ("network", "memory"):
            continue
        if than is not None and speed < FASTER * than:
            continue
        if best is None or speed > (_speed(best, writing) or 0.0):
            best = s
    return best


def _measured(ctx: Context, store: StoreSpeed, writing: bool, local: bool) -> str:
    speed = _speed(store, writing)
    what = "writing" if writing else "reading"
    where = f"the local {store.kind} {store.mountpoint}" if local else store.mountpoint
    figure = "no figure" if speed is None else f"{rate(speed)} {what}"
    when = age(ctx.rec.started_at - store.finished_at)
    return f"{where} measured {figure} (sparkdiag storage, {when})"


def store_lines(
    ctx: Context, paths: Sequence[str], moved: float | None, writing: bool
) -> tuple[list[str], str | None]:
    """Evidence lines for the store the job wrote to (read from), and an action that names a
    faster measured store where the one used is a network share or measured slower."""
    found = _places(ctx, paths)
    if not found:
        return [], None
    place, names = found[0]
    verb = "wrote" if writing else "read"
    shown = ", ".join(os.path.basename(n) for n in names[:2]) + (", ..." if len(names) > 2 else "")
    tick = sorted(v.dt for v in ctx.win)[len(ctx.win) // 2] if ctx.win else 0.0
    head = f"it {verb} " + ("" if moved is None else f"at {rate(moved)}{averaged(tick)} ")
    lines = [head + f"{'to' if writing else 'from'} {_where(place)}: {shown}"]
    store = _store(ctx, place.mountpoint)
    used = _speed(store, writing) if store is not None else None
    if store is not None:
        line = _measured(ctx, store, writing, local=False)
        if used is not None and moved is not None and moved > FASTER * used:
            line += (
                ": faster than the store itself, so the page cache took it (the kernel writes "
                "it out later)"
                if writing
                else ": faster than the store itself, so the page "
                "cache served it (the data fits in memory)"
            )
        lines.append(line)
    faster = _faster(ctx, place, writing, used)
    slow = place.kind in SLOW_KINDS or (used is not None and faster is not None)
    if faster is not None and (slow or store is None):
        lines.append(_measured(ctx, faster, writing, local=True))
    if store is None:
        lines.append(
            f"run `sparkdiag storage {place.mountpoint}` to know what {place.mountpoint} can do"
        )
    action = None
    if faster is not None and slow:
        action = (
            f"{'write checkpoints' if writing else 'keep the dataset'} on {faster.mountpoint} "
            f"({faster.kind}, {rate(_speed(faster, writing) or 0.0)} measured) rather than "
            f"{place.mountpoint}"
            + (", and copy them there in the background" if writing else ", copied there once")
        )
    return lines, action


def checkpoint_rate(ctx: Context, bursts: set[int], idx: list[int]) -> float | None:
    """Bytes per second from each burst to the end of the checkpoint's stop (median over the
    checkpoints)."""
    marked = set(idx) | bursts
    rates = []
    for stretch in runs(marked):
        first = next((i for i in stretch if i in bursts), None)
        if first is None:
            continue
        ticks = [ctx.win[i] for i in stretch if i >= first]
        seconds = sum(v.dt for v in ticks)
        written = sum((v.write or 0.0) * v.dt for v in ticks)
        if seconds > 0 and written > 0:
            rates.append(written / seconds)
    return sorted(rates)[len(rates) // 2] if rates else None


def paths(ctx: Context, idx: Sequence[int], writing: bool) -> list[str]:
    """The files held open in the ticks ``idx`` (and their neighbours: a burst's file may be
    closed by the tick after it), most often seen first."""
    seen: dict[str, int] = {}
    near = {j for i in idx for j in (i - 1, i, i + 1) if 0 <= j < len(ctx.win)}
    for i in sorted(near):
        job = ctx.rec.ticks[ctx.win[i].tick].job
        for p in job.writing if writing else job.reading:
            seen[p] = seen.get(p, 0) + 1
    return sorted(seen, key=lambda p: -seen[p])
