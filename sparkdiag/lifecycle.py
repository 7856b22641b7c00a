"""Signals of the daemon, installed before anything slow (imports, NVML start, the first poll).

* SIGTERM, SIGINT, SIGQUIT: stop. Answer no more scrapes, kill the running probe workers'
  process groups, exit 0: stopping is how the daemon ends, not an interruption of work (the 130
  other commands exit with on Ctrl-C; README, "Exit status"), and Ctrl-C in a terminal and
  systemd's SIGTERM end it the same way.
* SIGHUP: log that the configuration is not reloaded (restart to apply a change), and go on.
* SIGUSR1: log one status line (polls, GPUs up, probe cycles), and go on.

SIGHUP does not reload: the daemon's settings reach the poller, the probe schedulers and the HTTP
server at start, and a restart (0.3 s under systemd, baselines kept in the state directory) applies
any change with no half-applied state. Everything here imports only the standard library, so that
``sparkdiag serve`` installs it before it imports the rest.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("sparkdiag")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


class Lifecycle:
    """The stop event, and what SIGUSR1 reports (the daemon sets ``status`` once it runs)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.stopped_by: str | None = None
        self.status: Callable[[], str] = lambda: "starting"

    def install(self) -> Lifecycle:
        """Install the handlers (main thread only; elsewhere, as in tests, nothing is done)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        signal.signal(signal.SIGUSR1, self._on_usr1)
        return self

    # A handler runs in the main thread between two bytecodes, possibly in the middle of that
    # thread's own write to stderr: logging from it there raises "reentrant call" and the line is
    # lost (seen in CI: SIGHUP then SIGUSR1 at once). The handlers log from a thread of their own,
    # which waits for the stream's lock instead.
    @staticmethod
    def _log_later(level: int, message: str, *args: object) -> None:
        threading.Thread(
            target=log.log, args=(level, message, *args), name="sparkdiag-signal", daemon=False
        ).start()

    def _on_stop(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.stopped_by is None:
            self.stopped_by = name
            self._log_later(logging.INFO, "received %s, stopping", name)
        self.stop.set()

    def _on_hup(self, _signum: int, _frame: FrameType | None) -> None:
        self._log_later(
            logging.WARNING,
            "received SIGHUP: the configuration is read at start only; restart sparkdiag to "
            "apply a change (systemctl restart sparkdiag)",
        )

    def _on_usr1(self, _signum: int, _frame: FrameType | None) -> None:
        try:
            text = self.status()
        except Exception as exc:  # a status bug must not kill the daemon
            text = f"status unavailable: {exc}"
        self._log_later(logging.INFO, "status: %s", text)


# The process's one lifecycle: ``sparkdiag serve`` installs it first thing (see sparkdiag.entry).
LIFECYCLE = Lifecycle()
