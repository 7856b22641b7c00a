#!/usr/bin/env python3
"""Benchmark: what one ``sparkdiag link test`` costs, and whether its own TCP streams are the
bottleneck, on loopback.

Prints figures; asserts nothing.

    python benchmarks/link_cost.py [--rounds 5] [--seconds 2] [--streams 4] [--json out.json]

1. Cost: one measurement as ``link test`` makes it by default (latency, then sparkdiag's TCP
   streams to and from the peer, ``--no-tools``), against ``link serve`` running as its own
   process on 127.0.0.1: wall time, and the CPU seconds of the measuring process and of the
   listening one (``/proc/PID/stat`` utime + stime).
2. Throughput against iperf3 on the same pair (127.0.0.1), in the same run, alternating
   (sparkdiag, iperf3, sparkdiag, iperf3, ...) so that both see the same load: the same number
   of streams for the same seconds, one direction (to the peer), each figure counted by its
   receiver. The ratio sparkdiag/iperf3 of each adjacent pair, and their median.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sparkdiag.link import tools  # noqa: E402
from sparkdiag.link.client import Options, measure_link  # noqa: E402

SYSFS = Path("/sys")
ROOTFS = Path("/")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (``cat /proc/PID/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def start_server(port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkdiag", "link", "serve", "--listen", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if "listening on" not in line:
        raise SystemExit(f"link serve did not start: {line}{proc.stderr.read()}")
    return proc


def sparkdiag_once(port: int, options: Options) -> dict[str, Any]:
    started, cpu0 = time.monotonic(), own_cpu()
    report = measure_link("127.0.0.1", options, SYSFS, ROOTFS, dict(os.environ))
    wall, cpu = time.monotonic() - started, own_cpu() - cpu0
    (path,) = report.paths
    figures = {f"{t.direction}": t.gbps for t in path.throughput}
    return {"wall_s": wall, "cpu_s": cpu, "gbps": figures, "latency": path.latency}


def iperf3_once(port: int, seconds: float, streams: int) -> float | None:
    argv = tools.iperf3_client("127.0.0.1", port, seconds, streams, False, None)
    gbps, error = tools.parse_iperf3(tools.run(argv, seconds + 15).output)
    if error:
        print(f"  iperf3: {error}", file=sys.stderr)
    return gbps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    port = tools.free_port("127.0.0.1")
    server = start_server(port)
    out: dict[str, Any] = {"cpus": os.cpu_count(), "seconds": args.seconds, "streams": args.streams}
    try:
        # 1. one default measurement (both directions, sparkdiag's streams only)
        cpu0 = cpu_of(server.pid)
        cost = sparkdiag_once(
            port, Options(port=port, seconds=args.seconds, streams=args.streams, use_tools=False)
        )
        cost["server_cpu_s"] = cpu_of(server.pid) - cpu0
        lat = cost.pop("latency")
        out["cost"] = {**cost, "latency_median_us": lat.median_us if lat else None}
        print(
            f"one measurement (latency + {args.seconds:g} s each way, {args.streams} streams): "
            f"{cost['wall_s']:.2f} s wall; CPU {cost['cpu_s']:.2f} s measuring side, "
            f"{cost['server_cpu_s']:.2f} s listening side; "
            f"to peer {cost['gbps'].get('to-peer', 0):.2f} Gb/s, "
            f"from peer {cost['gbps'].get('from-peer', 0):.2f} Gb/s; "
            f"latency median {out['cost']['latency_median_us'] or 0:.0f} µs"
        )
        # 2. against iperf3, alternating, same pair, same streams and seconds
        if shutil.which("iperf3") is None:
            print("iperf3 is not installed: no comparison")
            return
        iperf_port = tools.free_port("127.0.0.1")
        iperf = subprocess.Popen(
            ["iperf3", "-s", "-B", "127.0.0.1", "-p", str(iperf_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while not tools.port_taken("127.0.0.1", iperf_port):
                time.sleep(0.05)
            one_way = Options(
                port=port,
                seconds=args.seconds,
                streams=args.streams,
                directions=("to-peer",),
                use_tools=False,
            )
            pairs = []
            for n in range(args.rounds):
                ours = sparkdiag_once(port, one_way)["gbps"].get("to-peer")
                theirs = iperf3_once(iperf_port, args.seconds, args.streams)
                ratio = ours / theirs if ours and theirs else None
                pairs.append({"sparkdiag_gbps": ours, "iperf3_gbps": theirs, "ratio": ratio})
                print(
                    f"round {n + 1}: sparkdiag {ours or 0:.2f} Gb/s, iperf3 {theirs or 0:.2f} "
                    f"Gb/s, ratio {ratio or 0:.2f}"
                )
            ratios = [p["ratio"] for p in pairs if p["ratio"]]
            out["rounds"] = pairs
            out["median_ratio"] = statistics.median(ratios) if ratios else None
            if ratios:
                print(
                    f"sparkdiag/iperf3: median {statistics.median(ratios):.2f}, "
                    f"min {min(ratios):.2f}, max {max(ratios):.2f} ({len(ratios)} pairs)"
                )
        finally:
            iperf.terminate()
            iperf.wait()
    finally:
        server.terminate()
        server.wait()
        if args.json:
            args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
