"""Run the worker's soak on every target at once (one worker per GPU), and stop them cleanly.

Each worker runs in its own session (:func:`sparkdiag.probe.runner.run_worker`), so a Ctrl-C in the
terminal reaches this process only, whose signals the command group owns
(:meth:`sparkdiag.lifecycle.Lifecycle.stop_on_signal`: they are counted, not raised, while a soak
runs). The first SIGINT or SIGTERM is passed on to every worker as the same signal (so that its
record says which one stopped it): the worker stops at its next check (within about
``--soak-chunk-ms``, or once the window it is measuring ends), synchronizes the GPU, frees its
buffers and prints its document with ``stopped: interrupted``. A second signal, or a worker still
running :data:`INTERRUPT_GRACE_SECONDS` after the first, gets its process group killed (the driver
frees a dead process's context, so the GPU is idle either way); its record then holds the windows of
its progress lines. Windows reach ``on_window`` in this (the main) thread, as they are measured.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sparkdiag.lifecycle import LIFECYCLE, Lifecycle
from sparkdiag.probe.document import Progress, SoakWindow
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.probe.runner import ProbeCycle, killpg, run_worker
from sparkdiag.soak.model import GpuSoak, Target
from sparkdiag.soak.verdict import judge

INTERRUPT_GRACE_SECONDS = 30.0  # after the first interrupt, how long a worker has to stop
POLL_SECONDS = 0.1


@dataclass(frozen=True)
class Job:
    """One worker to run: where, with which request and environment."""

    target: Target
    request: WorkerRequest
    env: Mapping[str, str] | None = None
    python: tuple[str, ...] | None = None  # the interpreter command; None: the runner's


class SoakRunner:
    """Runs the jobs in parallel threads; :meth:`run` waits for all of them in the main thread."""

    def __init__(
        self,
        jobs: Sequence[Job],
        timeout: float,
        python: Sequence[str] = (sys.executable,),
        grace: float = INTERRUPT_GRACE_SECONDS,
        life: Lifecycle = LIFECYCLE,
    ) -> None:
        self.jobs = list(jobs)
        self.life = life
        self.timeout = timeout
        self.python = tuple(python)
        self.grace = grace
        self.interrupted: str | None = None  # the first signal's name
        self.killed = False
        self._lock = threading.Lock()
        self._pids: dict[int, int] = {}
        self._windows: list[list[SoakWindow]] = [[] for _ in self.jobs]
        self._cycles: list[ProbeCycle | None] = [None] * len(self.jobs)
        self._queue: queue.Queue[tuple[int, SoakWindow]] = queue.Queue()
        self._signals: list[str] = []  # the signals received, acted on by the main loop
        self._seen = 0  # of the lifecycle's received signals
        self._interrupted_at: float | None = None

    # -- the worker threads ---------------------------------------------------------------------

    def _started(self, i: int, pid: int) -> None:
        with self._lock:
            self._pids[i] = pid
            killed, interrupted = self.killed, self.interrupted is not None
        if killed or interrupted:  # the interrupt came before this worker started
            killpg(pid, signal.SIGKILL if killed else _passed_on(self.interrupted))

    def _progress(self, i: int, item: Progress) -> None:
        if item.window is not None:
            self._windows[i].append(item.window)
            self._queue.put((i, item.window))

    def _run(self, i: int) -> None:
        job = self.jobs[i]
        try:
            self._cycles[i] = run_worker(
                job.python or self.python,
                job.request,
                self.timeout,
                env=job.env,
                on_start=lambda pid: self._started(i, pid),
                on_progress=lambda item: self._progress(i, item),
            )
        except Exception as exc:  # a bug here must not leave the main loop waiting
            self._cycles[i] = ProbeCycle(
                "error",
                f"cannot run the worker: {type(exc).__name__}: {exc}",
                None,
                "",
                None,
                0.0,
                self._pids.get(i),
            )
        finally:
            with self._lock:  # reaped: its pid may name another process from now on
                self._pids.pop(i, None)

    # -- the main thread ------------------------------------------------------------------------

    def _act(self) -> None:
        """Pass on the signals received since the last call; kill workers past the grace."""
        received = self.life.received
        self._signals += received[self._seen :]
        self._seen = len(received)
        while self._signals:
            name = self._signals.pop(0)
            with self._lock:
                first = self.interrupted is None
                if first:
                    self.interrupted, self._interrupted_at = name, time.monotonic()
                else:
                    self.killed = True
                pids = list(self._pids.values())
            for pid in pids:
                killpg(pid, _passed_on(name) if first else signal.SIGKILL)
        at = self._interrupted_at
        if at is not None and not self.killed and time.monotonic() - at > self.grace:
            self.kill()

    def kill(self) -> None:
        """SIGKILL every worker's process group."""
        with self._lock:
            self.killed = True
            pids = list(self._pids.values())
        for pid in pids:
            killpg(pid, signal.SIGKILL)

    def interrupt(self, name: str = "SIGINT") -> None:
        """As if the command got ``name`` (tests, and callers without signals)."""
        self._signals.append(name)

    def run(self, on_window: Callable[[int, SoakWindow], None] | None = None) -> list[GpuSoak]:
        """Run every job to its end; SIGINT, SIGTERM and SIGHUP stop them (the module's
        docstring)."""
        self.life.stop_on_signal()
        self._seen = len(self.life.received)
        threads = [
            threading.Thread(target=self._run, args=(i,), name=f"soak-{i}", daemon=True)
            for i in range(len(self.jobs))
        ]
        try:
            for thread in threads:
                thread.start()
            while any(t.is_alive() for t in threads) or not self._queue.empty():
                self._act()
                try:
                    i, window = self._queue.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    continue
                if on_window is not None:
                    on_window(i, window)
        finally:
            if any(t.is_alive() for t in threads):  # an exception in on_window, or in here
                self.kill()
                for thread in threads:
                    thread.join(timeout=10)
        return [self._outcome(i) for i in range(len(self.jobs))]

    def _outcome(self, i: int) -> GpuSoak:
        job = self.jobs[i]
        cycle = self._cycles[i] or ProbeCycle(
            "error", "the worker did not run", None, "", None, 0.0, None
        )
        progress = tuple(self._windows[i])
        doc = cycle.document
        soak = doc.soak if doc is not None else None
        windows = progress
        elapsed = progress[-1].elapsed_seconds if progress else None
        thresholds: Mapping[str, float] = {}
        if soak is not None and soak.stopped:
            stopped, reason = soak.stopped, soak.reason
            windows = soak.windows or progress
            elapsed = soak.elapsed_seconds
            thresholds = soak.thresholds
        elif self.killed or (self.interrupted and cycle.result == "error"):
            stopped = "interrupted"
            reason = (
                f"{self.interrupted} received; the worker was killed before it stopped by itself"
                if self.killed
                else f"{self.interrupted} received before the soak started ({cycle.reason})"
            )
        elif cycle.result == "skipped_busy":
            stopped, reason = "skipped", cycle.reason
        elif cycle.result == "unsupported":
            stopped, reason = "unsupported", cycle.reason
        else:
            stopped = "error"
            reason = cycle.reason or "the worker's document has no soak"
        return GpuSoak(
            target=job.target,
            stopped=stopped,
            reason=reason,
            elapsed_seconds=elapsed,
            windows=windows,
            verdict=judge(windows, thermal=job.request.device != "cpu"),
            result=cycle.result,
            worker_reason=cycle.reason,
            worker_pid=cycle.worker_pid,
            stderr_tail=cycle.stderr_tail,
            software=doc.software if doc is not None else None,
            thresholds=thresholds,
        )


def _passed_on(name: str | None) -> signal.Signals:
    """The signal a worker gets for the one received: the same for SIGTERM and SIGHUP, else
    SIGINT (each stops the worker cleanly, and its record names it)."""
    if name == "SIGHUP":
        return signal.SIGHUP
    return signal.SIGTERM if name == "SIGTERM" else signal.SIGINT
