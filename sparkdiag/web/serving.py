"""An HTTP/1.1 server on asyncio that holds under bursts, idle sockets and hostile clients.

Requests are parsed by h11 (python-hyper's sans-I/O HTTP/1.1 state machine: request-line and
header grammar, ``Host`` required in HTTP/1.1, conflicting ``Content-Length`` refused,
pipelining); this module owns the sockets, the limits and TLS. Why h11 and not the previous
hand-written parser or aiohttp's server: ``docs/web.md`` (measured side by side).

One event loop owns every socket: it accepts, runs TLS handshakes through ``ssl.SSLObject`` on
memory buffers (so a connection holds no TLS state until its first byte arrives, and no buffer
larger than one read of ``READ_CHUNK`` bytes), reads requests and writes responses. Only the
handler's work (rendering, bcrypt) runs in threads, so threads do not grow with connections.

Limits (:class:`Limits`, defaults from ``config.OPTIONS``):

* ``timeout`` bounds each step of a connection: the TLS handshake, receiving a whole request head
  (a client trickling bytes gets no more time than a silent one), waiting idle for the next
  request on a kept-alive connection, and writing each response.
* ``max_connections`` caps open connections, lowered to what the open-files limit leaves
  (:func:`connection_cap`). At the cap a new connection first evicts the connection that has
  waited longest without a request in progress (idle, sending its request head, or in its TLS
  handshake); only when every connection is busy is the new one refused: a plain-HTTP client
  gets ``503`` at once, a TLS client is closed.
* out of file descriptors anyway (``EMFILE``: probe workers, NVML), accepting pauses with a
  growing delay (5 ms to 1 s, as Go's ``net/http`` does) and one idle connection is evicted to
  make room; one warning per episode.

Request heads are at most ``MAX_HEAD`` bytes, ``MAX_HEADERS`` header lines and ``MAX_LINE``
bytes per header value, values without control characters; bodies (none is needed) up to
``MAX_BODY`` bytes are read and dropped, chunked bodies refused. A malformed request gets a
4xx/5xx answer and the connection is closed; nothing a client sends logs more than a debug line.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import http
import ipaddress
import logging
import os
import resource
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any, Protocol
from urllib.parse import urlsplit

import h11

from sparkdiag.config import DEFAULTS

log = logging.getLogger(__name__)

MAX_HEAD = 16384  # the request line and every header line together
MAX_LINE = 8192  # one header value
MAX_HEADERS = 100
MAX_BODY = 65536  # a request body is read and discarded up to this size
READ_CHUNK = 16384  # bytes read from a socket at once (one TLS record at most)
REFUSE_LINGER = 1.0  # seconds a refused connection is read (and discarded) before closing
RESERVED_FDS = 64  # file descriptors kept for the rest of the daemon (NVML, store, workers)
ACCEPT_PAUSE = (0.005, 1.0)  # first and longest pause of accepting while out of descriptors
_OUT_OF_FDS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_TLS_HANDSHAKE = 0x16  # first byte of a TLS record carrying a ClientHello


@dataclass(frozen=True)
class Limits:
    timeout: float = DEFAULTS["web_read_timeout"]
    max_connections: int = DEFAULTS["web_max_connections"]
    backlog: int = 1024


@dataclass(frozen=True)
class Tls:
    """What a new TLS connection is served with: the context and, where the web config lists
    ``client_allowed_sans``, the subject alternative names of which the client's certificate
    must carry one."""

    context: ssl.SSLContext
    allowed_sans: frozenset[str] | None = None


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    version: str  # "HTTP/1.0" or "HTTP/1.1"
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    peer: str

    @property
    def path(self) -> str:
        target = self.target
        if target[:7].lower() == "http://" or target[:8].lower() == "https://":
            target = urlsplit(target).path or "/"  # absolute-form (RFC 9112 3.2.2)
        return target.split("?", 1)[0]


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False  # close the connection after this response


def text(
    status: int, message: str, *, headers: tuple[tuple[str, str], ...] = (), close: bool = False
) -> Response:
    """A plain-text response with one line of text."""
    return Response(status, (message + "\n").encode(), headers=headers, close=close)


Handler = Callable[[Request], Awaitable[Response]]
TlsProvider = Callable[[], Tls | None]  # None: refuse new TLS connections for now


@dataclass
class Stats:
    """Counters of what the limits did, for tests and debugging."""

    accepted: int = 0
    evicted: int = 0  # closed to make room for a new connection
    refused: int = 0  # new connections turned away at the cap
    timed_out: int = 0  # closed by the timeout (handshake, request, idle or write)
    out_of_fds: int = 0  # accept() failures for want of file descriptors
    fd_episodes: int = 0  # runs of such failures, each logged once
    tls_started: int = 0  # connections that sent a ClientHello (and so got TLS state)


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    peer: str
    task: asyncio.Task[None] | None = None
    waiting: bool = True  # no request in progress: idle, reading a head or in the handshake
    since: float = field(default_factory=time.monotonic)
    partial: bool = False  # some bytes of the next request have arrived

    def wait(self) -> None:
        self.waiting, self.since, self.partial = True, time.monotonic(), False

    def busy(self) -> None:
        self.waiting = False


class _Closed(Exception):
    """The client went away or broke the protocol; close without an answer."""


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
    need = wanted + in_use + RESERVED_FDS
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(hard, need)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted, None
    cap = max(1, soft - in_use - RESERVED_FDS)
    return cap, (
        f"web.max-connections {wanted} lowered to {cap}: the open-files limit is {soft} "
        f"(hard {hard}) and {in_use + RESERVED_FDS} are kept for the rest of the daemon; "
        "raise LimitNOFILE= to serve more"
    )


class _Channel(Protocol):
    async def recv(self) -> bytes: ...
    async def send(self, data: bytes) -> None: ...


class _Plain:
    def __init__(self, sock: socket.socket, pending: bytes = b"") -> None:
        self.sock = sock
        self.pending = pending
        self.loop = asyncio.get_running_loop()

    async def recv(self) -> bytes:
        if self.pending:
            data, self.pending = self.pending, b""
            return data
        return await self.loop.sock_recv(self.sock, READ_CHUNK)

    async def send(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)


class _Tls:
    """TLS over a non-blocking socket through memory buffers; nothing is read ahead."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=True)

    async def handshake(self, first: bytes) -> None:
        self.incoming.write(first)
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                data = await self.loop.sock_recv(self.sock, READ_CHUNK)
                if not data:
                    raise _Closed("closed during the TLS handshake") from None
                self.incoming.write(data)
            except ssl.SSLError:
                with contextlib.suppress(OSError):
                    await self._flush()  # the alert that says why, as far as it goes
                raise
        await self._flush()

    async def recv(self) -> bytes:
        while True:
            try:
                data = self.obj.read(READ_CHUNK)
            except ssl.SSLWantReadError:
                await self._flush()
                raw = await self.loop.sock_recv(self.sock, READ_CHUNK)
                if not raw:
                    return b""
                self.incoming.write(raw)
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
            if self.outgoing.pending:
                await self._flush()
            return data

    async def send(self, data: bytes) -> None:
        self.obj.write(data)
        await self._flush()

    async def _flush(self) -> None:
        out = self.outgoing.read()
        if out:
            await self.loop.sock_sendall(self.sock, out)


