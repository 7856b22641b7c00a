"""A recording seen the way the diagnosis reads it: one :class:`View` per tick over the GPUs the
job ran on (means over those GPUs, the reasons of any, the hottest temperature), with the job's
side of the same tick."""

from __future__ import annotations

from dataclasses import dataclass

from sparkdiag.sources.nvml.gpu import UNHEALTHY_REASONS, reasons_mask
from sparkdiag.watch.causes import amount, mean, pct
from sparkdiag.watch.model import GpuTick, ProcessLoad, Recording

ACTIVE_MIN = 0.01  # utilization (or SM activity) of a tick in which the GPU ran some kernel
UNHEALTHY_MASK = reasons_mask(UNHEALTHY_REASONS)
POWER_CAP = reasons_mask({"sw_power_cap"})


@dataclass(frozen=True)
class View:
    """One tick. ``util`` is the job's own share of the GPU's busy time: its utilization less
    what other processes' kernels took (``others``, from NVML's per-process samples; 0 where
    none was seen or sampled), and ``eff``, ``sm``, ``tensor``, ``dram`` are the job's share of
    GPM's device-wide figures likewise. ``eff`` is GPM SM activity where the GPU has GPM, else
    utilization; ``sm``, ``tensor`` and ``dram`` are GPM's (None without). ``held``: the job
    was seen holding the GPU this tick (among its compute processes, or holding memory on it).
    ``throttled`` and ``capped``: the share of the tick in which an unhealthy clock event
    reason (``UNHEALTHY_MASK``), the power cap, was read set on any of them (1 or 0 as
    sampled; a share for a tick a long watch merged: ``GpuTick.reasons_held``).
    ``tick``: its index in the recording's ticks. ``pcie_tx``/``pcie_rx``: bytes per second
    device to host / host to device."""

    t: float
    dt: float
    util: float
    eff: float
    sm: float | None = None
    tensor: float | None = None
    dram: float | None = None
    memory_util: float | None = None
    clock: float | None = None
    clock_max: float | None = None
    reasons: int = 0
    throttled: float = 0.0
    capped: float = 0.0
    temperature: float | None = None
    power: float | None = None
    power_limit: float | None = None
    pcie_rx: float | None = None
    pcie_tx: float | None = None
    others: float = 0.0
    tick: int = -1
    gpu_thread: float | None = None
    gpu_thread_name: str = ""
    cpu_cores: float | None = None
    loads: tuple[ProcessLoad, ...] = ()
    write: float | None = None
    read: float | None = None
    io_stall: float | None = None
    cpu_stall: float | None = None
    on_gpu: bool = False
    held: bool = False

    @property
    def idle(self) -> float:
        """The share of the tick in which no kernel ran, the job's or another's."""
        return max(0.0, 1.0 - self.util - self.others)

    @property
    def active(self) -> bool:
        """The GPU ran some kernel during the tick."""
        return self.util >= ACTIVE_MIN or (self.sm or 0.0) >= ACTIVE_MIN


def theirs(g: GpuTick) -> bool:
    """The GPU's tick belongs to other processes: NVML listed none of the job's processes on
    it, and every compute process it listed is one this PID namespace shows (so not the job's,
    ``GpuTick.others_seen``). Never so in a recording without those counts."""
    return (
        not g.job_on_gpu and not g.job_memory_bytes and bool(g.others_seen) and g.others_unseen == 0
    )


def seen_on_a_gpu(rec: Recording) -> bool:
    """NVML listed a process of the job (or memory it holds) on some GPU at some tick."""
    return any(g.job_on_gpu or g.job_memory_bytes for t in rec.ticks for g in t.gpus)


def _held(g: GpuTick) -> bool:
    """The job held the GPU this tick: among its compute processes, or holding memory there."""
    return g.job_on_gpu or bool(g.job_memory_bytes)


def _worked(g: GpuTick) -> bool:
    """The job's kernels ran on the GPU this tick: its processes' own SM samples say so, or the
    GPU was busy beyond what other processes' kernels took."""
    own = (g.utilization or 0.0) - _others(g)
    return (g.job_sm or 0.0) >= ACTIVE_MIN or own >= ACTIVE_MIN


