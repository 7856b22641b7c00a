"""The ranks of a distributed job (``torch.distributed``: torchrun's or ``mp.spawn``'s children,
one process per rank), read from their stacks: the collective the ranks wait in and the rank
that does not arrive, or the straggler the others wait for. A pure function of the recording.

A process is a rank where its environment names one (torchrun's ``RANK``) or where its training
thread waited in a collective at some time. In a tick a rank *waits* where it spent at least
``WAITING_SHARE`` of its sampled time in a collective (``all_reduce``, ``barrier``, a work's
``wait()``...).

- **A stalled collective**: a stretch of at least ``STALL_SECONDS`` in which every rank but some
  waits and those never do: they do not arrive. It names the collective (the line the waiting
  ranks called it from), the ranks waiting, and each rank missing with the line it was at
  (a sleep, a loop of its own, a process stopped where it stood); a stretch lasting to the end
  of the recording is a hang.
- **A straggler**: over the whole window the other ranks spent at least ``STRAGGLER_WAIT`` of
  their time in collectives (median) and one rank less than ``STRAGGLER_RATIO`` of that: the
  others wait for it, and it spends its time where it is named.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sparkdiag.watch import stacks as st
from sparkdiag.watch.causes import ACTIONS, Cause, pct
from sparkdiag.watch.model import Recording
from sparkdiag.watch.sites import frame_name
from sparkdiag.watch.threads import Readings

WAITING_SHARE = 0.5
STALL_SECONDS = 2.0
STRAGGLER_WAIT = 0.25
STRAGGLER_RATIO = 0.5


DOING = {
    st.USER: "in its own code", st.WAITING: "waiting", st.LAUNCH: "computing",
    st.DATA_PREP: "preparing data", st.SYNC: "waiting for its GPU",
    st.AFTER_SYNC: "in its own code",
    st.COPY: "copying to its GPU", st.CHECKPOINT: "saving a checkpoint", st.LOGGING: "logging",
    st.COMPILE: "compiling", st.OPTIMIZER: "in the optimizer step",
    st.HOST_OPTIMIZER: "in the optimizer step", st.DATALOADER: "waiting for its data",
    st.IMPORTING: "importing",
}  # fmt: skip


@dataclass(frozen=True)
class Rank:
    """A rank's training thread (index into the recording's threads), its process and number
    (None where its environment gives none)."""

    thread: int
    pid: int
    rank: int | None

    @property
    def name(self) -> str:
        return f"pid {self.pid}" if self.rank is None else f"rank {self.rank} (pid {self.pid})"


def _callers(rec: Recording, readings: Readings) -> tuple[set[int], set[tuple[str, str]]]:
    """The training threads that waited in a collective, and the functions of the job's own
    code that called it (the rank's loop)."""
    waited: set[int] = set()
    callers: set[tuple[str, str]] = set()
    for tick in readings.ticks:
        for s in tick:
            if s.activity == st.COLLECTIVE:
                waited.add(s.thread)
                site = readings.stacks[s.stack].site
                if site is None:
                    continue
                if st.library_path(rec.frames[site].file, readings.roots) is None:
                    callers.add((rec.frames[site].file, rec.frames[site].function))
    return waited, callers


def _runs(rec: Recording, readings: Readings, thread: int, code: set[tuple[str, str]]) -> bool:
    """The thread ran one of the functions ``code`` (or mp.spawn's wrapper of a rank)."""
    for tick in readings.ticks:
        for s in tick:
            if s.thread != thread:
                continue
            for i in rec.stacks[s.stack]:
                f = rec.frames[i]
                if (f.file, f.function) in code or (
                    st.library_path(f.file, readings.roots) == "torch/multiprocessing/spawn.py"
                    and f.function.endswith("_wrap")
                ):
                    return True
    return False


def ranks(rec: Recording, readings: Readings) -> list[Rank]:
    """The job's ranks, by rank number then pid: the processes that waited in a collective,
    those whose environment names their rank (torchrun), and those that run the same loop as
    a rank that waited (the function that called the collective) or that mp.spawn started as
    a rank (a rank stopped, or busy elsewhere, all the time it was watched)."""
    numbered = {r.pid: r.rank for r in rec.ranks}
    waited, callers = _callers(rec, readings)
    found = [
        Rank(t, rec.threads[t].pid, numbered.get(rec.threads[t].pid))
        for t in readings.training
        if t in waited
        or numbered.get(rec.threads[t].pid) is not None
        or (waited and _runs(rec, readings, t, callers))
    ]
    return sorted(found, key=lambda r: (r.rank is None, r.rank or 0, r.pid))


@dataclass(frozen=True)
class _Tick:
    waiting: frozenset[int]  # threads
    seen: frozenset[int]  # threads sampled in the tick


def _ticks(readings: Readings, found: list[Rank], ticks: Sequence[int]) -> list[_Tick]:
    threads = {r.thread for r in found}
    out = []
    for k in ticks:
        known: dict[int, float] = {}
        waited: dict[int, float] = {}
        for s in readings.samples(k):
            if s.thread in threads and s.activity != st.NOTHING:
                known[s.thread] = known.get(s.thread, 0.0) + s.seconds
                if s.activity == st.COLLECTIVE:
                    waited[s.thread] = waited.get(s.thread, 0.0) + s.seconds
        waiting = {t for t, sec in waited.items() if sec >= WAITING_SHARE * known[t]}
        out.append(_Tick(frozenset(waiting), frozenset(known)))
    return out


def _top(
    rec: Recording, readings: Readings, thread: int, ticks: Sequence[int], collective: bool
) -> tuple[int, str] | None:
    """The stack a thread spent most of ``ticks`` in (in a collective, or elsewhere)."""
    spent: dict[int, float] = {}
    for k in ticks:
        for s in readings.samples(k):
            inside = s.activity == st.COLLECTIVE
            if s.thread == thread and s.activity != st.NOTHING and inside == collective:
                spent[s.stack] = spent.get(s.stack, 0.0) + s.seconds
    if not spent:
        return None
    stack = max(spent, key=lambda k: spent[k])
    return stack, readings.stacks[stack].activity


def _line(rec: Recording, readings: Readings, stack: int) -> str:
    """``train.py:42 (main: dist.all_reduce(y))``, in ``all_reduce (...)`` where a library
    frame decided."""
    reading = readings.stacks[stack]
    if reading.site is None:
        return "a stack with no Python frame"
    f = rec.frames[reading.site]
    where = f"{st.short_file(f.file, rec.cwd, readings.roots)}:{f.line} "
    where += f"({st.function_name(f.function)}"
    where += f": {f.text})" if f.text else ")"
    if reading.via is not None and reading.via != reading.site:
        where += f", in {frame_name(rec.frames[reading.via], rec.cwd, readings.roots)}"
    return where


def _names(found: Sequence[Rank]) -> str:
    named = [r.name for r in found]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]


