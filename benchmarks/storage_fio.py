"""The storage probe beside fio, the reference tool, on the same directory with the same flags.

    python benchmarks/storage_fio.py DIR [--fio PATH] [--rounds 5] [--size 256M] [--threads 4]
                                         [--seconds 3] [--json FILE] [--cost]

Each round runs the probe (``sparkdiag.storage.run``) and then fio twice (a sequential write of
a fresh file, then a time-based sequential read of it), with the probe's flags::

    fio --ioengine=psync --direct=1 --bs=1M --iodepth=1 --numjobs=THREADS --size=SHARE
        --offset_increment=SHARE --fallocate=posix --thread --rw=write|read [--time_based]

and prints both figures and their ratio per round, then the median ratio per direction (paired
rounds: what a shared machine does meanwhile hits both sides of a round). ``--cost`` first runs
the probe once at its defaults (1 GiB, 20 s, 8 threads) and prints what it cost: bytes written
and seconds. Standard library and sparkdiag only, so that it runs on the lent GPU machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkdiag.config import OPTIONS_BY_KEY
from sparkdiag.config.option import size_bytes
from sparkdiag.storage.run import ProbeRequest, run_probe

READ_SHARE = 0.35  # of the probe's --seconds: its read phase (sparkdiag.storage.measure)


def fio(binary: str, directory: Path, rw: str, share: int, threads: int, seconds: float) -> float:
    """fio's bandwidth in bytes per second for one sequential pass (write) or a time-based read
    of ``seconds``, with the probe's flags, on ``DIR/fio.dat``."""
    args = [
        binary, "--name=sparkdiag", f"--directory={directory}", "--filename=fio.dat",
        f"--rw={rw}", "--ioengine=psync", "--direct=1", "--bs=1M", "--iodepth=1",
        f"--numjobs={threads}", f"--size={share}", f"--offset_increment={share}",
        "--fallocate=posix", "--group_reporting", "--output-format=json", "--thread",
    ]  # fmt: skip
    if rw == "read":
        args += ["--time_based", f"--runtime={seconds:g}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True)
    job = json.loads(done.stdout)["jobs"][0]
    return float(job[rw]["bw_bytes"])


def rounds(
    binary: str, directory: Path, count: int, size: int, threads: int, seconds: float
) -> list[dict[str, float]]:
    """``count`` paired rounds: probe, then fio write and read; figures in bytes per second."""
    share = size // threads
    probe_dir, fio_dir = directory / "sparkdiag-probe", directory / "sparkdiag-fio"
    probe_dir.mkdir(exist_ok=True)
    fio_dir.mkdir(exist_ok=True)
    results = []
    try:
        for _ in range(count):
            doc = run_probe(ProbeRequest(probe_dir, size=size, seconds=seconds / READ_SHARE,
                                         threads=threads, random_ops=1))  # fmt: skip
            row: dict[str, float] = {}
            for direction in ("write", "read"):
                figure = doc.figure(direction)
                probe = figure.bytes_per_second if figure is not None else None
                row[f"probe_{direction}"] = probe or 0.0
                row[f"fio_{direction}"] = fio(binary, fio_dir, direction, share, threads, seconds)
            (fio_dir / "fio.dat").unlink(missing_ok=True)
            results.append(row)
    finally:
        (fio_dir / "fio.dat").unlink(missing_ok=True)
        for folder in (probe_dir, fio_dir):
            shutil.rmtree(folder, ignore_errors=True)
    return results


def cost(directory: Path) -> dict[str, Any]:
    """One probe at the daemon's defaults: what it wrote and how long it took."""
    size = int(OPTIONS_BY_KEY["storage.size"].default)
    seconds = float(OPTIONS_BY_KEY["storage.duration"].default)
    started = time.monotonic()
    doc = run_probe(ProbeRequest(directory, size=size, seconds=seconds))
    wall = time.monotonic() - started
    return {
        "size": size, "seconds_limit": seconds, "bytes_written": doc.bytes_written,
        "probe_seconds": doc.finished_at - doc.started_at, "wall_seconds": wall,
        "write_bytes_per_second": (doc.figure("write") or doc.throughput[0]).bytes_per_second,
        "read_bytes_per_second": (doc.figure("read") or doc.throughput[0]).bytes_per_second,
        "p99_4k_read_seconds": doc.random_read.p99 if doc.random_read else None,
    }  # fmt: skip


def table(results: list[dict[str, float]]) -> str:
    lines = ["round  probe write  fio write  ratio  probe read  fio read  ratio  (GB/s)"]
    for i, r in enumerate(results, 1):
        lines.append(
            f"{i:5}  {r['probe_write'] / 1e9:11.3f}  {r['fio_write'] / 1e9:9.3f}  "
            f"{r['probe_write'] / r['fio_write']:5.2f}  {r['probe_read'] / 1e9:10.3f}  "
            f"{r['fio_read'] / 1e9:8.3f}  {r['probe_read'] / r['fio_read']:5.2f}"
        )
    for direction in ("write", "read"):
        ratio = statistics.median(r[f"probe_{direction}"] / r[f"fio_{direction}"] for r in results)
        lines.append(f"median probe/fio {direction}: {ratio:.3f} ({abs(ratio - 1):.1%} apart)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--fio", default=shutil.which("fio"), help="fio binary")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", default="256M", help="test file per round (K, M, G)")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0, help="each read phase")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--cost", action="store_true", help="first one probe at its defaults")
    args = parser.parse_args()
    size = size_bytes(args.size)
    if size is None:
        parser.error(f"--size {args.size!r} is not a size")
    doc: dict[str, Any] = {"directory": str(args.directory)}
    if args.cost:
        doc["cost"] = cost(args.directory)
        c = doc["cost"]
        print(f"cost at defaults: wrote {c['bytes_written'] / 2**30:.2f} GiB in "
              f"{c['probe_seconds']:.1f} s (wall {c['wall_seconds']:.1f} s)")  # fmt: skip
    if args.fio is None:
        print("fio not found: give --fio PATH", file=sys.stderr)
        doc["error"] = "no fio"
    else:
        doc["rounds"] = rounds(args.fio, args.directory, args.rounds, size, args.threads,
                               args.seconds)  # fmt: skip
        print(table(doc["rounds"]))
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if "rounds" in doc else 1


if __name__ == "__main__":
    sys.exit(main())
