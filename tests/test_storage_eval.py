"""A storage probe's figures judged: the storage baselines in the store, the one slow rule, the
state file with each figure's previous value, the collector, the text and JSON a user reads, the
check row, the daemon's periodic probe, the CLI's exit statuses and the settings."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sparkdiag.baseline.storage_store import StorageKey
from sparkdiag.baseline.store import BaselineStore, open_store
from sparkdiag.check.model import CheckContext, StorageProbe
from sparkdiag.check.storage_checks import check_storage_speed
from sparkdiag.config import ConfigError, build_settings
from sparkdiag.exporter.storage import StorageCollector
from sparkdiag.snapshot import PcieLink
from sparkdiag.sources.host.blockdev import BlockChain
from sparkdiag.sources.host.mounts import Mount, read_mounts
from sparkdiag.storage.ceiling import link_bytes_per_second, rated
from sparkdiag.storage.evaluate import evaluate, keys, other_io
from sparkdiag.storage.model import Latency, ProbeDocument, Throughput
from sparkdiag.storage.periodic import StoragePeriodic
from sparkdiag.storage.render import text
from sparkdiag.storage.state import StorageStateError, read_state, record_report
from sparkdiag.storage.target import PSEUDO_FSTYPES, StorageTarget, locate, refusal
from tests.support import fixture_snapshot, invoke_cli

GB = 1e9
SPARK_LINK = PcieLink("0004:01:00.0", "nvme", "nvme", 32e9, 32e9, 4, 4)


def target(links: tuple[PcieLink, ...] = (SPARK_LINK,)) -> StorageTarget:
    mount = Mount("/data", "ext4", "/dev/nvme0n1p2", 259, 2, False)
    chain = BlockChain("nvme0n1p2", "nvme", ("nvme0n1",), ("nvme0",), ("0004:01:00.0",),
                       ("nvme0n1p2 partition", "nvme0n1 nvme disk"))  # fmt: skip
    return StorageTarget("/data/ckpt", mount, chain, links, ())


def doc(write: float, read: float, at: float = 1000.0) -> ProbeDocument:
    """A probe of 1 GiB that moved at ``write`` and ``read`` GB/s."""
    size = 1 << 30
    return ProbeDocument(
        "ok", None, "/data/ckpt", True, size, 1 << 20, 8,
        (Throughput("read", "host", 4 * size, 4 * size / (read * GB)),
         Throughput("write", "host", size, size / (write * GB))),
        0.01, Latency(2000, 1.0, 4096, 70e-6, 180e-6, 2e-3), size, at - 10, at,
    )  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> BaselineStore:
    return open_store(tmp_path, create=True)


def test_pcie_ceilings() -> None:
    assert link_bytes_per_second(32e9, 4) == pytest.approx(15.75e9, rel=1e-3)  # Gen5 x4
    assert link_bytes_per_second(16e9, 4) == pytest.approx(7.877e9, rel=1e-3)
    assert link_bytes_per_second(2.5e9, 1) == 250e6  # Gen1: 8b/10b
    assert link_bytes_per_second(None, 4) is None and link_bytes_per_second(32e9, 0) is None
    assert target().ceiling == pytest.approx(15.75e9, rel=1e-3)
    spark = rated("SAMSUNG MZAL84T0HDLB-00BTW")  # any PM9E1 part number
    assert spark is not None and spark.read == 14.5e9 and rated("WDC PC SN740") is None


def test_three_healthy_runs_learn_the_median_and_five_freeze_it(store: BaselineStore) -> None:
    key = StorageKey("", "/data", "nvme0n1p2", "write", "host", "o_direct:1048576x8")
    assert store.record_storage(key, 8e9, True) is None
    assert store.record_storage(key, 1e9, False) is None  # unhealthy: kept, not learned
    assert store.record_storage(key, 9e9, True) is None
    learned = store.record_storage(key, 7e9, True)
    assert learned is not None and learned.bytes_per_second == 8e9 and learned.runs == 3
    store.record_storage(key, 10e9, True)
    frozen = store.record_storage(key, 10e9, True)
    assert frozen is not None and frozen.runs == 5 and frozen.bytes_per_second == 9e9
    assert store.record_storage(key, 1e9, True).bytes_per_second == 9e9  # type: ignore[union-attr]
    pinned = store.pin_storage(key, 6e9, "after the firmware update")
    assert store.record_storage(key, 1e9, True) == pinned
    assert [b.key for b in store.storage_baselines()] == [key]
    assert store.reset_storage("/data") == 1 and store.storage_baseline(key) is None
    with pytest.raises(ValueError):
        store.record_storage(key, float("nan"), True)
    with pytest.raises(ValueError):
        StorageKey("", "", "nvme0n1p2", "write", "host", "m")


def test_a_figure_under_0_7_of_its_baseline_is_slow(store: BaselineStore) -> None:
    for at in (1.0, 2.0, 3.0):
        report = evaluate(target(), doc(8.0, 11.0, at), store, record=True)
    assert report.verdict == "fit" and report.learned_from
    slow = evaluate(target(), doc(5.5, 11.0, 4.0), store, record=False)
    write = slow.figure("write")
    assert write is not None and write.ratio == pytest.approx(5.5 / 8.0) and write.verdict == "slow"
    assert slow.verdict == "slow" and not slow.recorded
    at_limit = evaluate(target(), doc(5.6, 11.0, 5.0), store, record=False)
    assert at_limit.verdict == "fit"  # 0.7 exactly is not under 0.7


def test_a_run_beside_other_io_is_not_learned_from(store: BaselineStore) -> None:
    probe = doc(8.0, 11.0)
    ours_read = 4 * (1 << 30) + 2000 * 4096
    noisy = other_io(probe, (0, 0), (ours_read + (1 << 30), 1 << 30))
    assert noisy == 1 << 30
    report = evaluate(target(), probe, store, record=True, other_io_bytes=noisy)
    assert report.recorded and not report.learned_from
    key = keys(target(), probe)[("write", "host")]
    assert store.storage_baseline(key) is None
    assert other_io(probe, None, (1, 1)) is None


def test_the_state_keeps_the_previous_figure_and_the_collector_exports_it(
    store: BaselineStore, tmp_path: Path
) -> None:
    path = tmp_path / "storage.json"
    for at, write in ((1.0, 8.0), (2.0, 8.2), (3.0, 7.8), (4.0, 5.0)):
        record_report(path, evaluate(target(), doc(write, 11.0, at), store, record=True))
    [kept] = read_state(path) or ()
    write = next(f for f in kept.figures if f.direction == "write")
    assert write.bytes_per_second == pytest.approx(5.0 * GB) and write.previous == pytest.approx(
        7.8 * GB
    )
    assert write.baseline == pytest.approx(8.0 * GB)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StorageCollector(path))
    labels = {"mountpoint": "/data", "device": "nvme0n1p2", "direction": "write", "path": "host"}
    get = registry.get_sample_value
    assert get("sparkdiag_storage_throughput_bytes_per_second", labels) == pytest.approx(5 * GB)
    assert get("sparkdiag_storage_previous_throughput_bytes_per_second", labels) == pytest.approx(
        7.8 * GB
    )
    assert get("sparkdiag_storage_baseline_bytes_per_second", labels) == pytest.approx(8 * GB)
    p99 = {"mountpoint": "/data", "device": "nvme0n1p2", "quantile": "0.99"}
    assert get("sparkdiag_storage_read_latency_seconds", p99) == 180e-6
    assert get("sparkdiag_storage_probe_timestamp_seconds", {"mountpoint": "/data"}) == 4.0
    assert get("sparkdiag_storage_probe_written_bytes", {"mountpoint": "/data"}) == 1 << 30
    # nothing measured along the GPU paths: no series for them
    assert get("sparkdiag_storage_throughput_bytes_per_second", {**labels, "path": "gpu"}) is None


def test_a_damaged_state_file_is_an_error_and_is_replaced(
    store: BaselineStore, tmp_path: Path
) -> None:
    path = tmp_path / "storage.json"
    path.write_text("{half")
    with pytest.raises(StorageStateError, match="is damaged"):
        read_state(path)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StorageCollector(path))
    assert list(registry.collect()) == []
    record_report(path, evaluate(target(), doc(8.0, 11.0), store, record=False))
    assert len(read_state(path) or ()) == 1
    assert read_state(tmp_path / "none.json") is None


def test_the_text_fits_80_columns_and_says_cost_and_ceiling(store: BaselineStore) -> None:
    report = evaluate(target(), doc(8.0, 11.0), store, record=True)
    shown = text(report, 80)
    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    assert "8 GB/s" in shown and "51% of 15.8 GB/s" in shown  # write 8 of a 15.75 GB/s link
    assert "p50 70 µs, p99 180 µs" in shown
    assert "cost: wrote 1 GiB" in shown and "O_TMPFILE" in shown
    json.dumps(report.as_json(), allow_nan=False)


def test_storage_speed_rows(store: BaselineStore, tmp_path: Path) -> None:
    snap = fixture_snapshot("h200-idle", tmp_path)

    def row(probe: StorageProbe | None) -> tuple[str, str]:
        [result] = check_storage_speed(CheckContext(snapshot=snap, storage=probe))
        return result.status, result.finding

    assert row(None)[0] == "skip"
    assert row(StorageProbe(None, "refused: /x is a device", refused=True))[0] == "warn"
    assert row(StorageProbe(None, "the storage probe ... did not finish"))[0] == "fail"
    learning = evaluate(target(), doc(8.0, 11.0), None, record=False)
    assert row(StorageProbe(learning)) == (
        "pass", "/data/ckpt on nvme0n1p2: read 11 GB/s, write 8 GB/s, link 15.8 GB/s, 4 KiB "
        "p99 180 µs (no baseline yet)",
    )  # fmt: skip
    for at in (1.0, 2.0, 3.0):
        evaluate(target(), doc(8.0, 11.0, at), store, record=True)
    status, finding = row(StorageProbe(evaluate(target(), doc(2.0, 11.0), store, record=False)))
    assert status == "warn" and finding.startswith("slow write (under 0.7 of baseline)")
    assert "write 2 GB/s (0.25 of 8 GB/s)" in finding
    # a drive at 0.2 % of its baseline keeps its digits (it read "(0.00 of ...)")
    status, finding = row(StorageProbe(evaluate(target(), doc(0.016, 11.0), store, record=False)))
    assert status == "warn" and "write 16 MB/s (0.002 of 8 GB/s)" in finding
    # reads the device did not serve: the figures are the page cache's, so the row warns and
    # says so (a cached run passed it, fit against its baseline)
    probe = doc(8.0, 11.0)
    cached = evaluate(target(), probe, store, record=False, device_read_bytes=0)
    status, finding = row(StorageProbe(cached))
    assert status == "warn"
    assert finding.startswith("/data/ckpt on nvme0n1p2: the reads came from a cache, not the drive")


def test_the_periodic_probe_skips_while_a_gpu_is_busy(tmp_path: Path) -> None:
    settings = build_settings(None, {"storage_enabled": True, "state_dir": tmp_path})
    busy = fixture_snapshot("h200-idle", tmp_path, {"utilization": {"gpu": 95, "memory": 0}})
    line = StoragePeriodic(settings, lambda: busy).once()
    assert line.startswith("storage probe skipped: GPU 0 busy"), line
    assert not (tmp_path / "storage.json").exists()


def test_the_periodic_probe_measures_and_records(tmp_path: Path) -> None:
    settings = build_settings(None, {"storage_enabled": True, "state_dir": tmp_path,
                                     "storage_size": "16M", "storage_duration": "2"})  # fmt: skip
    line = StoragePeriodic(settings, lambda: None).once()
    assert line.startswith(f"storage probe of {tmp_path}") and "wrote 16 MiB" in line, line
    assert (tmp_path / "storage.json").exists() and (tmp_path / "baselines.sqlite").exists()


def test_settings_take_sizes_and_the_probe_is_off_by_default() -> None:
    settings = build_settings(None, {}, "serve")
    assert settings.storage_enabled is False and settings.storage_size == 1 << 30
    assert build_settings(None, {}, "check").storage_size == 256 << 20
    assert build_settings(None, {"storage_size": "1.5G"}, "storage").storage_size == 3 << 29
    with pytest.raises(ConfigError, match="16 MiB to 64 GiB"):
        build_settings(None, {"storage_size": "1M"}, "storage")
    with pytest.raises(ConfigError, match="is not an integer"):
        build_settings(None, {"storage_size": "12Q"}, "storage")


def test_locate_names_this_machines_root_filesystem() -> None:
    found = locate(Path("/tmp"))
    assert found.mountpoint and found.mount is not None
    assert found.kind in {"nvme", "virtio", "sata", "scsi", "dm", "md", "loop", "other", "memory",
                          "network", "zfs", "unknown"}  # fmt: skip


def test_cli_exit_statuses_and_json(tmp_path: Path) -> None:
    refused = invoke_cli("storage", "/dev/null", "--state-dir", str(tmp_path))
    assert refused.returncode == 2 and refused.stderr.startswith("Error: refused: /dev/null is")
    assert "Traceback" not in refused.stderr and refused.stderr.count("\n") == 1
    bad = invoke_cli("storage", str(tmp_path), "--storage.size", "lots")
    assert bad.returncode == 2 and "storage.size" in bad.stderr
    measured = invoke_cli("storage", str(tmp_path), "--json", "--state-dir", str(tmp_path / "s"),
                          "--storage.size", "16M", "--storage.duration", "2")  # fmt: skip
    assert measured.returncode == 0, measured.stderr
    doc = json.loads(measured.stdout)
    assert doc["schema"] == "sparkdiag-storage-report/1" and doc["verdict"] == "learning"
    assert {f["direction"] for f in doc["figures"]} == {"read", "write"}
    assert doc["bytes_written"] == 16 << 20 and doc["tmpfile"] is True
    assert [p.name for p in tmp_path.iterdir()] == ["s"]
    # off a terminal, a line as each phase starts (before, nothing at all)
    assert measured.stderr.splitlines() == [
        "sparkdiag storage: writing a 16 MiB test file…",
        "sparkdiag storage: flushing it to the drive (fdatasync)…",
        "sparkdiag storage: reading it back…",
        "sparkdiag storage: random 4 KiB reads…",
    ]
    bounds = ("--storage.size", "16M", "--storage.duration", "2")
    no_record = invoke_cli("storage", str(tmp_path / "s"), "--no-record", "--state-dir",
                           str(tmp_path / "t"), *bounds)  # fmt: skip
    assert no_record.returncode == 0 and not (tmp_path / "t").exists()


def test_json_says_refused_and_why_with_the_exit_status(tmp_path: Path) -> None:
    """Before: 'storage --json' on a refused directory printed nothing on standard output."""
    refused = invoke_cli("storage", "/dev/null", "--json", "--state-dir", str(tmp_path))
    assert refused.returncode == 2
    assert json.loads(refused.stdout) == {
        "schema": "sparkdiag-storage-report/1",
        "status": "refused",
        "directory": "/dev/null",
        "reason": "refused: /dev/null is a device: sparkdiag never writes to a raw device; give "
        "a directory on a filesystem of that drive",
        "exit_status": 2,
    }
    assert refused.stderr.startswith("Error: refused: /dev/null is a device")  # as without
    empty = invoke_cli("storage", "", "--json", "--state-dir", str(tmp_path))
    doc = json.loads(empty.stdout)
    assert empty.returncode == 2 and (doc["status"], doc["exit_status"]) == ("error", 2)
    assert doc["reason"].startswith("DIR is empty")
    measured = invoke_cli("storage", str(tmp_path), "--json", "--no-record", "--state-dir",
                          str(tmp_path / "s"), "--storage.size", "16M", "--storage.duration",
                          "2")  # fmt: skip
    doc = json.loads(measured.stdout)
    assert measured.returncode == 0 and (doc["status"], doc["exit_status"]) == ("measured", 0)


def test_an_empty_dir_is_a_usage_error_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: 'storage ""' (an unset variable) measured the current directory."""
    monkeypatch.chdir(tmp_path)
    done = invoke_cli("storage", "", "--storage.size", "16M", "--storage.duration", "2",
                      "--state-dir", str(tmp_path / "s"))  # fmt: skip
    assert done.returncode == 2, done.stdout
    assert done.stderr == (
        "Error: DIR is empty: give the directory to measure ('.' for the current one), or leave "
        "it out for the state directory\n"
    )
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