class HttpServer:
    """Serve ``handler`` on an already bound, listening socket until ``stop`` is set; TLS when
    ``tls`` is given (asked for each new connection, so a reloaded certificate applies)."""

    def __init__(
        self,
        sock: socket.socket,
        handler: Handler,
        limits: Limits,
        tls: TlsProvider | None = None,
        server_name: str = "",
    ) -> None:
        self.sock = sock
        self.handler = handler
        self.tls = tls
        self.server_name = server_name
        cap, why = connection_cap(limits.max_connections)
        if why:
            log.warning("%s", why)
        self.limits = Limits(limits.timeout, cap, limits.backlog)
        self.connections: set[_Connection] = set()
        self.refusing = 0
        self.stats = Stats()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pause = 0.0  # current accept pause; 0 while accepting normally
        self._date = (0, "")

    async def serve(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        self.sock.setblocking(False)
        self._loop = loop
        loop.add_reader(self.sock.fileno(), self._accept_ready)
        try:
            await stop.wait()
        finally:
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(self.sock.fileno())
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=2)

    # -- accepting -----------------------------------------------------------------------------

    def _accept_ready(self) -> None:
        for _ in range(self.limits.backlog):
            try:
                client, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_FDS:
                    self._out_of_fds(exc)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # that client is gone already
                log.warning("accept failed: %s", exc.strerror or exc)
                return
            if self._pause:
                log.debug("accepting again (%d accept failures so far)", self.stats.out_of_fds)
                self._pause = 0.0
            self._accepted(client)

    def _out_of_fds(self, exc: OSError) -> None:
        self.stats.out_of_fds += 1
        if not self._pause:
            self.stats.fd_episodes += 1
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            log.warning(
                "out of file descriptors (%s; open-files limit %s, %d HTTP connections open): "
                "accepting paused and retried, the longest-idle connection closed to make room",
                exc.strerror or exc,
                soft,
                len(self.connections),
            )
        self._evict_one()
        self._pause = min(ACCEPT_PAUSE[1], max(ACCEPT_PAUSE[0], self._pause * 2))
        loop = self._loop
        loop.remove_reader(self.sock.fileno())
        loop.call_later(self._pause, self._resume_accepting)

    def _resume_accepting(self) -> None:
        with contextlib.suppress(ValueError, OSError):  # closed at shutdown meanwhile
            self._loop.add_reader(self.sock.fileno(), self._accept_ready)

    def _accepted(self, client: socket.socket) -> None:
        self.stats.accepted += 1
        client.setblocking(False)
        with contextlib.suppress(OSError):
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = _peer(client)
        if len(self.connections) >= self.limits.max_connections and not self._evict_one():
            self._spawn(self._refuse(client), client)
            return
        conn = _Connection(client, peer)
        self.connections.add(conn)
        conn.task = self._spawn(self._client(conn), client, conn)

    def _spawn(
        self,
        work: Coroutine[Any, Any, None],
        sock: socket.socket,
        conn: _Connection | None = None,
    ) -> asyncio.Task[None]:
        """Run ``work`` for ``sock``; the socket is closed when it ends, however it ends (a task
        cancelled before it started never runs its own ``finally``)."""
        task = self._loop.create_task(work)
        self._tasks.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._tasks.discard(finished)
            if conn is not None:
                self.connections.discard(conn)
            sock.close()

        task.add_done_callback(done)
        return task

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest without a request; False if none."""
        idle = [c for c in self.connections if c.waiting]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.since)
        self.connections.discard(victim)
        if victim.task is not None:
            victim.task.cancel()
        self.stats.evicted += 1
        return True

    async def _refuse(self, sock: socket.socket) -> None:
        """Every connection is busy: 503 for plain HTTP (TLS: close), without a thread."""
        self.stats.refused += 1
        if self.tls is not None or self.refusing >= self.limits.max_connections:
            sock.close()
            return
        self.refusing += 1
        try:
            await self._answer_and_close(
                sock, _Plain(sock), 503, "too many open connections", (("Retry-After", "1"),)
            )
        finally:
            self.refusing -= 1

    # -- one connection ------------------------------------------------------------------------

    async def _client(self, conn: _Connection) -> None:
        sock = conn.sock
        try:
            channel = await self._open(conn)
            if channel is not None:
                await self._converse(conn, channel)
        except TimeoutError:
            self.stats.timed_out += 1
            log.debug("%s: timed out after %g s", conn.peer, self.limits.timeout)
        except asyncio.CancelledError:
            log.debug("%s: closed (evicted or shutting down)", conn.peer)
        except (_Closed, OSError, ssl.SSLError, h11.ProtocolError) as exc:
            log.debug("%s: closed: %s", conn.peer, exc or type(exc).__name__)
        except Exception as exc:  # a bug here, not the client's doing: one line, then details
            log.error("%s: internal error (%s: %s); connection closed", conn.peer,
                      type(exc).__name__, exc)  # fmt: skip
            log.debug("internal error", exc_info=True)
        finally:
            self.connections.discard(conn)
            sock.close()

    async def _open(self, conn: _Connection) -> _Channel | None:
        """The connection's channel once its first bytes are in (TLS: after the handshake);
        None when it was answered or closed already."""
        loop = asyncio.get_running_loop()
        timeout = self.limits.timeout
        if self.tls is None:
            return _Plain(conn.sock)
        async with asyncio.timeout(timeout):
            first = await loop.sock_recv(conn.sock, READ_CHUNK)
            if not first:
                return None
            conn.partial = True
            if first[0] != _TLS_HANDSHAKE:
                if first[:1].isalpha():  # plain HTTP on the TLS port: say so, as Go does
                    await self._answer_and_close(
                        conn.sock, _Plain(conn.sock), 400,
                        "this port speaks HTTPS: send the request with https://",
                    )  # fmt: skip
                return None
            tls = self.tls()
            if tls is None:  # the web config changed into an unusable one: refused until fixed
                return None
            channel = _Tls(conn.sock, tls.context)
            self.stats.tls_started += 1
            await channel.handshake(first)
        if tls.allowed_sans is not None and not _san_allowed(channel.obj, tls.allowed_sans):
            log.debug("%s: client certificate carries none of client_allowed_sans", conn.peer)
            return None
        return channel

    async def _converse(self, conn: _Connection, channel: _Channel) -> None:
        timeout = self.limits.timeout
        parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        while True:
            conn.wait()
            try:
                async with asyncio.timeout(timeout):
                    request = await self._read_request(parser, channel, conn)
            except TimeoutError:
                if conn.partial:  # a partial request: say why before closing
                    self.stats.timed_out += 1
                    await self._answer_and_close(conn.sock, channel, 408, "request timed out")
                    return
                raise
            if request is None:
                return
            conn.busy()
            if isinstance(request, Response):  # a request that cannot be served
                await self._answer_and_close(
                    conn.sock, channel, request.status, request.body.decode().strip()
                )
                return
            response = await self.handler(request)
            data, keep = self._encode(parser, request, response)
            async with asyncio.timeout(timeout):
                await channel.send(data)
            log.debug("%s %s %s %d", conn.peer, request.method, request.target[:200],
                      response.status)  # fmt: skip
            if not keep:
                return
            parser.start_next_cycle()

    async def _read_request(
        self, parser: h11.Connection, channel: _Channel, conn: _Connection
    ) -> Request | Response | None:
        """One request (its body read and dropped); None at a clean end of the connection, a
        :class:`Response` for a request that must be refused (the connection then closes)."""
        head: h11.Request | None = None
        first_line: bytes | None = b""  # until its end is seen
        received = 0
        body = 0
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as exc:
                if parser.their_state is h11.ERROR and not conn.partial:
                    return None
                return text(exc.error_status_hint, f"bad request: {exc}"[:200], close=True)
            if event is h11.NEED_DATA:
                data = await channel.recv()
                if not data and not conn.partial:
                    return None
                if not data and head is None:
                    raise _Closed("end of stream inside the request head")
                conn.partial = True
                if head is None:
                    if first_line is not None and len(first_line) < MAX_LINE:
                        first_line += data[: MAX_LINE - len(first_line)]
                        if b"\n" in first_line:
                            if len(first_line.split(b"\n", 1)[0].split()) == 2:
                                # h11 would wait for a blank line that HTTP/0.9 never sends
                                return text(400, "HTTP/0.9 is not supported", close=True)
                            first_line = None
                    received += len(data)
                    if received > MAX_HEAD + READ_CHUNK:
                        return text(431, "request head too large", close=True)
                parser.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                head = event
                problem = _problem(event)
                if problem is not None:
                    return problem
            elif isinstance(event, h11.Data):
                body += len(event.data)
                if body > MAX_BODY:
                    return text(413, "request body too large", close=True)
            elif isinstance(event, h11.EndOfMessage) and head is not None:
                return Request(
                    head.method.decode("ascii"),
                    head.target.decode("ascii", "replace"),
                    "HTTP/" + head.http_version.decode("ascii"),
                    _headers(head),
                    conn.peer,
                )
            else:  # PAUSED cannot happen before the response; anything else: give up
                raise _Closed(f"unexpected parser event {event!r}")

    def _encode(
        self, parser: h11.Connection, request: Request, response: Response
    ) -> tuple[bytes, bool]:
        """The response's bytes, and whether the connection stays open after it."""
        headers = [
            ("Server", self.server_name),
            ("Date", self._now()),
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            *response.headers,
        ]
        if response.close:
            headers.append(("Connection", "close"))
        reason = _phrase(response.status)
        out = parser.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
        if request.method != "HEAD" and response.body:
            out += parser.send(h11.Data(data=response.body))
        out += parser.send(h11.EndOfMessage())
        keep = parser.our_state is h11.DONE and parser.their_state is h11.DONE
        return out or b"", keep

    async def _answer_and_close(
        self,
        sock: socket.socket,
        channel: _Channel,
        status: int,
        message: str,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Send one answer outside the parser's state (errors, refusals), then close after
        reading what the client still sends for a moment, so that closing does not reset the
        connection and lose the answer."""
        lines = [
            f"HTTP/1.1 {status} {_phrase(status)}",
            f"Server: {self.server_name}",
            f"Date: {self._now()}",
            "Content-Type: text/plain; charset=utf-8",
            f"Content-Length: {len(message) + 1}",
            *(f"{name}: {value}" for name, value in headers),
            "Connection: close",
        ]
        data = ("\r\n".join(lines) + "\r\n\r\n" + message + "\n").encode("latin-1", "replace")
        with contextlib.suppress(TimeoutError, OSError, ssl.SSLError):
            async with asyncio.timeout(self.limits.timeout):
                await channel.send(data)
            if isinstance(channel, _Plain):
                sock.shutdown(socket.SHUT_WR)
            async with asyncio.timeout(REFUSE_LINGER):
                while await channel.recv():
                    pass
        sock.close()

    def _now(self) -> str:
        second = int(time.time())
        if self._date[0] != second:
            self._date = (second, formatdate(second, usegmt=True))
        return self._date[1]


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def _problem(event: h11.Request) -> Response | None:
    """Why a parsed request head is refused (h11 checked the grammar), or None."""
    if event.http_version not in (b"1.0", b"1.1"):
        return text(505, "only HTTP/1.0 and HTTP/1.1 are supported", close=True)
    if len(event.headers) > MAX_HEADERS:
        return text(431, "too many header lines", close=True)
    for name, value in event.headers:
        if len(value) > MAX_LINE:
            return text(431, f"header line longer than {MAX_LINE} bytes", close=True)
        if any((byte < 0x20 and byte != 0x09) or byte == 0x7F for byte in value):
            return text(400, "control character in a header value", close=True)
        if name == b"transfer-encoding":
            return text(501, "request bodies are not supported", close=True)
        if name == b"content-length" and int(value) > MAX_BODY:
            return text(413, "request body too large", close=True)
    return None


def _headers(event: h11.Request) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in event.headers:
        name, value = raw_name.decode("ascii"), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _san_allowed(obj: ssl.SSLObject, allowed: frozenset[str]) -> bool:
    """Whether the verified client certificate names one of ``allowed`` among its DNS names,
    e-mail addresses, IP addresses or URIs (exporter-toolkit's rule)."""
    cert = obj.getpeercert()
    if not cert:
        return False
    for entry in cert.get("subjectAltName", ()):
        kind, value = str(entry[0]), str(entry[1])
        if kind == "IP Address":
            with contextlib.suppress(ValueError):
                value = str(ipaddress.ip_address(value.strip()))
        if value in allowed:
            return True
    return False


def _peer(sock: socket.socket) -> str:
    try:
        peer = sock.getpeername()
    except OSError:
        return "?"
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
