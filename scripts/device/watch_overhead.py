#!/usr/bin/env python3
"""On the lent GPU machine: where does ``sparkdiag watch`` cost a launch-bound job throughput?

    python3 scripts/device/watch_overhead.py --job launch --seconds 8 --repeat 2

The job (scripts/device/watch_jobs.py's ``job`` mode, default ``launch``: 1-element additions,
one launching thread) runs alone and beside a sampling loop built from sparkdiag's own
:mod:`sparkdiag.watch.sampler`, one variant at a time, "alone" runs interleaved so that drift
shows. Variants (``--variants``):

  alone       no sampling
  full        GPU and host sampler, as ``sparkdiag watch`` builds them
  host        the host side only (/proc of the job's tree, PSI, meminfo)
  gpu         the GPU side only
  -KEY        the full sampler with one NVML query left unanswered (never asked):
              -utilization_samples, -gpm, -compute_processes, -pcie_throughput, -clock ...
  nvml-open   NVML initialised, nothing asked
  watch       the real ``python3 -m sparkdiag watch --json -- <job>``

Each run reports the job's throughput, the overhead (1 - run / median of the alone runs), and
the sampler's CPU seconds and mean milliseconds per tick for the GPU and host sides. Written to
$OUT/watch_overhead.json and .txt.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DEFAULT_VARIANTS = (
    "alone,full,alone,host,gpu,alone,-gpm,-utilization_samples,alone,"
    "-compute_processes,-pcie_throughput,alone,nvml-open,watch,alone"
)


def job_argv(job: str, seconds: float, device: str, scale: str, result: Path) -> list[str]:
    return [
        sys.executable, str(ROOT / "scripts/device/watch_jobs.py"), "job", job,
        "--seconds", str(seconds), "--device", device, "--scale", scale, "--result", str(result),
    ]  # fmt: skip


def sampler_loop(variant: str, pid: int, interval: float, stop: threading.Event) -> dict[str, Any]:
    """Sample ``pid`` every ``interval`` s as ``variant`` says until ``stop``; timings."""
    from sparkdiag.commands.watch import PCIE_SECONDS
    from sparkdiag.sources.nvml.backends import make_backend
    from sparkdiag.sources.nvml.gpu import GpuSource
    from sparkdiag.watch.sampler import GpuSampler, HostSampler

    source = GpuSource(make_backend(None), slow_seconds=PCIE_SECONDS)
    gpu = GpuSampler(source) if source.start() else None
    if variant not in ("full", "gpu") and not variant.startswith("-"):
        gpu = None
    if variant.startswith("-"):
        skip, ask = variant[1:], source.ask
        source.ask = lambda i, q, a=None: None if q == skip else ask(i, q, a)  # type: ignore[method-assign]
    host = (
        HostSampler(Path("/"), Path("/sys"), pid)
        if variant in ("full", "host") or (variant.startswith("-"))
        else None
    )
    gpu_ms: list[float] = []
    host_ms: list[float] = []
    started_at = time.time()
    cpu0 = time.process_time()
    next_at = time.monotonic()
    while not stop.wait(max(0.0, next_at - time.monotonic())):
        next_at += interval
        pids = {pid}
        if host is not None:
            t = time.perf_counter()
            pids = set(host.tree())
            host_ms.append((time.perf_counter() - t) * 1e3)
        gpu_pids: set[int] = set()
        if gpu is not None:
            t = time.perf_counter()
            gpu.sample(started_at, pids)
            gpu_pids = gpu.gpu_pids(pids)
            gpu_ms.append((time.perf_counter() - t) * 1e3)
        if host is not None:
            t = time.perf_counter()
            host.sample(gpu_pids)
            host_ms[-1] += (time.perf_counter() - t) * 1e3
    cpu = time.process_time() - cpu0
    source.stop()
    if gpu is None and variant != "host":
        return {"error": f"NVML unavailable: {source.unavailable_reason}"}

    def summary(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        return {"mean": statistics.fmean(values), "max": max(values), "n": len(values)}

    return {"sampler_cpu_s": cpu, "gpu_ms": summary(gpu_ms), "host_ms": summary(host_ms)}


def run(args: argparse.Namespace, variant: str, n: int, out: Path) -> dict[str, Any]:
    result = out / f".overhead-{n}.json"
    result.unlink(missing_ok=True)
    argv = job_argv(args.job, args.seconds, args.device, args.scale, result)
    entry: dict[str, Any] = {"variant": variant}
    if variant == "watch":
        argv = [sys.executable, "-m", "sparkdiag", "watch", "--json", "--interval",
                str(args.interval), "--", *argv]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    stop = threading.Event()
    sampling: dict[str, Any] = {}
    thread = None
    if variant not in ("alone", "watch"):
        if variant == "nvml-open":
            from sparkdiag.sources.nvml.backends import make_backend
            from sparkdiag.sources.nvml.gpu import GpuSource

            source = GpuSource(make_backend(None))
            source.start()
            thread = threading.Thread(target=lambda: (stop.wait(), source.stop()))
        else:
            thread = threading.Thread(
                target=lambda: sampling.update(sampler_loop(variant, proc.pid, args.interval, stop))
            )
        thread.start()
    stdout, _ = proc.communicate(timeout=args.seconds + 180)
    stop.set()
    if thread is not None:
        thread.join()
    entry.update(sampling)
    if variant == "watch":
        try:
            entry["diagnosis"] = json.loads(stdout)["verdict"]
        except (json.JSONDecodeError, KeyError):
            entry["diagnosis"] = None
    try:
        doc = json.loads(result.read_text())
        entry["per_second"] = doc["per_second"]
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        entry["error"] = f"no result (exit {proc.returncode}): {exc}"
    result.unlink(missing_ok=True)
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", default="launch")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--scale", default="full")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--repeat", type=int, default=1, help="run the variant list this often")
    parser.add_argument("--out", default=None, help="default $OUT, else /tmp/out")
    args = parser.parse_args()
    out = Path(args.out or os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    variants = [v for v in args.variants.split(",") if v] * args.repeat
    for n, variant in enumerate(variants):
        entry = run(args, variant, n, out)
        rows.append(entry)
        print(json.dumps(entry), flush=True)
    alone = [r["per_second"] for r in rows if r["variant"] == "alone" and "per_second" in r]
    base = statistics.median(alone) if alone else None
    lines = [f"job {args.job}, {args.seconds:g} s per run, interval {args.interval} s; "
             f"alone median {base:.0f}/s" if base else "no alone run"]  # fmt: skip
    by: dict[str, list[float]] = {}
    for r in rows:
        if base and "per_second" in r:
            r["overhead"] = 1.0 - r["per_second"] / base
            by.setdefault(r["variant"], []).append(r["overhead"])
    head = f"{'variant':<24} {'runs':>4} {'overhead (each)':<28} {'gpu ms':>7} {'host ms':>8}"
    lines.append(head)
    for variant, values in by.items():
        picks = [r for r in rows if r["variant"] == variant]
        gpu = [r["gpu_ms"]["mean"] for r in picks if r.get("gpu_ms")]
        host = [r["host_ms"]["mean"] for r in picks if r.get("host_ms")]
        each = " ".join(f"{v * 100:+.1f}%" for v in values)
        lines.append(
            f"{variant:<24} {len(values):>4} {each:<28} "
            f"{statistics.fmean(gpu) if gpu else float('nan'):>7.2f} "
            f"{statistics.fmean(host) if host else float('nan'):>8.2f}"
        )
    text = "\n".join(lines) + "\n"
    doc = {"job": args.job, "seconds": args.seconds, "interval": args.interval, "rows": rows}
    (out / "watch_overhead.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "watch_overhead.txt").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
