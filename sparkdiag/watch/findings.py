"""From lost seconds to findings: the :class:`Ledger` the diagnosis fills tick by tick (each
cause's lost seconds, its ticks, the stacks its seconds were spent in, the spans to shade), and
:func:`findings`, which turns it into the causes over their thresholds, each with its evidence,
the lines of code that took the time and what to try."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sparkdiag.watch import evidence as ev
from sparkdiag.watch import loaders, ranks, tenants
from sparkdiag.watch import loop_evidence as loop
from sparkdiag.watch import store_evidence as stores
from sparkdiag.watch.attribute import Part
from sparkdiag.watch.causes import ACTIONS, Cause, pct
from sparkdiag.watch.sites import lines, top_stacks
from sparkdiag.watch.threads import Readings
from sparkdiag.watch.views import View

REPORT_MIN = 0.10  # a cause of lost time below this share of the window is not reported
STALL_REPORT_MIN = 0.05  # a stalled kernel: a hang matters even when short
STALL_MIN_TICKS = 2
FEW_SM_REPORT_MIN = 0.20
COTENANT_REPORT_MIN = 0.05
SPAN_MIN = 0.10  # of a tick: a cause that took less of it is not shaded there


@dataclass
class Ledger:
    loss: dict[str, float] = field(default_factory=dict)
    ticks: dict[str, list[int]] = field(default_factory=dict)
    by_stack: dict[str, dict[int, float]] = field(default_factory=dict)
    spans: list[tuple[float, float, str]] = field(default_factory=list)

    def add(self, i: int, v: View, part: Part) -> None:
        if part.seconds <= 0:
            return
        name = part.cause
        self.loss[name] = self.loss.get(name, 0.0) + part.seconds
        ticks = self.ticks.setdefault(name, [])
        if not ticks or ticks[-1] != i:
            ticks.append(i)
        if part.stack is not None:
            spent = self.by_stack.setdefault(name, {})
            spent[part.stack] = spent.get(part.stack, 0.0) + part.seconds
        if part.seconds >= SPAN_MIN * v.dt:
            self.spans.append((v.t - v.dt, v.t, name))


DOINGS = {"input-starved": "waited", "cpu-bound-launcher": "launched",
          "checkpoint-stalls": "saved"}  # fmt: skip


def _with_sites(cause: Cause, ctx: ev.Context, spent: loop.Spent, length: float) -> Cause:
    """An existing cause with the lines its time was spent in, where stacks were sampled."""
    if spent.readings is None or not spent.spent:
        return cause
    found = spent.sites(ctx, length)
    return replace(
        cause,
        evidence=(*cause.evidence, *lines(found, DOINGS.get(cause.name, "spent"))),
        sites=found,
        stacks=top_stacks(ctx.rec, spent.spent, length),
    )


def _with_store(
    cause: Cause, ctx: ev.Context, idx: list[int], moved: float | None, writing: bool
) -> Cause:
    """The cause with where it wrote (read) and what that store and the others measured; a
    faster store first in the advice where the one used is a network share or measured slower
    (for the input, only where the store is what it waits on)."""
    lines, action = stores.store_lines(ctx, stores.paths(ctx, idx, writing), moved, writing)
    if not lines:
        return cause
    actions = cause.actions
    if action is not None and (writing or actions[:1] == (ev.STORE,)):
        actions = (action, *actions)
    return replace(cause, evidence=(*cause.evidence, *lines), actions=actions)


def _with_ranks(cause: Cause, ctx: ev.Context, readings: Readings) -> Cause:
    """A collective's wait with the ranks' side: the rank that does not arrive, a straggler."""
    found = ranks.find(ctx.rec, readings, [v.tick for v in ctx.win])
    if found is None:
        return cause
    return replace(
        cause,
        evidence=(*cause.evidence, *found.evidence),
        actions=(found.first, *cause.actions),
    )


def _checkpoint(ctx: ev.Context, bursts: set[int], idx: list[int], share: float) -> Cause:
    if bursts:
        cause = ev.checkpoint_cause(ctx, bursts, idx, share)
        return _with_store(cause, ctx, idx, stores.checkpoint_rate(ctx, bursts, idx), True)
    return Cause(
        "checkpoint-stalls",
        share,
        (
            f"the training thread saved a checkpoint while the GPU waited: {pct(share)} of the "
            "time it would otherwise have worked (no write burst stood out: the writes were "
            "spread out, or went elsewhere than the job's own calls)",
        ),
        ACTIONS["checkpoint-stalls"],
    )


def findings(
    ctx: ev.Context,
    ledger: Ledger,
    length: float,
    bursts: set[int],
    readings: Readings | None,
    notes: list[str],
) -> list[Cause]:
    """The causes over their thresholds (module docstring); the window-wide ones (throttling,
    memory pressure) too. ``notes`` gets what is worth saying but is no cause."""
    share = {k: v / length for k, v in ledger.loss.items()}
    ticks = ledger.ticks

    def spent(name: str) -> loop.Spent:
        return loop.Spent(readings, ledger.by_stack.get(name, {}))

    def over(name: str, minimum: float = REPORT_MIN) -> bool:
        return share.get(name, 0.0) >= minimum

    causes: list[Cause] = []
    if over("co-tenant", COTENANT_REPORT_MIN):
        causes.append(tenants.cotenant_cause(ctx, share["co-tenant"]))
    notes.extend(tenants.unmeasured(ctx))
    if over("input-starved"):
        idx = ticks["input-starved"]
        cause = ev.input_cause(ctx, idx, share["input-starved"])
        cause = _with_store(cause, ctx, idx, ev.median_read(ctx, idx), False)
        if readings is not None:  # what the loaders did while the GPU waited for them
            at = loaders.loader_lines(ctx.rec, readings, [ctx.win[i].tick for i in idx])
            cause = replace(cause, evidence=(*cause.evidence, *loaders.evidence(at)))
        causes.append(_with_sites(cause, ctx, spent("input-starved"), length))
    if over("stalled-kernel", STALL_REPORT_MIN) and len(ticks["stalled-kernel"]) >= STALL_MIN_TICKS:
        causes.append(ev.stalled_cause(ctx, ticks["stalled-kernel"], share["stalled-kernel"]))
    if over("few-sms", FEW_SM_REPORT_MIN):
        causes.append(ev.few_sms_cause(ctx, ticks["few-sms"], share["few-sms"]))
    if over("cpu-bound-launcher"):
        cause = ev.launcher_cause(ctx, ticks["cpu-bound-launcher"], share["cpu-bound-launcher"])
        causes.append(_with_sites(cause, ctx, spent("cpu-bound-launcher"), length))
    if over("checkpoint-stalls"):
        cause = _checkpoint(ctx, bursts, ticks["checkpoint-stalls"], share["checkpoint-stalls"])
        causes.append(_with_sites(cause, ctx, spent("checkpoint-stalls"), length))
    for name, build in (
        ("data-prep-in-loop", loop.data_prep_cause),
        ("host-sync", loop.host_sync_cause),
        ("pageable-copies", loop.copies_cause),
    ):
        if over(name):
            cause = build(ctx, ticks[name], share[name], spent(name))
            if name == "data-prep-in-loop":  # the loop reading its data itself: from where
                cause = _with_store(
                    cause, ctx, ticks[name], ev.median_read(ctx, ticks[name]), False
                )
            causes.append(cause)
    for name in loop.DOING:
        minimum = STALL_REPORT_MIN if name == "collective-wait" else REPORT_MIN  # a hang
        if over(name, minimum):
            cause = loop.stack_cause(name, ctx, ticks[name], share[name], spent(name))
            if name == "collective-wait" and readings is not None:
                cause = _with_ranks(cause, ctx, readings)
            causes.append(cause)
    throttled = ev.throttle_cause(ctx.win, length, notes)
    if throttled:
        causes.append(throttled)
    memory = ev.memory_cause(ctx.rec, ctx.start, ctx.end)
    if memory:
        causes.append(memory)
    return causes
