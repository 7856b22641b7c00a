"""``sparkdiag link serve``: the listening side. It answers one measuring session at a time
(see :mod:`sparkdiag.link.wire`), opened only by a machine that proves it holds the same link
secret (:mod:`sparkdiag.link.auth`), and before that proof it says nothing but a challenge (or,
to the opening of another protocol, that both sides must run the same sparkdiag): no host name,
interface, address, tool or lint finding. Then it counts what arrives on data
connections, sends for as long as it is asked to (at most :data:`~sparkdiag.link.wire.MAX_SECONDS`,
on at most :data:`~sparkdiag.link.wire.MAX_STREAMS` connections, only back on the connection that
asked), and starts ``iperf3 -s -1`` or ``ib_write_bw`` when asked and installed. It runs
``ib_write_bw`` as a client only toward an address the session's own connections came from.

Everything a client can make it hold or spawn is bounded (:mod:`sparkdiag.link.bounds`):
connections that have not proved themselves yet (per address and in all), the session's
connections, tests set up at once, tools alive at once and in all, bytes echoed on a ping
connection, how long a data connection counts, how long a session may stay silent and last in
all. Tools past their time are killed and reaped. From its hello on, every control line it sends
carries a mac under the session key, and a request without the peer's ends the session
(:class:`~sparkdiag.link.wire.Sealed`). An ``accept`` that fails (out of file
descriptors, or anything else) pauses and goes on; it never ends the server.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sparkdiag import __version__
from sparkdiag.descriptors import ACCEPT_PAUSE, next_pause, out_of_fds
from sparkdiag.errors import SparkdiagError, UsageError
from sparkdiag.jsonvalues import as_float, as_int, as_str
from sparkdiag.link import auth, bounds, tools
from sparkdiag.link.bounds import (
    MAX_SESSION_CONNECTIONS,
    MAX_TESTS,
    MAX_TOOL_RUNS,
    MAX_TOOLS,
    PING_LIMIT,
    SINK_GRACE,
    TOOL_GRACE,
    Conn,
    Pending,
    Session,
    Test,
)
from sparkdiag.link.ends import describe
from sparkdiag.link.lint import lint
from sparkdiag.link.readings import CudaOnce, FabricReadings, read_fabric
from sparkdiag.link.streams import receive, send_until
from sparkdiag.link.wire import (
    HELLO_TIMEOUT,
    MAX_SECONDS,
    MAX_STREAMS,
    VERSION,
    LineReader,
    MacError,
    ProtocolError,
    Sealed,
    encode,
    is_hello,
    send,
)
from sparkdiag.sources.host.netif import (
    InterfaceAddress,
    interface_addresses,
    interface_of,
    plain_address,
)

log = logging.getLogger(__name__)

_BROKEN = (TimeoutError, ConnectionError, ProtocolError, OSError)
SAY_EVERY = 10.0  # seconds between two lines of one kind (refused, out of descriptors)


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; "" listens on every address (IPv6 and IPv4 where
    the kernel has both). Raises SparkdiagError (exit 3: cannot start) when the port cannot be
    had; in use or not allowed, it says so without blaming --listen's value. A host name that
    does not exist is --listen's usage error (exit 2; it was exit 3, as if the port were
    taken); one that cannot be looked up now (the resolver down) stays exit 3."""
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
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            raise UsageError(
                f"{host!r}: not an address of this machine, and no such host name "
                f"({exc.strerror}): give one of its addresses, or ':{port}' for every one",
                flag="--listen",
            ) from None
        raise SparkdiagError(
            f"cannot listen on {host}:{port}: the name cannot be looked up now ({exc.strerror})",
            flag="--listen",
        ) from None
    except UnicodeError:  # a label of more than 63 characters, an empty one
        raise UsageError(f"{host!r}: not a host name", flag="--listen") from None
    except OSError:  # no IPv6 in this kernel
        family, address = socket.AF_INET, ("0.0.0.0", port)
        sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and not host:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        where = f"[{host}]:{port}" if ":" in host else f"{host or '*'}:{port}"
        if exc.errno == errno.EADDRINUSE:  # as 'sparkdiag serve' says it: not a bad value
            raise SparkdiagError(
                f"cannot listen on {where}: the address is already in use (another 'sparkdiag "
                "link serve'? stop it, or choose another port with --listen)"
            ) from None
        if exc.errno == errno.EACCES:
            raise SparkdiagError(
                f"cannot listen on {where}: not allowed ({exc.strerror}; a port under 1024 "
                "needs root): choose another port with --listen"
            ) from None
        raise SparkdiagError(
            f"cannot listen on {where}: {exc.strerror or exc}", flag="--listen"
        ) from None
    return sock


