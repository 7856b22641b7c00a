"""Storage baselines: the healthy sequential throughput of one directory's filesystem, learned on
this machine as the GEMM baselines are (:mod:`sparkdiag.baseline.store`): the median of the first
healthy runs, once ``min_runs`` are in (3), following them until ``learn_runs`` (5), then frozen;
or pinned. Which run is healthy is the caller's to say (:func:`sparkdiag.storage.evaluate
.evaluate`: nothing else moving through the device, reads that reached it, and a figure not
judged slow against the baseline it already has); an unhealthy run is kept, not learned from.

A key is the drive (its model: a new drive learns anew), the mount point and block device, the
direction (``read``, ``write``), the path (``host``, ``gpu``, ``gds``) and the method (block size
and threads: figures measured another way are not compared). The tables (schema migration 3) are
apart from the GEMM ones. These functions take the store's connection inside its transaction;
:class:`~sparkdiag.baseline.store.BaselineStore` calls them.

``sqlite3 $STATE_DIRECTORY/baselines.sqlite 'SELECT * FROM storage_baselines'``.
"""

from __future__ import annotations

import math
import sqlite3
import statistics
import time
from dataclasses import dataclass
from typing import Any, Literal

from sparkdiag.baseline.schema import check_time

STORAGE_KEY = ("drive", "mountpoint", "device", "direction", "path", "method")
_KEY_LIST = ", ".join(STORAGE_KEY)
_KEY_WHERE = " AND ".join(f"{c} = ?" for c in STORAGE_KEY)
_COLUMNS = f"{_KEY_LIST}, bytes_per_second, source, runs, created_at, updated_at, note"
_UPSERT = f"INSERT OR REPLACE INTO storage_baselines ({_COLUMNS}) VALUES ({', '.join('?' * 12)})"


@dataclass(frozen=True)
class StorageKey:
    """What a storage baseline is for (see the module docstring); ``drive`` may be "" where the
    model is unknown, the others must be set."""

    drive: str
    mountpoint: str
    device: str
    direction: str
    path: str
    method: str

    def __post_init__(self) -> None:
        for name in STORAGE_KEY:
            value = getattr(self, name)
            if not isinstance(value, str) or (name != "drive" and not value.strip()):
                raise ValueError(f"StorageKey.{name} must be a non-empty string, got {value!r}")

    def row(self) -> tuple[str, ...]:
        return tuple(getattr(self, name) for name in STORAGE_KEY)


@dataclass(frozen=True)
class StorageBaseline:
    """bytes_per_second: the healthy figure; source learned or pinned; runs: healthy runs in it."""

    key: StorageKey
    bytes_per_second: float
    source: Literal["learned", "pinned"]
    runs: int
    created_at: float
    updated_at: float
    note: str = ""


def _figure(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"bytes_per_second must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"bytes_per_second must be finite and > 0, got {value!r}")
    return float(value)


def select(conn: sqlite3.Connection, key: StorageKey) -> StorageBaseline | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM storage_baselines WHERE {_KEY_WHERE}", key.row()
    ).fetchone()
    return None if row is None else _baseline(row)


def select_all(conn: sqlite3.Connection) -> list[StorageBaseline]:
    rows = conn.execute(f"SELECT {_COLUMNS} FROM storage_baselines ORDER BY {_KEY_LIST}")
    return [_baseline(row) for row in rows.fetchall()]


def _baseline(row: tuple[Any, ...]) -> StorageBaseline:
    width = len(STORAGE_KEY)
    value, source, runs, created, updated, note = row[width:]
    return StorageBaseline(
        StorageKey(*(str(v) for v in row[:width])),
        float(value),
        "pinned" if source == "pinned" else "learned",
        int(runs),
        float(created),
        float(updated),
        str(note),
    )


def record(
    conn: sqlite3.Connection,
    key: StorageKey,
    bytes_per_second: float,
    healthy: bool,
    learn_runs: int,
    min_runs: int,
    at: float | None = None,
) -> StorageBaseline | None:
    """Keep one figure; learn from it while the key's baseline is neither pinned nor frozen.
    Returns the baseline after it (None while fewer than ``min_runs`` healthy runs are in)."""
    value = _figure(bytes_per_second)
    when = time.time() if at is None else check_time(at, "at")
    conn.execute(
        f"INSERT INTO storage_runs ({_KEY_LIST}, bytes_per_second, healthy, at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (*key.row(), value, int(bool(healthy)), when),
    )
    current = select(conn, key)
    if not healthy or (
        current is not None and (current.source == "pinned" or current.runs >= learn_runs)
    ):
        return current
    first = [
        float(v)
        for (v,) in conn.execute(
            f"SELECT bytes_per_second FROM storage_runs WHERE {_KEY_WHERE} AND healthy = 1"
            " ORDER BY id LIMIT ?",
            (*key.row(), learn_runs),
        )
    ]
    if len(first) < min_runs:
        return current
    now = time.time()
    created = current.created_at if current is not None else now
    conn.execute(
        _UPSERT,
        (*key.row(), statistics.median(first), "learned", len(first), created, now, ""),
    )
    return select(conn, key)


def pin(
    conn: sqlite3.Connection, key: StorageKey, bytes_per_second: float, note: str = ""
) -> StorageBaseline:
    """Set the key's baseline; later runs never move it."""
    value = _figure(bytes_per_second)
    current = select(conn, key)
    now = time.time()
    created = current.created_at if current is not None else now
    conn.execute(
        _UPSERT,
        (*key.row(), value, "pinned", 0, created, now, note),
    )
    baseline = select(conn, key)
    assert baseline is not None
    return baseline


def reset(conn: sqlite3.Connection, mountpoint: str | None = None) -> int:
    """Delete the storage baselines and runs (of one mount point); how many baselines went."""
    where, params = (" WHERE mountpoint = ?", (mountpoint,)) if mountpoint else ("", ())
    removed = conn.execute(f"DELETE FROM storage_baselines{where}", params).rowcount
    conn.execute(f"DELETE FROM storage_runs{where}", params)
    return int(removed)
