"""A tick's lost GPU time given to what the training thread was doing meanwhile (its stacks in
the recording), in place of the counters' one label.

While the GPU idles, the thread that feeds it is doing something else: every second the GPU lost
is a second the thread spent preparing data, working on results it copied back, copying,
serialising a checkpoint, logging, compiling, in the optimizer, waiting for a collective, for
its loader or for something else. Those activities (:data:`HOST_SIDE`) take the tick's lost time
first, in proportion to the time the thread spent in each, but each at most its own time. What
is left (the GPU idled longer than the thread did anything else) goes to the activities that
can overlap the GPU's own work (:data:`OVERLAPPING`): waiting in a sync (which loses time when
what it waits for is a copy, not a kernel), launching kernels and the optimizer's step on GPU
tensors (its kernels queue behind the backward's, still running: a healthy ViT on the H200 read
optimizer-step 11 % when it took the idle time first), in proportion again; where the thread did
none, to the cause the counters gave the tick. Launching takes none of it where the thread was
not hot (under ``HOT_THREAD`` of a core): it was then off the CPU for part of the time its
stacks were in launches (blocked in the driver or the allocator), so the CPU launching is not
what kept the GPU waiting, and that part of the time goes to no cause (not to the others that
overlap, nor to the counters' label): a healthy ResNet-50 on the H200, its thread at 56 % of a
core and in launching frames for 86 % of its sampled time, read cpu-bound-launcher 11 %.
Samples with no frame read say nothing and are left out.

Work the thread claims to have done itself (:data:`WORK`: preparing data, its own unnamed code,
working on results a sync brought back) needs the thread to have been on a CPU doing it: a
stack is where the thread stood, not that it ran there (a ``time.sleep`` or a blocking read
called from the job's own line reads as that line). Those activities take at most the seconds
the GPU's busiest thread was busy in the tick (``gpu_thread``, as the counters read it); the
rest of their time the thread waited at that line (``WAITING``: input-starved, the line named).
A job asleep in its loop with the GPU idle is input-starved with nobody busy, as without
stacks, not data prepared in the loop at 0 % of a core.

A tick the counters call launch-bound (a hot thread, small kernels) whose thread spent at
least half its time launching, or one in which a hot thread feeds a GPU that runs with gaps and
spent half its time in lines that call torch, is a launcher's tick whole: its loss is the time
the SMs did not work, as without stacks (``diagnose._parts``). The thread's own code doing
something no frame names (``USER``: pure Python, numpy) is launching in a launch-bound tick and
preparing data in any other.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkdiag.watch import stacks as st
from sparkdiag.watch.threads import Readings

CAUSE = {
    st.DATALOADER: "input-starved",
    st.WAITING: "input-starved",
    st.DATA_PREP: "data-prep-in-loop",
    st.AFTER_SYNC: "host-sync",
    st.SYNC: "host-sync",
    st.COPY: "pageable-copies",
    st.CHECKPOINT: "checkpoint-stalls",
    st.LOGGING: "logging",
    st.COMPILE: "recompiling",
    st.OPTIMIZER: "optimizer-step",
    st.HOST_OPTIMIZER: "optimizer-step",
    st.COLLECTIVE: "collective-wait",
    st.LAUNCH: "cpu-bound-launcher",
}
OVERLAPPING = frozenset({st.SYNC, st.LAUNCH, st.OPTIMIZER})
HOST_SIDE = frozenset(CAUSE) - OVERLAPPING
WORK = frozenset({st.DATA_PREP, st.AFTER_SYNC})  # the thread's own work: needs its CPU
COVERAGE_MIN = 0.25  # of a tick: a thread sampled less than this leaves the tick to the counters
LAUNCHING_MIN = 0.5  # of the sampled time launching, in a launch-bound tick: the launcher's


@dataclass(frozen=True)
class Part:
    """Lost seconds given to a cause, and the stack (index) they were spent in; None: the
    counters' label, no stack."""

    cause: str
    stack: int | None
    seconds: float


def training_stacks(readings: Readings, tick: int) -> list[tuple[int, str, float]]:
    """(stack, activity, seconds) of the training threads during one tick of the recording
    (what the autograd engine did for them included: :mod:`.threads`)."""
    return [(s.stack, s.activity, s.seconds) for s in readings.feeding_samples(tick)]


def _known(sampled: list[tuple[int, str, float]]) -> float:
    """The seconds in which a stack was read: an empty one (no Python frame, or a sample
    py-spy could not read) says nothing of what the thread did."""
    return sum(seconds for _, a, seconds in sampled if a != st.NOTHING)


def covered(sampled: list[tuple[int, str, float]], dt: float) -> bool:
    return _known(sampled) >= COVERAGE_MIN * dt


def launching_share(sampled: list[tuple[int, str, float]]) -> float:
    total = _known(sampled)
    launching = sum(s for _, a, s in sampled if a in (st.LAUNCH, st.USER))
    return launching / total if total > 0 else 0.0


def split(
    loss: float,
    dt: float,
    sampled: list[tuple[int, str, float]],
    fallback: str,
    launching: bool,
    hot: bool = True,
    busy: float | None = None,
) -> list[Part]:
    """``loss`` seconds of a ``dt``-second tick shared out over the thread's activities (the
    module docstring); ``launching``: the counters call the tick launch-bound, so the thread's
    own unnamed code (``USER``) was launching; ``hot``: the thread ran at ``HOT_THREAD`` of a
    core or more (or was not measured), else launching's part of the time that overlaps is
    given to no cause; ``busy``: the seconds of the tick the thread was on a CPU (None: not
    measured), at most what its own work (:data:`WORK`) takes, the rest waited."""
    if loss <= 0:
        return []
    total = _known(sampled)
    if total <= 0:
        return [Part(fallback, None, loss)]
    scale = dt / total  # the samples stand for the whole tick
    user = st.LAUNCH if launching else st.DATA_PREP
    resolved = [(stack, user if a == st.USER else a, s * scale) for stack, a, s in sampled]
    if busy is not None:
        resolved = _within_cpu(resolved, busy)
    host = [(stack, a, s) for stack, a, s in resolved if a in HOST_SIDE]
    busy = sum(s for _, _, s in host)
    parts: list[Part] = []
    if busy >= loss:
        return [Part(CAUSE[a], stack, loss * s / busy) for stack, a, s in host]
    parts = [Part(CAUSE[a], stack, s) for stack, a, s in host]
    left = loss - busy
    overlap = [(stack, a, s) for stack, a, s in resolved if a in OVERLAPPING]
    waited = sum(s for _, _, s in overlap)
    if waited <= 0:
        return [*parts, Part(fallback, None, left)]
    # beside a thread that was not hot, launching keeps its proportion of the time but names no
    # cause for it: off the CPU for part of its launches, it did not keep the GPU waiting, and
    # the time is not the sync's or the optimizer's either
    return [*parts, *(Part(CAUSE[a], stack, left * s / waited) for stack, a, s in overlap
                      if hot or a != st.LAUNCH)]  # fmt: skip


def _within_cpu(
    resolved: list[tuple[int, str, float]], busy: float
) -> list[tuple[int, str, float]]:
    """The thread's own work (:data:`WORK`) cut to the ``busy`` seconds it was on a CPU, each
    stack in proportion; the rest of each such stack's time it waited there."""
    work = sum(s for _, a, s in resolved if a in WORK)
    if work <= busy:
        return resolved
    kept = max(0.0, busy) / work
    out: list[tuple[int, str, float]] = []
    for stack, a, s in resolved:
        if a not in WORK:
            out.append((stack, a, s))
            continue
        if kept > 0:
            out.append((stack, a, s * kept))
        if kept < 1:
            out.append((stack, st.WAITING, s * (1.0 - kept)))
    return out
