#!/usr/bin/env python3
"""sparkdiag's scrape latency against nvitop-exporter and ``nvidia-smi --query-gpu``, on the GPU.

Issue 23's target: sparkdiag p50 and p99 each at least 1.5x faster than nvitop-exporter.

On the lent H200 (about 90 s of device time), from the checkout, with the wheels in ``.whl``::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:$PWD python3 scripts/device/scrape_peers.py --out $OUT

Here, on CPU (no nvitop-exporter, no nvidia-smi: those rows are skipped)::

    python scripts/device/scrape_peers.py --nvml-fixture tests/fixtures/nvml/h200-idle.json \\
        --out /tmp/peers --scrapes 60 --cold 3 --idle 3

What it does, all in one run: starts ``sparkdiag serve --no-probe.enabled`` and
``nvitop-exporter`` side by side on loopback, waits for both, then ``--scrapes`` GETs of
``/metrics`` each (a new connection each), in alternating blocks of 10, once with no request
headers and once with Prometheus 2.42's (``Accept`` preferring OpenMetrics, ``Accept-Encoding:
gzip``); ``--scrapes`` runs of ``nvidia-smi --query-gpu`` with the 23 fields of
benchmarks/scrape_latency.py; ``--cold`` sparkdiag scrapes spaced past the 1 s poll (each
renders a new snapshot: back-to-back scrapes share one render); then each exporter's CPU and
RSS over ``--idle`` seconds while scraped every 5 s. Writes ONE archive,
``$OUT/scrape_peers.tar.gz``, with ``results.json`` (every sample), ``summary.txt`` (what it
printed) and both exporters' logs.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks.common
from benchmarks.common import SMI_FIELDS, stop  # noqa: E402

PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
    "User-Agent": "Prometheus/2.42.0",
}
MODES = {"plain": {}, "prometheus": PROMETHEUS_HEADERS}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, headers: dict[str, str]) -> tuple[int, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        return resp.status, len(resp.read())
    finally:
        conn.close()


@contextlib.contextmanager
def exporter(name: str, cmd: list[str], port: int, logs: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = (logs / f"{name}.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}; see {name}.log")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if get(port, {})[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not answer /metrics within 60 s")
            time.sleep(0.1)
        time.sleep(1.5)  # past the first polls
        yield proc
    finally:
        stop(proc)
        log.close()


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def figures(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": pct(samples, 50) * 1e3, "p99_ms": pct(samples, 99) * 1e3, "n": len(samples)}


def proc_usage(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MiB) of a process from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(stat[11]) + int(stat[12])) / ticks
    rss = int(stat[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return cpu, rss


def idle_cost(pid: int, port: int, seconds: float) -> dict[str, float]:
    cpu0, _ = proc_usage(pid)
    start = time.monotonic()
    peak = 0.0
    next_scrape = start
    while time.monotonic() - start < seconds:
        if time.monotonic() >= next_scrape:
            get(port, PROMETHEUS_HEADERS)
            next_scrape += 5
        peak = max(peak, proc_usage(pid)[1])
        time.sleep(0.5)
    cpu1, rss = proc_usage(pid)
    wall = time.monotonic() - start
    return {"cpu_percent_of_one_core": 100 * (cpu1 - cpu0) / wall, "rss_mib": rss,
            "peak_rss_mib": peak, "seconds": wall}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--nvml-fixture", help="run sparkdiag on a fixture (CPU check)")
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--cold", type=int, default=20)
    parser.add_argument("--idle", type=float, default=20.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    printed = io.StringIO()

    def say(line: str) -> None:
        print(line, flush=True)
        printed.write(line + "\n")

    results: dict[str, Any] = {"host": os.uname().nodename, "python": sys.version.split()[0]}
    with tempfile.TemporaryDirectory(prefix="scrape-peers-") as tmp:
        logs = Path(tmp)
        ports = {"sparkdiag": free_port(), "nvitop-exporter": free_port()}
        spark_cmd = [sys.executable, "-m", "sparkdiag", "serve", "--no-probe.enabled",
                     "--listen", f"127.0.0.1:{ports['sparkdiag']}"]  # fmt: skip
        if args.nvml_fixture:
            spark_cmd += ["--nvml-fixture", args.nvml_fixture]
        nvitop_cmd = [sys.executable, "-m", "nvitop_exporter", "--bind-address", "127.0.0.1",
                      "--port", str(ports["nvitop-exporter"])]  # fmt: skip
        have_nvitop = not args.nvml_fixture and _importable("nvitop_exporter")
        with contextlib.ExitStack() as stack:
            procs = {"sparkdiag": stack.enter_context(
                exporter("sparkdiag", spark_cmd, ports["sparkdiag"], logs))}  # fmt: skip
            if have_nvitop:
                procs["nvitop-exporter"] = stack.enter_context(
                    exporter("nvitop-exporter", nvitop_cmd, ports["nvitop-exporter"], logs)
                )
            else:
                say("nvitop-exporter: not run (fixture run, or not importable)")
            samples: dict[str, dict[str, list[float]]] = {m: {n: [] for n in procs} for m in MODES}
            sizes: dict[str, dict[str, int]] = {m: {} for m in MODES}
            for mode, headers in MODES.items():
                for name in procs:
                    get(ports[name], headers)  # warm
                for block in range(0, args.scrapes, 10):
                    order = list(procs) if (block // 10) % 2 == 0 else list(procs)[::-1]
                    for name in order:
                        for _ in range(min(10, args.scrapes - block)):
                            start = time.perf_counter()
                            status, size = get(ports[name], headers)
                            samples[mode][name].append(time.perf_counter() - start)
                            assert status == 200, (name, status)
                            sizes[mode][name] = size
            results["scrapes"] = {
                m: {n: {**figures(v), "bytes": sizes[m][n]} for n, v in by.items()}
                for m, by in samples.items()
            }
            results["samples_s"] = samples
            cold = []
            for _ in range(args.cold):
                time.sleep(1.05)
                start = time.perf_counter()
                get(ports["sparkdiag"], PROMETHEUS_HEADERS)
                cold.append(time.perf_counter() - start)
            if cold:
                results["sparkdiag_new_snapshot"] = figures(cold)
            results["idle"] = {n: idle_cost(p.pid, ports[n], args.idle) for n, p in procs.items()}
        smi = shutil.which("nvidia-smi")
        if smi and not args.nvml_fixture:
            cmd = [smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"]
            subprocess.run(cmd, check=True, capture_output=True)
            times = []
            for _ in range(args.scrapes):
                start = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True)
                times.append(time.perf_counter() - start)
            results["nvidia_smi"] = figures(times)
        else:
            say("nvidia-smi: not run")
        for mode, by in results["scrapes"].items():
            for name, fig in by.items():
                p50, p99 = fig["p50_ms"], fig["p99_ms"]
                say(f"{mode:<10} {name:<16} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  "
                    f"{fig['bytes']} bytes")  # fmt: skip
            if "nvitop-exporter" in by:
                s, n = by["sparkdiag"], by["nvitop-exporter"]
                r50, r99 = n["p50_ms"] / s["p50_ms"], n["p99_ms"] / s["p99_ms"]
                say(f"{mode:<10} nvitop-exporter / sparkdiag: p50 {r50:.2f}x, p99 {r99:.2f}x "
                    "(target: each at least 1.5x)")  # fmt: skip
        if "sparkdiag_new_snapshot" in results:
            c = results["sparkdiag_new_snapshot"]
            say(f"sparkdiag, each scrape a new snapshot: p50 {c['p50_ms']:.2f} ms, "
                f"p99 {c['p99_ms']:.2f} ms (n={c['n']})")  # fmt: skip
        if "nvidia_smi" in results:
            m = results["nvidia_smi"]
            say(f"nvidia-smi --query-gpu: p50 {m['p50_ms']:.2f} ms, p99 {m['p99_ms']:.2f} ms")
        for name, fig in results["idle"].items():
            say(f"idle {name}: CPU {fig['cpu_percent_of_one_core']:.2f} % of a core, RSS "
                f"{fig['rss_mib']:.1f} MiB (peak {fig['peak_rss_mib']:.1f})")  # fmt: skip
        (logs / "results.json").write_text(json.dumps(results, indent=1))
        (logs / "summary.txt").write_text(printed.getvalue())
        archive = args.out / "scrape_peers.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            for path in sorted(logs.iterdir()):
                tar.add(path, arcname=f"scrape_peers/{path.name}")
        print(f"wrote {archive}")


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    main()
