"""The link test's parts one by one: the address table, the tools' output, the verdict, peer
names and bad answers, and a whole session on loopback (in this process) where loopback is
dressed as a ConnectX-7 function, so that the iperf3 and ib_write_bw legs run (ib_write_bw as a
stand-in script: there is no RDMA hardware here)."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkdiag.errors import SparkdiagError, UsageError
from sparkdiag.link import session as session_module
from sparkdiag.link import tools
from sparkdiag.link.client import LinkError, Options, measure_link
from sparkdiag.link.model import End, Throughput
from sparkdiag.link.server import LinkServer, listen_socket
from sparkdiag.link.session import open_control, resolve, split_peer
from sparkdiag.link.verdict import judge, pcie_gbps
from sparkdiag.snapshot import PcieLink
from sparkdiag.sources.host.netif import (
    interface_addresses,
    interface_of,
    parse_addr_dump,
    plain_address,
)
from tests.support import ROOTFS

STANDINS = Path(__file__).parent / "support" / "link_scripts"
SECRET = b"0123456789abcdef" * 4  # the link secret both sides hold
# A DGX Spark ConnectX-7 interface: 200 GbE on PCIe Gen5 x4 (126 Gb/s), MTU 9000.
SPARK_END = End("enp1s0f1np1", "192.168.200.13", 9000, 200000, 126.03, None, True, ("rocep1s0f1",))


def _addr_message(index: int, family: int, prefix: int, raw: bytes) -> bytes:
    attr = struct.pack("=HH", 4 + len(raw), 2) + raw  # IFA_LOCAL
    attr += b"\0" * ((4 - len(attr) % 4) % 4)
    body = struct.pack("=BBBBI", family, prefix, 0, 0, index) + attr
    return struct.pack("=IHHII", 16 + len(body), 20, 2, 1, 0) + body  # RTM_NEWADDR


def test_rtnetlink_address_dump_is_parsed() -> None:
    dump = _addr_message(2, socket.AF_INET, 24, bytes([192, 168, 200, 13]))
    dump += _addr_message(3, socket.AF_INET6, 64, ipaddress.IPv6Address("fd00::2").packed)
    dump += struct.pack("=IHHII", 16, 3, 2, 1, 0)  # NLMSG_DONE
    found = parse_addr_dump(dump, {2: "enp1s0f1np1", 3: "eth0"})
    assert [(a.interface, str(a.network)) for a in found] == [
        ("enp1s0f1np1", "192.168.200.13/24"),
        ("eth0", "fd00::2/64"),
    ]
    assert interface_of("::ffff:192.168.200.13", found) == "enp1s0f1np1"
    assert plain_address("::ffff:10.0.0.1") == "10.0.0.1"


def test_this_machine_has_loopback_in_its_address_table() -> None:
    assert interface_of("127.0.0.1", interface_addresses()) == "lo"


def test_iperf3_and_ib_write_bw_output() -> None:
    doc = {"end": {"sum_received": {"bits_per_second": 92.57e9}}}
    assert tools.parse_iperf3(json.dumps(doc)) == (92.57, None)
    assert tools.parse_iperf3('{"error": "unable to connect to server"}') == (
        None,
        "iperf3: unable to connect to server",
    )
    assert tools.parse_iperf3("iperf3: error")[0] is None
    # the client output NVIDIA's DGX Spark guide quotes (five rows, --run_infinitely)
    guide = """ #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]    MsgRate[Mpps]
 65536      882805           0.00               92.57                0.176554
 65536      882791           0.00               92.56                0.176552
