"""``sparkdiag link serve`` in one network namespace, ``sparkdiag link test`` in another, joined by
a veth pair whose sysfs speed (10000 Mb/s) is the ceiling: fit without a limit, degraded with
``tc`` shaping the pair to a tenth of it, and each bad input as one line with its exit status.

A test that shapes the pair, takes an end down or needs its own ``link serve`` (``--once``, the
busy one) makes its own namespaces; the others share one pair and one ``link serve`` for the
module (tests/support/netns.py removes them). Each measurement is the shortest that still shows
its point (``--duration``, ``--connect-timeout``). Skipped, with the reason, where namespaces
cannot be made. The tests are of the slow kind ``network`` (tests/conftest.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import NVML, ROOTFS, assert_clean_error
from tests.support.netns import Pair, ended, veth_pair, wait_for_line

pytestmark = pytest.mark.network

VETH_GBPS = 10.0  # /sys/class/net/vethX/speed of a veth: 10000 Mb/s
NOBODY_PORT = 10949  # nothing listens there in any pair
OTHER_PORT = 10951  # the stand-in for another service, on the shared pair


@pytest.fixture
def pair() -> Iterator[Pair]:
    """A pair of this test's own, to shape, take down or serve on as it likes."""
    with veth_pair() as made:
        yield made


@pytest.fixture(scope="module")
def shared() -> Iterator[Pair]:
    """One pair for the module's tests that leave it as they found it, with one ``link serve``
    (not ``--once``) on the default port."""
    with veth_pair() as made:
        server = made.serve()
        try:
            yield made
        finally:
            ended(server, stop=True)


