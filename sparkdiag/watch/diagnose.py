"""Why a job is slow: a pure function of a :class:`~sparkdiag.watch.model.Recording`.

docs/watch.md defines every cause and share and gives the figures measured on the H200.

**The window.** A job that held the GPU (NVML lists one of its processes, or memory it holds) or,
where NVML cannot name its processes (another PID namespace), whose GPU ran kernels, is diagnosed
over its life: from the first to the last tick at which the GPU's utilization reached
``window.WINDOW_LEVEL`` of the job's typical utilization (the median of the ticks in which it ran
any kernel, ``views.ACTIVE_MIN``). A job starved to 7 % is diagnosed as well as one at 99 %;
start-up and tear-down (imports, CUDA initialisation, a final save) stay out, and so do the
window's first ticks in which the job's stacks show it still importing its modules, and the ticks
at either end in which they show no Python frame at all (the interpreter starting or finalising)
(:mod:`.window`). A job that held the GPU but never ran a kernel is diagnosed over the ticks it held
it. Only a job that never touched the GPU reads "gpu-unused", unless its ranks waited in a
collective: the host causes are judged as where no GPU was sampled. The GPUs diagnosed are those
on which the job ran kernels while it held them (:func:`.views.job_gpus`): one where it only held
memory (a stray CUDA context) is named in a note, not averaged in. A window (once start-up and
tear-down are out) under ``MIN_WINDOW_TICKS`` ticks or ``MIN_WINDOW_SECONDS`` is "too-short": its
figures, no cause.

**Each tick's lost time** goes, by the counters, to at most one cause, in this order:

checkpoint stalls   the job wrote in a burst (at least ``WRITE_BURST_MIN`` bytes/s and
                    ``WRITE_BURST_FACTOR`` times its rate while the GPU worked) in this tick or
                    the next or previous one, or a burst was followed by this tick with the GPU
                    stopped
                    (``CHECKPOINT_IDLE``) and tasks waiting on I/O (PSI ``CHECKPOINT_IO_STALL``)
                    for at most ``CHECKPOINT_TAIL_SECONDS``: a checkpoint fills the page cache
                    in a burst, then waits in fsync writing nothing more (or its thread stays
                    busy closing it); and the ticks right
                    before a burst with the GPU stopped (``CHECKPOINT_IDLE``), for at most
                    ``CHECKPOINT_LEAD_SECONDS``: the state copied to the host and serialised;
                    on either side the one tick in which the GPU stopped part of the time
                    (``IDLE_MIN``) with the job's thread busy (below) belongs to it
stalled kernel      the GPU read busy (utilization at least ``STALL_UTIL``) while GPM showed SMs
                    under ``STALL_SM``, DRAM under ``STALL_DRAM`` and tensor pipes under
                    ``STALL_TENSOR``: a kernel resident and doing nothing, as a collective
                    waiting for a peer, or a spin, does. Without GPM: NVML memory utilization
                    at most ``STALL_MEMORY_UTIL`` with the power near idle (``STALL_POWER`` of
                    the way from idle to the limit, or under ``STALL_POWER_OF_BUSY`` of the
                    power while the job computed)
few SMs busy        kernels ran (utilization at least ``FEW_SM_UTIL``) but kept SMs under
                    ``FEW_SM_MAX`` active while DRAM or tensor pipes worked (``FEW_SM_WORKING``):
                    too small a batch, a serial kernel (GPM only). A finding, not lost time:
                    its share is the SM time left idle while kernels ran
CPU-bound launcher  a thread of the processes that hold the GPU ran at ``HOT_THREAD`` of a core
                    or more (mean of the tick and its two neighbours, which smooths the CPU
                    clock's 10 ms granularity) while kernels ran at least ``LAUNCH_UTIL_MIN`` of
                    the tick with gaps between them (idle at least ``IDLE_MIN``), the GPU worked
                    less than ``LAUNCH_ACTIVITY_MAX`` and its kernels were small (GPM SM
                    activity under ``TINY_KERNELS`` of utilization: the SMs at most half
                    occupied while they ran; where the GPU has no GPM, every such tick); the
                    lost time is what the GPU did not work
idle                the GPU was idle at least ``IDLE_MIN`` of the tick, nothing above applying:
                    input-starved where a process of the job that does not hold the GPU worked
                    (a loader, ``LOADER_WORKING``) or where the GPU's busiest thread was busy
                    less than ``THREAD_OF_IDLE`` of the GPU's idle time (or under
                    ``THREAD_BUSY_MIN`` of the tick): it waited on something; else that thread
                    worked itself: a host sync where the GPU sent the host at least
                    ``PCIE_HEAVY`` bytes/s (a device-to-host flood), copies to the GPU where it
                    received that much, else data prepared in the loop

**With stacks** (py-spy; :mod:`.stacks`, :mod:`.attribute`) the lost time of a tick the
counters give to a host-side cause (any of the idle ones, the launcher, the checkpoint) goes to
what the training thread did meanwhile: the DataLoader, its own data preparation, a host sync
and the work on what it brought back, a copy, a checkpoint, logging, compiling, the optimizer,
a collective, launching; each cause names the lines that took the time (a line read as a copy
to the GPU is a host sync in a tick whose PCIe traffic went to the host alone: at least
``TO_HOST_MIN`` bytes/s, ``TO_HOST_RATIO`` times what went to the GPU). The thread's own work
(data preparation, work on results) takes at most the time its CPU was busy in the tick; the
rest it waited (input-starved at that line).

**A co-tenant** (another process's kernels on the job's GPU, NVML's per-process samples) takes
its busy time of each tick first (``dt * min(others, U - util) / U``); the job's own
utilization is what the rules above read.

**A lost share** (the idle causes, checkpoint stalls) is the time the GPU would otherwise have
worked: per tick ``dt * (1 - (utilization + others) / U)``, where ``U`` is the job's unimpeded
utilization (the median busy share, the job's and any co-tenant's, of the window's ticks no
cause claimed, where those are at least ``UNIMPEDED_MIN_SHARE`` of the window, else 1), summed
over the cause's ticks and divided by the window's length. A stalled kernel loses its ticks'
kernel time (``dt * min(1, util / U)``), and in the ticks where a stall began or ended the
share of the tick it took (``1 - work / usual``: GPM SM activity, else memory utilization,
against the job's when it computes); a launcher loses the time the GPU did not work
(``dt * (1 - SM activity)``).

**Independently of idle time:**

throttled           a thermal, hardware-slowdown or power-brake clock reason while the GPU was
                    busy; the lost time is the clock's shortfall from the median unthrottled
                    busy clock (the power cap is reported as a note: it is the GPU at its limit)
memory pressure     memory PSI ("some" stall time of the host, or of the job's cgroup)
low tensor activity the GPU busy (activity >= 0.5) with tensor pipes under ``TENSOR_LOW``, for at
                    least ``LOW_TENSOR_SHARE`` of its busy time (GPM only); its share is the
                    time computing with tensor pipes idle

Causes below their threshold (``REPORT_MIN``, ``STALL_REPORT_MIN``, ``FEW_SM_REPORT_MIN``,
``COTENANT_REPORT_MIN`` in :mod:`.findings` and the rules in :mod:`.evidence`) are not
reported; a job with none is healthy, and where the GPU still idled ``REPORT_MIN`` of the time
it would otherwise have worked (``Diagnosis.unattributed``) the report says that time was not
attributed rather than that there is nothing to fix. Shares of different causes may overlap (a
throttled tick can also be memory-stalled).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sparkdiag.watch import attribute, ranks, window
from sparkdiag.watch import evidence as ev
from sparkdiag.watch import stacks as st
from sparkdiag.watch.causes import ACTIONS as ACTIONS
from sparkdiag.watch.causes import TITLES as TITLES
from sparkdiag.watch.causes import Cause, mean, pct
from sparkdiag.watch.evidence import HOT_THREAD, IDLE_MIN, LOADER_WORKING, PCIE_HEAVY, TINY_KERNELS
from sparkdiag.watch.findings import REPORT_MIN, Ledger, findings
from sparkdiag.watch.model import Recording
from sparkdiag.watch.threads import Readings, read_recording
from sparkdiag.watch.views import (
    ACTIVE_MIN,
    View,
    idle_held_note,
    job_gpus,
    smoothed,
    unknown_gpu_note,
    unused_note,
    views,
)

__all__ = ["ACTIONS", "TITLES", "Cause", "Diagnosis", "diagnose", "job_gpus"]

LAUNCH_ACTIVITY_MAX = 0.60
LAUNCH_UTIL_MIN = 0.10
THREAD_BUSY_MIN = 0.30
THREAD_OF_IDLE = 0.90
STALL_UTIL = 0.90
STALL_SM = 0.25
STALL_DRAM = 0.01
STALL_TENSOR = 0.01
STALL_MEMORY_UTIL = 0.02
STALL_POWER = 0.25
STALL_POWER_OF_BUSY = 0.70
FEW_SM_UTIL = 0.80
FEW_SM_MAX = 0.30
FEW_SM_WORKING = 0.01
WRITE_BURST_MIN = 50e6
WRITE_BURST_FACTOR = 4.0
CHECKPOINT_IDLE = 0.90
CHECKPOINT_IO_STALL = 0.02
CHECKPOINT_TAIL_SECONDS = 30.0
CHECKPOINT_LEAD_SECONDS = 30.0
UNIMPEDED_MIN_SHARE = 0.20
# a window shorter than this (after its start-up and tear-down are left out) is too short to
# diagnose: one 0.1 s tick read "input-starved, 96 % lost", a healthy ResNet-50's first 20 s
# (one tick of its loop) "healthy, GPU busy 7 %, nothing to fix"
MIN_WINDOW_TICKS = 3
MIN_WINDOW_SECONDS = 2.0
COLLECTIVE_MIN = 0.5  # of a stalled tick's stacks in a collective: the collective's wait
# a tick whose PCIe traffic goes one way, to the host: a line read as a copy to the GPU there
# copies to the host (a .to(device) whose device is the CPU); copies to the GPU read on the
# H200 at 1.3-4.9 GB/s host to device against 0.08-0.29 device to host, the gpt2-host-sync
# job's .to(torch.device("cpu")) at 0.52-1.5 GB/s device to host against 0-10 MB/s
TO_HOST_MIN = 250e6  # bytes/s device to host
TO_HOST_RATIO = 20.0  # times the traffic host to device, at least
# the causes the counters give a tick whose lost time the stacks may share out (attribute.py)
HOST_LABELS = frozenset(
    {"input-starved", "data-prep-in-loop", "host-sync", "pageable-copies",
     "cpu-bound-launcher", "checkpoint-stalls"}
)  # fmt: skip


@dataclass(frozen=True)
class Diagnosis:
    """verdict: "healthy" (no cause found), the name of the largest cause, "too-short" (the job was
    active on the GPU for under ``MIN_WINDOW_TICKS`` ticks or ``MIN_WINDOW_SECONDS``: its figures,
    no cause), "gpu-unused" (the job never touched its GPUs) or "no-gpu" (nothing was sampled on a
    GPU); in these two only host causes are assessed (where ranks waited, memory pressure): the
    largest found is the verdict instead of "no-gpu", and ranks waiting in a collective instead of
    "gpu-unused". ``unimpeded``: the utilization the lost shares are measured against (see the
    module). ``healthy_actions``: what follows the headline where no cause was found (healthy, or
    too short). ``unattributed``: for a healthy verdict, the share of the window the GPU would
    otherwise have worked that no cause took (the idle time of causes under their threshold, or of
    none): at ``findings.REPORT_MIN`` or more the report says so rather than "nothing to fix"."""

    verdict: str
    causes: tuple[Cause, ...]
    window: tuple[float, float]  # seconds since the start of the recording
    gpus: tuple[int, ...]  # the GPUs diagnosed (those the job ran on)
    gpu_busy: float | None  # mean utilization over the window
    tensor_activity: float | None  # mean over the window's busy ticks (GPM)
    notes: tuple[str, ...]
    skipped: tuple[str, ...]
    healthy_actions: tuple[str, ...] = ()
    # when each tick-attributed cause struck: (start, end, cause), contiguous ticks merged
    spans: tuple[tuple[float, float, str], ...] = ()
    unimpeded: float | None = None
    unattributed: float | None = None


def _write_bursts(vs: list[View]) -> set[int]:
    """Indexes of the ticks in which the job wrote in a burst: ``WRITE_BURST_FACTOR`` times
    its usual rate, the median over the ticks in which the GPU worked (at least half the
    tick; all ticks where it never did). A job that checkpoints often writes in half its
    ticks, and the median of them all would be a checkpoint's own rate."""
    writes = [v.write for v in vs if v.write is not None]
    if not writes:
        return set()
    working = [v.write for v in vs if v.write is not None and v.util >= 0.5]
    usual = statistics.median(working or writes)
    floor = max(WRITE_BURST_MIN, WRITE_BURST_FACTOR * usual)
    return {i for i, v in enumerate(vs) if v.write is not None and v.write >= floor}


