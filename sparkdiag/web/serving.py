"""An HTTP/1.1 server on asyncio that holds under bursts, idle sockets and hostile clients.

Requests are parsed by h11 (python-hyper's sans-I/O HTTP/1.1 state machine: request-line and
header grammar, ``Host`` required in HTTP/1.1, conflicting ``Content-Length`` refused,
pipelining); this module owns the sockets and the connections' life. Why h11 and not the
previous hand-written parser or aiohttp's server: ``docs/web.md`` (measured side by side).
Beside it: :mod:`~sparkdiag.web.messages` (requests, responses and the checks beyond h11),
:mod:`~sparkdiag.web.channels` (plain and TLS byte channels), :mod:`~sparkdiag.web.limits`
(the limits, their counters and the connection cap).

One event loop owns every socket: it accepts, runs TLS handshakes through ``ssl.SSLObject`` on
memory buffers (so a connection holds no TLS state until its first byte arrives, and no buffer
larger than one read of ``READ_CHUNK`` bytes), reads requests and writes responses. Only the
handler's work (rendering, bcrypt) runs in threads, so threads do not grow with connections.

Limits (:class:`~sparkdiag.web.limits.Limits`, defaults from ``config.OPTIONS``):

* ``timeout`` bounds each step of a connection: the TLS handshake, receiving a whole request head
  (a client trickling bytes gets no more time than a silent one), waiting idle for the next
  request on a kept-alive connection, and writing each response.
* ``max_connections`` caps open connections, lowered to what the open-files limit leaves
  (:func:`~sparkdiag.web.limits.connection_cap`). At the cap a new connection first evicts the
  connection that has waited longest without a request in progress (idle, sending its request
  head, or in its TLS handshake); only when every connection is busy is the new one refused: a
  plain-HTTP client gets ``503`` at once, a TLS client is closed.
* out of file descriptors anyway (``EMFILE``: probe workers, NVML), accepting pauses with a
  growing delay (5 ms to 1 s, as Go's ``net/http`` does; the rule ``link serve`` follows too,
  :mod:`sparkdiag.descriptors`) and one idle connection is evicted to make room; one warning
  per episode (it ends after a minute without running out).

A malformed request gets a 4xx/5xx answer and the connection is closed, as does a request head
cut short by the client's end of stream (400, as Go's ``net/http``; an end of stream before any
byte of a request closes without an answer, as there); nothing a client sends logs more than a
debug line.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import time
from collections.abc import Coroutine
from typing import Any

import h11

from sparkdiag.descriptors import next_pause, out_of_fds
from sparkdiag.web.channels import (
    READ_CHUNK,
    TLS_HANDSHAKE,
    Channel,
    Closed,
    Plain,
    Tls,
    TlsProvider,
)
from sparkdiag.web.limits import (
    FD_WARN_QUIET,
    MAX_REFUSING,
    RESERVED_FDS,
    Connection,
    Limits,
    Stats,
    connection_cap,
    peer_name,
)
from sparkdiag.web.messages import (
    MAX_BODY,
    MAX_HEAD,
    MAX_LINE,
    Handler,
    HeadSize,
    Request,
    Response,
    header_dict,
    phrase,
    plain,
    problem,
    refusal,
    text,
)

__all__ = [  # what callers import from here (the server and the types of its interface)
    "RESERVED_FDS",
    "Handler",
    "HttpServer",
    "Limits",
    "Request",
    "Response",
    "Stats",
    "Tls",
    "TlsProvider",
    "connection_cap",
    "text",
]

log = logging.getLogger(__name__)

REFUSE_LINGER = 1.0  # seconds a refused connection is read (and discarded) before closing


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
        self.connections: set[Connection] = set()
        self.refusing = 0
        self.stats = Stats()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pause = 0.0  # current accept pause; 0 while accepting normally
        self._fds_short_at = -FD_WARN_QUIET  # when accept last ran out of descriptors
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
                if out_of_fds(exc):
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
        """One warning per episode: an episode ends when accepting has gone FD_WARN_QUIET
        seconds without running out (each failure evicts an idle connection, so the next accept
        succeeds; ending it there warned once per connection)."""
        self.stats.out_of_fds += 1
        now = time.monotonic()
        if now - self._fds_short_at >= FD_WARN_QUIET:
            self.stats.fd_episodes += 1
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            log.warning(
                "out of file descriptors (%s; open-files limit %s, %d HTTP connections open): "
                "accepting paused and retried, the longest-idle connection closed to make room "
                "(%d failures so far; said again after %.0f s without one)",
                exc.strerror or exc,
                soft,
                len(self.connections),
                self.stats.out_of_fds,
                FD_WARN_QUIET,
            )
        self._fds_short_at = now
        self._evict_one()
        self._pause = next_pause(self._pause)
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
        peer = peer_name(client)
        if len(self.connections) >= self.limits.max_connections and not self._evict_one():
            self._spawn(self._refuse(client), client)
            return
        conn = Connection(client, peer)
        self.connections.add(conn)
        conn.task = self._spawn(self._client(conn), client, conn)

    def _spawn(
        self,
        work: Coroutine[Any, Any, None],
        sock: socket.socket,
        conn: Connection | None = None,
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
        """Close the connection that has waited longest without a request, or whose client
        has not read its response for longest (``Connection.stalled_since``); False if none."""
        now = time.monotonic()
        stalled = [
            (since, c) for c in self.connections if (since := c.stalled_since(now)) is not None
        ]
        if not stalled:
            return False
        _, victim = min(stalled, key=lambda pair: pair[0])
        self.connections.discard(victim)
        if victim.task is not None:
            victim.task.cancel()
        self.stats.evicted += 1
        return True

    async def _refuse(self, sock: socket.socket) -> None:
        """Every connection is busy: 503 for plain HTTP (TLS: close), without a thread."""
        self.stats.refused += 1
        if self.tls is not None or self.refusing >= min(self.limits.max_connections, MAX_REFUSING):
            sock.close()
            return
        self.refusing += 1
        try:
            await self._answer_and_close(
                sock, Plain(sock), 503, "too many open connections", (("Retry-After", "1"),)
            )
        finally:
            self.refusing -= 1

    # -- one connection ------------------------------------------------------------------------

    async def _client(self, conn: Connection) -> None:
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
        except (Closed, OSError, h11.ProtocolError) as exc:  # ssl.SSLError is an OSError
            log.debug("%s: closed: %s", conn.peer, exc or type(exc).__name__)
        except Exception as exc:  # a bug here, not the client's doing: one line, then details
            log.error(
                "%s: internal error (%s: %s); connection closed", conn.peer, type(exc).__name__, exc
            )
            log.debug("internal error", exc_info=True)
        finally:
            self.connections.discard(conn)
            sock.close()

    async def _open(self, conn: Connection) -> Channel | None:
        """The connection's channel once its first bytes are in (TLS: after the handshake);
        None when it was answered or closed already."""
        loop = asyncio.get_running_loop()
        timeout = self.limits.timeout
        if self.tls is None:
            return Plain(conn.sock)
        async with asyncio.timeout(timeout):
            first = await loop.sock_recv(conn.sock, READ_CHUNK)
            if not first:
                return None
            conn.partial = True
            if first[0] != TLS_HANDSHAKE:
                if first[:1].isalpha():  # plain HTTP on the TLS port: say so, as Go does
                    await self._answer_and_close(
                        conn.sock,
                        Plain(conn.sock),
                        400,
                        "this port speaks HTTPS: send the request with https://",
                    )
                return None
            tls = self.tls()
            if tls is None:  # the web config changed into an unusable one: refused until fixed
                return None
            from sparkdiag.web.tls import TlsChannel, san_allowed  # loaded with the context

            channel = TlsChannel(conn.sock, tls.context)
            self.stats.tls_started += 1
            await channel.handshake(first)
        if tls.allowed_sans is not None and not san_allowed(channel.obj, tls.allowed_sans):
            log.debug("%s: client certificate carries none of client_allowed_sans", conn.peer)
            return None
        return channel

    async def _converse(self, conn: Connection, channel: Channel) -> None:
        timeout = self.limits.timeout
        pending = b""  # bytes of the next request that came with the previous one (pipelining)
        while True:
            # a parser per request: what followed the last request is fed to the new one first,
            # so the request is read from its first byte whatever the read boundaries were
            parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
            conn.wait()
            try:
                async with asyncio.timeout(timeout):
                    request = await self._read_request(parser, channel, conn, pending)
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
            conn.writing = time.monotonic()
            async with asyncio.timeout(timeout):
                await channel.send(data)
            conn.writing = None
            log.debug(
                "%s %s %s %d", conn.peer, request.method, request.target[:200], response.status
            )
            if not keep:
                return
            pending = parser.trailing_data[0]

    async def _read_request(
        self, parser: h11.Connection, channel: Channel, conn: Connection, pending: bytes = b""
    ) -> Request | Response | None:
        """One request (its body read and dropped); None at a clean end of the connection, a
        :class:`Response` for a request that must be refused (the connection then closes).
        ``pending``: bytes received already, fed before anything is read. Empty lines before
        the request line are skipped (RFC 9112 section 2.2)."""
        head: h11.Request | None = None
        head_bytes = b""  # the request head as received so far, up to MAX_LINE bytes
        head_size = HeadSize()
        body = 0
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as exc:
                if parser.their_state is h11.ERROR and not conn.partial:
                    return None
                return refusal(exc.error_status_hint, plain(str(exc)))
            if event is h11.NEED_DATA:
                if pending:
                    data, pending = pending, b""
                else:
                    data = await channel.recv()
                    if not data and not conn.partial:
                        return None
                    if not data and head is None:
                        # as Go's net/http: its readRequest makes an end of stream after a
                        # head's first bytes io.ErrUnexpectedEOF, which conn.serve answers 400
                        return refusal(400, "the request head ended before its blank line")
                if head is None:
                    if not head_bytes:
                        data = data.lstrip(b"\r\n")  # empty lines before the request line
                        if not data:
                            continue
                    conn.partial = True
                    head_bytes += data[: max(MAX_LINE - len(head_bytes), 0)]
                    line, newline, _ = head_bytes.partition(b"\n")
                    if newline and len(line.split()) == 2:
                        # h11 would wait for a blank line that HTTP/0.9 never sends
                        return text(400, "HTTP/0.9 is not supported", close=True)
                    if head_size.over(data):
                        return text(431, "request head too large", close=True)
                parser.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                head = event
                refused = problem(event)
                if refused is not None:
                    return refused
                if parser.they_are_waiting_for_100_continue:  # RFC 9110 10.1.1
                    go_on = parser.send(h11.InformationalResponse(status_code=100, headers=[]))
                    await channel.send(go_on or b"")
            elif isinstance(event, h11.Data):
                body += len(event.data)
                if body > MAX_BODY:
                    return text(413, "request body too large", close=True)
            elif isinstance(event, h11.EndOfMessage) and head is not None:
                return Request(
                    head.method.decode("ascii"),
                    head.target.decode("ascii", "replace"),
                    "HTTP/" + head.http_version.decode("ascii"),
                    header_dict(head),
                    conn.peer,
                )
            else:  # PAUSED cannot happen before the response; anything else: give up
                raise Closed(f"unexpected parser event {event!r}")

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
        reason = phrase(response.status)
        out = parser.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
        if request.method != "HEAD" and response.body:
            out += parser.send(h11.Data(data=response.body))
        out += parser.send(h11.EndOfMessage())
        keep = parser.our_state is h11.DONE and parser.their_state is h11.DONE
        return out or b"", keep

    async def _answer_and_close(
        self,
        sock: socket.socket,
        channel: Channel,
        status: int,
        message: str,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Send one answer outside the parser's state (errors, refusals), then close after
        reading what the client still sends for a moment, so that closing does not reset the
        connection and lose the answer."""
        lines = [
            f"HTTP/1.1 {status} {phrase(status)}",
            f"Server: {self.server_name}",
            f"Date: {self._now()}",
            "Content-Type: text/plain; charset=utf-8",
            f"Content-Length: {len(message) + 1}",
            *(f"{name}: {value}" for name, value in headers),
            "Connection: close",
        ]
        data = ("\r\n".join(lines) + "\r\n\r\n" + message + "\n").encode("latin-1", "replace")
        with contextlib.suppress(TimeoutError, OSError):  # ssl.SSLError is an OSError
            async with asyncio.timeout(self.limits.timeout):
                await channel.send(data)
            if isinstance(channel, Plain):
                sock.shutdown(socket.SHUT_WR)
            async with asyncio.timeout(REFUSE_LINGER):
                while await channel.recv():
                    pass
        sock.close()

    def _now(self) -> str:
        second = int(time.time())
        if self._date[0] != second:
            self._date = (second, http_date(second))
        return self._date[1]


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(second: float) -> str:
    """RFC 9110's IMF-fixdate (``Sun, 06 Nov 1994 08:49:37 GMT``), as
    ``email.utils.formatdate(usegmt=True)`` writes it, without loading the e-mail package."""
    t = time.gmtime(second)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year:04d} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )
