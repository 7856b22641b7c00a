"""How the baseline store's file is opened: for writing (WAL), for reading only, and checked.

Reading only (``check``, ``baseline show``, ``probe --no-record``, ``storage --no-record``): the
file is opened with SQLite's ``mode=ro`` URI, so that a reader never writes into the store (no
journal switch) and needs no write permission on it. The one exception is a store of an older
schema, which the first open that can write migrates, a reader's too; where the reader cannot
write, it says that the store needs one open with write access. A WAL database is read
through its shared-memory file (``baselines.sqlite-shm``): while a writer (the daemon) has the
store open it exists and a reader opens it read-only; when none has, the reader must create it,
which it cannot in a directory it may not write or on a read-only file system.

Then, and only on a file system that is itself read-only, the file is opened ``immutable=1``:
SQLite reads it with no locks and no shared memory, trusting that nobody changes it while it
reads. That holds where nobody can write the file: the file system's superblock is read-only
(``ro`` in the super options of ``/proc/self/mountinfo``, as for a read-only block device, an
ISO image or a filesystem mounted ``ro``) and no write-ahead log holds committed pages that an
immutable reader would skip (a non-empty ``-wal``: the store was not closed cleanly before the
file system became read-only; SQLite reads it with ``mode=ro`` when the ``-shm`` is there). A
read-only *mount* of a file system that is writable elsewhere (a container's ``:ro`` volume of
the host's state directory, ``mount --bind -o ro``) is not enough: the daemon may write the file
through its own mount while we read, and an immutable reader would then read pages half-written.
There, and in a directory the user cannot write, the reader says why it cannot read the store.

A damaged page (a disk error, a copy taken mid-write, a bad sector) is found by ``PRAGMA
quick_check`` at open (:func:`damage`): 37 ms with the file in the page cache, 0.5-0.6 s from a
cold cache, on a store of 46,880 runs (44 MB: eight GPUs at the default retention) on the 2-core
development machine. Every command that opens the store runs it; the daemon runs the fuller
``integrity_check`` (85 ms warm) once when it opens the store.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from sparkdiag.sources.host.mounts import directory_device, find_mount, read_mounts

# What to do about a damaged store, said wherever one is found.
DAMAGED_ACTION = (
    "move it aside (sparkdiag learns new baselines from the next runs) or restore a copy"
)


def connect(target: str, timeout: float, uri: bool = False) -> sqlite3.Connection:
    return sqlite3.connect(
        target,
        timeout=timeout,
        uri=uri,
        isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE ... COMMIT
        check_same_thread=False,  # guarded by the store's lock instead
    )


def connect_readonly(path: Path, timeout: float) -> sqlite3.Connection:
    """``path`` opened for reading only: ``mode=ro``, else ``immutable=1`` where that is safe
    (the module docstring); raises ``sqlite3.Error`` when neither can read it."""
    uri = path.absolute().as_uri()
    conn = connect(f"{uri}?mode=ro", timeout, uri=True)
    try:
        conn.execute("PRAGMA user_version").fetchone()  # the first read opens the -shm
        return conn
    except sqlite3.Error as exc:
        conn.close()
        if not nobody_writes(path):
            why = _why_not_read(path, exc)
            if not why:
                raise  # as SQLite said it, with its code (access_hint reads it)
            raise sqlite3.OperationalError(f"{exc}{why}") from exc
    conn = connect(f"{uri}?mode=ro&immutable=1", timeout, uri=True)
    try:
        conn.execute("PRAGMA user_version").fetchone()
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def nobody_writes(path: Path) -> bool:
    """Whether nobody can change ``path`` while it is read: it lies on a file system whose
    superblock is read-only, and no non-empty ``-wal`` beside it holds committed pages."""
    wal = path.with_name(path.name + "-wal")
    try:
        if wal.exists() and wal.stat().st_size > 0:
            return False
        if not os.statvfs(path).f_flag & os.ST_RDONLY:
            return False
    except OSError:
        return False
    resolved = str(path.resolve())
    mount = find_mount(read_mounts(Path("/")), resolved, directory_device(resolved))
    return mount is not None and mount.filesystem_read_only


# SQLite's primary result codes (sqlite3.h) for a file that could not be opened or written:
# READONLY (8, with READONLY_DIRECTORY, READONLY_CANTINIT ...: the -shm could not be made) and
# CANTOPEN (14); and for a file that is not a database, or a damaged one: NOTADB, CORRUPT.
_OPEN_FAILED = (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN)
_NOT_A_STORE = (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT)


def _code(exc: sqlite3.Error | None) -> int | None:
    """The primary result code of ``exc`` (extended codes carry it in their low byte)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _why_not_read(path: Path, exc: sqlite3.Error) -> str:
    """Why a read-only reader cannot open the store without its ``-shm``: said only where
    that is so, for a failure to open (READONLY, CANTOPEN), with the ``-shm`` absent and the
    directory really not writable (a read-only mount, or no permission); "" otherwise, and
    the caller raises SQLite's own error (a file that is not a database says so)."""
    shm = path.name + "-shm"
    if _code(exc) not in _OPEN_FAILED or path.with_name(shm).exists():
        return ""
    if os.access(path.parent, os.W_OK | os.X_OK):
        return ""
    try:
        mount_ro = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        mount_ro = False
    if mount_ro:
        place = (
            f"{path.parent} is a read-only mount of a file system that is writable elsewhere "
            "(a read-only bind mount or volume), where another sparkdiag may write the store"
        )
        who = ""
    else:
        place = f"directory {path.parent} is not writable for uid {os.getuid()}"
        who = ", as a user who may write the directory"
    return (
        f" ({place}, and {shm} is absent: it exists while the daemon has the store open; read "
        f"it while the daemon runs{who}, or from a copy (--state-dir))"
    )


