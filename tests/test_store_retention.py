"""The baseline store's retention: the runs a baseline needs stay, the history beyond them is
bounded by count and age, the WAL is truncated, and a mostly free file is compacted."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sparkdiag.baseline import keeper as keeper_module
from sparkdiag.baseline.keeper import Retention, StoreKeeper
from sparkdiag.baseline.model import BaselineKey
from sparkdiag.baseline.store import BaselineStore, open_store

T0 = 1_700_000_000.0


def key(gpu: str = "GPU-a", dtype: str = "bf16") -> BaselineKey:
    return BaselineKey(gpu, dtype, "8192x8192x8192", "native", "580.1", "2.11", "13.0")


def ids(store: BaselineStore, k: BaselineKey) -> list[int]:
    return sorted(run.id for run in store.runs(k, limit=10_000))


def test_keeps_the_newest_the_teaching_runs_and_the_newest_of_each_key(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "b.sqlite", learn_runs=3, min_runs=2)
    a, b = key("GPU-a"), key("GPU-b")
    for i in range(4):  # unhealthy first: they teach nothing
        store.record_run(a, 50.0, healthy=False, at=T0 + i)
    for i in range(4, 20):
        store.record_run(a, 100.0 + i, healthy=True, at=T0 + i)
        store.record_run(b, 100.0, healthy=True, at=T0 + i)
    before_a, before_b = ids(store, a), ids(store, b)

    deleted = store.prune(keep=5, max_age_s=1e9, now=T0 + 20)

    teaching = before_a[4:7]  # the first three healthy runs of a
    assert ids(store, a) == sorted(teaching + before_a[-5:])
    assert ids(store, b) == sorted(before_b[:3] + before_b[-5:])
    assert deleted == (20 - 8) + (16 - 8)
    # the learned baseline is the median of its teaching runs, and learning it again from
    # what is left gives the same figure
    learned = store.get(a)
    assert learned is not None and learned.tflops == 105.0 and learned.runs == 3
    assert store.prune(keep=5, max_age_s=1e9, now=T0 + 20) == 0  # nothing left to do


def test_a_baseline_still_learning_keeps_its_runs(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "b.sqlite", learn_runs=3, min_runs=3)
    k = key()
    store.record_run(k, 100.0, healthy=True, at=T0)
    for i in range(1, 30):
        store.record_run(k, 10.0, healthy=False, at=T0 + i)
    store.record_run(k, 110.0, healthy=True, at=T0 + 30)
    store.prune(keep=2, max_age_s=1e9, now=T0 + 31)
    assert len(ids(store, k)) == 3  # two healthy (teaching) and the newest of the keep
    baseline = store.record_run(k, 120.0, healthy=True, at=T0 + 32)
    assert baseline is not None and baseline.tflops == 110.0  # median of 100, 110, 120


def test_old_runs_go_but_what_is_always_kept_stays(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "b.sqlite", learn_runs=2, min_runs=2)
    old, live = key("GPU-old"), key("GPU-live")
    for i in range(10):
        store.record_run(old, 100.0, healthy=True, at=T0 + i)  # software since replaced
    for i in range(10):
        store.record_run(live, 100.0, healthy=True, at=T0 + 1000 + i)
    deleted = store.prune(keep=100, max_age_s=500.0, now=T0 + 1010)
    assert deleted == 7  # old: 10 runs less its two teaching runs and its newest
    assert len(ids(store, old)) == 3
    assert len(ids(store, live)) == 10
    assert store.latest_runs()[0].key in (old, live)
    assert {r.key for r in store.latest_runs()} == {old, live}


def test_prune_refuses_bad_limits(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "b.sqlite")
    for bad_keep in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="keep"):
            store.prune(bad_keep, 10.0)  # type: ignore[arg-type]
    for bad_age in (0, -1.0, float("nan"), "1"):
        with pytest.raises(ValueError, match="max_age_s"):
            store.prune(1, bad_age)  # type: ignore[arg-type]


def test_the_keeper_bounds_the_store_checkpoints_and_rate_limits(tmp_path: Path) -> None:
    now = [0.0]
    keeper = StoreKeeper(
        lambda: open_store(tmp_path, create=True), Retention(runs=4, days=30), lambda: now[0]
    )
    store = keeper.store()
    assert store is not None
    k = key()
    for _ in range(20):
        store.record_run(k, 100.0, healthy=True, conditions={"pad": "x" * 400})
    wal = tmp_path / "baselines.sqlite-wal"
    assert wal.stat().st_size > 0
    assert keeper.maintain() == 20 - 4 - store.learn_runs
    assert wal.stat().st_size == 0  # checkpointed and truncated
    store.record_run(k, 100.0, healthy=True)
    now[0] = keeper_module.MAINTAIN_EVERY - 1
    assert keeper.maintain() is None  # too soon
    now[0] = keeper_module.MAINTAIN_EVERY
    assert keeper.maintain() == 1
    assert len(ids(store, k)) == 4 + store.learn_runs


def test_a_mostly_free_file_is_compacted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keeper_module, "COMPACT_MIN_BYTES", 64 * 1024)
    path = tmp_path / "baselines.sqlite"
    store = open_store(tmp_path, create=True)
    k = key()
    conn = sqlite3.connect(path)  # a store that grew before retention: 2,000 runs of one key
    pad = '{"pad": "' + "x" * 400 + '"}'
    rows = [(*k.as_row(), 100.0, 1, T0 + i, pad) for i in range(2000)]
    conn.executemany(
        "INSERT INTO runs (gpu_uuid, dtype, shape, context, driver, torch, cuda, method, "
        "tflops, healthy, at, conditions) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    conn.commit()
    conn.close()
    keeper = StoreKeeper(lambda: store, Retention(runs=10, days=36500))
    grown = store.space()[0]
    assert keeper.maintain() == 2000 - 10 - store.learn_runs
    assert store.space() == (path.stat().st_size, 0)  # checkpointed, no free page left
    assert path.stat().st_size < grown / 10
    assert store.integrity_check() == "ok"
    assert len(ids(store, k)) == 10 + store.learn_runs


def test_maintenance_failing_counts_as_a_write_error(tmp_path: Path) -> None:
    store = open_store(tmp_path, create=True)
    keeper = StoreKeeper(lambda: store)
    store.close()
    assert keeper.maintain(force=True) is None
    health = keeper.health()
    assert not health.up and health.errors["write"] == 1
