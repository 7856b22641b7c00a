"""The baseline store, on real SQLite files, with real concurrent and killed processes."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import select
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sparkdiag.baseline.model import Baseline, BaselineKey, BaselineStoreError
from sparkdiag.baseline.schema import SCHEMA_VERSION
from sparkdiag.baseline.store import DEFAULT_FILENAME, BaselineStore, open_store

HELPERS = Path(__file__).parent / "support" / "baseline_scripts"
REPO = Path(__file__).resolve().parent.parent


def key(**overrides: str) -> BaselineKey:
    fields = {
        "gpu_uuid": "GPU-1111",
        "dtype": "bf16",
        "shape": "8192x8192x8192",
        "context": "native",
        "driver": "580.159",
        "torch": "2.11.0",
        "cuda": "13.0",
    }
    fields.update(overrides)
    return BaselineKey(**fields)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / DEFAULT_FILENAME


@pytest.fixture
def store(db: Path) -> Any:
    with BaselineStore(db) as opened:
        yield opened


def helper_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def raw(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(str(db), timeout=10.0)


def integrity(db: Path) -> str:
    with raw(db) as conn:
        return "\n".join(row[0] for row in conn.execute("PRAGMA integrity_check"))


def count_runs(db: Path, **where: str) -> int:
    clause = " AND ".join(f"{column} = ?" for column in where) or "1"
    with raw(db) as conn:
        return int(
            conn.execute(
                f"SELECT count(*) FROM runs WHERE {clause}", tuple(where.values())
            ).fetchone()[0]
        )


# -- learning ----------------------------------------------------------------


def test_no_baseline_before_min_runs(store: BaselineStore) -> None:
    k = key()
    assert store.record_run(k, 700.0, healthy=True) is None
    assert store.record_run(k, 710.0, healthy=True) is None
    assert store.get(k) is None
    assert store.list() == []


def test_median_once_min_runs_are_in(store: BaselineStore) -> None:
    k = key()
    for value in (700.0, 650.0):
        store.record_run(k, value, healthy=True)
    third = store.record_run(k, 760.0, healthy=True)
    assert third is not None
    assert (third.tflops, third.source, third.runs) == (700.0, "learned", 3)
    fourth = store.record_run(k, 600.0, healthy=True)
    assert fourth is not None
    assert fourth.tflops == statistics.median([700.0, 650.0, 760.0, 600.0])
    assert fourth.runs == 4
    assert fourth.created_at == third.created_at
    assert store.get(k) == fourth


def test_frozen_at_learn_runs(store: BaselineStore) -> None:
    k = key()
    values = [690.0, 700.0, 680.0, 720.0, 710.0]
    for value in values:
        latest = store.record_run(k, value, healthy=True)
    assert latest is not None
    assert (latest.tflops, latest.runs) == (statistics.median(values), 5)
    # A slow degradation afterwards never drags the baseline down.
    for step in range(10):
        after = store.record_run(k, 600.0 - 20 * step, healthy=True)
        assert after == latest
    assert store.get(k) == latest
    assert len(store.runs(k, limit=100)) == 15


def test_unhealthy_runs_never_count(store: BaselineStore) -> None:
    k = key()
    assert store.record_run(k, 700.0, healthy=True) is None
    assert store.record_run(k, 300.0, healthy=False) is None
    assert store.record_run(k, 710.0, healthy=True) is None
    assert store.record_run(k, 100.0, healthy=False) is None
    learned = store.record_run(k, 720.0, healthy=True)
    assert learned is not None
    assert (learned.tflops, learned.runs) == (710.0, 3)
    assert store.record_run(k, 5.0, healthy=False) == learned
    runs = store.runs(k)
    assert [r.healthy for r in runs] == [False, True, False, True, False, True]
    assert [r.tflops for r in runs] == [5.0, 720.0, 100.0, 710.0, 300.0, 700.0]


def test_learning_settings_are_honoured(db: Path) -> None:
    with BaselineStore(db, learn_runs=2, min_runs=1) as store:
        k = key()
        first = store.record_run(k, 100.0, healthy=True)
        assert first is not None and (first.tflops, first.runs) == (100.0, 1)
        second = store.record_run(k, 200.0, healthy=True)
        assert second is not None and (second.tflops, second.runs) == (150.0, 2)
        assert store.record_run(k, 1.0, healthy=True) == second


def test_runs_keep_time_and_conditions(store: BaselineStore) -> None:
    k = key()
    store.record_run(k, 700.0, healthy=True, at=1_700_000_000.5, conditions={"gpu_c": 61})
    store.record_run(k, 701.0, healthy=True)
    newest, oldest = store.runs(k)
    assert oldest.at == 1_700_000_000.5
    assert oldest.conditions == {"gpu_c": 61}
    assert newest.conditions is None
    assert abs(newest.at - time.time()) < 60
    assert newest.id > oldest.id
    assert store.runs(k, limit=1) == [newest]


# -- pinning, resetting, software identity -------------------------------------


def test_pin_overrides_learned_and_survives_runs(store: BaselineStore) -> None:
    k = key()
    for value in (700.0, 700.0, 700.0):
        learned = store.record_run(k, value, healthy=True)
    assert learned is not None
    pinned = store.pin(k, 795.0, note="public MAMF")
    assert (pinned.tflops, pinned.source, pinned.runs, pinned.note) == (
        795.0,
        "pinned",
        0,
        "public MAMF",
    )
    assert pinned.created_at == learned.created_at
    for _ in range(6):
        assert store.record_run(k, 650.0, healthy=True) == pinned
    assert store.get(k) == pinned


def test_pin_before_any_run(store: BaselineStore) -> None:
    k = key()
    pinned = store.pin(k, 760.0)
    for _ in range(5):
        assert store.record_run(k, 700.0, healthy=True) == pinned
    repinned = store.pin(k, 770.0, note="new")
    assert (repinned.tflops, repinned.note) == (770.0, "new")
    assert store.get(k) == repinned


def test_reset_removes_baselines_and_runs_and_learning_restarts(store: BaselineStore) -> None:
    k = key()
    for value in (700.0, 700.0, 700.0, 700.0, 700.0):
        store.record_run(k, value, healthy=True)
    store.pin(key(gpu_uuid="GPU-2222"), 500.0)
    assert store.reset(gpu_uuid="GPU-1111") == 1
    assert store.get(k) is None
    assert store.runs(k) == []
    assert store.get(key(gpu_uuid="GPU-2222")) is not None
    # Learning starts from scratch: the old runs no longer count.
    assert store.record_run(k, 600.0, healthy=True) is None
    assert store.record_run(k, 610.0, healthy=True) is None
    relearned = store.record_run(k, 620.0, healthy=True)
    assert relearned is not None and (relearned.tflops, relearned.runs) == (610.0, 3)


def test_reset_filters(store: BaselineStore) -> None:
    keys = [
        key(gpu_uuid=gpu, dtype=dtype, shape=shape)
        for gpu in ("GPU-a", "GPU-b")
        for dtype in ("bf16", "fp8")
        for shape in ("8192x8192x8192", "1x8192x8192")
    ]
    for k in keys:
        store.pin(k, 100.0)
    learning = key(gpu_uuid="GPU-a", dtype="fp16")
    store.record_run(learning, 100.0, healthy=True)  # still learning: no baseline yet
    assert store.reset(gpu_uuid="GPU-a", dtype="bf16", shape="1x8192x8192") == 1
    assert store.reset(dtype="fp8") == 4
    assert store.reset(gpu_uuid="GPU-a") == 1
    assert store.runs(learning) == []
    assert {(b.key.gpu_uuid, b.key.dtype, b.key.shape) for b in store.list()} == {
        ("GPU-b", "bf16", "8192x8192x8192"),
        ("GPU-b", "bf16", "1x8192x8192"),
    }
    assert store.reset() == 2
    assert store.list() == []
    assert store.reset() == 0


def test_new_software_identity_gets_its_own_baseline_and_keeps_the_old(
    store: BaselineStore,
) -> None:
    old, new = key(torch="2.10.0"), key(torch="2.11.0", cuda="13.1")
    for value in (700.0, 710.0, 720.0, 730.0, 740.0):
        store.record_run(old, value, healthy=True)
    old_baseline = store.get(old)
    assert old_baseline is not None
    assert store.get(new) is None  # new software learns afresh
    for value in (600.0, 610.0, 620.0):
        store.record_run(new, value, healthy=True)
    new_baseline = store.get(new)
    assert new_baseline is not None and new_baseline.tflops == 610.0
    assert store.get(old) == old_baseline
    listed = store.list("GPU-1111")
    assert listed == [old_baseline, new_baseline]  # oldest first
    assert store.list("GPU-none") == []


def test_list_spans_gpus_and_contexts(store: BaselineStore) -> None:
    a = store.pin(key(gpu_uuid="GPU-a", context="container"), 1.0)
    b = store.pin(key(gpu_uuid="GPU-b"), 2.0)
    c = store.pin(key(gpu_uuid="GPU-a"), 3.0)
    assert store.list() == [a, c, b]
    assert store.list("GPU-a") == [a, c]


def test_persists_across_reopen_with_wal_and_full_sync(db: Path) -> None:
    with BaselineStore(db) as store:
        pinned = store.pin(key(), 795.0, note="kept")
        for value in (1.0, 2.0, 3.0):
            store.record_run(key(dtype="fp8"), value, healthy=True)
        learned = store.get(key(dtype="fp8"))
        assert store._conn is not None
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    with BaselineStore(db) as store:
        assert store.get(key()) == pinned
        assert store.get(key(dtype="fp8")) == learned
        assert store.integrity_check() == "ok"
    with raw(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_closed_store_refuses_and_close_is_idempotent(db: Path) -> None:
    store = BaselineStore(db)
    store.close()
    store.close()
    with pytest.raises(BaselineStoreError, match="closed"):
        store.get(key())
    assert "closed" in repr(store)


def test_threads_share_one_store(store: BaselineStore, db: Path) -> None:
    k = key()
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(25):
                store.record_run(k, 700.0 + n + i / 100, healthy=True)
                store.get(k)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert count_runs(db) == 100
    baseline = store.get(k)
    assert baseline is not None and baseline.runs == 5


def test_a_held_write_lock_gives_a_clear_error_after_the_busy_timeout(db: Path) -> None:
    with BaselineStore(db, busy_timeout_s=0.2) as store:
        blocker = sqlite3.connect(str(db), isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(BaselineStoreError, match=r"locked") as info:
            store.record_run(key(), 700.0, healthy=True)
        assert 0.15 < time.monotonic() - started < 5
        assert str(db) in str(info.value)
        # Readers are not blocked by a writer in WAL mode.
        assert store.get(key()) is None
        blocker.execute("ROLLBACK")
        blocker.close()
        assert store.record_run(key(), 700.0, healthy=True) is None
        assert len(store.runs(key())) == 1


def test_the_default_store_is_in_the_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    with open_store(None, create=True) as store:
        assert store.path == tmp_path / "baselines.sqlite"


# -- validation ------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, -math.inf, "700", True, None])
def test_tflops_must_be_finite_and_positive(store: BaselineStore, bad: Any) -> None:
    with pytest.raises(ValueError, match="tflops"):
        store.record_run(key(), bad, healthy=True)
    with pytest.raises(ValueError, match="tflops"):
        store.pin(key(), bad)
    assert store.runs(key()) == []


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("dtype", "", "dtype"),
        ("dtype", "   ", "dtype"),
        ("shape", "", "shape"),
        ("shape", "8192", "shape"),
        ("shape", "8192 x 8192 x 8192", "shape"),
        ("shape", "8192x8192x8192\n", "shape"),  # a regex's "$" lets a trailing newline through
        ("gpu_uuid", "", "gpu_uuid"),
        ("context", "docker", "context"),
    ],
)
def test_key_fields_are_validated(field: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        key(**{field: value})


def test_key_fields_must_be_strings() -> None:
    with pytest.raises(ValueError, match="torch"):
        BaselineKey("GPU-1", "bf16", "1x2x3", "native", "580", None, "13.0")  # type: ignore[arg-type]


def test_other_arguments_are_validated(store: BaselineStore, db: Path) -> None:
    k = key()
    with pytest.raises(ValueError, match="healthy"):
        store.record_run(k, 700.0, healthy=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at"):
        store.record_run(k, 700.0, healthy=True, at=math.nan)
    with pytest.raises(ValueError, match="conditions"):
        store.record_run(k, 700.0, healthy=True, conditions={"x": object()})
    with pytest.raises(ValueError, match="conditions"):
        store.record_run(k, 700.0, healthy=True, conditions={"x": math.nan})
    with pytest.raises(ValueError, match="key"):
        store.get(("GPU", "bf16"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        store.runs(k, limit=0)
    with pytest.raises(ValueError, match="dtype"):
        store.reset(dtype="")
    with pytest.raises(ValueError, match="note"):
        store.pin(k, 700.0, note=None)  # type: ignore[arg-type]
    assert store.runs(k) == []
    with pytest.raises(ValueError, match="min_runs"):
        BaselineStore(db, min_runs=0)
    with pytest.raises(ValueError, match="learn_runs"):
        BaselineStore(db, learn_runs=2, min_runs=3)
    with pytest.raises(ValueError, match="busy_timeout_s"):
        BaselineStore(db, busy_timeout_s=math.inf)


# -- opening errors ----------------------------------------------------------------


def _assert_refused(path: Path) -> str:
    """The message of the BaselineStoreError that opening ``path`` raises; it names the path."""
    with pytest.raises(BaselineStoreError) as info:
        BaselineStore(path)
    message = str(info.value)
    assert str(path) in message
    return message


def test_garbage_file_raises_naming_the_path(db: Path) -> None:
    db.write_bytes(b"this is not a database, just some bytes\n" * 200)
    assert "not a database" in _assert_refused(db)


def test_foreign_sqlite_database_is_refused(db: Path) -> None:
    with raw(db) as conn:
        conn.execute("CREATE TABLE something (x)")
    assert "not a sparkdiag baseline store" in _assert_refused(db)


def test_newer_schema_is_refused(db: Path) -> None:
    BaselineStore(db).close()
    with raw(db) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    assert "newer" in _assert_refused(db)


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / DEFAULT_FILENAME
    assert "does not exist" in _assert_refused(path)
    assert not path.parent.exists()


def test_directory_in_place_of_the_file(db: Path) -> None:
    db.mkdir()
    assert "not a regular file" in _assert_refused(db)


def test_parent_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    path = tmp_path / "file" / DEFAULT_FILENAME
    _assert_refused(path)


root_only_bypasses = pytest.mark.skipif(os.geteuid() == 0, reason="root bypasses file permissions")


@root_only_bypasses
def test_unreadable_file(db: Path) -> None:
    BaselineStore(db).close()
    db.chmod(0)
    try:
        _assert_refused(db)
    finally:
        db.chmod(0o600)


@root_only_bypasses
def test_read_only_directory(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o500)
    path = directory / DEFAULT_FILENAME
    try:
        _assert_refused(path)
    finally:
        directory.chmod(0o700)


# -- concurrent writers (real processes) -------------------------------------------


def read_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    """The next stdout line of ``proc``; fails the test instead of hanging."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        pytest.fail(f"helper {proc.args!r} printed nothing in {timeout} s")
    return proc.stdout.readline().strip()


