"""The evidence for the causes in the training loop's own thread (data prepared in the loop, a
host sync, copies to the GPU, recompiling, logging, the optimizer step, a collective), from the
counters of the ticks the diagnosis gave each and, where the job's stacks were sampled, the lines
that took the time (:mod:`.sites`). Pure functions, like the rest of the diagnosis."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from sparkdiag.watch import stacks as st
from sparkdiag.watch.causes import ACTIONS, Cause, Site, amount, mean, pct, rate
from sparkdiag.watch.evidence import Context, runs
from sparkdiag.watch.sites import lines, sites, top_stacks
from sparkdiag.watch.threads import Readings

VISIT_MIN_SECONDS = 0.1  # a visit this long is seen at every sample rate watch uses
PINNED_NOTE = (
    "pinned copies on the lent H200 ran at 55 GB/s, pageable ones at 8.9 GB/s host to device "
    "and 16.5 device to host (256 MiB, sparkdiag probe's transfers)"
)
NO_STACKS = (
    "without the job's stacks the line is not known{what}: install py-spy (pip install "
    "'sparkdiag[stacks]') and let watch read the job (see docs/watch.md, 'Stacks')"
)
_JUDGED = "; its lost time is judged from the counters alone"  # how commands/watch.py ends them


def _reason(line: str) -> str:
    """The why of a skipped line on a pid's stacks: ``cannot read the Python stacks of pid N:
    WHY; its lost time ...`` (the same for ``no Python stacks of pid N (name): WHY; ...``)."""
    why = line.split(": ", 1)[1] if ": " in line else line
    return why.removesuffix(_JUDGED).split("; its lost time")[0]


def no_stacks(skipped: Sequence[str], sampler: str, what: str = "") -> str:
    """Why the line is not known, worded from why the recording holds no stacks (its
    ``skipped`` lines, as commands/watch.py and the stack sampler write them): turned off
    (--stacks off), py-spy not found (install it), not permitted to read the job (what to
    grant), or py-spy ran and read nothing (why); :data:`NO_STACKS` where the recording does
    not say (one made before watch sampled stacks)."""
    head = f"without the job's stacks the line is not known{what}"
    for line in skipped:
        if "not sampled (--stacks off)" in line:
            return f"{head}: they were not sampled (--stacks off); watch without it to have them"
        if line.startswith("py-spy not found"):
            return NO_STACKS.format(what=what)
    refused = [line for line in skipped if line.startswith("cannot read the Python stacks")]
    failed = [line for line in skipped if line.startswith("no Python stacks of pid")]
    refused += [line for line in failed if "CAP_SYS_PTRACE" in line]
    if refused:
        return f"{head}: py-spy is installed but may not read the job ({_reason(refused[0])})"
    if failed:
        return f"{head}: py-spy could not read the job ({_reason(failed[0])})"
    if sampler:
        return f"{head}: py-spy read no stack of the job's processes"
    return NO_STACKS.format(what=what)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


class Spent:
    """The seconds of one cause, by stack, split by what the stack was doing (its activity)."""

    def __init__(self, readings: Readings | None, spent: dict[int, float]) -> None:
        self.readings = readings
        self.spent = spent

    def of(self, *activities: str) -> dict[int, float]:
        if self.readings is None:
            return {}
        stacks = self.readings.stacks
        return {s: sec for s, sec in self.spent.items() if stacks[s].activity in activities}

    def sites(self, ctx: Context, length: float, *activities: str) -> tuple[Site, ...]:
        if self.readings is None:
            return ()
        chosen = self.of(*activities) if activities else self.spent
        return sites(ctx.rec, self.readings, chosen, length)


def _visits(
    ctx: Context, readings: Readings | None, idx: list[int], stacks: set[int]
) -> tuple[int, float]:
    """(visits, seconds) of the training threads to these stacks over the ticks ``idx``."""
    if readings is None:
        return 0, 0.0
    count, seconds = 0, 0.0
    for i in idx:
        for s in ctx.rec.ticks[ctx.win[i].tick].stacks:
            if s.thread in readings.feeding and s.stack in stacks:
                count += s.visits
                seconds += s.seconds
    return count, seconds


def _per_visit(
    ctx: Context, spent: Spent, idx: list[int], moved: float | None, what: str, *activities: str
) -> str:
    """ "about N MB each time (K seen)" where each visit lasted long enough to be seen."""
    if moved is None:
        return ""
    count, seconds = _visits(ctx, spent.readings, idx, set(spent.of(*activities)))
    if count == 0 or seconds / count < VISIT_MIN_SECONDS:
        return ""
    return f", about {amount(moved / count)} each time it {what} ({count} seen)"


def _stretches(
    ctx: Context, readings: Readings | None, idx: list[int], activity: str, doing: str
) -> list[str]:
    """ "N stretches of compiling, the longest X s": the runs of ticks in which the training
    thread spent most of its time in ``activity`` (two close together read as one)."""
    if readings is None:
        return []
    mostly = []
    for i in idx:
        sampled = [(s.activity, s.seconds) for s in readings.feeding_samples(ctx.win[i].tick)
                   if s.activity != st.NOTHING]  # fmt: skip
        total = sum(sec for _, sec in sampled)
        if total > 0 and sum(sec for a, sec in sampled if a == activity) >= 0.5 * total:
            mostly.append(i)
    stretches = runs(mostly)
    if not stretches:
        return []
    longest = max(sum(ctx.win[i].dt for i in r) for r in stretches)
    return [f"{len(stretches)} stretches of {doing}, the longest {longest:.1f} s"]


def _idle(ctx: Context, idx: list[int]) -> str:
    seconds = sum(ctx.win[i].dt for i in idx)
    return f"idle {pct(mean([ctx.win[i].idle for i in idx]) or 0.0)} during {seconds:.1f} s"


def _moved(ctx: Context, idx: list[int], attr: str) -> tuple[float | None, float | None]:
    """(median bytes/s over the ticks, bytes moved in them) of ``pcie_tx`` or ``pcie_rx``."""
    values = [getattr(ctx.win[i], attr) for i in idx]
    if all(v is None for v in values):
        return None, None
    total = sum((v or 0.0) * ctx.win[i].dt for i, v in zip(idx, values, strict=True))
    return _median(values), total


def data_prep_cause(ctx: Context, idx: list[int], share: float, spent: Spent) -> Cause:
    length = ctx.end - ctx.start
    thread = _median([ctx.threads[i] for i in idx])
    evidence = [
        f"the training thread prepared data (or ran other host code) itself while the GPU "
        f"waited: {pct(share)} of the time it would otherwise have worked ({_idle(ctx, idx)})"
        + ("" if thread is None else f"; the thread busy {pct(thread)} of a core meanwhile")
    ]
    found = spent.sites(ctx, length, st.DATA_PREP, st.USER)
    evidence += lines(found, "prepared")
    if spent.readings is None:
        what = (
            ", and preparing data cannot be told from other host work in the loop (scoring "
            "results on the CPU)"
        )
        evidence.append(no_stacks(ctx.rec.skipped, ctx.rec.stack_sampler, what))
    return _cause("data-prep-in-loop", share, evidence, found, spent, ctx)


def host_sync_cause(ctx: Context, idx: list[int], share: float, spent: Spent) -> Cause:
    length = ctx.end - ctx.start
    evidence = [
        f"the training thread waited for the GPU's results, or worked on them on the host, "
        f"while the GPU waited: {pct(share)} of the time it would otherwise have worked "
        f"({_idle(ctx, idx)})"
    ]
    # a copy's line is the sync's where the PCIe traffic went to the host (diagnose._parts)
    synced = spent.sites(ctx, length, st.SYNC, st.COPY)
    after = spent.sites(ctx, length, st.AFTER_SYNC)
    evidence += lines(synced, "synced")
    evidence += lines(after, "worked on the results")
    d2h, moved = _moved(ctx, idx, "pcie_tx")
    if d2h is not None and d2h > 0:
        flood = "" if spent.readings is not None else ": the job copies results to the host"
        evidence.append(
            f"device to host {rate(d2h)} meanwhile (median)"
            + _per_visit(ctx, spent, idx, moved, "synced", st.SYNC, st.COPY)
            + flood
        )
    if spent.readings is None:
        evidence.append(no_stacks(ctx.rec.skipped, ctx.rec.stack_sampler))
    return _cause("host-sync", share, evidence, (*synced, *after), spent, ctx)


def copies_cause(ctx: Context, idx: list[int], share: float, spent: Spent) -> Cause:
    length = ctx.end - ctx.start
    evidence = [
        f"the GPU waited for data copied to it: {pct(share)} of the time it would otherwise "
        f"have worked ({_idle(ctx, idx)})"
    ]
    found = spent.sites(ctx, length, st.COPY)
    evidence += lines(found, "copied")
    h2d, moved = _moved(ctx, idx, "pcie_rx")
    if h2d is not None and h2d > 0:
        evidence.append(
            f"host to device {rate(h2d)} meanwhile (median)"
            + _per_visit(ctx, spent, idx, moved, "copied", st.COPY)
        )
    if found:
        evidence.append(
            "the training thread waited inside the copy: a copy from pinned memory with "
            "non_blocking=True returns at once and overlaps the step, so this one copies from "
            f"pageable memory or waits for its end ({PINNED_NOTE})"
        )
    elif spent.readings is None:
        evidence.append(
            "no loader process was busy meanwhile: the training thread's own copies; "
            + no_stacks(
                ctx.rec.skipped, ctx.rec.stack_sampler, ", nor whether its memory is pinned"
            )
        )
    return _cause("pageable-copies", share, evidence, found, spent, ctx)


DOING = {
    "recompiling": (st.COMPILE, "torch.compile compiled the code again", "compiled"),
    "logging": (st.LOGGING, "the training thread logged", "logged"),
    "optimizer-step": (st.OPTIMIZER, "the training thread ran the optimizer step", "stepped"),
    "collective-wait": (
        st.COLLECTIVE, "the training thread waited in a collective for the other ranks", "waited"
    ),
}  # fmt: skip


def stack_cause(name: str, ctx: Context, idx: list[int], share: float, spent: Spent) -> Cause:
    """A cause only the stacks find: the thread in the library that names it."""
    activity, what, verb = DOING[name]
    length = ctx.end - ctx.start
    evidence = [
        f"{what} while the GPU waited: {pct(share)} of the time it would otherwise have worked "
        f"({_idle(ctx, idx)})"
    ]
    found = spent.sites(ctx, length)  # the cause's own activity (or the engine's, for it)
    evidence += lines(found, verb)
    if name == "recompiling":
        window = list(range(len(ctx.win)))  # a compilation runs on through ticks it lost none
        evidence += _stretches(ctx, spent.readings, window, activity, "compiling")
    return _cause(name, share, evidence, found, spent, ctx)


def _cause(
    name: str,
    share: float,
    evidence: list[str],
    found: Sequence[Site],
    spent: Spent,
    ctx: Context,
) -> Cause:
    length = ctx.end - ctx.start
    return Cause(
        name,
        share,
        tuple(evidence),
        ACTIONS[name],
        sites=tuple(found),
        stacks=top_stacks(ctx.rec, spent.spent, length) if spent.readings is not None else (),
    )
