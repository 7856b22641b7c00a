"""TLS over a non-blocking socket through ``ssl.SSLObject`` on memory buffers, and the check of
a client certificate's names. Imported at the first TLS connection (``ssl`` itself, which
loads OpenSSL, comes with a web config that turns TLS on: :mod:`sparkdiag.web.webconfig`).

A TLS connection holds no TLS state until its first byte arrives (:class:`TlsChannel` is made
then), and no buffer larger than one read of ``READ_CHUNK`` bytes: nothing is read ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import ssl

from sparkdiag.web.channels import READ_CHUNK, Closed


class TlsChannel:
    """TLS over a non-blocking socket through memory buffers; nothing is read ahead."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=True)

    async def handshake(self, first: bytes) -> None:
        self.incoming.write(first)
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                data = await self.loop.sock_recv(self.sock, READ_CHUNK)
                if not data:
                    raise Closed("closed during the TLS handshake") from None
                self.incoming.write(data)
            except ssl.SSLError:
                with contextlib.suppress(OSError):
                    await self._flush()  # the alert that says why, as far as it goes
                raise
        await self._flush()

    async def recv(self) -> bytes:
        while True:
            try:
                data = self.obj.read(READ_CHUNK)
            except ssl.SSLWantReadError:
                await self._flush()
                raw = await self.loop.sock_recv(self.sock, READ_CHUNK)
                if not raw:
                    return b""
                self.incoming.write(raw)
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
            if self.outgoing.pending:
                await self._flush()
            return data

    async def send(self, data: bytes) -> None:
        self.obj.write(data)
        await self._flush()

    async def _flush(self) -> None:
        out = self.outgoing.read()
        if out:
            await self.loop.sock_sendall(self.sock, out)


def san_allowed(obj: ssl.SSLObject, allowed: frozenset[str]) -> bool:
    """Whether the verified client certificate names one of ``allowed`` among its DNS names,
    e-mail addresses, IP addresses or URIs (exporter-toolkit's rule)."""
    cert = obj.getpeercert()
    if not cert:
        return False
    for entry in cert.get("subjectAltName", ()):
        kind, value = str(entry[0]), str(entry[1])
        if kind == "IP Address":
            with contextlib.suppress(ValueError):
                value = str(ipaddress.ip_address(value.strip()))
        if value in allowed:
            return True
    return False