def _checkpoint_ticks(vs: list[View], bursts: set[int], threads: list[float | None]) -> set[int]:
    """The burst ticks with their neighbours; before each burst the ticks in which the GPU was
    already stopped (``CHECKPOINT_IDLE``), for up to ``CHECKPOINT_LEAD_SECONDS``: the state
    copied to the host and serialised before it is written; and after each burst the ticks in
    which the GPU stays stopped while tasks wait on I/O (PSI; where PSI is missing, on the GPU
    alone) or the job's thread is busy, for up to ``CHECKPOINT_TAIL_SECONDS``: a checkpoint
    fills the page cache in a burst and then waits in fsync or close, writing nothing more.
    Either way the stretch ends with the tick in which the GPU stopped only part of the time
    while the job's thread was busy: the step that ended, or began again, inside it."""
    marked = {j for i in bursts for j in (i - 1, i, i + 1) if 0 <= j < len(vs)}

    def edge(j: int) -> bool:
        return vs[j].idle >= IDLE_MIN and _thread_busy(vs[j], threads[j])

    for i in sorted(bursts):
        lead = 0.0
        for j in range(i - 1, -1, -1):
            v = vs[j]
            if v.idle < CHECKPOINT_IDLE or lead >= CHECKPOINT_LEAD_SECONDS:
                if edge(j) and lead < CHECKPOINT_LEAD_SECONDS:
                    marked.add(j)
                break
            marked.add(j)
            lead += v.dt
    for i in sorted(bursts):
        tail = 0.0
        for j in range(i + 1, len(vs)):
            v = vs[j]
            waiting = v.io_stall is None or v.io_stall >= CHECKPOINT_IO_STALL
            waiting = waiting or _thread_busy(v, threads[j])  # still writing, or closing
            if v.idle < CHECKPOINT_IDLE or not waiting or tail >= CHECKPOINT_TAIL_SECONDS:
                if edge(j) and tail < CHECKPOINT_TAIL_SECONDS:
                    marked.add(j)
                break
            marked.add(j)
            tail += v.dt
    return marked


