"""Where the job writes and reads, and what sparkdiag storage measured there (issue 30's part in
watch): the files a real process holds open, their mounts on this machine, storage.json read
from a state directory, the evidence and advice built from a recording, and watch end to end
on a real job reading a real file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sparkdiag.sources.host import procfs
from sparkdiag.sources.host.mounts import find_mount, read_mounts
from sparkdiag.watch import places
from sparkdiag.watch.diagnose import diagnose
from sparkdiag.watch.model import Place, Recording, StoreSpeed, load
from tests.support import NVML, ROOT, invoke_cli
from tests.support.watch import periodic, saving, short_window

STORAGE_STATE = ROOT / "tests/fixtures/state/storage-vda/storage.json"  # measured on /dev/vda

HOLD = """
import sys, time
w = open(sys.argv[1], "wb"); r = open(sys.argv[2], "rb")
w.write(b"x" * 4096); w.flush()
print("ready", flush=True)
time.sleep(30)
"""


@pytest.fixture
def holder(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "in.bin").write_bytes(b"y" * 4096)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "out.ckpt"), str(tmp_path / "in.bin")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()


def test_the_files_a_process_holds_open_and_how(
    holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    found = {f.path: f.writing for f in procfs.open_files(Path("/"), holder.pid)}
    assert found[str(tmp_path / "out.ckpt")] is True
    assert found[str(tmp_path / "in.bin")] is False
    assert not any(p.startswith(("/dev/", "/proc/")) for p in found)  # its stdio, /dev/null
    # only the processes that wrote (read) heavily are looked at, and only in a heavy tick
    writing, reading = places.heavy_files(Path("/"), {holder.pid: 2e9}, {holder.pid: 5e8})
    assert writing == (str(tmp_path / "out.ckpt"),) and reading == (str(tmp_path / "in.bin"),)
    assert places.heavy_files(Path("/"), {holder.pid: 1e6}, {holder.pid: 1e6}) == ((), ())


def test_a_directory_is_placed_on_its_mount_as_findmnt_does(tmp_path: Path) -> None:
    files = [str(tmp_path / "a.ckpt"), str(tmp_path / "b.ckpt")]
    (place,) = places.locate_places(Path("/"), Path("/sys"), os.getpid(), files)
    out = subprocess.run(["findmnt", "-n", "-T", str(tmp_path), "-o", "TARGET,FSTYPE"],
                         capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert (place.directory, place.mountpoint, place.fstype) == (str(tmp_path), *out)
    assert place.kind  # the storage probe's reading of it (virtio here, nvme, network...)
    # a job in another mount namespace: its own mountinfo (here the same file's text)
    mount = find_mount(read_mounts(Path("/"), os.getpid()), str(tmp_path))
    assert mount is not None and mount.mountpoint == place.mountpoint


def test_the_storage_probe_s_figures_are_read_from_the_state_directory(tmp_path: Path) -> None:
    (tmp_path / "storage.json").write_bytes(STORAGE_STATE.read_bytes())
    (store,), unread = places.read_stores(tmp_path)
    assert unread == ""
    assert (store.mountpoint, store.device, store.kind) == ("/", "vda", "virtio")
    assert store.write_bps == pytest.approx(1231800406.48) and store.read_bps == pytest.approx(
        747749645.09
    )
    assert places.read_stores(tmp_path / "none") == ((), "")  # never probed: nothing to say
    (tmp_path / "storage.json").write_text("{not json")
    stores, unread = places.read_stores(tmp_path)
    assert stores == () and "is damaged" in unread and "not compared" in unread


# ---- the evidence, from recordings ---------------------------------------------------------------

SHARE = Place("/mnt/share/ckpt", "/mnt/share", "nfs4", "nas:/export", "network")
NVME = StoreSpeed("/data", "nvme0n1p1", "nvme", 0.0, write_bps=8e9, read_bps=9e9)


def checkpoint_to(place: Place, stores: tuple[StoreSpeed, ...], probed_ago: float) -> Recording:
    """A job stopping on ticks 7-14 of every 20 (its checkpoint), writing 1.5 GB/s meanwhile to
    ``place``'s directory (the file open in its burst ticks)."""
    stop = periodic(7, 15)
    rec = saving(stop, thread=1.0)
    ticks = tuple(
        replace(t, job=replace(t.job, writing=(place.directory + "/last.ckpt",)))
        if stop(i) else t for i, t in enumerate(rec.ticks)
    )  # fmt: skip
    stores = tuple(replace(s, finished_at=rec.started_at - probed_ago) for s in stores)
    return replace(rec, ticks=ticks, places=(place,), stores=stores)


