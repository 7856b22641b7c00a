#!/usr/bin/env python3
"""Benchmark: the state directory's size, RSS and CPU of a daemon probing for a long time.

Prints figures; asserts nothing (the retention rules are proven by tests/test_store_retention.py;
this shows the store's size staying within its bound over a long run):

    nohup python benchmarks/store_soak.py --minutes 60 --json out/soak.json > out/soak.txt &

Runs ``sparkdiag serve`` on the 8-GPU NVML fixture with the recorded H200 probe document
replayed every ``--probe-interval`` seconds (default 5: 172 figures a cycle, 60 times the
default rate), ``--compat.dcgm`` and ``--process-metrics``, its state directory in a fresh
temporary folder, scraped every ``--scrape-every`` seconds as Prometheus asks (gzip). Every
``--sample-every`` seconds it prints the size of the state directory (database, WAL, shared
memory), the rows in the store's ``runs`` table, the daemon's RSS, threads and open files, its
CPU share since the last sample, and the scrapes that failed. Extra ``serve`` arguments after
``--`` (for example ``-- --baseline.history-runs 100``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks.common
from benchmarks.common import fetch, free_port, proc_usage, stop, wait_http  # noqa: E402

PROMETHEUS = {
    "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    "Accept-Encoding": "gzip",
}


def directory_bytes(state: Path) -> dict[str, int]:
    """Bytes of each file in the state directory, and their total."""
    sizes = {p.name: p.stat().st_size for p in state.iterdir() if p.is_file()}
    return {**sizes, "total": sum(sizes.values())}


def runs_in(db: Path) -> int | None:
    """Rows in the store's ``runs`` table, read in a short read-only connection."""
    if not db.exists():
        return None
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
        return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])


class Scraper(threading.Thread):
    def __init__(self, port: int, every: float) -> None:
        super().__init__(daemon=True)
        self.port, self.every = port, every
        self.done = threading.Event()
        self.ok = self.failed = 0

    def run(self) -> None:
        while not self.done.wait(self.every):
            try:
                fetch(self.port, PROMETHEUS)
                self.ok += 1
            except (OSError, SystemExit):
                self.failed += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--probe-interval", type=float, default=5.0)
    parser.add_argument("--scrape-every", type=float, default=0.5)
    parser.add_argument("--sample-every", type=float, default=60.0)
    parser.add_argument("--json", type=Path, help="write every sample here too")
    parser.add_argument("serve_args", nargs="*", help="more serve arguments (after --)")
    opts = parser.parse_args()

    fixtures = ROOT / "tests" / "fixtures"
    results: dict[str, Any] = {"host": os.uname().nodename, "samples": []}
    with tempfile.TemporaryDirectory(prefix="store-soak-") as tmp:
        state = Path(tmp) / "state"
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "sparkdiag",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--nvml-fixture",
            str(fixtures / "nvml" / "h200-x8.json"),
            "--probe.fixture",
            str(fixtures / "probe" / "h200-default.json"),
            "--path.sysfs",
            str(fixtures / "sysfs" / "h200-x8"),
            "--path.rootfs",
            str(fixtures / "rootfs" / "gpu-host"),
            "--probe.interval",
            str(opts.probe_interval),
            "--probe.first-delay",
            "0",
            "--compat.dcgm",
            "--process-metrics",
            "--state-dir",
            str(state),
            "--log-level",
            "warning",
            *opts.serve_args,
        ]
        results["command"] = cmd
        log = (Path(tmp) / "serve.log").open("wb")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_http(port, proc)
            scraper = Scraper(port, opts.scrape_every)
            scraper.start()
            start = time.monotonic()
            cpu_last, at_last = proc_usage(proc.pid)[0], start
            print(
                f"{'minute':>6} {'state MB':>9} {'db MB':>7} {'wal MB':>7} {'runs':>7} "
                f"{'RSS MiB':>8} {'threads':>7} {'fds':>4} {'CPU %':>6} {'scrapes':>8} "
                f"{'failed':>6}",
                flush=True,
            )
            while (elapsed := time.monotonic() - start) < opts.minutes * 60:
                time.sleep(min(opts.sample_every, opts.minutes * 60 - elapsed))
                if proc.poll() is not None:
                    raise RuntimeError(f"serve exited {proc.returncode}")
                cpu, rss = proc_usage(proc.pid)
                now = time.monotonic()
                sizes = directory_bytes(state)
                sample = {
                    "minute": (now - start) / 60,
                    "state_bytes": sizes["total"],
                    "files": sizes,
                    "runs": runs_in(state / "baselines.sqlite"),
                    "rss_mib": rss,
                    "threads": len(os.listdir(f"/proc/{proc.pid}/task")),
                    "fds": len(os.listdir(f"/proc/{proc.pid}/fd")),
                    "cpu_percent": 100 * (cpu - cpu_last) / (now - at_last),
                    "scrapes": scraper.ok,
                    "failed": scraper.failed,
                }
                cpu_last, at_last = cpu, now
                results["samples"].append(sample)
                mb = 1e6
                print(
                    f"{sample['minute']:6.1f} {sizes['total'] / mb:9.2f} "
                    f"{sizes.get('baselines.sqlite', 0) / mb:7.2f} "
                    f"{sizes.get('baselines.sqlite-wal', 0) / mb:7.2f} "
                    f"{sample['runs'] or 0:7d} {rss:8.1f} {sample['threads']:7d} "
                    f"{sample['fds']:4d} {sample['cpu_percent']:6.2f} {scraper.ok:8d} "
                    f"{scraper.failed:6d}",
                    flush=True,
                )
            scraper.done.set()
        finally:
            stop(proc)
            log.close()
            results["log_tail"] = (Path(tmp) / "serve.log").read_text(errors="replace")[-4000:]
    samples = results["samples"]
    if samples:
        half = [s["state_bytes"] for s in samples if s["minute"] >= opts.minutes / 2]
        print(
            f"state directory: {samples[0]['state_bytes'] / 1e6:.2f} MB after the first "
            f"sample, at most {max(s['state_bytes'] for s in samples) / 1e6:.2f} MB; over the "
            f"second half {min(half) / 1e6:.2f}-{max(half) / 1e6:.2f} MB"
        )
    if opts.json:
        opts.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
