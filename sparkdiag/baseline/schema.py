"""The baseline store's SQL: the key columns, the schema as a list of migrations, the
transaction helper and the checks on values before they are written.

Schema versions live in ``PRAGMA user_version``; each migration moves the file from version i
to i + 1 and is never edited once released (see :mod:`sparkdiag.baseline.store`).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import math
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeGuard

KEY_COLUMNS = ("gpu_uuid", "dtype", "shape", "context", "driver", "torch", "cuda", "method")
KEY_WHERE = " AND ".join(f"{column} = ?" for column in KEY_COLUMNS)
KEY_LIST = ", ".join(KEY_COLUMNS)
BASELINE_COLUMNS = f"{KEY_LIST}, tflops, source, runs, created_at, updated_at, note"
# The key as schema version 1 had it (migrations are never edited, so they spell it out).
_V1KEY_LIST = "gpu_uuid, dtype, shape, context, driver, torch, cuda"
# Version 1's column definitions, for the migrations that create a table with them (runs and
# baselines in 1, baselines again in 2): frozen like the migrations themselves.
_V1KEY_DDL = """\
            gpu_uuid TEXT NOT NULL, dtype TEXT NOT NULL, shape TEXT NOT NULL,
            context TEXT NOT NULL, driver TEXT NOT NULL, torch TEXT NOT NULL,"""
_V1BASELINE_DDL = """\
            tflops REAL NOT NULL CHECK (tflops > 0),
            source TEXT NOT NULL CHECK (source IN ('learned', 'pinned')),
            runs INTEGER NOT NULL CHECK (runs >= 0),
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            note TEXT NOT NULL DEFAULT '',"""

# Each entry moves the schema from version i to i + 1 (PRAGMA user_version).
# Append new migrations; never edit a released one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        f"""CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
{_V1KEY_DDL}
            cuda TEXT NOT NULL,
            tflops REAL NOT NULL CHECK (tflops > 0),
            healthy INTEGER NOT NULL CHECK (healthy IN (0, 1)),
            at REAL NOT NULL,
            conditions TEXT
        )""",
        f"CREATE INDEX runs_by_key ON runs ({_V1KEY_LIST}, healthy, id)",
        f"""CREATE TABLE baselines (
{_V1KEY_DDL}
            cuda TEXT NOT NULL,
{_V1BASELINE_DDL}
            PRIMARY KEY ({_V1KEY_LIST})
        ) WITHOUT ROWID""",
    ),
    # 2: the measuring method joins the key; what was there was measured by the median.
    (
        "ALTER TABLE runs ADD COLUMN method TEXT NOT NULL DEFAULT 'median'",
        "DROP INDEX runs_by_key",
        f"CREATE INDEX runs_by_key ON runs ({_V1KEY_LIST}, method, healthy, id)",
        f"""CREATE TABLE baselines_2 (
{_V1KEY_DDL}
            cuda TEXT NOT NULL, method TEXT NOT NULL,
{_V1BASELINE_DDL}
            PRIMARY KEY ({_V1KEY_LIST}, method)
        ) WITHOUT ROWID""",
        f"""INSERT INTO baselines_2 SELECT {_V1KEY_LIST}, 'median', tflops, source, runs,
            created_at, updated_at, note FROM baselines""",
        "DROP TABLE baselines",
        "ALTER TABLE baselines_2 RENAME TO baselines",
    ),
    # 3: storage figures (sparkdiag storage, the daemon's storage probe, check --storage), in
    # tables of their own: a drive, a mount, a direction, a path (host, gpu, gds) and a method.
    (
        """CREATE TABLE storage_runs (
            id INTEGER PRIMARY KEY,
            drive TEXT NOT NULL, mountpoint TEXT NOT NULL, device TEXT NOT NULL,
            direction TEXT NOT NULL, path TEXT NOT NULL, method TEXT NOT NULL,
            bytes_per_second REAL NOT NULL CHECK (bytes_per_second > 0),
            healthy INTEGER NOT NULL CHECK (healthy IN (0, 1)),
            at REAL NOT NULL,
            conditions TEXT
        )""",
        "CREATE INDEX storage_runs_by_key ON storage_runs"
        " (drive, mountpoint, device, direction, path, method, healthy, id)",
        """CREATE TABLE storage_baselines (
            drive TEXT NOT NULL, mountpoint TEXT NOT NULL, device TEXT NOT NULL,
            direction TEXT NOT NULL, path TEXT NOT NULL, method TEXT NOT NULL,
            bytes_per_second REAL NOT NULL CHECK (bytes_per_second > 0),
            source TEXT NOT NULL CHECK (source IN ('learned', 'pinned')),
            runs INTEGER NOT NULL CHECK (runs >= 0),
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            note TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (drive, mountpoint, device, direction, path, method)
        ) WITHOUT ROWID""",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)

# Retention (no migration: it only deletes rows; store.BaselineStore.prune runs these), key by
# key (its columns bound as :k0, :k1 ...) so that each statement walks runs_by_key. Always kept:
# the newest run of the key, and its first ``learn`` healthy runs (a learned baseline is their
# median; record_run reads them while it learns). Of the others, the runs beyond the newest
# ``keep`` go (PRUNE_BEYOND, for the keys RUN_COUNTS shows over), and those older than ``cutoff``
# (PRUNE_OLDER, for the keys OLD_KEYS finds).
RUN_COUNTS = f"SELECT {KEY_LIST}, count(*) FROM runs GROUP BY {KEY_LIST}"
OLD_KEYS = f"SELECT DISTINCT {KEY_LIST} FROM runs WHERE at < :cutoff"
_KEY_NAMED = " AND ".join(f"{column} = :k{i}" for i, column in enumerate(KEY_COLUMNS))
_NOT_KEPT = f"""id != (SELECT max(id) FROM runs WHERE {_KEY_NAMED})
    AND id NOT IN (
        SELECT id FROM runs WHERE {_KEY_NAMED} AND healthy = 1 ORDER BY id LIMIT :learn)"""
PRUNE_BEYOND = f"""DELETE FROM runs WHERE {_KEY_NAMED}
    AND id <= (SELECT id FROM runs WHERE {_KEY_NAMED} ORDER BY id DESC LIMIT 1 OFFSET :keep)
    AND {_NOT_KEPT}"""
PRUNE_OLDER = f"DELETE FROM runs WHERE {_KEY_NAMED} AND at < :cutoff AND {_NOT_KEPT}"


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            # The original error says more; SQLite rolls back on close anyway.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def placeholders(extra: int) -> str:
    """``?, ?, ...`` for the key columns and ``extra`` more."""
    return ", ".join("?" * (len(KEY_COLUMNS) + extra))


def filters(**filters: str | None) -> tuple[str, tuple[str, ...]]:
    clauses: builtins.list[str] = []
    params: builtins.list[str] = []
    for column, value in filters.items():
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{column} filter must be a non-empty string, got {value!r}")
        clauses.append(f"{column} = ?")
        params.append(value)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    return where, tuple(params)


def is_real(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_tflops(value: object) -> float:
    if not is_real(value):
        raise ValueError(f"tflops must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"tflops must be finite and > 0, got {value!r}")
    return number


def check_time(value: object, name: str) -> float:
    if not is_real(value):
        raise ValueError(f"{name} must be a unix time in seconds, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite unix time >= 0, got {value!r}")
    return number


def conditions_json(conditions: Mapping[str, Any] | None) -> str | None:
    if conditions is None:
        return None
    if not isinstance(conditions, Mapping):
        raise ValueError(f"conditions must be a mapping, got {type(conditions).__name__}")
    try:
        return json.dumps(dict(conditions), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"conditions must be JSON-serialisable: {exc}") from exc


def conditions_from_json(text: object) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(str(text))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def is_busy(exc: sqlite3.OperationalError) -> bool:
    message = str(exc).lower()
    return "locked" in message or "busy" in message
