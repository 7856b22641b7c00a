"""A small HTTP/1.1 server on asyncio that holds under bursts, idle sockets and hostile clients.

One event loop owns every socket: it accepts, runs TLS handshakes (non-blocking, so a client that
never finishes one cannot stall anyone else), reads requests and writes responses. Only the
handler's work (rendering, bcrypt) runs in threads, so threads do not grow with connections.

Limits (:class:`Limits`):

* ``timeout`` bounds each step of a connection: the TLS handshake, receiving a whole request head
  (a client trickling bytes gets no more time than a silent one), waiting idle for the next
  request on a kept-alive connection, and writing each response.
* ``max_connections`` caps open connections. At the cap, a new connection first evicts the
  connection that has waited longest without a request in progress (idle, or still sending its
  request head, or in its TLS handshake), so scrapes get through beside any number of idle
  sockets; only when every connection is busy is the new one refused: a plain-HTTP client gets
  ``503`` at once, a TLS client is closed.
* ``backlog`` is the listen queue, sized for bursts (the kernel caps it at
  ``net.core.somaxconn``).

Requests are HTTP/1.0 and HTTP/1.1 with heads of at most 16 KiB and 100 header lines; a request
body (none is needed) of at most 64 KiB is read and discarded; HTTP/0.9 request lines, chunked
bodies and malformed heads get a 4xx/5xx answer and the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate

log = logging.getLogger(__name__)

MAX_LINE = 8192  # one request or header line
MAX_HEAD = 16384  # the request line and every header line together
MAX_HEADERS = 100
MAX_BODY = 65536  # a request body is read and discarded up to this size
REFUSE_LINGER = 1.0  # seconds a refused connection is read (and discarded) before closing


@dataclass(frozen=True)
class Limits:
    timeout: float = 10.0  # seconds for each step: handshake, request head, idle wait, a write
    max_connections: int = 512
    backlog: int = 1024


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    version: str  # "HTTP/1.0" or "HTTP/1.1"
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    peer: str

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens


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


@dataclass
class Stats:
    """Counters of what the limits did, for tests and debugging."""

    accepted: int = 0
    evicted: int = 0  # closed to make room for a new connection
    refused: int = 0  # new connections turned away at the cap
    timed_out: int = 0  # closed by the timeout (handshake, request, idle or write)


@dataclass(eq=False)
class _Connection:
    writer: asyncio.StreamWriter
    waiting: bool = True  # no request in progress: idle, reading a head or in the handshake
    since: float = field(default_factory=time.monotonic)
    partial: bool = False  # some bytes of the next request have arrived

    def wait(self) -> None:
        self.waiting, self.since, self.partial = True, time.monotonic(), False

    def busy(self) -> None:
        self.waiting = False


class _Closed(Exception):
    """The client went away or broke the protocol; close without an answer."""


class _TooLong(Exception):
    """A request or header line longer than MAX_LINE."""


class HttpServer:
    """Serve ``handler`` on an already bound, listening socket until ``stop`` is set."""

    def __init__(
        self,
        sock: socket.socket,
        handler: Handler,
        limits: Limits,
        ssl_context: ssl.SSLContext | None = None,
        server_name: str = "",
    ) -> None:
        self.sock = sock
        self.handler = handler
        self.limits = limits
        self.ssl_context = ssl_context
        self.server_name = server_name
        self.connections: set[_Connection] = set()
        self.refusing = 0
        self.stats = Stats()
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, stop: asyncio.Event) -> None:
        server = await asyncio.start_server(
            self._client, sock=self.sock, backlog=self.limits.backlog, limit=MAX_LINE
        )
        try:
            await stop.wait()
        finally:
            server.close()
            for conn in list(self.connections):
                conn.writer.transport.abort()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    await server.wait_closed()
                    if self._tasks:
                        await asyncio.wait(self._tasks)

    # -- connections -------------------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.stats.accepted += 1
        if len(self.connections) >= self.limits.max_connections and not self._evict_one():
            await self._refuse(reader, writer)
            return
        conn = _Connection(writer)
        self.connections.add(conn)
        peer = _peer(writer)
        try:
            await self._converse(conn, reader, writer, peer)
        except TimeoutError:
            self.stats.timed_out += 1
            log.debug("%s: timed out after %g s", peer, self.limits.timeout)
        except (_Closed, OSError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
            log.debug("%s: closed: %s", peer, exc or type(exc).__name__)
        except Exception:
            log.exception("%s: internal error; connection closed", peer)
        finally:
            conn.waiting, conn.since = True, 0.0  # closing: the first to evict
            await self._close(writer)
            self.connections.discard(conn)

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest without a request; False if none."""
        idle = [c for c in self.connections if c.waiting]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.since)
        self.connections.discard(victim)
        victim.writer.transport.abort()
        self.stats.evicted += 1
        return True

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Every connection is busy: 503 for plain HTTP (TLS: close), without a thread."""
        self.stats.refused += 1
        if self.ssl_context is not None or self.refusing >= self.limits.max_connections:
            writer.transport.abort()
            return
        self.refusing += 1
        try:
            response = text(503, "too many open connections", headers=(("Retry-After", "1"),))
            writer.write(self._encode(response, "GET", keep_alive=False))
            if writer.can_write_eof():
                writer.write_eof()
            # Read (and drop) what the client sends until it closes, so that closing does not
            # reset the connection and lose the answer.
            with contextlib.suppress(TimeoutError, OSError):
                async with asyncio.timeout(REFUSE_LINGER):
                    while await reader.read(65536):
                        pass
        finally:
            self.refusing -= 1
            writer.transport.abort()

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        """Close after flushing what is buffered; a client that does not read is cut off."""
        if writer.transport.is_closing():
            writer.transport.abort()
            return
        writer.close()
        try:
            async with asyncio.timeout(self.limits.timeout):
                await writer.wait_closed()
        except (TimeoutError, OSError, ssl.SSLError):
            writer.transport.abort()

    async def _converse(
        self,
        conn: _Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
    ) -> None:
        timeout = self.limits.timeout
        if self.ssl_context is not None:
            async with asyncio.timeout(timeout + 1):
                await writer.start_tls(self.ssl_context, ssl_handshake_timeout=timeout)
        while True:
            conn.wait()
            try:
                async with asyncio.timeout(timeout):
                    request = await _read_request(reader, peer, conn)
            except TimeoutError:
                if conn.partial:  # a partial request: say why before closing
                    self.stats.timed_out += 1
                    await self._send(writer, text(408, "request timed out", close=True), "GET")
                    return
                raise
            if request is None:
                return
            conn.busy()
            if isinstance(request, Response):  # a request that cannot be served
                await self._send(writer, request, "GET")
                return
            response = await self.handler(request)
            keep = request.keep_alive and not response.close
            await self._send(writer, response, request.method, keep, request.version)
            log.debug("%s %s %s %d", peer, request.method, request.target[:200], response.status)
            if not keep:
                return

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        response: Response,
        method: str,
        keep_alive: bool = False,
        version: str = "HTTP/1.1",
    ) -> None:
        writer.write(self._encode(response, method, keep_alive, announce=version == "HTTP/1.0"))
        async with asyncio.timeout(self.limits.timeout):
            await writer.drain()

    def _encode(
        self, response: Response, method: str, keep_alive: bool, announce: bool = False
    ) -> bytes:
        try:
            reason = http.HTTPStatus(response.status).phrase
        except ValueError:
            reason = ""
        lines = [
            f"HTTP/1.1 {response.status} {reason}",
            f"Server: {self.server_name}",
            f"Date: {formatdate(usegmt=True)}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
        ]
        lines += [f"{name}: {value}" for name, value in response.headers]
        if not keep_alive:
            lines.append("Connection: close")
        elif announce:
            lines.append("Connection: keep-alive")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if method == "HEAD" else head + response.body


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


async def _read_request(
    reader: asyncio.StreamReader, peer: str, conn: _Connection
) -> Request | Response | None:
    """Read one request head (and drop its body); None at a clean end of the connection,
    a :class:`Response` for a request that must be refused (the connection then closes)."""
    try:
        return await _read_head(reader, peer, conn)
    except _TooLong:
        return text(431, f"request line or header line longer than {MAX_LINE} bytes", close=True)


async def _read_head(
    reader: asyncio.StreamReader, peer: str, conn: _Connection
) -> Request | Response | None:
    first = await reader.read(1)  # returns at the first byte: from then on, a partial request
    if not first:
        return None
    conn.partial = True
    line = first if first == b"\n" else first + await _line(reader)
    for _ in range(2):  # RFC 9112 2.2: ignore empty lines before the request line
        if line not in (b"\r\n", b"\n"):
            break
        line = await _line(reader)
    if not line:
        return None
    if not line.endswith(b"\n"):
        raise _Closed("end of stream inside the request line")
    words = line.decode("latin-1").split()
    if len(words) == 2:
        return text(400, "HTTP/0.9 is not supported", close=True)
    if len(words) != 3:
        return text(400, "bad request line", close=True)
    method, target, version = words
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        if version.startswith("HTTP/"):
            return text(505, "only HTTP/1.0 and HTTP/1.1 are supported", close=True)
        return text(400, "bad request line", close=True)
    headers: dict[str, str] = {}
    size = len(line)
    for _ in range(MAX_HEADERS + 1):
        raw = await _line(reader)
        if not raw.endswith(b"\n"):
            raise _Closed("end of stream inside the request head")
        size += len(raw)
        if size > MAX_HEAD:
            return text(431, "request head too large", close=True)
        if raw in (b"\r\n", b"\n"):
            break
        if raw[:1] in (b" ", b"\t"):
            return text(400, "folded header lines are not supported", close=True)
        name, sep, value = raw.decode("latin-1").partition(":")
        if not sep or not name or name != name.strip():
            return text(400, "bad header line", close=True)
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    else:
        return text(431, "too many header lines", close=True)
    if "transfer-encoding" in headers:
        return text(501, "request bodies are not supported", close=True)
    length_text = headers.get("content-length", "0")
    if not (length_text.isascii() and length_text.isdigit()):
        return text(400, "bad Content-Length", close=True)
    length = int(length_text)
    if length > MAX_BODY:
        return text(413, "request body too large", close=True)
    if length:
        await reader.readexactly(length)
    return Request(method, target, version, headers, peer)


async def _line(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readline()
    except ValueError:  # longer than MAX_LINE (asyncio's LimitOverrunError, as ValueError)
        raise _TooLong from None