def _stalled(v: View, idle_power: float | None, busy_power: float | None) -> bool:
    """Busy, and nothing in the GPU works (module docstring)."""
    if v.util < STALL_UTIL:
        return False
    if v.sm is not None:
        return v.sm < STALL_SM and (v.dram or 0.0) < STALL_DRAM and (v.tensor or 0.0) < STALL_TENSOR
    if v.memory_util is None or v.memory_util > STALL_MEMORY_UTIL:
        return False
    if v.power is None:
        return True
    if v.power_limit is not None and idle_power is not None and v.power_limit > idle_power:
        return v.power - idle_power <= STALL_POWER * (v.power_limit - idle_power)
    if busy_power is not None:
        return v.power <= STALL_POWER_OF_BUSY * busy_power
    return True


def _few_sms(v: View) -> bool:
    return (
        v.sm is not None
        and v.util >= FEW_SM_UTIL
        and v.sm < FEW_SM_MAX
        and max(v.dram or 0.0, v.tensor or 0.0) >= FEW_SM_WORKING
    )


def _tiny(v: View) -> bool:
    """The kernels keep the SMs at most ``TINY_KERNELS`` occupied while they run (always so
    without GPM)."""
    return v.sm is None or v.sm < TINY_KERNELS * v.util


def _feeding(v: View, thread: float | None) -> bool:
    """A hot thread feeding a GPU that runs kernels with gaps between them and works under
    ``LAUNCH_ACTIVITY_MAX``: what a launch-bound loop looks like, whatever its kernels' size."""
    return (
        (thread or 0.0) >= HOT_THREAD
        and v.eff < LAUNCH_ACTIVITY_MAX
        and v.util >= LAUNCH_UTIL_MIN
        and v.idle >= IDLE_MIN
    )


