"""The ticks a job's diagnosis reads (:mod:`.diagnose`): its active window, then without the ticks
at either end in which its stacks show it still importing its modules, running no Python at all
(the interpreter starting or finalising) or mostly outside its training loop's frames (building
the model, a final save).

The active window opens at the first tick in which the GPU's utilization reached
``WINDOW_LEVEL`` of the job's typical utilization (the median of the ticks in which it ran any
kernel, ``views.ACTIVE_MIN``) and closes at the last.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from sparkdiag.watch import attribute, threads
from sparkdiag.watch import stacks as st
from sparkdiag.watch.model import Recording
from sparkdiag.watch.threads import Readings
from sparkdiag.watch.views import ACTIVE_MIN, View

WINDOW_LEVEL = 0.5


def trimmed(
    rec: Recording, readings: Readings | None, vs: list[View], first: int, last: int
) -> tuple[int, int]:
    """``first`` to ``last`` (the active window) without its start-up, the ticks without Python
    and those outside the training loop, at either end (the module docstring); as it is where
    no stacks were read."""
    first, last = _started(rec, readings, vs, first, last)
    first, last = _running_python(rec, readings, vs, first, last)
    return _in_loop(rec, readings, vs, first, last)


def active(vs: list[View]) -> tuple[int, int] | None:
    """First and last index of the active window (module docstring), None when the job never
    touched the GPU."""
    seen = any(v.held for v in vs)
    held = [i for i, v in enumerate(vs) if v.held or not seen]
    active = [i for i in held if vs[i].active]
    if not active:
        return (held[0], held[-1]) if seen and held else None
    level = max(ACTIVE_MIN, WINDOW_LEVEL * statistics.median(vs[i].util for i in active))
    opened = [i for i in active if vs[i].util >= level]
    return opened[0], opened[-1]


def _in_loop(
    rec: Recording, readings: Readings | None, vs: list[View], first: int, last: int
) -> tuple[int, int]:
    """The window without the ticks at either end that the training threads spent mostly
    outside their loop's frames (:func:`.threads.loop_frames`, read in the ticks in which the
    GPU worked at least ``WINDOW_LEVEL`` of its 90th percentile in the window: where the job
    computes, it is in its loop; a job stalled most of the time, by checkpoints, opens its
    window at a level its start-up and tear-down reach too): building the model, moving it back
    to the host, a final save. Ticks not sampled go with the ticks outside the loop beyond
    them."""
    if readings is None or last <= first:
        return first, last
    utils = sorted(vs[i].util for i in range(first, last + 1))
    level = WINDOW_LEVEL * utils[int(0.9 * (len(utils) - 1))]
    working = [vs[i].tick for i in range(first, last + 1) if vs[i].util >= level]
    frames = threads.loop_frames(readings, rec, working)
    if not frames:
        return first, last

    def outside(i: int) -> bool | None:
        share = threads.in_loop(readings, rec, vs[i].tick, frames)
        return None if share is None else share < 0.5

    return _trimmed(first, last, outside)


def _trimmed(first: int, last: int, outside: Callable[[int], bool | None]) -> tuple[int, int]:
    """``first`` to ``last`` without the ticks at either end that are ``outside`` (True), up to
    the first that is not (False); a tick that cannot tell (None) goes with those beyond it."""
    start, end = first, last
    for i in range(first, last):
        out = outside(i)
        if out is False:
            break
        if out:
            start = i + 1
    for i in range(last, start, -1):
        out = outside(i)
        if out is False:
            break
        if out:
            end = i - 1
    return start, end


def _running_python(
    rec: Recording, readings: Readings | None, vs: list[View], first: int, last: int
) -> tuple[int, int]:
    """The window without the ticks at either end in which the training threads were read
    with no Python frame at all (empty stacks only): the interpreter starting, or finalising
    after the job's last line, with its thread still busy and the GPU idle. Under two busy
    loops on a 2-core machine a torch.compile job's finalisation took over a second, which the
    counters called data prep in the loop (``tests/test_watch_jobs_script.py``'s dry run).
    Ticks not sampled go with the ticks beyond them; a tick with any Python frame stops it."""
    if readings is None:
        return first, last
    empty = [threads.without_python(readings, rec, vs[i].tick) for i in range(first, last + 1)]
    if False not in empty:  # no tick with a Python frame to keep: nothing to tell it by
        return first, last
    return _trimmed(first, last, lambda i: empty[i - first])


def _started(
    rec: Recording, readings: Readings | None, vs: list[View], first: int, last: int
) -> tuple[int, int]:
    """The window without its first ticks in which the training thread was still importing its
    modules (half its sampled time or more; ticks before py-spy read it go with them): start-up,
    whatever the GPU read."""
    if readings is None:
        return first, last
    started = first
    for i in range(first, last):
        sampled = attribute.training_stacks(readings, vs[i].tick)
        total = sum(seconds for _, _, seconds in sampled)
        if total <= 0:  # not sampled yet (py-spy attaching): as the ticks after it
            continue
        if sum(s for _, a, s in sampled if a == st.IMPORTING) < 0.5 * total:
            break
        started = i + 1
    return started, last
