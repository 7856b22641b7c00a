"""The session after the proofs (protocol 3): before, only the challenge and response were
authenticated, and a man in the middle who relayed them could rewrite the server's hello (its
addresses: the data connections went to his machine) or any later request or answer (a
``result``: the measurement falsified). Now both sides derive a session key from the secret and
the two nonces and every control line from the hello on carries a mac under it, over a count
of lines each side keeps (:class:`sparkdiag.link.wire.Sealed`): a line altered, replayed,
dropped or sent without its mac ends the session with a line that says so, on both sides.

The man in the middle is :class:`Relay`, a TCP relay of the control connection that passes
every line through a function of (which side sent it, its index on that side, the line)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sparkdiag.link import auth, bounds
from sparkdiag.link.client import LinkError
from sparkdiag.link.server import LinkServer
from sparkdiag.link.session import open_control
from sparkdiag.link.wire import VERSION, LineReader, encode, send
from tests.test_link_hostile import connect, fake_peer, prove, running, wait_for
from tests.test_link_units import SECRET

# Lines on the control connection as the relay counts them: the client's 0 is its opening and
# 1 its proof, so its request n (its mac's count) is line n + 2; the server's 0 is its
# challenge and 1 its hello (its mac's count 0), so its answer to request n is line n + 2.
HELLO = 1
FIRST = 2

Tamper = Callable[[str, int, bytes], list[bytes]]


class Relay:
    """Accepts one connection and relays it to ``port`` on 127.0.0.1, each whole line through
    ``tamper(side, index, line)`` ("client" or "server", counted from 0 on each side), which
    returns the lines to pass on instead: none drops it, two replay it."""

    def __init__(self, port: int, tamper: Tamper) -> None:
        self.port = port
        self.tamper = tamper
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.threads = [threading.Thread(target=self._run, daemon=True)]
        self.threads[0].start()

    @property
    def address(self) -> int:
        port: int = self.listener.getsockname()[1]
        return port

    def _run(self) -> None:
        with contextlib.suppress(OSError):
            near, _ = self.listener.accept()
            far = socket.create_connection(("127.0.0.1", self.port), 5)
            pumps = [
                threading.Thread(target=self._pump, args=(near, far, "client"), daemon=True),
                threading.Thread(target=self._pump, args=(far, near, "server"), daemon=True),
            ]
            for pump in pumps:
                pump.start()
            for pump in pumps:
                pump.join(30)
            near.close()
            far.close()

    def _pump(self, source: socket.socket, sink: socket.socket, side: str) -> None:
        held, index = b"", 0
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                held += data
                while b"\n" in held:
                    line, _, held = held.partition(b"\n")
                    for out in self.tamper(side, index, line + b"\n"):
                        sink.sendall(out)
                    index += 1
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()
        self.threads[0].join(10)


@contextlib.contextmanager
def relayed(server: LinkServer, tamper: Tamper) -> Iterator[int]:
    """The port of a :class:`Relay` to ``server``'s; the server left idle afterwards."""
    relay = Relay(server.port, tamper)
    try:
        yield relay.address
    finally:
        relay.close()
        wait_for(lambda: not server.busy)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[LinkServer, list[str]]]:
    """A listening side on 127.0.0.1, with what it says."""
    with running(LinkServer, tmp_path) as (server, _):
        said: list[str] = []
        server.say = said.append
        yield server, said


def on(side: str, index: int, change: Callable[[bytes], list[bytes]]) -> Tamper:
    """A tamper that applies ``change`` to line ``index`` of ``side`` only."""

    def tamper(who: str, at: int, line: bytes) -> list[bytes]:
        return change(line) if (who, at) == (side, index) else [line]

    return tamper


def flip(old: bytes, new: bytes) -> Callable[[bytes], list[bytes]]:
    """One value of a line changed: ``old``, which must be there, becomes ``new``."""

    def change(line: bytes) -> list[bytes]:
        assert old in line, line[:300]
        return [line.replace(old, new, 1)]

    return change


def test_the_relay_alone_changes_nothing_and_every_line_after_the_proofs_is_sealed(
    served: tuple[LinkServer, list[str]],
) -> None:
    """The stand-in man in the middle, passing every line: the session works through it, and
    every control line from the hello on, both ways, carries its mac (before: none did)."""
    server, _ = served
    seen: list[tuple[str, int, bytes]] = []

    def watch(side: str, index: int, line: bytes) -> list[bytes]:
        seen.append((side, index, line))
        return [line]

    with relayed(server, watch) as port:
        control = open_control("127.0.0.1", port, 3.0, SECRET)
        ready = control.ask({"op": "sink", "test": "t1", "streams": 1, "seconds": 1})
        assert ready == {"ok": True}
        assert control.ask({"op": "bye"}) == {"ok": True}
        control.sock.close()
    assert control.hello["host"] == socket.gethostname() and auth.MAC not in control.hello
    sealed = {(side, index) for side, index, line in seen if b'"mac":"' in line}
    assert sealed == {("server", 1), ("server", 2), ("server", 3), ("client", 2), ("client", 3)}


def test_a_hello_with_an_address_altered_on_the_way_is_refused(
    served: tuple[LinkServer, list[str]],
) -> None:
    """One byte of the hello's interface address (where the data connections would go)
    changed after the proofs: before, the client took it and measured the other path."""
    server, _ = served
    with (
        relayed(server, on("server", HELLO, flip(b'"127.0.0.1/8"', b'"127.0.0.9/8"'))) as port,
        pytest.raises(LinkError) as caught,
    ):
        open_control("127.0.0.1", port, 3.0, SECRET)
    said = str(caught.value)
    assert "session refused: the server's line 0 does not match its mac" in said, said
    assert "something between the two machines alters" in said


def test_a_request_altered_on_the_way_is_refused_by_the_server(
    served: tuple[LinkServer, list[str]],
) -> None:
    """The client asks for 4 streams, the server is made to read 5: it ends the session and
    says why on both sides, and sets nothing up."""
    server, said = served
    altered = on("client", FIRST, flip(b'"streams":4', b'"streams":5'))
    with relayed(server, altered) as port:
        control = open_control("127.0.0.1", port, 3.0, SECRET)
        with pytest.raises(LinkError) as caught:
            control.ask({"op": "sink", "test": "t1", "streams": 4, "seconds": 1})
        control.sock.close()
    assert "ended the session: the client's line 0 does not match its mac" in str(caught.value)
    wait_for(lambda: any("ended after" in line for line in said))
    assert any("refused: the client's line 0 does not match its mac" in x for x in said), said


