"""Bounded reads: every file sparkdiag parses is read up to a limit, never without bound.

The roots it reads under (``--path.sysfs``, ``--path.rootfs``, fixture paths) may be fake trees
or hostile: a "file" that is ``/dev/zero`` or a multi-gigabyte log must cost a bounded read and
one clear error, never the daemon's memory.
"""

from __future__ import annotations

from pathlib import Path

KIB = 1024
MIB = 1024 * KIB


class FileTooLarge(OSError):
    """The file holds more than the limit sparkdiag reads (``strerror`` says how much)."""


def read_limited(path: Path, limit: int) -> bytes:
    """The whole content of ``path`` when it holds at most ``limit`` bytes; FileTooLarge (an
    OSError, so callers that skip unreadable files skip it too) when it holds more."""
    with path.open("rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(0, f"larger than {_size(limit)}", str(path))
    return data


def read_text_limited(path: Path, limit: int, encoding: str = "utf-8") -> str:
    """:func:`read_limited`, decoded (undecodable bytes replaced)."""
    return read_limited(path, limit).decode(encoding, errors="replace")


def _size(limit: int) -> str:
    if limit >= MIB and limit % MIB == 0:
        return f"{limit // MIB} MiB"
    if limit >= KIB and limit % KIB == 0:
        return f"{limit // KIB} KiB"
    return f"{limit} bytes"
