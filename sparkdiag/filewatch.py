"""Files a long-running server follows as an operator replaces them: looked at (``stat``, no
read) at most once per interval, and said to have changed when a file's inode, size, mtime or
ctime differs from the last look, or it appeared or went. ``serve`` follows its web config and
the files it names with it (:class:`sparkdiag.web.webconfig.LiveWebConfig`), ``link serve`` its
link secret (:class:`sparkdiag.link.auth.LiveSecret`); each reads the files itself when told
they changed.

Each file is stamped before the caller reads it: a file that changes while it is read (a
renewal writing the key, then the certificate; a config rewritten to name another file) is seen
at the next look. ``stat`` follows
symbolic links, so a link pointed elsewhere is a change, and one left dangling reads as a file
that is not there. ``chmod`` changes the ctime: a mode put right is a change too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

Stamp = tuple[int, int, int, int] | None  # a file's inode, size, mtime and ctime (ns); None: absent
Signature = tuple[Stamp, ...]


def stamp(path: Path) -> Stamp:
    """``path``'s inode, size, mtime and ctime (ns); None where ``stat`` cannot see it."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def signature(files: Iterable[Path]) -> Signature:
    """Each file's :func:`stamp`."""
    return tuple(stamp(path) for path in files)


class FileWatch:
    """Whether ``files`` changed since the last look, looked at no more than once per ``every``
    seconds of ``clock`` (the first look comes ``every`` seconds after it is made). ``stamps``:
    the files' stamps from before the caller read them, where it has them (else taken now)."""

    def __init__(
        self,
        files: Iterable[Path],
        every: float,
        clock: Callable[[], float] = time.monotonic,
        stamps: Mapping[Path, Stamp] | None = None,
    ) -> None:
        self.every = every
        self._clock = clock
        self._checked = clock()
        self.files: tuple[Path, ...] = ()
        self._signature: Signature = ()
        self.watch(files, stamps or {})

    def changed(self) -> bool:
        """True once per change: when this look is due and a file differs from the last look.
        The caller then reads the files; what it reads is the state this look saw, or newer."""
        now = self._clock()
        if now - self._checked < self.every:
            return False
        self._checked = now
        seen = signature(self.files)
        if seen == self._signature:
            return False
        self._signature = seen
        return True

    def stamps(self) -> dict[Path, Stamp]:
        """Each file followed, with its stamp at the last look (before the caller's read)."""
        return dict(zip(self.files, self._signature, strict=True))

    def watch(self, files: Iterable[Path], stamps: Mapping[Path, Stamp]) -> None:
        """Follow ``files`` from now on (a config that names other files after a change), each
        against its stamp in ``stamps``, taken before the caller read it, so that a file that
        changed during the read is seen at the next look; one without a stamp is stamped now."""
        self.files = tuple(dict.fromkeys(files))
        self._signature = tuple(stamps[p] if p in stamps else stamp(p) for p in self.files)
