"""The kernel log (the ring buffer ``dmesg`` prints), under a configurable root (``--path.rootfs``).

On the real root the log is read from ``/dev/kmsg`` without blocking, or, when that cannot be
opened, from the output of ``dmesg``; both need ``kernel.dmesg_restrict=0`` or root. Under a fake
root, ``ROOT/dev/kmsg`` is a plain file of kmsg records or dmesg lines, so fixtures can stand in
for the machine. Nothing here raises: an unreadable log is a :class:`KernelLog` that says why.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sparkdiag.sources.files import MIB, read_text_limited

KMSG_MAX_RECORDS = 200_000
KMSG_MAX_SECONDS = 2.0
DMESG_TIMEOUT = 3.0

_KMSG_PREFIX = re.compile(r"^\d+,\d+,\d+")


@dataclass(frozen=True)
class KernelLog:
    """Kernel log lines (``dmesg``), or why they could not be read."""

    lines: tuple[str, ...] | None
    source: str  # "/dev/kmsg", "dmesg", a file
    unreadable: str | None = None  # the reason when lines is None


def read_kernel_log(rootfs: Path) -> KernelLog:
    """The kernel log since boot (as far as the ring buffer reaches), one message per line.

    Unit: none (lines of text; a kmsg record's ``PRIORITY,SEQ,USEC,FLAGS;`` prefix is dropped,
    other lines are kept as they are). Same reading as ``dmesg`` (or ``cat /dev/kmsg``, which
    blocks at the end instead of returning).

    On the real root: ``/dev/kmsg`` read without blocking (at most :data:`KMSG_MAX_RECORDS`
    records or :data:`KMSG_MAX_SECONDS` seconds), else the output of ``dmesg`` (killed after
    :data:`DMESG_TIMEOUT` seconds). Under a fake root, ``ROOT/dev/kmsg`` is read as a plain
    file of kmsg records or dmesg lines.
    """
    kmsg = rootfs / "dev" / "kmsg"
    if rootfs.resolve() != Path("/"):
        try:
            text = read_text_limited(kmsg, 64 * MIB)
        except OSError as exc:
            return KernelLog(None, str(kmsg), f"cannot read {kmsg}: {exc.strerror or exc}")
        return KernelLog(tuple(_message(line) for line in text.splitlines()), str(kmsg))
    lines, why = _read_kmsg(kmsg)
    if lines is not None:
        return KernelLog(lines, str(kmsg))
    dmesg_lines, dmesg_why = _read_dmesg()
    if dmesg_lines is not None:
        return KernelLog(dmesg_lines, "dmesg")
    return KernelLog(None, str(kmsg), f"{why}; dmesg: {dmesg_why}")


def _message(record: str) -> str:
    """The text of a kmsg record ("6,1234,5678,-;NVRM: ..."); other lines unchanged."""
    head, sep, text = record.partition(";")
    if sep and _KMSG_PREFIX.match(head):
        return text.rstrip("\n")
    return record.rstrip("\n")


def _read_kmsg(path: Path) -> tuple[tuple[str, ...] | None, str]:
    """The records of the kernel's ``/dev/kmsg`` device, read without blocking; (None, why)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        hint = " (kernel.dmesg_restrict=1? run as root)" if exc.errno in (1, 13) else ""
        return None, f"cannot open {path}: {exc.strerror or exc}{hint}"
    lines: list[str] = []
    deadline = time.monotonic() + KMSG_MAX_SECONDS
    try:
        if not stat.S_ISCHR(os.fstat(fd).st_mode):
            return None, f"{path} is not the kernel's character device"
        while len(lines) < KMSG_MAX_RECORDS and time.monotonic() < deadline:
            try:
                record = os.read(fd, 16384)
            except BlockingIOError:
                break  # the end of the buffer
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # a record was overwritten while we read: skip to the next
                if exc.errno == errno.EINVAL:
                    continue  # a record larger than the buffer
                return None, f"cannot read {path}: {exc.strerror or exc}"
            if not record:
                break
            lines.append(_message(record.decode("utf-8", "replace")))
    finally:
        os.close(fd)
    return tuple(lines), ""


def _read_dmesg() -> tuple[tuple[str, ...] | None, str]:
    """The lines ``dmesg`` prints; (None, why) when it is missing, fails or times out."""
    command = shutil.which("dmesg")
    if command is None:
        return None, "not installed"
    try:
        done = subprocess.run(
            [command], capture_output=True, timeout=DMESG_TIMEOUT, check=False, text=True
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if done.returncode != 0:
        err = done.stderr.strip().splitlines()
        return None, err[-1] if err else f"exit status {done.returncode}"
    return tuple(done.stdout.splitlines()), ""
