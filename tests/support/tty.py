"""A command run with a pseudo-terminal as its controlling terminal: where OpenSSL, left to
itself, asks for the pass phrase of an encrypted key ("Enter PEM pass phrase:") and waits."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import threading
import time
from collections.abc import Sequence

from tests.support import ROOT


class OnTerminal:
    """``argv`` started on a new pseudo-terminal; what it prints is collected in a thread."""

    def __init__(self, argv: Sequence[str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: never returns
            try:
                os.chdir(ROOT)
                os.execvp(argv[0], list(argv))
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self._chunks: list[bytes] = []
        self._ended = threading.Event()
        self.status: int | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                chunk = b""
            if not chunk:
                break
            self._chunks.append(chunk)
        self._ended.set()

    @property
    def output(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def said(self, needle: str) -> bool:
        """Whether ``needle`` is in the output, its lines joined: a log line on a terminal is
        wrapped to its width (80 here), where a long temporary path moves the breaks."""
        return " ".join(needle.split()) in " ".join(self.output.split())

    def wait_for(self, needle: str, timeout: float) -> bool:
        """Whether ``needle`` appears in the output (:meth:`said`) within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.said(needle):
                return True
            if self._ended.is_set():
                return self.said(needle)
            time.sleep(0.05)
        return False

    def wait(self, timeout: float) -> int | None:
        """The exit status once it ended by itself within ``timeout`` s, else None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                self._ended.wait(5)
                return self.status
            time.sleep(0.05)
        return None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; the terminal closed."""
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            if self.wait(5) is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.wait(5)
        self._ended.wait(5)
        with contextlib.suppress(OSError):
            os.close(self.fd)