def _launch_bound(v: View, thread: float | None) -> bool:
    """Launch-bound by the counters: feeding the GPU small kernels."""
    return _feeding(v, thread) and _tiny(v)


def _powers(vs: list[View], win: list[View]) -> tuple[float | None, float | None]:
    """The GPUs' lowest power over the recording, and their median power in the window's
    ticks that computed (SM activity at least one half; without GPM utilization, with the
    memory working: a stalled tick is not the job computing)."""
    seen = [v.power for v in vs if v.power is not None]
    busy = [
        v.power
        for v in win
        if v.power is not None
        and v.eff >= 0.5
        and (v.sm is not None or (v.memory_util or 1.0) > STALL_MEMORY_UTIL)
    ]
    return (min(seen) if seen else None), (statistics.median(busy) if busy else None)


def _thread_busy(v: View, thread: float | None) -> bool:
    """The GPU's busiest thread was busy about as long as the GPU idled (``THREAD_OF_IDLE`` of
    it, at least ``THREAD_BUSY_MIN`` of the tick): it worked, rather than waited, meanwhile."""
    return (thread or 0.0) >= max(THREAD_BUSY_MIN, THREAD_OF_IDLE * v.idle)


def _waiting_on(v: View, thread: float | None) -> str:
    """What an idle tick waited on, by the counters (module docstring, "idle")."""
    known = any(p.on_gpu for p in v.loads)
    if any(not p.on_gpu and p.cpu_cores >= LOADER_WORKING for p in v.loads if known):
        return "input-starved"
    if not _thread_busy(v, thread):
        return "input-starved"
    if (v.pcie_tx or 0.0) >= PCIE_HEAVY and (v.pcie_tx or 0.0) >= (v.pcie_rx or 0.0):
        return "host-sync"
    if (v.pcie_rx or 0.0) >= PCIE_HEAVY:
        return "pageable-copies"
    return "data-prep-in-loop"