"""
    assert tools.parse_ib_write_bw(guide) == 92.56
    assert tools.parse_ib_write_bw("Couldn't connect to 192.168.200.12:12000") is None
    assert tools.ib_write_bw("rocep1s0f0", 12000, 5, "192.168.200.12") == [
        "ib_write_bw",
        "-d",
        "rocep1s0f0",
        "-i",
        "1",
        "-p",
        "12000",
        "-F",
        "--report_gbits",
        "-q",
        "4",
        "-D",
        "5",
        "192.168.200.12",
    ]


def test_pcie_gen5_x4_carries_126_gbps() -> None:
    link = PcieLink("0000:01:00.1", "network", "mlx5_core", 32e9, 32e9, 4, 4)
    assert round(pcie_gbps(link) or 0, 2) == 126.03
    assert SPARK_END.ceiling_gbps == 126.03  # below the 200 GbE it negotiates


def _tcp(to: float | None, back: float | None) -> list[Throughput]:
    return [
        Throughput("tcp-sockets", "to-peer", to, 3),
        Throughput("tcp-sockets", "from-peer", back, 3),
    ]


def test_verdicts_against_the_public_spark_figures() -> None:
    # NVIDIA's guide: 92.57 and 97.28 Gb/s per rail, healthy
    verdict, finding, cause, _ = judge(SPARK_END, SPARK_END, _tcp(92.57, 97.28))
    assert (verdict, cause) == ("fit", None)
    assert finding.endswith("73% of the 126.0 Gb/s ceiling")
    # dgx-spark-playbooks PR #108: 12.86 Gb/s TCP on links at 200 GbE / Gen5 x4
    verdict, finding, cause, action = judge(SPARK_END, SPARK_END, _tcp(12.86, 13.5))
    assert verdict == "degraded" and finding.endswith("10% of the 126.0 Gb/s ceiling")
    assert cause is not None and cause.startswith("the degraded ConnectX-7 initialization state")
    assert "unplug each one's USB-C power" in action
    # the same rate behind an MTU of 1500 and a healthy-looking link: above the band
    low_mtu = End(**{**SPARK_END.__dict__, "mtu": 1500})
    _, _, cause, action = judge(low_mtu, SPARK_END, _tcp(40.0, 41.0))
    assert cause is not None and cause.startswith("MTU 1500 on enp1s0f1np1 (this machine)")
    narrow = End(**{**SPARK_END.__dict__, "pcie_gbps": 63.0, "pcie_short": "x2 of x4"})
    _, _, cause, _ = judge(SPARK_END, narrow, _tcp(12.0, 12.0))
    assert cause == "the PCIe link behind enp1s0f1np1 on the peer trained at x2 of x4"


def test_one_direction_decides_and_nothing_measured_fails() -> None:
    verdict, finding, _, _ = judge(SPARK_END, SPARK_END, _tcp(95.0, 14.0))
    assert verdict == "degraded" and "from peer 14.0 Gb/s" in finding
    verdict, finding, _, _ = judge(
        SPARK_END,
        SPARK_END,
        [
            Throughput("tcp-sockets", "to-peer", None, 3, error="data connection: reset"),
        ],
    )
    assert (verdict, finding) == ("failed", "nothing measured: data connection: reset")
    verdict, _, _, _ = judge(End("lo"), End("lo"), _tcp(5.0, 5.0))
    assert verdict == "unrated"


def test_peer_names() -> None:
    assert split_peer("spark-2") == ("spark-2", 10943)
    assert split_peer("spark-2:12000") == ("spark-2", 12000)
    assert split_peer("[fd00::1]:12000") == ("fd00::1", 12000)
    assert split_peer("fd00::1") == ("fd00::1", 10943)
    with pytest.raises(UsageError, match="give HOST or HOST:PORT"):
        split_peer("spark-2:99999")


@pytest.mark.parametrize(
    "text", ["[::1]x", "[::1]12000", "[::1", "127.0.0.1:", "[::1]:", "spark-2:", ":12000"]
)
def test_a_peer_with_text_after_its_bracket_or_an_empty_port_is_refused(text: str) -> None:
    """``[::1]x`` was taken as ``::1`` and ``127.0.0.1:`` as ``127.0.0.1`` (the review of
    2026-12): after ``]`` only nothing or ``:PORT``, and a ``:`` needs its port."""
    with pytest.raises(UsageError, match="give HOST or HOST:PORT") as caught:
        split_peer(text, "PEER")
    assert caught.value.flag == "PEER"


def test_a_bracketed_ipv6_peer_with_or_without_a_port() -> None:
    assert split_peer("[::1]") == ("::1", 10943)
    assert split_peer("[::1]:12000") == ("::1", 12000)
    assert split_peer("::1") == ("::1", 10943)


@pytest.mark.parametrize("text", ["[::1]x", "127.0.0.1:"])
def test_link_test_refuses_such_a_peer_as_a_usage_error(tmp_path: Path, text: str) -> None:
    from tests.support import assert_clean_error, invoke_cli

    result = invoke_cli("link", "test", text, "--address-only", *_secret_args(tmp_path))
    assert_clean_error(result, 2, "PEER", "give HOST or HOST:PORT")


def test_a_listen_host_that_does_not_exist_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``link serve --listen nonexistent.invalid:20011`` exited 3, "cannot run", as if the
    port were taken: a name that does not exist is --listen's bad value, exit 2, and no secret
    file is made. A resolver that cannot answer now is still exit 3."""
    from tests.support import assert_clean_error, invoke_cli

    real = socket.getaddrinfo

    def lookup(host: object, *args: object, **kwargs: object) -> object:
        if host == "nonexistent.invalid":  # whatever this machine's resolver says of it
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        if host == "later.example":
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    secret = tmp_path / "conf" / "link.secret"
    result = invoke_cli(
        "link", "serve", "--listen", "nonexistent.invalid:20011", "--link.secret-file", str(secret)
    )
    assert_clean_error(result, 2, "--listen", "'nonexistent.invalid': not an address of this")
    assert not secret.exists()
    with pytest.raises(UsageError):
        listen_socket("a" * 64 + ".example", 20011)
    with pytest.raises(SparkdiagError, match="cannot be looked up now") as caught:
        listen_socket("later.example", 20011)
    assert caught.value.exit_code == 3


