"""The Python stacks of a running process, read from outside by py-spy (the only module that
runs it; an optional extra: ``pip install 'sparkdiag[stacks]'``).

One :class:`Recorder` runs ``py-spy record --format chrometrace --threads --idle --nonblocking``
on one process until it is stopped (SIGINT) or the process ends, then its trace is read back as
:class:`Segment` s: the stretches of time each thread spent in one stack. The chrome trace is the
one py-spy format that keeps time (microseconds since py-spy started, so a stretch maps onto the
caller's clock); ``raw`` and ``speedscope`` only count samples. ``--nonblocking`` reads the
process's memory without stopping it: on this machine a blocking 50 Hz record slowed a
launch-bound loop by 17 % (median of 3 runs), a non-blocking one by nothing measurable.
``--native`` (C and C++ frames: ``cudaStreamSynchronize``, ``cudaMemcpy``) needs the process
stopped at each sample and is left to the caller. ``--subprocesses`` is not used: py-spy keys a
chrome trace's threads by their pthread id, which forked processes share, so one recorder per
process keeps the threads apart.

Reading another process's memory needs ptrace's rights (:func:`access_problem`): the same user
(or CAP_SYS_PTRACE) and, under Yama's ``ptrace_scope`` 1, being the process's ancestor or
declared by it (``PR_SET_PTRACER``; :data:`PTRACER_SHIM` does that for a command it starts).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkdiag.sources.files import KIB, MIB, read_text_limited
from sparkdiag.sources.host.procfs import status_field

ENV = "SPARKDIAG_PYSPY"  # the py-spy binary to use; an empty or missing path: none
CAP_SYS_PTRACE = 19  # linux/capability.h
PR_SET_PTRACER = 0x59616D61  # linux/prctl.h ("Yama")
TRACE_LIMIT = 256 * MIB  # a chrome trace larger than this is not read
GRANT = (
    "give watch CAP_SYS_PTRACE (root has it unless a container dropped it: docker run "
    "--cap-add SYS_PTRACE; Kubernetes: securityContext.capabilities.add: [SYS_PTRACE])"
)
# Run as ``python -c PTRACER_SHIM CMD ARGS...``: lets the parent (watch) and its children (py-spy)
# read the command's memory under Yama ptrace_scope 1, then becomes the command (same pid).
PTRACER_SHIM = (
    "import ctypes, os, sys\n"
    "try:\n"
    f"    ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PTRACER}, os.getppid(), 0, 0, 0)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)
_THREAD = re.compile(r"thread \((0x[0-9A-Fa-f]+|\d+)\)(?:: (.*))?$")


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python frame: the function (py-spy's qualified name), the file as the process sees
    it, and the line it was at (0 where py-spy gives none)."""

    function: str
    file: str
    line: int


@dataclass(frozen=True, slots=True)
class Segment:
    """A thread in one stack from ``start`` to ``end`` (seconds on the recorder's clock).
    ``tid``: the OS thread id (the process's pid for its main thread) where py-spy read it,
    else its pthread id; ``frames``: outermost first."""

    start: float
    end: float
    pid: int
    tid: int
    thread: str
    frames: tuple[Frame, ...]


class StackError(Exception):
    """py-spy could not read the process; the message says why in one line."""


# -- finding py-spy and the right to use it ---------------------------------------------------


def find(environ: Mapping[str, str] | None = None) -> Path | None:
    """The py-spy binary: ``$SPARKDIAG_PYSPY`` when set (None if it is not an executable), else
    on PATH, beside this interpreter (a virtualenv's bin), where the py-spy distribution put it
    (``pip install --target`` leaves it in the target's bin), in the interpreter's scripts."""
    env = os.environ if environ is None else environ
    if ENV in env:
        given = Path(env[ENV]) if env[ENV] else None
        return given if given is not None and _executable(given) else None
    found = shutil.which("py-spy", path=env.get("PATH"))
    if found:
        return Path(found)
    for candidate in _candidates():
        if _executable(candidate):
            return candidate
    return None


def _candidates() -> Iterable[Path]:
    yield Path(sys.executable).parent / "py-spy"
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution("py-spy")
        for packed in dist.files or ():
            if packed.name == "py-spy":
                yield Path(str(dist.locate_file(packed))).resolve()
    for folder in sys.path:
        if folder:
            yield Path(folder) / "bin" / "py-spy"
    yield Path(sysconfig.get_path("scripts")) / "py-spy"
    with contextlib.suppress(KeyError):
        yield Path(sysconfig.get_path("scripts", f"{os.name}_user")) / "py-spy"


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def version(binary: Path) -> str | None:
    """``py-spy --version``'s answer ("py-spy 0.4.3"), None when it does not run."""
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def has_ptrace_capability(status: str) -> bool:
    """Whether a ``/proc/PID/status`` text shows CAP_SYS_PTRACE among the effective ones."""
    value = status_field(status, "CapEff")
    try:
        return value is not None and bool(int(value, 16) >> CAP_SYS_PTRACE & 1)
    except ValueError:
        return False


