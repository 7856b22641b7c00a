"""The protocol between ``sparkdiag link serve`` and ``sparkdiag link test``: JSON lines over TCP.

Every connection opens with one line from the measuring side, ``{"sparkdiag-link": 2, "kind":
K, ...}``, and the listening side answers ``{"sparkdiag-link": 2, ...}`` (or closes a connection
that does not open so within :data:`HELLO_TIMEOUT`). Three kinds:

``control``
    the session, opened by the challenge and response of :mod:`sparkdiag.link.auth` (both sides
    prove they hold the link secret; nothing else is said before). The hello that follows
    carries a random ``session`` token, the host name, the listening side's ConnectX-7
    interfaces (and the one the connection came in on) with their addresses, the tools it has
    (``iperf3``, ``ib_write_bw``) and its own lint findings. Requests follow, one line each,
    each answered by one line: ``sink``/``source`` (get ready to count or to send on N data
    connections), ``result`` (what was counted or sent), ``tool`` (start ``iperf3 -s`` or
    ``ib_write_bw``), ``bye``. One session at a time: a second gets ``{"error": "busy ..."}``.
``ping``
    carries the session token; the answer repeats it (proof that the address reaches the same
    listening process), then every 32-byte message is echoed: the latency.
``data``
    carries the token and a test id, then raw bytes in the direction the test was set up for.

Lines are at most :data:`MAX_LINE` bytes, nested at most :data:`MAX_DEPTH` levels, their integers
at most 40 digits and their numbers finite (:mod:`sparkdiag.safeload`); any other line ends the
connection. Protocol 1 (sparkdiag before issue 29) had no authentication; the two do not talk.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from sparkdiag import safeload

VERSION = 2
PORT = 10943  # beside the exporter's 10942
MAX_LINE = 64 * 1024
MAX_DEPTH = 16  # a hello nests 4 levels
HELLO_TIMEOUT = 5.0
PING_BYTES = 32
PING_MAX = 2000  # round trips of one latency measurement
CHUNK = 1 << 20  # bytes per send/recv call on a data connection
MAX_STREAMS = 64
MAX_SECONDS = 60.0


class ProtocolError(Exception):
    """The other side broke the protocol: not JSON, too long, not ``sparkdiag-link``."""


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(encode(message))


class LineReader:
    """Reads newline-terminated JSON messages from a socket, keeping what follows a line
    (the first bytes of a data or ping stream) in :attr:`rest`."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rest = b""

    def read(self, timeout: float | None) -> dict[str, Any]:
        """The next message; raises ProtocolError, TimeoutError (nothing within ``timeout``
        seconds) or ConnectionError (closed before a whole line)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.rest:
            if len(self.rest) > MAX_LINE:
                raise ProtocolError(f"a line longer than {MAX_LINE} bytes")
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no answer")
                self.sock.settimeout(left)
            else:
                self.sock.settimeout(None)
            try:
                chunk = self.sock.recv(4096)
            except TimeoutError:
                raise TimeoutError("no answer") from None
            if not chunk:
                raise ConnectionError(f"closed after {len(self.rest)} bytes: {self.rest[:60]!r}")
            self.rest += chunk
        line, _, self.rest = self.rest.partition(b"\n")
        try:
            message = safeload.parse_json(line, MAX_DEPTH)
        except safeload.LoadError as exc:
            raise ProtocolError(f"not a sparkdiag-link line ({exc}): {line[:60]!r}") from None
        if not isinstance(message, dict):
            raise ProtocolError(f"not a sparkdiag-link message: {line[:60]!r}")
        return message


def hello(kind: str, **fields: Any) -> dict[str, Any]:
    return {"sparkdiag-link": VERSION, "kind": kind, **fields}


def is_hello(message: dict[str, Any]) -> bool:
    return message.get("sparkdiag-link") == VERSION
