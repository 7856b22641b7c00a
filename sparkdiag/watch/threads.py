"""What the job's threads did over a whole recording, from the stacks :mod:`.stacks` reads: which
thread of each process runs the training loop, what it did in each tick (with the work it
waited for on the autograd engine's thread), and the frames its loop runs in (so that the
ticks before and after the loop can be told from it). Pure functions of the recording.

**The training thread** of a process is the one that spent the most time in ``torch`` frames or
launching, syncing, copying, stepping the optimizer or compiling; a process's main thread where
none did. A thread whose every stack begins inside ``torch`` was started by torch's C++ (the
autograd engine's device threads), not by the job: it is never the training thread.

**The autograd engine.** ``loss.backward()`` hands the backward to the engine's own thread and
waits (the training thread's stack ends in ``torch/autograd/graph.py: _engine_run_backward``);
where the engine runs Python meanwhile, py-spy sees it on that thread: a custom function's
backward, a hook, or AOTAutograd compiling the backward of a graph ``torch.compile`` just
compiled. What the engine's thread did there, other than launching, is what the training
thread waited for: its seconds in the wait are given to the engine's activity (at most the
seconds it waited). A backward compiled that way belongs to the forward the training thread
compiled last (AOTAutograd compiles a graph's backward at its first backward): it is counted
at that forward's stack, so the line named is the call that recompiled; so is a backward the
training thread compiles itself, inside ``backward()`` (on a CPU the engine runs there).

**The loop's frames**: the longest run of outermost frames that ``LOOP_SHARE`` of the training
threads' time shares in the ticks the GPU worked (frames are told apart by their line, so
``Trainer._run`` calling ``_run_stage`` is not ``Trainer._run`` calling ``_teardown``). A tick
the training threads spent mostly outside them is before or after the loop: model building,
moving the model back to the host, a final save.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sparkdiag.watch import stacks as st
from sparkdiag.watch.model import Recording

LOOP_SHARE = 0.8  # of the training threads' time in the working ticks: the loop's frames
ENGINE_WAIT = {"torch/autograd/graph.py": "_engine_run_backward",
               "torch/autograd/__init__.py": "backward"}  # fmt: skip
WORKING = (st.LAUNCH, st.SYNC, st.COPY, st.OPTIMIZER, st.COMPILE)


class Sample(NamedTuple):
    """A training thread spent ``seconds`` of a tick in ``stack`` (an index into the
    recording's stacks) doing ``activity`` (the stack's own reading, or the engine's work it
    waited for)."""

    thread: int
    stack: int
    activity: str
    seconds: float


@dataclass(frozen=True)
class Readings:
    """Every stack's reading, the threads that run the training loop (one per process), and
    per tick of the recording what they did (:class:`Sample`)."""

    stacks: tuple[st.Reading, ...]
    training: frozenset[int]  # indexes into the recording's threads
    ticks: tuple[tuple[Sample, ...], ...] = ()
    feeding: frozenset[int] = frozenset()  # the training threads of the GPU's processes
    roots: tuple[str, ...] = ()  # the folders of the job's own code (stacks.own_roots)

    def samples(self, tick: int) -> tuple[Sample, ...]:
        """What the training threads of every sampled process did in the tick."""
        return self.ticks[tick] if 0 <= tick < len(self.ticks) else ()

    def feeding_samples(self, tick: int) -> tuple[Sample, ...]:
        """What the training threads of the processes that hold the GPU did (of every sampled
        process where the recording does not say which hold it): a launcher such as torchrun,
        or a wrapper script waiting for its child, feeds no GPU."""
        return tuple(s for s in self.samples(tick) if s.thread in self.feeding)


def _after_sync(
    rec: Recording, readings: list[st.Reading], libraries: Sequence[str | None]
) -> list[st.Reading]:
    """``USER`` stacks working on what a sync brought back: a frame of the job's own code in a
    function that syncs, at a line after the one that syncs. ``libraries``: each frame's
    library (:func:`stacks.library_path`), None for the job's own code."""
    first: dict[tuple[str, str], int] = {}
    for reading in readings:
        if reading.activity == st.SYNC and reading.site is not None:
            f = rec.frames[reading.site]
            key = (f.file, f.function)
            first[key] = min(first.get(key, f.line), f.line)
    if not first:
        return readings
    out = []
    for stack, reading in zip(rec.stacks, readings, strict=True):
        if reading.activity == st.USER:
            for i in stack:
                f = rec.frames[i]
                line = first.get((f.file, f.function))
                if line is not None and f.line > line and libraries[i] is None:
                    reading = st.Reading(st.AFTER_SYNC, reading.site, reading.via)
                    break
        out.append(reading)
    return out


def started_by_torch(rec: Recording, stack: int, own: Sequence[str] = ()) -> bool:
    """The stack begins in a torch frame: a thread torch's C++ started (the autograd engine's),
    running Python on torch's behalf. ``own``: the job's own folders (stacks.own_roots)."""
    ids = rec.stacks[stack]
    lib = st.library_path(rec.frames[ids[0]].file, own) if ids else None
    return (lib or "").startswith("torch/")


def _engine_frame(rec: Recording, frame: int, own: Sequence[str] = ()) -> bool:
    f = rec.frames[frame]
    name = ENGINE_WAIT.get(st.library_path(f.file, own) or "")
    return name is not None and f.function.rsplit(".", 1)[-1] == name


def engine_wait(rec: Recording, stack: int, own: Sequence[str] = ()) -> bool:
    """The thread waits for the autograd engine (``loss.backward()``)."""
    ids = rec.stacks[stack]
    return bool(ids) and _engine_frame(rec, ids[-1], own)


def through_engine(rec: Recording, stack: int, own: Sequence[str] = ()) -> bool:
    """The stack runs inside the autograd engine, called from the thread's own backward() (on
    a CPU the engine runs the backward on the calling thread)."""
    return any(_engine_frame(rec, i, own) for i in rec.stacks[stack])


def _training(
    rec: Recording,
    readings: list[st.Reading],
    libraries: Sequence[str | None],
    roots: Sequence[str] = (),
) -> frozenset[int]:
    """The training thread of each process (``libraries``: each frame's library path)."""
    score: dict[int, float] = {}
    mine: set[int] = set()  # threads with a stack the job started (not begun inside torch)
    # per stack, read once (a recording samples the same stacks again and again): begun by the
    # job, in the pin-memory thread, scored (working, or in torch)
    known: dict[int, tuple[bool, bool, bool]] = {}
    loaders = [thread.loader for thread in rec.threads]
    for tick in rec.ticks:
        for s in tick.stacks:
            if loaders[s.thread]:  # a DataLoader worker feeds the loop, never runs it
                continue
            facts = known.get(s.stack)
            if facts is None:
                libs = [libraries[i] or "" for i in rec.stacks[s.stack]]
                facts = known[s.stack] = (
                    bool(rec.stacks[s.stack]) and not started_by_torch(rec, s.stack, roots),
                    any(lib.startswith("torch/utils/data/_utils/pin_memory") for lib in libs),
                    readings[s.stack].activity in WORKING
                    or any(lib.startswith("torch/") for lib in libs),
                )
            begun, pinning, scored = facts
            if begun:
                mine.add(s.thread)
            if not pinning and scored:
                score[s.thread] = score.get(s.thread, 0.0) + s.seconds
    best: dict[int, int] = {}
    # the most seconds wins; a tie (none scored) goes to the main thread (tid == pid)
    main = {i for i, t in enumerate(rec.threads) if t.tid == t.pid and not t.loader}
    ranked = sorted(mine | main, key=lambda i: (score.get(i, 0.0), i in main))
    for index in ranked:
        best[rec.threads[index].pid] = index
    return frozenset(best.values())


def _tick_samples(
    rec: Recording,
    readings: list[st.Reading],
    training: frozenset[int],
    roots: Sequence[str] = (),
) -> tuple[tuple[Sample, ...], ...]:
    """Per tick, what each training thread did, the engine's work it waited for included (the
    module docstring)."""
    last_compile: dict[int, int] = {}  # training thread -> the stack it compiled in last
    out = []
    for tick in rec.ticks:
        samples: list[Sample] = []
        for thread in sorted(training):
            pid = rec.threads[thread].pid
            own = [s for s in tick.stacks if s.thread == thread]
            backward_compile: set[int] = set()  # compiling a backward in this thread
            for s in own:
                if readings[s.stack].activity == st.COMPILE:
                    if through_engine(rec, s.stack, roots):
                        backward_compile.add(s.stack)
                    else:
                        last_compile[thread] = s.stack
            waits = {s.stack: s.seconds for s in own if engine_wait(rec, s.stack, roots)}
            if sum(waits.values()) <= 0:  # a wait of no time (0.0 as recorded): none to fill
                waits = {}
            engine = [
                (readings[s.stack].activity, s.seconds)
                for s in tick.stacks
                if s.thread != thread
                and s.thread not in training
                and rec.threads[s.thread].pid == pid
                and started_by_torch(rec, s.stack, roots)
                and readings[s.stack].activity not in (st.LAUNCH, st.WAITING, st.NOTHING)
            ]
            waited, worked = sum(waits.values()), sum(sec for _, sec in engine)
            moved = min(waited, worked)
            for s in own:
                left = s.seconds * (1.0 - moved / waited) if s.stack in waits else s.seconds
                at = last_compile.get(thread, s.stack) if s.stack in backward_compile else s.stack
                if left > 0:
                    samples.append(Sample(thread, at, readings[s.stack].activity, left))
            if moved <= 0:
                continue
            for wait, seconds in waits.items():
                for activity, sec in engine:
                    at = last_compile.get(thread, wait) if activity == st.COMPILE else wait
                    share = moved * (seconds / waited) * (sec / worked)
                    samples.append(Sample(thread, at, activity, share))
        out.append(tuple(samples))
    return tuple(out)


def gpu_pids(rec: Recording) -> frozenset[int]:
    """The job's processes seen holding a GPU (each tick keeps them among its processes)."""
    return frozenset(p.pid for t in rec.ticks for p in t.job.loads if p.on_gpu)


def _root(rec: Recording, stack: int) -> tuple[str, str] | None:
    ids = rec.stacks[stack]
    return (rec.frames[ids[0]].file, rec.frames[ids[0]].function) if ids else None


def _torn(
    rec: Recording, readings: list[st.Reading], libraries: Sequence[str | None]
) -> list[st.Reading]:
    """Stacks py-spy read torn say nothing (``NOTHING``). It reads the job's memory without
    stopping it (``--nonblocking``), so a sample can hold only the innermost frames of a deep
    stack: on the H200 a training thread compiling with ``torch.compile`` (stacks of 100 frames
    and more) read a lone ``TorchDispatchMode.__enter__`` or ``Node.prepend`` now and then, and
    those torch frames read as launching (an 11 % launcher beside the recompiling). A thread
    the job started always begins at the same frame (the script's ``<module>``, runpy's
    ``_run_module_as_main``, ``Thread._bootstrap``): a stack of its that begins elsewhere,
    in a tick before the last one that saw it there, is torn (after that, the interpreter's
    exit handlers run outside ``<module>``: an ``atexit`` shutting inductor's compile workers
    down took 1.1 s of that job's last ticks). Threads torch's C++ started (the autograd
    engine's: their usual first frame is torch's) begin anywhere in torch and are left as read.
    ``libraries``: each frame's library, as for :func:`_after_sync`.
    """
    roots: dict[int, dict[tuple[str, str], float]] = {}
    library = {(f.file, f.function): libraries[i] for i, f in enumerate(rec.frames)}
    for tick in rec.ticks:
        for s in tick.stacks:
            root = _root(rec, s.stack)
            if root is not None:
                seen = roots.setdefault(s.thread, {})
                seen[root] = seen.get(root, 0.0) + s.seconds
    usual = {}
    for thread, seen in roots.items():
        root = max(seen, key=lambda r: seen[r])
        if not (library[root] or "").startswith("torch/"):
            usual[thread] = root
    last: dict[int, int] = {}  # thread -> the last tick in which it was at its usual root
    for k, tick in enumerate(rec.ticks):
        for s in tick.stacks:
            if s.thread in usual and _root(rec, s.stack) == usual[s.thread]:
                last[s.thread] = k
    torn = {
        s.stack
        for k, tick in enumerate(rec.ticks)
        for s in tick.stacks
        if s.thread in usual
        and k < last.get(s.thread, -1)
        and _root(rec, s.stack) not in (None, usual[s.thread])
    }
    return [st.Reading(st.NOTHING, None) if i in torn else r for i, r in enumerate(readings)]


def read_recording(rec: Recording) -> Readings:
    roots = st.own_roots(rec.cwd, rec.frames, rec.stacks)
    # each frame's library once: a recording's stacks share their frames (the 68 recordings
    # under docs/device: 7,511 stacks of up to 297 frames, 525,556 in all, name 23,489 frames)
    libraries = [st.library_path(f.file, roots) for f in rec.frames]
    readings = [
        st.read([rec.frames[i] for i in s], s, roots, [libraries[i] for i in s]) for s in rec.stacks
    ]
    readings = _after_sync(rec, _torn(rec, readings, libraries), libraries)
    training = _training(rec, readings, libraries, roots)
    on_gpu = gpu_pids(rec)
    feeding = frozenset(t for t in training if rec.threads[t].pid in on_gpu) or training
    samples = _tick_samples(rec, readings, training, roots)
    return Readings(tuple(readings), training, samples, feeding, roots)


# -- the loop's frames ------------------------------------------------------------------------


def loop_frames(readings: Readings, rec: Recording, ticks: Sequence[int]) -> tuple[int, ...]:
    """The outermost frames (indexes into the recording's frames) that ``LOOP_SHARE`` of the
    training threads' time in ``ticks`` shares (the module docstring)."""
    weighted: dict[tuple[int, ...], float] = {}
    for k in ticks:
        for s in readings.feeding_samples(k):
            weighted[rec.stacks[s.stack]] = weighted.get(rec.stacks[s.stack], 0.0) + s.seconds
    total = sum(weighted.values())
    prefix: tuple[int, ...] = ()
    if total <= 0:
        return prefix
    while True:
        depth = len(prefix)
        by_next: dict[int, float] = {}
        for stack, seconds in weighted.items():
            if len(stack) > depth and stack[:depth] == prefix:
                by_next[stack[depth]] = by_next.get(stack[depth], 0.0) + seconds
        if not by_next:
            return prefix
        frame, seconds = max(by_next.items(), key=lambda kv: kv[1])
        if seconds < LOOP_SHARE * total:
            return prefix
        prefix = (*prefix, frame)


def without_python(readings: Readings, rec: Recording, tick: int) -> bool | None:
    """True where the training threads were read in the tick with no Python frame at all
    (only empty stacks: the interpreter starting or ending; a torn stack, which also reads
    as nothing, has frames and is not one); None where they were not read."""
    samples = [s for s in readings.feeding_samples(tick) if s.seconds > 0]
    if not samples:
        return None
    return all(not rec.stacks[s.stack] for s in samples)


def in_loop(readings: Readings, rec: Recording, tick: int, frames: tuple[int, ...]) -> float | None:
    """The share of the training threads' sampled time in the tick spent inside the loop's
    frames; None where nothing was sampled (py-spy attaching, or an empty stack)."""
    sampled = [s for s in readings.feeding_samples(tick) if s.activity != st.NOTHING]
    total = sum(s.seconds for s in sampled)
    if total <= 0:
        return None
    n = len(frames)
    inside = sum(s.seconds for s in sampled if rec.stacks[s.stack][:n] == frames)
    return inside / total