def _label(
    i: int,
    v: View,
    marked: set[int],
    threads: list[float | None],
    idle_power: float | None,
    busy_power: float | None,
) -> str | None:
    if i in marked and v.idle >= IDLE_MIN:
        return "checkpoint-stalls"
    if _stalled(v, idle_power, busy_power):
        return "stalled-kernel"
    if _few_sms(v):
        return "few-sms"
    if _launch_bound(v, threads[i]):
        return "cpu-bound-launcher"
    if v.idle >= IDLE_MIN:
        return _waiting_on(v, threads[i])
    return None


def _unimpeded(win: list[View], labels: list[str | None]) -> float:
    clean = [v.util + v.others for v, label in zip(win, labels, strict=True) if label is None]
    if len(clean) < UNIMPEDED_MIN_SHARE * len(win):
        return 1.0
    return min(1.0, max(statistics.median(clean), 0.5))


def _idle_loss(v: View, unimpeded: float) -> float:
    """The seconds of the tick the GPU would otherwise have worked for the job: its idle time
    against the unimpeded utilization, a co-tenant's share left out."""
    return v.dt * max(0.0, 1.0 - (v.util + v.others) / unimpeded)


def _loss(v: View, label: str, unimpeded: float) -> float:
    """The tick's lost seconds for a cause attributed per tick (module docstring)."""
    if label == "stalled-kernel":
        return v.dt * min(1.0, v.util / unimpeded)
    if label == "few-sms":
        return v.dt * max(0.0, v.util - (v.sm or 0.0))
    if label == "cpu-bound-launcher":
        return v.dt * (1.0 - v.eff)
    return _idle_loss(v, unimpeded)


def _cotenant_loss(v: View, unimpeded: float) -> float:
    """The seconds other processes' kernels took from the job (at most what it lacked), in a
    tick in which the job ran kernels of its own: the GPU's time is sliced between the
    processes that have work queued, so a tick in which the job ran none is one in which it had
    none to run (its thread elsewhere), not one the other process took from it."""
    if v.util < ACTIVE_MIN:
        return 0.0
    return v.dt * min(v.others, max(0.0, unimpeded - v.util)) / unimpeded


def _work(v: View) -> float | None:
    """How hard the GPU worked in the tick: GPM SM activity, else NVML memory utilization."""
    return v.sm if v.sm is not None else v.memory_util


