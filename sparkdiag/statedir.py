"""Where sparkdiag keeps its state (the baseline database, for one).

Resolution order, first match wins:

1. ``$STATE_DIRECTORY``: set by systemd for a unit with ``StateDirectory=``
   (``/var/lib/sparkdiag``). systemd passes one absolute path per
   ``StateDirectory=`` entry, joined by ``:``; the first one is used.
2. ``$XDG_STATE_HOME/sparkdiag`` when ``XDG_STATE_HOME`` is an absolute path
   (the XDG Base Directory specification says relative values are invalid and
   must be ignored).
3. ``$HOME/.local/state/sparkdiag``, the specification's default.

``state_directory`` only computes the path; ``ensure_state_directory``
creates it (mode 0700) and turns every failure into a :class:`StateDirError`
that names the path and the operating system's reason.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pwd
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from sparkdiag import safeload
from sparkdiag.errors import SparkdiagError

APP_NAME = "sparkdiag"
DIRECTORY_MODE = 0o700


class StateDirError(SparkdiagError):
    """The state directory cannot be found, created or used (exit 3; the message names the
    path)."""


def state_directory(environ: Mapping[str, str] | None = None) -> Path:
    """The state directory sparkdiag should use; it is not created here.

    ``environ`` defaults to ``os.environ``; tests pass their own mapping.
    Same reading as ``systemctl show -p StateDirectory sparkdiag`` under
    systemd, or ``echo ${XDG_STATE_HOME:-$HOME/.local/state}/sparkdiag``.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ

    systemd = env.get("STATE_DIRECTORY", "")
    first = systemd.split(":", 1)[0].strip()
    if first:
        return Path(first)

    xdg = env.get("XDG_STATE_HOME", "").strip()
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / APP_NAME

    return _home(env) / ".local" / "state" / APP_NAME


# where the systemd unit's daemon keeps its state (StateDirectory=sparkdiag): a link to
# /var/lib/private/sparkdiag under DynamicUser=, whose directory only root may enter
SERVICE_STATE = Path("/var/lib") / APP_NAME


def service_state(rootfs: Path, used: Path | None) -> Path | None:
    """The systemd service's state directory seen under ``rootfs``, where it is there and is
    not ``used`` (the one this command reads; None: :func:`state_directory`'s): a command run
    as you reads ``~/.local/state/sparkdiag``, not the daemon's baselines or the soak it would
    export. Looked at without entering it (the link itself), so that a user who may not read
    it still learns it is there."""
    found = rootfs / SERVICE_STATE.relative_to("/")
    try:
        if not os.path.lexists(found):
            return None
        if found.resolve() == (used or state_directory()).resolve():
            return None
    except (OSError, StateDirError):
        return None
    return found


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME", "").strip()
    if home:
        return Path(home)
    # No HOME (a bare service environment): fall back to the password database.
    try:
        entry = pwd.getpwuid(os.getuid())
    except KeyError as exc:
        raise StateDirError(
            "cannot find a state directory: STATE_DIRECTORY, XDG_STATE_HOME and HOME are "
            f"unset and uid {os.getuid()} has no password entry"
        ) from exc
    if not entry.pw_dir:
        raise StateDirError(
            "cannot find a state directory: STATE_DIRECTORY, XDG_STATE_HOME and HOME are unset"
        )
    return Path(entry.pw_dir)


def ensure_state_directory(path: Path) -> Path:
    """Create ``path`` (and missing parents) with mode 0700 if it does not exist.

    An existing directory is left as it is (systemd sets its mode from
    ``StateDirectoryMode=``); it must be writable. Returns ``path``.
    Raises :class:`StateDirError` naming the path and the OS reason.
    """
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _error(path, "cannot inspect", exc) from exc

    if st is None:
        _refuse_dangling(path)  # mkdir would say "File exists"
        try:
            path.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
            # mkdir's mode is filtered by the umask; make it exact.
            os.chmod(path, DIRECTORY_MODE)
        except OSError as exc:
            raise _error(path, "cannot create", exc) from exc
        return path

    if not stat.S_ISDIR(st.st_mode):
        raise _not_a_directory(path)
    if not os.access(path, os.W_OK | os.X_OK):
        raise StateDirError(f"state directory {path} is not writable by uid {os.getuid()}")
    return path


def state_file(state_dir: Path | None, name: str) -> Path:
    """``name`` in the state directory (``state_dir``, else :func:`state_directory`), which
    need not exist yet. StateDirError, saying what to do, where something other than a
    directory stands in its place (a file, a link to nothing): every reader of the state then
    says that, not that nothing was recorded yet or that a file cannot be read."""
    directory = state_dir or state_directory()
    try:
        st = directory.stat()
    except FileNotFoundError:  # not made yet
        _refuse_dangling(directory)
        return directory / name
    except NotADirectoryError:  # a folder above it is a file: it can never be made
        above = next((p for p in directory.parents if p.exists()), None)
        raise StateDirError(
            f"state directory {directory} cannot be made: {above} is a file, not a directory: "
            "give --state-dir a directory (a missing one is created, mode 0700)"
        ) from None
    except OSError as exc:
        raise _error(directory, "cannot inspect", exc) from exc
    if not stat.S_ISDIR(st.st_mode):
        raise _not_a_directory(directory)
    return directory / name


