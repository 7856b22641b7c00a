"""The storage probe beside fio, the reference tool, on the same directory doing the same I/O.

    python benchmarks/storage_fio.py DIR [--fio PATH] [--rounds 5] [--size 256M] [--threads 4]
                                         [--seconds 3] [--pages auto|huge|small] [--contrast]
                                         [--json FILE] [--cost]

Each round runs the probe (``sparkdiag.storage.run``) and fio (a sequential write of a fresh
file, then a time-based sequential read of it) with the probe's flags::

    fio --ioengine=psync --direct=1 --bs=1M --iodepth=1 --numjobs=THREADS --size=SHARE
        --offset_increment=SHARE --thread --mem=mmaphuge|malloc --rw=write|read [--time_based]

the probe first in odd rounds and fio first in even ones, and prints both figures, their ratio
and the size of the read requests each tool's reads reached the device as (from
``/sys/class/block/DEV/stat``), then the median ratio per direction (paired rounds: what a
shared machine does meanwhile hits both sides of a round).

The same I/O, down to the device's requests: both tools' buffers lie in huge pages or both in 4
KiB pages (``--pages``; ``auto``: huge where the probe gets transparent huge pages and fio's
``--mem=mmaphuge`` has two free huge pages per job, ``vm.nr_hugepages``: a write job's buffer is
two blocks, and fio 3.33 crashed, not failed, when the pool ran out). On the lent H200's virtio
disk the probe read 1.28x and wrote 1.18x fio's figure with the probe's buffers in whatever pages
it was given and fio's in malloc's: a 1 MiB block in 4 KiB pages may reach the device as up to
256 segments (two requests past the queue's ``max_segments`` of 254), and this VM's disk moved
1 MiB from one huge page 2.0-2.2 GB/s against 0.8-0.9 GB/s from scattered 4 KiB pages, for either
tool (docs/storage.md). fio's file is laid out beforehand at its full size (``posix_fallocate``,
as the probe reserves its own), so that fio does not create, extend and unlink it on the way.

``--contrast`` then reads fio's file once with each kind of buffer and prints both: the cause
measured on the machine at hand. ``--cost`` first runs the probe once at its defaults (1 GiB,
20 s, 8 threads) and prints what it cost. Standard library and sparkdiag only, so that it runs on
the lent GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
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
from sparkdiag.storage.target import locate

READ_SHARE = 0.35  # of the probe's --seconds: its read phase (sparkdiag.storage.measure)
MEM = {"huge": "mmaphuge", "small": "malloc"}  # fio's --mem for each kind of buffer


def device_stat(directory: Path) -> Path | None:
    """``/sys/class/block/DEV/stat`` of the device the directory's filesystem is on."""
    target = locate(directory)
    if target.chain is None:
        return None
    path = Path("/sys/class/block") / target.chain.device / "stat"
    return path if path.exists() else None


def read_requests(stat: Path | None) -> tuple[int, int]:
    """(read requests completed, sectors read) of a device, (0, 0) where unknown."""
    if stat is None:
        return 0, 0
    fields = stat.read_text().split()
    return int(fields[0]), int(fields[2])


