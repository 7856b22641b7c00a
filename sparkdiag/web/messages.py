"""What the HTTP server hands a handler and takes back, and the request checks beyond h11.

:class:`Request` is a parsed request head, :class:`Response` the handler's answer (:func:`text`
for a one-line plain-text one). Request heads are at most ``MAX_HEAD`` bytes, ``MAX_HEADERS``
header lines and ``MAX_LINE`` bytes per header value, values without control characters;
bodies (none is needed), by Content-Length or chunked, up to ``MAX_BODY`` bytes are read and
dropped; a request that frames its body both ways, or chunked in HTTP/1.0, is refused
(:func:`problem`), as is an absolute-form target that cannot be split.
"""

from __future__ import annotations

import http
import re
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
    "HeadSize",
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

_END_OF_HEAD = re.compile(rb"\n\r?\n")  # the blank line that ends a head, as h11 finds it


class HeadSize:
    """A request head's size as its bytes arrive, counted up to the blank line that ends it,
    so that ``MAX_HEAD`` holds whatever the reads' sizes: a head of ``MAX_HEAD`` bytes (its
    blank line included) passes, one byte more does not, in one read or in many. Bytes after
    the blank line (a body, a pipelined request) are not counted."""

    def __init__(self) -> None:
        self.size = 0
        self.ended = False
        self._tail = b""  # the last bytes counted: a blank line may be cut across two reads

    def over(self, data: bytes) -> bool:
        """Count ``data``, the next bytes of the head; True once the head is over MAX_HEAD."""
        if not self.ended:
            joined = self._tail + data
            end = _END_OF_HEAD.search(joined)
            if end is None:
                self.size += len(data)
                self._tail = joined[-2:]
            else:
                self.size += end.end() - len(self._tail)
                self.ended = True
        return self.size > MAX_HEAD


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
        if _absolute(target):
            target = _absolute_path(target) or "/"  # absolute-form (RFC 9112 3.2.2)
        return target.split("?", 1)[0]


def _absolute(target: str) -> bool:
    return target[:7].lower() == "http://" or target[:8].lower() == "https://"


def _absolute_path(target: str) -> str | None:
    """The path of an absolute-form target; None where it cannot be split (``http://[/x``: an
    IPv6 authority left open), which :func:`problem` refuses before any handler asks."""
    try:
        return urlsplit(target).path
    except ValueError:
        return None


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
    target = event.target.decode("ascii", "replace")
    if _absolute(target) and _absolute_path(target) is None:
        return text(400, "malformed request target", close=True)
    names = {name for name, _ in event.headers}
    if b"transfer-encoding" in names and (
        b"content-length" in names or event.http_version == b"1.0"
    ):  # RFC 9112 6.1 and 6.3: the framing is faulty, and the connection must close
        return text(400, "Transfer-Encoding with Content-Length, or in HTTP/1.0", close=True)
    if len(event.headers) > MAX_HEADERS:
        return text(431, "too many header lines", close=True)
    for name, value in event.headers:
        if len(value) > MAX_LINE:
            return text(431, f"header line longer than {MAX_LINE} bytes", close=True)
        if any((byte < 0x20 and byte != 0x09) or byte == 0x7F for byte in value):
            return text(400, "control character in a header value", close=True)
        if name == b"content-length" and int(value) > MAX_BODY:
            return text(413, "request body too large", close=True)
    return None


def header_dict(event: h11.Request) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in event.headers:
        name, value = raw_name.decode("ascii"), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers
