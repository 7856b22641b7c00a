"""The process's signals, owned here for every command.

* SIGINT, SIGTERM and SIGHUP, for every command (the command group installs them around the
  command it runs, :meth:`Lifecycle.owning`; SIGHUP not when it is ignored, as under nohup):
  :class:`Interrupted` is raised where the main thread is, so that what is running unwinds
  (the probe workers, containers and tools that the command started run in sessions of their
  own and are killed on the way out) and the group exits INTERRUPTED (130). A command that
  stops its own work and decides how it ends (``soak``, ``watch``, ``link serve``) asks for
  :meth:`Lifecycle.stop_on_signal`: from then on the signals set :attr:`Lifecycle.stop` and
  are counted in :attr:`Lifecycle.received` instead.
* The daemon (``sparkdiag serve``, :meth:`Lifecycle.install` with ``daemon=True``, before its
  heavy imports: :mod:`sparkdiag.entry`): SIGTERM, SIGINT and SIGQUIT stop it. It answers no
  more scrapes, kills the running probe workers' process groups and exits 0: stopping is how the
  daemon ends, not an interruption of work (README, "Exit status"), and Ctrl-C in a terminal and
  systemd's SIGTERM end it the same way. SIGHUP logs that the configuration is not reloaded
  (restart to apply a change) and goes on; SIGUSR1 logs one status line (polls, GPUs up, probe
  cycles) and goes on.

A handler runs in the main thread between two bytecodes, maybe while that thread holds a lock
(inside ``stop.wait()``, a thread's start, a log call): a handler that takes a lock itself can
wait for its own thread for ever. So a handler takes none: it notes the signal, writes its
number to a pipe and, for a command, raises; the signals' thread (``sparkdiag-signals``) reads
the pipe and does the rest (sets :attr:`Lifecycle.stop`, logs, asks for the status).

SIGHUP does not reload: the daemon's settings reach the poller, the probe schedulers and the HTTP
server at start, and a restart (0.3 s under systemd, baselines kept in the state directory) applies
any change with no half-applied state. Everything here imports only the standard library, so that
``sparkdiag serve`` installs it before it imports the rest.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

log = logging.getLogger("sparkdiag")

# SIGHUP (the terminal or the ssh session closed) ends a command as SIGTERM does: left at its
# default it killed the command and none of its results were written (an hour of soak lost), and
# a worker in its own session went on loading the GPU until it noticed. Unless it is ignored
# (nohup): then it stays ignored.
COMMAND_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)  # the daemon's


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped a command: raised in the main thread by the handler. A
    KeyboardInterrupt, so that nothing that catches ``Exception`` swallows it."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class Lifecycle:
    """The stop event, the signals received, and what SIGUSR1 reports (the daemon sets
    ``status`` once it runs)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.stopped_by: str | None = None  # the first stop signal's name
        self.received: list[str] = []  # every stop signal's name, in order
        self.status: Callable[[], str] = lambda: "starting"
        self._raising = True  # a stop signal raises Interrupted (not under stopping())
        self._daemon = False
        self._installed = False
        self._wake: int | None = None  # the pipe's write end, to the signals' thread
        self._announced = False  # "received ..., stopping" logged (the daemon's first stop)
        # the signals' thread checks and sets the stop under it, owning() clears under it: a
        # stop of the command before is never set after the next one's start (no handler takes it)
        self._settling = threading.Lock()
        os.register_at_fork(after_in_child=self._forget_pipe)

    def install(self, daemon: bool = False) -> Lifecycle:
        """Install SIGINT, SIGTERM and SIGHUP (with ``daemon``: SIGQUIT and SIGUSR1 too, SIGHUP
        only logged, and a stop never raises). Main thread only; elsewhere, as in tests, nothing
        is done."""
        if not _main_thread():
            return self
        self._start_thread()
        if daemon:
            self._daemon, self._raising = True, False
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._on_stop)
            signal.signal(signal.SIGHUP, self._on_other)
            signal.signal(signal.SIGUSR1, self._on_other)
        elif not self._installed:
            for sig in COMMAND_SIGNALS:
                if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                    continue  # nohup: the user asked for the command to outlive the terminal
                signal.signal(sig, self._on_stop)
        self._installed = True
        return self

    @contextlib.contextmanager
    def owning(self) -> Iterator[None]:
        """SIGINT, SIGTERM and SIGHUP for the command run within (the command group's), restored
        after. Within a process whose handlers are already in (the daemon's, installed at start),
        nothing changes."""
        if not _main_thread() or self._installed:
            yield
            return
        previous: dict[int, Any] = {sig: signal.getsignal(sig) for sig in COMMAND_SIGNALS}
        with self._settling:
            self.stopped_by, self.received[:] = None, []
            self.stop.clear()
        self._raising, self._daemon, self._announced = True, False, False
        self.install()
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._installed = False

    def stop_on_signal(self) -> threading.Event:
        """For a command that stops its own work: from now until it returns (the end of
        :meth:`owning`), SIGINT, SIGTERM and SIGHUP set the stop event returned (and are counted in
        :attr:`received`) instead of interrupting it."""
        self._raising = False
        return self.stop

    def interrupt_on_signal(self) -> None:
        """Undo :meth:`stop_on_signal` for what is left of the command (writing out what it
        measured): a stop signal interrupts it again, so that a write that blocks (``--json``
        into a FIFO nobody reads) cannot hold the command past Ctrl-C, which it had swallowed."""
        self._raising = True

    # -- the handlers: no lock taken (see the module's docstring) -------------------------------

    def _on_stop(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        if self.stopped_by is None:
            self.stopped_by = name
        self._pass_on(signum)
        if self._raising:
            raise Interrupted(name)

    def _on_other(self, signum: int, _frame: FrameType | None) -> None:
        self._pass_on(signum)

    def _pass_on(self, signum: int) -> None:
        if self._wake is None:  # a forked child (sparkdiag makes none) has no signals' thread:
            if signum in STOP_SIGNALS:  # the stop alone, taking its lock as handlers once did
                self.stop.set()
            return
        with contextlib.suppress(OSError):  # full (a flood of signals): one is enough
            os.write(self._wake, bytes([signum]))

    # -- the signals' thread ------------------------------------------------------------------

    def _start_thread(self) -> None:
        if self._wake is not None:
            return
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._wake = write
        threading.Thread(
            target=self._signals, args=(read,), name="sparkdiag-signals", daemon=True
        ).start()

    def _forget_pipe(self) -> None:
        self._wake = None  # the thread reading it is the parent's

    def _signals(self, read: int) -> None:
        while True:
            try:
                got = os.read(read, 64)
            except InterruptedError:
                continue
            if not got:
                return
            for signum in got:
                try:
                    self._act(signum)
                except Exception:  # a logging failure must not end the signals' handling
                    log.exception("handling signal %d", signum)
            # the stop signals of the read, and one whose byte a full pipe dropped (a flood of
            # other signals): each is in received, so one settling serves them all
            self._settle()

    def _settle(self) -> None:
        with self._settling:
            if not self.received or self.stop.is_set():
                return  # none, or one from before owning() cleared them
            if self._daemon and not self._announced and self.stopped_by is not None:
                self._announced = True
                log.info("received %s, stopping", self.stopped_by)
            self.stop.set()

    def _act(self, signum: int) -> None:
        """SIGHUP's and SIGUSR1's lines; a stop signal is settled after the read."""
        if signum == signal.SIGHUP and self._daemon:  # a command's SIGHUP is a stop
            log.warning(
                "received SIGHUP: the configuration is read at start only; restart sparkdiag "
                "to apply a change (systemctl restart sparkdiag)"
            )
        elif signum == signal.SIGUSR1:
            try:
                text = self.status()
            except Exception as exc:  # a status bug must not kill the daemon
                text = f"status unavailable: {exc}"
            log.info("status: %s", text)


# The process's one lifecycle: the command group installs it around every command, and
# ``sparkdiag serve`` first thing (see sparkdiag.entry).
LIFECYCLE = Lifecycle()


class Sessions:
    """The process groups of children started in sessions of their own (probe workers, storage
    probes, an interpreter's ``sys.path`` question), which a stop kills: ``add`` a child's pid
    as it starts, ``discard`` it once reaped, under :attr:`lock` where the reaping is (so that
    :meth:`kill`, which signals under the lock, never signals a reaped child's number, which
    the kernel may have given another process). One kill for the three kinds, where each kept
    its own copy."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._pids: set[int] = set()

    def add(self, pid: int) -> None:
        with self.lock:
            self._pids.add(pid)

    def discard(self, pid: int) -> None:
        """Forget ``pid``; the caller holds :attr:`lock` where it reaps under it."""
        self._pids.discard(pid)

    def __contains__(self, pid: object) -> bool:
        return pid in self._pids

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._pids))

    def __len__(self) -> int:
        return len(self._pids)

    def reap_when_gone(self, proc: Any) -> None:
        """In a daemon thread: wait, without reaping, for a child that SIGKILL could not end yet
        (stuck in the kernel or the driver), then reap it and forget it under the lock, so that
        a stop meanwhile signals it again (a daemon that exits first leaves it to init)."""

        def wait() -> None:
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            with self.lock:
                self._pids.discard(proc.pid)
                proc.wait()

        threading.Thread(target=wait, name=f"reap-{proc.pid}", daemon=True).start()

    def kill(self, send: Callable[[int, signal.Signals], None] = os.killpg) -> int:
        """SIGKILL every group (under the lock, through ``send``); how many there were."""
        with self.lock:
            groups = sorted(self._pids)
            for pgid in groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    send(pgid, signal.SIGKILL)
        return len(groups)