def access_problem(
    own_status: str, target_status: str | None, yama: str | None, descendant: bool
) -> str | None:
    """Why reading the target's memory would be refused, with what to grant; None when it should
    be allowed. ``own_status``/``target_status``: the text of ``/proc/self/status`` and of the
    target's ``/proc/PID/status`` (None: unreadable); ``yama``: ``ptrace_scope`` (None: no Yama);
    ``descendant``: the target is this process's child and has declared it its tracer (a job
    started through :data:`PTRACER_SHIM`). The kernel's rules (ptrace(2), Yama's documentation)."""
    scope = (yama or "0").strip()
    if scope == "3":
        return (
            "the kernel forbids reading any process's memory (kernel.yama.ptrace_scope=3, only "
            "a reboot lowers it)"
        )
    if has_ptrace_capability(own_status):
        return None
    if scope == "2":
        return f"kernel.yama.ptrace_scope=2 lets only CAP_SYS_PTRACE read other processes: {GRANT}"
    own = status_field(own_status, "Uid")
    theirs = None if target_status is None else status_field(target_status, "Uid")
    if own is None or theirs is None or own.split()[1:2] != theirs.split()[:1]:
        return f"the job runs as another user: {GRANT}"
    if scope == "1" and not descendant:
        return (
            "kernel.yama.ptrace_scope=1 lets a process read only its own descendants: start the "
            "job under watch (sparkdiag watch -- CMD), set kernel.yama.ptrace_scope=0, or " + GRANT
        )
    return None


def _read(path: Path) -> str | None:
    try:
        return read_text_limited(path, 64 * KIB)
    except OSError:
        return None


def ptrace_problem(rootfs: Path, pid: int, descendant: bool) -> str | None:
    """:func:`access_problem` for ``pid`` under ``ROOT`` (this process read from the real /proc)."""
    own = _read(Path("/proc/self/status")) or ""
    yama = _read(rootfs / "proc/sys/kernel/yama/ptrace_scope")
    return access_problem(own, _read(rootfs / "proc" / str(pid) / "status"), yama, descendant)


def yama_scope(rootfs: Path) -> str | None:
    """``kernel.yama.ptrace_scope`` ("0".."3"), None without Yama."""
    value = _read(rootfs / "proc/sys/kernel/yama/ptrace_scope")
    return None if value is None else value.strip()


# -- recording ----------------------------------------------------------------------------------