@dataclass(frozen=True)
class Finding:
    """What the ranks' stacks say, as evidence lines and the advice that comes first."""

    evidence: tuple[str, ...]
    first: str


def _entered(readings: Readings, span: Sequence[int]) -> set[int]:
    """The threads sampled in a collective at some time in ``span``."""
    return {s.thread for k in span for s in readings.samples(k) if s.activity == st.COLLECTIVE}


def _reentered(rec: Recording, readings: Readings, span: Sequence[int], threads: set[int]) -> bool:
    """One of ``threads`` came into a collective again during ``span``: it left the one it
    waited in (the collective completed), so this is no single wait but a run of them."""
    return any(
        s.visits > 0
        for k in span
        for s in rec.ticks[k].stacks
        if s.thread in threads and readings.stacks[s.stack].activity == st.COLLECTIVE
    )


def _stretches(per: Sequence[_Tick]) -> list[list[int]]:
    """The stretches of ticks in which the same ranks wait and the others do not: one begins
    where some rank sampled is not waiting, and goes on while every rank sampled keeps its side
    (a rank py-spy did not sample in a tick, as under load, does not end it, the missing one
    included)."""
    runs: list[list[int]] = []
    side: dict[int, bool] = {}  # the run's ranks so far: waiting or not
    for i, t in enumerate(per):
        keeps = all(side.get(r, r in t.waiting) == (r in t.waiting) for r in t.seen)
        if t.waiting and runs and runs[-1][-1] == i - 1 and keeps:
            runs[-1].append(i)
        elif t.waiting and len(t.waiting) < len(t.seen):
            runs.append([i])
            side = {}
        else:
            continue
        side.update({r: r in t.waiting for r in t.seen})
    return runs


