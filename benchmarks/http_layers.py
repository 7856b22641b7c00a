#!/usr/bin/env python3
"""Benchmark: three HTTP layers side by side, serving the same bytes, in one run.

The choice of issue 23 item 1: the hand-written asyncio parser sparkdiag had (taken from git,
``--old-commit``), the h11-based server it has now (``sparkdiag/web/serving.py``), and
aiohttp's low-level server. Each serves one static body (the 8-GPU fixture's scrape, rendered
once) from its own process, so RSS is its own; rounds alternate between the layers so that
the noise of a shared machine falls on all three alike. Prints medians over the rounds:

* scrape: p50/p99 of sequential GETs, a new connection each (as the other benchmarks do);
* burst: wall time of 200 simultaneous GETs and how many got 200;
* memory: RSS after start (imports included) and beside 700 idle connections.

    python benchmarks/http_layers.py --rounds 5      # needs h11 and aiohttp installed

Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import importlib.util
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks.common
from benchmarks.common import stop  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "nvml" / "h200-x8.json"
LAYERS = ("old-asyncio", "h11", "aiohttp")


def body_bytes() -> bytes:
    out = subprocess.run(
        [sys.executable, "-m", "sparkdiag", "dump", "--nvml-fixture", str(FIXTURE)],
        capture_output=True, check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    ).stdout  # fmt: skip
    return out


def serve(kind: str, port: int, body_file: Path, old_module: Path) -> None:
    body = body_file.read_bytes()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    if kind == "aiohttp":
        from aiohttp import web

        async def handle(_request: Any) -> Any:
            return web.Response(body=body, content_type="text/plain", charset="utf-8")

        async def main() -> None:
            server = web.Server(handle)
            await asyncio.get_running_loop().create_server(server, sock=sock, backlog=1024)
            await asyncio.Event().wait()

        asyncio.run(main())
        return
    if kind == "h11":
        from sparkdiag.web import serving as module
    else:
        spec = importlib.util.spec_from_file_location("old_serving", old_module)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["old_serving"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)

    async def handler(_request: Any) -> Any:
        return module.Response(200, body, "text/plain; version=0.0.4; charset=utf-8")

    async def run() -> None:
        limits = module.Limits(timeout=10.0, max_connections=2000, backlog=1024)
        await module.HttpServer(sock, handler, limits).serve(asyncio.Event())

    asyncio.run(run())


@contextlib.contextmanager
def server(kind: str, body_file: Path, old_module: Path) -> Iterator[tuple[int, int]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    cmd = [sys.executable, __file__, "--serve", kind, str(port), str(body_file), str(old_module)]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                if get(port)[0] == 200:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"{kind} did not start")
            time.sleep(0.05)
        yield port, proc.pid
    finally:
        stop(proc)


def get(port: int, timeout: float = 30) -> tuple[int, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        return resp.status, len(resp.read())
    finally:
        conn.close()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def measure(port: int, pid: int, scrapes: int, burst: int, idle: int) -> dict[str, float]:
    rss_start = rss_mib(pid)
    get(port)
    times = []
    for _ in range(scrapes):
        start = time.perf_counter()
        status, _ = get(port)
        times.append(time.perf_counter() - start)
        assert status == 200
    results: list[int] = []
    barrier = threading.Barrier(burst)

    def one() -> None:
        barrier.wait()
        try:
            results.append(get(port, 60)[0])
        except OSError:
            results.append(0)

    threads = [threading.Thread(target=one) for _ in range(burst)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    burst_wall = time.perf_counter() - start
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(idle)]
    time.sleep(1.0)
    rss_idle = rss_mib(pid)
    for sock in socks:
        sock.close()
    return {
        "p50_ms": pct(times, 50) * 1e3,
        "p99_ms": pct(times, 99) * 1e3,
        "burst_s": burst_wall,
        "burst_200": float(results.count(200)),
        "rss_start": rss_start,
        "rss_idle": rss_idle,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--idle", type=int, default=700)
    parser.add_argument("--old-commit", default="84844b1", help="commit with the old parser")
    parser.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        kind, port, body_file, old_module = args.serve
        serve(kind, int(port), Path(body_file), Path(old_module))
        return
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    with tempfile.TemporaryDirectory(prefix="http-layers-") as tmp:
        body_file, old_module = Path(tmp) / "body", Path(tmp) / "old_serving.py"
        body_file.write_bytes(body_bytes())
        old_module.write_text(subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{args.old_commit}:sparkdiag/web/serving.py"],
            capture_output=True, text=True, check=True,
        ).stdout)  # fmt: skip
        size = body_file.stat().st_size
        load = os.getloadavg()[0]
        print(f"body {size} bytes; {os.cpu_count()} CPUs, load {load:.2f}; {args.rounds} rounds")
        figures: dict[str, list[dict[str, float]]] = {kind: [] for kind in LAYERS}
        for round_no in range(args.rounds):
            order = LAYERS if round_no % 2 == 0 else LAYERS[::-1]
            for kind in order:
                with server(kind, body_file, old_module) as (port, pid):
                    figures[kind].append(measure(port, pid, args.scrapes, args.burst, args.idle))
    keys = ("p50_ms", "p99_ms", "burst_s", "burst_200", "rss_start", "rss_idle")
    print(f"{'layer':<12}" + "".join(f"{k:>11}" for k in keys) + "   (medians over rounds)")
    medians = {k: {key: statistics.median(r[key] for r in v) for key in keys}
               for k, v in figures.items()}  # fmt: skip
    for kind in LAYERS:
        print(f"{kind:<12}" + "".join(f"{medians[kind][key]:11.2f}" for key in keys))
    base = medians["old-asyncio"]
    for kind in ("h11", "aiohttp"):
        ratios = ", ".join(f"{key} {medians[kind][key] / base[key]:.2f}x" for key in keys[:3])
        print(f"{kind} / old-asyncio: {ratios}")


if __name__ == "__main__":
    main()
