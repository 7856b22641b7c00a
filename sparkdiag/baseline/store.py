"""Healthy GEMM baselines, kept in an SQLite file in the state directory.

A baseline is what "healthy" throughput means for one GPU running one probe
(dtype, shape) in one context (native or container) under one software
identity (driver, torch, CUDA). Every probe result is recorded as a run; the
baseline is either

* learned: the median of the first healthy runs. It exists once ``min_runs``
  healthy runs are in, follows the median until ``learn_runs`` went into it,
  and is then frozen, so later runs (a GPU that slowly degrades) never drag
  it down; or
* pinned by the user (``sparkdiag baseline pin``), which overrides learning
  and survives later runs until it is reset.

New software is a new key, so it learns a new baseline while the old one is
kept (and listed) for comparison. ``reset`` deletes baselines and their runs
so learning starts again.

Durability: WAL journal, ``synchronous=FULL``, and every write is a single
``BEGIN IMMEDIATE`` transaction, so a crash or ``kill -9`` mid-write leaves
the last committed state intact. Several processes may write at once (the
daemon records, the CLI pins); SQLite serialises them and waits up to
``busy_timeout_s`` for the write lock. Within one process a store object
holds one connection guarded by a lock, so threads may share it.

Retention: :meth:`BaselineStore.prune` deletes the runs that no baseline needs beyond a bounded
history (the daemon calls it
through :class:`sparkdiag.baseline.keeper.StoreKeeper`; the rules in
:mod:`sparkdiag.baseline.schema`), then the WAL is checkpointed and
truncated. Deleted pages are reused by later runs, so the file stops growing once the history is
full; a file that is mostly free pages (a store from before retention) is compacted once.

Inspect with ``sqlite3 $STATE_DIRECTORY/baselines.sqlite 'SELECT * FROM baselines'``.
"""

from __future__ import annotations

import builtins
import math
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from sparkdiag.baseline import opening, storage_store
from sparkdiag.baseline.model import (
    Baseline,
    BaselineKey,
    BaselineStoreDamaged,
    BaselineStoreError,
    Learning,
    RunRecord,
)
from sparkdiag.baseline.rows import baseline_from_row, select_baseline, upsert_baseline
from sparkdiag.baseline.schema import (
    BASELINE_COLUMNS,
    KEY_COLUMNS,
    KEY_LIST,
    KEY_WHERE,
    MIGRATIONS,
    OLD_KEYS,
    PRUNE_BEYOND,
    PRUNE_OLDER,
    RUN_COUNTS,
    SCHEMA_VERSION,
    check_tflops,
    check_time,
    conditions_from_json,
    conditions_json,
    filters,
    is_busy,
    is_real,
    placeholders,
    transaction,
)
from sparkdiag.baseline.storage_store import StorageBaseline, StorageKey
from sparkdiag.statedir import StateDirError, ensure_state_directory, state_file

DEFAULT_FILENAME = "baselines.sqlite"

# Bytes the WAL is cut back to after each checkpoint (SQLite's auto-checkpoint runs every 1000
# pages, about 4 MiB, and leaves the file at its largest size without this limit).
WAL_LIMIT_BYTES = 4 << 20


def open_store(
    state_dir: Path | None, create: bool, write: bool | None = None, verify: bool = True
) -> BaselineStore:
    """The baseline store in ``state_dir`` (default: the state directory, see statedir).

    With ``create`` the directory and the database are created when missing (the daemon and
    ``sparkdiag probe``, which teach baselines); without it a missing database is an error
    (``check`` and ``baseline show|pin|reset`` only read what was learned). ``write`` (default:
    ``create``) opens it for writing (``baseline pin|reset``); without, for reading only, which
    needs no write permission nor a writable file system (:mod:`sparkdiag.baseline.opening`).
    ``verify`` runs SQLite's quick check and refuses a damaged file. Every failure is a
    :class:`BaselineStoreError` whose message names the path and why.
    """
    try:
        path = state_file(state_dir, DEFAULT_FILENAME)
        if create:
            ensure_state_directory(path.parent)
    except StateDirError as exc:
        raise BaselineStoreError(str(exc)) from None
    if not create and not path.exists():
        raise BaselineStoreError(f"no baselines yet: {path} does not exist")
    store = BaselineStore(path, readonly=not (create if write is None else write))
    if verify:
        try:
            store.verify()
        except BaselineStoreError:
            store.close()
            raise
    return store


