"""The container relay: runs the container command and forwards only the worker's document.

Started as ``python3 -I relay.py SCHEMA COMMAND...`` (standard library only, so it runs under
any interpreter, and is read by ruff and mypy like any module). It runs the container command,
passes the worker's source through on standard input (inherited), and forwards to its own
standard output only the worker's JSON document, the last line that is one; anything the image
printed around it (the NGC entrypoint prints its banner on standard output) goes to standard
error. Output without such a line is forwarded unchanged, so that it is still reported as "not
the worker's JSON". It runs in the worker's process group: the runner's timeout kills it together
with the container command and whatever that started; and should sparkdiag itself die
(kill -9), the relay sees the reader of its standard output go (sparkdiag reads the document
through a pipe only it holds: a pipe whose reader has gone polls as an error however early that
happened, before the relay ran too), or its parent change (for a starter that reads no pipe),
and ends its group (SIGTERM first, which docker and podman pass on to the container; SIGKILL 5 s
later).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import stat
import subprocess
import sys
import time

MAX_BUFFER = 16 * 1024 * 1024  # bytes of the container's standard output kept
DRAIN_SECONDS = 1.0  # how long to read after the command exited
ORPHAN_GRACE_SECONDS = 5.0  # SIGTERM to SIGKILL when sparkdiag died


def _end_group(child: subprocess.Popen[bytes]) -> None:
    """sparkdiag died: end the whole process group, the relay last."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=ORPHAN_GRACE_SECONDS)
    os.killpg(0, signal.SIGKILL)


def _collect(child: subprocess.Popen[bytes], parent: int) -> bytes:
    """The command's standard output (at most MAX_BUFFER bytes), read until it closes or
    DRAIN_SECONDS after the command exited; the group ended should sparkdiag die meanwhile."""
    assert child.stdout is not None
    fd = child.stdout.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    reader = _output_pipe()
    if reader is not None:
        poller.register(reader, 0)  # POLLERR and POLLHUP are reported unasked
    buf = bytearray()
    exited: float | None = None
    while True:
        if os.getppid() != parent:
            _end_group(child)
        if exited is None and child.poll() is not None:
            exited = time.monotonic()
        if exited is not None and time.monotonic() - exited > DRAIN_SECONDS:
            break
        events = dict(poller.poll(200))
        if reader is not None and events.get(reader, 0) & (select.POLLERR | select.POLLHUP):
            _end_group(child)  # the reader of the document is gone: sparkdiag died
        if reader is not None and events.get(reader, 0) & select.POLLNVAL:
            poller.unregister(reader)  # not a descriptor any more: not watched
            reader = None
        if events.get(fd):
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            if len(buf) < MAX_BUFFER:
                buf += chunk
    return bytes(buf)


def _output_pipe() -> int | None:
    """Standard output's descriptor where it is a pipe or a socket, whose reader can go."""
    try:
        mode = os.fstat(1).st_mode
    except OSError:  # closed
        return None
    return 1 if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) else None


def split_document(output: bytes, schema: str) -> tuple[bytes, bytes]:
    """(the last line that is a JSON document of ``schema``, everything else); when there is no
    such line, (the whole output, nothing)."""
    lines = output.splitlines(keepends=True)
    for i in range(len(lines) - 1, -1, -1):
        text = lines[i].strip()
        if not text.startswith(b"{"):
            continue
        try:
            doc = json.loads(text)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("schema") == schema:
            return lines[i], b"".join(lines[:i] + lines[i + 1 :])
    return output, b""


def main(argv: list[str]) -> int:
    schema, cmd = argv[0], argv[1:]
    parent = os.getppid()
    try:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    except OSError as exc:
        sys.stderr.write(f"cannot start worker {cmd[0]!r}: {exc}\n")
        return 127
    output = _collect(child, parent)
    code = child.wait()
    document, extra = split_document(output, schema)
    if extra.strip():
        sys.stderr.buffer.write(extra)
        sys.stderr.buffer.flush()
    sys.stdout.buffer.write(document)
    sys.stdout.buffer.flush()
    if code < 0:  # end the way the command ended
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
