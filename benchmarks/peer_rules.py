#!/usr/bin/env python3
"""Benchmark: how the cost of the peer rules (group ``sparkdiag-peers`` of
prometheus/sparkdiag-rules.yml) grows with the fleet, in a real Prometheus.

Prints figures; asserts nothing.

    python benchmarks/peer_rules.py --gpus 8,100,1000 --json out.json

For each fleet size N it writes an hour of simulated series in the OpenMetrics text format and
backfills them (``promtool tsdb create-blocks-from openmetrics``): N H200s on N/8 nodes (eight per
node), every GPU with ``sparkdiag_gpu_info``, ``sparkdiag_probe_software_info`` and
``sparkdiag_gemm_tflops`` at the probe's kernels (by default the twelve compute-bound ones and
six decode shapes, which the rules select out), one sample every ``--interval`` seconds (a
scrape; the gauge holds the last probe), run-to-run noise of ±2 %, one GPU in 50 at 0.9. Then a
Prometheus (``--prometheus``, default the one on PATH) loads that TSDB and the shipped rules,
evaluates them every ``--every`` seconds, and the benchmark reads each evaluation's time of the
group and of its slowest rule from ``/api/v1/rules`` (Prometheus' own ``evaluationTime``), a
few evaluations per size, and prints the median and the maximum.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "prometheus" / "sparkdiag-rules.yml"
GROUP = "sparkdiag-peers"
DTYPES = ("bf16", "fp16", "tf32", "fp8", "int8", "int4")
SHAPES = {"compute": "8192x8192x8192", "llm": "4096x11008x4096", "decode": "1x8192x8192"}
LEVEL = {"bf16": 725.0, "fp16": 703.0, "tf32": 376.0, "fp8": 1346.0, "int8": 961.0, "int4": 29.0}


def kernels(decode: bool) -> list[tuple[str, str]]:
    kinds = ("compute", "llm", "decode") if decode else ("compute", "llm")
    return [(d, SHAPES[k]) for d in DTYPES for k in kinds]


def write_openmetrics(path: Path, gpus: int, interval: float, end: float, decode: bool) -> int:
    """An hour ending at ``end``; returns the number of series written."""
    rng = random.Random(gpus)
    steps = int(3600 // interval) + 1
    start = end - (steps - 1) * interval
    series = 0
    with path.open("w", encoding="utf-8") as out:
        families: dict[str, list[tuple[str, float | None]]] = {
            "sparkdiag_gpu_info": [],
            "sparkdiag_probe_software_info": [],
            "sparkdiag_gemm_tflops": [],
        }
        for g in range(gpus):
            node, index = divmod(g, 8)
            base = (f'instance="node-{node}:10942",job="sparkdiag",gpu="{index}",'
                    f'uuid="GPU-00000000-0000-0000-0000-{g:012d}"')  # fmt: skip
            families["sparkdiag_gpu_info"].append((
                f'{base},name="NVIDIA H200",pci_bus_id="00000000:{index:02X}:00.0",'
                'driver_version="580.159.04",cuda_capability="9.0",memory_model="dedicated"', None
            ))  # fmt: skip
            families["sparkdiag_probe_software_info"].append((
                f'{base},context="native",torch="2.11.0+cu130",cuda="13.0",cublas="13.1.0",'
                'driver="580.159.04"', None
            ))  # fmt: skip
            slow = 0.9 if g % 50 == 7 else 1.0
            for dtype, shape in kernels(decode):
                level = LEVEL[dtype] * slow if not shape.startswith("1x") else 4.0
                families["sparkdiag_gemm_tflops"].append(
                    (f'{base},dtype="{dtype}",shape="{shape}",context="native"', level)
                )
        for name, items in families.items():
            out.write(f"# TYPE {name} gauge\n")
            for labels, level in items:
                series += 1
                for step in range(steps):
                    at = start + step * interval
                    value = 1.0 if level is None else level * (1 + rng.uniform(-0.02, 0.02))
                    out.write(f"{name}{{{labels}}} {value:.3f} {at:.3f}\n")
        out.write("# EOF\n")
    return series


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rules_of_group() -> str:
    """Only the peers group: what is measured, and nothing else evaluated beside it."""
    text = RULES.read_text(encoding="utf-8")
    start = text.index(f"  - name: {GROUP}\n")
    end = text.find("\n  - name: ", start + 1)
    return "groups:\n" + text[start : len(text) if end < 0 else end + 1]


def evaluations(base: str, wanted: int, timeout: float) -> list[dict[str, Any]]:
    """``wanted`` distinct evaluations of the group, as /api/v1/rules reports them."""
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < wanted and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=10) as answer:
                groups = json.load(answer)["data"]["groups"]
        except OSError:
            time.sleep(0.5)
            continue
        for group in groups:
            last = group.get("lastEvaluation", "")
            if group["name"] == GROUP and not last.startswith("0001") and last not in seen:
                seen[last] = group
        time.sleep(0.3)
    return list(seen.values())


def measure(prometheus: str, promtool: str, gpus: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="peer-rules-") as tmp:
        work = Path(tmp)
        data = work / "series.om"
        now = time.time()
        began = time.monotonic()
        series = write_openmetrics(data, gpus, args.interval, now - 5, not args.no_decode)
        size = data.stat().st_size
        subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(data), str(work / "tsdb")],
            check=True, capture_output=True,
        )  # fmt: skip
        data.unlink()
        backfill = time.monotonic() - began
        (work / "rules.yml").write_text(rules_of_group(), encoding="utf-8")
        (work / "prometheus.yml").write_text(
            json.dumps(
                {
                    "global": {"evaluation_interval": f"{args.every:g}s"},
                    "rule_files": [str(work / "rules.yml")],
                }
            ),
            encoding="utf-8",
        )
        port = free_port()
        proc = subprocess.Popen(
            [prometheus, f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
             "--storage.tsdb.retention.time=30d", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            found = evaluations(f"http://127.0.0.1:{port}", args.evaluations + 1, args.timeout)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    found = found[1:]  # the first evaluation also warms the head and caches
    if not found:
        return {"gpus": gpus, "error": "no evaluation seen"}
    group = [g["evaluationTime"] for g in found]
    rules = {
        r["name"]: statistics.median([
            next(x["evaluationTime"] for x in g["rules"] if x["name"] == r["name"]) for g in found
        ])
        for r in found[0]["rules"]
    }  # fmt: skip
    firing = sum(len(r.get("alerts", [])) for r in found[-1]["rules"] if r["type"] == "alerting")
    return {
        "gpus": gpus,
        "series": series,
        "samples_per_series": int(3600 // args.interval) + 1,
        "openmetrics_bytes": size,
        "backfill_seconds": round(backfill, 1),
        "evaluations": len(group),
        "group_seconds_median": statistics.median(group),
        "group_seconds_max": max(group),
        "slowest_rule": max(rules, key=lambda k: rules[k]),
        "rule_seconds_median": rules,
        "alerts_pending_or_firing": firing,
        "health": sorted({r["health"] for r in found[-1]["rules"]}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="8,100,1000", help="fleet sizes, comma separated")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--every", type=float, default=5.0, help="rule evaluation interval")
    parser.add_argument("--evaluations", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--no-decode", action="store_true", help="compute-bound kernels only")
    parser.add_argument("--prometheus", default=os.environ.get("PROMETHEUS", "prometheus"))
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    prometheus, promtool = shutil.which(args.prometheus), shutil.which("promtool")
    if prometheus is None or promtool is None:
        print("needs prometheus and promtool (apt-get install prometheus)", file=sys.stderr)
        return 2
    results = []
    for gpus in (int(n) for n in args.gpus.split(",")):
        result = measure(prometheus, promtool, gpus, args)
        results.append(result)
        if "error" in result:
            print(f"{gpus:5d} GPUs: {result['error']}")
            continue
        print(
            f"{gpus:5d} GPUs, {result['series']:6d} series x {result['samples_per_series']} "
            f"samples: group {result['group_seconds_median'] * 1e3:8.2f} ms median, "
            f"{result['group_seconds_max'] * 1e3:8.2f} ms max over {result['evaluations']} "
            f"evaluations; slowest rule {result['slowest_rule']} "
            f"{result['rule_seconds_median'][result['slowest_rule']] * 1e3:.2f} ms; "
            f"{result['alerts_pending_or_firing']} alert(s) pending or firing; "
            f"backfill {result['backfill_seconds']} s"
        )
    load = os.getloadavg()
    print(f"load average during the run: {load[0]:.1f} on {os.cpu_count()} CPU(s)")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "load": load}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
