"""The state directory against a hostile operator: a store that cannot take a write (a file where
the directory goes, a store of a newer sparkdiag, a write lock held by another process, a full
disk) never costs the measurement; a cycle is recorded whole or not at all."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkdiag.baseline.model import BaselineKey, BaselineStoreError
from sparkdiag.baseline.store import BaselineStore
from tests.support import NVML, PROBE, invoke_cli

NOT_RECORDED = "results not recorded in the baseline store: "


def probe(state: Path, *extra: str) -> list[str]:
    return [
        "probe",
        "--nvml-fixture",
        str(NVML / "h200-idle.json"),
        "--probe.fixture",
        str(PROBE / "h200-default.json"),
        "--record",  # a replayed cycle teaches only when asked to
        "--state-dir",
        str(state),
        *extra,
    ]


def key(dtype: str = "bf16") -> BaselineKey:
    return BaselineKey("GPU-1", dtype, "8x8x8", "native", "580", "2.11", "13.0")


def test_probe_measures_when_the_state_directory_is_a_file(tmp_path: Path) -> None:
    """It exited 3 (FAILED), "state directory ... exists but is not a directory", and showed
    nothing of the cycle it could measure."""
    state = tmp_path / "state"
    state.write_text("not a directory\n")
    result = invoke_cli(*probe(state))
    assert result.returncode == 0, result.stderr
    assert "GPU 0 NVIDIA H200" in result.stdout
    said = " ".join(result.stderr.split())
    assert f"{NOT_RECORDED}state directory {state} is a file, not a directory" in said
    assert "--no-record" in said
    assert len([line for line in result.stderr.splitlines() if NOT_RECORDED in line]) == 1


def test_check_says_once_how_to_mend_a_state_directory_that_is_a_file(tmp_path: Path) -> None:
    """The baseline-store row said "no baselines yet: .../baselines.sqlite does not exist" and
    advised running serve to learn some, which can never work; the soak row said the file could
    not be read. Both now name the directory, and their action says to mend it."""
    state = tmp_path / "state"
    state.write_text("not a directory\n")
    result = invoke_cli(
        "check", "--quick", "--json", "--state-dir", str(state),
        "--nvml-fixture", str(NVML / "h200-idle.json"),
    )  # fmt: skip
    rows = {row["name"]: row for row in json.loads(result.stdout)["checks"]}
    for name in ("baseline-store", "soak"):
        row = rows[name]
        assert row["status"] == "warn", row
        assert f"state directory {state} is a file, not a directory" in row["finding"]
        assert "give --state-dir a directory" in row["finding"]
        assert row["action"].startswith("fix the state directory as the finding says"), row
    assert "learn baselines" not in json.dumps(rows["baseline-store"])


def test_baseline_show_and_check_say_the_state_directory_cannot_be(tmp_path: Path) -> None:
    """``baseline show`` of a file said "No baselines yet ... 'sparkdiag probe' learns them",
    exit 0; check under a file (file/sub) said "no baselines yet ... run serve" (the review)."""
    (tmp_path / "file").write_text("")
    shown = invoke_cli("baseline", "show", "--state-dir", str(tmp_path / "file"))
    assert shown.returncode == 3 and "is a file, not a directory" in shown.stderr
    assert "No baselines yet" not in shown.stdout
    checked = invoke_cli(
        "check", "--quick", "--json", "--state-dir", str(tmp_path / "file" / "sub"),
        "--nvml-fixture", str(NVML / "h200-idle.json"),
    )  # fmt: skip
    rows = {row["name"]: row for row in json.loads(checked.stdout)["checks"]}
    for name in ("baseline-store", "soak"):
        assert f"cannot be made: {tmp_path / 'file'} is a file" in rows[name]["finding"], name


def test_state_files_are_refused_in_a_directory_that_is_not_one(tmp_path: Path) -> None:
    from sparkdiag.statedir import StateDirError, state_file

    assert state_file(tmp_path / "new", "x.json") == tmp_path / "new" / "x.json"  # not made
    assert not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(StateDirError, match="is a file, not a directory: give --state-dir"):
        state_file(tmp_path / "file", "x.json")
    with pytest.raises(StateDirError, match=r"symbolic link to .*gone, which does not exist"):
        state_file(tmp_path / "link", "x.json")


def test_probe_compares_with_a_store_it_cannot_write(tmp_path: Path) -> None:
    """A store from a newer sparkdiag: measured, compared with nothing it cannot read, said once,
    the measurement's exit status (it was 3, the measurement lost); --json says it too."""
    state = tmp_path / "state"
    state.mkdir()
    db = state / "baselines.sqlite"
    BaselineStore(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA user_version = 99")
    result = invoke_cli(*probe(state, "--json"))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["gpus"][0]["result"] == "ok"
    assert doc["not_recorded"].startswith(NOT_RECORDED)
    assert "newer than the" in doc["not_recorded"]
    with sqlite3.connect(db) as conn:  # nothing was written into the newer store
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0


def test_probe_with_a_locked_store_waits_once_and_compares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the write lock: the cycle waits once for the busy timeout (each of
    its 19 kernels waited in turn, then the command exited 3 with the measurement lost), is
    compared with the baselines it reads, and is not recorded."""
    state = tmp_path / "state"
    for _ in range(3):  # teach the baselines
        assert invoke_cli(*probe(state)).returncode == 0
    with BaselineStore(state / "baselines.sqlite") as store:
        before = sum(len(store.runs(b.key, limit=100)) for b in store.list())
    init = BaselineStore.__init__

    def short(self: BaselineStore, path: Path, *args: object, **kwargs: object) -> None:
        init(self, path, busy_timeout_s=0.3)

    monkeypatch.setattr(BaselineStore, "__init__", short)
    blocker = sqlite3.connect(state / "baselines.sqlite", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        result = invoke_cli(*probe(state))
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert result.returncode == 0, result.stderr
    assert "verdict: as fast as its baseline" in " ".join(result.stdout.split())
    said = " ".join(result.stderr.split())
    assert NOT_RECORDED in said and "database is locked" in said
    assert "another process has held its write lock" in said
    with BaselineStore(state / "baselines.sqlite") as store:
        assert sum(len(store.runs(b.key, limit=100)) for b in store.list()) == before


def test_a_cycle_is_recorded_whole_or_not_at_all(tmp_path: Path) -> None:
    """A write that fails part-way through a cycle (a full disk, a kill) left the kernels before
    it recorded and the others not."""
    with BaselineStore(tmp_path / "b.sqlite") as store:
        with pytest.raises(BaselineStoreError, match="disk full"), store.cycle():
            store.record_run(key("bf16"), 700.0, True)
            store.record_run(key("fp8"), 1400.0, True)
            raise BaselineStoreError("disk full")
        assert store.runs(key("bf16")) == [] and store.runs(key("fp8")) == []
        with store.cycle():
            store.record_run(key("bf16"), 700.0, True)
            with store.cycle():  # a nested cycle joins the outer one
                store.record_run(key("fp8"), 1400.0, True)
        assert len(store.runs(key("bf16"))) == 1 and len(store.runs(key("fp8"))) == 1


def test_a_cycle_waits_once_for_a_held_lock(tmp_path: Path) -> None:
    db = tmp_path / "b.sqlite"
    with BaselineStore(db, busy_timeout_s=0.2) as store:
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        held = pytest.raises(BaselineStoreError, match=r"write lock for over 0\.2 s")
        with held, store.cycle():
            store.record_run(key(), 700.0, True)
        blocker.execute("ROLLBACK")
        blocker.close()
        assert store.runs(key()) == []


def test_two_soaks_writing_at_once_keep_both_verdicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``soak --gpu 0`` and ``soak --gpu 1`` in two terminals: each read soak.json, added its
    GPU and wrote it back, and the later write dropped the other's verdict."""
    from sparkdiag.soak import state as soak_state
    from tests.support.soak import gpu_state

    path = soak_state.state_path(tmp_path / "state")
    read = soak_state.read_state
    both_read = threading.Barrier(2, timeout=1)

    def slow_read(p: Path) -> soak_state.SoakState | None:
        found = read(p)
        with contextlib.suppress(threading.BrokenBarrierError):
            both_read.wait()  # the unlocked writers both read before either writes
        return found

    monkeypatch.setattr(soak_state, "read_state", slow_read)
    writers = [
        threading.Thread(target=soak_state.write_state, args=(path, [gpu_state(g, f"GPU-{g}")]))
        for g in ("0", "1")
    ]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    state = read(path)
    assert state is not None and [g.gpu for g in state.gpus] == ["0", "1"]


def test_a_state_file_lock_held_too_long_is_one_line(tmp_path: Path) -> None:
    from sparkdiag.statedir import StateDirError, updating

    path = tmp_path / "soak.json"
    with updating(path), pytest.raises(StateDirError) as info, updating(path, wait_s=0.1):
        pass
    assert str(info.value) == (
        f"state directory {tmp_path} stayed locked by another sparkdiag for over 0.1 s; "
        "soak.json not updated: try again"
    )


def test_a_dangling_symlink_for_the_state_directory_is_named(tmp_path: Path) -> None:
    """It said "cannot create state directory X: File exists"."""
    from sparkdiag.statedir import StateDirError, ensure_state_directory

    link = tmp_path / "state"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(StateDirError) as info:
        ensure_state_directory(link)
    assert str(info.value) == (
        f"state directory {link} is a symbolic link to {tmp_path / 'gone'}, which does not "
        "exist: create its target or remove the link"
    )


@contextlib.contextmanager
def full_filesystem(directory: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs under ``directory``, filled up; skipped where it cannot be mounted."""
    with tmpfs(directory, "full", size="64k") as mountpoint:
        with contextlib.suppress(OSError), (mountpoint / "fill").open("wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
        yield mountpoint


def test_the_native_scan_cache_leaves_nothing_on_a_full_disk(tmp_path: Path) -> None:
    """The cache was written to a fixed cuda-libraries.json.tmp, left behind (empty) when the
    disk was full, and shared by two processes writing at once."""
    from sparkdiag.sources.software.cuda_libraries import ScanCache

    with full_filesystem(tmp_path) as full:
        cache = ScanCache(full / "cuda-libraries.json")
        cache.put(("/lib/libx.so", 1, 2), None)
        cache.save()
        assert sorted(p.name for p in full.iterdir()) == ["fill"]
        (full / "fill").unlink()
        cache.save()
        assert ScanCache(full / "cuda-libraries.json").get(("/lib/libx.so", 1, 2)) == (True, None)


def test_check_does_not_advise_moving_a_newer_store_aside(tmp_path: Path) -> None:
    """A store of a newer sparkdiag was met with "a damaged file: move it aside", which loses
    its baselines to a downgrade."""
    from sparkdiag.baseline.keeper import inspect_store
    from sparkdiag.check.store_checks import check_baseline_store
    from tests.support.check import context, poll

    BaselineStore(tmp_path / "baselines.sqlite").close()
    with sqlite3.connect(tmp_path / "baselines.sqlite") as conn:
        conn.execute("PRAGMA user_version = 99")
    (row,) = check_baseline_store(
        context(poll(NVML / "h200-idle.json"), baseline_store=inspect_store(tmp_path))
    )
    assert row.status == "warn" and "newer than the" in row.finding
    assert row.action is not None and "upgrade" in row.action and "move it" not in row.action


# -- a damaged store, a read-only one, and the daemon's cycle (the review's leftovers) ----------


def taught(state: Path) -> Path:
    """``state`` with baselines learned from three probe cycles; the store's path."""
    for _ in range(3):
        assert invoke_cli(*probe(state)).returncode == 0
    return state / "baselines.sqlite"


def damage_runs(db: Path) -> None:
    """Garbage over the cell pointers of the runs table's root page: the baselines table still
    reads, as after a bad sector or a copy taken mid-write (quick_check: "Offset 65535 out of
    range")."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'runs'").fetchone()
    with db.open("r+b") as fh:
        fh.seek((root - 1) * size + 12)
        fh.write(b"\xff" * 64)


def test_every_command_notices_a_damaged_store(tmp_path: Path) -> None:
    """A store with a damaged page: probe compared with it ("as fast"), show listed it, pin wrote
    into it; only check and the daemon said "malformed". Now each says so in one line with what
    to do, probe still shows its figures (not recorded), and nothing writes into the file."""
    state = tmp_path / "state"
    db = taught(state)
    damage_runs(db)
    before = db.read_bytes()
    for extra in ((), ("--no-record",)):
        result = invoke_cli(*probe(state, *extra))
        assert result.returncode == 0, result.stderr
        out = " ".join(result.stdout.split())
        assert "bf16" in out and "725" in out  # the measurement is shown
        assert "as fast" not in out and "verdict: not judged: the baseline store" in out
        said = " ".join((result.stdout + result.stderr).split())
        assert "is damaged (" in said and "move it aside" in said
        assert "--no-record" not in result.stderr  # it would not help
    show = invoke_cli("baseline", "show", "--state-dir", str(state))
    pin = invoke_cli("baseline", "pin", "--all", "--state-dir", str(state))
    reset = invoke_cli("baseline", "reset", "--all", "--state-dir", str(state))
    for result in (show, pin, reset):
        assert result.returncode == 3, result.stdout
        assert f"baseline store {db} is damaged (" in " ".join(result.stderr.split())
    assert db.read_bytes() == before


@contextlib.contextmanager
def tmpfs(directory: Path, name: str = "fs", size: str = "8m") -> Iterator[Path]:
    """A small tmpfs under ``directory``; skipped where it cannot be mounted."""
    mountpoint = directory / name
    mountpoint.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)


def remount_ro(mountpoint: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mountpoint)], check=True)


def test_readers_read_a_good_store_on_a_read_only_file_system(tmp_path: Path) -> None:
    """WAL needs the -shm file, which nobody can create on a read-only file system: show, check
    and probe exited 3 or compared with nothing. Read-only readers open it mode=ro, then
    immutable=1 (nobody can write it there)."""
    with tmpfs(tmp_path) as fs:
        state = fs / "state"
        taught(state)
        remount_ro(fs)
        show = invoke_cli("baseline", "show", "--state-dir", str(state))
        assert show.returncode == 0, show.stderr
        assert "bf16" in show.stdout and "learned runs=3" in " ".join(show.stdout.split())
        for extra in (("--no-record",), ()):
            result = invoke_cli(*probe(state, *extra))
            assert result.returncode == 0, result.stderr
            assert "verdict: as fast as its baseline" in " ".join(result.stdout.split())
        assert NOT_RECORDED in result.stderr and "not writable" in result.stderr
        check = invoke_cli(
            "check", "--json", "--nvml-fixture", str(NVML / "h200-idle.json"),
            "--probe.fixture", str(PROBE / "h200-default.json"), "--state-dir", str(state),
        )  # fmt: skip
        rows = {row["name"]: row for row in json.loads(check.stdout)["checks"]}
        assert rows["baseline-store"]["status"] == "pass", rows["baseline-store"]
        assert "1.00 of baseline 725" in rows["probe"]["finding"], rows["probe"]
        assert sorted(p.name for p in state.iterdir()) == ["baselines.sqlite"]


def test_a_read_only_bind_mount_is_not_read_as_immutable(tmp_path: Path) -> None:
    """A read-only mount of a file system that is writable elsewhere (a container's :ro volume
    of the state directory the daemon writes): reading it immutable could read pages half
    written, so the reader says why it cannot read it."""
    from sparkdiag.baseline.opening import nobody_writes

    with tmpfs(tmp_path) as fs:
        db = taught(fs / "state")
        view = tmp_path / "view"
        view.mkdir()
        subprocess.run(["mount", "--bind", "-o", "ro", str(fs / "state"), str(view)], check=True)
        try:
            assert not nobody_writes(view / "baselines.sqlite")
            show = invoke_cli("baseline", "show", "--state-dir", str(view))
            assert show.returncode == 3
            said = " ".join(show.stderr.split())
            assert "read-only mount of a file system that is writable elsewhere" in said
            assert "baselines.sqlite-shm is absent" in said and "from a copy" in said
            remount_ro(fs)  # now nobody can write it: read through both mounts
            assert nobody_writes(view / "baselines.sqlite") and nobody_writes(db)
        finally:
            subprocess.run(["umount", "-l", str(view)], capture_output=True, check=False)


def test_immutable_is_not_used_over_a_write_ahead_log(tmp_path: Path) -> None:
    """A store not closed cleanly before its file system went read-only keeps committed pages in
    its -wal; an immutable reader would skip them. With the -shm there, mode=ro reads them."""
    from sparkdiag.baseline.opening import nobody_writes

    with tmpfs(tmp_path) as fs:
        db = fs / "baselines.sqlite"
        writer = BaselineStore(db)
        writer.pin(key(), 700.0)
        copy = fs / "copy"
        copy.mkdir()
        for suffix in ("", "-wal", "-shm"):  # as a crash leaves it
            (copy / f"baselines.sqlite{suffix}").write_bytes(Path(f"{db}{suffix}").read_bytes())
        writer.close()
        remount_ro(fs)
        assert (copy / "baselines.sqlite-wal").stat().st_size > 0
        assert not nobody_writes(copy / "baselines.sqlite")
        with BaselineStore(copy / "baselines.sqlite", readonly=True) as store:
            pinned = store.get(key())
            assert pinned is not None and pinned.tflops == 700.0


def test_the_daemon_compares_a_cycle_it_could_not_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler's whole cycle, through a fixture probe: a write that fails part-way (a full
    disk, a lock held past the timeout) leaves nothing of the cycle in the store, counts as a
    write error, and the figures are compared with the baselines the store still reads (they
    were compared with none)."""
    from sparkdiag.baseline.keeper import StoreKeeper
    from sparkdiag.probe.launchers import FixtureLauncher
    from sparkdiag.scheduling.probe_state import ProbeState
    from sparkdiag.scheduling.scheduler import ProbeScheduler
    from tests.support import fixture_snapshot

    snap = fixture_snapshot("h200-idle", tmp_path)
    store = BaselineStore(tmp_path / "b.sqlite", busy_timeout_s=0.2)
    keeper = StoreKeeper(lambda: store)
    launcher = FixtureLauncher(PROBE / "h200-default.json")
    sched = ProbeScheduler(launcher, ProbeState(), keeper, "native", lambda: snap, 300.0)
    for _ in range(3):
        sched.run_cycle()
    conn = store._conn
    assert conn is not None

    def count() -> int:
        return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])

    runs = count()
    record_run = BaselineStore.record_run
    calls = []

    def fails_on_the_fifth(self: BaselineStore, *args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 5:
            raise BaselineStoreError("baseline store: database or disk is full")
        return record_run(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(BaselineStore, "record_run", fails_on_the_fifth)
    (record,) = sched.run_cycle()
    assert len(calls) == 5 and count() == runs  # the four before it were rolled back
    measured = [f for f in record.figures if f.delivered is not None]
    assert measured and all(f.efficiency == pytest.approx(1.0) for f in measured)
    assert record.ratios and all(r.baseline is not None for r in record.ratios)
    health = keeper.health()
    assert not health.up and health.errors["write"] == 1 and "disk is full" in str(health.reason)
    monkeypatch.setattr(BaselineStore, "record_run", record_run)

    blocker = sqlite3.connect(tmp_path / "b.sqlite", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        (record,) = sched.run_cycle()
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert count() == runs and keeper.health().errors["write"] == 2
    assert all(f.efficiency == pytest.approx(1.0) for f in record.figures if f.delivered)
    (record,) = sched.run_cycle()  # the lock is gone: recorded whole, usable again
    assert count() > runs and keeper.health().up
    store.close()


def test_the_state_lock_is_a_file_and_a_filesystem_without_locks_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock was flock on the directory, opened read-only: NFS emulates flock with byte-range
    locks, which need a file open for writing (the review). Now a lock file; and where the
    filesystem has no locks (ENOLCK) the update goes on unlocked, as before there was one."""
    import errno
    import os

    from sparkdiag import statedir

    seen: list[int] = []

    def flock(fd: int, how: int) -> None:
        seen.append(os.fstat(fd).st_mode)
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(statedir.fcntl, "flock", flock)
    path = tmp_path / "state" / "x.json"
    out = statedir.update_json_state(path, lambda: ({"schema": "x/1"}, 7), RuntimeError)
    assert out == 7 and json.loads(path.read_text()) == {"schema": "x/1"}
    import stat

    assert seen and stat.S_ISREG(seen[0])  # a regular file, opened for writing


def test_a_reader_never_writes_to_another_programs_database(tmp_path: Path) -> None:
    """``baseline show`` of another program's SQLite file refused it, but only after the
    writable open its older-schema path fell back to had switched the file to WAL (the review)."""
    db = tmp_path / "baselines.sqlite"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE notes (x)")
        conn.commit()
    shown = invoke_cli("baseline", "show", "--state-dir", str(tmp_path))
    assert shown.returncode == 3 and "not a sparkdiag baseline store" in shown.stderr
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


@pytest.mark.parametrize("kind", ["soak", "storage"])
def test_a_fifo_in_place_of_a_state_file_is_refused_not_waited_on(
    tmp_path: Path, kind: str
) -> None:
    """A FIFO named soak.json or storage.json: the plain open waited for a writer for ever,
    hanging storage (holding the state directory's lock), soak after its load, check, and the
    daemon's scrape of the soak and storage figures. Now it is an unusable state file."""
    import os

    from sparkdiag.soak.state import SoakStateError
    from sparkdiag.soak.state import read_state as read_soak
    from sparkdiag.storage.state import StorageStateError
    from sparkdiag.storage.state import read_state as read_storage

    fifo = tmp_path / f"{kind}.json"
    os.mkfifo(fifo)
    read, error = (
        (read_soak, SoakStateError) if kind == "soak" else (read_storage, StorageStateError)
    )
    with pytest.raises(error, match="not a regular file"):
        read(fifo)