def link_addresses(readings: FabricReadings, addresses: Sequence[InterfaceAddress]) -> list[str]:
    """The addresses of this machine's ConnectX-7 interfaces that a peer can reach: IPv4, and
    IPv6 that needs no scope (not fe80::/10)."""
    names = {i.name for f in readings.functions for i in f.interfaces}
    return [
        a.address
        for a in addresses
        if a.interface in names and (a.network.version == 4 or not a.network.ip.is_link_local)
    ]


class LinkServer:
    """The listening side on ``socks``. ``serve(stop)`` accepts until ``stop`` is set (or, with
    ``once``, until one session has ended); ``say`` receives one line per event worth a line on
    the terminal (a session, a refused secret, running out of file descriptors). ``secret`` is
    the secret itself, or a :class:`~sparkdiag.link.auth.LiveSecret` that follows its file
    (asked at each control connection's challenge, and in the accept loop, so that a changed
    file that cannot be used is said when it is written, not when the next peer comes)."""

    def __init__(
        self,
        socks: socket.socket | Sequence[socket.socket],
        sysfs: Path,
        rootfs: Path,
        environ: Mapping[str, str],
        secret: bytes | auth.LiveSecret,
        say: Callable[[str], None] = lambda line: None,
        once: bool = False,
        cuda: CudaOnce | None = None,
    ) -> None:
        self.socks = [socks] if isinstance(socks, socket.socket) else list(socks)
        self.sysfs = sysfs
        self.rootfs = rootfs
        self.environ = environ
        self._secret: Callable[[], bytes] = (
            secret.current if isinstance(secret, auth.LiveSecret) else lambda: secret
        )
        self.say = say
        self.once = once
        # the CUDA attributes, read once for every session (see CudaOnce): warmed up in the
        # background when serving starts, never asked between a peer's proof and the hello
        self.cuda = CudaOnce() if cuda is None else cuda
        self._lock = threading.Lock()
        self._session: Session | None = None
        self._sessions_done = 0
        self.pending = Pending()
        self.accept_failures = 0  # accept() calls that failed, for tests and the benchmark
        self._pause = 0.0
        self._told: dict[str, tuple[float, int]] = {}

    @property
    def busy(self) -> bool:
        """A measuring session is under way."""
        return self._session is not None

    @property
    def port(self) -> int:
        port: int = self.socks[0].getsockname()[1]
        return port

    def serve(self, stop: threading.Event) -> None:
        threading.Thread(target=self._warm_up, name="fabric", daemon=True).start()
        selector = selectors.DefaultSelector()
        for sock in self.socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        try:
            while not stop.is_set():
                if self.once and self._sessions_done:
                    return
                self._housekeeping()
                for key, _ in selector.select(0.2):
                    listener = key.fileobj
                    assert isinstance(listener, socket.socket)
                    self._accept(listener)
        finally:
            selector.close()

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, peer = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.accept_failures += 1
            if out_of_fds(exc):
                self._tell(
                    "fds",
                    f"out of file descriptors ({exc.strerror}): accepting paused and retried, "
                    "the oldest unproved connection closed to make room",
                )
                self.pending.evict_one()
                self._pause = next_pause(self._pause)
                time.sleep(self._pause)
            elif exc.errno not in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                log.warning("accept failed: %s", exc.strerror or exc)
                time.sleep(ACCEPT_PAUSE[0])
            return
        self._pause = 0.0
        conn.setblocking(True)
        entry = Conn(conn, plain_address(peer[0]))
        self.pending.add(entry)
        try:
            threading.Thread(target=self._handle, args=(entry,), daemon=True).start()
        except RuntimeError:  # no thread to be had: the connection goes
            self.pending.remove(entry)
            conn.close()

    def _warm_up(self) -> None:
        """The fabric read once before any peer comes, so that the CUDA attributes (read only
        where the fabric has a ConnectX-7, on the real root) are kept for the first hello."""
        with contextlib.suppress(Exception):  # said, if it still fails, in a session's hello
            read_fabric(self.sysfs, self.rootfs, self.environ, cuda=self.cuda)

    def _housekeeping(self) -> None:
        """Tools past their time killed (and every ended tool reaped); a session past its
        total time ended; the secret file looked at."""
        self._secret()
        with self._lock:
            session = self._session
        if session is None:
            return
        now = time.monotonic()
        session.reap(now)
        if session.over(now):
            session.close_control()

    def close(self) -> None:
        with self._lock:
            session = self._session
        if session is not None:
            session.end()
        self.pending.close_all()
        for sock in self.socks:
            sock.close()

    # -- one connection --------------------------------------------------------------------

    def _handle(self, entry: Conn) -> None:
        try:
            self._converse(entry)
        except Exception:  # a bug must not take the listener down
            log.debug("connection from %s failed", entry.peer, exc_info=True)
        finally:  # forgotten before it is closed, so that nobody shuts down a reused descriptor
            self.pending.remove(entry)
            with self._lock:
                session = self._session
            if session is not None:
                session.forget(entry)
            entry.sock.close()

    def _converse(self, entry: Conn) -> None:
        conn, peer = entry.sock, entry.peer
        reader = LineReader(conn)
        deadline = time.monotonic() + HELLO_TIMEOUT  # to open and, for control, to prove
        try:
            opening = reader.read(HELLO_TIMEOUT)
        except _BROKEN:
            return
        if not is_hello(opening):
            self._other_version(conn, peer, opening)
            return
        kind = opening.get("kind")
        if kind == "control":
            self._control(entry, reader, opening, deadline)
        elif kind in ("ping", "data"):
            session = self._session_for(opening, peer)
            if session is None or not session.adopt(entry, self.pending):
                return
            if kind == "ping":
                self._ping(conn, reader, session)
            else:
                self._data(conn, reader, opening, session)

    def _session_for(self, message: Mapping[str, Any], peer: str) -> Session | None:
        with self._lock:
            session = self._session
        token = message.get("session")
        if session is None or not isinstance(token, str):
            return None
        if not secrets.compare_digest(token.encode(), session.token.encode()):
            return None
        session.addresses.add(peer)
        return session

    def _other_version(self, conn: socket.socket, peer: str, opening: Mapping[str, Any]) -> None:
        """A control opening of another protocol, 2 or later (1 had no error line), gets one
        line that says both sides must run the same sparkdiag (nothing else: it proved
        nothing), and the terminal hears of it."""
        version = opening.get("sparkdiag-link")
        if opening.get("kind") != "control" or type(version) is not int or version < 2:
            return
        said = (
            f"it speaks sparkdiag-link protocol {version}, this link serve {VERSION}: both sides "
            "must run the same sparkdiag"
        )
        with contextlib.suppress(OSError):
            send(conn, {"sparkdiag-link": VERSION, "error": f"refused: {said}"})
        self._tell("version", f"{peer}: refused: {said} (update the older one)")

    def _refused(self, peer: str) -> None:
        self._tell("refused", f"{peer}: refused: it did not prove it holds the link secret")

    def _tell(self, kind: str, line: str) -> None:
        """``line``, unless a line of its ``kind`` was said less than :data:`SAY_EVERY` seconds
        ago (a flood must not flood the terminal or the log): then it is counted, and the
        next line of the kind says how many were left unsaid."""
        now = time.monotonic()
        with self._lock:
            said, unsaid = self._told.get(kind, (-SAY_EVERY, 0))
            if now - said < SAY_EVERY:
                self._told[kind] = (said, unsaid + 1)
                return
            self._told[kind] = (now, 0)
        self.say(line + (f" ({unsaid} more like it since the last such line)" if unsaid else ""))

    def _proved(
        self, conn: socket.socket, reader: LineReader, opening: Mapping[str, Any], deadline: float
    ) -> tuple[str, bytes] | None:
        """The challenge and response (:mod:`sparkdiag.link.auth`); the proof this side sends
        back and the session key, or None when the other side did not prove it holds the
        secret."""
        theirs = opening.get("nonce")
        if not auth.valid_nonce(theirs):
            return None
        assert isinstance(theirs, str)
        secret = self._secret()  # as the file holds it now: a rotated one from the next session
        mine = auth.nonce()
        send(conn, {"sparkdiag-link": VERSION, "challenge": mine})
        try:
            answer = reader.read(max(deadline - time.monotonic(), 0.01))
        except _BROKEN:
            return None
        if not auth.valid(secret, "client", mine, theirs, answer.get("proof")):
            send(
                conn,
                {
                    "sparkdiag-link": VERSION,
                    "error": "authentication failed: the link secrets of the two machines differ",
                },
            )
            return None
        return auth.proof(secret, "server", theirs, mine), auth.session_key(secret, mine, theirs)

    def _control(
        self, entry: Conn, reader: LineReader, opening: Mapping[str, Any], deadline: float
    ) -> None:
        conn, peer = entry.sock, entry.peer
        proved = self._proved(conn, reader, opening, deadline)
        if proved is None:
            self._refused(peer)
            return
        proof, key = proved
        channel = Sealed(conn, reader, key, "server")
        with self._lock:
            busy = self._session
            if busy is None:
                session = Session(secrets.token_hex(16), peer, time.monotonic(), {peer})
                self._session = session
        if busy is not None:
            channel.send(
                {
                    "sparkdiag-link": VERSION,
                    "proof": proof,
                    "error": f"busy: a test from {busy.peer} is running",
                }
            )
            return
        self.pending.remove(entry)
        session.control = conn
        self.say(f"session from {peer}: started")
        failed = ""
        try:
            channel.send({**self._hello(session, conn), "proof": proof})
            while True:
                try:
                    request = channel.read(bounds.CONTROL_IDLE)
                except MacError as exc:  # altered on the way: said to both sides, and ended
                    failed = f"; refused: {exc}"
                    with contextlib.suppress(OSError):
                        channel.send({"refused": str(exc)})
                    return
                except _BROKEN:
                    return
                if request.get("op") == "bye":
                    channel.send({"ok": True})
                    return
                channel.send(self._request(session, request))
        except Exception as exc:  # a proved session that breaks says why (out of descriptors)
            if not isinstance(exc, (TimeoutError, ConnectionError, ProtocolError)):
                failed = f"; it failed: {exc}"
            raise
        finally:
            session.end()
            with self._lock:
                self._session = None
                self._sessions_done += 1
            took = time.monotonic() - session.started
            why = " (its time was up)" if session.expired else ""
            self.say(f"session from {peer}: ended after {took:.1f} s{why}{failed}")

    def _hello(self, session: Session, conn: socket.socket) -> dict[str, Any]:
        readings = read_fabric(self.sysfs, self.rootfs, self.environ, cuda=self.cuda)
        addresses = interface_addresses()
        arrived = interface_of(conn.getsockname()[0], addresses)
        names = [i.name for f in readings.functions for i in f.interfaces]
        if arrived is not None:
            names.append(arrived)
        return {
            "sparkdiag-link": VERSION,
            "session": session.token,
            "host": socket.gethostname(),
            "version": __version__,
            "arrived_on": arrived,
            "interfaces": describe(names, readings, self.sysfs, addresses),
            "tools": tools.installed(),
            "lint": [finding.as_json() for finding in lint(readings)],
        }

    def _request(self, session: Session, request: Mapping[str, Any]) -> dict[str, Any]:
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
            if test_id not in session.tests and len(session.tests) >= MAX_TESTS:
                return {"error": f"at most {MAX_TESTS} tests at once: ask for a result first"}
            session.tests[test_id] = Test(op, streams, seconds)
            return {"ok": True}
        if op == "result":
            test = session.tests.pop(test_id or "", None)
            if test is None:
                return {"error": "no such test"}
            with test.cond:
                test.cond.wait_for(
                    lambda: test.finished >= test.streams, timeout=bounds.RESULT_WAIT
                )
            return {
                "bytes": test.counter.bytes if test.kind == "sink" else test.sent,
                "seconds": test.counter.seconds,
                "connected": test.connected,
                "finished": test.finished,
            }
        if op == "tool":
            return self._tool(session, request)
        return {"error": f"unknown op {str(op)[:40]!r}"}

    def _tool(self, session: Session, request: Mapping[str, Any]) -> dict[str, Any]:
        tool = request.get("tool")
        if tool not in tools.TOOLS or not tools.installed()[str(tool)]:
            return {"error": f"{str(tool)[:40]} is not installed on {socket.gethostname()}"}
        seconds = as_float(request.get("seconds")) or 3.0
        if not 0 < seconds <= MAX_SECONDS:
            return {"error": f"a tool runs for more than 0 and at most {MAX_SECONDS:g} s"}
        session.reap(time.monotonic())
        if session.tool_runs >= MAX_TOOL_RUNS:
            return {"error": f"at most {MAX_TOOL_RUNS} tool runs in one session"}
        if len(session.processes) >= MAX_TOOLS:
            return {"error": f"at most {MAX_TOOLS} tools at once: one started earlier still runs"}
        if tool == tools.IPERF3:
            address = as_str(request.get("address")) or ""
            if address not in {a.address for a in interface_addresses()}:
                return {"error": f"{address[:60]!r} is not an address of {socket.gethostname()}"}
            return self._start(session, address, tools.iperf3_server, seconds)
        device = as_str(request.get("device")) or ""
        fabric = read_fabric(self.sysfs, self.rootfs, self.environ, cuda=self.cuda)
        if device not in fabric.rdma_devices():
            return {"error": f"{device[:60]!r} is not an RDMA device of {socket.gethostname()}"}
        if request.get("role") == "client":
            address = as_str(request.get("address")) or ""
            target = as_int(request.get("port"))
            if address not in session.addresses or target is None or not 0 < target < 65536:
                return {"error": "ib_write_bw runs as a client only toward this session's peer"}
            session.tool_runs += 1
            try:
                run = tools.run(tools.ib_write_bw(device, target, seconds, address), seconds + 20)
            except OSError as exc:
                return {"error": f"ib_write_bw could not be started: {exc.strerror or exc}"}
            return {"gbps": tools.parse_ib_write_bw(run.output), "returncode": run.returncode}

        def server(address: str, port: int) -> list[str]:
            return tools.ib_write_bw(device, port, seconds)

        return self._start(session, "0.0.0.0", server, seconds)

    def _start(
        self,
        session: Session,
        address: str,
        argv: Callable[[str, int], list[str]],
        seconds: float,
    ) -> dict[str, Any]:
        """A tool's one-shot server on a free port of ``address``, killed if it is still there
        :data:`TOOL_GRACE` seconds after its measurement should have ended."""
        session.tool_runs += 1
        try:
            port = tools.free_port(address)
            process = tools.Process(argv(address, port), lifetime=seconds + TOOL_GRACE)
        except OSError as exc:
            return {"error": f"the tool could not be started: {exc.strerror or exc}"}
        session.processes.append(process)
        if not process.wait_listening(address, port, 5.0):
            output = process.finish(1.0).output[-200:]
            return {"error": f"{process.argv[0]} did not start: {output}"}
        return {"port": port}

    def _ping(self, conn: socket.socket, reader: LineReader, session: Session) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(encode({"sparkdiag-link": VERSION, "session": session.token}))
        echoed = len(reader.rest)
        if reader.rest:
            conn.sendall(reader.rest[:PING_LIMIT])
        conn.settimeout(30.0)
        with contextlib.suppress(OSError):
            while echoed < PING_LIMIT and (data := conn.recv(4096)):
                conn.sendall(data)
                echoed += len(data)

    def _data(
        self, conn: socket.socket, reader: LineReader, opening: Mapping[str, Any], session: Session
    ) -> None:
        test = session.tests.get(as_str(opening.get("test")) or "")
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
                until = time.monotonic() + (test.seconds or MAX_SECONDS) + SINK_GRACE
                receive(conn, test.counter, reader.rest, idle=30.0, until=until)
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


__all__ = ["MAX_SESSION_CONNECTIONS", "LinkServer", "link_addresses", "listen_socket"]
