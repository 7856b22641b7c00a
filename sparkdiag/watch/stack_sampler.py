"""The job's Python stacks beside the counters: py-spy (:mod:`sparkdiag.sources.host.pyspy`) records
the processes that hold the GPU (before NVML names them, or without NVML, the job's Python
processes), and at the end every stretch a thread spent in one stack is cut into the ticks it
overlaps, so that each tick holds what each thread was doing while the counters were read.

A recorder is replaced every ``CHUNK_SECONDS`` (the new one starts before the old one stops, and
the stretches are cut where they meet): py-spy keeps a chrome trace in memory until it ends, so
a long watch keeps at most a chunk's trace there. A recorder that fails at once (the process
not yet a Python interpreter, a race with its start) is started again every ``RETRY_SECONDS``,
at most ``RETRIES`` times; why the last one failed is said once.

At most ``MAX_PROCESSES`` processes are recorded at a time: a slot is freed once its process is
gone and its recorders are read (a launch script's data-prep pool, then its training script),
a process on the GPU takes the slot of one that is not where every slot is taken, and one on the
GPU that gets none is said (:meth:`StackSampler.update`); where it gets one later, the report
says from when it has stacks instead (:meth:`StackSampler.settled`).
"""

from __future__ import annotations

import bisect
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from sparkdiag.sources.host import procfs, pyspy
from sparkdiag.watch.model import (
    LOADER_NAMES,
    RankInfo,
    StackFrame,
    StackTime,
    ThreadInfo,
    Tick,
)

STACK_RATE = 20  # samples a second (see docs/watch.md: its cost and why not more)
CHUNK_SECONDS = 30.0
RETRY_SECONDS = 1.0
# A chunk's first stretch in the thread's last stack goes on with it when it begins within this
# of the last one's end. The two meet where the last recorder was stopped, 0 apart on an idle
# machine; on two loaded cores the stopped recorder's last sample came more than 0.1 s (the
# bound until 2026-12-05) before the stop, and one wait across a chunk read as two visits (a
# test failed so twice in the fast subset). A failed recorder's retry comes
# RETRY_SECONDS after the failure, so this stays well below that.
CONTINUES_SECONDS = 0.5
RETRIES = 10
MAX_PROCESSES = 8


@dataclass
class _Target:
    pid: int
    current: pyspy.Recorder | None = None
    stopping: list[pyspy.Recorder] = field(default_factory=list)
    tries: int = 0
    retry_at: float = 0.0
    worked: bool = False
    error: str = ""


@dataclass(frozen=True)
class StackTables:
    """What the recording keeps of the stacks: its tables and the ticks pointing into them."""

    frames: tuple[StackFrame, ...]
    stacks: tuple[tuple[int, ...], ...]
    threads: tuple[ThreadInfo, ...]
    ticks: tuple[Tick, ...]


