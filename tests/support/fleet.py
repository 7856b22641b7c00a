"""A stand-in Prometheus HTTP API for ``sparkdiag fleet`` (answers chosen per query), a hostile
one that writes raw bytes (:func:`raw_server`), and the peer rules' answers for a list of GPUs:
tests/test_fleet.py, tests/test_fleet_hostile.py, tests/test_terminal.py and
scripts/term_widths.py share them."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[str], tuple[int, bytes]]
H200 = {
    "name": "NVIDIA H200",
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "driver": "580.159.04",
    "context": "native",
}
GPU = {
    "instance": "h200:10942",
    "job": "sparkdiag",
    "gpu": "0",
    "uuid": "GPU-979ad365-0b73-a0ac-74a2-3520b773d460",
}
KERNEL = {"dtype": "bf16", "shape": "8192x8192x8192"}


def vector(*samples: tuple[dict[str, str], float]) -> bytes:
    result = [{"metric": m, "value": [1700000000.0, str(v)]} for m, v in samples]
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}
    ).encode()


@contextlib.contextmanager
def stand_in(answer: Answer) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            status, body = answer(query.get("query", [""])[0])
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


Sample = tuple[dict[str, str], float]


def peer_answers(rows: Sequence[Sample], group: int | None = None) -> dict[str, bytes]:
    """The peers rule group's answers for ``rows`` (a GPU's labels and its ratio to its peers) of
    one H200 group at the bf16 compute cube (median 725 TFLOPS)."""
    size = len(rows) if group is None else group
    return {
        "sparkdiag:gemm_tflops:peer_ratio": vector(*rows),
        "sparkdiag:gemm_tflops:peer_score": vector(*[(m, (r - 1) * 100) for m, r in rows]),
        "sparkdiag:gemm_tflops:median_1h": vector(*[(m, 725 * r) for m, r in rows]),
        "sparkdiag:gemm_tflops:peer_median_1h": vector(({**H200, **KERNEL}, 725.0)),
        "sparkdiag:gemm_tflops:peer_group_gpus": vector(({**H200, **KERNEL}, float(size))),
    }


Raw = Callable[[bytes, socket.socket], None]


@contextlib.contextmanager
def raw_server(respond: Raw, tls: ssl.SSLContext | None = None) -> Iterator[RawServer]:
    """A hostile stand-in at the byte level: for each connection, ``respond(request head,
    socket)`` writes whatever it likes (a malformed status line, a redirect, one byte a
    second); the heads it was sent are kept in ``heads``. TLS with ``tls``."""
    listener = socket.create_server(("127.0.0.1", 0))
    server = RawServer(listener.getsockname()[1], tls is not None)
    stop = threading.Event()

    def one(conn: socket.socket) -> None:
        with contextlib.suppress(OSError, ssl.SSLError), conn:
            if tls is not None:
                conn = tls.wrap_socket(conn, server_side=True)
            conn.settimeout(10)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            server.heads.append(head)
            respond(head, conn)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # shut down: the server is done
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        # wakes the accept at once (Linux): a 0.2 s accept timeout polled for the stop before,
        # 0.1 s on average at the end of each of test_fleet_hostile's 37 tests
        listener.shutdown(socket.SHUT_RDWR)
        thread.join(5)
        listener.close()


@dataclass
class RawServer:
    port: int
    tls: bool
    heads: list[bytes] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def authorizations(self) -> list[bytes]:
        """The Authorization header of every request it was sent."""
        found = []
        for head in self.heads:
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"authorization":
                    found.append(value.strip())
        return found


def answer(status: str, body: bytes, *headers: str) -> bytes:
    """A whole HTTP/1.1 response with a Content-Length."""
    lines = [f"HTTP/1.1 {status}", *headers, f"Content-Length: {len(body)}", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def query_of(head: bytes) -> str:
    """The ``query`` parameter of the request line in ``head``."""
    target = head.split(b" ", 2)[1].decode("latin-1")
    return urllib.parse.parse_qs(urllib.parse.urlsplit(target).query).get("query", [""])[0]
