"""Files a long-running server follows as an operator replaces them: looked at (``stat``, no
read) at most once per interval, and said to have changed when a file's inode, size, mtime or
ctime differs from the last look, or it appeared or went. ``serve`` follows its web config and
the files it names with it (:class:`sparkdiag.web.webconfig.LiveWebConfig`), ``link serve`` its
link secret (:class:`sparkdiag.link.auth.LiveSecret`); each reads the files itself when told
they changed.

The signature is taken before the caller reads the files: a file that changes while it is read
(a renewal writing the key, then the certificate) is seen at the next look. ``stat`` follows
symbolic links, so a link pointed elsewhere is a change, and one left dangling reads as a file
that is not there. ``chmod`` changes the ctime: a mode put right is a change too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

Signature = tuple[tuple[int, int, int, int] | None, ...]  # per file: inode, size, mtime, ctime


def signature(files: Iterable[Path]) -> Signature:
    """Each file's inode, size, mtime and ctime (ns); None for one that ``stat`` cannot see."""
    out: list[tuple[int, int, int, int] | None] = []
    for path in files:
        try:
            st = path.stat()
        except OSError:
            out.append(None)
            continue
        out.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


class FileWatch:
    """Whether ``files`` changed since the last look, looked at no more than once per ``every``
    seconds of ``clock`` (the first look comes ``every`` seconds after it is made)."""

    def __init__(
        self,
        files: Iterable[Path],
        every: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.files: tuple[Path, ...] = tuple(dict.fromkeys(files))
        self.every = every
        self._clock = clock
        self._checked = clock()
        self._signature = signature(self.files)

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

    def watch(self, files: Iterable[Path]) -> None:
        """Follow ``files`` from now on (a config that names other files after a change). A set
        other than the one followed is looked at now, so that only later changes count."""
        watched = tuple(dict.fromkeys(files))
        if watched != self.files:
            self.files = watched
            self._signature = signature(watched)
