"""The one way a worker runs inside a container, shared by ``sparkdiag compare`` and the daemon's
container probe (``probe.container-command``).

The container command (an argument list, never given to a shell) gets the worker's source on
standard input, so nothing has to be installed in the image; :mod:`sparkdiag.probe.relay` runs
it and forwards only the worker's document.

Containers that outlive their client are stopped when a cycle is abandoned.

``docker run`` and ``podman run`` are clients: the container itself is run by the engine
(dockerd; podman's conmon). When a cycle times out, the runner kills the client's process
group, but the container goes on running (with ``--rm`` too): its main process is PID 1 of the
container, which ignores the SIGTERM that the client forwards unless it installed a handler,
and SIGKILL of the client is not forwarded at all. Measured with podman 4.3.1: after a timed-out
``compare``, ``podman ps`` still listed the hung container, holding its GPU until it ended.

So for a ``docker``/``podman``/``nerdctl`` ``run`` command, ``--cidfile`` is added after ``run``
and, when the cycle is abandoned (timeout, or an exception such as Ctrl-C), the container named
in that file is killed with the same engine and its global options (``podman --runtime runc
kill ID``); with ``--rm`` it is also removed. Any other command (``apptainer exec``, ``enroot
start``, a wrapper script) is run unchanged.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from sparkdiag.probe.document import SCHEMA
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.probe.runner import ProbeCycle, run_worker

RELAY_PATH = Path(__file__).with_name("relay.py")

ENGINES = frozenset({"docker", "podman", "nerdctl"})
ENGINE_CALL_TIMEOUT = 30.0  # seconds for one `kill` or `rm` call to the engine


def _run_index(command: Sequence[str]) -> int | None:
    """Index of the ``run`` subcommand in an engine command, or None (not a guarded command).

    Global options come before it (``podman --runtime runc run``), and ``docker container run``
    has its object word before it: the first word ``run`` is taken."""
    if not command or Path(command[0]).name not in ENGINES:
        return None
    for index, word in enumerate(command[1:], start=1):
        if word == "run":
            return index
    return None


def _has_option(words: Sequence[str], name: str) -> bool:
    return any(w == name or w.startswith(name + "=") for w in words)


class ContainerGuard:
    """One guarded run: ``argv`` is the command to start (``--cidfile`` added where it applies);
    ``close(abandoned)`` kills the container if the cycle was abandoned, and cleans up."""

    def __init__(self, command: Sequence[str]) -> None:
        self.command = tuple(command)
        self.argv = self.command
        self.prefix: tuple[str, ...] = ()
        self.remove = False
        self._dir: Path | None = None
        index = _run_index(self.command)
        if index is None or _has_option(self.command[index + 1 :], "--cidfile"):
            return
        self._dir = Path(tempfile.mkdtemp(prefix="sparkdiag-cid-"))
        self.prefix = self.command[:index]
        self.remove = _has_option(self.command[index + 1 :], "--rm")
        cidfile = self._dir / "cid"  # must not exist yet: the engine creates it
        self.argv = (*self.command[: index + 1], f"--cidfile={cidfile}", *self.command[index + 1 :])

    @property
    def guarded(self) -> bool:
        return self._dir is not None

    def container_id(self) -> str | None:
        if self._dir is None:
            return None
        try:
            text = (self._dir / "cid").read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return text or None

    def close(self, abandoned: bool) -> None:
        """Kill (and remove) an abandoned container. A further Ctrl-C while the engine's kill
        runs (it may take seconds) interrupted the kill and left the container on the GPU
        (found in a review): the kill is tried again, ``CLOSE_ATTEMPTS`` times at most, and
        the interruption raised once the container is dealt with."""
        interrupted: BaseException | None = None
        try:
            cid = self.container_id()
            if abandoned and cid is not None:
                calls = [("kill", cid)] + ([("rm", "--force", cid)] if self.remove else [])
                for args in calls:
                    for _attempt in range(CLOSE_ATTEMPTS):
                        try:
                            self._engine(*args)
                            break
                        except KeyboardInterrupt as exc:
                            interrupted = exc
        finally:
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
        if interrupted is not None:
            raise interrupted

    def _engine(self, *args: str) -> None:
        # The container may already be gone (it ended, or --rm removed it): errors are expected.
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [*self.prefix, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=ENGINE_CALL_TIMEOUT,
                check=False,
            )


CLOSE_ATTEMPTS = 3  # tries of each engine call of a close that a further Ctrl-C interrupts


def guards(command: Sequence[str]) -> bool:
    """True when a cycle of ``command`` would have its container stopped when abandoned."""
    index = _run_index(command)
    return index is not None and not _has_option(command[index + 1 :], "--cidfile")


def run_guarded(command: Sequence[str], run: Callable[[Sequence[str]], ProbeCycle]) -> ProbeCycle:
    """``run(argv)`` with ``argv`` the guarded form of ``command``; a cycle that timed out, whose
    client was killed by a signal (the daemon stopping) or that raised has its container killed
    (and removed with ``--rm``)."""
    guard = ContainerGuard(command)
    abandoned = True
    try:
        cycle = run(guard.argv)
        killed = cycle.returncode is not None and cycle.returncode < 0
        abandoned = cycle.result == "timeout" or killed
        return cycle
    finally:
        guard.close(abandoned)


def container_command(cmd: Sequence[str]) -> tuple[str, ...]:
    """The container command as the runner wants it: without the interpreter's trailing "-".

    Users write the command that reads a script from standard input, ending in ``-`` (``docker
    run -i --rm --gpus all IMAGE python3 -``); the runner appends ``-`` and the worker's
    arguments itself, so one trailing ``-`` is dropped. A command without it is taken as is.
    """
    argv = tuple(str(a) for a in cmd)
    if argv and argv[-1] == "-":
        argv = argv[:-1]
    if not argv:
        raise ValueError("the container command is empty: give the command that starts Python")
    return argv


def run_in_container(
    command: Sequence[str],
    request: WorkerRequest,
    timeout: float,
    kill_grace: float = 2.0,
    on_start: Callable[[int], None] | None = None,
) -> ProbeCycle:
    """One worker cycle inside the container: its source on standard input, through the relay
    that keeps only the worker's document on standard output; a container that outlives an
    abandoned cycle is stopped (engine.run_guarded)."""

    def relayed(argv: Sequence[str]) -> ProbeCycle:
        relay = (sys.executable, "-I", str(RELAY_PATH), SCHEMA, *argv)
        return run_worker(
            relay,
            request,
            timeout=timeout,
            stdin_script=True,
            kill_grace=kill_grace,
            on_start=on_start,
        )

    return run_guarded(container_command(command), relayed)
