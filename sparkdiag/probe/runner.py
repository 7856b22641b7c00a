"""Run the probe worker in a subprocess and classify the cycle.

The daemon never imports torch: each probe cycle starts the worker (``worker/``, run as one
script) in a fresh interpreter (or feeds it on standard input to an interpreter inside a
container), reads the one JSON document it prints, and kills the worker's
whole process group when it outlives its timeout.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sparkdiag.config import OPTIONS_BY_KEY
from sparkdiag.lifecycle import Sessions
from sparkdiag.probe.document import (
    PROGRESS_PREFIX,
    Progress,
    WorkerDocument,
    find_document,
    parse_progress,
)
from sparkdiag.probe.request import DEFAULT_REQUEST, WorkerRequest
from sparkdiag.probe.script import assemble

ProbeResult = Literal["ok", "timeout", "error", "unsupported", "skipped_busy"]

DEFAULT_TIMEOUT: float = OPTIONS_BY_KEY["probe.timeout"].default
STDERR_TAIL_BYTES = 8192
STDOUT_LIMIT_BYTES = 16 * 1024 * 1024
KILL_GRACE_SECONDS = 2.0
EXIT_DRAIN_SECONDS = 1.0  # how long to wait for EOF once the worker has exited
# How long to wait for a SIGKILLed worker to be gone before its cycle ends without it. A process
# stuck in the driver (D state) does not act on SIGKILL until the driver lets it go, maybe never;
# a GPU process that does die can take seconds to release a large context, so this is generous.
KILLED_WAIT_SECONDS = 10.0

_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception|Exit|Interrupt)|error)\b.*", re.I)


@dataclass(frozen=True)
class ProbeCycle:
    """Outcome of one probe cycle.

    result: ok | timeout | error | unsupported | skipped_busy
    reason: one line saying why, None when ok
    document: the worker's parsed document, None when there was none
    stderr_tail: the last bytes (up to 8 KiB) of the worker's stderr
    returncode: exit status, negative for a signal, None if it never started or could not be
        killed (its cycle is a timeout; a daemon thread reaps it if it ever ends)
    wall_seconds: wall-clock time from start to reaping the worker (or to leaving one that could
        not be killed)
    worker_pid: PID of the worker (also its process group and session id)
    """

    result: ProbeResult
    reason: str | None
    document: WorkerDocument | None
    stderr_tail: str
    returncode: int | None
    wall_seconds: float
    worker_pid: int | None


NO_TORCH_PREFIX = "cannot import torch"  # the worker's reason when its Python has no torch


def torch_install_hint(python: str = sys.executable) -> str:
    """What to do when the worker's Python has no torch: one line, for any command."""
    return (
        f"install it into the Python that runs the worker: {python} -m pip install torch "
        "(the build for your GPU's CUDA: https://pytorch.org/get-started/locally/)"
    )


def worker_path() -> Path:
    """The worker package, which runs as one script: ``python3 PATH ARGS`` (its __main__.py
    assembles the script from the package's rooms: probe/script.py)."""
    return Path(__file__).with_name("worker")


def worker_source() -> str:
    """The worker as one self-contained script, for ``python -`` (e.g. inside a container)."""
    return assemble()


