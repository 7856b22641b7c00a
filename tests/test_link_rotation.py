"""Rotating the link secret under a running ``link serve``: before, the file was read at start
only, so a new secret on every machine meant restarting every ``link serve`` (and dropping a
measurement under way). Now a changed file applies from the next session, a session under way
goes on, and a changed file that cannot be used leaves the last good secret in use, said once
with the fix and again when the file is usable."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sparkdiag.link.auth import LiveSecret
from sparkdiag.link.client import LinkError
from sparkdiag.link.server import LinkServer, listen_socket
from sparkdiag.link.session import open_control
from sparkdiag.link.wire import VERSION, LineReader, send
from tests.support import ROOTFS, SYSFS, sparkdiag_cmd
from tests.test_link_hostile import start, wait_for
from tests.test_link_units import _loopback_as_cx7

OLD = b"old secret, of 32 characters ..."
NEW = b"the new secret, after rotation!!"


def write_secret(path: Path, secret: bytes) -> None:
    """As an operator rotates it: a file beside the old one, moved over it."""
    beside = path.with_name(path.name + ".new")
    beside.write_bytes(secret + b"\n")
    beside.chmod(0o600)
    beside.replace(path)


def works(port: int, secret: bytes) -> bool:
    """Whether a session opens with ``secret`` (closed again at once). The session before may
    still be ending on the listening side ("busy") for a moment after its bye."""
    deadline = time.monotonic() + 10
    while True:
        try:
            control = open_control("127.0.0.1", port, 3.0, secret)
        except LinkError as exc:
            if "busy" in str(exc) and time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            assert "refused this machine's link secret" in str(exc), exc
            return False
        control.ask({"op": "bye"})
        control.sock.close()
        return True


class Rotating:
    """A ``LinkServer`` on 127.0.0.1 with a ``LiveSecret`` of ``path``, whose clock the test
    moves: each ``tick`` makes the next look at the file due."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "link.secret"
        write_secret(self.path, OLD)
        self.said: list[str] = []
        self.now = 0.0
        self.secret = LiveSecret(self.path, self.said.append, clock=lambda: self.now)
        self.server = LinkServer(
            listen_socket("127.0.0.1", 0),
            _loopback_as_cx7(tmp_path / "sysfs"),
            ROOTFS / "native",
            {},
            self.secret,
            say=self.said.append,
        )

    def tick(self) -> None:
        self.now += 1.5

    def lines(self, text: str) -> list[str]:
        return [line for line in self.said if text in line]


@pytest.fixture
def rotating(tmp_path: Path) -> Iterator[Rotating]:
    served = Rotating(tmp_path)
    stop, thread = start(served.server)
    try:
        yield served
    finally:
        stop.set()
        thread.join(5)
        served.server.close()
    assert not thread.is_alive()


def test_a_rotated_secret_applies_to_the_next_session_not_the_one_under_way(
    rotating: Rotating,
) -> None:
    port = rotating.server.port
    under_way = open_control("127.0.0.1", port, 3.0, OLD)  # proved with the old secret
    write_secret(rotating.path, NEW)
    rotating.tick()
    wait_for(lambda: rotating.secret.rotations == 1)  # seen by the accept loop, no peer needed
    # the session that proved the old secret goes on: it is answered, and its token still
    # opens a ping connection (what its measurement's connections carry)
    assert under_way.ask({"op": "sink", "test": "t1", "streams": 1, "seconds": 1}) == {"ok": True}
    with socket.create_connection(("127.0.0.1", port), 5) as ping:
        send(ping, {"sparkdiag-link": VERSION, "kind": "ping", "session": under_way.token})
        assert LineReader(ping).read(5) == {"sparkdiag-link": VERSION, "session": under_way.token}
    assert under_way.ask({"op": "bye"}) == {"ok": True}
    under_way.sock.close()
    wait_for(lambda: not rotating.server.busy)
    assert works(port, NEW)
    assert not works(port, OLD)
    assert rotating.lines("holds a new secret: new sessions must prove it") == [
        f"the link secret file {rotating.path} holds a new secret: new sessions must prove it "
        "(a session under way goes on)"
    ]


