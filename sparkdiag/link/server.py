"""``sparkdiag link serve``: the listening side. It answers one measuring session at a time
(see :mod:`sparkdiag.link.wire`), counts what arrives on data connections, sends for as long as
it is asked to (at most :data:`~sparkdiag.link.wire.MAX_SECONDS`, on at most
:data:`~sparkdiag.link.wire.MAX_STREAMS` connections, only back on the connection that asked),
and starts ``iperf3 -s -1`` or ``ib_write_bw`` when asked and installed. It runs ``ib_write_bw``
as a client only toward an address the session's own connections came from.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkdiag import __version__
from sparkdiag.errors import SparkdiagError
from sparkdiag.jsonvalues import as_float, as_int, as_str
from sparkdiag.link import tools
from sparkdiag.link.ends import describe
from sparkdiag.link.lint import lint
from sparkdiag.link.readings import read_fabric
from sparkdiag.link.streams import Counter, receive, send_until
from sparkdiag.link.wire import (
    HELLO_TIMEOUT,
    MAX_SECONDS,
    MAX_STREAMS,
    LineReader,
    ProtocolError,
    encode,
    is_hello,
    send,
)
from sparkdiag.sources.netif import interface_addresses, interface_of, plain_address

log = logging.getLogger(__name__)

CONTROL_IDLE = 120.0  # seconds a session may stay silent
MAX_CONNECTIONS = 2 * MAX_STREAMS + 8


@dataclass
class _Test:
    kind: str  # "sink" (count what arrives) or "source" (send)
    streams: int
    seconds: float = 0.0
    counter: Counter = field(default_factory=Counter)
    sent: int = 0
    connected: int = 0
    finished: int = 0
    start: float | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)


@dataclass
class _Session:
    token: str
    peer: str
    started: float
    tests: dict[str, _Test] = field(default_factory=dict)
    addresses: set[str] = field(default_factory=set)  # where this session's connections came from
    processes: list[tools.Process] = field(default_factory=list)


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; "" listens on every address (IPv6 and IPv4 where
    the kernel has both). Raises SparkdiagError (exit 3) when the port cannot be had."""
    try:
        if host:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, _, _, _, address = info[0]
        else:
            family, address = socket.AF_INET6, ("::", port)
            if not socket.has_ipv6:
                family, address = socket.AF_INET, ("0.0.0.0", port)
        sock = socket.socket(family, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise SparkdiagError(
            f"cannot listen on {host}:{port}: {exc.strerror}", flag="--listen"
        ) from None
    except OSError:  # no IPv6 in this kernel
        family, address = socket.AF_INET, ("0.0.0.0", port)
        sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and not host:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(MAX_CONNECTIONS)
    except OSError as exc:
        sock.close()
        raise SparkdiagError(
            f"cannot listen on {host or '*'}:{port}: {exc.strerror or exc}", flag="--listen"
        ) from None
    return sock


class LinkServer:
    """The listening side. ``serve(stop)`` accepts until ``stop`` is set (or, with ``once``,
    until one session has ended); ``say`` receives one line per session for the terminal."""

    def __init__(
        self,
        sock: socket.socket,
        sysfs: Path,
        rootfs: Path,
        environ: Mapping[str, str],
        say: Callable[[str], None] = lambda line: None,
        once: bool = False,
    ) -> None:
        self.sock = sock
        self.sysfs = sysfs
        self.rootfs = rootfs
        self.environ = environ
        self.say = say
        self.once = once
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self._sessions_done = 0
        self._open = 0

    @property
    def busy(self) -> bool:
        """A measuring session is under way."""
        return self._session is not None

    @property
    def port(self) -> int:
        port: int = self.sock.getsockname()[1]
        return port

    def serve(self, stop: threading.Event) -> None:
        self.sock.settimeout(0.2)
        while not stop.is_set():
            if self.once and self._sessions_done:
                return
            try:
                conn, peer = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if stop.is_set():
                    return
                raise
            with self._lock:
                if self._open >= MAX_CONNECTIONS:
                    conn.close()
                    continue
                self._open += 1
            args = (conn, plain_address(peer[0]))
            threading.Thread(target=self._handle, args=args, daemon=True).start()

    def close(self) -> None:
        with self._lock:
            session = self._session
        if session is not None:
            for process in session.processes:
                process.kill()
        self.sock.close()

    # -- one connection --------------------------------------------------------------------

    def _handle(self, conn: socket.socket, peer: str) -> None:
        try:
            with conn:
                reader = LineReader(conn)
                try:
                    opening = reader.read(HELLO_TIMEOUT)
                except (ProtocolError, TimeoutError, ConnectionError, OSError):
                    return
                if not is_hello(opening):
                    return
                kind = opening.get("kind")
                if kind == "control":
                    self._control(conn, reader, peer)
                elif kind == "ping":
                    self._ping(conn, reader, opening, peer)
                elif kind == "data":
                    self._data(conn, reader, opening, peer)
        except Exception:  # a bug must not take the listener down
            log.debug("connection from %s failed", peer, exc_info=True)
        finally:
            with self._lock:
                self._open -= 1

    def _session_for(self, message: Mapping[str, Any], peer: str) -> _Session | None:
        with self._lock:
            session = self._session
        if session is None or not secrets.compare_digest(
            str(message.get("session", "")), session.token
        ):
            return None
        session.addresses.add(peer)
        return session

    def _control(self, conn: socket.socket, reader: LineReader, peer: str) -> None:
        with self._lock:
            busy = self._session
            if busy is None:
                session = _Session(secrets.token_hex(16), peer, time.monotonic(), addresses={peer})
                self._session = session
        if busy is not None:
            send(conn, {"sparkdiag-link": 1, "error": f"busy: a test from {busy.peer} is running"})
            return
        self.say(f"session from {peer}: started")
        try:
            send(conn, self._hello(session, conn))
            while True:
                try:
                    request = reader.read(CONTROL_IDLE)
                except (TimeoutError, ConnectionError, ProtocolError, OSError):
                    return
                if request.get("op") == "bye":
                    send(conn, {"ok": True})
                    return
                send(conn, self._request(session, request))
        finally:
            for process in session.processes:
                process.kill()
            with self._lock:
                self._session = None
                self._sessions_done += 1
            self.say(f"session from {peer}: ended after {time.monotonic() - session.started:.1f} s")

    def _hello(self, session: _Session, conn: socket.socket) -> dict[str, Any]:
        readings = read_fabric(self.sysfs, self.rootfs, self.environ)
        addresses = interface_addresses()
        arrived = interface_of(conn.getsockname()[0], addresses)
        names = [i.name for f in readings.functions for i in f.interfaces]
        if arrived is not None:
            names.append(arrived)
        return {
            "sparkdiag-link": 1,
            "session": session.token,
            "host": socket.gethostname(),
            "version": __version__,
            "arrived_on": arrived,
            "interfaces": describe(names, readings, self.sysfs, addresses),
            "tools": tools.installed(),
            "lint": [finding.as_json() for finding in lint(readings)],
        }

    def _request(self, session: _Session, request: Mapping[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        test_id = as_str(request.get("test"))
        if op in ("sink", "source"):
            streams = as_int(request.get("streams"))
            seconds = as_float(request.get("seconds")) or 0.0
            if test_id is None or len(test_id) > 32 or streams is None:
                return {"error": "a test needs a short 'test' id and 'streams'"}
            if not 1 <= streams <= MAX_STREAMS or not 0 <= seconds <= MAX_SECONDS:
                return {"error": f"at most {MAX_STREAMS} streams and {MAX_SECONDS:g} s"}
            if op == "source" and seconds <= 0:
                return {"error": "a source needs 'seconds'"}
            session.tests[test_id] = _Test(op, streams, seconds)
            return {"ok": True}
        if op == "result":
            test = session.tests.pop(test_id or "", None)
            if test is None:
                return {"error": "no such test"}
            with test.cond:
                test.cond.wait_for(lambda: test.finished >= test.streams, timeout=15.0)
            return {
                "bytes": test.counter.bytes if test.kind == "sink" else test.sent,
                "seconds": test.counter.seconds,
                "connected": test.connected,
                "finished": test.finished,
            }
        if op == "tool":
            return self._tool(session, request)
        return {"error": f"unknown op {op!r}"}

    def _tool(self, session: _Session, request: Mapping[str, Any]) -> dict[str, Any]:
        tool = request.get("tool")
        if tool not in tools.TOOLS or not tools.installed()[str(tool)]:
            return {"error": f"{tool} is not installed on {socket.gethostname()}"}
        seconds = min(as_float(request.get("seconds")) or 3.0, MAX_SECONDS)
        if tool == tools.IPERF3:
            address = as_str(request.get("address")) or ""
            if address not in {a.address for a in interface_addresses()}:
                return {"error": f"{address!r} is not an address of {socket.gethostname()}"}
            port = tools.free_port(address)
            process = tools.Process(tools.iperf3_server(address, port))
            session.processes.append(process)
            if not process.wait_listening(address, port, 5.0):
                return {"error": "iperf3 -s did not start: " + process.finish(1.0).output[-200:]}
            return {"port": port}
        device = as_str(request.get("device")) or ""
        if device not in read_fabric(self.sysfs, self.rootfs, self.environ).rdma_devices():
            return {"error": f"{device!r} is not an RDMA device of {socket.gethostname()}"}
        if request.get("role") == "client":
            address = as_str(request.get("address")) or ""
            target = as_int(request.get("port"))
            if address not in session.addresses or target is None:
                return {"error": "ib_write_bw runs as a client only toward this session's peer"}
            run = tools.run(tools.ib_write_bw(device, target, seconds, address), seconds + 20)
            return {"gbps": tools.parse_ib_write_bw(run.output), "returncode": run.returncode}
        port = tools.free_port("0.0.0.0")
        process = tools.Process(tools.ib_write_bw(device, port, seconds))
        session.processes.append(process)
        if not process.wait_listening("0.0.0.0", port, 5.0):
            return {"error": "ib_write_bw did not start: " + process.finish(1.0).output[-200:]}
        return {"port": port}

    def _ping(
        self, conn: socket.socket, reader: LineReader, opening: Mapping[str, Any], peer: str
    ) -> None:
        session = self._session_for(opening, peer)
        if session is None:
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(encode({"sparkdiag-link": 1, "session": session.token}))
        if reader.rest:
            conn.sendall(reader.rest)
        conn.settimeout(30.0)
        with contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)

    def _data(
        self, conn: socket.socket, reader: LineReader, opening: Mapping[str, Any], peer: str
    ) -> None:
        session = self._session_for(opening, peer)
        test = session.tests.get(as_str(opening.get("test")) or "") if session else None
        if test is None:
            return
        with test.cond:
            test.connected += 1
            if test.connected > test.streams:
                return
            if test.connected == test.streams:
                test.start = time.monotonic()
            test.cond.notify_all()
        try:
            if test.kind == "sink":
                receive(conn, test.counter, reader.rest, idle=30.0)
            else:
                with test.cond:
                    test.cond.wait_for(lambda: test.start is not None, timeout=10.0)
                if test.start is not None:
                    sent = send_until(conn, test.start + test.seconds)
                    with test.cond:
                        test.sent += sent
                    with contextlib.suppress(OSError):  # wait for the other side to close
                        conn.settimeout(10.0)
                        conn.recv(1)
        finally:
            with test.cond:
                test.finished += 1
                test.cond.notify_all()