def test_a_pseudo_filesystem_is_refused_before_the_program_runs(tmp_path: Path) -> None:
    """Before: 'storage /proc' said "the storage probe failed: /proc was removed before the probe
    could start" (exit 3), and /dev (devtmpfs) was measured, a test file written beside the
    device nodes."""
    mounts = {m.mountpoint: m.fstype for m in read_mounts(Path("/"))}
    for directory in ("/proc", "/sys", "/dev"):
        if mounts.get(directory) not in PSEUDO_FSTYPES:
            continue  # a container's /dev may be a tmpfs
        refused = invoke_cli("storage", directory, "--state-dir", str(tmp_path))
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr == (
            f"Error: refused: {directory} is on {mounts[directory]}, a pseudo-filesystem of the "
            "kernel: no drive is under it; give a directory on a drive's filesystem (where the "
            "data is)\n"
        )
    assert not list(tmp_path.iterdir())
    proc = invoke_cli("storage", "/proc/self", "--state-dir", str(tmp_path))
    assert proc.returncode == 2 and "is on proc (mounted at /proc), a pseudo" in proc.stderr


def test_a_loop_device_header_leaves_out_the_disk_it_has_not() -> None:
    """Before: '/mnt (ext4 on /dev/loop0):  (loop)', an empty disk name."""
    mount = Mount("/mnt", "ext4", "/dev/loop0", 7, 0, False)
    loop = BlockChain("loop0", "loop", layers=("loop0 loop on /var/disk.img",))
    assert StorageTarget("/mnt", mount, loop).describe() == (
        "/mnt (ext4 on /dev/loop0): loop0 loop on /var/disk.img"
    )
    bare = BlockChain("loop0", "loop", layers=("loop0 loop",))
    assert StorageTarget("/mnt", mount, bare).describe() == "/mnt (ext4 on /dev/loop0): loop0 loop"
    nothing = BlockChain("loop0", "loop")
    assert StorageTarget("/mnt", mount, nothing).describe() == "/mnt (ext4 on /dev/loop0)"