def test_a_name_that_does_not_resolve_is_bad_input_and_no_dns_is_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def nxdomain(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", nxdomain)
    with pytest.raises(UsageError, match="no such host name"):
        resolve("spark-9", 10943)

    def no_dns(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(LinkError, match="cannot be resolved now") as caught:
        resolve("spark-9", 10943)
    assert caught.value.exit_code == 3


def test_a_silent_service_on_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "HELLO_TIMEOUT", 0.3)
    silent = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()
    port = silent.getsockname()[1]
    try:
        with pytest.raises(
            LinkError, match=r"accepted the connection but sent nothing within 0\.3 s"
        ):
            open_control("127.0.0.1", port, 2.0, SECRET)
    finally:
        for conn in accepted:
            conn.close()
        silent.close()


def _loopback_as_cx7(root: Path) -> Path:
    """A sysfs tree where ``lo`` is the interface of a ConnectX-7 function with an RDMA
    device, so that both sides of a loopback session take the ConnectX-7 paths."""
    function = root / "devices/pci0000:00/0000:00:00.0/0000:01:00.1"
    (function / "net/lo").mkdir(parents=True)
    for name, value in (
        ("mtu", "9000"),
        ("speed", "200000"),
        ("carrier", "1"),
        ("operstate", "unknown"),
    ):
        (function / "net/lo" / name).write_text(value + "\n")
    port = function / "infiniband/rocep1s0f1/ports/1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("Ethernet\n")
    for name, value in (
        ("vendor", "0x15b3"),
        ("device", "0x1021"),
        ("class", "0x020000"),
        ("current_link_speed", "32.0 GT/s PCIe"),
        ("max_link_speed", "32.0 GT/s PCIe"),
        ("current_link_width", "4"),
        ("max_link_width", "4"),
    ):
        (function / name).write_text(value + "\n")
    (root / "bus/pci/devices").mkdir(parents=True)
    (root / "bus/pci/devices/0000:01:00.1").symlink_to(
        "../../../devices/pci0000:00/0000:00:00.0/0000:01:00.1"
    )
    (root / "class/net").mkdir(parents=True)
    (root / "class/net/lo").symlink_to("../../devices/pci0000:00/0000:00:00.0/0000:01:00.1/net/lo")
    return root


@pytest.fixture
def loopback_server(tmp_path: Path) -> Iterator[tuple[LinkServer, Path]]:
    sysfs = _loopback_as_cx7(tmp_path / "sysfs")
    server = LinkServer(listen_socket("127.0.0.1", 0), sysfs, ROOTFS / "native", {}, SECRET)
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    yield server, sysfs
    stop.set()
    thread.join(5)
    server.close()


def test_a_whole_session_with_every_method(
    loopback_server: tuple[LinkServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, sysfs = loopback_server
    monkeypatch.setenv("PATH", f"{STANDINS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_IB_GBPS", "97.28")
    seen: list[str] = []
    report = measure_link(
        "127.0.0.1",
        Options(port=server.port, seconds=0.5, streams=2, secret=SECRET),
        sysfs,
        ROOTFS / "native",
        {},
        progress=seen.append,
    )
    (path,) = report.paths
    assert (path.local.interface, path.local.cx7, path.local.rdma) == ("lo", True, ("rocep1s0f1",))
    assert path.peer.cx7 and path.peer.speed_mbps == 200000 and path.peer.pcie_gbps
    methods = {(t.method, t.direction) for t in path.throughput if t.gbps}
    expected = {"tcp-sockets", "ib_write_bw"} | (
        {"iperf3"} if tools.installed()["iperf3"] else set()
    )
    assert methods == {(m, d) for m in expected for d in ("to-peer", "from-peer")}, path.throughput
    assert report.tools["ib_write_bw"] == "ran"
    ib = [t.gbps for t in path.throughput if t.method == "ib_write_bw"]
    assert ib == [97.28, 97.28]
    assert path.verdict == "fit"  # the stand-in's 97.28 of the 126 Gb/s PCIe ceiling
    assert report.peer_host == socket.gethostname()
    assert any("ib_write_bw from peer" in line for line in seen)
    doc = report.as_json()
    assert doc["format"] == "sparkdiag-link-test/1" and doc["exit_status"] == 0
    json.dumps(doc)


def test_a_budget_bounds_the_run(loopback_server: tuple[LinkServer, Path]) -> None:
    server, sysfs = loopback_server
    options = Options(
        port=server.port, seconds=1.0, streams=1, use_tools=False, budget=1.8, secret=SECRET
    )
    report = measure_link("127.0.0.1", options, sysfs, ROOTFS / "native", {})
    (path,) = report.paths
    assert len(path.throughput) == 1 and path.throughput[0].direction == "to-peer"
    assert path.notes == ("tcp-sockets from-peer not run: the 1.8 s bound",)
    assert report.tools == {"iperf3": "not run (--no-tools)", "ib_write_bw": "not run (--no-tools)"}


def _secret_args(tmp_path: Path) -> list[str]:
    path = tmp_path / "link.secret"
    path.write_text("0123456789abcdef" * 4 + "\n")
    path.chmod(0o600)
    return ["--link.secret-file", str(path)]


def test_link_test_takes_host_colon_port_as_check_peer_does(tmp_path: Path) -> None:
    """Found in a review: 'link test 127.0.0.1:10943' said "not an address, and no such host
    name" where 'check --peer' takes HOST:PORT. The port in PEER is the one connected to (9
    refuses here); with --port as well, they must agree."""
    from tests.support import assert_clean_error, invoke_cli

    quick = ["--address-only", "--connect-timeout", "2", *_secret_args(tmp_path)]
    for extra in ([], ["--port", "9"]):
        result = invoke_cli("link", "test", "127.0.0.1:9", *extra, *quick)
        assert_clean_error(result, 3, "127.0.0.1:9 refused the connection")
    six = invoke_cli("link", "test", "[::1]:9", *quick)
    assert six.returncode in (2, 3) and "no such host name" not in six.stderr, six.stderr
    both = invoke_cli("link", "test", "127.0.0.1:9", "--port", "10", *quick)
    assert_clean_error(both, 2, "PEER gives port 9 and --port 10")
    bad = invoke_cli("link", "test", "127.0.0.1:99999", *quick)
    assert_clean_error(bad, 2, "PEER", "give HOST or HOST:PORT")
