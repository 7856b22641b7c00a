"""Where the DataLoader's worker processes spent their time, from their stacks (py-spy records
them after the job's own processes): the lines of the dataset and its transforms that a starved
GPU waits for. A pure function of the recording.

The time a worker waits for its next index (an idle worker) or says nothing (an empty stack) is
left out: what is left is its working time, and each line's share is of that.
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkdiag.watch import stacks as st
from sparkdiag.watch.causes import Site, pct
from sparkdiag.watch.model import Recording
from sparkdiag.watch.sites import sites
from sparkdiag.watch.threads import Readings

LOADER_LINES = 2  # lines named in the evidence
LINE_MIN = 0.10  # of the workers' working time: a line that took less is not named


def loader_lines(rec: Recording, readings: Readings, ticks: Sequence[int]) -> tuple[Site, ...]:
    """The lines the DataLoader workers worked at most over ``ticks`` (indexes into the
    recording's ticks), each with its share of their working time."""
    spent: dict[int, float] = {}
    for k in ticks:
        for s in rec.ticks[k].stacks:
            if not rec.threads[s.thread].loader:
                continue
            if readings.stacks[s.stack].activity in (st.NOTHING, st.WAITING):
                continue
            spent[s.stack] = spent.get(s.stack, 0.0) + s.seconds
    working = sum(spent.values())
    if working <= 0:
        return ()
    found = sites(rec, readings, spent, working)
    return tuple(s for s in found if s.share >= LINE_MIN)[:LOADER_LINES]


def evidence(found: Sequence[Site]) -> list[str]:
    """One line per loader line: where, what it runs, and its share."""
    out = []
    for s in found:
        text = f": {s.text}" if s.text else ""
        via = f", in {s.via}" if s.via else ""
        out.append(
            f"the loader processes worked {pct(s.share)} of their time at {s.file}:{s.line} "
            f"({s.function}{text}){via}"
        )
    return out
