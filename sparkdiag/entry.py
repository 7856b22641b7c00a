"""The ``sparkdiag`` entry point: installs the daemon's signal handlers before anything slow.

``sparkdiag serve`` must answer SIGTERM cleanly from its first instant (systemd may stop it while
it starts); importing the command line and its dependencies takes a few hundred milliseconds, so
the handlers (:mod:`sparkdiag.lifecycle`, standard library only) go in before those imports. Every
other command gets SIGINT and SIGTERM from the command group, around the command it runs.
"""

from __future__ import annotations

import errno
import io
import os
import sys
from typing import Any


def main() -> None:
    _fill_closed_descriptors()  # before the daemon's signal pipe takes descriptor 1
    if "serve" in sys.argv[1:2]:
        from sparkdiag.lifecycle import LIFECYCLE

        LIFECYCLE.install(daemon=True)
    from sparkdiag.cli import main as cli_main

    _watch_stdout()
    try:
        try:
            cli_main()
        finally:  # what is still buffered fails here, where it can be said, not at exit
            sys.stdout.flush()
    except StdoutError as exc:
        _stdout_lost(exc)


class StdoutError(OSError):
    """A write to standard output failed (a full disk, a closed pipe): raised by the standard
    output :func:`_watch_stdout` sets up, so that it is told from every other OSError."""


class _Stdout(io.RawIOBase):
    """File descriptor 1, whose failed writes raise :class:`StdoutError`."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        try:
            return os.write(self._fd, data)
        except BlockingIOError:
            raise
        except OSError as exc:
            raise StdoutError(exc.errno, exc.strerror) from None


def _fill_closed_descriptors() -> None:
    """Standard input, output or error that the caller closed (``sparkdiag serve >&-``) become
    /dev/null, as the daemon under a supervisor without them would want, before anything opens
    a descriptor: the next one opened takes the lowest free number. The daemon's signal pipe
    became descriptor 1, and putting /dev/null there later closed the pipe's reading end, so
    that every signal after the first was lost (SIGTERM included: the review of 2026-12-04).
    Python leaves ``sys.stdin``, ``sys.stdout`` or ``sys.stderr`` None for a closed one; each is
    made again over /dev/null."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if getattr(sys, name) is None and name != "stdout":  # stdout: _watch_stdout's
            setattr(sys, name, open(fd, mode, encoding="utf-8", closefd=False))  # noqa: SIM115


def _watch_stdout() -> None:
    """Standard output as Python made it (encoding, errors, line buffering on a terminal), over
    :class:`_Stdout`. A closed one (``sparkdiag ... >&-``: Python leaves ``sys.stdout`` None)
    becomes /dev/null, as ``>/dev/null`` would: the flush at exit was an AttributeError's
    traceback after the command had run, and the next file opened took descriptor 1."""
    if sys.stdout is None:  # descriptor 1 is /dev/null by now (_fill_closed_descriptors)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    old = sys.stdout
    if old is None or not isinstance(old, io.TextIOWrapper):  # not the interpreter's own
        return
    try:
        fd = old.fileno()
    except (OSError, ValueError):
        return
    old.flush()
    raw = _Stdout(fd)
    # python -u (PYTHONUNBUFFERED): no buffer under the text layer, as Python makes it there
    unbuffered = not isinstance(old.buffer, io.BufferedWriter)
    sys.stdout = io.TextIOWrapper(
        raw if unbuffered else io.BufferedWriter(raw),
        encoding=old.encoding,
        errors=old.errors,
        line_buffering=old.line_buffering,
        write_through=old.write_through or unbuffered,
    )


def _stdout_lost(exc: StdoutError) -> None:
    """Standard output that cannot be written (a full disk, a closed pipe) ends the command
    with one line and status 1, as an output file not written does, where it was a traceback;
    a reader that went away (``| head -1``) is said nothing."""
    from sparkdiag.errors import Exit

    with open(os.devnull, "wb") as sink:  # the exit's own flush then goes nowhere, quietly
        os.dup2(sink.fileno(), sys.stdout.fileno())
    if exc.errno != errno.EPIPE:
        print(f"Error: cannot write standard output: {exc.strerror or exc}", file=sys.stderr)
    raise SystemExit(Exit.ATTENTION)
