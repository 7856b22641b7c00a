"""The storage probe on real filesystems made for the test: ext4 on a loop device (root), a full
one, a read-only one, one whose directory vanishes mid-run, the same device throttled with the
cgroup v1 blkio controller (which `check` must judge slow while the unthrottled one is fit), and
fio on the same filesystem with the same flags (the probe must agree within 10 %)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkdiag.errors import Exit
from sparkdiag.storage.run import ProbeRequest, StorageProbeError, run_probe
from sparkdiag.storage.session import Where, probe_directory
from tests.support import ROOT, sparkdiag_cmd
from tests.support.loopfs import LoopFs, blkio_throttle, in_cgroup, loop_filesystem

pytestmark = pytest.mark.storage
MIB = 1 << 20


@pytest.fixture
def loopfs(tmp_path: Path) -> Iterator[LoopFs]:
    with loop_filesystem(tmp_path, 512) as fs:
        yield fs


def used_bytes(path: Path) -> int:
    fs = os.statvfs(path)
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize


def test_probe_of_a_loop_filesystem_names_it_and_leaves_nothing(
    loopfs: LoopFs, tmp_path: Path
) -> None:
    data = loopfs.mountpoint / "ckpt"
    data.mkdir()
    before = used_bytes(loopfs.mountpoint)
    request = ProbeRequest(data, size=64 * MIB, seconds=4, threads=4, random_ops=500)
    report = probe_directory(request, Where(state_dir=tmp_path / "state"))
    target = report.target
    assert target.mountpoint == str(loopfs.mountpoint)
    assert target.device == loopfs.name and target.kind == "loop"
    assert target.chain is not None and target.chain.backing_file == str(tmp_path / "disk.img")
    assert target.ceiling is None  # a loop device has no link of its own
    assert {f.throughput.direction for f in report.figures} == {"read", "write"}
    assert all(f.value and f.value > 0 for f in report.figures)
    assert report.other_io_bytes is not None and report.recorded
    assert list(data.iterdir()) == []
    assert abs(used_bytes(loopfs.mountpoint) - before) < 4 * MIB
    kept = json.loads((tmp_path / "state" / "storage.json").read_text())
    assert kept["mounts"][0]["device"] == loopfs.name


def _refused(directory: Path, **kwargs: object) -> StorageProbeError:
    with pytest.raises(StorageProbeError) as raised:
        run_probe(ProbeRequest(directory, **{"size": 32 * MIB, "seconds": 3, **kwargs}))  # type: ignore[arg-type]
    assert "\n" not in raised.value.message and "Traceback" not in raised.value.message
    return raised.value


def test_a_read_only_filesystem_is_refused(tmp_path: Path) -> None:
    with loop_filesystem(tmp_path, 128, options="ro") as fs:
        error = _refused(fs.mountpoint)
    assert error.exit_code == Exit.USAGE and "read-only filesystem" in error.message


def test_a_full_filesystem_is_refused_and_a_reservation_past_it_fails_cleanly(
    loopfs: LoopFs,
) -> None:
    filler = loopfs.mountpoint / "filler"
    free = os.statvfs(loopfs.mountpoint).f_bavail * os.statvfs(loopfs.mountpoint).f_frsize
    with filler.open("wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, free - 24 * MIB)
    before = used_bytes(loopfs.mountpoint)
    error = _refused(loopfs.mountpoint)
    assert error.exit_code == Exit.USAGE and "MiB free" in error.message
    # with the margin check told to let it through (a margin below zero), the filesystem itself
    # says no at the reservation, before a byte is written
    error = _refused(loopfs.mountpoint, min_free=-(1 << 30), size=64 * MIB)
    assert error.exit_code == Exit.FAILED and "no room for a 64 MiB test file" in error.message
    assert sorted(p.name for p in loopfs.mountpoint.iterdir()) == ["filler", "lost+found"]
    assert used_bytes(loopfs.mountpoint) == before


def test_a_directory_removed_mid_run_ends_in_one_line_and_nothing_left(loopfs: LoopFs) -> None:
    data = loopfs.mountpoint / "vanishing"
    data.mkdir()
    before = used_bytes(loopfs.mountpoint)
    started = threading.Event()

    def remove_when_running() -> None:
        started.wait(30)
        data.rmdir()  # empty to the eye: an O_TMPFILE has no name in it

    remover = threading.Thread(target=remove_when_running)
    remover.start()
    with pytest.raises(StorageProbeError) as raised:
        run_probe(
            ProbeRequest(data, size=256 * MIB, seconds=20, threads=2),
            on_progress=lambda _progress: started.set(),
        )
    remover.join()
    assert raised.value.exit_code == Exit.FAILED
    assert "was removed while the probe ran" in raised.value.message
    assert not data.exists() and abs(used_bytes(loopfs.mountpoint) - before) < 4 * MIB


def test_a_symlink_out_of_the_filesystem_is_refused(loopfs: LoopFs, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    link = loopfs.mountpoint / "data"
    link.symlink_to(outside)
    error = _refused(link)
    assert error.exit_code == Exit.USAGE and "is a symlink to" in error.message
    assert list(outside.iterdir()) == []


def _sparkdiag(*args: str, cgroup: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = sparkdiag_cmd(*args)
    return subprocess.run(
        in_cgroup(cgroup, argv) if cgroup is not None else argv,
        capture_output=True, text=True, timeout=180, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def test_check_judges_the_throttled_device_slow_and_the_unthrottled_fit(
    loopfs: LoopFs, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    data = loopfs.mountpoint / "data"
    data.mkdir()
    # 256 MiB: with the buffers in huge pages the unthrottled device writes ~1.8 GB/s, and a
    # 64 MiB write (35 ms) read 0.28 of its baseline in 2 of 4 runs here: noise, not the drive
    bounds = ("--storage.size", "256M", "--storage.duration", "6")
    for _ in range(3):  # three healthy runs learn the baseline
        learned = _sparkdiag("storage", str(data), "--state-dir", str(state), *bounds)
        assert learned.returncode == 0, learned.stdout + learned.stderr
    assert "fit" in learned.stdout or "learning" in learned.stdout

    def storage_row(cgroup: Path | None = None) -> dict[str, object]:
        done = _sparkdiag("check", "--quick", "--json", "--storage", str(data),
                          "--state-dir", str(state), *bounds, cgroup=cgroup)  # fmt: skip
        assert "Traceback" not in done.stderr
        rows = json.loads(done.stdout)["checks"]
        return next(r for r in rows if r["name"] == "storage-speed")

    fit = storage_row()
    if fit["status"] != "pass":
        # once more: beside a full CI run on 2 cores an unthrottled read came out at 0.55 of
        # its baseline (3 of 3 passes alone); the loop device's figure is noise there, and the
        # throttled run below is what this test judges
        fit = storage_row()
    assert fit["status"] == "pass", fit
    with blkio_throttle(loopfs.majmin, 20 * MIB) as group:
        slow = storage_row(group)
    assert slow["status"] == "warn", slow
    assert str(slow["finding"]).startswith("slow "), slow
    figures = {f["direction"]: f for f in slow["data"]["figures"]}  # type: ignore[index]
    assert figures["write"]["ratio"] < 0.7 and figures["read"]["ratio"] < 0.7
    assert figures["write"]["bytes_per_second"] < 25 * MIB  # held to 20 MiB/s by the throttle


# -- fio, the reference tool -------------------------------------------------------------------


def test_the_probe_agrees_with_fio_within_ten_percent(loopfs: LoopFs, tmp_path: Path) -> None:
    """benchmarks/storage_fio.py: five rounds, each the probe then fio with the same flags on
    the same filesystem, the median of the rounds' ratios within 10 % for sequential write and
    read. The loop device is held to 300 MiB/s (blkio): this shared machine's disk varies 0.6 to
    2.2 GB/s from one round to the next unthrottled (docs/storage.md), which says nothing about
    either tool. Both must also read near the throttle's rate: a figure from the page cache
    would not be held to it."""
    binary = shutil.which("fio")
    if binary is None:
        pytest.skip("fio not installed (apt-get install fio)")
    figures = tmp_path / "rounds.json"
    script = ROOT / "benchmarks" / "storage_fio.py"
    argv = [sys.executable, str(script), str(loopfs.mountpoint), "--fio", binary,
            "--rounds", "5", "--size", "256M", "--threads", "4", "--seconds", "3",
            "--json", str(figures)]  # fmt: skip
    rate = 300 * MIB
    with blkio_throttle(loopfs.majmin, rate) as group:
        done = subprocess.run(in_cgroup(group, argv), capture_output=True, text=True,
                              timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(figures.read_text())["rounds"]
    for direction in ("read", "write"):
        ratios = [r[f"probe_{direction}"] / r[f"fio_{direction}"] for r in results]
        assert abs(statistics.median(ratios) - 1) <= 0.10, (direction, ratios)
        probe = statistics.median(r[f"probe_{direction}"] for r in results)
        assert 0.85 * rate <= probe <= 1.15 * rate, (direction, probe)
    assert sorted(p.name for p in loopfs.mountpoint.iterdir()) == ["lost+found"]


def test_reads_from_the_page_cache_are_said_and_teach_no_baseline(tmp_path: Path) -> None:
    """ext4 mounted data=journal takes O_DIRECT and buffers it without a word: the probe read
    2048 MiB at 5.31 GB/s (random p50 1.4 µs) while /sys/block/loopN/stat counted 0 MiB read,
    and the verdict was fit, exit 0, the baseline learned. The device's counters tell it: the
    verdict is cached (exit 1), nothing is learned and storage.json is not written."""
    state = tmp_path / "state"
    with loop_filesystem(tmp_path, 256, options="data=journal") as fs:
        data = fs.mountpoint / "data"
        data.mkdir()
        done = _sparkdiag("storage", str(data), "--json", "--state-dir", str(state),
                          "--storage.size", "64M", "--storage.duration", "4")  # fmt: skip
        assert list(data.iterdir()) == []
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["verdict"] == "cached" and doc["exit_status"] == 1, doc
    assert doc["verdict_reason"].startswith("the reads came from a cache, not the drive: loop")
    reads = next(f for f in doc["figures"] if f["direction"] == "read")
    assert doc["device_read_bytes"] < reads["bytes"] / 2
    assert doc["recorded"] and not doc["learned_from"]
    assert {f["verdict"] for f in doc["figures"]} == {"cached"}
    assert not (state / "storage.json").exists()