def _stalls(
    rec: Recording, readings: Readings, found: list[Rank], ticks: Sequence[int]
) -> Finding | None:
    per = _ticks(readings, found, ticks)
    best = None
    for run in _stretches(per):
        seconds = sum(rec.ticks[ticks[i]].dt for i in run)
        span = [ticks[i] for i in run]
        missing = set.union(*(set(per[i].seen - per[i].waiting) for i in run))
        # inside the stretch (its first and last ticks hold its start and its end): a straggler
        # arrives, late, and the collective completes; a rank missing never does
        inside = span[1:-1]
        missing -= _entered(readings, inside)
        waiters = set.union(*(set(per[i].waiting) for i in run))
        if (
            seconds >= STALL_SECONDS
            and missing
            and not _reentered(rec, readings, inside, waiters)
            and (best is None or seconds > best[0])
        ):
            best = (seconds, run, missing)
    if best is None:
        return None
    seconds, run, missing = best
    span = [ticks[i] for i in run]
    waiting = [r for r in found if r.thread in set.union(*(set(per[i].waiting) for i in run))]
    absent = [r for r in found if r.thread in missing]
    top = _top(rec, readings, waiting[0].thread, span, collective=True)
    where = "" if top is None else f" at {_line(rec, readings, top[0])}"
    ended = run[-1] == len(per) - 1
    lines = [
        f"{_names(waiting)} waited {seconds:.1f} s in a collective{where}"
        + (", and still waited when the watch ended: a hang" if ended else "")
        + f", while {_names(absent)} did not arrive"
    ]
    for r in absent:
        at = _top(rec, readings, r.thread, span, collective=False)
        doing = (
            "no stack read (the process stopped, or gone)"
            if at is None
            else f"{DOING.get(at[1], at[1])} at {_line(rec, readings, at[0])}"
        )
        lines.append(f"meanwhile {r.name} was {doing}")
    first = (
        f"see why {_names(absent)} does not reach the collective: py-spy dump --pid "
        f"{absent[0].pid} shows where it is now (and NCCL_DEBUG=INFO which collective each "
        "rank last entered); a rank that skips a collective the others make (a condition on "
        "its rank, an exception caught) hangs them all"
    )
    return Finding(tuple(lines), first)


def _straggler(
    rec: Recording, readings: Readings, found: list[Rank], ticks: Sequence[int]
) -> Finding | None:
    known: dict[int, float] = {}
    waited: dict[int, float] = {}
    for k in ticks:
        for s in readings.samples(k):
            if s.activity != st.NOTHING:
                known[s.thread] = known.get(s.thread, 0.0) + s.seconds
                if s.activity == st.COLLECTIVE:
                    waited[s.thread] = waited.get(s.thread, 0.0) + s.seconds
    share = {r.thread: waited.get(r.thread, 0.0) / known[r.thread] for r in found
             if known.get(r.thread)}  # fmt: skip
    if len(share) < 2:
        return None
    slow = min(share, key=lambda t: share[t])
    others = statistics.median(v for t, v in share.items() if t != slow)
    if others < STRAGGLER_WAIT or share[slow] >= STRAGGLER_RATIO * others:
        return None
    rank = next(r for r in found if r.thread == slow)
    top = _top(rec, readings, slow, ticks, collective=False)
    lines = [
        f"the other ranks spent {pct(others)} of their time waiting in collectives (median), "
        f"{rank.name} {pct(share[slow])}: they wait for it, a straggler"
    ]
    if top is not None:
        lines.append(f"{rank.name} spent its time most at {_line(rec, readings, top[0])}")
    first = (
        f"make {rank.name} as fast as the others: give it the same share of the work and data "
        "(uneven batches or sequence lengths, a rank that also logs, evaluates or saves), and "
        "check its GPU and CPUs (sparkdiag check, a throttled or shared GPU)"
    )
    return Finding(tuple(lines), first)


def find(rec: Recording, readings: Readings, ticks: Sequence[int]) -> Finding | None:
    """A stalled collective, else a straggler, among the ranks over ``ticks``."""
    found = ranks(rec, readings)
    if len(found) < 2:
        return None
    return _stalls(rec, readings, found, ticks) or _straggler(rec, readings, found, ticks)


def waiting_share(rec: Recording, readings: Readings, ticks: Sequence[int]) -> float:
    """The share of the ranks' sampled time spent waiting in collectives over ``ticks``."""
    threads = {r.thread for r in ranks(rec, readings)}
    known = waited = 0.0
    for k in ticks:
        for s in readings.samples(k):
            if s.thread in threads and s.activity != st.NOTHING:
                known += s.seconds
                waited += s.seconds if s.activity == st.COLLECTIVE else 0.0
    return waited / known if known > 0 else 0.0


def cause_without_gpu(
    rec: Recording, readings: Readings, ticks: Sequence[int], why: str = "no GPU was sampled"
) -> Cause | None:
    """Without a GPU's figures (ranks on CPUs, gloo; ``why``: none was sampled, or the job used
    none): the collective the ranks waited in, from their stacks alone; its share is the
    ranks' time spent waiting there."""
    finding = find(rec, readings, ticks)
    if finding is None:
        return None
    share = waiting_share(rec, readings, ticks)
    evidence = (
        *finding.evidence,
        f"the ranks spent {pct(share)} of their time waiting in collectives ({why}: the "
        "share is of the ranks' time, not of a GPU's)",
    )
    return Cause(
        "collective-wait", share, evidence, (finding.first, *ACTIONS["collective-wait"]), lost=False
    )
