"""The baseline store's health: visible, logged once per change, and recovered from by itself.

A full disk, a read-only or corrupt file, or a state directory that disappeared must not stay
invisible while the probe keeps counting successful cycles. The daemon keeps its store in a
:class:`StoreKeeper`: an open or a write that fails is counted (by operation), logged once when the
store goes from usable to unusable (and once when it comes back), and retried at the next probe
cycle, so the daemon recovers when space returns. ``sparkdiag_baseline_store_up`` and
``sparkdiag_baseline_store_errors_total`` export it; ``check`` reports the same through
:func:`inspect_store`.

It also keeps the store's size bounded (:meth:`StoreKeeper.maintain`, after probe cycles): runs
beyond the :class:`Retention` are deleted (``BaselineStore.prune`` says which are always kept),
the WAL is checkpointed and truncated, and a file that is mostly free pages is compacted once.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from sparkdiag.baseline.learning import Held
from sparkdiag.baseline.model import BaselineKey, BaselineStoreDamaged, BaselineStoreError
from sparkdiag.baseline.store import BaselineStore, open_store
from sparkdiag.config import DEFAULTS

log = logging.getLogger(__name__)

OPERATIONS = ("open", "write")
DAY = 86400.0
# Retention runs at most this often (seconds): a prune reads every run's key, about 0.1 s for a
# full 8-GPU store on the 2-core development machine (docs/daemon-cost.md).
MAINTAIN_EVERY = 600.0
# A file whose free pages are more than this share of it, and at least COMPACT_MIN_BYTES, is
# compacted (VACUUM) after a prune: a store that grew without bound before retention existed.
COMPACT_FREE_SHARE = 0.5
COMPACT_MIN_BYTES = 8 << 20


@dataclass(frozen=True)
class Retention:
    """How much run history the store keeps (``baseline.history-runs``, ``-days``): the newest
    ``runs`` runs of each key, none older than ``days``, beside what is always kept."""

    runs: int = DEFAULTS["baseline_history_runs"]
    days: float = DEFAULTS["baseline_history_days"]


@dataclass(frozen=True)
class StoreHealth:
    """up: the last open and write succeeded; errors: failures by operation since start;
    reason: why the store is unusable now (None while it is up)."""

    up: bool
    errors: Mapping[str, int] = field(default_factory=dict)
    reason: str | None = None


class StoreKeeper:
    """The daemon's baseline store (shared by its probe schedulers), and its health."""

    def __init__(
        self,
        opener: Callable[[], BaselineStore],
        retention: Retention | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._opener = opener
        self.retention = retention or Retention()
        self._clock = clock
        self._maintained: float | None = None  # clock() at the last maintain that ran
        self._lock = threading.Lock()
        self._store: BaselineStore | None = None
        self._opened: tuple[int, int] | None = None  # the open file's device and inode
        self._errors = dict.fromkeys(OPERATIONS, 0)
        self._reason: str | None = None
        self._up = True
        self.store()  # open at start, so that a bad store is visible before the first cycle

    def store(self) -> BaselineStore | None:
        """The open store, opening it (again) when needed; None while it cannot be opened. The
        open store is let go of when its file is no longer the one opened (moved aside, as the
        advice for a damaged store says, or removed with its state directory): the daemon wrote
        into the old file for ever, its baselines lost at the next start while ``check`` read
        none (found in a review). The next open makes a new store, or says why it cannot."""
        with self._lock:
            if self._store is not None:
                if _same_file(self._store.path, self._opened):
                    return self._store
                log.warning(
                    "baseline store %s was moved or removed while open: opening it again",
                    self._store.path,
                )
                self._store.close()
                self._store = None
        try:
            store = self._opener()
            problems = store.integrity_check()
            if problems != "ok":
                store.close()
                raise BaselineStoreError(f"baseline store {store.path} is damaged: {problems}")
            opened = _identity(store.path)
        except BaselineStoreError as exc:
            self.failed("open", exc)
            return None
        with self._lock:
            self._store, self._opened = store, opened
        self.succeeded()
        return store

    def succeeded(self) -> None:
        with self._lock:
            came_back = not self._up
            self._up, self._reason = True, None
        if came_back:
            log.warning("baseline store usable again: baselines are learned and compared")

    def failed(self, operation: str, exc: Exception) -> None:
        """Count the failure; log it when the store was usable until now."""
        with self._lock:
            self._errors[operation] = self._errors.get(operation, 0) + 1
            went_down = self._up
            self._up, self._reason = False, f"{operation}: {exc}"
            # a write that found the file damaged: let go of it, so that the next cycle opens it
            # again through the integrity check and writes no more into it (it went on writing)
            if (operation == "open" or _damage(exc)) and self._store is not None:
                self._store.close()
                self._store = None
        if went_down:
            log.warning(
                "baseline store unusable (%s): probes go on without learning or comparing "
                "baselines; sparkdiag retries at every cycle",
                self._reason,
            )

    def maintain(self, force: bool = False) -> int | None:
        """Apply the retention, checkpoint the WAL, and compact a mostly free file; at most
        once per ``MAINTAIN_EVERY`` seconds unless ``force``. Returns the runs deleted, None
        when it did not run (too soon, or no usable store); a failure counts as a write
        error."""
        now = self._clock()
        last = self._maintained
        if not force and last is not None and now - last < MAINTAIN_EVERY:
            return None
        store = self.store()
        if store is None:
            return None
        self._maintained = now
        try:
            deleted = store.prune(self.retention.runs, self.retention.days * DAY)
            size, free = store.space()
            compact = free >= COMPACT_MIN_BYTES and free > COMPACT_FREE_SHARE * size
            store.checkpoint(compact=compact)
        except BaselineStoreError as exc:
            self.failed("write", exc)
            return None
        if compact:
            log.info(
                "baseline store %s: compacted (%.1f of %.1f MB were free after deleting %d "
                "run(s) beyond the history kept)",
                store.path,
                free / 1e6,
                size / 1e6,
                deleted,
            )
        return deleted

    def health(self) -> StoreHealth:
        with self._lock:
            return StoreHealth(self._up, MappingProxyType(dict(self._errors)), self._reason)

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


@dataclass(frozen=True)
class HeldRun:
    """A kernel whose last run was held out of the baseline it was learning."""

    key: BaselineKey
    held: Held
    at: float


@dataclass(frozen=True)
class StoreReport:
    """What ``check`` found of the store: ``state`` is ok, absent or unusable."""

    state: str
    path: Path | None
    detail: str
    baselines: int = 0
    # the kernels whose learning baseline the daemon's last run held out (baseline/learning.py)
    held: tuple[HeldRun, ...] = ()


def held_runs(store: BaselineStore) -> tuple[HeldRun, ...]:
    """The keys whose latest run was held and whose baseline is still learning (not pinned
    since, nor frozen)."""
    found = []
    for run in store.latest_runs():
        held = Held.from_dict((run.conditions or {}).get("held"))
        if held is not None and store.learning(store.get(run.key)):
            found.append(HeldRun(run.key, held, run.at))
    return tuple(found)


def inspect_store(state_dir: Path | None) -> StoreReport:
    """Open the store for reading (never creating it), check its integrity, count baselines."""
    try:
        store = open_store(state_dir, create=False, verify=False)  # integrity_check below
    except BaselineStoreError as exc:
        absent = str(exc).startswith("no baselines yet")
        return StoreReport("absent" if absent else "unusable", None, str(exc))
    try:
        problems = store.integrity_check()
        if problems != "ok":
            return StoreReport("unusable", store.path, f"damaged: {problems.splitlines()[0]}")
        count = len(store.list())
        return StoreReport("ok", store.path, f"{count} baseline(s)", count, held_runs(store))
    except BaselineStoreError as exc:
        return StoreReport("unusable", store.path, str(exc))
    finally:
        store.close()


def _identity(path: Path) -> tuple[int, int] | None:
    """The device and inode of the file at ``path``; None where there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _same_file(path: Path, opened: tuple[int, int] | None) -> bool:
    """Whether ``path`` still names the file opened (a stat a probe cycle)."""
    return opened is not None and _identity(path) == opened


def _damage(exc: Exception) -> bool:
    """Whether ``exc`` says the file is damaged (SQLite's CORRUPT or NOTADB), not full or
    locked: a full disk keeps the store open, to be written again when space returns."""
    if isinstance(exc, BaselineStoreDamaged):
        return True
    cause = exc.__cause__
    name = getattr(cause, "sqlite_errorname", "")
    return isinstance(cause, sqlite3.DatabaseError) and name in ("SQLITE_CORRUPT", "SQLITE_NOTADB")
