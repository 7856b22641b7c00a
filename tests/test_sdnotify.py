"""sd_notify against a real unix datagram socket, as systemd would listen."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkdiag.sdnotify import Notifier


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    yield sock, path
    sock.close()


def receive(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().split("\n")


def test_ready_status_watchdog_stopping(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
    assert n.enabled and n.watchdog_interval == 1.0
    assert n.ready("polling 1 GPU")
    assert receive(sock) == ["READY=1", "STATUS=polling 1 GPU", f"MAINPID={os.getpid()}"]
    assert n.watchdog(now=100.0)
    assert receive(sock) == ["WATCHDOG=1"]
    assert not n.watchdog(now=100.5)  # within half the timeout: no ping
    assert n.watchdog(now=101.1)
    assert receive(sock) == ["WATCHDOG=1"]
    assert n.stopping()
    assert receive(sock) == ["STOPPING=1", "STATUS=stopping"]
    n.close()


def test_abstract_socket() -> None:
    name = f"sparkdiag-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).status("hello")
        assert receive(sock) == ["STATUS=hello"]
    finally:
        sock.close()


def test_without_systemd_everything_is_a_noop() -> None:
    n = Notifier({})
    assert not n.enabled
    assert not n.ready("x") and not n.watchdog() and not n.stopping()


def test_watchdog_for_another_pid_is_ignored(listener: tuple[socket.socket, str]) -> None:
    _, path = listener
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert n.watchdog_interval is None
    assert not n.watchdog()


def test_vanished_socket_is_not_fatal(tmp_path: Path) -> None:
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert not n.ready("x")


def test_daemon_notifies_ready_then_stopping(listener: tuple[socket.socket, str]) -> None:
    """The real daemon: READY=1 after the first poll, STOPPING=1 on SIGTERM."""
    import signal
    import subprocess

    from tests.support import NVML, ROOT, SYSFS, free_port, sparkdiag_cmd

    sock, path = listener
    sock.settimeout(20)
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="200000")
    cmd = sparkdiag_cmd(
        "serve",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--poll-interval",
        "0.05",
        "--nvml-fixture",
        str(NVML / "h200-idle.json"),
        "--path.sysfs",
        str(SYSFS / "h200-vm"),
    )
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE)
    try:
        messages = [receive(sock) for _ in range(4)]
        assert messages[0][0] == "READY=1", messages
        assert "NVML up, 1 GPU(s)" in messages[0][1]
        assert all(m == ["WATCHDOG=1"] for m in messages[1:]), messages
        proc.send_signal(signal.SIGTERM)
        while (m := receive(sock)) == ["WATCHDOG=1"]:
            pass
        assert m == ["STOPPING=1", "STATUS=stopping"]
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_poll_interval_longer_than_the_watchdog_allows_is_shortened(
    listener: tuple[socket.socket, str],
) -> None:
    """--poll-interval 5 under a 4 s watchdog pinged every 5 s: systemd would kill the service
    at every gap (the shipped unit's 60 s against any --poll-interval of 60 s or more: a
    restart loop; found in a review). The polls come at a quarter of it, the pings at half.
    Here at half that scale: --poll-interval 2.5 under a 2 s watchdog."""
    import itertools
    import signal
    import subprocess
    import time

    from tests.support import NVML, ROOT, SYSFS, free_port, sparkdiag_cmd

    sock, path = listener
    sock.settimeout(20)
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="2000000")
    cmd = sparkdiag_cmd(
        "serve", "--listen", f"127.0.0.1:{free_port()}", "--poll-interval", "2.5",
        "--nvml-fixture", str(NVML / "h200-idle.json"), "--path.sysfs", str(SYSFS / "h200-vm"),
    )  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert receive(sock)[0] == "READY=1"
        times = []
        for _ in range(3):
            assert receive(sock) == ["WATCHDOG=1"]
            times.append(time.monotonic())
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert max(gaps) < 2.0, gaps  # within the watchdog, where 2.5 s were
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=10)
        assert "polling every 0.5 s instead, so that the watchdog is fed" in err
    finally:
        proc.kill()
        proc.wait()
