"""Writes to a baseline store until it is killed (driven by tests/test_baseline.py).

Run as ``python crasher.py MODE DB KEYS_JSON``; KEYS_JSON is a list of
BaselineKey fields (as dicts) whose committed baselines the test protects.

``store``: loops through the public API as fast as it can: records runs for the
protected keys (a frozen learned one and a pinned one, which must not move) and
for scratch keys, and pins scratch keys with large notes. Prints ``writing``
after the first round has committed.

``bulk``: one large transaction that never commits, in SQLite directly with the
store's settings (WAL, synchronous=FULL) and a tiny page cache so that dirty
pages spill into the WAL file before any commit: it overwrites the protected
baselines (as a pin would), inserts thousands of runs and upserts hundreds of
pinned scratch baselines. Prints ``in-transaction`` once it has written about
1.2 MB inside the transaction, then keeps writing.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from itertools import count
from pathlib import Path

from sparkdiag.baseline.model import BaselineKey
from sparkdiag.baseline.store import BaselineStore


def scratch(i: int) -> BaselineKey:
    return BaselineKey(f"GPU-scratch-{i}", "fp8", "4096x4096x4096", "container", "1", "2", "3")


def store_mode(db: Path, protected: list[BaselineKey]) -> None:
    with BaselineStore(db, busy_timeout_s=30.0) as store:
        for i in count():
            for key in protected:
                store.record_run(key, 1.0, healthy=True)
            store.record_run(
                scratch(i % 7), 100.0 + i % 13, healthy=i % 3 != 0, conditions={"i": i}
            )
            store.pin(scratch(100 + i % 5), 50.0 + i, note="n" * 65536)
            if i == 0:
                print("writing", flush=True)


def bulk_mode(db: Path, protected: list[BaselineKey]) -> None:
    conn = sqlite3.connect(str(db), isolation_level=None, timeout=30.0)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA cache_size = 16")  # pages: forces dirty pages out to the WAL early
    conn.execute("BEGIN IMMEDIATE")
    where = "gpu_uuid = ? AND dtype = ? AND shape = ? AND context = ? AND driver = ? "
    where += "AND torch = ? AND cuda = ? AND method = ?"
    big = "x" * 4096
    for key in protected:
        conn.execute(
            "UPDATE baselines SET tflops = 1.0, source = 'pinned', runs = 0, note = ? "
            f"WHERE {where}",
            (big, *key.as_row()),
        )
    for i in count():
        if i == 300:  # about 1.2 MB written, far past the 16-page cache: spilled to the WAL
            print("in-transaction", flush=True)
        conn.execute(
            "INSERT INTO runs (gpu_uuid, dtype, shape, context, driver, torch, cuda, method, "
            "tflops, healthy, at, conditions) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)",
            (*scratch(i % 50).as_row(), 1.0 + i, float(i), json.dumps({"pad": big})),
        )
        if i % 10 == 0:
            conn.execute(
                "INSERT INTO baselines (gpu_uuid, dtype, shape, context, driver, torch, cuda, "
                "method, tflops, source, runs, created_at, updated_at, note) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pinned', 0, 0, 0, ?) "
                "ON CONFLICT DO UPDATE SET tflops = excluded.tflops, note = excluded.note",
                (*scratch(1000 + i % 300).as_row(), 1.0 + i, big),
            )


def main() -> int:
    mode, db = sys.argv[1], Path(sys.argv[2])
    protected = [BaselineKey(**fields) for fields in json.loads(sys.argv[3])]
    if mode == "store":
        store_mode(db, protected)
    elif mode == "bulk":
        bulk_mode(db, protected)
    else:
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
