#!/usr/bin/env python3
"""On the lent GPU machine: what sampling the job's stacks costs its throughput (issue 28).

    python3 scripts/device/watch_stack_cost.py --seconds 4 --repeats 3 --budget 140 \
        --archive $OUT/watch/watch_cost.tgz

Two jobs of scripts/device/watch_jobs.py (``job`` mode): ``healthy`` (bf16 8192^3 matmuls back
to back: GPU-bound) and ``launch`` (1-element additions: launch-bound, every launch waits on its
CPU). Each runs alone, under ``sparkdiag watch --stacks off`` and under ``sparkdiag watch`` (its
stacks sampled at the default rate), ``--repeats`` times, the order of the three rotating from
one repeat to the next so that drift spreads over all of them. The cost of a way of watching is
1 - its median throughput / the median alone (targets: 2 % for the GPU-bound job, 5 % for the
launch-bound one). ``--budget S`` starts no run likely to end after S seconds (each call to
the device is at most 10 minutes; this one is meant for about 150 s).

Written under --out (default $OUT/watch/cost): ``watch_cost.json`` and ``watch_cost.txt`` (the
table, also on stdout), each watched run's diagnosis and recording; with ``--archive`` all of it
packed in one tar archive. Test it on a CPU: ``--device cpu --scale tiny --seconds 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from watch_report import pack

ROOT = Path(__file__).resolve().parents[2]
JOBS = ("healthy", "launch")
WAYS = ("alone", "counters", "stacks")  # alone, watch --stacks off, watch with stacks
TARGETS = {"healthy": 0.02, "launch": 0.05}


def argv(
    args: argparse.Namespace, job: str, way: str, result: Path, out: Path, n: int
) -> list[str]:
    pin = ["taskset", "-c", args.pin] if args.pin else []  # the same core for every run
    run = [*pin, sys.executable, str(ROOT / "scripts/device/watch_jobs.py"), "job", job,
           "--seconds", str(args.seconds), "--device", args.device, "--scale", args.scale,
           "--result", str(result)]  # fmt: skip
    if way == "alone":
        return run
    record = out / f"{job}.{way}.{n}.recording.json"
    watch = [sys.executable, "-m", "sparkdiag", "watch", "--json", "--interval",
             str(args.interval), "--record", str(record)]  # fmt: skip
    if way == "counters":
        watch += ["--stacks", "off"]
    if args.nvml_fixture:
        watch += ["--nvml-fixture", args.nvml_fixture]
    return [*watch, "--", *run]


def once(args: argparse.Namespace, job: str, way: str, out: Path, n: int) -> dict[str, Any]:
    result = out / f".{job}.{way}.json"
    result.unlink(missing_ok=True)
    entry: dict[str, Any] = {"job": job, "way": way, "repeat": n}
    began = time.monotonic()
    try:
        proc = subprocess.run(argv(args, job, way, result, out, n), cwd=ROOT, capture_output=True,
                              text=True, timeout=args.seconds + 120)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {**entry, "error": "timed out"}
    entry["wall_seconds"] = time.monotonic() - began
    if way != "alone":
        try:
            doc = json.loads(proc.stdout)
            entry["diagnosis"] = doc["verdict"]
            entry["stack_sampler"] = doc.get("stack_sampler", "")
            (out / f"{job}.{way}.{n}.diagnosis.json").write_text(proc.stdout, encoding="utf-8")
        except (json.JSONDecodeError, KeyError):
            entry["error"] = f"watch printed no JSON (exit {proc.returncode}): {proc.stderr[-200:]}"
    try:
        entry["per_second"] = json.loads(result.read_text())["per_second"]
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        entry.setdefault("error", f"no result (exit {proc.returncode}): {exc}")
    result.unlink(missing_ok=True)
    return entry


def summary(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    out: dict[str, Any] = {}
    lines = [f"{'job':<8} {'way':<9} {'runs':>4} {'median /s':>12} {'cost':>7} {'target':>7}  each"]
    for job in JOBS:
        rates = {w: [r["per_second"] for r in rows if r["job"] == job and r["way"] == w
                     and "per_second" in r] for w in WAYS}  # fmt: skip
        if not rates["alone"]:
            continue
        alone = statistics.median(rates["alone"])
        for way in WAYS:
            if not rates[way]:
                continue
            median = statistics.median(rates[way])
            cost = 1.0 - median / alone
            # each repeat's run against that repeat's alone run (the three are back to back,
            # so drift over the call cancels): the median of those costs beside the pooled one
            paired = paired_costs(rows, job, way) if way != "alone" else []
            out[f"{job}/{way}"] = {"median": median, "cost": cost, "runs": rates[way],
                                   "paired_costs": paired}  # fmt: skip
            target = f"{TARGETS[job] * 100:.0f} %" if way == "stacks" else ""
            each = " ".join(f"{v:.0f}" for v in rates[way])
            pair = (f"  paired {statistics.median(paired) * 100:+.1f}%"
                    if paired and way != "alone" else "")  # fmt: skip
            lines.append(f"{job:<8} {way:<9} {len(rates[way]):>4} {median:>12.0f} "
                         f"{cost * 100:>+6.1f}% {target:>7}  {each}{pair}")  # fmt: skip
    lines.append("cost: 1 - median throughput / median alone; paired: the median of 1 - run / "
                 "the same repeat's alone run; alone: no watch; counters: watch --stacks off; "
                 "stacks: watch sampling the job's stacks (py-spy)")  # fmt: skip
    return out, "\n".join(lines) + "\n"


def paired_costs(rows: list[dict[str, Any]], job: str, way: str) -> list[float]:
    """1 - run / alone for each repeat that has both."""
    runs = {(r["way"], r["repeat"]): r["per_second"] for r in rows
            if r["job"] == job and "per_second" in r}  # fmt: skip
    return [1.0 - runs[(way, n)] / runs[("alone", n)] for (w, n) in sorted(runs)
            if w == way and ("alone", n) in runs and runs[("alone", n)] > 0]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="timed run of each job")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--scale", default="full", choices=("full", "tiny"))
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("--nvml-fixture", default=None, help="a dry run on a CPU")
    parser.add_argument("--out", default=None, help="default $OUT/watch/cost")
    parser.add_argument("--archive", default=None)
    parser.add_argument("--jobs", default=",".join(JOBS), help="of: " + ", ".join(JOBS))
    parser.add_argument("--pin", default=None, metavar="CPUS",
                        help="run every job under taskset -c CPUS (its throughput then depends "
                             "less on which core the scheduler gave it)")  # fmt: skip
    args = parser.parse_args()
    out = Path(args.out or Path(os.environ.get("OUT", "/tmp/out")) / "watch" / "cost")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    longest = 0.0
    jobs = [job for job in args.jobs.split(",") if job]
    if not jobs or any(job not in JOBS for job in jobs):
        parser.error(f"--jobs: each of {', '.join(JOBS)}, got {args.jobs!r}")
    for n in range(args.repeats):
        for job in jobs:
            for way in WAYS[n % 3 :] + WAYS[: n % 3]:
                elapsed = time.monotonic() - started
                if (
                    args.budget is not None
                    and elapsed + max(longest, args.seconds + 5) > args.budget
                ):
                    rows.append({"job": job, "way": way, "repeat": n, "error": "not run: budget"})
                    continue
                entry = once(args, job, way, out, n)
                longest = max(longest, entry.get("wall_seconds", 0.0))
                rows.append(entry)
                print(json.dumps(entry), flush=True)
    costs, text = summary(rows)
    doc = {"seconds": args.seconds, "repeats": args.repeats, "interval": args.interval,
           "rows": rows, "costs": costs, "wall_seconds": time.monotonic() - started}  # fmt: skip
    (out / "watch_cost.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    (out / "watch_cost.txt").write_text(text, encoding="utf-8")
    pack(out, Path(args.archive) if args.archive else None)
    print(text, end="")
    print(f"wall time {time.monotonic() - started:.0f} s; files under {out}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
