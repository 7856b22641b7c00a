"""``sparkdiag link serve`` in one network namespace, ``sparkdiag link test`` in another, joined by
a veth pair whose sysfs speed (10000 Mb/s) is the ceiling: fit without a limit, degraded with
``tc`` shaping the pair to a tenth of it, and each bad input as one line with its exit status.

Every test makes its own namespaces and removes them (tests/support/netns.py); they are skipped,
with the reason, where namespaces cannot be made.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import NVML, ROOTFS, assert_clean_error, sparkdiag_cmd
from tests.support.netns import Pair, veth_pair

VETH_GBPS = 10.0  # /sys/class/net/vethX/speed of a veth: 10000 Mb/s


@pytest.fixture
def pair() -> Iterator[Pair]:
    with veth_pair() as made:
        yield made


def _test(pair: Pair, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    result = pair.sparkdiag(
        pair.client,
        "link",
        "test",
        pair.server_ip,
        "--duration",
        "1",
        "--streams",
        "4",
        "--json",
        *args,
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
    result, doc = _test(pair)
    server.wait(timeout=30)
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
    result, doc = _test(pair)
    server.wait(timeout=30)
    (path,) = doc["paths"]
    assert (path["verdict"], doc["verdict"], result.returncode) == ("degraded", "degraded", 1)
    assert all(t["gbps"] <= 1.1 for t in path["throughput"] if "gbps" in t), path["throughput"]
    assert path["ratio"] <= 0.11
    # a veth is no ConnectX-7: its MTU 1500 is not blamed; no configuration finding explains it
    assert path["cause"] == "no configuration finding explains it"
    assert "ethtool -S" in path["action"]


def test_the_text_report_names_the_path_and_the_verdict(pair: Pair) -> None:
    server = pair.serve("--once")
    result = pair.sparkdiag(
        pair.client, "link", "test", pair.server_ip, "--duration", "0.5", "--no-tools"
    )
    server.wait(timeout=30)
    assert result.returncode in (0, 1), result.stderr
    out = result.stdout
    assert f"{pair.client_if} {pair.client_ip} -> {pair.server_ip} ({pair.server_if})" in out
    assert "negotiated 10.0 Gb/s, MTU 1500" in out
    assert "iperf3 not run (--no-tools)" in out
    assert out.rstrip().splitlines()[-1].startswith("verdict: ")


def test_a_refused_port(pair: Pair) -> None:
    result = pair.sparkdiag(pair.client, "link", "test", pair.server_ip, "--port", "10949")
    assert_clean_error(
        result, 3, f"{pair.server_ip}:10949 refused the connection", "sparkdiag link serve"
    )
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_unreachable_peer(pair: Pair) -> None:
    nobody = pair.server_ip.rsplit(".", 1)[0] + ".99"
    result = pair.sparkdiag(pair.client, "link", "test", nobody, "--connect-timeout", "2")
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1
    assert line.startswith(f"Error: {nobody}:10943 ")
    assert "unreachable" in line or "did not answer within 2 s" in line


def test_a_peer_not_running_the_listening_side(pair: Pair) -> None:
    # another service on the port: it greets like an SSH server
    script = (
        "import socket; s = socket.create_server(('0.0.0.0', 10943)); print('up', flush=True)\n"
        "while True:\n c, _ = s.accept(); c.sendall(b'SSH-2.0-OpenSSH_9.6\\r\\n'); c.close()"
    )
    other = subprocess.Popen(
        pair.argv(pair.server, sys.executable, "-c", script), stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "up"
        result = pair.sparkdiag(pair.client, "link", "test", pair.server_ip)
    finally:
        other.kill()
        other.wait()
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
    server.terminate()
    server.wait(timeout=30)
    assert_clean_error(result, 3, f"{pair.client_if} has no carrier", "NO-CARRIER")
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_interface_that_does_not_exist(pair: Pair) -> None:
    result = pair.sparkdiag(pair.client, "link", "test", pair.server_ip, "--interface", "eth9")
    assert_clean_error(result, 2, "'--interface'", "eth9: no such interface here", pair.client_if)


def test_a_peer_name_that_does_not_resolve(pair: Pair) -> None:
    # a name with spaces fails in the resolver itself (EAI_NONAME), without asking any DNS
    result = pair.sparkdiag(pair.client, "link", "test", "no such host")
    assert_clean_error(result, 2, "'no such host': not an address, and no such host name")


def test_a_busy_listening_side(pair: Pair) -> None:
    """A second measuring machine is turned away while a session runs."""
    server = pair.serve()
    first = subprocess.Popen(
        pair.argv(pair.client, *sparkdiag_cmd("link", "test", pair.server_ip, "--duration", "3")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(100):
            second = pair.sparkdiag(pair.client, "link", "test", pair.server_ip)
            if second.returncode == 3 and "busy" in second.stderr:
                break
        else:
            pytest.fail("the second test was never turned away as busy")
        assert_clean_error(second, 3, "busy: a test from", "try again when it is done")
    finally:
        first.wait(timeout=60)
        server.terminate()
        server.wait(timeout=30)
    assert server.returncode == 0, "SIGTERM between sessions ends link serve with 0"


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


def test_check_with_a_peer(pair: Pair) -> None:
    server = pair.serve("--once")
    _, rows = _check(pair, pair.server_ip)
    server.wait(timeout=60)
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


def test_check_with_a_peer_that_refuses(pair: Pair) -> None:
    result, rows = _check(pair, f"{pair.server_ip}:10949")
    peer = rows[1]
    assert peer["status"] == "fail"
    assert peer["finding"].startswith(f"{pair.server_ip}:10949 refused the connection")
    assert result.returncode == 3  # errors.Exit.FAILED: at least one check failed