def test_a_tmpfs_is_measured_as_memory_and_a_devtmpfs_refused() -> None:
    """A tmpfs holds users' files (/dev/shm): measured, named memory, no link ceiling."""
    tmpfs = StorageTarget("/dev/shm", Mount("/dev/shm", "tmpfs", "tmpfs", 0, 25, False), None)
    assert refusal(tmpfs) is None and tmpfs.kind == "memory" and tmpfs.ceiling is None
    assert tmpfs.describe() == "/dev/shm (tmpfs on tmpfs): memory, no drive"
    dev = StorageTarget("/dev/disk", Mount("/dev", "devtmpfs", "udev", 0, 5, False), None)
    assert refusal(dev) == (
        "/dev/disk is on devtmpfs (mounted at /dev), a pseudo-filesystem of the kernel: no drive "
        "is under it; give a directory on a drive's filesystem (where the data is)"
    )
    assert refusal(target()) is None
    assert refusal(StorageTarget("/x", None, None)) is None  # mountinfo unreadable: the program


def test_check_help_and_storage_help_say_it_writes() -> None:
    for command in ("storage", "check"):
        shown = invoke_cli(command, "--help").stdout
        assert "WRITES" in shown, command
    assert subprocess.run(["true"], check=False).returncode == 0
    assert replace(target(), links=()).ceiling is None


