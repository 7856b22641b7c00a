"""Two network namespaces joined by a veth pair, for the ``sparkdiag link`` tests.

Each pair (made for one test, or for a module's tests that leave it as they found it) has
names that carry the pid and a counter, so that tests running at the same time on one machine
never meet, and is removed when its user ends, whatever happens: every process still in the
namespaces (all started by the tests) is killed, then the namespaces are deleted, which deletes
the veth pair. ``ip netns exec`` mounts a fresh sysfs for the namespace,
so ``/sys/class/net`` there shows the namespace's veth end, which reports a speed (10000 Mb/s).
Where namespaces cannot be made (not root, no iproute2, a sandbox without CAP_SYS_ADMIN) the
test is skipped and says why.
"""

from __future__ import annotations

import itertools
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import pytest

from tests.support import ROOT, sparkdiag_cmd

_COUNTER = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


@dataclass(frozen=True)
class Pair:
    """Namespace ``server`` holds interface ``server_if`` at ``server_ip``; ``client`` holds
    ``client_if`` at ``client_ip``; both in ``SUBNET``."""

    server: str
    client: str
    server_if: str
    client_if: str
    server_ip: str
    client_ip: str
    config_home: str  # $XDG_CONFIG_HOME of both ends: 'link serve' makes the secret there

    def argv(self, namespace: str, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", namespace, *argv]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "XDG_CONFIG_HOME": self.config_home}

    def run(
        self, namespace: str, argv: Sequence[str], timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(namespace, *argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            env=self.env,
        )

    def sparkdiag(
        self, namespace: str, *args: str, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return self.run(namespace, sparkdiag_cmd(*args), timeout)

    def serve(self, *args: str) -> subprocess.Popen[str]:
        """``sparkdiag link serve`` in the server namespace (on the veth's address unless
        ``--listen`` is given: a veth is no ConnectX-7), once it listens."""
        if "--listen" not in args:
            args = (*args, "--listen", f"{self.server_ip}:10943")
        proc = subprocess.Popen(
            self.argv(self.server, *sparkdiag_cmd("link", "serve", *args)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=self.env,
        )
        assert proc.stderr is not None
        line = proc.stderr.readline()
        while "made a new link secret" in line:
            line = proc.stderr.readline()
        assert "listening on" in line, line + proc.stderr.read()
        return proc

    def popen(self, namespace: str, *argv: str) -> subprocess.Popen[str]:
        """``argv`` in ``namespace``, its stdin and stdout pipes (text)."""
        return subprocess.Popen(
            self.argv(namespace, *argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=self.env,
        )

    def limit(self, rate: str) -> None:
        """Shape both ends to ``rate`` (``1gbit``) with a token bucket filter."""
        for namespace, interface in ((self.server, self.server_if), (self.client, self.client_if)):
            tbf = ["tc", "qdisc", "add", "dev", interface, "root", "tbf", "rate", rate]
            tbf += ["burst", "256kb", "latency", "20ms"]
            subprocess.run(self.argv(namespace, *tbf), check=True, capture_output=True, timeout=30)

    def down(self, namespace: str, interface: str) -> None:
        _ip("-n", namespace, "link", "set", interface, "down")


def ended(proc: subprocess.Popen[str], stop: bool = False) -> int:
    """Wait for ``proc`` (SIGTERM first with ``stop``), close its pipes; its exit status."""
    if stop:
        proc.terminate()
    try:
        return proc.wait(timeout=30)
    finally:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def wait_for_line(proc: subprocess.Popen[str], needle: str, timeout: float = 30) -> str:
    """The first line of ``proc``'s stderr that holds ``needle``, read in a thread so that a
    process that never says it fails the test after ``timeout`` seconds instead of hanging it."""
    assert proc.stderr is not None
    stream = proc.stderr
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            if needle in line:
                lines.put(line)
                return
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    try:
        line = lines.get(timeout=timeout)
    except queue.Empty:
        pytest.fail(f"no line with {needle!r} within {timeout:g} s")
    assert line, f"the process ended (exit {proc.poll()}) without a line with {needle!r}"
    return line


def _cleanup(namespaces: Sequence[str]) -> None:
    for namespace in namespaces:
        pids = _ip("netns", "pids", namespace, check=False).stdout.split()
        for pid in pids:
            with suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while pids and time.monotonic() < deadline:
            pids = _ip("netns", "pids", namespace, check=False).stdout.split()
            time.sleep(0.05)
        for pid in pids:
            with suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", namespace, check=False)


@contextmanager
def veth_pair() -> Iterator[Pair]:
    """A fresh pair of namespaces joined by a veth pair, removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs the tests as root)")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("network namespaces need iproute2 (ip, tc): apt-get install iproute2")
    tag = f"{os.getpid() % 100000}{next(_COUNTER)}"
    octet = (os.getpid() + int(tag)) % 250 + 1
    pair = Pair(
        server=f"sdlink-s{tag}",
        client=f"sdlink-c{tag}",
        server_if=f"sds{tag}"[:15],
        client_if=f"sdc{tag}"[:15],
        server_ip=f"10.231.{octet}.1",
        client_ip=f"10.231.{octet}.2",
        config_home=tempfile.mkdtemp(prefix="sdlink-config-"),
    )
    made: list[str] = []
    try:
        for namespace in (pair.server, pair.client):
            _ip("netns", "add", namespace)
            made.append(namespace)
        _ip("link", "add", pair.server_if, "type", "veth", "peer", "name", pair.client_if)
        for namespace, interface, address in (
            (pair.server, pair.server_if, pair.server_ip),
            (pair.client, pair.client_if, pair.client_ip),
        ):
            _ip("link", "set", interface, "netns", namespace)
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", interface)
            _ip("-n", namespace, "link", "set", interface, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        _ip("link", "del", pair.server_if, check=False)
        _cleanup(made)
        shutil.rmtree(pair.config_home, ignore_errors=True)
        pytest.skip(f"network namespaces cannot be made here: {exc.stderr.strip()}")
    try:
        yield pair
    finally:
        _cleanup(made)
        shutil.rmtree(pair.config_home, ignore_errors=True)
