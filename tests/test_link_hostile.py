"""``sparkdiag link serve`` and ``link test`` under the red team's cases of issue 29, on loopback in
this process (tests/test_link_netns.py has the two-namespace runs): nothing said before the
link secret is proved, in both directions; every bound a client could push (tests, tools,
unproved connections, the session's time); EMFILE survived; a hostile peer's answers (deep JSON,
a 400-digit byte count, impossible ceilings) refused in one line; the protocol fuzzed."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkdiag.descriptors import ACCEPT_PAUSE
from sparkdiag.link import auth, bounds
from sparkdiag.link import server as server_module
from sparkdiag.link.client import LinkError, Options, measure_link
from sparkdiag.link.readings import read_fabric
from sparkdiag.link.server import LinkServer, link_addresses, listen_socket
from sparkdiag.link.session import open_control
from sparkdiag.link.wire import VERSION, LineReader, Sealed, encode, send
from sparkdiag.sources.host.netif import interface_addresses
from tests.support import ROOTFS, SYSFS, invoke_cli, run_cli, sparkdiag_cmd
from tests.support.fuzz import examples
from tests.test_link_units import SECRET, _loopback_as_cx7

NATIVE = ROOTFS / "native"


def start(server: LinkServer) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    return stop, thread


def halt(server: LinkServer, stop: threading.Event, thread: threading.Thread) -> None:
    """``stop`` set, and a connection that wakes ``server``'s accept loop to see it at once (it
    looks between accepts, and every 0.2 s without any: 0.1-0.2 s of each test's teardown)."""
    stop.set()
    with contextlib.suppress(OSError):
        socket.create_connection(("127.0.0.1", server.port), 1).close()
    thread.join(5)


S = TypeVar("S", bound=LinkServer)


@contextlib.contextmanager
def running(kind: type[S], tmp_path: Path) -> Iterator[tuple[S, Path]]:
    """A ``kind`` of listening side on 127.0.0.1 in a thread, over a loopback dressed as a
    ConnectX-7 (its sysfs returned beside it); stopped and closed afterwards."""
    sysfs = _loopback_as_cx7(tmp_path / "sysfs")
    server = kind(listen_socket("127.0.0.1", 0), sysfs, NATIVE, {}, SECRET)
    stop, thread = start(server)
    try:
        yield server, sysfs
    finally:
        halt(server, stop, thread)
        server.close()
    assert not thread.is_alive()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[LinkServer, Path]]:
    with running(LinkServer, tmp_path) as found:
        yield found


def connect(server: LinkServer, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), 10, (source, 0))


def prove(sock: socket.socket, secret: bytes = SECRET) -> tuple[Sealed, dict[str, Any]]:
    """The measuring side's half of the challenge and response, by hand: the control channel
    sealed under the session key, and the answer to the proof (the hello, its mac checked)."""
    reader = LineReader(sock)
    mine = auth.nonce()
    send(sock, {"sparkdiag-link": VERSION, "kind": "control", "nonce": mine})
    challenge = reader.read(5)
    send(sock, {"proof": auth.proof(secret, "client", challenge["challenge"], mine)})
    channel = Sealed(sock, reader, auth.session_key(secret, challenge["challenge"], mine), "client")
    answer = reader.read(5)
    return channel, channel.check(answer) if auth.MAC in answer else answer


def sealed_hello(theirs: str, mine: str, secret: bytes = SECRET, **fields: Any) -> bytes:
    """What a listening side holding ``secret`` answers a proof with, by hand: its proof and
    ``fields``, sealed as its line 0 (``theirs``: the measuring side's nonce, ``mine``: its own)."""
    hello = {"sparkdiag-link": VERSION, "proof": auth.proof(secret, "server", theirs, mine)}
    hello.update(fields)
    key = auth.session_key(secret, mine, theirs)
    return encode({**hello, auth.MAC: auth.mac(key, "server", 0, hello)})