def kib_per_request(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    requests, sectors = after[0] - before[0], after[1] - before[1]
    return sectors * 512 / 1024 / requests if requests > 0 else None


def free_huge_pages() -> int:
    """Free pages of the hugetlb pool (``HugePages_Free``), which fio's mmaphuge takes from."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("HugePages_Free:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def fio(binary: str, directory: Path, rw: str, share: int, threads: int, seconds: float,
        pages: str) -> float:  # fmt: skip
    """fio's bandwidth in bytes per second for one sequential pass (write) or a time-based read
    of ``seconds``, with the probe's flags, on ``DIR/fio.dat``."""
    args = [
        binary, "--name=sparkdiag", f"--directory={directory}", "--filename=fio.dat",
        f"--rw={rw}", "--ioengine=psync", "--direct=1", "--bs=1M", "--iodepth=1",
        f"--numjobs={threads}", f"--size={share}", f"--offset_increment={share}",
        f"--mem={MEM[pages]}", "--group_reporting", "--output-format=json", "--thread",
    ]  # fmt: skip
    if rw == "read":
        args += ["--time_based", f"--runtime={seconds:g}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"fio {rw} failed: {(done.stderr or done.stdout).strip()[-300:]}")
    job = json.loads(done.stdout)["jobs"][0]
    return float(job[rw]["bw_bytes"])


def lay_out(path: Path, size: int) -> None:
    """fio's file at its full size before fio sees it: fio then writes into it as the probe
    writes into its reserved file, instead of creating, extending and unlinking it per job."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


def one_round(
    binary: str, probe_dir: Path, fio_dir: Path, size: int, threads: int, seconds: float,
    pages: str, stat: Path | None, fio_first: bool,
) -> dict[str, Any]:  # fmt: skip
    """The probe and fio once each, in the order asked; figures in bytes per second."""
    share = size // threads
    row: dict[str, Any] = {"order": "fio first" if fio_first else "probe first", "pages": pages}

    def probe() -> None:
        before = read_requests(stat)
        doc = run_probe(ProbeRequest(probe_dir, size=size, seconds=seconds / READ_SHARE,
                                     threads=threads, random_ops=1, pages=pages))  # fmt: skip
        row["probe_read_kib_per_request"] = kib_per_request(before, read_requests(stat))
        row["probe_pages"] = doc.pages
        for direction in ("write", "read"):
            figure = doc.figure(direction)
            row[f"probe_{direction}"] = (figure.bytes_per_second if figure else None) or 0.0

    def reference() -> None:
        lay_out(fio_dir / "fio.dat", share * threads)
        row["fio_write"] = fio(binary, fio_dir, "write", share, threads, seconds, pages)
        before = read_requests(stat)
        row["fio_read"] = fio(binary, fio_dir, "read", share, threads, seconds, pages)
        row["fio_read_kib_per_request"] = kib_per_request(before, read_requests(stat))
        (fio_dir / "fio.dat").unlink(missing_ok=True)

    for run in (reference, probe) if fio_first else (probe, reference):
        run()
    return row


def rounds(
    binary: str, directory: Path, count: int, size: int, threads: int, seconds: float,
    pages: str,
) -> list[dict[str, Any]]:  # fmt: skip
    """``count`` paired rounds, the order alternating."""
    probe_dir, fio_dir = directory / "sparkdiag-probe", directory / "sparkdiag-fio"
    probe_dir.mkdir(exist_ok=True)
    fio_dir.mkdir(exist_ok=True)
    stat = device_stat(directory)
    try:
        return [one_round(binary, probe_dir, fio_dir, size, threads, seconds, pages, stat,
                          fio_first=i % 2 == 1) for i in range(count)]  # fmt: skip
    finally:
        (fio_dir / "fio.dat").unlink(missing_ok=True)
        for folder in (probe_dir, fio_dir):
            shutil.rmtree(folder, ignore_errors=True)


def contrast(
    binary: str, directory: Path, size: int, threads: int, seconds: float
) -> dict[str, Any]:
    """fio's read of one file with buffers in 4 KiB pages, then in huge pages: the cause."""
    folder = directory / "sparkdiag-fio-contrast"
    folder.mkdir(exist_ok=True)
    share, stat = size // threads, device_stat(directory)
    out: dict[str, Any] = {}
    try:
        lay_out(folder / "fio.dat", share * threads)
        fio(binary, folder, "write", share, threads, seconds, "huge")
        for pages in ("small", "huge"):
            before = read_requests(stat)
            out[f"{pages}_read"] = fio(binary, folder, "read", share, threads, seconds, pages)
            out[f"{pages}_kib_per_request"] = kib_per_request(before, read_requests(stat))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out


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


def _kib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def table(results: list[dict[str, Any]]) -> str:
    lines = ["round  probe write  fio write  ratio  probe read  fio read  ratio  (GB/s)"]
    for i, r in enumerate(results, 1):
        lines.append(
            f"{i:5}  {r['probe_write'] / 1e9:11.3f}  {r['fio_write'] / 1e9:9.3f}  "
            f"{r['probe_write'] / r['fio_write']:5.2f}  {r['probe_read'] / 1e9:10.3f}  "
            f"{r['fio_read'] / 1e9:8.3f}  {r['probe_read'] / r['fio_read']:5.2f}"
        )
    lines.append("round  order        buffers  read KiB/request: probe  fio")
    for i, r in enumerate(results, 1):
        lines.append(
            f"{i:5}  {r['order']:11}  {r['pages']:7}  {_kib(r['probe_read_kib_per_request']):>23}"
            f"  {_kib(r['fio_read_kib_per_request']):>3}"
        )
    for direction in ("write", "read"):
        ratio = statistics.median(r[f"probe_{direction}"] / r[f"fio_{direction}"] for r in results)
        lines.append(f"median probe/fio {direction}: {ratio:.3f} ({abs(ratio - 1):.1%} apart)")
    return "\n".join(lines)


def contrast_text(c: dict[str, Any]) -> str:
    return (
        f"fio read, 1 MiB buffers in 4 KiB pages: {c['small_read'] / 1e9:.3f} GB/s "
        f"({_kib(c['small_kib_per_request'])} KiB per request); in huge pages: "
        f"{c['huge_read'] / 1e9:.3f} GB/s ({_kib(c['huge_kib_per_request'])} KiB per request): "
        f"{c['huge_read'] / c['small_read']:.2f}x"
    )


def huge_pages_needed(threads: int) -> int:
    """Huge pages fio's ``--mem=mmaphuge`` takes: a write job allocates two 1 MiB blocks plus
    alignment (``fio --debug=mem``: 2101247 bytes), two 2 MiB pages."""
    return 2 * threads


def choose_pages(asked: str, threads: int) -> tuple[str, str | None]:
    """The buffers both tools use, and a note when ``auto`` could not give huge pages."""
    if asked != "auto":
        return asked, None
    if free_huge_pages() >= huge_pages_needed(threads):
        return "huge", None
    return "small", (
        f"fio's --mem=mmaphuge needs {huge_pages_needed(threads)} free huge pages "
        "(vm.nr_hugepages; "
        f"{free_huge_pages()} free): both tools use 4 KiB pages, so their figures vary with "
        "where their buffers fall in memory"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--fio", default=shutil.which("fio"), help="fio binary")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", default="256M", help="test file per round (K, M, G)")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0, help="each read phase")
    parser.add_argument("--pages", choices=("auto", "huge", "small"), default="auto",
                        help="what both tools' buffers lie in")  # fmt: skip
    parser.add_argument("--contrast", action="store_true",
                        help="then fio's read with each kind of buffer")  # fmt: skip
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
        return 1
    pages, note = choose_pages(args.pages, args.threads)
    if pages == "huge" and free_huge_pages() < huge_pages_needed(args.threads):
        print(f"--pages huge: fio needs {huge_pages_needed(args.threads)} free huge pages "
              "(vm.nr_hugepages)", file=sys.stderr)  # fmt: skip
        return 2
    doc["pages"] = pages
    if note:
        print(f"note: {note}")
        doc["note"] = note

    def keep() -> None:  # after each part: a run cut short keeps what it measured
        if args.json is not None:
            args.json.write_text(json.dumps(doc, indent=1) + "\n")

    try:
        doc["rounds"] = rounds(args.fio, args.directory, args.rounds, size, args.threads,
                               args.seconds, pages)  # fmt: skip
        print(table(doc["rounds"]), flush=True)
        keep()
        if args.contrast and free_huge_pages() >= huge_pages_needed(args.threads):
            doc["contrast"] = contrast(args.fio, args.directory, size, args.threads, args.seconds)
            print(contrast_text(doc["contrast"]))
        elif args.contrast:
            print("contrast skipped: fio needs free huge pages (vm.nr_hugepages)")
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        doc["error"] = str(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        doc["error"] = "interrupted"
    keep()
    return 0 if "rounds" in doc and "error" not in doc else 1


if __name__ == "__main__":
    sys.exit(main())
