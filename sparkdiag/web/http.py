"""HTTP serving: ``/metrics``, ``/healthz`` and a small landing page at ``/``.

:class:`ExporterServer` binds the listen socket when constructed (so a port in use is an error
at start) and serves in one thread running an asyncio loop (:mod:`sparkdiag.web.serving`
holds the connection limits and timeouts). Per request: basic auth first (answers from the
credential cache at once; bcrypt in a pool of ``AUTH_WORKERS`` threads with at most
``AUTH_QUEUE`` waiting, beyond which 503), then at most ``max_requests`` requests in flight
(more get 503), rendered in a pool of ``RENDER_WORKERS`` threads.
"""

from __future__ import annotations

import asyncio
import html
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from sparkdiag import __version__
from sparkdiag.config import ConfigError, echo
from sparkdiag.exporter.registry import render
from sparkdiag.web.serving import HttpServer, Limits, Request, Response, text
from sparkdiag.web.webconfig import WebConfig

log = logging.getLogger(__name__)

AUTH_WORKERS = 2  # bcrypt checks at once (each takes one core for tens of ms)
AUTH_QUEUE = 64  # bcrypt checks waiting; more get 503 at once
RENDER_WORKERS = 4  # rendering holds the GIL: more threads would not render faster

# getaddrinfo answers that mean "no such host" (a configuration error, exit 2), as opposed to
# EAI_AGAIN and the like (DNS not reachable yet at boot: worth a restart, exit 1).
_NO_SUCH_HOST = {
    getattr(socket, name)
    for name in ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY", "EAI_FAMILY", "EAI_SERVICE")
    if hasattr(socket, name)
}


class ListenError(ConfigError):
    """The listen address names no host this machine can resolve: a configuration error."""


def listen_socket(address: tuple[str, int], backlog: int) -> socket.socket:
    """A bound, listening TCP socket. Raises :class:`ListenError` for a host that does not
    resolve, ``OSError`` for everything else (port in use, address not on this machine)."""
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(
            host or None, port, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        if exc.errno in _NO_SUCH_HOST:
            raise ListenError(
                f"listen: host {echo(host)} does not resolve ({exc.strerror}); "
                "allowed: an address or host name of this machine"
            ) from None
        raise
    except (UnicodeError, ValueError) as exc:  # IDNA encoding, embedded NUL
        raise ListenError(f"listen: host {echo(host)} is not a host name ({exc})") from None
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


class ExporterServer:
    """HTTP(S) server for the exporter; TLS and basic auth from ``web``."""

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        healthy: Callable[[], tuple[bool, str]],
        web: WebConfig | None = None,
        max_requests: int = 40,
        *,
        max_connections: int = 512,
        timeout: float = 10.0,
        backlog: int = 1024,
    ) -> None:
        self.registry = registry
        self.healthy = healthy
        self.web = web or WebConfig()
        self.slots = threading.BoundedSemaphore(max_requests) if max_requests > 0 else None
        self.timeout = timeout
        self.socket = listen_socket(address, backlog)
        self.server_address: tuple[Any, ...] = self.socket.getsockname()
        self.engine = HttpServer(
            self.socket,
            self._handle,
            Limits(timeout=timeout, max_connections=max_connections, backlog=backlog),
            ssl_context=self.web.ssl_context,
            server_name=f"sparkdiag/{__version__}",
        )
        self._render_pool = ThreadPoolExecutor(RENDER_WORKERS, thread_name_prefix="http-render")
        self._auth_pool = ThreadPoolExecutor(AUTH_WORKERS, thread_name_prefix="http-auth")
        self._auth_waiting = 0
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._serving = threading.Event()
        self._done = threading.Event()

    # -- life cycle (the socketserver names, which the daemon and tests use) -------------------

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown`; blocks the calling thread."""
        self._serving.set()
        try:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self.engine.serve(self._stop))
        finally:
            self._done.set()

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)
        thread.start()
        return thread

    def shutdown(self) -> None:
        """Stop serving: close the listen socket and every connection; wait for the loop."""
        try:
            self._loop.call_soon_threadsafe(self._stop.set)
        except RuntimeError:  # the loop is closed already
            return
        if self._serving.is_set():
            self._done.wait(timeout=10)

    def server_close(self) -> None:
        self.socket.close()
        self._render_pool.shutdown(wait=False, cancel_futures=True)
        self._auth_pool.shutdown(wait=False, cancel_futures=True)
        if not self._loop.is_running():
            self._loop.close()

    # -- requests ------------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return text(405, "only GET and HEAD", headers=(("Allow", "GET, HEAD"),))
        if self.web.auth.enabled:
            allowed = await self._authorize(request.headers.get("authorization"))
            if allowed is None:
                return text(503, "too many logins in progress", headers=(("Retry-After", "1"),))
            if not allowed:
                return text(
                    401,
                    "unauthorized",
                    headers=(("WWW-Authenticate", 'Basic realm="sparkdiag", charset="UTF-8"'),),
                )
        slots = self.slots
        if slots is not None and not slots.acquire(blocking=False):
            return text(503, "too many concurrent requests", headers=(("Retry-After", "1"),))
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._render_pool, self._route, request)
        finally:
            if slots is not None:
                slots.release()

    async def _authorize(self, header: str | None) -> bool | None:
        """True or False; None when bcrypt is too busy to check in time (answer 503)."""
        auth = self.web.auth
        answer = auth.decide(header)
        if isinstance(answer, bool):
            return answer
        if self._auth_waiting >= AUTH_QUEUE:
            return None
        self._auth_waiting += 1
        try:
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(self.timeout):
                return await loop.run_in_executor(self._auth_pool, auth.verify, answer)
        except TimeoutError:
            return None
        finally:
            self._auth_waiting -= 1

    def _route(self, request: Request) -> Response:
        path = request.path
        try:
            if path == "/metrics":
                return self._metrics(request)
            if path == "/healthz":
                ok, detail = self.healthy()
                return text(200 if ok else 503, detail)
            if path == "/":
                _, detail = self.healthy()
                body = _LANDING.format(version=__version__, health=html.escape(detail))
                return Response(200, body.encode(), "text/html; charset=utf-8")
        except Exception:
            log.exception("serving %s failed", path)
            return text(500, "internal error")
        return text(404, "not found: try /metrics")

    def _metrics(self, request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        if content_type.startswith("text/plain"):
            body = render(self.registry)  # the fast encoder for the text format
        else:
            body = encoder(self.registry)
        return Response(200, body, content_type)


_LANDING = """<!doctype html>
<html><head><meta charset="utf-8"><title>sparkdiag</title></head>
<body>
<h1>sparkdiag {version}</h1>
<p>GPU health and performance-regression exporter.</p>
<ul>
<li><a href="metrics">/metrics</a> &mdash; Prometheus metrics</li>
<li><a href="healthz">/healthz</a> &mdash; {health}</li>
</ul>
</body></html>
"""


def health_check(latest: Callable[[], Any], interval: float) -> Callable[[], tuple[bool, str]]:
    """Healthy while the newest snapshot is younger than three poll intervals (at least 5 s)."""
    limit = max(3 * interval, 5.0)

    def check() -> tuple[bool, str]:
        snap = latest()
        if snap is None:
            return False, "starting: no poll has completed yet"
        age = time.time() - snap.timestamp
        if age > limit:
            return False, f"stale: last poll {age:.1f} s ago (limit {limit:.0f} s)"
        return True, f"ok: poll {snap.poll}, {age:.1f} s ago"

    return check