def _stall_edges(win: list[View], labels: list[str | None]) -> dict[int, float]:
    """The ticks on either side of a stalled stretch in which the stall began or ended: busy,
    claimed by no cause, working less than the job does when it computes (the median of its
    busy unclaimed ticks). Index -> the share of the tick stalled, ``1 - work / usual``."""
    computing = [
        w
        for v, label in zip(win, labels, strict=True)
        if label is None and v.util >= STALL_UTIL and (w := _work(v)) is not None
    ]
    if not computing:
        return {}
    usual = statistics.median(computing)
    edges: dict[int, float] = {}
    for i, label in enumerate(labels):
        if label != "stalled-kernel":
            continue
        for j in (i - 1, i + 1):
            if not 0 <= j < len(win) or labels[j] is not None or win[j].util < STALL_UTIL:
                continue
            work = _work(win[j])
            if work is not None and usual > 0:
                fraction = max(0.0, min(1.0, 1.0 - work / usual))
                if fraction >= IDLE_MIN:
                    edges[j] = fraction
    return edges


def _to_host_only(v: View) -> bool:
    """The tick's PCIe traffic went to the host, almost none to the GPU (``TO_HOST_MIN``,
    ``TO_HOST_RATIO``)."""
    tx, rx = v.pcie_tx, v.pcie_rx
    return tx is not None and rx is not None and tx >= TO_HOST_MIN and rx * TO_HOST_RATIO <= tx


def _parts(
    rec: Recording,
    readings: Readings | None,
    v: View,
    label: str,
    unimpeded: float,
    thread: float | None,
) -> list[attribute.Part]:
    """The tick's lost time by cause: the counters' label whole, or shared out over what the
    training thread did (attribute.py) where its stacks cover the tick. A tick whose thread
    spent half its time or more launching is the launcher's whole (losing the time the SMs did
    not work) where the counters call it launch-bound, or where the thread feeds the GPU as a
    launch-bound loop does and the stacks name torch calls (not only unnamed code) for that
    half: the stacks tell launching from preparing data, which the kernels' size guessed. In a
    tick whose PCIe traffic went to the host alone (:func:`_to_host_only`), a line read as a
    copy to the GPU is a host sync: its text said "device", the counters say which way."""
    loss = _loss(v, label, unimpeded)
    if readings is None or label not in (*HOST_LABELS, "stalled-kernel"):
        return [attribute.Part(label, None, loss)]
    sampled = attribute.training_stacks(readings, v.tick)
    if not attribute.covered(sampled, v.dt):
        return [attribute.Part(label, None, loss)]
    if label == "stalled-kernel":  # a collective's kernel waiting for a peer, where it shows
        waits = [(s, sec) for s, a, sec in sampled if a == st.COLLECTIVE]
        waited = sum(sec for _, sec in waits)
        if waited < COLLECTIVE_MIN * sum(sec for _, a, sec in sampled if a != st.NOTHING):
            return [attribute.Part(label, None, loss)]
        return [attribute.Part("collective-wait", s, loss * sec / waited) for s, sec in waits]
    if _to_host_only(v):  # a copy read from its text is the other way: a sync
        sampled = [(s, st.SYNC if a == st.COPY else a, sec) for s, a, sec in sampled]
    launch_bound = _launch_bound(v, thread)
    total = sum(sec for _, a, sec in sampled if a != st.NOTHING)
    named = sum(sec for _, a, sec in sampled if a == st.LAUNCH) / total if total > 0 else 0.0
    if (launch_bound and attribute.launching_share(sampled) >= attribute.LAUNCHING_MIN) or (
        _feeding(v, thread) and named >= attribute.LAUNCHING_MIN
    ):
        launching = [(s, st.LAUNCH, sec) for s, a, sec in sampled if a in (st.LAUNCH, st.USER)]
        lost = v.dt * (1.0 - v.eff)
        return attribute.split(lost, v.dt, launching, "cpu-bound-launcher", launching=True)
    hot = thread is None or thread >= HOT_THREAD  # a thread not measured: as before the rule
    busy = None if thread is None else thread * v.dt
    return attribute.split(_idle_loss(v, unimpeded), v.dt, sampled, label, launch_bound, hot, busy)


