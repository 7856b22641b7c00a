"""The baseline store's health: a full disk (SQLite's own SQLITE_FULL, through max_page_count), a
damaged file and a missing directory are visible as metrics, logged once per change, reported by
check, and recovered from without a restart."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sparkdiag.baseline.keeper import StoreKeeper, inspect_store
from sparkdiag.baseline.model import BaselineKey
from sparkdiag.baseline.store import BaselineStore, open_store
from sparkdiag.check.store_checks import check_baseline_store
from sparkdiag.exporter.probe import ProbeCollector
from sparkdiag.probe.launchers import FixtureLauncher
from sparkdiag.scheduling.probe_state import ProbeState
from sparkdiag.scheduling.scheduler import ProbeScheduler
from tests.support import NVML, PROBE, http_get, running_daemon
from tests.support import fixture_snapshot as snapshot
from tests.support.check import context, poll


def _full(store: BaselineStore, full: bool) -> None:
    """Make SQLite answer SQLITE_FULL ("database or disk is full") on growth, or stop it."""
    conn = store._conn
    assert conn is not None
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages if full else 1_000_000}")


def _registry(state: ProbeState, keeper: StoreKeeper) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProbeCollector(state.view, keeper.health))  # type: ignore[arg-type]
    return registry


def test_a_full_disk_is_visible_logged_once_and_recovered_from(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(tmp_path, create=True)
    keeper = StoreKeeper(lambda: store)
    state = ProbeState()
    sched = ProbeScheduler(
        FixtureLauncher(PROBE / "h200-default.json"),
        state,
        keeper,
        "native",
        lambda: snap,
        300.0,
    )
    snap = snapshot("h200-idle", tmp_path)
    registry = _registry(state, keeper)
    assert registry.get_sample_value("sparkdiag_baseline_store_up") == 1.0

    _full(store, True)
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        (record,) = sched.run_cycle()
        assert record.result == "ok"
        assert any(f.delivered for f in record.figures)  # the measurement is kept
    assert registry.get_sample_value("sparkdiag_baseline_store_up") == 0.0
    errors = registry.get_sample_value(
        "sparkdiag_baseline_store_errors_total", {"operation": "write"}
    )
    assert errors == 3.0
    unusable = [r for r in caplog.records if "baseline store unusable" in r.getMessage()]
    assert len(unusable) == 1, [r.getMessage() for r in caplog.records]  # once, not per cycle
    assert "full" in unusable[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info]  # no tracebacks

    _full(store, False)
    (record,) = sched.run_cycle()
    assert registry.get_sample_value("sparkdiag_baseline_store_up") == 1.0
    assert any("usable again" in r.getMessage() for r in caplog.records)
    conn = store._conn
    assert conn is not None
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] > 0  # learning resumed
    store.close()


def test_a_damaged_store_is_reported_by_check_and_unusable_for_the_daemon(tmp_path: Path) -> None:
    (tmp_path / "baselines.sqlite").write_bytes(b"this is not an SQLite database" * 100)
    report = inspect_store(tmp_path)
    assert report.state == "unusable"
    ctx = context(poll(NVML / "h200-idle.json"), baseline_store=report)
    (result,) = check_baseline_store(ctx)
    assert result.status == "warn" and "unusable" in result.finding
    assert "move it aside" in result.action

    keeper = StoreKeeper(lambda: open_store(tmp_path, create=True))
    health = keeper.health()
    assert not health.up and health.errors["open"] == 1 and health.reason
    (tmp_path / "baselines.sqlite").unlink()  # the user moves it aside
    assert keeper.store() is not None and keeper.health().up


def test_check_on_a_fresh_and_a_healthy_store(tmp_path: Path) -> None:
    (result,) = check_baseline_store(
        context(poll(NVML / "h200-idle.json"), baseline_store=inspect_store(tmp_path))
    )
    assert result.status == "skip" and "no baselines yet" in result.finding
    open_store(tmp_path, create=True).close()  # a store the daemon made, nothing learnt yet
    (result,) = check_baseline_store(
        context(poll(NVML / "h200-idle.json"), baseline_store=inspect_store(tmp_path))
    )
    assert result.status == "skip" and result.finding.startswith("no baselines yet in")
    assert "published figures only" in result.finding and "learn" in result.action
    store = open_store(tmp_path, create=True)
    store.pin(BaselineKey("GPU-0", "bf16", "4096x4096x4096", "native", "", "", ""), 700.0)
    store.close()
    (result,) = check_baseline_store(
        context(poll(NVML / "h200-idle.json"), baseline_store=inspect_store(tmp_path))
    )
    assert result.status == "pass" and result.finding.startswith("1 baseline(s) in")


def test_the_daemon_exports_a_store_it_cannot_open_and_recovers(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "baselines.sqlite").write_bytes(b"garbage" * 1000)
    args = [
        "--nvml-fixture", str(NVML / "h200-idle.json"), "--probe.fixture",
        str(PROBE / "h200-default.json"), "--state-dir", str(state),
        "--probe.first-delay", "0", "--probe.interval", "1",
    ]  # fmt: skip
    with running_daemon(args) as base:
        body = http_get(base + "/metrics")[2].decode()
        assert re.search(r"^sparkdiag_baseline_store_up 0\.0$", body, re.M), body
        assert 'sparkdiag_baseline_store_errors_total{operation="open"}' in body
        (state / "baselines.sqlite").unlink()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            body = http_get(base + "/metrics")[2].decode()
            if re.search(r"^sparkdiag_baseline_store_up 1\.0$", body, re.M):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the store did not come back")
    assert (state / "baselines.sqlite").is_file()


def _daemon_probe(state_dir: Path, tmp_path: Path) -> tuple[StoreKeeper, ProbeScheduler]:
    keeper = StoreKeeper(lambda: open_store(state_dir, create=True, verify=False))
    snap = snapshot("h200-idle", tmp_path)
    launcher = FixtureLauncher(PROBE / "h200-default.json")
    return keeper, ProbeScheduler(launcher, ProbeState(), keeper, "native", lambda: snap, 300.0)


def test_a_store_moved_aside_or_removed_while_open_is_opened_again(tmp_path: Path) -> None:
    """The daemon kept writing into the file it had open after it was moved aside (the advice
    for a damaged store) or removed with its state directory: nothing reached the new place,
    the baselines went at the next start, and check read none (found in a review)."""
    import shutil

    state_dir = tmp_path / "state"
    keeper, sched = _daemon_probe(state_dir, tmp_path)
    sched.run_cycle()
    db = state_dir / "baselines.sqlite"
    db.rename(tmp_path / "aside.sqlite")
    sched.run_cycle()
    assert db.exists() and keeper.health().up  # a new store, in its place
    assert inspect_store(state_dir).state == "ok"
    shutil.rmtree(state_dir)
    sched.run_cycle()
    assert keeper.health().up and db.exists()  # made again, directory and all
    assert keeper.health().errors["write"] == 0


def test_a_write_that_finds_the_file_damaged_lets_go_of_it(tmp_path: Path) -> None:
    """A store damaged while open was written into for ever, and store_up stayed 0 after it
    was moved aside (found in a review): a write that finds damage lets the file go, the next
    cycle's open meets the integrity check, and moving it aside brings the store back."""
    import sqlite3

    state_dir = tmp_path / "state"
    keeper, sched = _daemon_probe(state_dir, tmp_path)
    sched.run_cycle()
    keeper.maintain(force=True)  # the WAL into the file, which the damage then hits
    db = state_dir / "baselines.sqlite"
    with db.open("r+b") as fh:  # a bad run of sectors under the runs table
        fh.seek(4096 * 2)
        fh.write(b"\xff" * 4096 * 4)
    with sqlite3.connect(db) as conn:  # another writer: the daemon's page cache is dropped
        conn.execute("PRAGMA user_version = 3")
    sched.run_cycle()
    health = keeper.health()
    assert not health.up and "malformed" in (health.reason or "")
    assert keeper._store is None  # let go of, where it was kept and written
    sched.run_cycle()
    assert not keeper.health().up and keeper.health().errors["open"] >= 1
    db.rename(tmp_path / "damaged.sqlite")
    sched.run_cycle()
    assert keeper.health().up and db.exists()
