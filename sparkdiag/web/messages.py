"""What the HTTP server hands a handler and takes back, and the request checks beyond h11.

:class:`Request` is a parsed request head, :class:`Response` the handler's answer (:func:`text`
for a one-line plain-text one). Request heads are at most ``MAX_HEAD`` bytes, ``MAX_HEADERS``
header lines and ``MAX_LINE`` bytes per header value, values without control characters;
bodies (none is needed) up to ``MAX_BODY`` bytes are read and dropped, chunked bodies refused
(:func:`problem`).
"""

from __future__ import annotations

import http
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

from sparkdiag.peers.httpget import plain

__all__ = [
    "MAX_BODY",
    "MAX_HEAD",
    "MAX_HEADERS",
    "MAX_LINE",
    "Handler",
    "Request",
    "Response",
    "header_dict",
    "phrase",
    "plain",
    "problem",
    "refusal",
    "text",
]

MAX_HEAD = 16384  # the request line and every header line together
MAX_LINE = 8192  # one header value
MAX_HEADERS = 100
MAX_BODY = 65536  # a request body is read and discarded up to this size


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


def refusal(status: int, detail: str) -> Response:
    """A request refused with ``status``: its reason phrase, then the detail in plain words
    (``400`` says "bad request: ...", ``501`` "not implemented: ..."); the connection closes."""
    return text(status, f"{phrase(status).lower() or 'refused'}: {detail}"[:300], close=True)


Handler = Callable[[Request], Awaitable[Response]]


def phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def problem(event: h11.Request) -> Response | None:
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


def header_dict(event: h11.Request) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in event.headers:
        name, value = raw_name.decode("ascii"), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers
