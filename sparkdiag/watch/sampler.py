"""Sampling for ``sparkdiag watch``: one :class:`~sparkdiag.watch.model.Tick` per call.

The GPU side asks NVML through a :class:`~sparkdiag.sources.nvml.gpu.GpuSource` (so fixtures, the
unsupported memory and the lost-GPU rule work as in the daemon): the driver's utilization
samples since the last tick, GPM activity, SM clock, clock event reasons, temperatures, power,
the compute processes with their utilization (the job's and any other's: a co-tenant), and PCIe
traffic: GPM's PCIe TX/RX rates over each tick where the GPU has GPM (Hopper and later), else
its 20 ms throughput window (each read blocks ~20 ms: every ``pcie_seconds``).
The job side reads ``/proc`` under ``--path.rootfs``: the process tree, CPU per thread, I/O per
process; the host side PSI (the job's cgroup's where the kernel has it), memory and swap.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkdiag.snapshot import ProcessIdentity
from sparkdiag.sources.host import pressure, procfs
from sparkdiag.sources.nvml.gpu import DeviceLost, GpuSource
from sparkdiag.watch.model import (
    GpuInfo,
    GpuTick,
    HostTick,
    JobTick,
    OtherProcess,
    ProcessInfo,
    ProcessLoad,
    Tick,
)
from sparkdiag.watch.places import heavy_files
from sparkdiag.watch.stack_sampler import StackSampler, targets

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
TOP_PROCESSES = 8  # per tick, the busiest processes of the job kept in the recording
LOAD_MIN = 0.01  # a process using less CPU than this (cores) and reading nothing is left out
OTHERS_KEPT = 8  # per GPU and tick, the pids kept of the other processes this namespace shows


def _ratio(value: Any) -> float | None:
    return None if value is None else min(max(float(value) / 100.0, 0.0), 1.0)


Describe = Callable[[list[int]], dict[int, ProcessIdentity]]


class GpuSampler:
    """The GPUs' side of a tick. ``gpus`` limits it to those indices (None: every GPU);
    ``describe`` names the processes outside the job seen on the job's GPUs (pid -> identity,
    :class:`~sparkdiag.sources.host.procfs.ProcessIdentities`), kept in :attr:`tenants`, and
    tells which of the GPUs' other processes this PID namespace shows (it leaves out the pids
    ``/proc`` does not hold); ``rootfs``, where given, is read for the PID namespace of each
    (``/proc/PID/ns/pid``): a process in another one than the job's may be the job's own (a
    container it started), so it counts as not shown."""

    def __init__(
        self,
        source: GpuSource,
        gpus: set[int] | None = None,
        describe: Describe | None = None,
        clock: Callable[[], float] = time.monotonic,
        rootfs: Path | None = None,
    ) -> None:
        self.source = source
        self.rootfs = rootfs
        self.indices = [g.index for g in source.identities if gpus is None or g.index in gpus]
        self.lost: set[int] = set()
        self.job_gpus: set[int] = set()  # GPUs the job was seen on
        self.describe = describe
        self.clock = clock
        self.tenants: dict[int, ProcessInfo] = {}
        self._job_namespace: str | None = None  # the job's PID namespace at this tick

    def infos(self) -> tuple[GpuInfo, ...]:
        return tuple(
            GpuInfo(g.index, g.name, g.uuid, g.memory_model)
            for g in self.source.identities
            if g.index in self.indices
        )

    def sample(self, started_at: float, job_pids: set[int]) -> tuple[GpuTick, ...]:
        self.source.backend.advance()
        self.source.begin()
        self._job_namespace = self._namespace(min(job_pids)) if job_pids else None
        ticks = []
        for index in self.indices:
            if index in self.lost:
                continue
            try:
                ticks.append(self._one(index, started_at, job_pids))
            except DeviceLost:
                self.lost.add(index)
        return tuple(ticks)

    def _one(self, index: int, started_at: float, job_pids: set[int]) -> GpuTick:
        ask = self.source.ask
        raw = ask(index, "utilization_samples") or []
        # the driver's buffer holds seconds from before the watch (the first call), and a
        # recorded fixture replays the same old samples at every tick: only newer ones count
        samples = tuple(
            (t, min(max(float(value) / 100.0, 0.0), 1.0))
            for stamp, value in raw
            if (t := float(stamp) / 1e6 - started_at) >= 0
        )
        rates = ask(index, "utilization")
        if samples:
            utilization: float | None = sum(v for _, v in samples) / len(samples)
        else:
            utilization = None if rates is None else _ratio(rates.get("gpu"))
        gpm = ask(index, "gpm") or {}
        procs = ask(index, "compute_processes")
        mine = [p for p in procs or () if int(p["pid"]) in job_pids]
        on_gpu = bool(mine)
        held = [p["used_memory"] for p in mine if p.get("used_memory") is not None]
        if on_gpu:
            self.job_gpus.add(index)
        job_sm, others = self._processes(index, procs or [], job_pids) if on_gpu else (None, ())
        seen, unseen = self._shown(procs, job_pids)
        # the 20 ms PCIe window blocks ~20 ms per direction: only on the GPUs the job was seen
        # on (on every GPU where NVML lists no processes, or when there is one GPU), and only
        # where the GPU has no GPM PCIe rates
        tx, rx = _pcie_gpm(gpm)
        if tx is None and (index in self.job_gpus or procs is None or len(self.indices) == 1):
            tx, rx = self._pcie_window(index)
        clock = ask(index, "clock", 1)
        clock_max = ask(index, "max_clock", 1)
        power = ask(index, "power_mw")
        limit = ask(index, "power_limit_mw")
        mem_temp = ask(index, "memory_temperature")
        reasons = ask(index, "clock_event_reasons")
        temperature = ask(index, "temperature", 0)
        return GpuTick(
            index=index,
            utilization=utilization,
            samples=samples,
            sm_activity=_ratio(gpm.get("sm")),
            tensor_activity=_ratio(gpm.get("tensor")),
            dram_activity=_ratio(gpm.get("dram")),
            sm_occupancy=_ratio(gpm.get("sm_occupancy")),
            sm_clock_hz=None if clock is None else float(clock) * 1e6,
            sm_clock_max_hz=None if clock_max is None else float(clock_max) * 1e6,
            reasons=None if reasons is None else int(reasons),
            temperature=None if temperature is None else float(temperature),
            memory_temperature=None if not mem_temp else float(mem_temp),
            power_w=None if power is None else float(power) / 1000.0,
            power_limit_w=None if limit is None else float(limit) / 1000.0,
            pcie_tx=tx,
            pcie_rx=rx,
            job_on_gpu=on_gpu,
            memory_utilization=None if rates is None else _ratio(rates.get("memory")),
            job_memory_bytes=float(sum(held)) if held else None,
            job_sm=job_sm,
            others=others,
            others_seen=None if seen is None else len(seen),
            others_seen_pids=tuple(sorted(seen or ())[:OTHERS_KEPT]),
            others_unseen=unseen,
        )

    def _namespace(self, pid: int) -> str | None:
        """The PID namespace of ``pid`` (``/proc/PID/ns/pid``'s link), None where unread."""
        if self.rootfs is None:
            return None
        try:
            return os.readlink(self.rootfs / "proc" / str(pid) / "ns" / "pid")
        except OSError:
            return None

    def _kernel_thread(self, pid: int) -> bool:
        """``pid`` here is a kernel thread (``PF_KTHREAD`` in ``/proc/PID/stat``), which holds
        no GPU: the pid NVML listed is one of another PID namespace that matches it by chance."""
        return self.rootfs is not None and procfs.is_kernel_thread(self.rootfs, pid)

    def _shown(
        self, procs: list[dict[str, Any]] | None, job_pids: set[int]
    ) -> tuple[set[int] | None, int | None]:
        """The compute processes outside the job that this PID namespace shows (certainly not
        the job's), and how many NVML lists that it does not show or shows in another PID
        namespace than the job's (a container the job may have started); (None, None) where
        that cannot be told (NVML lists no processes, or nothing describes them)."""
        if procs is None or self.describe is None:
            return None, None
        outside = sorted({int(p["pid"]) for p in procs} - job_pids)
        known = self.describe(outside) if outside else {}
        seen: set[int] = set()
        for pid in known:
            if self._kernel_thread(pid):  # no GPU context: a pid of another namespace's
                continue
            ns = self._namespace(pid) if self._job_namespace is not None else None
            if ns is None or ns == self._job_namespace:
                seen.add(pid)
        for pid in seen - self.tenants.keys():
            who = known[pid]
            self.tenants[pid] = ProcessInfo(pid, who.name, who.user, who.container_id, who.pod_uid)
        return seen, len(outside) - len(seen)

    def _processes(
        self, index: int, procs: list[dict[str, Any]], job_pids: set[int]
    ) -> tuple[float | None, tuple[OtherProcess, ...]]:
        """The job's SM utilization (its processes' together) and the other compute processes,
        from NVML's per-process samples since the last ask. A process with no sample is None:
        NVML keeps none for a process that ran no kernel (the job's) or is not sampled here."""
        util = self.source.ask(index, "process_utilization")
        sm = {int(u["pid"]): _ratio(u.get("sm")) for u in util or ()}
        job = [v for pid, v in sm.items() if pid in job_pids and v is not None]
        others = tuple(
            OtherProcess(
                pid=int(p["pid"]),
                sm=sm.get(int(p["pid"])) if util is not None else None,
                memory_bytes=None if p.get("used_memory") is None else float(p["used_memory"]),
            )
            for p in procs
            if int(p["pid"]) not in job_pids
        )
        new = [o.pid for o in others if o.pid not in self.tenants]
        if new:
            known = self.describe(new) if self.describe is not None else {}
            for pid in new:
                who = known.get(pid)
                self.tenants[pid] = (
                    ProcessInfo(pid, who.name, who.user, who.container_id, who.pod_uid)
                    if who is not None
                    else ProcessInfo(pid)
                )
        return (min(1.0, sum(job)) if job else None), others

    def _pcie_window(self, index: int) -> tuple[float | None, float | None]:
        tx = self.source.ask(index, "pcie_throughput", 0)
        rx = self.source.ask(index, "pcie_throughput", 1)
        return (None if tx is None else float(tx) * 1024.0), (
            None if rx is None else float(rx) * 1024.0
        )

    def gpu_pids(self, job_pids: set[int]) -> set[int]:
        """The job's processes among the compute processes of the last answer (cached)."""
        found: set[int] = set()
        for index in self.indices:
            if index in self.lost:
                continue
            try:
                procs = self.source.ask(index, "compute_processes") or []
            except DeviceLost:
                continue
            found.update(int(p["pid"]) for p in procs if int(p["pid"]) in job_pids)
        return found


MIB = 1024.0 * 1024.0


def _pcie_gpm(gpm: dict[str, float]) -> tuple[float | None, float | None]:
    """Bytes per second sent (device to host) and received over the tick, from GPM's PCIe rates
    (MiB/s); (None, None) where GPM has none. NVML's PCIe byte-counter fields were tried first
    and dropped: on the H200 they wrap at 32 bits, several times a second under copies."""
    tx, rx = gpm.get("pcie_tx"), gpm.get("pcie_rx")
    if tx is None or rx is None:
        return None, None
    return float(tx) * MIB, float(rx) * MIB


class HostSampler:
    """The job's and the host's side of a tick, as rates over the time since the last call.
    ``own_pid`` (watch's, where ``rootfs`` is its own) is left out of the job's tree with the
    processes under it (py-spy): ``--pid`` of the shell that runs watch, or of PID 1, counted
    watch's own sampling as the job's.

    PSI is the job's cgroup's where the kernel has it (``pressure_scope`` "cgroup"), but a
    cgroup may hold more than the job: a container's, a login session's, a tmux server's. Where
    two ticks in a row find a process in it that is not the job's, nor watch's, nor a parent
    of either (the shell that started them), and that was not idle between them (asleep at
    both, no CPU time run), the scope is "shared-cgroup" from then on: its
    stalls may be another's (a parallel test run on the lent H100 read 26 % I/O stall in the
    container's cgroup for a job that read nothing, and advised a faster store)."""

    def __init__(
        self,
        rootfs: Path,
        sysfs: Path,
        root_pid: int,
        clock: Callable[[], float] = time.monotonic,
        own_pid: int | None = None,
    ) -> None:
        self.rootfs = rootfs
        self.own_pid = own_pid
        self.sysfs = sysfs
        self.root_pid = root_pid
        self.clock = clock
        self._at: float | None = None
        self._cpu: dict[tuple[int, int], procfs.ThreadTimes] = {}
        self._io: dict[int, tuple[float, float]] = {}
        self._pressure: pressure.PressureSample | None = None
        self.cgroup = procfs.cgroup_v2_path(rootfs, root_pid)
        self.scope = "host"
        self.sharers: set[int] = set()  # processes seen in the job's cgroup that are not its
        self._others_before: dict[int, tuple[str, int] | None] = {}  # of the last tick: activity
        self._parents: set[int] | None = None  # the job's and watch's, read once (_note_sharers)
        self.pids: list[int] = []
        self.job_cpus = procfs.allowed_cpus(rootfs, root_pid)
        self.paths: set[str] = set()  # the files written and read heavily (places.py)

    def tree(self) -> list[int]:
        pids = procfs.process_tree(self.rootfs, self.root_pid)
        if self.own_pid is not None and self.own_pid in pids:
            own = set(procfs.process_tree(self.rootfs, self.own_pid))
            pids = [p for p in pids if p not in own]
        self.pids = pids
        return self.pids

    def sample(self, gpu_pids: set[int]) -> tuple[JobTick, HostTick]:
        """The job and the host since the last call; call :meth:`tree` first."""
        now = self.clock()
        dt = None if self._at is None else max(now - self._at, 1e-6)
        self._at = now
        cpu: dict[tuple[int, int], procfs.ThreadTimes] = {}
        for pid in self.pids:
            for tid, times in procfs.thread_times(self.rootfs, pid).items():
                cpu[(pid, tid)] = times
        io: dict[int, tuple[float, float]] = {}
        for pid in self.pids:
            counters = procfs.process_io(self.rootfs, pid)
            if counters is not None:
                io[pid] = (counters.get("rchar", 0.0), counters.get("wchar", 0.0))
        job = JobTick(processes=len(self.pids), threads=len(cpu))
        if dt is not None:
            job = self._job_rates(job, dt, cpu, io, gpu_pids)
        self._cpu, self._io = cpu, io

        sample = pressure.read_pressure(self.rootfs, self.sysfs, self.cgroup)
        self.scope = sample.scope
        if sample.scope == "cgroup":
            self._note_sharers()
        host = HostTick(available_bytes=sample.memory_bytes.get("available"))
        previous, self._pressure = self._pressure, sample
        if dt is not None and previous is not None:
            host = self._host_rates(host, dt, previous, sample)
        return job, host

    @property
    def pressure_scope(self) -> str:
        """Whose stalls PSI counted: "cgroup" (the job's own), "shared-cgroup" (the job's
        cgroup, with other processes in it) or "host"."""
        return "shared-cgroup" if self.scope == "cgroup" and self.sharers else self.scope

    def _note_sharers(self) -> None:
        """Adds to :attr:`sharers` the processes of the job's cgroup that are not the job's,
        nor its parents (the shell that started it, with ``--pid``), nor watch's or watch's
        parents, seen on two ticks in a row (a child of the job that ended between two reads
        is seen once) and not idle between them (asleep at both, no CPU time run: a shell
        waiting at its prompt in the same tmux scope stalls on nothing; one whose activity
        cannot be read counts). Once there is one the scope is settled and the cgroup no
        longer read.
        Nothing is judged once the job has ended (its workers may outlive it), where watch
        reads another root than its own (``--path.rootfs``: the cgroup's pids may be of
        another PID namespace than that /proc's), or where the cgroup's list cannot be read
        (the scope stays "cgroup"). A pid 0 in the list is a process this PID namespace does
        not show: not the job's."""
        if self.sharers or self.cgroup is None or self.own_pid is None or not self.pids:
            return
        members = pressure.cgroup_processes(self.sysfs, self.cgroup)
        # a child the job started after tree() is in the next tick's: seen once, it is left out
        others = set(members or ()) - set(self.pids)
        if others:
            if self._parents is None:  # the job's and watch's: theirs for the whole run
                self._parents = {
                    *procfs.ancestors(self.rootfs, self.root_pid),
                    *procfs.ancestors(self.rootfs, self.own_pid),
                }
            others -= self._parents
            others -= set(procfs.process_tree(self.rootfs, self.own_pid))  # watch, its py-spy
        now = {pid: procfs.process_activity(self.rootfs, pid) for pid in others}
        before = self._others_before
        self.sharers.update(p for p in others if p in before and not _idle(before[p], now[p]))
        self._others_before = now

    def _job_rates(
        self,
        job: JobTick,
        dt: float,
        times: dict[tuple[int, int], procfs.ThreadTimes],
        io: dict[int, tuple[float, float]],
        gpu_pids: set[int],
    ) -> JobTick:
        def rate(now: float | None, before: float | None) -> float:
            # one thread occupies one core at most: above 1.0 is the counters' granularity
            return min(1.0, max(0.0, ((now or 0.0) - (before or 0.0)) / dt))

        old = self._cpu
        cpu = {k: rate(t.cpu, old[k].cpu if k in old else 0.0) for k, t in times.items()}
        # how busy a thread is: on a CPU or waiting for one (schedstat), else on a CPU
        busy = {
            k: rate(t.runnable, old[k].runnable if k in old else 0.0)
            if t.runnable is not None
            else cpu[k]
            for k, t in times.items()
        }
        on_gpu = {k: r for k, r in busy.items() if k[0] in gpu_pids} or busy
        hottest = max(on_gpu, key=lambda k: on_gpu[k], default=None)
        reads = writes = 0.0
        read_by: dict[int, float] = {}
        write_by: dict[int, float] = {}
        for pid, (rchar, wchar) in io.items():
            before = self._io.get(pid, (0.0, 0.0))
            read_by[pid] = max(0.0, rchar - before[0]) / dt
            write_by[pid] = max(0.0, wchar - before[1]) / dt
            reads += max(0.0, rchar - before[0])
            writes += max(0.0, wchar - before[1])
        writing, reading = heavy_files(self.rootfs, write_by, read_by)
        self.paths.update((*writing, *reading))
        return JobTick(
            processes=job.processes,
            threads=job.threads,
            cpu_cores=sum(cpu.values()),
            gpu_thread=None if hottest is None else on_gpu[hottest],
            gpu_thread_name="" if hottest is None else times[hottest].name,
            gpu_thread_id=None if hottest is None else hottest[1],
            other_cpu_cores=sum(r for k, r in cpu.items() if gpu_pids and k[0] not in gpu_pids),
            read_bps=reads / dt if io else None,
            write_bps=writes / dt if io else None,
            loads=_loads(times, cpu, read_by, gpu_pids),
            writing=writing,
            reading=reading,
        )

    @staticmethod
    def _host_rates(
        host: HostTick,
        dt: float,
        before: pressure.PressureSample,
        after: pressure.PressureSample,
    ) -> HostTick:
        def stall(key: str) -> float | None:
            if key not in after.stall_seconds or key not in before.stall_seconds:
                return None
            return min(max((after.stall_seconds[key] - before.stall_seconds[key]) / dt, 0.0), 1.0)

        swap = None
        if after.swapped_pages and before.swapped_pages:
            pages = sum(after.swapped_pages.values()) - sum(before.swapped_pages.values())
            swap = max(0.0, pages) * PAGE_SIZE / dt
        return HostTick(
            memory_stall=stall("memory_some"),
            memory_full=stall("memory_full"),
            io_stall=stall("io_some"),
            cpu_stall=stall("cpu_some"),
            swap_bps=swap,
            available_bytes=host.available_bytes,
        )


# States of a process that waits for nothing that PSI counts: asleep (interruptible), stopped,
# traced, a zombie, an idle kernel thread
IDLE_STATES = frozenset("STtZI")


def _idle(before: tuple[str, int] | None, now: tuple[str, int] | None) -> bool:
    """Between two ticks the process was asleep at both and ran no CPU time."""
    if before is None or now is None:
        return False
    return before[0] in IDLE_STATES and now[0] in IDLE_STATES and now[1] == before[1]


def _loads(
    times: dict[tuple[int, int], procfs.ThreadTimes],
    cpu: dict[tuple[int, int], float],
    read_by: dict[int, float],
    gpu_pids: set[int],
) -> tuple[ProcessLoad, ...]:
    """The busiest processes (CPU over all their threads), at most ``TOP_PROCESSES``."""
    per_pid: dict[int, float] = {}
    for (pid, _tid), rate in cpu.items():
        per_pid[pid] = per_pid.get(pid, 0.0) + rate
    names = {pid: t.name for (pid, tid), t in times.items() if pid == tid}
    kept = [
        pid
        for pid in per_pid
        if per_pid[pid] >= LOAD_MIN or read_by.get(pid, 0.0) > 0.0 or pid in gpu_pids
    ]
    kept.sort(key=lambda pid: -per_pid[pid])
    return tuple(
        ProcessLoad(
            pid=pid,
            name=names.get(pid, "?"),
            cpu_cores=round(per_pid[pid], 4),
            read_bps=read_by.get(pid),
            on_gpu=pid in gpu_pids,
        )
        for pid in kept[:TOP_PROCESSES]
    )


@dataclass(eq=False)
class Sampler:
    """Both sides together; ``tick()`` returns one :class:`Tick`. With ``stacks``, the job's
    Python stacks are recorded beside (the processes on the GPU, else its Python processes);
    ``start`` is the clock's reading at the recording's time 0, ``problems`` what the stack
    sampler could not do, each once."""

    gpu: GpuSampler | None
    host: HostSampler
    started_at: float
    clock: Callable[[], float] = time.monotonic
    stacks: StackSampler | None = None
    problems: list[str] = field(init=False, default_factory=list)
    start: float = field(init=False)
    _last: float = field(init=False)

    def __post_init__(self) -> None:
        self.start = self.clock()
        self._last = self.start

    def fold_stacks(self, ticks: list[Tick]) -> list[Tick]:
        """``ticks`` with the Python stacks read so far in them, before they are merged."""
        return ticks if self.stacks is None else self.stacks.fold(ticks, self.start)

    def tick(self) -> Tick:
        tree = self.host.tree()
        pids = set(tree)
        gpus: tuple[GpuTick, ...] = ()
        gpu_pids: set[int] = set()
        if self.gpu is not None:
            gpus = self.gpu.sample(self.started_at, pids)
            gpu_pids = self.gpu.gpu_pids(pids)
        if self.stacks is not None and tree:
            chosen = targets(self.host.rootfs, tree, gpu_pids, limit=None)
            self.problems += self.stacks.update(chosen, gpu_pids)
        job, host = self.host.sample(gpu_pids)
        now = self.clock()
        tick = Tick(t=now - self.start, dt=now - self._last, gpus=gpus, job=job, host=host)
        self._last = now
        return tick