def test_concurrent_writer_processes_lose_nothing(db: Path) -> None:
    writers, runs_each = 4, 100
    procs = [
        subprocess.Popen(
            [sys.executable, str(HELPERS / "writer.py"), str(db), str(n), str(runs_each)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=helper_env(),
        )
        for n in range(writers)
    ]
    try:
        # All open (and race to create and migrate) the new file, then start together.
        assert [read_line(p) for p in procs] == ["ready"] * writers
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["own"] == runs_each

    assert integrity(db) == "ok"
    assert count_runs(db) == writers * runs_each * 2
    assert count_runs(db, gpu_uuid="GPU-shared") == writers * runs_each
    with BaselineStore(db) as store:
        for n in range(writers):
            own = dataclasses.replace(_writer_key(), gpu_uuid=f"GPU-writer-{n}")
            assert count_runs(db, gpu_uuid=own.gpu_uuid) == runs_each
            baseline = store.get(own)
            assert baseline is not None
            assert (baseline.tflops, baseline.runs) == (102.0, 5)  # median of 100..104
        # The shared key's read-modify-write was serialised: its frozen baseline is
        # the median of exactly the first five healthy runs that were committed.
        shared = store.get(_writer_key())
        assert shared is not None and shared.runs == 5
        with raw(db) as conn:
            first = [
                row[0]
                for row in conn.execute(
                    "SELECT tflops FROM runs WHERE gpu_uuid = 'GPU-shared' ORDER BY id LIMIT 5"
                )
            ]
        assert shared.tflops == statistics.median(first)
        assert store.integrity_check() == "ok"


def _writer_key() -> BaselineKey:
    return BaselineKey("GPU-shared", "bf16", "8192x8192x8192", "native", "580.1", "2.11", "13.0")


# -- kill -9 mid-write ---------------------------------------------------------------


def committed_baselines(db: Path) -> tuple[Baseline, Baseline]:
    """A pinned and a frozen learned baseline, committed before the helper starts."""
    with BaselineStore(db) as store:
        pinned = store.pin(key(gpu_uuid="GPU-pinned"), 795.0, note="pinned before the crash")
        learned: Baseline | None = None
        for value in (700.0, 690.0, 710.0, 705.0, 695.0):
            learned = store.record_run(key(gpu_uuid="GPU-learned"), value, healthy=True)
        assert learned is not None and learned.runs == 5
        return pinned, learned


def kill_mid_write(db: Path, mode: str, marker: str, protected: list[Baseline]) -> None:
    keys = json.dumps([dataclasses.asdict(b.key) for b in protected])
    proc = subprocess.Popen(
        [sys.executable, str(HELPERS / "crasher.py"), mode, str(db), keys],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=helper_env(),
    )
    try:
        line = read_line(proc)
        if line != marker:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"crasher printed {line!r}, expected {marker!r}: {err}")
        time.sleep(random.uniform(0.0, 0.06))
        assert proc.poll() is None, "the writer must still be writing when it is killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert proc.returncode == -signal.SIGKILL