class BaselineStore:
    """SQLite-backed baselines; see the module docstring for the rules.

    ``learn_runs``: healthy runs after which a learned baseline is frozen.
    ``min_runs``: healthy runs needed before any baseline exists.
    ``busy_timeout_s``: how long a write waits for another writer.
    ``readonly``: open for reading only (:func:`sparkdiag.baseline.opening.connect_readonly`).
    Raises :class:`BaselineStoreError` (naming the path) when the file cannot
    be opened as a baseline store, ``ValueError`` for bad arguments.
    """

    def __init__(
        self,
        path: Path,
        learn_runs: int = 5,
        min_runs: int = 3,
        busy_timeout_s: float = 10.0,
        readonly: bool = False,
    ) -> None:
        if isinstance(min_runs, bool) or not isinstance(min_runs, int) or min_runs < 1:
            raise ValueError(f"min_runs must be an integer >= 1, got {min_runs!r}")
        if isinstance(learn_runs, bool) or not isinstance(learn_runs, int):
            raise ValueError(f"learn_runs must be an integer, got {learn_runs!r}")
        if learn_runs < min_runs:
            raise ValueError(f"learn_runs ({learn_runs}) must be >= min_runs ({min_runs})")
        if not is_real(busy_timeout_s) or not math.isfinite(busy_timeout_s):
            raise ValueError(f"busy_timeout_s must be a finite number, got {busy_timeout_s!r}")
        if busy_timeout_s < 0:
            raise ValueError(f"busy_timeout_s must be >= 0, got {busy_timeout_s!r}")
        self.path = Path(path)
        self.learn_runs = learn_runs
        self.min_runs = min_runs
        self.busy_timeout_s = float(busy_timeout_s)
        self.readonly = readonly
        self._lock = threading.RLock()
        self._batched = False  # inside cycle(): writes join its transaction
        self._conn: sqlite3.Connection | None = self._open()

    # -- opening -----------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        parent = self.path.parent
        if not parent.is_dir():
            raise BaselineStoreError(
                f"cannot open baseline store {self.path}: directory {parent} does not exist"
            )
        if self.path.exists() and not self.path.is_file():
            raise BaselineStoreError(f"cannot open baseline store {self.path}: not a regular file")
        if self.readonly:
            conn = self._open_readonly()
            if conn is not None:
                return conn
            # an older schema: migrated by this open, as by any that can write; where it
            # cannot write (a read-only file system, another user's store) it says so, where
            # it said "unable to open database file" (found in a review)
            try:
                return self._open_writable()
            except BaselineStoreError as exc:
                raise BaselineStoreError(
                    f"baseline store {self.path} has an older schema than this sparkdiag's "
                    f"(version {SCHEMA_VERSION}) and cannot be brought up to it here: "
                    f"{exc.message}; open it once where it can be written (the daemon, or "
                    "'sparkdiag probe' as the store's owner)"
                ) from exc
        return self._open_writable()

    def _open_writable(self) -> sqlite3.Connection:
        # sqlite3's timeout is the connection's busy timeout (PRAGMA busy_timeout)
        conn = self._connected("open", lambda: opening.connect(str(self.path), self.busy_timeout_s))
        try:
            self._use_wal(conn)
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
            self._migrate(conn)
        except BaselineStoreError:
            conn.close()
            raise
        except sqlite3.Error as exc:
            conn.close()
            raise BaselineStoreError(
                f"cannot open baseline store {self.path}: {exc}{self._access_hint(exc)}"
            ) from exc
        return conn

    def _open_readonly(self) -> sqlite3.Connection | None:
        """The file opened for reading only; None when its schema is older than this
        sparkdiag's (the caller opens it for writing, which migrates it). Another program's
        database is refused here, before anything could write to it."""
        conn = self._connected(
            "read", lambda: opening.connect_readonly(self.path, self.busy_timeout_s)
        )
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.Error as exc:
            conn.close()
            raise BaselineStoreError(f"cannot read baseline store {self.path}: {exc}") from exc
        if version > SCHEMA_VERSION:
            conn.close()
            self._migrate_refused(version)
        if version < SCHEMA_VERSION:
            try:  # another program's database: refused as it is, never switched to WAL first
                foreign = version == 0 and _has_tables(conn)
            except sqlite3.Error as exc:
                raise BaselineStoreError(f"cannot read baseline store {self.path}: {exc}") from exc
            finally:
                conn.close()
            if foreign:
                raise _not_a_store(self.path)
            return None
        return conn

    def _connected(
        self, verb: str, connect: Callable[[], sqlite3.Connection]
    ) -> sqlite3.Connection:
        try:
            return connect()
        except sqlite3.Error as exc:
            raise BaselineStoreError(
                f"cannot {verb} baseline store {self.path}: {exc}{self._access_hint(exc)}"
            ) from exc

    def verify(self) -> None:
        """Raise :class:`BaselineStoreDamaged` when ``PRAGMA quick_check`` finds a damaged
        page (its cost: :mod:`sparkdiag.baseline.opening`)."""
        with self._read() as conn:
            try:
                problem = opening.damage(conn)
            except sqlite3.DatabaseError as exc:  # "database disk image is malformed"
                problem = str(exc)
        if problem is not None:
            raise BaselineStoreDamaged(
                f"baseline store {self.path} is damaged ({problem}): {opening.DAMAGED_ACTION}"
            )

    def _access_hint(self, exc: sqlite3.Error | None = None) -> str:
        return opening.access_hint(self.path, exc, self.busy_timeout_s)

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        # Switching to WAL takes an exclusive lock and does not always go
        # through the busy handler, so retry it until the busy timeout.
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
                if mode != "wal":
                    mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
                continue
            if mode != "wal":
                raise BaselineStoreError(
                    f"cannot open baseline store {self.path}: journal mode is {mode!r}, "
                    "WAL is required (is the file system read-only or without shared memory?)"
                )
            return

    def _migrate(self, conn: sqlite3.Connection) -> None:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            self._migrate_refused(version)
        with transaction(conn):
            # Another process may have migrated while we waited for the lock.
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version == 0 and _has_tables(conn):
                raise _not_a_store(self.path)
            for step in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[step]:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _migrate_refused(self, version: int) -> NoReturn:
        raise BaselineStoreError(
            f"baseline store {self.path} has schema version {version}, newer than the "
            f"{SCHEMA_VERSION} this sparkdiag understands; upgrade sparkdiag"
        )

    # -- plumbing ----------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise BaselineStoreError(f"baseline store {self.path} is closed")
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction under the object lock (within :meth:`cycle`, a part of its
        transaction); sqlite errors become ours."""
        with self._lock:
            conn = self._connection()
            try:
                if self._batched:
                    yield conn
                    return
                with transaction(conn):
                    yield conn
            except sqlite3.Error as exc:
                raise BaselineStoreError(
                    f"baseline store {self.path}: {exc}{self._access_hint(exc)}"
                ) from exc

    @contextmanager
    def cycle(self) -> Iterator[None]:
        """The writes inside as one transaction: a probe cycle's runs are recorded whole or not
        at all (a full disk, a lock held past ``busy_timeout_s`` or a kill part-way through left
        some kernels of the cycle recorded and the others not, each failing after its own wait).
        Other threads wait on the object lock meanwhile; a nested cycle joins the outer one."""
        with self._lock:
            if self._batched:
                yield
                return
            conn = self._connection()
            try:
                with transaction(conn):
                    self._batched = True
                    try:
                        yield
                    finally:
                        self._batched = False
            except sqlite3.Error as exc:
                raise BaselineStoreError(
                    f"baseline store {self.path}: {exc}{self._access_hint(exc)}"
                ) from exc

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                yield conn
            except sqlite3.Error as exc:
                raise BaselineStoreError(
                    f"baseline store {self.path}: {exc}{self._access_hint(exc)}"
                ) from exc

    # -- public API --------------------------------------------------------

    def record_run(
        self,
        key: BaselineKey,
        tflops: float,
        healthy: bool,
        at: float | None = None,
        conditions: Mapping[str, Any] | None = None,
    ) -> Baseline | None:
        """Store one probe result and update the learned baseline.

        ``tflops`` in TFLOPS; ``healthy`` says whether the run may count
        towards a baseline (unhealthy runs are kept for display only); ``at``
        is unix time (default: now); ``conditions`` is any JSON-serialisable
        mapping (temperatures, clocks, ...). Returns the key's baseline after
        this run, or None while it is still learning.
        """
        _check_key(key)
        value = check_tflops(tflops)
        if not isinstance(healthy, bool):
            raise ValueError(f"healthy must be a bool, got {healthy!r}")
        when = time.time() if at is None else check_time(at, "at")
        conditions_text = conditions_json(conditions)
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO runs ({KEY_LIST}, tflops, healthy, at, conditions) "
                f"VALUES ({placeholders(4)})",
                (*key.as_row(), value, int(healthy), when, conditions_text),
            )
            current = select_baseline(conn, key)
            if current is not None and (
                current.source == "pinned" or current.runs >= self.learn_runs
            ):
                return current  # pinned, or learned and frozen
            if not healthy:
                return current
            values = [
                float(row[0])
                for row in conn.execute(
                    f"SELECT tflops FROM runs WHERE {KEY_WHERE} AND healthy = 1 "
                    "ORDER BY id LIMIT ?",
                    (*key.as_row(), self.learn_runs),
                )
            ]
            if len(values) < self.min_runs:
                return current
            now = time.time()
            learned = Baseline(
                key=key,
                tflops=float(statistics.median(values)),
                source="learned",
                runs=len(values),
                created_at=current.created_at if current is not None else now,
                updated_at=now,
                note=current.note if current is not None else "",
            )
            upsert_baseline(conn, learned)
            return learned

    def learning(self, baseline: Baseline | None) -> bool:
        """Whether runs still teach this baseline: none yet, or learned from fewer than
        ``learn_runs`` healthy runs (a pinned or frozen baseline is not learning)."""
        return baseline is None or (
            baseline.source == "learned" and baseline.runs < self.learn_runs
        )

    def learning_kernels(self, recent: int = 5000) -> builtins.list[Learning]:
        """The kernels still learning: those among :meth:`latest_runs` that have no baseline
        yet, by key, each with its healthy runs so far and its first and latest run (what
        ``baseline show`` says of them; a read, as the others)."""
        learned = {b.key for b in self.list()}
        keys = [run.key for run in self.latest_runs(recent) if run.key not in learned]
        found = []
        with self._read() as conn:
            for key in keys:  # the runs_by_key index: a kernel's runs, not the table's
                healthy, first, last = conn.execute(
                    f"SELECT TOTAL(healthy), MIN(at), MAX(at) FROM runs WHERE {KEY_WHERE}",
                    key.as_row(),
                ).fetchone()
                if first is not None:  # its runs were pruned or reset since latest_runs
                    found.append(Learning(key, int(healthy), float(first), float(last)))
        return found

    def latest_runs(self, recent: int = 5000) -> builtins.list[RunRecord]:
        """The most recent run of every key among the last ``recent`` runs (a daemon probing
        eight GPUs records about 180 a cycle), by key: bounded however long the store grows."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT id, {KEY_LIST}, tflops, healthy, at, conditions FROM runs "
                "ORDER BY id DESC LIMIT ?",
                (recent,),
            ).fetchall()
        width = len(KEY_COLUMNS)
        latest: dict[BaselineKey, RunRecord] = {}
        for row in rows:
            key = BaselineKey(*(str(v) for v in row[1 : 1 + width]))
            if key not in latest:
                latest[key] = RunRecord(
                    id=int(row[0]),
                    key=key,
                    tflops=float(row[1 + width]),
                    healthy=bool(row[2 + width]),
                    at=float(row[3 + width]),
                    conditions=conditions_from_json(row[4 + width]),
                )
        return sorted(latest.values(), key=lambda r: r.key.as_row())

    def pin(self, key: BaselineKey, tflops: float, note: str = "") -> Baseline:
        """Set the key's baseline to ``tflops`` (TFLOPS); later runs never move it."""
        _check_key(key)
        value = check_tflops(tflops)
        if not isinstance(note, str):
            raise ValueError(f"note must be a string, got {note!r}")
        with self._write() as conn:
            current = select_baseline(conn, key)
            now = time.time()
            pinned = Baseline(
                key=key,
                tflops=value,
                source="pinned",
                runs=0,
                created_at=current.created_at if current is not None else now,
                updated_at=now,
                note=note,
            )
            upsert_baseline(conn, pinned)
            return pinned

    def get(self, key: BaselineKey) -> Baseline | None:
        """The key's baseline, or None when there is none (yet)."""
        _check_key(key)
        with self._read() as conn:
            return select_baseline(conn, key)

    def list(self, gpu_uuid: str | None = None) -> builtins.list[Baseline]:
        """Every baseline (of one GPU when ``gpu_uuid`` is given), old software included.

        Ordered by GPU, dtype, shape, context, then creation time.
        """
        where, params = filters(gpu_uuid=gpu_uuid)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {BASELINE_COLUMNS} FROM baselines{where} "
                "ORDER BY gpu_uuid, dtype, shape, context, created_at, driver, torch, cuda",
                params,
            ).fetchall()
        return [baseline_from_row(row) for row in rows]

    def reset(
        self,
        gpu_uuid: str | None = None,
        dtype: str | None = None,
        shape: str | None = None,
    ) -> int:
        """Delete matching baselines and their runs so learning starts again.

        No filter resets everything. Returns the number of baselines removed
        (runs of keys that were still learning are removed too).
        """
        where, params = filters(gpu_uuid=gpu_uuid, dtype=dtype, shape=shape)
        with self._write() as conn:
            removed = conn.execute(f"DELETE FROM baselines{where}", params).rowcount
            conn.execute(f"DELETE FROM runs{where}", params)
            return int(removed)

    def runs(self, key: BaselineKey, limit: int = 20) -> builtins.list[RunRecord]:
        """The key's most recent runs, newest first, at most ``limit``."""
        _check_key(key)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT id, tflops, healthy, at, conditions FROM runs WHERE {KEY_WHERE} "
                "ORDER BY id DESC LIMIT ?",
                (*key.as_row(), limit),
            ).fetchall()
        return [
            RunRecord(
                id=int(row[0]),
                key=key,
                tflops=float(row[1]),
                healthy=bool(row[2]),
                at=float(row[3]),
                conditions=conditions_from_json(row[4]),
            )
            for row in rows
        ]

    # -- storage baselines (baseline/storage_store.py) --------------------------

    def record_storage(
        self, key: StorageKey, bytes_per_second: float, healthy: bool, at: float | None = None
    ) -> StorageBaseline | None:
        """Keep one storage figure (bytes/s) and learn from it: the GEMM rules (median of the
        first healthy runs, frozen after ``learn_runs``) in the storage tables."""
        with self._write() as conn:
            return storage_store.record(
                conn, key, bytes_per_second, healthy, self.learn_runs, self.min_runs, at
            )

    def storage_baseline(self, key: StorageKey) -> StorageBaseline | None:
        """The key's storage baseline, or None while it is learned."""
        with self._read() as conn:
            return storage_store.select(conn, key)

    def storage_baselines(self) -> builtins.list[StorageBaseline]:
        with self._read() as conn:
            return storage_store.select_all(conn)

    def pin_storage(
        self, key: StorageKey, bytes_per_second: float, note: str = ""
    ) -> StorageBaseline:
        with self._write() as conn:
            return storage_store.pin(conn, key, bytes_per_second, note)

    def reset_storage(self, mountpoint: str | None = None) -> int:
        with self._write() as conn:
            return storage_store.reset(conn, mountpoint)

    def prune(self, keep: int, max_age_s: float, now: float | None = None) -> int:
        """Delete the runs no baseline needs beyond the newest ``keep`` of each key that are at
        most ``max_age_s`` seconds old; returns how many were deleted. Always kept: the newest
        run of every key and the first ``learn_runs`` healthy runs of every key (a learned
        baseline is their median). Baselines themselves are never deleted here."""
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be a positive integer, got {keep!r}")
        if not is_real(max_age_s) or not max_age_s > 0:
            raise ValueError(f"max_age_s must be a number > 0, got {max_age_s!r}")
        cutoff = (time.time() if now is None else check_time(now, "now")) - float(max_age_s)
        limits = {"learn": self.learn_runs, "keep": keep, "cutoff": cutoff}
        deleted = 0
        width = len(KEY_COLUMNS)
        bound = keep + self.learn_runs  # at most this many runs per key once pruned
        with self._read() as conn:  # no write transaction (and its fsync) when nothing is due
            over = [row[:width] for row in conn.execute(RUN_COUNTS) if row[width] > bound]
            old = conn.execute(OLD_KEYS, limits).fetchall()
        if not over and not old:
            return 0
        with self._write() as conn:
            for statement, keys in ((PRUNE_BEYOND, over), (PRUNE_OLDER, old)):
                for key in keys:
                    named = {f"k{i}": value for i, value in enumerate(key)}
                    deleted += conn.execute(statement, {**limits, **named}).rowcount
        return deleted

    def space(self) -> tuple[int, int]:
        """(bytes of the database file, bytes of it on SQLite's free list)."""
        with self._read() as conn:
            size = int(conn.execute("PRAGMA page_size").fetchone()[0])
            pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
            free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        return pages * size, free * size

    def checkpoint(self, compact: bool = False) -> None:
        """Copy the WAL into the database and truncate it to zero bytes; with ``compact``
        first rebuild the file without its free pages (``VACUUM``: takes the write lock for as
        long as copying the live rows takes)."""
        with self._read() as conn:
            if compact:
                conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: "ok", or the problems found, one per line."""
        with self._read() as conn:
            rows = conn.execute("PRAGMA integrity_check").fetchall()
        return "\n".join(str(row[0]) for row in rows)

    def close(self) -> None:
        """Close the connection; safe to call twice."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> BaselineStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._conn is None else "open"
        return f"BaselineStore({str(self.path)!r}, {state})"


# -- helpers -----------------------------------------------------------------


def _not_a_store(path: Path) -> BaselineStoreError:
    return BaselineStoreError(f"{path} is an SQLite database but not a sparkdiag baseline store")


def _has_tables(conn: sqlite3.Connection) -> bool:
    """Whether the database holds anything of its own (a sparkdiag store of version 0 holds
    nothing: it was never made)."""
    row = conn.execute("SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
    return bool(row.fetchone()[0])


def _check_key(key: object) -> None:
    if not isinstance(key, BaselineKey):
        raise ValueError(f"key must be a BaselineKey, got {type(key).__name__}")
