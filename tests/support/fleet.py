"""A stand-in Prometheus HTTP API for ``sparkdiag fleet`` (answers chosen per query) and the
peer rules' answers for a list of GPUs: tests/test_fleet.py, tests/test_terminal.py and
scripts/term_widths.py share them."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[str], tuple[int, bytes]]
H200 = {"name": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0", "driver": "580.159.04",
        "context": "native"}  # fmt: skip
GPU = {"instance": "h200:10942", "job": "sparkdiag", "gpu": "0",
       "uuid": "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"}  # fmt: skip
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