def assert_survived(db: Path, protected: list[Baseline]) -> None:
    assert integrity(db) == "ok"
    with BaselineStore(db) as store:
        assert store.integrity_check() == "ok"
        for baseline in protected:
            assert store.get(baseline.key) == baseline
        # Still writable, by the store's own code.
        fresh = key(gpu_uuid=f"GPU-after-{time.monotonic_ns()}")
        assert store.record_run(fresh, 1.0, healthy=True) is None
        assert store.pin(fresh, 2.0).tflops == 2.0
        assert store.get(fresh) is not None


@pytest.mark.parametrize("attempt", range(3))
def test_kill_9_while_recording_and_pinning_through_the_store(db: Path, attempt: int) -> None:
    protected = list(committed_baselines(db))
    for _ in range(2):
        kill_mid_write(db, "store", "writing", protected)
        assert_survived(db, protected)


@pytest.mark.parametrize("attempt", range(3))
def test_kill_9_inside_a_large_uncommitted_transaction(db: Path, attempt: int) -> None:
    protected = list(committed_baselines(db))
    runs_before = count_runs(db)
    kill_mid_write(db, "bulk", "in-transaction", protected)
    wal = db.with_name(db.name + "-wal")
    # The transaction had spilled uncommitted pages into the WAL before the kill.
    assert wal.exists() and wal.stat().st_size > 64 * 1024
    assert_survived(db, protected)
    # Nothing of the killed transaction is visible (the check above added one run).
    assert count_runs(db) == runs_before + 1
    with BaselineStore(db) as store:
        assert not [b for b in store.list() if b.key.gpu_uuid.startswith("GPU-scratch")]