def _ranks_without_gpu(rec: Recording, why: str) -> Cause | None:
    """Without a GPU's figures (``why``: none sampled, or the job used none), the ranks' stacks
    alone (ranks.py), over the ticks after they imported."""
    if not rec.stacks:
        return None
    readings = read_recording(rec)
    started = [
        k
        for k in range(len(rec.ticks))
        if any(s.activity not in (st.IMPORTING, st.NOTHING) for s in readings.samples(k))
    ]
    return (
        ranks.cause_without_gpu(rec, readings, range(started[0], len(rec.ticks)), why)
        if started
        else None
    )


def _host_causes(rec: Recording, why: str) -> list[Cause]:
    """What is judged of a job without a GPU's figures: where its ranks waited, memory
    pressure; the largest share first."""
    end = rec.ticks[-1].t if rec.ticks else 0.0
    found = [c for c in (_ranks_without_gpu(rec, why), ev.memory_cause(rec, 0.0, end)) if c]
    return sorted(found, key=lambda c: -c.share)


def diagnose(rec: Recording) -> Diagnosis:
    """The diagnosis of a recording (see the module docstring for the rules)."""
    gpus = job_gpus(rec)
    vs = views(rec, gpus)
    skipped = list(rec.skipped)
    if not vs:
        found_causes = _host_causes(rec, "no GPU was sampled")
        return Diagnosis(
            verdict=found_causes[0].name if found_causes else "no-gpu",
            causes=tuple(found_causes),
            window=(0.0, rec.ticks[-1].t if rec.ticks else 0.0),
            gpus=(),
            gpu_busy=None,
            tensor_activity=None,
            notes=(),
            skipped=(
                *skipped,
                "no GPU was sampled: input, launcher, checkpoint, stall, throttling and tensor "
                "causes are not assessed",
            ),
        )
    found = window.active(vs)
    if found is None:
        # the job's ranks may still wait for one another (gloo on the CPUs, a barrier before
        # the first kernel): named as where no GPU was sampled, not hidden behind the GPU (on
        # the lent H100, ranks stopped in a collective read "gpu-unused" and no cause); that
        # wait is the verdict, memory pressure (maybe another's) only a cause below it
        found_causes = _host_causes(rec, "the job used no GPU")
        waited = [c for c in found_causes if c.name == "collective-wait"]
        return Diagnosis(
            verdict="collective-wait" if waited else "gpu-unused",
            causes=tuple(found_causes),
            window=(vs[0].t - vs[0].dt, vs[-1].t),
            gpus=gpus,
            gpu_busy=mean([v.util for v in vs]),
            tensor_activity=None,
            notes=(unused_note(rec, gpus),),
            skipped=tuple(skipped),
        )
    readings = read_recording(rec) if rec.stacks else None
    first, last = window.trimmed(rec, readings, vs, *found)
    win = vs[first : last + 1]
    start, end = win[0].t - win[0].dt, win[-1].t
    length = max(end - start, 1e-9)
    notes = [note for note in (unknown_gpu_note(rec, gpus), idle_held_note(rec, gpus)) if note]
    if len(win) < MIN_WINDOW_TICKS or end - start < MIN_WINDOW_SECONDS:
        return _too_short(win, gpus, notes, skipped)
    idle_power, busy_power = _powers(vs, win)
    bursts = _write_bursts(win)
    threads = smoothed([v.gpu_thread for v in win])
    marked = _checkpoint_ticks(win, bursts, threads)
    labels = [_label(i, v, marked, threads, idle_power, busy_power) for i, v in enumerate(win)]
    unimpeded = _unimpeded(win, labels)
    ctx = ev.Context(rec, gpus, win, threads, start, end, idle_power, busy_power)

    ledger = Ledger()
    edges = _stall_edges(win, labels)
    for i, (v, label) in enumerate(zip(win, labels, strict=True)):
        if v.throttled >= 0.5 and v.util >= 0.5:
            ledger.spans.append((v.t - v.dt, v.t, "throttled"))
        if i in edges:  # part of the tick stalled, the rest computed
            ledger.add(i, v, attribute.Part("stalled-kernel", None, v.dt * edges[i]))
        if v.others > 0:
            ledger.add(i, v, attribute.Part("co-tenant", None, _cotenant_loss(v, unimpeded)))
        if label is None:
            continue
        for part in _parts(rec, readings, v, label, unimpeded, threads[i]):
            ledger.add(i, v, part)

    causes = findings(ctx, ledger, length, bursts, readings, notes)
    busy = [v for v in win if v.eff >= 0.5]
    tensor_mean = _tensor_mean(win)
    if any(v.tensor is not None for v in win):
        low = ev.low_tensor_cause(busy, length)
        if low:
            causes.append(low)
    else:
        skipped.append(
            "tensor and SM activity: no GPM on this GPU (before Hopper, or not exposed); "
            "low tensor activity and few busy SMs not assessed, the launcher and stall rules "
            "use utilization, memory utilization and power"
        )
    causes.sort(key=lambda c: -c.share)
    busy_share = mean([v.util for v in win])
    healthy_actions: tuple[str, ...] = ()
    unattributed = None
    if not causes:
        unattributed = sum(_idle_loss(v, unimpeded) for v in win) / length
        healthy_actions = (_healthy_line(busy_share or 0.0, tensor_mean, unattributed),)
    reported = {c.name for c in causes}
    return Diagnosis(
        verdict=causes[0].name if causes else "healthy",
        causes=tuple(causes),
        window=(start, end),
        gpus=gpus,
        gpu_busy=busy_share,
        tensor_activity=tensor_mean,
        notes=tuple(notes),
        skipped=tuple(skipped),
        healthy_actions=healthy_actions,
        spans=_merge([span for span in ledger.spans if span[2] in reported]),
        unimpeded=unimpeded,
        unattributed=unattributed,
    )


