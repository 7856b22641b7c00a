"""Moving bytes on data connections, the same way at both ends: a sender writes 1 MiB chunks
until its deadline; a receiver counts what arrives and when the first and last bytes came, and
the rate is what the receiver counted over that window.

Each stream runs in its own thread: ``send``/``recv_into`` release the GIL during the system
call, so streams run in parallel on as many cores as the kernel gives them.
"""

from __future__ import annotations

import socket
import threading
import time

from sparkdiag.link.wire import CHUNK

_ZEROS = memoryview(bytes(CHUNK))


class Counter:
    """Bytes received over several streams, and the first and last arrival (monotonic s)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes = 0
        self.first: float | None = None
        self.last: float | None = None

    def add(self, count: int, now: float) -> None:
        with self._lock:
            self.bytes += count
            if self.first is None:
                self.first = now
            self.last = now

    @property
    def seconds(self) -> float:
        if self.first is None or self.last is None:
            return 0.0
        return self.last - self.first

    def gbps(self) -> float | None:
        """Gb/s over the arrival window; None when fewer than two arrivals spanned any time."""
        seconds = self.seconds
        return self.bytes * 8 / seconds / 1e9 if seconds > 0 and self.bytes else None


def receive(
    sock: socket.socket, counter: Counter, initial: bytes, idle: float, until: float | None = None
) -> None:
    """Count every byte until the sender closes, ``idle`` seconds pass with nothing, or the
    monotonic time ``until`` (a sender that never stops is not counted forever)."""
    if initial:
        counter.add(len(initial), time.monotonic())
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    sock.settimeout(idle)
    try:
        while until is None or time.monotonic() < until:
            got = sock.recv_into(view)
            if not got:
                return
            counter.add(got, time.monotonic())
    except OSError:
        return


def send_until(sock: socket.socket, deadline: float) -> int:
    """Send zeros until ``deadline`` (monotonic), then close the sending half; bytes sent."""
    sent = 0
    try:
        while time.monotonic() < deadline:
            sock.sendall(_ZEROS)
            sent += CHUNK
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    return sent