def test_show_while_learning_says_so_and_no_match_only_for_filters(tmp_path: Path) -> None:
    """After one recorded probe, ``baseline show`` said "no baselines match" though no filter
    was given (a newcomer's review): it now says how many kernels are still learning."""
    from tests.support import invoke_cli

    with BaselineStore(tmp_path / "baselines.sqlite") as store:
        store.record_run(key(), 700.0, healthy=True)
        store.record_run(key(dtype="fp8"), 1400.0, healthy=True)
    state = ["--state-dir", str(tmp_path)]
    shown = invoke_cli("baseline", "show", *state)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("no baselines yet: 2 kernel(s) still learning")
    assert "3 healthy runs" in shown.stdout and "match" not in shown.stdout
    filtered = invoke_cli("baseline", "show", *state, "--dtype", "bf16")
    assert filtered.returncode == 0 and filtered.stdout == "no baselines match\n"
    assert json.loads(invoke_cli("baseline", "show", *state, "--json").stdout) == []


def test_show_json_with_learning_tells_learning_kernels_from_nothing_recorded(
    tmp_path: Path,
) -> None:
    """``baseline show --json`` printed ``[]`` for a store whose kernels were still learning as
    for one with nothing recorded, so a script could not tell them apart (the text said "2
    kernel(s) still learning"). ``--learning`` adds a row per such kernel, with the keys of a
    baseline's row (no figure yet) and the healthy runs it has of those it needs."""
    from tests.support import invoke_cli

    empty, learning = tmp_path / "empty", tmp_path / "learning"
    empty.mkdir()
    learning.mkdir()
    BaselineStore(empty / "baselines.sqlite").close()
    with BaselineStore(learning / "baselines.sqlite") as store:
        store.record_run(key(), 700.0, healthy=True, at=1000.0)
        store.record_run(key(), 420.0, healthy=False, at=1300.0)  # beside another process
        for at in (1000.0, 1300.0):
            store.record_run(key(dtype="fp8"), 1400.0, healthy=True, at=at)
        for at in (1000.0, 1300.0, 1600.0):
            store.record_run(key(dtype="int8"), 1500.0, healthy=True, at=at)
        (learned,) = store.list()

    def shown(state: Path, *args: str) -> Any:
        done = invoke_cli("baseline", "show", "--state-dir", str(state), "--json", *args)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    old = {
        **dataclasses.asdict(learned.key),
        "tflops": 1500.0,
        "source": "learned",
        "runs": 3,
        "created_at": learned.created_at,
        "updated_at": learned.updated_at,
        "note": "",
    }
    assert shown(learning) == [old]  # unchanged without --learning
    assert shown(empty, "--learning") == [] and shown(tmp_path / "none", "--learning") == []
    rows = shown(learning, "--learning")
    assert rows[0] == old
    assert rows[1:] == [
        {**dataclasses.asdict(key()), "tflops": None, "source": "learning", "runs": 1,
         "created_at": 1000.0, "updated_at": 1300.0, "note": "", "runs_needed": 3},
        {**dataclasses.asdict(key(dtype="fp8")), "tflops": None, "source": "learning",
         "runs": 2, "created_at": 1000.0, "updated_at": 1300.0, "note": "", "runs_needed": 3},
    ]  # fmt: skip
    assert [r["dtype"] for r in shown(learning, "--learning", "--dtype", "fp8")] == ["fp8"]
    text = invoke_cli("baseline", "show", "--state-dir", str(learning), "--learning")
    lines = [line for line in text.stdout.splitlines() if not line.startswith(" ")]  # wrapped
    assert len(lines) == 3 and "1500.0" in lines[0], text.stdout
    assert "bf16" in lines[1] and "learning: 1 of 3 healthy runs" in lines[1]
    assert "fp8" in lines[2] and "learning: 2 of 3 healthy runs" in lines[2]