def test_a_result_altered_on_the_way_is_refused_by_the_client(
    served: tuple[LinkServer, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The byte count of a ``result`` rewritten: before, the figure was taken."""
    server, _ = served
    monkeypatch.setattr(bounds, "RESULT_WAIT", 0.05)
    with relayed(server, on("server", FIRST + 1, flip(b'"bytes":0', b'"bytes":9'))) as port:
        control = open_control("127.0.0.1", port, 3.0, SECRET)
        control.ask({"op": "sink", "test": "t1", "streams": 1, "seconds": 1})
        with pytest.raises(LinkError, match="session refused: the server's line 2 does not"):
            control.ask({"op": "result", "test": "t1"})
        control.sock.close()


def _twice(line: bytes) -> list[bytes]:
    return [line, line]


def _dropped(line: bytes) -> list[bytes]:
    return []


@pytest.mark.parametrize(
    ("side", "change", "said"),
    [
        # the server takes the first request twice: the second is its line 1, with the mac of 0
        ("client", _twice, "ended the session: the client's line 1 does not match its mac"),
        # the first request never arrives: the second comes as line 0, with the mac of 1
        ("client", _dropped, "ended the session: the client's line 0 does not match its mac"),
        # the client reads the first answer again as the answer to the second
        ("server", _twice, "session refused: the server's line 2 does not match its mac"),
        # the first answer never arrives: the second comes as line 1, with the mac of 2
        ("server", _dropped, "session refused: the server's line 1 does not match its mac"),
    ],
    ids=["request-replayed", "request-dropped", "answer-replayed", "answer-dropped"],
)
def test_a_control_line_replayed_or_dropped_is_refused(
    served: tuple[LinkServer, list[str]],
    side: str,
    change: Callable[[bytes], list[bytes]],
    said: str,
) -> None:
    """Each line's mac covers its count on its side, which is not sent but kept by both: a
    replayed line, or the line after a dropped one, comes at the wrong count."""
    server, _ = served
    with relayed(server, on(side, FIRST, change)) as port:
        control = open_control("127.0.0.1", port, 3.0, SECRET)
        with contextlib.suppress(TimeoutError):  # the dropped one is never answered
            assert control.ask({"op": "result", "test": "t1"}, timeout=1.0) == {
                "error": "no such test"
            }
        with pytest.raises(LinkError) as caught:
            control.ask({"op": "result", "test": "t2"}, timeout=5.0)
        control.sock.close()
    assert said in str(caught.value), str(caught.value)


def test_a_request_without_a_mac_after_the_proofs_is_refused(
    served: tuple[LinkServer, list[str]],
) -> None:
    """What protocol 2 took, a plain request once the proofs were through, ends the session."""
    server, said = served
    with connect(server) as sock:
        channel, hello = prove(sock)
        assert hello["host"] == socket.gethostname() and auth.MAC not in hello
        send(sock, {"op": "result", "test": "t1"})
        answer = channel.read(5)
        assert answer == {"refused": "the client's line 0 came without its mac"}
        sock.settimeout(5)
        assert sock.recv(10) == b""  # and closed
    wait_for(lambda: not server.busy)
    assert any("refused: the client's line 0 came without its mac" in x for x in said), said


def test_a_hello_without_a_mac_is_refused() -> None:
    """A listening side that proves the secret but seals nothing (or a relay that strips the
    mac) opens no session."""

    def unsealed(theirs: str, mine: str) -> bytes:
        proof = auth.proof(SECRET, "server", theirs, mine)
        return encode({"sparkdiag-link": VERSION, "proof": proof, "session": "s", "host": "h"})

    with fake_peer(unsealed) as port, pytest.raises(LinkError) as caught:
        open_control("127.0.0.1", port, 3.0, SECRET)
    assert "session refused: the server's line 0 came without its mac" in str(caught.value)


def test_a_line_of_another_session_is_refused(served: tuple[LinkServer, list[str]]) -> None:
    """The key is the session's (both nonces are fresh): a request sealed in one session, with
    the right count, does not pass in the next."""
    server, _ = served
    with connect(server) as first:
        channel, _ = prove(first)
        recorded = encode(channel.seal({"op": "result", "test": "t1"}))
    wait_for(lambda: not server.busy)
    with connect(server) as second:
        channel, _ = prove(second)
        second.sendall(recorded)
        assert channel.read(5) == {
            "refused": "the client's line 0 does not match its mac (altered on the way, or "
            "replayed, reordered or one before it dropped)"
        }


def test_a_protocol_2_client_is_told_both_sides_must_run_the_same_sparkdiag(
    served: tuple[LinkServer, list[str]],
) -> None:
    """It gets one line (and nothing of the host: it proved nothing); the terminal hears."""
    server, said = served
    with connect(server) as sock:
        send(sock, {"sparkdiag-link": 2, "kind": "control", "nonce": auth.nonce()})
        answer = LineReader(sock).read(5)
    assert answer == {
        "sparkdiag-link": VERSION,
        "error": f"refused: it speaks sparkdiag-link protocol 2, this link serve {VERSION}: "
        "both sides must run the same sparkdiag",
    }
    # said after the answer is sent: waited for (read at once, it raced under -n 2)
    wait_for(
        lambda: any(
            "both sides must run the same sparkdiag (update the older one)" in x for x in said
        )
    )
    assert not server.busy


def _refused_by_a_server_that(answers: dict[str, object] | None) -> str:
    """What ``open_control`` says of a server that reads the opening and sends ``answers``
    (None: closes without a word)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                LineReader(conn).read(5)
                if answers is not None:
                    send(conn, answers)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with pytest.raises(LinkError) as caught:
            open_control("127.0.0.1", listener.getsockname()[1], 3.0, SECRET)
    finally:
        listener.close()
        thread.join(5)
    return str(caught.value)


def test_a_protocol_2_server_is_said_to_need_the_same_sparkdiag() -> None:
    """A link serve of protocol 2 closes on this opening without a word: before, that read as
    "another service listens on that port"."""
    said = _refused_by_a_server_that(None)
    assert "closed the connection at once" in said
    assert "both sides must run the same sparkdiag" in said
    assert "another service listens" not in said


def test_a_server_of_another_protocol_is_named_with_it() -> None:
    said = _refused_by_a_server_that({"sparkdiag-link": 4, "error": "refused"})
    assert (
        f"of another sparkdiag (protocol 4, this one speaks {VERSION}): both sides must run the "
        "same sparkdiag"
    ) in said