def test_a_checkpoint_to_a_network_share_names_it_and_the_faster_local_store() -> None:
    slow = StoreSpeed("/mnt/share", "nas:/export", "network", 0.0, write_bps=0.4e9)
    d = diagnose(checkpoint_to(SHARE, (slow, NVME), probed_ago=2 * 3600))
    (cause,) = d.causes
    evidence = " ".join(cause.evidence)
    assert (
        "it wrote at 1.5 GB/s to /mnt/share (nfs4 on nas:/export, a network share): last.ckpt"
        in (evidence)
    )
    assert "/mnt/share measured 400.0 MB/s writing (sparkdiag storage, 2 h before this watch)" in (
        evidence
    )
    assert "the page cache took it" in evidence  # 1.5 GB/s against the store's 0.4
    assert "the local nvme /data measured 8.0 GB/s writing" in evidence
    assert cause.actions[0].startswith("write checkpoints on /data (nvme, 8.0 GB/s measured)")


def test_a_store_never_measured_says_how_to_measure_it() -> None:
    d = diagnose(checkpoint_to(SHARE, (), probed_ago=0))
    evidence = " ".join(d.causes[0].evidence)
    assert "run `sparkdiag storage /mnt/share` to know what /mnt/share can do" in evidence
    assert d.causes[0].actions[0].startswith("checkpoint asynchronously")  # nothing measured


def test_a_recording_with_its_places_replays_the_same(tmp_path: Path) -> None:
    rec = checkpoint_to(SHARE, (NVME,), probed_ago=600)
    rec.save(tmp_path / "run.json")
    again = load(tmp_path / "run.json")
    assert again == rec and diagnose(again) == diagnose(rec)
    assert "10 min before this watch" in " ".join(diagnose(again).causes[0].evidence)


# ---- end to end ---------------------------------------------------------------------------------

# reads for 1.2 s: 12 ticks of 0.1 s, with the window diagnosed lowered (short_window) from the
# 2 s the rule needs, which this test is not about
READER = """
import sys, time
path = sys.argv[1]
open(path, "wb").write(b"z" * (32 << 20))
end = time.time() + 1.2
with open(path, "rb") as f:
    while time.time() < end:
        f.seek(0)
        while f.read(4 << 20):
            pass
        time.sleep(0.05)
"""


def test_watch_names_the_store_a_real_job_reads_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    short_window(monkeypatch)
    state = tmp_path / "state"
    state.mkdir()
    mount = find_mount(read_mounts(Path("/")), str(tmp_path))
    assert mount is not None
    doc = json.loads(STORAGE_STATE.read_text())
    doc["mounts"][0]["mountpoint"] = mount.mountpoint
    doc["mounts"][0]["finished_at"] = time.time() - 7200
    (state / "storage.json").write_text(json.dumps(doc))
    result = invoke_cli("watch", "--json", "--stacks", "off", "--interval", "0.1", "--state-dir",
                        str(state), "--record", str(tmp_path / "run.json"), "--nvml-fixture",
                        str(NVML / "watch-starved.json"), "--", sys.executable, "-c", READER,
                        str(tmp_path / "data.bin"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    cause = json.loads(result.stdout)["causes"][0]
    evidence = " ".join(cause["evidence"])
    assert f"from {mount.mountpoint} ({mount.fstype} on {mount.source}" in evidence, evidence
    assert "data.bin" in evidence
    assert f"{mount.mountpoint} measured 747.7 MB/s reading (sparkdiag storage, 2 h" in evidence
    rec = load(tmp_path / "run.json")
    assert rec.places[0].directory == str(tmp_path) and rec.stores[0].read_bps is not None
    assert any(str(tmp_path / "data.bin") in t.job.reading for t in rec.ticks)