class StackSampler:
    """Records the stacks of the processes :meth:`update` names, until :meth:`finish`."""

    def __init__(
        self,
        binary: Path,
        rootfs: Path,
        rate: int = STACK_RATE,
        native: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.binary, self.rootfs, self.rate, self.native, self.clock = (
            binary, rootfs, rate, native, clock
        )  # fmt: skip
        self.workdir = Path(tempfile.mkdtemp(prefix="sparkdiag-watch-stacks-"))
        self.targets: dict[int, _Target] = {}
        self.segments: list[pyspy.Segment] = []
        # one tuple of frames a process's distinct stack, which every stretch in it shares: a
        # stretch held its own (2.2 KB at 75 frames: 76 MiB an hour at 10 changes a second)
        self._stacks: dict[tuple[int, tuple[pyspy.Frame, ...]], tuple[pyspy.Frame, ...]] = {}
        self._names: dict[str, str] = {}
        self._folder: Folder | None = None  # the stretches let go of so far (fold)
        self.problems: list[str] = []  # each said once
        self.lines = pyspy.SourceLines(rootfs)
        self.texts: dict[tuple[int, str, int], str] = {}
        self.names: dict[int, str] = {}  # pid -> its name, read while it runs
        self._ranks: dict[int, RankInfo] = {}  # pid -> its distributed rank, where it has one
        self.retired: list[_Target] = []  # gave their slot up, recorders still to be read
        self.done: set[int] = set()  # gone, or py-spy gave up on them: not taken again
        self.unsampled: set[int] = set()  # on the GPU, no slot left for them: said
        # the no-slot lines said, each with the (pid, name) it named, and when a process said
        # there had a slot after all (one ended): settled() words the report from them
        self._no_slot: dict[str, tuple[tuple[int, str], ...]] = {}
        self._noted_start: dict[int, str | None] = {}  # tells a later process given the pid
        self._slotted: dict[int, float] = {}
        self._recorded: set[int] = set()  # py-spy gave stretches of them
        self._failed: set[int] = set()  # why py-spy gave nothing is said in a line of its own
        self.version = pyspy.version(binary) or "py-spy"

    @property
    def ranks(self) -> tuple[RankInfo, ...]:
        """The ranks of the processes recorded, DataLoader workers left out: a worker inherits
        its rank's environment (and its ``RANK``), and may take its name after it was read."""
        return tuple(
            r
            for pid, r in self._ranks.items()
            if not self.names.get(pid, "").startswith(LOADER_NAMES)
        )

    def describe(self) -> str:
        how = (
            "with native frames, stopping the job at each sample"
            if self.native
            else ("non-blocking")
        )
        return f"{self.version}, {self.rate} samples a second per process, {how}"

    def _recorder(self, target: _Target) -> pyspy.Recorder | None:
        rec = pyspy.Recorder(self.binary, target.pid, self.workdir, self.rate, self.native,
                             self.clock)  # fmt: skip
        try:
            rec.start()
        except OSError as exc:  # py-spy itself would not run
            target.error, target.tries = f"cannot run {self.binary}: {exc.strerror or exc}", RETRIES
            return None
        return rec

    def update(self, pids: Iterable[int], on_gpu: Collection[int] = ()) -> list[str]:
        """Record ``pids`` (in their order, at most ``MAX_PROCESSES`` at a time), rotate the
        chunks and read the finished ones; the problems newly found, each in one line.

        A process's slot is freed once it is gone (or py-spy gave up on it for good) and its
        recorders are read: a launch script's ``multiprocessing.Pool(8)`` took every slot and
        the training script it ran next was never recorded. With every slot taken, a process
        of ``on_gpu`` (those holding a GPU) takes the slot of one that is not (a DataLoader
        worker first, else the one recorded last: its recorder is stopped and read, what it
        recorded kept); one on the GPU that still gets none is said."""
        now = self.clock()
        before = len(self.problems)
        self._free()
        gpu = set(on_gpu)
        unsampled = []
        for pid in pids:
            if pid in self.targets or pid in self.done:
                continue
            if len(self.targets) >= MAX_PROCESSES and pid in gpu:
                self._retire(gpu)
            if len(self.targets) < MAX_PROCESSES:
                self.targets[pid] = _Target(pid)
                noted = self._noted_start.get(pid)
                if pid in self.unsampled and noted == procfs.start_time(self.rootfs, pid):
                    self._slotted.setdefault(pid, now)
            elif pid in gpu and pid not in self.unsampled:
                unsampled.append(pid)
        self._say_unsampled(unsampled)
        # read again while they run: a DataLoader worker takes its name when its loop starts
        self.names.update(procfs.process_names(self.rootfs, list(self.targets)))
        for pid in self.targets:
            if pid not in self._ranks:
                self._ranks[pid] = rank_of(self.rootfs, pid)
        for target in self.targets.values():
            self._step(target, now)
        for target in self.retired:
            self._drain(target)
        self.retired = [t for t in self.retired if t.stopping]
        return self.problems[before:]

    def _free(self) -> None:
        """Free the slots of the processes gone, and of those py-spy gave up on for good, whose
        recorders are all read; neither is taken again (a pid read in the tree just before its
        process ended would have been, and said as one py-spy could not read)."""
        for pid, target in list(self.targets.items()):
            if target.current is not None or target.stopping:
                continue
            gone = not _alive(self.rootfs, pid)
            if gone or (not target.worked and target.tries >= RETRIES):
                if gone and not target.worked:
                    self._fail(target)  # why it gave nothing, where py-spy said
                self.done.add(pid)
                del self.targets[pid]

    def _retire(self, gpu: set[int]) -> None:
        """Free a slot for a process on the GPU: the one of a process that is not on it (a
        DataLoader worker first, else the one taken last), its recorders stopped and read
        later (:attr:`retired`)."""
        others = [pid for pid in self.targets if pid not in gpu]
        if not others:
            return
        loaders = [p for p in others if self.names.get(p, "").startswith(LOADER_NAMES)]
        pid = (loaders or others)[-1]
        target = self.targets.pop(pid)
        if target.current is not None:
            target.stopping.append(target.current)
            target.current = None
        for rec in target.stopping:
            rec.stop()
        self.retired.append(target)

    def _drain(self, target: _Target) -> None:
        """Read the recorders of ``target`` that have stopped."""
        for old in [r for r in target.stopping if not r.running()]:
            target.stopping.remove(old)
            self._collect(target, old)

    def _say_unsampled(self, pids: list[int]) -> None:
        """Say, once, the processes on the GPU that no slot was left for."""
        if not pids:
            return
        self.unsampled.update(pids)
        for pid in pids:
            self._noted_start[pid] = procfs.start_time(self.rootfs, pid)
        names = procfs.process_names(self.rootfs, pids)
        named = tuple((pid, names.get(pid, "?")) for pid in pids)
        line = _no_slot_line(named)
        self._no_slot[line] = named
        self.problems.append(line)

    def settled(self, lines: Sequence[str], start: float) -> list[str]:
        """``lines`` (what :meth:`update` and :meth:`finish` returned, and any other) as they
        stand at the end: a process that had a slot later (the same process: its start time
        is compared, not only its pid) and was recorded is said to have stacks from then on
        (``start``: the clock's reading at the recording's time 0), one whose recording failed
        is left to the line that says why (:meth:`finish`), and the no-slot line names the rest,
        which have no stacks in the report (no slot, or a slot and nothing recorded). The report
        kept the line said at the time: "no Python stacks of pid N" for a process whose stacks
        it showed."""
        out = []
        for line in lines:
            named = self._no_slot.get(line)
            if named is None:
                out.append(line)
                continue
            later = {pid for pid, _ in named if pid in self._slotted and pid in self._recorded}
            never = tuple(
                (pid, name)
                for pid, name in named
                if pid not in later and not (pid in self._slotted and pid in self._failed)
            )
            if never:
                out.append(_no_slot_line(never))
            for pid, name in named:
                if pid in later:
                    out.append(
                        f"Python stacks of pid {pid} ({name}), on the GPU, only from "
                        f"{self._slotted[pid] - start:.1f} s on: until then the job's other "
                        f"processes on the GPU held watch's {MAX_PROCESSES} slots; its lost time "
                        "before is judged from the counters and the others' stacks"
                    )
        return out

    def _step(self, target: _Target, now: float) -> None:
        rec = target.current
        if rec is None:
            if target.tries < RETRIES and now >= target.retry_at:
                target.tries += 1
                target.current = self._recorder(target)
                if target.current is None:
                    self._fail(target)
            return
        if not rec.running():  # the process ended, or py-spy could not read it
            target.current = None
            self._collect(target, rec)
            if not target.worked and _alive(self.rootfs, target.pid):
                target.retry_at = now + RETRY_SECONDS
                if target.tries >= RETRIES:
                    self._fail(target)
        elif now - rec.origin >= CHUNK_SECONDS:
            fresh = self._recorder(target)
            if fresh is not None:
                rec.stop()
                fresh.since = rec.stopped_at
                target.stopping.append(rec)
                target.current = fresh
        self._drain(target)

    def _collect(self, target: _Target, rec: pyspy.Recorder) -> None:
        try:
            got = rec.collect()
        except pyspy.StackError as exc:
            target.error = str(exc)
            return
        target.worked = target.worked or bool(got)
        if got:
            self._recorded.add(target.pid)
        for s in got:
            frames = self._stacks.get((s.pid, s.frames))
            if frames is None:  # a stack this process was not seen in before: its lines read
                frames = self._stacks[(s.pid, s.frames)] = s.frames
                for f in frames:
                    key = (s.pid, f.file, f.line)
                    if key not in self.texts:
                        self.texts[key] = self.lines(s.pid, f.file, f.line)
            thread = self._names.setdefault(s.thread, s.thread)
            self.segments.append(pyspy.Segment(s.start, s.end, s.pid, s.tid, thread, frames))

    def _fail(self, target: _Target) -> None:
        if not target.error:
            return
        name = procfs.process_names(self.rootfs, [target.pid]).get(target.pid) or self.names.get(
            target.pid, "?"
        )
        self.problems.append(
            f"no Python stacks of pid {target.pid} ({name}): {target.error}; its lost time is "
            "judged from the counters alone"
        )
        self._failed.add(target.pid)
        target.error = ""
        target.tries = RETRIES

    def fold(self, ticks: Sequence[Tick], start: float) -> list[Tick]:
        """The stretches read so far cut into ``ticks`` (``start``: the clock's reading at the
        recording's time 0) and let go, before a long watch merges its ticks
        (:mod:`sparkdiag.watch.compact`): what goes past the last tick is kept for later."""
        if self._folder is None:
            self._folder = Folder(start, self.texts, self.names)
        if not ticks:
            return list(ticks)
        cut = start + ticks[-1].t
        now, later = [], []
        for s in self.segments:
            if s.start >= cut:
                later.append(s)
                continue
            now.append(s)
            if s.end > cut:  # the rest, from the last tick's end on, is folded later
                later.append(replace(s, start=cut))
        self.segments = later
        return self._folder.fold(now, ticks)

    def tables(self, ticks: Sequence[Tick], start: float) -> StackTables:
        """Every stretch cut into ``ticks``, with the tables they point into (after
        :meth:`finish`)."""
        folder = self._folder or Folder(start, self.texts, self.names)
        return folder.finish(self.segments, ticks)

    def finish(self) -> list[str]:
        """Stop every recorder and read what it wrote; the problems newly found."""
        before = len(self.problems)
        every = [*self.targets.values(), *self.retired]
        for target in every:
            for rec in [*target.stopping, *([target.current] if target.current else [])]:
                rec.stop()
        for target in every:
            for rec in [*target.stopping, *([target.current] if target.current else [])]:
                self._collect(target, rec)
            target.stopping.clear()
            target.current = None
            if not target.worked:
                self._fail(target)
        self.retired = []
        shutil.rmtree(self.workdir, ignore_errors=True)
        return self.problems[before:]


def _no_slot_line(named: Sequence[tuple[int, str]]) -> str:
    """The line for processes on the GPU that found every slot taken (``named``: pid, name)."""
    which = ", ".join(f"{pid} ({name})" for pid, name in named)
    return (
        f"no Python stacks of pid{'s' if len(named) > 1 else ''} {which}, on the GPU: watch "
        f"records at most {MAX_PROCESSES} processes at a time, and the job's other processes "
        "on the GPU held them (until one ends); its lost time is judged from the counters "
        "and the others' stacks"
    )


def _alive(rootfs: Path, pid: int) -> bool:
    return (rootfs / "proc" / str(pid)).is_dir()


def targets(
    rootfs: Path, tree: list[int], gpu_pids: set[int], limit: int | None = MAX_PROCESSES
) -> list[int]:
    """Whose stacks to record: the job's processes on the GPU where NVML names them, and its
    processes that run Python and are not DataLoader workers (the root first: a launcher such
    as torchrun, then the ranks it started, each its own process, on a GPU or not: a rank
    that never reaches the GPU, or a job of ranks on CPUs, is sampled all the same), then
    the DataLoader workers (where a starved GPU's time goes: the dataset's and transforms'
    lines), at most ``limit`` in all (None: every one, for :meth:`StackSampler.update` to
    choose from as slots free up); else the root."""
    names = procfs.process_names(rootfs, tree)
    python = [
        pid
        for pid in tree
        if names.get(pid, "").startswith(("python", "pt_main_thread", *LOADER_NAMES))
        and pid not in gpu_pids
    ]
    loaders = [pid for pid in python if names[pid].startswith(LOADER_NAMES)]
    python = [pid for pid in python if pid not in loaders]
    on_gpu = [pid for pid in tree if pid in gpu_pids] or sorted(gpu_pids)
    return ([*on_gpu, *python, *loaders] or tree[:1])[:limit]


RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def rank_of(rootfs: Path, pid: int) -> RankInfo:
    """The process's distributed rank from its environment (torchrun's variables)."""
    env = procfs.environment(rootfs, pid, RANK_VARIABLES)

    def number(name: str) -> int | None:
        value = env.get(name, "")
        return int(value) if value.isdigit() else None

    return RankInfo(pid, number("RANK"), number("WORLD_SIZE"), number("LOCAL_RANK"))


class Folder:
    """Cuts stretches into the ticks they overlap, in as many batches as wanted: :meth:`fold`
    before ticks are merged (a long watch, :mod:`sparkdiag.watch.compact`) so that the stretches
    are not all held to the end, :meth:`finish` at the end. The indexes a tick's ``stacks`` hold
    stay valid from one batch to the next; :meth:`finish` drops a thread that stayed in one
    stack the whole time (a parked worker), unless it is a process's main thread, and what only
    it pointed at."""

    def __init__(
        self, start: float, texts: dict[tuple[int, str, int], str], names: dict[int, str]
    ) -> None:
        self.start, self.texts, self.names = start, texts, names
        self.thread_index: dict[tuple[int, int], int] = {}
        self.threads: list[ThreadInfo] = []
        self.frame_index: dict[StackFrame, int] = {}
        self.stack_index: dict[tuple[int, ...], int] = {}
        self.distinct: dict[int, set[int]] = {}  # thread -> the stacks it was seen in
        self.first: dict[tuple[int, int], float] = {}  # (thread, stack) -> when first seen
        self.last: dict[int, tuple[int, float]] = {}  # a thread's stretch before: stack, end

    def fold(self, segments: list[pyspy.Segment], ticks: Sequence[Tick]) -> list[Tick]:
        """``ticks`` with the parts of ``segments`` that fall in them added to their stacks."""
        ends = [t.t for t in ticks]
        per_tick: dict[int, dict[tuple[int, int], float]] = {}
        visits: dict[int, dict[tuple[int, int], int]] = {}
        for s in sorted(segments, key=lambda s: s.start):
            key = (s.pid, s.tid)
            thread = self.thread_index.get(key)
            if thread is None:
                thread = self.thread_index[key] = len(self.threads)
                self.threads.append(ThreadInfo(s.pid, s.tid, s.thread, self.names.get(s.pid, "")))
            frames = []
            for f in s.frames:
                text = self.texts.get((s.pid, f.file, f.line), "")
                frame = StackFrame(f.function, f.file, f.line, text)
                frames.append(self.frame_index.setdefault(frame, len(self.frame_index)))
            stack = self.stack_index.setdefault(tuple(frames), len(self.stack_index))
            self.distinct.setdefault(thread, set()).add(stack)
            seen_at = self.first.get((thread, stack))
            if seen_at is None or s.start < seen_at:
                self.first[(thread, stack)] = s.start
            begin, end = s.start - self.start, s.end - self.start
            i = bisect.bisect_right(ends, begin)
            # each stretch begins with the thread coming into its stack, but where the stretch
            # before was in the same stack and ended as this one began: py-spy gives one stretch
            # per change, so that is the next chunk's recorder going on where the last stopped
            # (after a gap, as a failed recorder's retry, the thread may have left and come back)
            before = self.last.get(thread)
            goes_on = (
                before is not None
                and before[0] == stack
                and s.start - before[1] <= CONTINUES_SECONDS
            )
            if i < len(ticks) and not goes_on:
                seen = visits.setdefault(i, {})
                seen[(thread, stack)] = seen.get((thread, stack), 0) + 1
            self.last[thread] = (stack, s.end)
            while i < len(ticks) and ticks[i].t - ticks[i].dt < end:
                overlap = min(end, ticks[i].t) - max(begin, ticks[i].t - ticks[i].dt)
                if overlap > 0:
                    slot = per_tick.setdefault(i, {})
                    slot[(thread, stack)] = slot.get((thread, stack), 0.0) + overlap
                i += 1
        folded = list(ticks)
        for i, times in per_tick.items():  # a visit counts where its stretch spent time
            seen = visits.get(i, {})
            had = {(st.thread, st.stack): st for st in ticks[i].stacks}
            for at in times:
                old = had.get(at)
                seconds = times[at] + (old.seconds if old else 0.0)
                count = seen.get(at, 0) + (old.visits if old else 0)
                had[at] = StackTime(at[0], at[1], seconds, count)
            folded[i] = replace(ticks[i], stacks=tuple(had[at] for at in sorted(had)))
        return folded

    def finish(self, segments: list[pyspy.Segment], ticks: Sequence[Tick]) -> StackTables:
        """The last batch folded, the threads that stayed in one stack (not a process's main
        thread) dropped, and the tables renumbered to what the ticks still point at. A tick's
        time in a stack is kept to 0.1 ms; one that rounds to none is left out."""
        ticks = self.fold(segments, ticks)
        keep_threads = [
            n
            for n, info in enumerate(self.threads)
            if len(self.distinct.get(n, ())) > 1 or info.pid == info.tid
        ]
        thread_map = {old: new for new, old in enumerate(keep_threads)}
        # the kept threads' stacks, in the order they were first seen in (so one batch gives
        # the tables a single pass over the sorted stretches gave)
        first: dict[int, float] = {}
        for (thread, stack), at in self.first.items():
            if thread in thread_map and at < first.get(stack, math.inf):
                first[stack] = at
        used_stacks = sorted(first, key=lambda stack: (first[stack], stack))
        stack_map = {old: new for new, old in enumerate(used_stacks)}
        stacks = list(self.stack_index)
        frame_map: dict[int, int] = {}
        for old in used_stacks:
            for f in stacks[old]:
                frame_map.setdefault(f, len(frame_map))
        frames = list(self.frame_index)
        return StackTables(
            frames=tuple(frames[old] for old in frame_map),
            stacks=tuple(tuple(frame_map[f] for f in stacks[old]) for old in used_stacks),
            threads=tuple(self.threads[old] for old in keep_threads),
            ticks=tuple(
                replace(
                    tick,
                    stacks=tuple(
                        sorted(
                            StackTime(
                                thread_map[st.thread],
                                stack_map[st.stack],
                                round(st.seconds, 4),
                                st.visits,
                            )
                            for st in tick.stacks
                            # a stretch that overlaps the tick by under 50 us rounds to no time:
                            # left out (a wait of 0.0 s divided the engine's work by zero)
                            if st.thread in thread_map and round(st.seconds, 4) > 0
                        )
                    ),
                )
                for tick in ticks
            ),
        )


def tables(
    segments: list[pyspy.Segment],
    ticks: list[Tick],
    start: float,
    texts: dict[tuple[int, str, int], str],
    names: dict[int, str],
) -> StackTables:
    """The stretches cut into the ticks they overlap (``start``: the clock's reading at the
    recording's time 0), with the tables they point into, in one batch (:class:`Folder`)."""
    return Folder(start, texts, names).finish(segments, ticks)