def held_gpus(rec: Recording) -> tuple[int, ...]:
    """The GPUs the job was seen holding at some tick."""
    return tuple(sorted({g.index for t in rec.ticks for g in t.gpus if _held(g)}))


def job_gpus(rec: Recording) -> tuple[int, ...]:
    """The GPUs the job ran on: of those it held, the ones on which it ran kernels while it held
    them (a GPU where it only held memory, a stray CUDA context on cuda:0 while it trained on
    cuda:1, is left out: averaged in, its idle time halved "GPU busy" and read as a cause; all
    it held where it ran no kernel anywhere). Where that is unknown (NVML lists none of its
    processes: another PID namespace, a container), those that ran kernels at some tick that
    was not other processes' (:func:`theirs`), else every GPU."""
    on = held_gpus(rec)
    if on:
        worked = {g.index for t in rec.ticks for g in t.gpus if _held(g) and _worked(g)}
        return tuple(i for i in on if i in worked) or on
    busy = sorted(
        {
            g.index
            for t in rec.ticks
            for g in t.gpus
            if g.utilization is not None and g.utilization >= ACTIVE_MIN and not theirs(g)
        }
    )
    return tuple(busy) if busy else tuple(g.index for g in rec.gpus)


def _others(g: GpuTick) -> float:
    """What other processes' kernels took of one GPU's tick (at most its utilization): all of
    it in a tick that was theirs alone (:func:`theirs`)."""
    if theirs(g):
        return g.utilization or 0.0
    took = sum(o.sm for o in g.others if o.sm is not None)
    return min(took, g.utilization or 0.0)


def views(rec: Recording, gpus: tuple[int, ...]) -> list[View]:
    out = []
    for index, tick in enumerate(rec.ticks):
        mine: list[GpuTick] = [g for g in tick.gpus if g.index in gpus]
        busy = mean([g.utilization for g in mine])
        if busy is None:
            continue
        others = mean([_others(g) for g in mine]) or 0.0
        util = max(0.0, busy - others)
        share = util / busy if busy > 0 else 1.0

        def job(values: list[float | None], share: float = share) -> float | None:
            value = mean(values)
            return None if value is None else value * share

        sm = job([g.sm_activity for g in mine])
        reasons = 0
        for g in mine:
            reasons |= g.reasons or 0
        throttled = max(g.reasons_share(UNHEALTHY_MASK) for g in mine)
        capped = max(g.reasons_share(POWER_CAP) for g in mine)
        temps = [g.temperature for g in mine if g.temperature is not None]
        powers = [g.power_w for g in mine if g.power_w is not None]
        limits = [g.power_limit_w for g in mine if g.power_limit_w is not None]
        out.append(
            View(
                t=tick.t,
                dt=tick.dt,
                util=util,
                eff=util if sm is None else sm,
                sm=sm,
                tensor=job([g.tensor_activity for g in mine]),
                dram=job([g.dram_activity for g in mine]),
                memory_util=mean([g.memory_utilization for g in mine]),
                clock=mean([g.sm_clock_hz for g in mine]),
                clock_max=mean([g.sm_clock_max_hz for g in mine]),
                reasons=reasons,
                throttled=throttled,
                capped=capped,
                temperature=max(temps) if temps else None,
                power=sum(powers) if powers else None,
                power_limit=sum(limits) if len(limits) == len(powers) and limits else None,
                pcie_rx=mean([g.pcie_rx for g in mine]),
                pcie_tx=mean([g.pcie_tx for g in mine]),
                others=others,
                tick=index,
                gpu_thread=tick.job.gpu_thread,
                gpu_thread_name=tick.job.gpu_thread_name,
                cpu_cores=tick.job.cpu_cores,
                loads=tick.job.loads,
                write=tick.job.write_bps,
                read=tick.job.read_bps,
                io_stall=tick.host.io_stall,
                cpu_stall=tick.host.cpu_stall,
                on_gpu=any(g.job_on_gpu for g in mine),
                held=any(g.job_on_gpu or bool(g.job_memory_bytes) for g in mine),
            )
        )
    return out


def smoothed(values: list[float | None]) -> list[float | None]:
    """Each value as the mean of itself and its neighbours (None where it is None)."""
    out: list[float | None] = []
    for i, value in enumerate(values):
        out.append(None if value is None else mean(values[max(0, i - 1) : i + 2]))
    return out


