"""What one client can make ``link serve`` hold or spawn, and the bounds on each.

Measured before these bounds (issue 29): one client registered tests without limit (RSS 33 ->
664 MiB in 16 s, 219 MiB still held after it left), started 150 ``iperf3`` servers in 4 s (at the
open-files limit ``accept()`` raised EMFILE and the server exited with a traceback; the killed
iperf3s stayed zombies holding pipes), held the one session forever, and filled the connection
cap so that every other client was reset. ``benchmarks/link_flood.py`` floods a ``link serve``
for 60 s and prints its RSS, open files and children; docs/link.md has its figures.

* :class:`Pending`: connections that have not yet proved anything (the control connection
  until its proof, a data or ping connection until its session token): at most
  :data:`MAX_PENDING_PER_ADDRESS` from one address and :data:`MAX_PENDING` in all; past either,
  the oldest of the address that holds the most is closed. Each has
  :data:`~sparkdiag.link.wire.HELLO_TIMEOUT` seconds to prove itself.
* :class:`Session`: at most :data:`MAX_SESSION_CONNECTIONS` connections, :data:`MAX_TESTS`
  tests set up and not collected, :data:`MAX_TOOLS` tools alive and :data:`MAX_TOOL_RUNS`
  started; a tool is killed :data:`TOOL_GRACE` seconds after its measurement should have ended;
  the session ends after :data:`CONTROL_IDLE` seconds of silence or :data:`SESSION_SECONDS` in
  all (the longest full test, four rails, three methods, two directions of 60 s, takes 24
  minutes), and at its end its tools are killed and reaped and its connections closed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field

from sparkdiag.link import tools
from sparkdiag.link.streams import Counter
from sparkdiag.link.wire import MAX_STREAMS, PING_BYTES, PING_MAX

CONTROL_IDLE = 60.0  # seconds a session may stay silent
SESSION_SECONDS = 1800.0  # seconds a session may last
MAX_PENDING = 64
MAX_PENDING_PER_ADDRESS = 16
MAX_SESSION_CONNECTIONS = 2 * MAX_STREAMS + 8  # two tests' streams, pings and the control
MAX_TESTS = 4  # a link test uses one at a time
MAX_TOOLS = 2  # a link test runs one tool server at a time
MAX_TOOL_RUNS = 32  # four paths, two tools, two directions: 16
TOOL_GRACE = 30.0
RESULT_WAIT = 15.0  # seconds a result waits for its test's streams to end
SINK_GRACE = 15.0  # a data connection counts for its test's seconds and this long after
PING_LIMIT = (PING_MAX + 64) * PING_BYTES  # bytes echoed on one ping connection


@dataclass(eq=False)
class Conn:
    """One accepted connection."""

    sock: socket.socket
    peer: str
    since: float = field(default_factory=time.monotonic)

    def shut(self) -> None:
        """Wake whatever reads it (its own thread closes it)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class Pending:
    """Connections that have not proved themselves yet, bounded per address and in all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_address: dict[str, list[Conn]] = {}

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._by_address.values())

    def add(self, entry: Conn) -> None:
        with self._lock:
            mine = self._by_address.setdefault(entry.peer, [])
            if len(mine) >= MAX_PENDING_PER_ADDRESS:
                mine.pop(0).shut()
            elif sum(len(v) for v in self._by_address.values()) >= MAX_PENDING:
                self._pop_oldest_of_greediest().shut()
            mine.append(entry)

    def _pop_oldest_of_greediest(self) -> Conn:
        greediest = max(self._by_address.values(), key=len)
        return greediest.pop(0)

    def remove(self, entry: Conn) -> None:
        with self._lock:
            mine = self._by_address.get(entry.peer)
            if mine is not None and entry in mine:
                mine.remove(entry)
                if not mine:
                    del self._by_address[entry.peer]

    def evict_one(self) -> None:
        """Close the oldest connection of the address that holds the most (out of descriptors:
        make room)."""
        with self._lock:
            if any(self._by_address.values()):
                self._pop_oldest_of_greediest().shut()

    def close_all(self) -> None:
        with self._lock:
            for entries in self._by_address.values():
                for entry in entries:
                    entry.shut()
            self._by_address.clear()


@dataclass
class Test:
    kind: str  # "sink" (count what arrives) or "source" (send)
    streams: int
    seconds: float = 0.0
    counter: Counter = field(default_factory=Counter)
    sent: int = 0
    connected: int = 0
    finished: int = 0
    start: float | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)


@dataclass(eq=False)
class Session:
    token: str
    peer: str
    started: float
    addresses: set[str]  # where this session's connections came from
    tests: dict[str, Test] = field(default_factory=dict)
    processes: list[tools.Process] = field(default_factory=list)
    tool_runs: int = 0
    control: socket.socket | None = None
    expired: bool = False  # ended for its time
    conns: set[Conn] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def adopt(self, entry: Conn, pending: Pending) -> bool:
        """``entry`` proved to be of this session: it leaves the pending ones; False (to be
        closed) when the session holds its most connections already."""
        pending.remove(entry)
        with self.lock:
            if len(self.conns) >= MAX_SESSION_CONNECTIONS:
                return False
            self.conns.add(entry)
            return True

    def forget(self, entry: Conn) -> None:
        with self.lock:
            self.conns.discard(entry)

    def reap(self, now: float) -> None:
        """Kill the tools past their time; reap (and forget) every tool that ended."""
        with self.lock:
            keep = []
            for process in self.processes:
                if process.overdue(now) or not process.alive():
                    process.kill()
                else:
                    keep.append(process)
            self.processes = keep

    def over(self, now: float) -> bool:
        return now - self.started > SESSION_SECONDS

    def close_control(self) -> None:
        """End the session for its time: its control connection is shut down."""
        self.expired = True
        if self.control is not None:
            with contextlib.suppress(OSError):
                self.control.shutdown(socket.SHUT_RDWR)

    def end(self) -> None:
        """Kill and reap its tools, close its connections, drop its tests."""
        with self.lock:
            for process in self.processes:
                process.kill()
            self.processes = []
            for entry in self.conns:
                entry.shut()
            self.tests.clear()
