"""HTTP serving: ``/metrics``, ``/healthz`` and a small landing page at ``/``.

:class:`ExporterServer` binds the listen socket when constructed (so a port in use is an error
at start) and serves in one thread running an asyncio loop (:mod:`sparkdiag.web.serving`
holds the connection limits and timeouts). Per request, in exporter-toolkit's order: the web
config as it is now (:class:`~sparkdiag.web.webconfig.LiveWebConfig`; 500 while a change left
it unusable), its ``rate_limit`` (429), basic auth (answers from the credential cache at once;
bcrypt in a pool of ``AUTH_WORKERS`` threads with at most ``AUTH_QUEUE`` waiting, beyond which
503), then at most ``max_requests`` requests in flight (more get 503), rendered in a pool of
``RENDER_WORKERS`` threads through :class:`~sparkdiag.web.scrape.RenderCache`, which
:meth:`ExporterServer.published` (the poller's listener) fills ahead for each new snapshot; a
body made already is answered on the event loop without going through the pool.
Every answer of the handler carries ``http_server_config.headers``. Defaults of the limits:
``config.OPTIONS``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from sparkdiag import __version__
from sparkdiag.config import DEFAULTS, ConfigError, echo
from sparkdiag.exporter.registry import Collectable, render, render_openmetrics
from sparkdiag.web import scrape
from sparkdiag.web.channels import Tls
from sparkdiag.web.limits import Limits
from sparkdiag.web.messages import Request, Response, text
from sparkdiag.web.serving import HttpServer
from sparkdiag.web.webconfig import LiveWebConfig, RateLimit, WebConfig

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
    family, kind, proto, sockaddr = listen_address(address)
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def listen_address(address: tuple[str, int]) -> tuple[int, int, int, Any]:
    """The address to bind for ``--listen`` (family, type, protocol, socket address), without
    binding it (``serve`` and ``config check`` alike). Raises :class:`ListenError` for a host
    that does not resolve, ``socket.gaierror`` when the resolver does not answer (EAI_AGAIN)."""
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    name: str | bytes | None = host or None
    if host.isascii():  # as bytes, checked as the IDNA codec would: it loads unicodedata
        labels = host.removesuffix(".").split(".")
        if host and any(not 0 < len(label) < 64 for label in labels):
            raise ListenError(
                f"listen: host {echo(host)} is not a host name (label empty or too long)"
            )
        name = host.encode() or None
    try:
        infos = socket.getaddrinfo(name, port, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
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
    return family, kind, proto, sockaddr


class _Bucket:
    """Go's ``rate.Limiter``: ``burst`` tokens at start, one more each ``interval``."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self.tokens = float(limit.burst)
        self.last = clock()

    def allow(self) -> bool:
        now = self.clock()
        self.tokens = min(self.limit.burst, self.tokens + (now - self.last) / self.limit.interval)
        self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class ExporterServer:
    """HTTP(S) server for the exporter; TLS, basic auth, headers and rate limit from ``web``
    (a :class:`LiveWebConfig` follows the file as it changes). ``generation`` returns the
    current snapshot: ``/metrics`` renders once per snapshot (no cache without it), ahead of
    the scrapes when :meth:`published` is called for each new one."""

    def __init__(
        self,
        address: tuple[str, int],
        registry: Collectable,
        healthy: Callable[[], tuple[bool, str]],
        web: WebConfig | LiveWebConfig | None = None,
        max_requests: int = DEFAULTS["web_max_requests"],
        *,
        max_connections: int = DEFAULTS["web_max_connections"],
        timeout: float = DEFAULTS["web_read_timeout"],
        backlog: int = Limits.backlog,
        generation: Callable[[], object] | None = None,
    ) -> None:
        self.registry = registry
        self.healthy = healthy
        first = web.current() if isinstance(web, LiveWebConfig) else web
        self.web: WebConfig = first or WebConfig()
        self._web = web.current if isinstance(web, LiveWebConfig) else (lambda: self.web)
        self.slots = threading.BoundedSemaphore(max_requests) if max_requests > 0 else None
        self.timeout = timeout
        self.socket = listen_socket(address, backlog)
        self.server_address: tuple[Any, ...] = self.socket.getsockname()
        self.cache = scrape.RenderCache(
            {scrape.TEXT: lambda: render(registry), scrape.OPENMETRICS: self._openmetrics},
            generation,
        )
        self.prerenderer = scrape.Prerenderer(self.cache)
        self.engine = HttpServer(
            self.socket,
            self._handle,
            Limits(timeout=timeout, max_connections=max_connections, backlog=backlog),
            tls=self._tls if self.web.tls is not None else None,
            server_name=f"sparkdiag/{__version__}",
        )
        self._render_pool = ThreadPoolExecutor(RENDER_WORKERS, thread_name_prefix="http-render")
        self._auth_pool = ThreadPoolExecutor(AUTH_WORKERS, thread_name_prefix="http-auth")
        self._auth_waiting = 0
        self._bucket: _Bucket | None = None
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

    def published(self, _snapshot: object = None) -> None:
        """A new snapshot is the latest (the poller's listener): render ``/metrics`` ahead in
        the background, in the formats and encodings scrapes have been asking for."""
        self.prerenderer.published()

    def server_close(self) -> None:
        self.socket.close()
        self.prerenderer.close()
        self._render_pool.shutdown(wait=False, cancel_futures=True)
        self._auth_pool.shutdown(wait=False, cancel_futures=True)
        if not self._loop.is_running():
            self._loop.close()

    # -- requests ------------------------------------------------------------------------------

    def _tls(self) -> Tls | None:
        web = self._web()
        return None if web is None else web.tls

    async def _handle(self, request: Request) -> Response:
        web = self._web()
        if web is None:
            return text(500, "the web config changed and is unusable: see the daemon's log")
        response = await self._answer(web, request)
        if web.headers:
            response = replace(response, headers=response.headers + web.headers)
        return response

    async def _answer(self, web: WebConfig, request: Request) -> Response:
        if web.rate_limit is not None:
            if self._bucket is None or self._bucket.limit != web.rate_limit:
                self._bucket = _Bucket(web.rate_limit)
            if not self._bucket.allow():
                return text(429, "too many requests", headers=(("Retry-After", "1"),))
        if request.method not in ("GET", "HEAD"):
            return text(405, "only GET and HEAD", headers=(("Allow", "GET, HEAD"),))
        if web.auth.enabled:
            allowed = await self._authorize(web, request.headers.get("authorization"))
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
            ready = self._ready(request)
            if ready is not None:
                return ready
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._render_pool, self._route, request)
        finally:
            if slots is not None:
                slots.release()

    async def _authorize(self, web: WebConfig, header: str | None) -> bool | None:
        """True or False; None when bcrypt is too busy to check in time (answer 503)."""
        auth = web.auth
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
                import html  # for this page only

                _, detail = self.healthy()
                body = _LANDING.format(version=__version__, health=html.escape(detail))
                return Response(200, body.encode(), "text/html; charset=utf-8")
        except Exception as exc:
            log.error("serving %s failed: %s: %s", path, type(exc).__name__, exc)
            log.debug("serving %s failed", path, exc_info=True)
            return text(500, "internal error")
        return text(404, "not found: try /metrics")

    def _ready(self, request: Request) -> Response | None:
        """``/metrics`` when the newest snapshot's body is made already (rendered ahead, or by
        an earlier scrape): answered on the event loop, no thread hand-off; else None."""
        if request.path != "/metrics":
            return None
        try:
            fmt, compress = self._variant(request)
            body = self.cache.ready(fmt, compress)
        except Exception:  # a bug: the pool's path answers 500 and logs it
            return None
        return None if body is None else _metrics_response(fmt, compress, body)

    def _metrics(self, request: Request) -> Response:
        fmt, compress = self._variant(request)
        return _metrics_response(fmt, compress, self.cache.body(fmt, compress))

    @staticmethod
    def _variant(request: Request) -> tuple[str, bool]:
        fmt = scrape.choose_format(request.headers.get("accept"))
        return fmt, scrape.accepts_gzip(request.headers.get("accept-encoding"))

    def _openmetrics(self) -> bytes:
        return render_openmetrics(self.registry)


