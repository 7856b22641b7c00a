"""HTTP serving: ``/metrics``, ``/healthz`` and a small landing page at ``/``."""

from __future__ import annotations

import html
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from sparkdiag import __version__
from sparkdiag.exporter.registry import render
from sparkdiag.exporter.webconfig import WebConfig

log = logging.getLogger(__name__)


class ExporterServer(ThreadingHTTPServer):
    """Threaded HTTP(S) server. TLS handshakes run in the request's thread, never in the accept
    loop, so a slow or plain-HTTP client cannot stall other scrapes."""

    daemon_threads = True
    allow_reuse_address = True
    handshake_timeout = 10.0

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        healthy: Callable[[], tuple[bool, str]],
        web: WebConfig | None = None,
        max_requests: int = 40,
    ) -> None:
        self.registry = registry
        self.healthy = healthy
        self.web = web or WebConfig()
        self.slots = threading.BoundedSemaphore(max_requests) if max_requests > 0 else None
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        context = self.web.ssl_context
        if context is not None:
            request.settimeout(self.handshake_timeout)
            try:
                request = context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                log.debug("TLS handshake with %s failed: %s", client_address, exc)
                return
            request.settimeout(None)
        super().finish_request(request, client_address)

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)
        thread.start()
        return thread


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


class _Handler(BaseHTTPRequestHandler):
    server: ExporterServer
    server_version = f"sparkdiag/{__version__}"

    def do_GET(self) -> None:
        slots = self.server.slots
        if slots is not None and not slots.acquire(blocking=False):
            self._send(503, "text/plain; charset=utf-8", b"too many concurrent requests\n")
            return
        try:
            if not self.server.web.authorized(self.headers.get("Authorization")):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="sparkdiag", charset="UTF-8"')
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                body = b"unauthorized\n"
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                return
            self._route()
        finally:
            if slots is not None:
                slots.release()

    def _route(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._metrics()
        elif path == "/healthz":
            ok, detail = self.server.healthy()
            self._send(200 if ok else 503, "text/plain; charset=utf-8", (detail + "\n").encode())
        elif path == "/":
            _, detail = self.server.healthy()
            body = _LANDING.format(version=__version__, health=html.escape(detail))
            self._send(200, "text/html; charset=utf-8", body.encode())
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics\n")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _metrics(self) -> None:
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        try:
            if content_type.startswith("text/plain"):
                body = render(self.server.registry)  # the fast encoder for the text format
            else:
                body = encoder(self.server.registry)
        except Exception:
            log.exception("rendering /metrics failed")
            self._send(500, "text/plain; charset=utf-8", b"internal error rendering metrics\n")
            return
        self._send(200, content_type, body)

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


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
