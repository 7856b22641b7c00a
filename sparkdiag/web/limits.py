"""The HTTP server's limits, what it counts of them, and the connection cap the open-files
limit allows.

* ``timeout`` bounds each step of a connection: the TLS handshake, receiving a whole request head
  (a client trickling bytes gets no more time than a silent one), waiting idle for the next
  request on a kept-alive connection, and writing each response.
* ``max_connections`` caps open connections, lowered to what the open-files limit leaves
  (:func:`connection_cap`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import time
from dataclasses import dataclass, field

from sparkdiag.config import DEFAULTS

RESERVED_FDS = 64  # file descriptors kept for the rest of the daemon (NVML, store, workers)
MAX_REFUSING = 8  # sockets held at once to answer 503 beyond the cap (counted in the reserve)
FD_WARN_QUIET = 60.0  # out of descriptors: a warning, then debug lines until this long passes
# A response still being written after this long goes to a client that does not read it: at
# the cap such a connection is evicted like an idle one (a scrape's response is written in
# milliseconds; before, only the write timeout freed it, and hundreds of them failed a fifth of the
# scrapes in the security review of 2026-12-05)
STALLED_WRITE = 1.0


@dataclass(frozen=True)
class Limits:
    timeout: float = DEFAULTS["web_read_timeout"]
    max_connections: int = DEFAULTS["web_max_connections"]
    backlog: int = 1024


@dataclass
class Stats:
    """Counters of what the limits did, for tests and debugging."""

    accepted: int = 0
    evicted: int = 0  # closed to make room for a new connection
    refused: int = 0  # new connections turned away at the cap
    timed_out: int = 0  # closed by the timeout (handshake, request, idle or write)
    out_of_fds: int = 0  # accept() failures for want of file descriptors
    fd_episodes: int = 0  # runs of such failures: a warning each, none within FD_WARN_QUIET s
    tls_started: int = 0  # connections that sent a ClientHello (and so got TLS state)


@dataclass(eq=False)
class Connection:
    """One open connection, as the cap and the eviction see it."""

    sock: socket.socket
    peer: str
    task: asyncio.Task[None] | None = None
    waiting: bool = True  # no request in progress: idle, reading a head or in the handshake
    since: float = field(default_factory=time.monotonic)
    partial: bool = False  # some bytes of the next request have arrived
    writing: float | None = None  # when the response being written began to be

    def wait(self) -> None:
        self.waiting, self.since, self.partial = True, time.monotonic(), False

    def busy(self) -> None:
        self.waiting = False

    def stalled_since(self, now: float) -> float | None:
        """Since when the connection has done nothing for the server: waiting for a request,
        or writing one response for over ``STALLED_WRITE`` s; None while it is served."""
        if self.waiting:
            return self.since
        if self.writing is not None and now - self.writing >= STALLED_WRITE:
            return self.writing
        return None


def connection_cap(wanted: int) -> tuple[int, str | None]:
    """The connection cap the open-files limit allows: (cap, why it is below ``wanted``).

    The soft limit is raised towards the hard one first where it is too low (systemd's default
    is 1024 soft, 524288 hard, precisely so that programs that need more raise it themselves;
    the Go runtime does so for every Go exporter), keeping ``RESERVED_FDS`` descriptors beside
    the ones already open."""
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 32
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + in_use + RESERVED_FDS + MAX_REFUSING
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(hard, need)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted, None
    cap = max(1, soft - in_use - RESERVED_FDS - MAX_REFUSING)
    return cap, (
        f"web.max-connections {wanted} lowered to {cap}: the open-files limit is {soft} "
        f"(hard {hard}) and {in_use + RESERVED_FDS + MAX_REFUSING} are kept for the rest of the "
        "daemon and for refusals; "
        "raise LimitNOFILE= to serve more"
    )


def peer_name(sock: socket.socket) -> str:
    try:
        peer = sock.getpeername()
    except OSError:
        return "?"
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
