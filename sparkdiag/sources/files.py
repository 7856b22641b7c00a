"""Bounded reads: every file sparkdiag parses is read up to a limit, never without bound.

The roots it reads under (``--path.sysfs``, ``--path.rootfs``, fixture paths) may be fake trees
or hostile: a "file" that is ``/dev/zero`` or a multi-gigabyte log must cost a bounded read and
one clear error, never the daemon's memory.
"""

from __future__ import annotations

from pathlib import Path

from sparkdiag.safeload import LoadError, read_file

KIB = 1024
MIB = 1024 * KIB


class FileTooLarge(OSError):
    """The file holds more than the limit sparkdiag reads (``strerror`` says how much), or is
    no regular file (a FIFO, a device: ``strerror`` says which), which is not read at all."""


def read_limited(path: Path, limit: int) -> bytes:
    """The whole content of the regular file ``path`` when it holds at most ``limit`` bytes;
    FileTooLarge (an OSError, so callers that skip unreadable files skip it too) when it holds
    more or is not a regular file: a FIFO given as a fixture, or lying in a fixture tree, was
    opened for reading and waited for a writer forever (the bad-input review)."""
    try:
        return read_file(path, limit)
    except LoadError as exc:
        raise FileTooLarge(0, str(exc), str(path)) from None


def read_text_limited(path: Path, limit: int, encoding: str = "utf-8") -> str:
    """:func:`read_limited`, decoded (undecodable bytes replaced)."""
    return read_limited(path, limit).decode(encoding, errors="replace")