def _tensor_mean(win: list[View]) -> float | None:
    """Tensor-pipe activity, the mean over the window's busy ticks (GPM)."""
    values = [v.tensor for v in win if v.eff >= 0.5 and v.tensor is not None]
    return sum(values) / len(values) if values else None


def _healthy_line(busy: float, tensor: float | None, unattributed: float) -> str:
    """What follows a healthy headline: nothing to fix, or, where the GPU idled
    ``REPORT_MIN`` of the time it would otherwise have worked with no cause over its threshold,
    that this time was not attributed."""
    figures = f"the GPU was busy {pct(busy)} of the time" + (
        "" if tensor is None else f", tensor pipes {pct(tensor)}"
    )
    if unattributed < REPORT_MIN:
        return (
            f"nothing to fix: {figures}; to go faster, scale the batch or the model, or compare "
            "with sparkdiag probe"
        )
    return (
        f"{figures}; its idle time went to causes each under their threshold "
        f"({pct(REPORT_MIN)}) or to none the rules name: lost, but not attributed; --plot "
        "shows when the GPU idled"
    )


def _too_short(
    win: list[View], gpus: tuple[int, ...], notes: list[str], skipped: list[str]
) -> Diagnosis:
    """A window under ``MIN_WINDOW_TICKS`` ticks or ``MIN_WINDOW_SECONDS``: what was measured
    over it, and no cause."""
    start, end = win[0].t - win[0].dt, win[-1].t
    busy = mean([v.util for v in win]) or 0.0
    tensor = _tensor_mean(win)
    ticks = f"{len(win)} tick{'s' if len(win) != 1 else ''}"
    line = (
        f"measured over {end - start:.1f} s ({ticks}): GPU busy {pct(busy)}, idle "
        f"{pct(mean([v.idle for v in win]) or 0.0)}"
        + ("" if tensor is None else f", tensor pipes {pct(tensor)} when busy")
        + "; no cause is named from so little: watch the job longer (its whole run, or a "
        "--duration of 30 s or more)"
    )
    return Diagnosis(
        verdict="too-short",
        causes=(),
        window=(start, end),
        gpus=gpus,
        gpu_busy=busy,
        tensor_activity=tensor,
        notes=tuple(notes),
        skipped=tuple(skipped),
        healthy_actions=(line,),
    )


def _merge(spans: list[tuple[float, float, str]]) -> tuple[tuple[float, float, str], ...]:
    merged: list[tuple[float, float, str]] = []
    for start, end, name in sorted(spans, key=lambda s: (s[2], s[0])):
        if merged and merged[-1][2] == name and start <= merged[-1][1] + 1e-6:
            merged[-1] = (merged[-1][0], end, name)
        else:
            merged.append((start, end, name))
    return tuple(sorted(merged))