def wait_for(condition: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


# -- nothing is said or measured before the secret is proved ---------------------------------------


def test_before_the_proof_only_a_challenge_is_said(served: tuple[LinkServer, Path]) -> None:
    server, _ = served
    with connect(server) as sock:
        reader = LineReader(sock)
        send(sock, {"sparkdiag-link": VERSION, "kind": "control", "nonce": auth.nonce()})
        first = reader.read(5)
        assert set(first) == {"sparkdiag-link", "challenge"}  # no host, interface, tool, lint
        assert not server.busy
        send(sock, {"proof": "0" * 64})
        refused = reader.read(5)
        assert refused["error"].startswith("authentication failed")
        assert set(refused) == {"sparkdiag-link", "error"}
        assert sock.recv(10) == b""  # and closed
    assert not server.busy


def test_a_proof_of_other_characters_is_refused_as_any_wrong_proof(
    served: tuple[LinkServer, Path],
) -> None:
    """64 non-ASCII characters made compare_digest raise TypeError: the session ended without
    "authentication failed" and the attempt was never counted (the hostile-client review)."""
    server, _ = served
    with connect(server) as sock:
        reader = LineReader(sock)
        send(sock, {"sparkdiag-link": VERSION, "kind": "control", "nonce": auth.nonce()})
        reader.read(5)
        send(sock, {"proof": "\u00e9" * 64})
        assert reader.read(5)["error"].startswith("authentication failed")
    assert not auth.valid(SECRET, "client", "a", "b", "\u00e9" * 64)


def test_a_protocol_1_hello_learns_nothing(served: tuple[LinkServer, Path]) -> None:
    """What sparkdiag before issue 29 sent: it got the host name, interfaces, tools and lint."""
    server, _ = served
    with connect(server) as sock:
        sock.sendall(b'{"sparkdiag-link": 1, "kind": "control"}\n')
        sock.settimeout(6)
        assert sock.recv(65536) == b""
    assert not server.busy


def test_the_proof_holds_in_both_directions(served: tuple[LinkServer, Path]) -> None:
    server, _ = served
    with pytest.raises(LinkError, match="refused this machine's link secret: the two secret"):
        open_control("127.0.0.1", server.port, 3.0, b"another secret of 32 characters!")
    good = open_control("127.0.0.1", server.port, 3.0, SECRET)
    assert good.hello["host"] == socket.gethostname()
    good.ask({"op": "bye"})
    good.sock.close()
    wait_for(lambda: not server.busy)
    # a listening side that does not hold the secret: the measuring side stops at once
    impostor = LinkServer(
        listen_socket("127.0.0.1", 0),
        SYSFS / "h200-vm",
        NATIVE,
        {},
        b"the impostor's secret, 32 chars!",
    )
    stop, thread = start(impostor)
    try:
        with pytest.raises(LinkError, match="refused this machine's link secret"):
            open_control("127.0.0.1", impostor.port, 3.0, SECRET)
    finally:
        halt(impostor, stop, thread)
        impostor.close()


@contextlib.contextmanager
def fake_peer(last: Callable[[str, str], bytes]) -> Iterator[int]:
    """A listening side speaking the protocol by hand: a challenge, the proof read (not checked),
    then the line ``last(the measuring side's nonce, its own)``; its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                reader = LineReader(conn)
                opening = reader.read(5)
                mine = auth.nonce()
                send(conn, {"sparkdiag-link": VERSION, "challenge": mine})
                reader.read(5)
                conn.sendall(last(opening["nonce"], mine))
                time.sleep(1)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_a_fake_listening_side_cannot_pass_for_the_peer() -> None:
    """It answers the challenge protocol but cannot make the proof: nothing is measured."""

    def made_up(theirs: str, mine: str) -> bytes:
        return encode(
            {"sparkdiag-link": VERSION, "proof": "f" * 64, "session": "x", "host": "evil"}
        )

    with fake_peer(made_up) as port, pytest.raises(LinkError, match="did not prove it holds"):
        open_control("127.0.0.1", port, 3.0, SECRET)


def test_the_secret_file(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "link.secret"
    assert auth.make_secret(path) and not auth.make_secret(path)
    assert (path.stat().st_mode & 0o777, len(auth.read_secret(path))) == (0o600, 64)
    path.chmod(0o644)
    with pytest.raises(auth.UsageError, match=r"is mode 644: its group and other users can read"):
        auth.read_secret(path)
    short = tmp_path / "short"
    short.write_text("abc\n")
    short.chmod(0o600)
    with pytest.raises(auth.UsageError, match="too short"):
        auth.read_secret(short)
    with pytest.raises(auth.UsageError, match=r"no link secret at .*: copy the one"):
        auth.read_secret(tmp_path / "missing")
    with pytest.raises(auth.UsageError, match=r"not a regular file \(a character device\)"):
        auth.read_secret(Path("/dev/zero"))


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        # before: "can be read by other users (mode 602)", of a file only they can write
        (0o602, "is mode 602: other users can write it, and so replace the secret with one they"),
        (0o640, "is mode 640: its group can read it, and so learn the secret"),
        (0o620, "is mode 620: its group can write it, and so replace the secret"),
        (0o646, "is mode 646: its group can read it, other users can read and write it, and so "
                "learn or replace the secret"),
        (0o610, "is mode 610: its group can execute it: chmod 600"),
    ],
    ids=["0602", "0640", "0620", "0646", "0610"],
)  # fmt: skip
def test_a_secret_file_open_to_others_says_who_can_do_what(
    tmp_path: Path, mode: int, said: str
) -> None:
    path = tmp_path / "link.secret"
    path.write_text(SECRET.decode() + "\n")
    path.chmod(mode)
    with pytest.raises(auth.UsageError) as caught:
        auth.read_secret(path)
    assert said in str(caught.value) and str(caught.value).endswith(f"chmod 600 {path}")
    assert "can be read" not in str(caught.value)


def test_a_dangling_link_as_the_secret_file_says_where_it_points(tmp_path: Path) -> None:
    """Before: 'no link secret at LINK: copy the one ... (scp PEER:LINK LINK ...)', as if
    nothing were there; the link is named with where it leads, which does not exist."""
    link = tmp_path / "link.secret"
    link.symlink_to("rotated/secret-2")
    with pytest.raises(auth.UsageError) as caught:
        auth.read_secret(link)
    where = tmp_path / "rotated" / "secret-2"
    assert str(caught.value) == (
        f"{link} is a symbolic link to rotated/secret-2 ({where}), which does not exist: put "
        "the link secret there (the same file as on the peer, mode 0600), or point the link at "
        f"the file that holds it (ln -sfn FILE {link})"
    )
    chain = tmp_path / "chain"
    chain.symlink_to(link)  # a link to that link: where the chain ends is named too
    with pytest.raises(auth.UsageError, match=f"to {link}, which leads to {where}, which does"):
        auth.read_secret(chain)
    # link serve makes no secret through it, and says the same at start (exit 2)
    assert not auth.make_secret(link) and not link.exists()
    free = listen_socket("127.0.0.1", 0)
    port = free.getsockname()[1]
    free.close()
    result = invoke_cli(
        "link", "serve", "--listen", f"127.0.0.1:{port}", "--link.secret-file", str(link)
    )
    assert result.returncode == 2, result.stderr
    assert "is a symbolic link to rotated/secret-2" in result.stderr
    assert "made a new link secret" not in result.stderr and not link.exists()


# -- listening where the link is -------------------------------------------------------------------


def test_the_default_is_the_connectx7_addresses_not_every_address(tmp_path: Path) -> None:
    sysfs = _loopback_as_cx7(tmp_path / "sysfs")
    found = link_addresses(read_fabric(sysfs, NATIVE, {}), interface_addresses())
    assert "127.0.0.1" in found and "0.0.0.0" not in found
    secret = tmp_path / "link.secret"
    result = run_cli(
        "link", "serve", "--path.sysfs", str(SYSFS / "h200-vm"), "--link.secret-file", str(secret)
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "this machine has no ConnectX-7 interface to listen on" in result.stderr
    assert "--listen ADDRESS:PORT" in result.stderr
    spark = run_cli(
        "link", "serve", "--path.sysfs", str(SYSFS / "dgx-spark"), "--link.secret-file", str(secret)
    )
    assert spark.returncode == 2
    assert "the ConnectX-7 interfaces (enp1s0f0np0" in spark.stderr
    assert "have no IP address to listen on" in spark.stderr
    # a refused start leaves nothing behind (before: it made the secret, said so, then exited 2)
    assert "made a new link secret" not in result.stderr + spark.stderr
    assert not secret.exists()


def test_a_port_in_use_is_cannot_start_not_a_bad_value(tmp_path: Path) -> None:
    """Before: exit 3 with "Invalid value for '--listen': ... Address already in use" (worded as
    a usage error), after making the link secret."""
    secret = tmp_path / "link.secret"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = invoke_cli(
            "link", "serve", "--listen", f"127.0.0.1:{port}", "--link.secret-file", str(secret)
        )
    assert result.returncode == 3, result.stderr
    assert result.stderr == (
        f"Error: cannot listen on 127.0.0.1:{port}: the address is already in use (another "
        "'sparkdiag link serve'? stop it, or choose another port with --listen)\n"
    )
    assert not secret.exists()


# -- bounds on what one client can make it hold or spawn -------------------------------------------


def test_tests_per_session_are_bounded(served: tuple[LinkServer, Path]) -> None:
    """Before: 33 -> 664 MiB of RSS from tests registered without limit."""
    server, _ = served
    with connect(server) as sock:
        channel, _ = prove(sock)
        answers = []
        for n in range(200):
            channel.send({"op": "sink", "test": f"t{n}", "streams": 64, "seconds": 60})
            answers.append(channel.read(5))
        assert sum(1 for a in answers if a.get("ok")) == bounds.MAX_TESTS
        assert "at most 4 tests at once" in answers[-1]["error"]
        session = server._session
        assert session is not None and len(session.tests) == bounds.MAX_TESTS


def _children() -> dict[int, str]:
    """pid -> state of this process's children (Z: a zombie)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            found[int(entry.name)] = fields[0]
    return found


@pytest.mark.skipif(not __import__("shutil").which("iperf3"), reason="needs iperf3")
def test_tools_are_bounded_killed_and_reaped(served: tuple[LinkServer, Path]) -> None:
    """Before: 150 iperf3 servers in 4 s, zombies after they were killed."""
    server, _ = served
    before = set(_children())
    with connect(server) as sock:
        channel, _ = prove(sock)
        started = 0
        for _ in range(12):
            channel.send({"op": "tool", "tool": "iperf3", "address": "127.0.0.1", "seconds": 1})
            answer = channel.read(10)
            started += "port" in answer
        assert started == bounds.MAX_TOOLS
        assert "at most 2 tools at once" in answer["error"]
        assert len(set(_children()) - before) == bounds.MAX_TOOLS
        channel.send({"op": "bye"})
        channel.read(5)
    wait_for(lambda: not server.busy)
    wait_for(lambda: not (set(_children()) - before))  # killed and reaped: not even zombies


def test_a_silent_session_ends_and_lets_the_next_one_in(
    served: tuple[LinkServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _ = served
    monkeypatch.setattr(bounds, "CONTROL_IDLE", 0.5)
    holder = open_control("127.0.0.1", server.port, 3.0, SECRET)
    with pytest.raises(LinkError, match="busy"):
        open_control("127.0.0.1", server.port, 3.0, SECRET)
    wait_for(lambda: not server.busy, 5)
    second = open_control("127.0.0.1", server.port, 3.0, SECRET)
    second.sock.close()
    holder.sock.close()


def test_a_busy_session_ends_at_its_total_time(
    served: tuple[LinkServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asking for something every moment keeps it from being idle, not from ending."""
    server, _ = served
    monkeypatch.setattr(bounds, "SESSION_SECONDS", 0.5)
    holder = open_control("127.0.0.1", server.port, 3.0, SECRET)
    ended = time.monotonic() + 10
    with pytest.raises(OSError):  # the connection is shut down under it
        while time.monotonic() < ended:
            answer = holder.ask({"op": "result", "test": "none"}, timeout=5)
            assert answer == {"error": "no such test"}
            time.sleep(0.05)
    wait_for(lambda: not server.busy)
    holder.sock.close()


def test_a_flood_of_silent_connections_does_not_lock_others_out(
    served: tuple[LinkServer, Path],
) -> None:
    """Before: the connection cap filled and every other client was reset."""
    server, sysfs = served
    flood = []
    for _ in range(300):
        flood.append(connect(server, "127.0.0.2"))
        if len(flood) % 16 == 0:  # as fast as the server takes them: past its listen backlog
            # (64) a connection waited a second for its SYN to be sent again, 4 s in all
            wait_for(lambda: not select.select(server.socks, [], [], 0)[0])
    try:
        wait_for(lambda: server.accept_failures == 0 and len(server.pending) > 0)
        assert len(server.pending) <= bounds.MAX_PENDING
        report = measure_link(
            "127.0.0.1",
            Options(port=server.port, seconds=0.3, streams=4, use_tools=False, secret=SECRET),
            sysfs,
            NATIVE,
            {},
        )
        (path,) = report.paths
        assert all(t.gbps for t in path.throughput), path.throughput
    finally:
        for sock in flood:
            sock.close()


def test_out_of_file_descriptors_the_server_goes_on(tmp_path: Path) -> None:
    """Before: accept() raised EMFILE and link serve ended with a traceback."""
    secret = tmp_path / "link.secret"
    secret.write_text(SECRET.decode() + "\n")
    secret.chmod(0o600)
    port = server_module.listen_socket("127.0.0.1", 0)
    number = port.getsockname()[1]
    port.close()

    def few_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))

    proc = subprocess.Popen(
        sparkdiag_cmd(
            "link",
            "serve",
            "--listen",
            f"127.0.0.1:{number}",
            "--path.sysfs",
            str(SYSFS / "h200-vm"),
            "--link.secret-file",
            str(secret),
        ),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=few_files,
    )
    assert proc.stderr is not None
    said: list[str] = []
    ran_out = threading.Event()

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            said.append(line)
            if "out of file descriptors" in line:
                ran_out.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    try:
        assert "listening on" in proc.stderr.readline()
        reader.start()
        flood = []
        for n in range(80):  # twice the descriptors it has, from 8 addresses (16 held each)
            try:
                source = (f"127.0.0.{2 + n % 8}", 0)
                flood.append(socket.create_connection(("127.0.0.1", number), 2, source))
            except OSError:
                break
        # until it says it ran out (a fixed 1 s before), then it must still be there
        assert ran_out.wait(30), "".join(said)
        assert proc.poll() is None, "".join(said)
        for sock in flood:
            sock.close()
        # it serves again: accepted once its pause (at most ACCEPT_PAUSE[1]) ends; before, a
        # fixed ACCEPT_PAUSE[1] + 0.5 s wait came first
        control = open_control("127.0.0.1", number, 3.0 + ACCEPT_PAUSE[1], SECRET)
        control.ask({"op": "bye"})
        control.sock.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if reader.ident is not None:  # started
            reader.join(timeout=30)
    out = "".join(said)
    assert "Traceback" not in out and "out of file descriptors" in out


# -- a hostile peer, seen from 'link test' ---------------------------------------------------------


class Hostile(LinkServer):
    """A listening side that holds the secret and lies in its answers."""

    hello_extra: ClassVar[dict[str, Any]] = {}
    result_extra: ClassVar[dict[str, Any]] = {}

    def _hello(self, session: Any, conn: socket.socket) -> dict[str, Any]:
        return {**super()._hello(session, conn), **self.hello_extra}

    def _request(self, session: Any, request: Any) -> dict[str, Any]:
        answer = super()._request(session, request)
        return {**answer, **self.result_extra} if request.get("op") == "result" else answer


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[tuple[Hostile, Path]]:
    with running(Hostile, tmp_path) as found:
        yield found


def _options(server: LinkServer) -> Options:
    return Options(
        port=server.port,
        seconds=0.3,
        streams=2,
        use_tools=False,
        secret=SECRET,
        directions=("to-peer",),
    )


def test_a_400_digit_byte_count_is_refused_in_one_line(hostile: tuple[Hostile, Path]) -> None:
    server, sysfs = hostile
    server.result_extra = {"bytes": 10**400}
    with pytest.raises(LinkError, match="an integer of 401 digits") as caught:
        measure_link("127.0.0.1", _options(server), sysfs, NATIVE, {})
    assert "\n" not in caught.value.line()


def test_a_byte_count_above_what_was_sent_is_not_believed(hostile: tuple[Hostile, Path]) -> None:
    server, sysfs = hostile
    server.result_extra = {"bytes": 10**30, "seconds": 0.3}
    report = measure_link("127.0.0.1", _options(server), sysfs, NATIVE, {})
    (t,) = report.paths[0].throughput
    assert t.gbps is None and "more than the" in (t.error or "")


def test_a_test_that_more_connections_joined_than_were_opened_is_not_believed(
    hostile: tuple[Hostile, Path],
) -> None:
    """The session's token travels in clear: a machine that read it off the link can join a
    test with a data connection of its own, and the server counts its bytes (found in a review
    of the session macs). Its sealed result says how many connected: more than the test's
    streams is refused, where the figure was taken."""
    server, sysfs = hostile
    server.result_extra = {"connected": 3}
    report = measure_link("127.0.0.1", _options(server), sysfs, NATIVE, {})
    (t,) = report.paths[0].throughput
    assert t.gbps is None and t.error == (
        "3 data connections joined a test of 2: another machine used the session's token; the "
        "figure is not believed"
    )


@pytest.mark.parametrize(
    ("window", "why"),
    [
        (5e-324, "arrived within"),  # was inf Gb/s, and a "fit" verdict
        (1e-9, "arrived within"),
        (0.1, "arrived within"),  # a third of the 0.3 s test
    ],
)
def test_a_window_shorter_than_the_sending_is_not_believed(
    hostile: tuple[Hostile, Path], window: float, why: str
) -> None:
    """A peer that holds the secret says it counted one byte in a sliver of a second: the
    bytes were sent for the whole test, so they arrived across most of it; the figure is
    refused, where it was 8,000 Gb/s or inf (and --json wrote Infinity)."""
    server, sysfs = hostile
    server.result_extra = {"bytes": 1, "seconds": window}
    report = measure_link("127.0.0.1", _options(server), sysfs, NATIVE, {})
    (t,) = report.paths[0].throughput
    assert t.gbps is None and why in (t.error or ""), t
    json.dumps(report.as_json(), allow_nan=False)


def test_a_figure_above_any_link_is_not_believed() -> None:
    from sparkdiag.link.measure import _counted

    gbps, _, error = _counted({"bytes": 10**15, "seconds": 1.0}, 10**15, 1.0)
    assert gbps is None and "more than any link carries" in (error or "")
    assert _counted({"bytes": 10**9, "seconds": 0.9}, 10**9, 1.0)[0] == pytest.approx(8.0 / 0.9)


@pytest.mark.parametrize("ceiling", [1e27, 1e300, 0.0, -5.0, "inf"])
def test_impossible_ceilings_from_the_peer_are_dropped(
    hostile: tuple[Hostile, Path], ceiling: Any
) -> None:
    server, sysfs = hostile
    server.hello_extra = {
        "interfaces": [
            {
                "interface": "lo",
                "addresses": ["127.0.0.1/8"],
                "speed_mbps": ceiling,
                "pcie_gbps": ceiling,
                "mtu": ceiling,
            }
        ]
    }
    report = measure_link("127.0.0.1", _options(server), sysfs, NATIVE, {})
    peer = report.paths[0].peer
    assert (peer.speed_mbps, peer.pcie_gbps, peer.mtu) == (None, None, None)
    assert report.paths[0].local.ceiling_gbps == pytest.approx(126.03, abs=0.01)


def test_deep_json_from_a_peer_is_refused_in_one_line() -> None:
    def deep(theirs: str, mine: str) -> bytes:
        good = auth.proof(SECRET, "server", theirs, mine)
        return (
            b'{"sparkdiag-link": 3, "proof": "'
            + good.encode()
            + b'", "x": '
            + b"[" * 5000
            + b"]" * 5000
            + b"}\n"
        )

    with fake_peer(deep) as port, pytest.raises(LinkError, match="nested too deeply") as caught:
        open_control("127.0.0.1", port, 3.0, SECRET)
    assert "\n" not in caught.value.line()


# -- a fuzz of the protocol ------------------------------------------------------------------------

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.lists(st.integers(0, 9), max_size=3),
)
_request = st.one_of(
    st.fixed_dictionaries(
        {"op": st.sampled_from(["sink", "source", "result", "tool", "bye", "x"])},
        optional={
            "test": st.sampled_from(["t1", "t2", "t3", "t4", "t5", ""]),
            "streams": st.one_of(st.integers(-2, 70), _values),
            "seconds": st.one_of(st.floats(-1, 70, allow_nan=False), _values),
            "tool": st.sampled_from(["iperf3", "ib_write_bw", "sh"]),
            "address": st.sampled_from(["127.0.0.1", "10.0.0.1", ""]),
            "role": st.sampled_from(["client", "server"]),
            "port": _values,
        },
    ),
    st.dictionaries(st.text(max_size=6), _values, max_size=4),
)
_line = st.one_of(
    _request.map(lambda r: json.dumps(r).encode() + b"\n"),
    st.binary(max_size=60).map(lambda b: b + b"\n"),
    st.sampled_from([b"[" * 3000 + b"\n", b"9" * 500 + b"\n", b"NaN\n", b"{}" * 10 + b"\n"]),
)
_opening = st.sampled_from(["proved", "wrong proof", "data", "ping", "garbage", "nothing"])


def _sealed(channel: Sealed, line: bytes) -> bytes:
    """``line`` with the mac a proved client gives it where it is a JSON object (so that the
    fuzz reaches the requests; one without is refused at once), else as it is."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return line
    return encode(channel.seal(message)) if isinstance(message, dict) else line


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(opening=_opening, lines=st.lists(_line, max_size=12))
def test_fuzz_the_protocol(
    served: tuple[LinkServer, Path],
    monkeypatch: pytest.MonkeyPatch,
    opening: str,
    lines: list[bytes],
) -> None:
    """Whatever a client sends, after whatever opening, the server stays up, holds no more than
    its bounds allow, and serves a proper client afterwards. 40 examples, a few seconds."""
    server, _ = served
    monkeypatch.setattr(bounds, "RESULT_WAIT", 0.05)
    with connect(server) as sock:
        sock.settimeout(3)
        channel = None
        try:
            if opening == "proved":
                channel, _ = prove(sock)
            elif opening == "wrong proof":
                prove(sock, b"not the secret, but 32 chars long")
            elif opening in ("data", "ping"):
                sock.sendall(
                    encode(
                        {
                            "sparkdiag-link": VERSION,
                            "kind": opening,
                            "session": "0" * 32,
                            "test": "t1",
                        }
                    )
                )
            elif opening == "garbage":
                sock.sendall(b"\xff\xfe garbage\n")
            for line in lines:
                sock.sendall(line if channel is None else _sealed(channel, line))
                session = server._session
                if session is not None:
                    assert len(session.tests) <= bounds.MAX_TESTS
                    assert len(session.processes) <= bounds.MAX_TOOLS
        except (OSError, LinkError, ValueError):
            pass  # the server may close on it: that is its right
        assert len(server.pending) <= bounds.MAX_PENDING
    wait_for(lambda: not server.busy, 10)
    control = open_control("127.0.0.1", server.port, 3.0, SECRET)
    control.ask({"op": "bye"})
    control.sock.close()
    wait_for(lambda: not server.busy, 10)


def test_the_secret_file_s_path_reaches_the_terminal_escaped(tmp_path: Path) -> None:
    """The new-secret line printed the path's bytes raw: an escape sequence in it set the
    terminal's title (the hostile-client review)."""
    path = tmp_path / "x\x1b]0;PWNED\x07"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        sparkdiag_cmd("link", "serve", "--listen", f"127.0.0.1:{port}",
                      "--link.secret-file", str(path)),
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        said = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert "made a new link secret" in said and "\x1b" not in said and "\\x1b" in said


class _OutOfFiles(LinkServer):
    """A listening side that runs out of descriptors while it writes its hello, as one did
    under a flood with an open-files limit of 40."""

    def _hello(self, session: Any, conn: socket.socket) -> dict[str, Any]:
        raise OSError(errno.EMFILE, "Too many open files")


def test_a_session_that_breaks_after_the_proof_says_so_on_both_sides(tmp_path: Path) -> None:
    """The measuring side said 'another service listens on that port' of a link serve that had
    sent its challenge, and the listening side logged 'ended after 0.0 s' with no reason (the
    hostile-client review)."""
    with running(_OutOfFiles, tmp_path) as (server, _):
        said: list[str] = []
        server.say = said.append
        with pytest.raises(LinkError) as caught:
            open_control("127.0.0.1", server.port, 3.0, SECRET)
        wait_for(lambda: any("ended after" in line for line in said))
    assert "closed the session after this machine's proof" in str(caught.value)
    assert "another service" not in str(caught.value)
    assert any("it failed: [Errno 24] Too many open files" in line for line in said), said
