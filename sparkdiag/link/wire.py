"""The protocol between ``sparkdiag link serve`` and ``sparkdiag link test``: JSON lines over TCP.

Every connection opens with one line from the measuring side, ``{"sparkdiag-link": 3, "kind":
K, ...}``, and the listening side answers ``{"sparkdiag-link": 3, ...}`` (or closes a connection
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
    From the hello (sent with the listening side's proof) on, every line in both directions
    carries a ``mac`` (:class:`Sealed`): the handshake is bound to the rest of the session.
``ping``
    carries the session token; the answer repeats it (proof that the address reaches the same
    listening process), then every 32-byte message is echoed: the latency.
``data``
    carries the token and a test id, then raw bytes in the direction the test was set up for.

The ping and data connections carry no mac: their bytes are the measurement (a mac over a
bandwidth stream costs what is measured); their token is checked against the session's.

Lines are at most :data:`MAX_LINE` bytes, nested at most :data:`MAX_DEPTH` levels, their integers
at most 40 digits and their numbers finite (:mod:`sparkdiag.safeload`); any other line ends the
connection. Protocol 1 (sparkdiag before issue 29) had no authentication, protocol 2 no mac after
the handshake; none of them talks to another: both sides must run the same sparkdiag.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from typing import Any

from sparkdiag import safeload
from sparkdiag.link import auth

VERSION = 3  # 2: no mac after the handshake (sparkdiag before the session key)
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


class MacError(ProtocolError):
    """A control line after the proofs without its mac, or with one that does not match."""


class Sealed:
    """One side of a control connection after the proofs. Every line it sends carries ``mac``:
    :func:`sparkdiag.link.auth.mac` under the session key of this side's ``role``, its count of
    lines sent so far (from 0: the hello is the listening side's 0) and the line without
    ``mac``. Every line it reads must carry the other side's, by the count of lines read so far:
    a line altered, replayed, reordered, or one that follows a dropped line, raises
    :class:`MacError`, and the connection is to be closed (the counts no longer agree)."""

    def __init__(self, sock: socket.socket, reader: LineReader, key: bytes, role: str) -> None:
        self.sock = sock
        self.reader = reader
        self._key = key
        self.role = role
        self.peer = "client" if role == "server" else "server"
        self.sent = 0
        self.received = 0

    def seal(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """``message`` with its mac, counted as sent. The mac is of the message as the other
        side will read it (a tuple as a list, a key as a string)."""
        read: dict[str, Any] = json.loads(encode(dict(message)))
        sealed = {**read, auth.MAC: auth.mac(self._key, self.role, self.sent, read)}
        self.sent += 1
        return sealed

    def send(self, message: Mapping[str, Any]) -> None:
        send(self.sock, self.seal(message))

    def check(self, message: dict[str, Any]) -> dict[str, Any]:
        """``message`` as read, without its mac, counted; MacError when the mac is not the
        other side's for it at this count."""
        given = message.get(auth.MAC)
        which = f"the {self.peer}'s line {self.received}"
        if given is None:
            raise MacError(f"{which} came without its mac")
        if not auth.valid_mac(self._key, self.peer, self.received, message, given):
            raise MacError(
                f"{which} does not match its mac (altered on the way, or replayed, reordered or "
                "one before it dropped)"
            )
        self.received += 1
        return {key: value for key, value in message.items() if key != auth.MAC}

    def read(self, timeout: float | None) -> dict[str, Any]:
        return self.check(self.reader.read(timeout))
