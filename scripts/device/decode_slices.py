#!/usr/bin/env python3
"""On the lent GPU machine: do decode batches see time-sliced contention, and what decides it?

The contention table of 2026-12-01 (part b) showed bf16 decode delivered at 0.48 of idle beside
a bf16 8192^3 loop, but fp8, int4 and int8 decode at 0.98-1.00: their batches are shorter.
This runs the worker on the decode shape only (``--shape 1x8192x8192``, bf16, fp8 and int4,
``--probe-when always``) idle once and beside that loop three times, for several batch
settings (``--max-iters``, and ``--max-prequeue-ms 0``: no hold before the batch), and keeps
per kernel delivered, peak, the batch's total milliseconds, its iterations, gaps and
``queued_ahead``. Then one default-suite cycle idle, listing every kernel whose batch was not
queued ahead. Written to --out: decode_slices.json and decode_slices.txt.

    python3 scripts/device/decode_slices.py --out /tmp/out
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WORKER = [sys.executable, str(ROOT / "sparkdiag" / "probe" / "worker")]
LOAD = ROOT / "tests" / "support" / "probe_scripts" / "gpu_load.py"
SETTINGS = {
    "max-iters 1000 (default)": [],
    "max-iters 4000": ["--max-iters", "4000", "--budget-seconds", "4"],
    "no hold, max-iters 1000": ["--max-prequeue-ms", "0"],
}
DECODE = [
    "--shape",
    "1x8192x8192",
    "--dtype",
    "bf16,fp8,int4",
    "--no-bandwidth",
    "--no-transfers",
    "--probe-when",
    "always",
]


def worker(args: list[str]) -> dict[str, Any]:
    proc = subprocess.run([*WORKER, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    try:
        doc: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        return {"status": "error", "reason": proc.stderr[-2000:], "results": []}
    return doc


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    keep = (
        "dtype",
        "shape",
        "kind",
        "beta",
        "status",
        "delivered",
        "peak",
        "total_ms",
        "gaps_ms",
        "iters",
        "batches",
        "queued_ahead",
    )
    return [{k: r.get(k) for k in keep} for r in doc.get("results", [])]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"started_at": time.time(), "settings": {}}
    lines: list[str] = []
    for name, extra in SETTINGS.items():
        runs = [{"condition": "idle", "results": rows(worker([*DECODE, *extra]))}]
        load = subprocess.Popen(
            [sys.executable, str(LOAD), "120"],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            assert load.stdout is not None and load.stdout.readline().strip() == "ready"
            for _ in range(args.repeats):
                runs.append({"condition": "busy", "results": rows(worker([*DECODE, *extra]))})
        finally:
            load.kill()
            load.wait()
        record["settings"][name] = {"argv": extra, "runs": runs}
        lines.append(f"== {name}")
        idle = {r["dtype"]: r for r in runs[0]["results"]}
        for dtype in ("bf16", "fp8", "int4"):
            base = idle.get(dtype) or {}
            busy = [
                next((r for r in run["results"] if r["dtype"] == dtype), {}) for run in runs[1:]
            ]
            ratios = [
                b["delivered"] / base["delivered"]
                for b in busy
                if b.get("delivered") and base.get("delivered")
            ]
            med = f" (median {statistics.median(ratios):.2f})" if ratios else ""
            lines.append(
                f"{dtype:5} idle {base.get('delivered') or 0:6.3f} TFLOPS over "
                f"{base.get('total_ms') or 0:6.1f} ms ({base.get('iters')} iters, ahead "
                f"{base.get('queued_ahead')}); busy/idle "
                + " ".join(f"{x:.2f}" for x in ratios)
                + med
            )
            lines.append(
                "      busy batches: "
                + ", ".join(
                    f"{b.get('total_ms') or 0:.1f} ms ahead {b.get('queued_ahead')}" for b in busy
                )
            )
    doc = worker([])
    record["default_idle"] = rows(doc)
    lines.append("== default suite idle: kernels whose batch was not queued ahead")
    behind = [r for r in record["default_idle"] if r["queued_ahead"] is False]
    lines += [
        f"{r['dtype']} {r['shape']} beta={r['beta']}: {r['iters']} iters over "
        f"{r['total_ms']:.1f} ms, gaps {r['gaps_ms']:.2f} ms, delivered "
        f"{r['delivered']:.4g} peak {r['peak']:.4g}"
        for r in behind
    ] or ["(none)"]
    record["finished_at"] = time.time()
    (args.out / "decode_slices.json").write_text(json.dumps(record, indent=1) + "\n")
    (args.out / "decode_slices.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