def test_a_reader_that_cannot_migrate_an_older_store_says_so(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store of an older schema, read where it cannot be written (a read-only file system),
    failed with SQLite's "unable to open database file" (found in a review): the reader says
    what the store needs."""
    from sparkdiag.baseline.schema import MIGRATIONS

    with raw(db) as conn:
        for statement in MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")

    def cannot_write(self: BaselineStore) -> None:
        raise BaselineStoreError(f"cannot open baseline store {self.path}: readonly database")

    monkeypatch.setattr(BaselineStore, "_open_writable", cannot_write)
    with pytest.raises(BaselineStoreError) as raised:
        BaselineStore(db, readonly=True)
    assert "has an older schema than this sparkdiag's" in raised.value.message
    assert raised.value.message.endswith(
        "readonly database; open it once where it can be written (the daemon, or 'sparkdiag "
        "probe' as the store's owner)"
    )
    monkeypatch.undo()
    BaselineStore(db, readonly=True).close()  # where it can write, the reader migrates it
    with raw(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_show_tells_identities_apart_by_their_method(tmp_path: Path) -> None:
    """A kernel learning under the median method of before 2026-12 and under today's printed
    the same line in the text (the method was left out; a review): it is said where it is not
    today's."""
    from tests.support import invoke_cli

    with BaselineStore(tmp_path / "baselines.sqlite") as store:
        store.record_run(key(), 700.0, healthy=True, at=1000.0)
        store.record_run(key(method="median"), 690.0, healthy=True, at=1100.0)
    text = invoke_cli("baseline", "show", "--state-dir", str(tmp_path), "--learning")
    entries: list[str] = []  # a kernel's line with what wrapped under it
    for line in text.stdout.splitlines():
        if line.startswith(" ") and entries:
            entries[-1] += " " + line.strip()
        else:
            entries.append(line)
    learning = [entry for entry in entries if "learning:" in entry]
    assert len(learning) == 2 and len(set(learning)) == 2, text.stdout
    assert sum("method=median" in entry for entry in learning) == 1, text.stdout
