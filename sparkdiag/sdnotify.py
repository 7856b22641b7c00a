"""systemd's readiness protocol (sd_notify) without libsystemd: datagrams to $NOTIFY_SOCKET.

The daemon sends ``READY=1`` once the first poll has completed, ``WATCHDOG=1`` from the poll loop
(so a hung poller gets the service restarted), ``STATUS=...`` lines, and ``STOPPING=1`` on the
way out. Outside systemd (no $NOTIFY_SOCKET) every call is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):  # abstract namespace
            address = "\0" + address[1:]
        self.address = address
        self.watchdog_interval: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            # Ping at half the timeout, as sd_watchdog_enabled(3) advises.
            self.watchdog_interval = int(usec) / 1e6 / 2
        self._last_ping = float("-inf")
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> bool:
        """Send ``FIELD=value`` lines in one datagram; False (and a debug log) when it fails."""
        if not self.address:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(fields).encode(), self.address)
            return True
        except OSError as exc:
            log.debug("sd_notify to %r failed: %s", self.address, exc)
            return False

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def watchdog(self, now: float | None = None) -> bool:
        """Ping the watchdog when enabled and half its timeout has passed since the last ping."""
        if self.watchdog_interval is None:
            return False
        now = time.monotonic() if now is None else now
        if now - self._last_ping < self.watchdog_interval:
            return False
        self._last_ping = now
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1", "STATUS=stopping")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