class Recorder:
    """``py-spy record`` of one process into a chrome trace under ``workdir``: :meth:`start`,
    :meth:`stop` (SIGINT: py-spy writes its trace and exits), :meth:`collect`. ``rate``: samples
    a second; ``native``: C/C++ frames too (py-spy then stops the process at each sample)."""

    def __init__(
        self,
        binary: Path,
        pid: int,
        workdir: Path,
        rate: int,
        native: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.binary, self.pid, self.rate, self.native = binary, pid, rate, native
        self.clock = clock
        self.trace = workdir / f"stacks-{pid}-{time.monotonic_ns()}.json"
        self.log = self.trace.with_suffix(".log")
        self.origin = 0.0
        self.since: float | None = None  # stretches before this are cut (the chunk before)
        self.stopped_at: float | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [
            str(self.binary), "record", "--pid", str(self.pid), "--format", "chrometrace",
            "--output", str(self.trace), "--rate", str(self.rate), "--threads", "--idle",
            *(["--native"] if self.native else ["--nonblocking"]),
        ]  # fmt: skip

    def start(self) -> None:
        with self.log.open("wb") as log:
            self.origin = self.clock()
            # its own session: a Ctrl-C in the terminal reaches watch, which stops it in turn
            self.proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Ask py-spy to write its trace and exit (it samples until then)."""
        if self.stopped_at is None:
            self.stopped_at = self.clock()
        if self.running():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGINT)

    def collect(self, timeout: float = 10.0) -> list[Segment]:
        """Wait for py-spy to end (killed after ``timeout``) and read its trace; StackError with
        py-spy's own reason when it wrote none."""
        if self.proc is None:
            raise StackError("py-spy was not started")
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            text = read_text_limited(self.trace, TRACE_LIMIT)
        except OSError:
            raise StackError(error_message(_read(self.log) or "")) from None
        finally:
            for path in (self.trace, self.log):
                path.unlink(missing_ok=True)
        try:
            events = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StackError(f"py-spy wrote an unreadable trace ({exc.msg})") from None
        return parse_chrometrace(events, self.origin, self.pid, self.since, self.stopped_at)


def error_message(log: str) -> str:
    """py-spy's reason for failing in one line: the last cause it gives after "Error:"."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    error = next((i for i, line in enumerate(lines) if line.startswith("Error:")), None)
    if error is None:
        return lines[-1] if lines else "py-spy ended without a trace"
    message = lines[error].removeprefix("Error:").strip()
    causes = []
    for line in lines[error + 1 :]:
        if line.startswith("Stack backtrace"):
            break
        cause = re.sub(r"^\d+:\s*", "", line)
        if cause and cause != "Caused by:":
            causes.append(cause)
    if causes:
        message = f"{message} ({causes[-1]})"
    if "Permission denied" in message or "Operation not permitted" in message:
        message += f"; {GRANT}"
    elif "python version" in message.lower():
        message = f"not a Python process, or one py-spy does not know ({message})"
    return message


def _thread(frame: Frame) -> tuple[int, str] | None:
    """(tid, name) of py-spy's thread pseudo-frame ``thread (TID): NAME``."""
    if frame.file or frame.line:
        return None
    match = _THREAD.match(frame.function)
    if match is None:
        return None
    raw = match.group(1)
    return (int(raw, 16) if raw.startswith("0x") else int(raw)), match.group(2) or ""


def parse_chrometrace(
    events: Any,
    origin: float,
    pid: int,
    since: float | None = None,
    until: float | None = None,
) -> list[Segment]:
    """The segments of a py-spy chrome trace: its "B"/"E" events open and close frames per
    thread (keyed by the event's ``tid``, a pthread id), at ``ts`` microseconds after
    ``origin``; a stack lasts from one change to the next. Stretches are cut to ``since``
    (where the recorder before this one stopped) and ``until`` (the moment py-spy was asked to
    stop). Events it cannot read are skipped."""
    if not isinstance(events, list):
        return []
    stacks: dict[int, list[Frame]] = {}
    opened: dict[int, float] = {}
    out: list[Segment] = []

    def close(key: int, at: float) -> None:
        frames = stacks.get(key) or []
        began = opened.get(key)
        if began is not None and at > began and frames:
            ident = _thread(frames[0])
            if ident is not None:
                end = at if until is None else min(at, until)
                start = began if since is None else max(began, since)
                if end > start:
                    out.append(Segment(start, end, pid, ident[0], ident[1], tuple(frames[1:])))
        opened[key] = at

    for event in events:
        if not isinstance(event, dict) or event.get("ph") not in ("B", "E"):
            continue
        try:
            key = int(event["tid"])
            at = origin + float(event["ts"]) / 1e6
            args = event.get("args") or {}
            frame = Frame(
                str(event["name"]), str(args.get("filename") or ""), int(args.get("line") or 0)
            )
        except (KeyError, TypeError, ValueError):
            continue
        if at != opened.get(key):
            close(key, at)
        stack = stacks.setdefault(key, [])
        if event["ph"] == "B":
            stack.append(frame)
        elif stack:
            stack.pop()
    return out


# -- what the frames point at ---------------------------------------------------------------------

LINE_CHARS = 200  # a source line kept in a recording is cut here
SOURCE_LIMIT = 4 * MIB  # a source file larger than this is not read


class SourceLines:
    """The text of a frame's line, read from the file the process names: through the process's
    own root (``ROOT/proc/PID/root/FILE``, which sees a container's files) while it runs, else
    under ``ROOT``. Files are read once (at most ``SOURCE_LIMIT``); "" where none can be read."""

    def __init__(self, rootfs: Path) -> None:
        self.rootfs = rootfs
        self._files: dict[tuple[int, str], list[str]] = {}

    def __call__(self, pid: int, file: str, line: int) -> str:
        if not file.startswith("/") or line <= 0:
            return ""
        lines = self._files.get((pid, file))
        if lines is None:
            lines = []
            for base in (self.rootfs / "proc" / str(pid) / "root", self.rootfs):
                try:
                    lines = read_text_limited(base / file.lstrip("/"), SOURCE_LIMIT).splitlines()
                    break
                except OSError:
                    continue
            self._files[(pid, file)] = lines
        return lines[line - 1].strip()[:LINE_CHARS] if line <= len(lines) else ""


def process_cwd(rootfs: Path, pid: int) -> str:
    """The working directory of ``pid`` (``readlink /proc/PID/cwd``); "" when unreadable."""
    try:
        return os.readlink(rootfs / "proc" / str(pid) / "cwd")
    except OSError:
        return ""