def _test(pair: Pair, seconds: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    result = pair.sparkdiag(
        pair.client,
        "link",
        "test",
        pair.server_ip,
        "--duration",
        seconds,
        "--streams",
        "4",
        "--json",
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result, json.loads(result.stdout)


def _by(path: dict[str, Any], method: str, direction: str) -> float | None:
    for t in path["throughput"]:
        if t["method"] == method and t["direction"] == direction:
            gbps: float | None = t.get("gbps")
            return gbps
    return None


def test_fit_without_a_limit(pair: Pair) -> None:
    server = pair.serve("--once")
    result, doc = _test(pair, "1")  # iperf3 runs whole seconds: 1 s, ours the same
    ended(server)
    (path,) = doc["paths"]
    # both ends read from the namespace's own sysfs, and the path is the veth pair
    assert path["local"]["interface"] == pair.client_if
    assert path["peer"]["interface"] == pair.server_if
    assert path["local"]["negotiated_gbps"] == VETH_GBPS
    assert path["peer"]["negotiated_gbps"] == VETH_GBPS
    assert path["ceiling_gbps"] == VETH_GBPS
    assert path["latency"]["round_trips"] > 100
    assert (
        0 < path["latency"]["min_us"] <= path["latency"]["median_us"] <= path["latency"]["p99_us"]
    )
    best = path["best_gbps"]
    assert set(best) == {"to-peer", "from-peer"}
    assert path["ratio"] == round(min(best.values()) / VETH_GBPS, 3)
    if shutil.which("iperf3"):
        assert doc["tools"]["iperf3"] == "ran"
        for direction in ("to-peer", "from-peer"):
            ours, theirs = _by(path, "tcp-sockets", direction), _by(path, "iperf3", direction)
            assert ours is not None and theirs is not None, path["throughput"]
            # sparkdiag's own streams keep up with iperf3 on the same pair
            assert ours >= 0.5 * theirs, path["throughput"]
            if path["verdict"] != "fit" and theirs < 0.5 * VETH_GBPS:
                pytest.skip(
                    f"this machine moves only {theirs:.2f} Gb/s {direction} over a veth pair "
                    "by iperf3 too: not enough to show fit against the veth's 10 Gb/s"
                )
    else:
        assert doc["tools"]["iperf3"] == "not installed here"
    assert (path["verdict"], doc["verdict"], result.returncode) == ("fit", "fit", 0), path


def test_degraded_at_a_tenth_of_the_rate(pair: Pair) -> None:
    pair.limit("1gbit")  # a tenth of the veth's 10 Gb/s, both directions
    server = pair.serve("--once")
    result, doc = _test(pair, "0.5")  # the shortest --duration: 62 MB at 1 Gb/s, burst 256 kB
    ended(server)
    (path,) = doc["paths"]
    assert (path["verdict"], doc["verdict"], result.returncode) == ("degraded", "degraded", 1)
    assert all(t["gbps"] <= 1.1 for t in path["throughput"] if "gbps" in t), path["throughput"]
    assert path["ratio"] <= 0.11
    # a veth is no ConnectX-7: its MTU 1500 is not blamed; no configuration finding explains it
    assert path["cause"] == "no configuration finding explains it"
    assert "ethtool -S" in path["action"]


def test_the_text_report_names_the_path_and_the_verdict(shared: Pair) -> None:
    pair = shared
    result = pair.sparkdiag(
        pair.client, "link", "test", pair.server_ip, "--duration", "0.5", "--no-tools"
    )
    assert result.returncode in (0, 1), result.stderr
    out = result.stdout
    assert f"{pair.client_if} {pair.client_ip} -> {pair.server_ip} ({pair.server_if})" in out
    assert "negotiated 10.0 Gb/s, MTU 1500" in out
    assert "iperf3 not run (--no-tools)" in out
    assert out.rstrip().splitlines()[-1].startswith("verdict: ")


def test_a_refused_port(shared: Pair) -> None:
    pair = shared
    port = str(NOBODY_PORT)
    result = pair.sparkdiag(pair.client, "link", "test", pair.server_ip, "--port", port)
    assert_clean_error(
        result, 3, f"{pair.server_ip}:{port} refused the connection", "sparkdiag link serve"
    )
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_unreachable_peer(shared: Pair) -> None:
    pair = shared
    nobody = pair.server_ip.rsplit(".", 1)[0] + ".99"
    result = pair.sparkdiag(pair.client, "link", "test", nobody, "--connect-timeout", "1")
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1
    assert line.startswith(f"Error: {nobody}:10943 ")
    assert "unreachable" in line or "did not answer within 1 s" in line


def test_a_peer_not_running_the_listening_side(shared: Pair) -> None:
    pair = shared
    # another service on the port: it greets like an SSH server
    script = (
        f"import socket; s = socket.create_server(('0.0.0.0', {OTHER_PORT}))\n"
        "print('up', flush=True)\n"
        "while True:\n c, _ = s.accept(); c.sendall(b'SSH-2.0-OpenSSH_9.6\\r\\n'); c.close()"
    )
    other = pair.popen(pair.server, sys.executable, "-c", script)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "up"
        result = pair.sparkdiag(
            pair.client, "link", "test", pair.server_ip, "--port", str(OTHER_PORT)
        )
    finally:
        other.kill()
        ended(other)
    assert_clean_error(
        result,
        3,
        "answered, but not as 'sparkdiag link serve'",
        "another service listens on that port",
    )


def test_an_interface_with_no_carrier(pair: Pair) -> None:
    server = pair.serve()
    pair.down(pair.server, pair.server_if)  # the far end goes down: no carrier here
    result = pair.sparkdiag(
        pair.client, "link", "test", pair.server_ip, "--interface", pair.client_if
    )
    ended(server, stop=True)
    assert_clean_error(result, 3, f"{pair.client_if} has no carrier", "NO-CARRIER")
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_interface_that_does_not_exist(shared: Pair) -> None:
    pair = shared
    result = pair.sparkdiag(pair.client, "link", "test", pair.server_ip, "--interface", "eth9")
    assert_clean_error(result, 2, "'--interface'", "eth9: no such interface here", pair.client_if)


def test_a_peer_name_that_does_not_resolve(shared: Pair) -> None:
    pair = shared
    # a name with spaces fails in the resolver itself (EAI_NONAME), without asking any DNS
    result = pair.sparkdiag(pair.client, "link", "test", "no such host")
    assert_clean_error(result, 2, "'no such host': not an address, and no such host name")


# The first session, held open by the protocol itself: the control connection and its hello
# (sparkdiag's own client code), then nothing until a line on stdin, then "bye".
HOLD = """
import sys
from sparkdiag.link.auth import default_path, read_secret
from sparkdiag.link.session import open_control
control = open_control(sys.argv[1], int(sys.argv[2]), 3.0, read_secret(default_path()))
print("held", flush=True)
sys.stdin.readline()
print(control.ask({"op": "bye"}, timeout=5.0), flush=True)
control.sock.close()
"""


def test_a_busy_listening_side(pair: Pair) -> None:
    """A second measuring machine is turned away while a session runs."""
    server = pair.serve()
    holder = pair.popen(pair.client, sys.executable, "-c", HOLD, pair.server_ip, "10943")
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        second = pair.sparkdiag(pair.client, "link", "test", pair.server_ip)
        assert_clean_error(
            second, 3, f"busy: a test from {pair.client_ip} is running", "try again when it is done"
        )
        out, _ = holder.communicate("\n", timeout=30)
        assert (holder.returncode, out.strip()) == (0, "{'ok': True}")
        # the session has ended on the server's side too before it is stopped
        wait_for_line(server, "ended after")
    finally:
        if holder.poll() is None:
            holder.kill()
        ended(holder)
        code = ended(server, stop=True)
    assert code == 0, "SIGTERM between sessions ends link serve with 0"


def _check(pair: Pair, peer: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    result = pair.sparkdiag(
        pair.client,
        "check",
        "--json",
        "--nvml-fixture",
        str(NVML / "no-nvml.json"),
        "--path.rootfs",
        str(ROOTFS / "native"),
        "--peer",
        peer,
    )
    assert "Traceback" not in result.stderr, result.stderr
    rows = json.loads(result.stdout)["checks"]
    return result, [r for r in rows if r["name"] in ("cx7-config", "link-peer")]


def test_check_with_a_peer(shared: Pair) -> None:
    pair = shared
    _, rows = _check(pair, pair.server_ip)
    config, peer = rows
    assert (config["status"], config["finding"]) == (
        "skip",
        "no ConnectX-7 (PCI 15b3:1021) on this machine",
    )
    assert peer["finding"].startswith(f"{pair.client_if} -> {pair.server_ip}: ")
    assert peer["data"]["local"]["negotiated_gbps"] == VETH_GBPS
    methods = {t["method"] for t in peer["data"]["throughput"]}
    assert methods == {"tcp-sockets"}  # check runs the short test: no iperf3
    assert all(t["seconds"] <= 3 for t in peer["data"]["throughput"])
    assert peer["status"] == {"fit": "pass", "degraded": "warn"}[peer["data"]["verdict"]]


def test_check_with_a_peer_that_refuses(shared: Pair) -> None:
    pair = shared
    result, rows = _check(pair, f"{pair.server_ip}:{NOBODY_PORT}")
    peer = rows[1]
    assert peer["status"] == "fail"
    assert peer["finding"].startswith(f"{pair.server_ip}:{NOBODY_PORT} refused the connection")
    assert result.returncode == 3  # errors.Exit.FAILED: at least one check failed
