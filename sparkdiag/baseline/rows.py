"""The baselines table's rows, read and written: a :class:`Baseline` from a row, and the row of
one, by its key (the store's queries: :mod:`sparkdiag.baseline.store`)."""

from __future__ import annotations

import sqlite3
from typing import Any

from sparkdiag.baseline.model import Baseline, BaselineKey, BaselineStoreError
from sparkdiag.baseline.schema import (
    BASELINE_COLUMNS,
    KEY_COLUMNS,
    KEY_LIST,
    KEY_WHERE,
    placeholders,
)


def select_baseline(conn: sqlite3.Connection, key: BaselineKey) -> Baseline | None:
    row = conn.execute(
        f"SELECT {BASELINE_COLUMNS} FROM baselines WHERE {KEY_WHERE}", key.as_row()
    ).fetchone()
    return None if row is None else baseline_from_row(row)


def upsert_baseline(conn: sqlite3.Connection, baseline: Baseline) -> None:
    conn.execute(
        f"INSERT INTO baselines ({BASELINE_COLUMNS}) VALUES ({placeholders(6)})"
        f" ON CONFLICT ({KEY_LIST}) DO UPDATE SET tflops = excluded.tflops,"
        " source = excluded.source, runs = excluded.runs,"
        " updated_at = excluded.updated_at, note = excluded.note",
        (
            *baseline.key.as_row(),
            baseline.tflops,
            baseline.source,
            baseline.runs,
            baseline.created_at,
            baseline.updated_at,
            baseline.note,
        ),
    )


def baseline_from_row(row: tuple[Any, ...]) -> Baseline:
    key = BaselineKey(*(str(value) for value in row[: len(KEY_COLUMNS)]))
    source = str(row[9])
    if source not in ("learned", "pinned"):
        raise BaselineStoreError(f"unknown baseline source {source!r} in the database")
    return Baseline(
        key=key,
        tflops=float(row[8]),
        source="pinned" if source == "pinned" else "learned",
        runs=int(row[10]),
        created_at=float(row[11]),
        updated_at=float(row[12]),
        note=str(row[13]),
    )