def _gone(path: Path) -> None:
    path.unlink()


def _dangling(path: Path) -> None:
    path.unlink()
    path.symlink_to("secret-2")


def _open_to_others(path: Path) -> None:
    write_secret(path, NEW)
    path.chmod(0o602)


def _empty(path: Path) -> None:
    write_secret(path, b"")


def _short(path: Path) -> None:
    write_secret(path, b"abc")


@pytest.mark.parametrize(
    ("spoil", "problem"),
    [
        (_gone, "no link secret at {path} any more: write the new one there"),
        (_dangling, "{path} is a symbolic link to secret-2 ({where}), which does not exist"),
        (_open_to_others, "{path} is mode 602: other users can write it, and so replace the"),
        (_empty, "{path}: a secret of 0 characters is too short (at least 16; write the new"),
        (_short, "{path}: a secret of 3 characters is too short"),
    ],
    ids=["gone", "dangling-link", "mode-0602", "empty", "too-short"],
)
def test_an_unusable_replacement_keeps_the_last_good_secret_said_once(
    rotating: Rotating, spoil: Callable[[Path], None], problem: str
) -> None:
    port, path = rotating.server.port, rotating.path
    assert works(port, OLD)
    spoil(path)
    for _ in range(4):  # looked at four times, by peers and by the accept loop
        rotating.tick()
        assert works(port, OLD)
    if path.exists():  # touched again, still unusable: the same problem is not said again
        os.utime(path, ns=(1, 1))
        rotating.tick()
        assert works(port, OLD)
    said = rotating.lines("cannot be used")
    expected = problem.format(path=path, where=path.parent / "secret-2")
    assert len(said) == 1 and expected in said[0], rotating.said
    assert said[0].startswith(
        "the link secret file changed and cannot be used, so new sessions still need the last "
        "good secret: "
    )
    # fixed with the new secret: said, and the new secret is the one from now on
    if path.is_symlink():
        path.unlink()
    write_secret(path, NEW)
    rotating.tick()
    assert works(port, NEW) and not works(port, OLD)
    assert rotating.lines("is usable again") == [
        f"the link secret file {path} is usable again and holds a new secret: new sessions "
        "must prove it (a session under way goes on)"
    ]
    assert len(rotating.lines("cannot be used")) == 1


def test_a_file_fixed_back_to_the_same_secret_is_said_usable_again(rotating: Rotating) -> None:
    rotating.path.chmod(0o644)
    rotating.tick()
    assert works(rotating.server.port, OLD)
    rotating.path.chmod(0o600)
    rotating.tick()
    assert works(rotating.server.port, OLD)
    assert rotating.lines("usable again") == [
        f"the link secret file {rotating.path} is usable again (the same secret)"
    ]
    assert rotating.secret.rotations == 0


def test_link_serve_follows_its_secret_file_without_a_restart(tmp_path: Path) -> None:
    """The command itself, in its own process, with its real clock: rotated, spoilt, fixed."""
    path = tmp_path / "link.secret"
    write_secret(path, OLD)
    with listen_socket("127.0.0.1", 0) as free:
        port = free.getsockname()[1]
    proc = subprocess.Popen(
        sparkdiag_cmd("link", "serve", "--listen", f"127.0.0.1:{port}",
                      "--path.sysfs", str(SYSFS / "h200-vm"), "--link.secret-file", str(path)),
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(proc.stderr or ()), daemon=True)
    try:
        assert proc.stderr is not None and "listening on" in proc.stderr.readline()
        reader.start()
        assert works(port, OLD)
        write_secret(path, NEW)
        wait_for(lambda: works(port, NEW), 10)  # looked at once a second
        assert not works(port, OLD)
        path.chmod(0o644)
        wait_for(lambda: any("cannot be used" in line for line in said), 10)
        for _ in range(3):
            assert works(port, NEW)
            time.sleep(0.4)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        with contextlib.suppress(RuntimeError):
            reader.join(timeout=30)
    out = "".join(said)
    assert proc.returncode == 0, out
    assert out.count("holds a new secret") == 1 and out.count("cannot be used") == 1, out
    assert f"{path} is mode 644: its group and other users can read it" in out
    assert "Traceback" not in out
