#!/usr/bin/env python3
"""Benchmark: /metrics scrape latency against ``nvidia-smi --query-gpu``, and the daemon's cost.

Prints figures; asserts nothing (performance goals live here, not in timed tests).

    python benchmarks/scrape_latency.py --fixture tests/fixtures/nvml/h200-x8.json --real \
        --scrapes 500 --fresh 30 --soak 60 --json out.json

* scrape latency: p50/p99 of sequential GETs of /metrics over one keep-alive-less connection
  each (as Prometheus does per scrape), for every target (each fixture given, and the real GPU
  with --real);
* --fresh N: N rounds, each 1-2 poll intervals after the last (a random phase, as Prometheus'
  scrapes fall against the 1 s poll), of the first scrape of a new snapshot (checked by its
  ``sparkdiag_last_poll_timestamp_seconds``) and a back-to-back scrape of the same snapshot,
  both as Prometheus 2.42 asks (gzip): p50/p99 of each and the ratio;
* nvidia-smi: p50/p99 of ``nvidia-smi --query-gpu=<the same fields> --format=csv`` in the same
  run, and the ratio to the real-GPU scrape (skipped where nvidia-smi is absent);
* soak: the daemon's peak RSS and CPU share (percent of one core) over --soak seconds at the
  default 1 s polling, scraped every 15 s like a Prometheus would;
* --compat-dcgm: for each fixture, a daemon without and one with ``--compat.dcgm``, scraped in
  alternating pairs: p50 of each and the median of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks.common
from benchmarks.common import SMI_FIELDS, fetch, poll_time  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_daemon(args: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = [sys.executable, "-m", "sparkdiag", "serve", "--listen", f"127.0.0.1:{port}", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if get(port, "/healthz")[0] == 200:
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"daemon {args} did not become healthy")


def get(port: int, path: str) -> tuple[int, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, len(resp.read())
    finally:
        conn.close()


PROMETHEUS = {  # what Prometheus 2.42 sends with each scrape
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


def get_poll(port: int) -> tuple[float, float]:
    """One Prometheus-like GET /metrics: (seconds, the poll timestamp it shows)."""
    took, body = fetch(port, PROMETHEUS)
    shown = poll_time(body)
    if shown is None:
        raise SystemExit("no sparkdiag_last_poll_timestamp_seconds in the scrape")
    return took, shown


def time_fresh(port: int, rounds: int) -> dict[str, Any]:
    """First scrapes of a new snapshot against back-to-back ones, in the same rounds."""
    rng = random.Random(23)
    first: list[float] = []
    again: list[float] = []
    last = get_poll(port)[1]
    for _ in range(rounds):
        time.sleep(1.0 + rng.random())
        took, seen = get_poll(port)
        if seen > last:  # else no poll since the last round: not a new snapshot
            first.append(took)
        last = seen
        again.append(get_poll(port)[0])
    f, a = percentiles(first), percentiles(again)
    return {"first": f, "back_to_back": a, "left_out": rounds - len(first),
            "first_over_back_to_back_p50": f["p50_ms"] / a["p50_ms"],
            "first_over_back_to_back_p99": f["p99_ms"] / a["p99_ms"]}  # fmt: skip


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    return {"p50_ms": pct(50) * 1e3, "p99_ms": pct(99) * 1e3, "n": len(ordered)}


def time_scrapes(port: int, n: int) -> dict[str, float]:
    get(port, "/metrics")  # warm
    samples = []
    size = 0
    for _ in range(n):
        start = time.perf_counter()
        status, size = get(port, "/metrics")
        samples.append(time.perf_counter() - start)
        assert status == 200
    return {**percentiles(samples), "bytes": size}


def time_nvidia_smi(n: int) -> dict[str, float] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    cmd = ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"]
    subprocess.run(cmd, check=True, capture_output=True)
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    return percentiles(samples)


def time_compat_pairs(args: list[str], n: int) -> dict[str, float]:
    """Scrapes of a daemon without and one with --compat.dcgm, alternating (noisy machines)."""
    daemons = [start_daemon(args), start_daemon([*args, "--compat.dcgm"])]
    try:
        ports = [port for _, port in daemons]
        for port in ports:
            get(port, "/metrics")  # warm
        samples: list[list[float]] = [[], []]
        for index in range(2 * n):
            which = (index + index // 2) % 2  # off on, on off, off on ...
            start = time.perf_counter()
            status, _ = get(ports[which], "/metrics")
            samples[which].append(time.perf_counter() - start)
            assert status == 200
        ratios = sorted(on / off for off, on in zip(*samples, strict=True))
        return {
            "off_p50_ms": percentiles(samples[0])["p50_ms"],
            "on_p50_ms": percentiles(samples[1])["p50_ms"],
            "on_over_off_median": ratios[len(ratios) // 2],
            "off_bytes": get(ports[0], "/metrics")[1],
            "on_bytes": get(ports[1], "/metrics")[1],
            "pairs": n,
        }
    finally:
        for proc, _ in daemons:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)


def soak(args: list[str], seconds: float) -> dict[str, float]:
    proc, port = start_daemon(args)
    try:
        ps = psutil.Process(proc.pid)
        time.sleep(2)  # past start-up
        t0 = ps.cpu_times()
        w0 = time.monotonic()
        peak_rss = 0
        next_scrape = w0
        while (elapsed := time.monotonic() - w0) < seconds:
            peak_rss = max(peak_rss, ps.memory_info().rss)
            if time.monotonic() >= next_scrape:
                get(port, "/metrics")
                next_scrape += 15
            time.sleep(min(1.0, max(0.0, seconds - elapsed)))
        t1 = ps.cpu_times()
        wall = time.monotonic() - w0
        cpu = (t1.user + t1.system) - (t0.user + t0.system)
        return {
            "seconds": wall,
            "cpu_percent_of_one_core": 100 * cpu / wall,
            "peak_rss_mb": peak_rss / 2**20,
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixture", action="append", default=[], help="NVML fixture target")
    parser.add_argument("--real", action="store_true", help="also benchmark the real GPU")
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--fresh", type=int, default=0, help="rounds of a new snapshot's scrape")
    parser.add_argument("--smi-runs", type=int, default=30)
    parser.add_argument("--soak", type=float, default=60.0, help="seconds; 0 to skip")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument(
        "--soak-arg",
        action="append",
        default=[],
        help="extra serve argument for the soak daemon (repeatable), "
        "e.g. --soak-arg=--no-probe.enabled",
    )
    parser.add_argument(
        "--compat-dcgm", action="store_true", help="also time --compat.dcgm against off, in pairs"
    )
    opts = parser.parse_args()

    results: dict[str, Any] = {"scrape": {}, "host": os.uname().nodename}
    targets = [(Path(f).stem, ["--nvml-fixture", f]) for f in opts.fixture]
    if opts.real:
        targets.append(("real-gpu", []))
    for name, args in targets:
        proc, port = start_daemon(args)
        try:
            results["scrape"][name] = time_scrapes(port, opts.scrapes)
            if opts.fresh:
                results.setdefault("fresh", {})[name] = time_fresh(port, opts.fresh)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    if opts.compat_dcgm:
        results["compat_dcgm"] = {
            name: time_compat_pairs(args, opts.scrapes) for name, args in targets
        }
    smi = time_nvidia_smi(opts.smi_runs)
    results["nvidia_smi"] = smi
    if opts.soak > 0:
        soak_args = [] if opts.real else ["--nvml-fixture", opts.fixture[0]]
        soak_args += opts.soak_arg
        results["soak"] = {"target": "real-gpu" if opts.real else opts.fixture[0]}
        results["soak"].update(soak(soak_args, opts.soak))

    print(f"{'target':<16} {'p50 ms':>8} {'p99 ms':>8} {'bytes':>8}")
    for name, fig in results["scrape"].items():
        print(f"{name:<16} {fig['p50_ms']:8.2f} {fig['p99_ms']:8.2f} {fig['bytes']:8d}")
    for name, fig in results.get("fresh", {}).items():
        f, a = fig["first"], fig["back_to_back"]
        print(
            f"{name} (gzip): first scrape of a new snapshot p50 {f['p50_ms']:.2f} / p99 "
            f"{f['p99_ms']:.2f} ms (n={f['n']}, {fig['left_out']} left out: no new poll); "
            f"back-to-back {a['p50_ms']:.2f} / {a['p99_ms']:.2f} ms; first / back-to-back "
            f"p50 {fig['first_over_back_to_back_p50']:.2f}x, "
            f"p99 {fig['first_over_back_to_back_p99']:.2f}x"
        )
    for name, fig in results.get("compat_dcgm", {}).items():
        print(
            f"{name} --compat.dcgm: p50 {fig['off_p50_ms']:.2f} ms off, {fig['on_p50_ms']:.2f} ms "
            f"on, on/off {fig['on_over_off_median']:.3f} (median of {fig['pairs']} pairs); "
            f"{fig['off_bytes']} -> {fig['on_bytes']} bytes"
        )
    if smi:
        print(f"{'nvidia-smi':<16} {smi['p50_ms']:8.2f} {smi['p99_ms']:8.2f}")
        real = results["scrape"].get("real-gpu")
        if real:
            ratio = smi["p50_ms"] / real["p50_ms"]
            results["smi_over_scrape_p50"] = ratio
            print(f"nvidia-smi p50 / real-GPU scrape p50 = {ratio:.1f}x")
    else:
        print("nvidia-smi: not found here, comparison skipped")
    if "soak" in results:
        s = results["soak"]
        print(
            f"soak {s['target']}: {s['seconds']:.0f} s at 1 s polling: peak RSS "
            f"{s['peak_rss_mb']:.1f} MB, CPU {s['cpu_percent_of_one_core']:.2f} % of one core"
        )
    if opts.json:
        opts.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