def _metrics_response(fmt: str, compress: bool, body: bytes) -> Response:
    # the body follows Accept (text or OpenMetrics) as well as Accept-Encoding: a cache that
    # heard of the second only could hand OpenMetrics to a client that asked for text (a review)
    headers: tuple[tuple[str, str], ...] = (("Vary", "Accept, Accept-Encoding"),)
    if compress:
        headers += (("Content-Encoding", "gzip"),)
    return Response(200, body, scrape.CONTENT_TYPES[fmt], headers)


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


def health_check(
    latest: Callable[[], Any], interval: float, published_at: Callable[[], float | None]
) -> Callable[[], tuple[bool, str]]:
    """Healthy while the newest snapshot is younger than three poll intervals (at least 5 s),
    aged on the monotonic clock (``published_at``): the wall clock's steps (NTP, a VM resumed)
    read a hung poller as healthy, or a fresh poll as stale (found in a review)."""
    limit = max(3 * interval, 5.0)

    def check() -> tuple[bool, str]:
        snap, at = latest(), published_at()
        if snap is None or at is None:
            return False, "starting: no poll has completed yet"
        age = time.monotonic() - at
        if age > limit:
            return False, f"stale: last poll {age:.1f} s ago (limit {limit:.0f} s)"
        return True, f"ok: poll {snap.poll}, {age:.1f} s ago"

    return check
