"""The job ``sparkdiag watch`` follows: a command it starts, or a running process it attaches to,
and the loop that samples it until it ends, the duration runs out, or the user interrupts."""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from sparkdiag.sources.host.procfs import (
    is_kernel_thread,
    process_names,
    process_stat,
    process_tree,
    start_time,
)
from sparkdiag.sources.host.pyspy import PTRACER_SHIM
from sparkdiag.watch import compact
from sparkdiag.watch.model import Tick
from sparkdiag.watch.sampler import Sampler

# After Ctrl-C, a started job gets this long to end after each signal (SIGINT, SIGTERM) before
# the next one; SIGKILL last. A further Ctrl-C or SIGTERM to watch moves on to the next at once.
STOP_GRACE_SECONDS = 5.0
STOP_POLL_SECONDS = 0.05  # how often a stopping job is looked at
# a job watch starts runs in watch's own PID namespace, whatever --path.rootfs says
OWN_PROC = Path("/")


def exit_status(returncode: int) -> int:
    """A shell's exit status for a child's return code: 128 + N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def interrupt_reached_job(pid: int | None = None) -> bool:
    """Whether the signal that stopped watch reached its started job (``pid``) as well: a Ctrl-C
    in the terminal goes to the terminal's foreground process group, which the job shares with
    watch unless it left it (``setsid``, ``setpgid``: then it was sent SIGINT only after
    ``STOP_GRACE_SECONDS``). A signal sent to watch alone (``kill``, a supervisor, watch run
    without a terminal) did not: the job is sent SIGINT at once rather than after the grace."""
    try:
        fd = sys.stdin.fileno()
        ours = os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
        return ours and (pid is None or os.getpgid(pid) == os.getpgrp())
    except (OSError, ValueError, AttributeError):  # no stdin, closed, not a file; the job gone
        return False


def check_runnable(program: str) -> None:
    """Raise the error that starting ``program`` would meet, said plainly, before anything
    starts (the ptracer shim runs first and would only fail later, inside the job's pid): a
    path (with a slash) that is missing is FileNotFoundError, one that is a folder or not
    executable PermissionError; a name is looked up on PATH as ``execvp`` does: one found there
    that cannot be run is PermissionError, none FileNotFoundError. PATH never includes the
    current folder unless it says so, so a file of that name here is not run; the error then
    says that it is here, and whether it is executable (``shutil.which`` answers None for a
    missing file and an unexecutable one alike, which read "No such file or directory")."""
    if not program:
        raise FileNotFoundError(errno.ENOENT, "the command's name is empty; give the program")
    on_path = shutil.which(program)
    if on_path is not None:
        _check_interpreter(Path(on_path), program)
        return
    if os.sep in program:
        path = Path(program)
        if not path.exists():
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", program)
        what = "it is a folder" if path.is_dir() else "not executable"
        raise PermissionError(errno.EACCES, f"Permission denied ({what})", program)
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        found = Path(folder or ".") / program
        if found.exists():  # exec's EACCES: a folder, or a file without the execute bit
            raise PermissionError(
                errno.EACCES, f"Permission denied ({found} is not executable)", program
            )
    here = Path(program)
    if here.is_file() and not os.access(here, os.X_OK):
        why = f"not found on PATH, and ./{program} in this folder is not executable"
        raise PermissionError(errno.EACCES, f"{why} (permission denied)", program)
    if here.is_file():
        why = f"not found on PATH (to run ./{program} in this folder, give ./{program})"
        raise FileNotFoundError(errno.ENOENT, why, program)
    raise FileNotFoundError(errno.ENOENT, "No such file or directory", program)


def _check_interpreter(path: Path, program: str) -> None:
    """A script whose ``#!`` interpreter is missing: exec's ENOENT read "No such file or
    directory" of a script that is there. FileNotFoundError naming the interpreter."""
    try:
        with path.open("rb") as script:
            first = script.readline(256)
    except OSError:
        return
    words = first[2:].split() if first.startswith(b"#!") else []
    if not words:
        return
    interpreter = os.fsdecode(words[0])
    if os.path.isabs(interpreter) and not os.access(interpreter, os.X_OK):
        raise FileNotFoundError(
            errno.ENOENT,
            f"its interpreter {interpreter} (its #! line) is not there or not executable; "
            "install it or correct the line",
            program,
        )


class SpawnedJob:
    """A command started by watch (``sparkdiag watch -- CMD ...``), in watch's process group so
    that Ctrl-C in the terminal reaches both. With ``ptracer`` it declares watch (and so the
    py-spy watch starts) its tracer before it runs, as Yama's ``ptrace_scope`` 1 requires of a
    process that is not the tracer's descendant; it keeps its pid (the shim execs it). With
    ``output_to_stderr`` the job's standard output goes to watch's standard error, so that
    watch's standard output holds its JSON document alone."""

    def __init__(
        self, argv: Sequence[str], ptracer: bool = False, output_to_stderr: bool = False
    ) -> None:
        self.argv = list(argv)
        run = self.argv
        check_runnable(self.argv[0])  # the shim's exec would fail only after it started
        if ptracer:
            run = [sys.executable, "-c", PTRACER_SHIM, *self.argv]
        self.proc = subprocess.Popen(run, stdout=2 if output_to_stderr else None)
        self.pid = self.proc.pid
        self.description = shlex.join(self.argv)

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def exit_status(self) -> int | None:
        code = self.proc.poll()
        return None if code is None else exit_status(code)

    def wait(self) -> int:
        return exit_status(self.proc.wait())

    def wait_unless(self, stop: threading.Event, hurry: Callable[[], int] = lambda: 0) -> int:
        """Wait for the job to end (after --duration), or :meth:`stop` it once ``stop`` is set
        (Ctrl-C or SIGTERM to watch): the wait did not look at it, and watch waited for a job
        that ignores SIGINT for as long as it ran."""
        while not stop.wait(STOP_POLL_SECONDS):
            code = self.proc.poll()
            if code is not None:
                return exit_status(code)
        return self.stop(hurry=hurry)

    def stop(self, grace: float = STOP_GRACE_SECONDS, hurry: Callable[[], int] = lambda: 0) -> int:
        """End the job and every process under it: SIGINT, SIGTERM and SIGKILL, ``grace``
        seconds apart, or at once when ``hurry()`` (the stop signals watch received) goes up;
        first a wait where the interrupt reached the job too (:func:`interrupt_reached_job`), so
        that a job ending on its own Ctrl-C (saving, cleaning up) does not get a second one.
        Each signal goes to the job and to every process seen under it since the stop began
        (``sh -c 'python train.py; ...'``, make, a launcher's workers: a process of its own
        group or session too), the job last; the stop waits until all of them ended, so that
        none is left running, orphaned, after watch. The status is the job's."""
        first = (None,) if interrupt_reached_job(self.pid) else ()
        tree: dict[int, str] = {}
        for sig in (*first, signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            self._note_tree(tree)
            if sig is not None:
                self._signal_tree(tree, sig)
            seen = hurry()
            deadline = time.monotonic() + grace
            while self._tree_running(tree) and time.monotonic() < deadline and hurry() == seen:
                time.sleep(STOP_POLL_SECONDS)
                self._note_tree(tree)
            if not self._tree_running(tree):
                break
        return exit_status(self.proc.wait())

    def _note_tree(self, tree: dict[int, str]) -> None:
        """Add the job's descendants now (under the job, or under one seen before: an orphan
        stays known after its parent ended) to ``tree``, pid -> start time."""
        # the job itself only while it is not reaped: after, its pid may be another process's
        job = [self.pid] if self.proc.returncode is None else []
        roots = [*job, *(p for p, t in tree.items() if start_time(OWN_PROC, p) == t)]
        for root in roots:
            for pid in process_tree(OWN_PROC, root):
                if pid != self.pid and pid not in tree:
                    started = start_time(OWN_PROC, pid)
                    if started is not None:
                        tree[pid] = started

    def _signal_tree(self, tree: dict[int, str], sig: int) -> None:
        for pid, started in tree.items():
            if start_time(OWN_PROC, pid) == started:  # the same process, not a new one
                with contextlib.suppress(OSError):  # gone since, or not ours to signal
                    os.kill(pid, sig)
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def _tree_running(self, tree: dict[int, str]) -> bool:
        return self.proc.poll() is None or any(
            start_time(OWN_PROC, p) == t for p, t in tree.items()
        )


def unwatchable(rootfs: Path, pid: int, own: int) -> str:
    """Why ``--pid PID`` cannot be watched, or "": watch itself (``own``: it would sample its
    own sampling), or a kernel thread (no job runs there: kthreadd's tree is every kernel thread,
    and it was diagnosed "healthy" from the GPU's readings alone)."""
    if pid == own and rootfs.resolve() == OWN_PROC:
        return f"{pid} is this sparkdiag watch itself; give the pid of the job to watch"
    if is_kernel_thread(rootfs, pid):
        name = process_names(rootfs, [pid]).get(pid, "?")
        return f"{pid} ({name}) is a kernel thread, not a job; give the pid of the job to watch"
    return ""


def alive(rootfs: Path, pid: int) -> bool:
    """True while ``ROOT/proc/PID`` exists and is not a zombie."""
    fields = process_stat(rootfs, pid)
    return fields is not None and fields[:1] not in (["Z"], ["X"], [])


class AttachedJob:
    """A running process (``sparkdiag watch --pid PID``); watching ends when it does, or when
    its pid is another process's (its start time changed: the pid was given again, and watch
    went on following the newcomer)."""

    def __init__(self, pid: int, rootfs: Path) -> None:
        self.pid = pid
        self.rootfs = rootfs
        self.started = start_time(rootfs, pid)
        name = process_names(rootfs, [pid]).get(pid, "?")
        self.description = f"pid {pid} ({name})"

    def ended(self) -> bool:
        return not alive(self.rootfs, self.pid) or start_time(self.rootfs, self.pid) != self.started

    def exit_status(self) -> int | None:
        return None


ENDED_POLL_SECONDS = 0.1  # how often the job's end is looked at between two ticks


def _wait_until(
    until: float, stop: threading.Event, ended: Callable[[], bool], monotonic: Callable[[], float]
) -> bool:
    """Wait until ``until``, the job's end or ``stop``; True for ``stop``."""
    while (left := until - monotonic()) > 0:
        if stop.wait(min(left, ENDED_POLL_SECONDS)):
            return True
        if ended():
            return False
    return stop.is_set()


class Followed(NamedTuple):
    """What :func:`follow` saw: the ticks, why it stopped, the interval the ticks ended at
    (doubled each time they were halved) and how many times they were halved."""

    ticks: list[Tick]
    ended_by: str
    interval: float
    halved: int = 0


# Every this many first intervals (ticks as first sampled, 512 s at the default 0.5 s, however
# often the ticks were merged since) the Python stacks read so far are cut into the ticks and
# let go of (StackSampler.fold): a long watch holds some minutes of py-spy's stretches.
FOLD_TICKS = 1024


def follow(
    sampler: Sampler,
    ended: Callable[[], bool],
    interval: float,
    duration: float | None,
    stop: threading.Event,
    monotonic: Callable[[], float] = time.monotonic,
    on_tick: Callable[[Tick, int], None] | None = None,
    max_ticks: int = compact.MAX_TICKS,
) -> Followed:
    """Sample every ``interval`` seconds until the job ends ("exit"), ``duration`` passes
    ("duration") or ``stop`` is set ("interrupt"). A first tick primes the counters and is
    dropped. Never drifts, never bursts. ``on_tick(tick, ticks taken so far)`` sees each tick
    (the live status line). Between ticks the job's end and the duration are looked at every
    ``ENDED_POLL_SECONDS``, and a last, shorter tick taken then (each tick has its own ``dt``):
    with ``--interval 20``, a job that ended at once was reported as watched for 20 s, and
    ``--duration 0.1`` ran 20 s. At ``max_ticks`` ticks, neighbours are merged in pairs and
    the interval doubles (:mod:`sparkdiag.watch.compact`), and every ``FOLD_TICKS`` first
    intervals (whatever the interval has become) the Python stacks read so far go into the
    ticks: memory stays bounded."""
    sampler.tick()
    ticks: list[Tick] = []
    halved = taken = unfolded = 0  # unfolded: first intervals' worth of ticks since a fold
    start = monotonic()
    next_at = start + interval
    while True:
        until = next_at if duration is None else min(next_at, start + duration)
        interrupted = _wait_until(until, stop, ended, monotonic)
        ticks.append(sampler.tick())
        taken += 1
        if on_tick is not None:
            on_tick(ticks[-1], taken)
        if interrupted:
            return Followed(ticks, "interrupt", interval, halved)
        if ended():
            return Followed(ticks, "exit", interval, halved)
        if duration is not None and monotonic() - start >= duration:
            return Followed(ticks, "duration", interval, halved)
        unfolded += 1 << halved  # a tick after k halvings is 2^k first intervals long
        if unfolded >= FOLD_TICKS or len(ticks) >= max_ticks:
            ticks = sampler.fold_stacks(ticks)  # the stacks read so far let go of
            unfolded = 0
        if len(ticks) >= max_ticks:
            ticks = compact.halve(ticks)
            interval *= 2
            halved += 1
        next_at += interval
        if next_at < monotonic():  # a tick overran: skip the missed ones
            next_at = monotonic() + interval