def damage(conn: sqlite3.Connection) -> str | None:
    """The first problem ``PRAGMA quick_check`` finds (every page and its structure, not the
    indexes against their tables), None when there is none."""
    found: list[str] = []
    cursor = conn.execute("PRAGMA quick_check")
    try:
        for row in cursor:
            found.extend(str(row[0]).splitlines())
    except sqlite3.DatabaseError as exc:  # "database disk image is malformed" part-way
        found.append(str(exc))
    if found == ["ok"]:
        return None
    lines = [line for line in found if line and not line.startswith("***")]
    return lines[0] if lines else "quick_check failed"


def access_hint(path: Path, exc: sqlite3.Error | None, busy_timeout_s: float) -> str:
    """SQLite says "unable to open database file", "disk I/O error" or "database is
    locked"; say which: a read-only or full file system, a missing permission, another
    process's write lock."""
    text = str(exc).lower()
    if _code(exc) in _NOT_A_STORE:
        return f" (the file is damaged or is not a baseline store: {DAMAGED_ACTION})"
    if "locked" in text or "busy" in text:
        return (
            f" (another process has held its write lock for over {busy_timeout_s:g} s: "
            f"'fuser {path}' names it)"
        )
    if "absent: it exists while" in text:  # _why_not_read said it
        return ""
    if exc is not None and not any(
        word in text for word in ("unable to open", "i/o", "full", "readonly")
    ):
        return ""  # the file itself (not a database, damaged): the message says so
    parent = path.parent
    try:
        fs = os.statvfs(parent)
    except OSError:
        fs = None
    if fs is not None and fs.f_flag & os.ST_RDONLY:
        return f" (directory {parent} is on a read-only file system)"
    if fs is not None and fs.f_bavail * fs.f_frsize < 1 << 20:
        free = fs.f_bavail * fs.f_frsize
        return f" (the file system of {parent} is full: {free} bytes free)"
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        return f" (no read/write permission on the file for uid {os.getuid()})"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f" (directory {parent} is not writable for uid {os.getuid()})"
    return ""