# -- what the report says of the GPUs the job used -------------------------------------------


def _others_busy(rec: Recording, gpus: tuple[int, ...]) -> dict[int, list[float]]:
    """Per GPU of ``gpus``, its utilization in the ticks in which it ran kernels that were
    other processes' (:func:`theirs`)."""
    busy: dict[int, list[float]] = {}
    for tick in rec.ticks:
        for g in tick.gpus:
            if g.index in gpus and theirs(g) and (g.utilization or 0.0) >= ACTIVE_MIN:
                busy.setdefault(g.index, []).append(g.utilization or 0.0)
    return busy


def unused_note(rec: Recording, gpus: tuple[int, ...]) -> str:
    """Why the job is ``gpu-unused``: no kernel ran, or the kernels that ran were other
    processes' (named, pid and name where this PID namespace shows them)."""
    busy = _others_busy(rec, gpus)
    if not busy:
        return (
            f"the job never touched GPU {', '.join(map(str, gpus))}: none of its processes "
            "held it and no kernel ran; check that the job runs on this GPU (device "
            "placement, CUDA_VISIBLE_DEVICES)"
        )
    pids = sorted(
        {p for t in rec.ticks for g in t.gpus if g.index in busy for p in g.others_seen_pids}
    )
    names = {p.pid: p.name for p in rec.tenants}
    who = ", ".join(f"pid {p} {names[p]}" if names.get(p) else f"pid {p}" for p in pids)
    where = ", ".join(
        f"GPU {index} {pct(sum(u) / len(u))} of {len(u)} tick{'s' if len(u) != 1 else ''}"
        for index, u in sorted(busy.items())
    )
    return (
        f"the job held no GPU: the busy time seen ({where}) was other processes' kernels "
        f"({who or 'not named'}), not the job's: NVML listed them, and none of the job's "
        "processes, on the GPU; check that the job runs on a GPU (device placement, "
        "CUDA_VISIBLE_DEVICES)"
    )


def idle_held_note(rec: Recording, gpus: tuple[int, ...]) -> str:
    """The GPUs the job held but ran no kernel on (left out of the diagnosed ``gpus``), in one
    line; "" where there are none."""
    idle = [i for i in held_gpus(rec) if i not in gpus]
    if not idle:
        return ""
    held: dict[int, float] = {}
    for t in rec.ticks:
        for g in t.gpus:
            if g.index in idle and g.job_memory_bytes:
                held[g.index] = max(held.get(g.index, 0.0), g.job_memory_bytes)
    which = ", ".join(
        f"GPU {i}" + (f" ({amount(held[i])} of memory)" if i in held else "") for i in idle
    )
    one = len(idle) == 1
    return (
        f"{which}: the job held {'it' if one else 'them'} but ran no kernel there, so "
        f"{'it is' if one else 'they are'} left out of the figures above (a CUDA context made "
        "and not used, as by a torch.cuda call without a device or a tensor put on the default "
        "device; CUDA_VISIBLE_DEVICES or torch.cuda.set_device keeps the job off it)"
    )


def unknown_gpu_note(rec: Recording, gpus: tuple[int, ...]) -> str:
    """Where NVML never listed the job's processes but the recording counted the others (a
    job or a watch in a container), the GPUs that ran kernels were taken as the job's: say
    that which GPU it used is not known and that their figures may be other processes'."""
    if seen_on_a_gpu(rec):
        return ""
    counted = [g for t in rec.ticks for g in t.gpus if g.index in gpus]
    if not any(g.others_unseen is not None for g in counted):
        return ""  # recorded before the counts: as before
    unseen = max((g.others_unseen or 0 for g in counted), default=0)
    why = (
        f"NVML listed none of the job's processes, and {unseen} compute "
        f"process{'es' if unseen != 1 else ''} that this PID namespace does not show (or shows "
        "in a PID namespace other than the job's: a container), which may be the job's"
        if unseen
        else "NVML listed none of the job's processes"
    )
    return (
        f"which GPU the job used is not known: {why}; GPU {', '.join(map(str, gpus))} ran "
        "kernels and is taken as the job's, so its figures may include other processes' work "
        "(run watch in the job's PID namespace, e.g. docker run --pid=host, to tell them apart)"
    )
