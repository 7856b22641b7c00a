"""A connection's byte channel: what every channel offers, and plain TCP. TLS, through
``ssl.SSLObject`` on memory buffers, is :mod:`sparkdiag.web.tls`, imported at the first TLS
connection; ``ssl`` (OpenSSL, some 5 MiB resident) loads only where a web config turns TLS on.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import ssl

READ_CHUNK = 16384  # bytes read from a socket at once (one TLS record at most)
TLS_HANDSHAKE = 0x16  # first byte of a TLS record carrying a ClientHello


@dataclass(frozen=True)
class Tls:
    """What a new TLS connection is served with: the context and, where the web config lists
    ``client_allowed_sans``, the subject alternative names of which the client's certificate
    must carry one."""

    context: ssl.SSLContext
    allowed_sans: frozenset[str] | None = None


TlsProvider = Callable[[], Tls | None]  # None: refuse new TLS connections for now


class Closed(Exception):
    """The client went away or broke the protocol; close without an answer."""


class Channel(Protocol):
    async def recv(self) -> bytes: ...
    async def send(self, data: bytes) -> None: ...


class Plain:
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