def run_worker(
    python: Sequence[str] = (sys.executable,),
    request: WorkerRequest = DEFAULT_REQUEST,
    timeout: float = DEFAULT_TIMEOUT,
    stdin_script: bool = False,
    env: Mapping[str, str] | None = None,
    kill_grace: float = KILL_GRACE_SECONDS,
    on_start: Callable[[int], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> ProbeCycle:
    """Run one probe cycle and classify it.

    ``python`` is the interpreter command, e.g. ``[sys.executable]`` or
    ``["docker", "run", "-i", "--rm", IMAGE, "python3"]``; ``request`` gives
    the worker's arguments. With ``stdin_script`` the worker's source is
    written to its standard input and the command is ``[*python, "-", *args]``;
    otherwise it is ``[*python, worker_path(), *args]``. The worker runs in a new session; at
    the timeout its whole process group gets SIGTERM and, ``kill_grace``
    seconds later, SIGKILL. Whatever else is left in that group when the
    worker ends is killed as well. A worker still there :data:`KILLED_WAIT_SECONDS` after
    SIGKILL (stuck in the driver) ends its cycle as a timeout that says so, with no
    ``returncode``; a daemon thread reaps it if it ever ends. ``on_start(pid)`` is called once
    the worker runs (the daemon uses it to keep its own worker out of the busy checks).
    ``on_progress(progress)`` is called for each progress line the worker
    prints on stderr (one kernel result each) when ``request.progress`` is set.
    """
    if not python:
        raise ValueError("python must name an interpreter command")
    script = "-" if stdin_script else str(worker_path())
    cmd = [*python, script, *request.argv()]
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE if stdin_script else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        return ProbeCycle(
            result="error",
            reason=f"cannot start worker {cmd[0]!r}: {exc}",
            document=None,
            stderr_tail="",
            returncode=None,
            wall_seconds=time.monotonic() - started,
            worker_pid=None,
        )
    # The worker's group stays in _LIVE until the worker is reaped (_reap), not merely until its
    # cycle ends: one that could not be killed still runs, and a daemon that stops must try again.
    _LIVE.add(proc.pid)
    try:
        if on_start is not None:
            on_start(proc.pid)
        source = worker_source().encode("utf-8") if stdin_script else b""
        stdout, stderr, timed_out = _exchange(proc, source, started + timeout, on_progress)
        returncode = _finish(proc, timed_out, kill_grace)
    except BaseException:
        # Interrupted (KeyboardInterrupt, or SystemExit from a signal handler): the worker runs
        # in its own session and would outlive us; its group goes first.
        if proc.returncode is None:  # once reaped, its pid may name another process
            killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                _reap(proc, kill_grace)
        raise
    wall = time.monotonic() - started
    kept = stderr[-STDERR_TAIL_BYTES:]
    if len(stderr) >= STDERR_TAIL_BYTES and b"\n" in kept:  # cut: its first line is a piece
        kept = kept[kept.index(b"\n") + 1 :]
    tail = kept.decode("utf-8", "replace")
    document = find_document(stdout)
    if returncode is None:
        # still there after SIGKILL: its cycle ends now (the caller holds the GPU's lock) and a
        # daemon thread reaps it whenever the driver lets it go
        result: ProbeResult = "timeout"
        late = f"did not finish within {timeout:g} s and " if timed_out else ""
        reason: str | None = (
            f"worker {late}could not be killed: pid {proc.pid} still there "
            f"{KILLED_WAIT_SECONDS:g} s after SIGKILL (stuck in the driver?)"
        )
    elif timed_out:
        result = "timeout"
        reason = f"worker did not finish within {timeout:g} s and was killed"
    else:
        result, reason = classify(returncode, document, stdout, tail)
    return ProbeCycle(
        result=result,
        reason=reason,
        document=document,
        stderr_tail=tail,
        returncode=returncode,
        wall_seconds=wall,
        worker_pid=proc.pid,
    )


# Process groups of the workers running now (their leader's pid), so that a daemon that stops
# can end them from another thread: kill_running_workers().
_LIVE = Sessions()
_LIVE_LOCK = _LIVE.lock


def kill_running_workers() -> int:
    """SIGKILL the process group of every worker running in this process; returns how many.

    The daemon calls it when it stops: a worker runs in its own session, so it would otherwise
    outlive the daemon with nothing left to enforce its timeout. Each runner thread then reaps
    its worker as usual (its cycle ends as killed by SIGKILL).
    """
    # Signalled under the lock: a worker leaves _LIVE as it is reaped, under the same lock
    # (_reap), so no group signalled here can have been reaped and its pid given to another.
    return _LIVE.kill(killpg)


def _exited(pid: int) -> bool:
    """True once the process has exited, without reaping it.

    Not reaping keeps the PID (and so the process group id) reserved until we
    have signalled the whole group.
    """
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _exchange(
    proc: subprocess.Popen[bytes],
    source: bytes,
    deadline: float,
    on_progress: Callable[[Progress], None] | None = None,
) -> tuple[bytes, bytes, bool]:
    """Feed stdin, collect stdout and the tail of stderr until EOF or deadline."""
    partial = bytearray()  # stderr bytes after the last newline, for progress lines
    assert proc.stdout is not None and proc.stderr is not None
    out = bytearray()
    err = bytearray()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    pending = memoryview(source)
    if proc.stdin is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        if pending:
            sel.register(proc.stdin, selectors.EVENT_WRITE, None)
        else:
            proc.stdin.close()
    exited_at: float | None = None
    timed_out = False
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = not _exited(proc.pid)
                break
            if exited_at is None and _exited(proc.pid):
                exited_at = now
            if exited_at is not None and now - exited_at > EXIT_DRAIN_SECONDS:
                break  # something that outlived the worker still holds a pipe
            for key, _ in sel.select(timeout=min(deadline - now, 0.2)):
                if key.data is None:  # stdin
                    assert proc.stdin is not None
                    try:
                        written = os.write(proc.stdin.fileno(), pending[:65536])
                        pending = pending[written:]
                    except BlockingIOError:
                        continue
                    except OSError as exc:
                        if exc.errno not in (errno.EPIPE, errno.EINVAL):
                            raise
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf: bytearray = key.data
                buf += chunk
                if buf is err and on_progress is not None:
                    partial += chunk
                    *lines, rest = partial.split(b"\n")
                    partial[:] = rest[-65536:]
                    for line in lines:
                        _progress(line, on_progress)
                if buf is err and len(err) > 4 * STDERR_TAIL_BYTES:
                    del err[: len(err) - STDERR_TAIL_BYTES]
                elif buf is out and len(out) > STDOUT_LIMIT_BYTES:
                    del out[STDOUT_LIMIT_BYTES:]
        else:
            # all pipes closed; the worker may still be running (closed its stdout)
            remaining = deadline - time.monotonic()
            while not _exited(proc.pid):
                if remaining <= 0:
                    timed_out = True
                    break
                time.sleep(min(0.05, remaining))
                remaining = deadline - time.monotonic()
    finally:
        sel.close()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
    return bytes(out), bytes(err), timed_out


def _progress(line: bytes | bytearray, callback: Callable[[Progress], None]) -> None:
    progress = parse_progress(line.decode("utf-8", "replace"))
    if progress is not None:
        callback(progress)


def killpg(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group ``pgid``; one that is gone already is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _finish(proc: subprocess.Popen[bytes], timed_out: bool, grace: float) -> int | None:
    """Stop whatever is left of the worker's process group and reap the worker; None when the
    worker is still there :data:`KILLED_WAIT_SECONDS` after SIGKILL (see :func:`_reap`)."""
    if timed_out:
        killpg(proc.pid, signal.SIGTERM)
        end = time.monotonic() + grace
        while not _exited(proc.pid) and time.monotonic() < end:
            time.sleep(0.05)
    # The worker is not reaped yet, so its PID still names its process group:
    # nothing it started (in its session) may outlive the cycle.
    killpg(proc.pid, signal.SIGKILL)
    return _reap(proc, KILLED_WAIT_SECONDS)


def _reap(proc: subprocess.Popen[bytes], wait: float) -> int | None:
    """Reap the SIGKILLed worker within ``wait`` seconds and return its exit status; None when it
    is still there, and a daemon thread reaps it later.

    Found in a review: this was ``proc.wait()`` with no timeout, so a worker stuck in the driver
    (D state, where SIGKILL stays pending) held the probe thread, and with it that GPU's lock,
    for ever, and its pid had already left _LIVE. It stays in _LIVE until reaped, so that
    :func:`kill_running_workers` still signals it.
    """
    end = time.monotonic() + wait
    while not _exited(proc.pid):
        if time.monotonic() >= end:
            _LIVE.reap_when_gone(proc)
            return None
        time.sleep(0.05)
    return _reaped(proc)


def _reaped(proc: subprocess.Popen[bytes]) -> int:
    """Reap a worker that has exited; its group leaves _LIVE in the same step (see
    :func:`kill_running_workers`)."""
    with _LIVE_LOCK:
        _LIVE.discard(proc.pid)
        return proc.wait()


def _error_line(stderr_tail: str) -> str | None:
    # a progress line (a kernel's or a soak window's JSON) says nothing of why the worker ended:
    # a soak worker killed mid-window gave 300 characters of window JSON as its reason
    lines = [
        line.strip()
        for line in stderr_tail.splitlines()
        if line.strip() and not line.startswith(PROGRESS_PREFIX)
    ]
    for line in reversed(lines):
        if _ERROR_LINE.match(line):
            return line[:300]
    return lines[-1][:300] if lines else None


def _first_line(text: str | None) -> str | None:
    """One line of a worker's reason; for a traceback, its final exception line."""
    if text is None or not text.strip():
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if lines[0].startswith("worker crashed") and len(lines) > 1:
        return ("worker crashed: " + lines[-1])[:300]
    if lines[0].startswith("Traceback"):
        return lines[-1][:300]
    return lines[0][:300]


def classify(
    returncode: int | None, document: WorkerDocument | None, stdout: bytes, stderr_tail: str
) -> tuple[ProbeResult, str | None]:
    """Classify a finished (not timed-out) worker run."""
    if returncode is None or returncode != 0:
        if returncode is not None and returncode < 0:
            try:
                name = signal.Signals(-returncode).name
            except ValueError:
                name = f"signal {-returncode}"
            head = f"worker killed by {name}"
        else:
            head = f"worker exited {returncode}"
        detail = _first_line(document.reason) if document else None
        detail = detail or _error_line(stderr_tail)
        return "error", f"{head}: {detail}" if detail else head
    if document is None:
        shown = stdout[:120].decode("utf-8", "replace")
        if not stdout.strip():
            detail = _error_line(stderr_tail)
            return "error", "worker printed no JSON" + (f" ({detail})" if detail else "")
        return "error", f"worker printed no JSON document (first bytes: {shown!r})"
    status = document.status
    reason = _first_line(document.reason)
    if status == "skipped_busy":
        return "skipped_busy", reason or "GPU busy"
    if status == "error":
        return "error", reason or "worker reported an error"
    failed = document.failed()
    if failed:
        return "error", f"{len(failed)} kernel(s) failed: {', '.join(failed)}"
    if status == "unsupported" or document.all_unsupported():
        return "unsupported", reason or "no requested kernel is supported here"
    if not document.has_items():
        return "unsupported", reason or "the worker probed nothing"
    if status == "ok":
        return "ok", None
    return "error", f"worker reported unknown status {status[:40]!r}"