def _refuse_dangling(path: Path) -> None:
    if path.is_symlink():
        raise StateDirError(
            f"state directory {path} is a symbolic link to {os.readlink(path)}, which does "
            "not exist: create its target or remove the link"
        )


def _not_a_directory(path: Path) -> StateDirError:
    return StateDirError(
        f"state directory {path} is a file, not a directory: give --state-dir a directory "
        "(a missing one is created, mode 0700) or move the file aside"
    )


def _error(path: Path, what: str, exc: OSError) -> StateDirError:
    reason = exc.strerror or str(exc)
    return StateDirError(f"{what} state directory {path}: {reason}")


def write_atomically(path: Path, data: bytes, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old file or the new one, never
    half of one: a temporary file in the same directory, fsync, rename, fsync of the directory.
    The directory is created (0700) when missing. The file is 0600 (mkstemp's), or ``mode``.
    StateDirError for a missing directory that cannot be made; OSError when the file cannot be
    written (the temporary file is removed)."""
    ensure_state_directory(path.parent)
    tmp: str | None = None
    try:
        import tempfile  # loads random and shutil: imported when a file is written

        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        tmp = None
        with contextlib.suppress(OSError):  # the rename itself, on filesystems that need it
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


LOCK_WAIT_S = 10.0
LOCK_NAME = ".lock"  # the state directory's lock file (updating)
R = TypeVar("R")


@contextlib.contextmanager
def updating(path: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the state directory's lock (``flock`` on :data:`LOCK_NAME` in it) for a read,
    change and write of ``path``, so that two processes updating the same state file (two
    ``soak --gpu`` runs, the daemon's storage probe and ``sparkdiag storage``) each keep the
    other's entries: without it the later write dropped what the earlier one added. A file
    opened for writing, not the directory: NFS and CIFS emulate flock with byte-range locks,
    which need one. Where the filesystem has no locks at all (ENOLCK, EOPNOTSUPP) the update
    goes on unlocked, as before there was a lock. The directory is created (0700) when
    missing. StateDirError when the lock is not had within ``wait_s`` seconds."""
    directory = ensure_state_directory(path.parent)
    lock = directory / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise _error(directory, f"cannot open {LOCK_NAME} in", exc) from exc
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StateDirError(
                        f"state directory {directory} stayed locked by another sparkdiag "
                        f"for over {wait_s:g} s; {path.name} not updated: try again"
                    ) from None
                time.sleep(0.02)
            except OSError as exc:
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    raise _error(directory, "cannot lock", exc) from exc
                break  # no locks on this filesystem: unlocked, as before
        yield
    finally:
        os.close(fd)  # releases the lock


def update_json_state(
    path: Path,
    change: Callable[[], tuple[Mapping[str, Any], R]],
    error: Callable[[str], Exception],
) -> R:
    """Read, change and write one JSON state file under its directory's lock (:func:`updating`),
    so that what another process wrote meanwhile is kept: ``change`` reads the file as it is
    now and returns the document to write and what to return; the document is written
    atomically. A failure (the lock, the directory, the write) raises ``error(message)``."""
    try:
        with updating(path):
            doc, out = change()
            write_atomically(path, (json.dumps(doc, indent=1, allow_nan=False) + "\n").encode())
    except StateDirError as exc:
        raise error(str(exc)) from None
    except OSError as exc:
        raise error(f"cannot write {path}: {exc.strerror or exc}") from None
    return out


def read_json_state(
    path: Path, limit: int, what: str, schema: str, error: Callable[[str], Exception]
) -> Mapping[str, Any] | None:
    """A state file's decoded JSON object (at most ``limit`` bytes) whose ``schema`` is
    ``schema``, or None when there is no file; ``error(reason)`` is raised when it cannot be used
    (unreadable, too large, not JSON, another schema). ``what`` names the file's kind in the
    reason (``a soak state file``)."""
    try:  # a FIFO in its place (a plain open waited for a writer for ever) is refused
        raw = safeload.read_file(path, limit)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from None
    except safeload.LoadError as exc:
        raise error(f"{path}: {exc}; not {what}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise error(f"{path} is damaged: not JSON ({exc})") from None
    if not isinstance(doc, Mapping) or doc.get("schema") != schema:
        raise error(f"{path} is not {what} (schema {schema})")
    return doc