def test_progress_on_a_terminal_names_every_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the status line follows the program's phases: the flush and the random
    reads showed the write's last figures, for as long as they took."""
    import io

    from sparkdiag.commands.storage import _Progress
    from sparkdiag.storage.run import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", "100")
    stream = Tty()
    shown = _Progress("1 GiB", stream)
    for item in (Progress("write", 512 << 20, 1.0), Progress("flush", 1 << 30, 0.0),
                 Progress("read", 256 << 20, 2.0), Progress("random", 4096 * 12_000, 3.0),
                 Progress("gpu", 0, 0.0)):  # fmt: skip
        shown.show(item)
    parts = [part.strip() for part in stream.getvalue().split("\r") if part.strip()]
    # a line shorter than the one before is written twice: after the padding that erases it
    lines = [part for i, part in enumerate(parts) if i == 0 or part != parts[i - 1]]
    assert lines == [
        "write: 512 MiB in 1 s…",
        "flushing it to the drive (fdatasync)…",
        "read: 256 MiB in 2 s…",
        "random 4 KiB reads: 12,000 in 3 s…",
        "reading it into the GPU (the probe worker)…",
    ]


# -- the review's defects: a cache's reads, a slow run learned from, one note, small ratios ------


def test_reads_the_device_did_not_serve_are_cached_and_teach_nothing(
    store: BaselineStore, tmp_path: Path
) -> None:
    """ext4 mounted data=journal buffers O_DIRECT without a word: the probe read 2048 MiB at
    5.31 GB/s while the device read 0 MiB, and the run was judged fit and learned from."""
    from sparkdiag.commands.storage import exit_status
    from sparkdiag.storage.evaluate import device_read

    for at in (1.0, 2.0, 3.0):
        evaluate(target(), doc(8.0, 11.0, at), store, record=True)
    probe = doc(8.0, 11.0, 4.0)
    ours = probe.host_read_bytes
    assert device_read((0, 0), (0, 1 << 30)) == 0  # read nothing, wrote: it counts
    assert device_read((0, 0), (5, 0)) is None  # counted no write at all: counts nothing
    assert device_read(None, (0, 1)) is None
    cached = evaluate(target(), probe, store, record=True, device_read_bytes=ours // 4)
    assert cached.verdict == "cached" and cached.recorded and not cached.learned_from
    assert {f.verdict for f in cached.figures} == {"cached"}
    assert exit_status(cached) == 1
    shown = text(cached, 200)
    assert (
        "CACHED: the reads came from a cache, not the drive: nvme0n1p2 read 1026 MiB while the "
        "probe read back 4104 MiB" in shown
    )
    assert "fit" not in shown and "O_DIRECT" in shown
    as_json = cached.as_json()
    assert as_json["verdict"] == "cached" and as_json["device_read_bytes"] == ours // 4
    assert as_json["verdict_reason"].startswith("the reads came from a cache")
    # not learned from: the baseline is the three runs' (8 GB/s), not moved by a fourth at 8.0
    key = keys(target(), probe)[("write", "host")]
    runs = store.storage_baseline(key)
    assert runs is not None and runs.runs == 3
    # the device read what the probe read (O_DIRECT honoured): fit, learned from
    fit = evaluate(target(), doc(8.0, 11.0, 5.0), store, record=True, device_read_bytes=ours)
    assert fit.verdict == "fit" and fit.learned_from and exit_status(fit) == 0
    # no counters (tmpfs, a network share): as before
    assert evaluate(target(), probe, store, record=False).verdict == "fit"


def test_a_cached_run_is_not_kept_in_storage_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is what the metrics export: a page cache's figures are no drive's."""
    from sparkdiag.storage import session
    from sparkdiag.storage.run import ProbeRequest

    counters = iter([(0, 0), (4096, 1 << 30)])  # the device read 4 KiB of the probe's 4 GiB
    mount = Mount(str(tmp_path), "ext4", "/dev/vdz", 252, 0, False)
    found = StorageTarget(str(tmp_path), mount, BlockChain("vdz", "virtio"))
    monkeypatch.setattr(session, "locate", lambda *_a: found)
    monkeypatch.setattr(session, "io_bytes", lambda *_a: next(counters))
    monkeypatch.setattr(session, "run_probe", lambda *_a: doc(8.0, 11.0))
    where = session.Where(state_dir=tmp_path / "state")
    report = session.probe_directory(ProbeRequest(tmp_path), where)
    assert report.verdict == "cached" and report.device_read_bytes == 4096
    assert report.recorded and not report.learned_from
    assert (tmp_path / "state" / "baselines.sqlite").exists()
    assert not (tmp_path / "state" / "storage.json").exists()


def test_a_btrfs_over_several_devices_is_not_judged_by_one_devices_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """btrfs raid1 may serve every read from the other mirror: the source device's counter
    reading little is no cache there; a btrfs on one device is judged as ext4 is."""
    from sparkdiag.storage import session
    from sparkdiag.storage.run import ProbeRequest

    sysfs = tmp_path / "sys"
    members = sysfs / "fs" / "btrfs" / "0f2c" / "devices"
    members.mkdir(parents=True)
    (members / "vdz").touch()
    mount = Mount(str(tmp_path), "btrfs", "/dev/vdz", 0, 40, False)
    found = StorageTarget(str(tmp_path), mount, BlockChain("vdz", "virtio"))
    assert session._sees_every_read(found, sysfs)
    assert session._sees_every_read(replace(found, mount=None), sysfs)
    (members / "vdy").touch()
    assert not session._sees_every_read(found, sysfs)
    assert not session._sees_every_read(found, tmp_path / "no-sysfs")  # cannot be told
    counters = iter([(0, 0), (4096, 1 << 30)])
    monkeypatch.setattr(session, "locate", lambda *_a: found)
    monkeypatch.setattr(session, "io_bytes", lambda *_a: next(counters))
    monkeypatch.setattr(session, "run_probe", lambda *_a: doc(8.0, 11.0))
    where = session.Where(sysfs=sysfs, state_dir=tmp_path / "state")
    report = session.probe_directory(ProbeRequest(tmp_path), where)
    assert report.verdict == "learning" and report.device_read_bytes is None


def test_a_figure_judged_slow_does_not_teach_the_baseline(store: BaselineStore) -> None:
    """Runs 4 and 5 still move a learned baseline (median of the first healthy runs, frozen at
    5): a slow fourth run pulled it from 9 to 8.5 GB/s, and was called healthy."""
    for at, gbps in ((1.0, 8.0), (2.0, 9.0), (3.0, 10.0)):
        evaluate(target(), doc(gbps, 11.0, at), store, record=True)
    key = keys(target(), doc(8.0, 11.0))[("write", "host")]
    assert store.storage_baseline(key).bytes_per_second == 9 * GB  # type: ignore[union-attr]
    slow = evaluate(target(), doc(2.0, 11.0, 4.0), store, record=True)
    assert store.storage_baseline(key).bytes_per_second == 9 * GB  # type: ignore[union-attr]
    assert slow.verdict == "slow" and slow.recorded
    write, read = slow.figure("write"), slow.figure("read")
    assert write is not None and not write.learned_from and write.verdict == "slow"
    assert read is not None and read.learned_from  # the read was fit: it still teaches
    assert {f["direction"]: f["learned_from"] for f in slow.as_json()["figures"]} == {
        "read": True, "write": False}  # fmt: skip


def test_the_text_and_the_help_say_how_the_baseline_is_learned(store: BaselineStore) -> None:
    """They said "the median of the first 3 healthy runs" while runs 4 and 5 moved it."""
    shown = " ".join(invoke_cli("storage", "--help").stdout.split())
    assert "median of the first healthy runs, set at 3 and frozen at 5" in shown
    assert "first 3 healthy runs" not in shown
    learning = evaluate(target(), doc(8.0, 11.0, 1.0), store, record=True)
    said = " ".join(text(learning, 80).split())
    assert (
        "learning: the baseline is the median of the first healthy runs, set at 3 and "
        "frozen at 5; a run judged slow against it, or beside other I/O, is not learned "
        "from" in said
    )


def test_small_ratios_keep_their_digits(store: BaselineStore) -> None:
    """A drive at 0.2 % of its baseline read "(0.00)"."""
    for at in (1.0, 2.0, 3.0):
        evaluate(target(), doc(8.0, 11.0, at), store, record=True)
    shown = text(evaluate(target(), doc(0.016, 11.0, 4.0), store, record=False), 80)
    assert "8 GB/s (0.002)" in shown and "(0.00)" not in shown
    from sparkdiag.storage.render import ratio

    assert [ratio(v) for v in (0.93, 0.01, 0.002, 0.0049, 0.0004)] == [
        "0.93", "0.01", "0.002", "0.005", "<0.001"]  # fmt: skip


def test_a_state_dir_that_is_a_file_says_not_recorded_once(tmp_path: Path) -> None:
    """The note said the same sentence twice (the store's and storage.json's), and the text
    told who had just run 'sparkdiag storage DIR' to run it."""
    state = tmp_path / "state"
    state.write_text("")
    (tmp_path / "m").mkdir()
    bounds = ("--storage.size", "16M", "--storage.duration", "2", "--state-dir", str(state))
    done = invoke_cli("storage", str(tmp_path / "m"), "--json", *bounds)
    assert done.returncode == 0, done.stderr
    note = json.loads(done.stdout)["store_note"]
    assert note.startswith(f"not recorded: state directory {state} is a file, not a directory")
    assert note.count("is a file") == 1
    shown = " ".join(invoke_cli("storage", str(tmp_path / "m"), *bounds).stdout.split())
    assert "run 'sparkdiag storage DIR'" not in shown
    assert "this run was not recorded" in shown and shown.count("is a file") == 1
