"""The hello that follows the proof (the review of 2026-12): ``link serve`` read the CUDA attributes
(a subprocess that calls cuInit, up to 20 s) in every session, after the peer's proof and before
its hello, and ``link test`` waited 5 s for that hello and then said the peer was "not 'sparkdiag
link serve'". The server now reads them once, in the background from its start; the client waits
longer than the CUDA timeout after its proof, and says what happened when even that runs out.

``HELLO_TIMEOUT`` is made 1 s here so that a hello 2 s late stands for one 20 s late."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sparkdiag.link import readings
from sparkdiag.link import session as session_module
from sparkdiag.link.client import LinkError
from sparkdiag.link.readings import CUDA_TIMEOUT, CudaOnce
from sparkdiag.link.server import LinkServer, listen_socket
from sparkdiag.link.session import open_control
from sparkdiag.link.wire import HELLO_TIMEOUT, VERSION
from tests.test_link_hostile import fake_peer, sealed_hello, start
from tests.test_link_units import SECRET, _loopback_as_cx7

LATE = 2.0  # seconds the hello comes after the proof, past the patched HELLO_TIMEOUT of 1 s


def test_the_client_waits_for_the_hello_longer_than_the_cuda_timeout() -> None:
    assert session_module.HELLO_AFTER_PROOF > CUDA_TIMEOUT + HELLO_TIMEOUT


def test_a_hello_that_comes_late_after_the_proof_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(session_module, "HELLO_TIMEOUT", 1.0)

    def late_hello(theirs: str, mine: str) -> bytes:
        time.sleep(LATE)
        return sealed_hello(theirs, mine, session="s", host="peer")

    with fake_peer(late_hello) as port:
        control = open_control("127.0.0.1", port, 3.0, SECRET)
    assert control.hello["host"] == "peer"
    control.sock.close()


def test_no_hello_after_the_proof_is_said_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    """It sent a sparkdiag challenge and took the proof: it is link serve, and a slow one,
    not "another service on that port"."""
    monkeypatch.setattr(session_module, "HELLO_AFTER_PROOF", 0.5)

    def no_hello(theirs: str, mine: str) -> bytes:
        time.sleep(1.5)
        return b""

    with fake_peer(no_hello) as port, pytest.raises(LinkError) as caught:
        open_control("127.0.0.1", port, 3.0, SECRET)
    said = str(caught.value)
    assert "'sparkdiag link serve' took this machine's proof but sent no hello within 0.5 s" in (
        said
    )
    assert "not 'sparkdiag link serve'" not in said


def test_the_server_reads_the_cuda_attributes_once_not_per_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the real root with a ConnectX-7 (loopback dressed as one), each session asked the
    CUDA attributes after the proof: with them 2 s slow, every session failed as "not link
    serve". Now they are asked once, when serving starts: the first session waits for that
    read (within the client's wait), the next does not wait at all."""
    monkeypatch.setattr(session_module, "HELLO_TIMEOUT", 1.0)
    asked: list[float] = []
    lock = threading.Lock()

    def slow_attributes(**kwargs: object) -> str:
        with lock:
            asked.append(time.monotonic())
        time.sleep(LATE)
        return "not asked: a stand-in"

    monkeypatch.setattr(readings, "cuda_attributes", slow_attributes)
    sysfs = _loopback_as_cx7(tmp_path / "sysfs")
    server = LinkServer(listen_socket("127.0.0.1", 0), sysfs, Path("/"), {}, SECRET)
    stop, thread = start(server)
    took = []
    try:
        for _ in range(2):
            began = time.monotonic()
            control = open_control("127.0.0.1", server.port, 3.0, SECRET)
            took.append(time.monotonic() - began)
            assert control.hello["sparkdiag-link"] == VERSION
            control.ask({"op": "bye"})
            control.sock.close()
            deadline = time.monotonic() + 5
            while server.busy and time.monotonic() < deadline:
                time.sleep(0.02)
    finally:
        stop.set()
        thread.join(5)
        server.close()
    assert len(asked) == 1, asked
    assert took[1] < 1.0, took


def test_cuda_once_reads_once_whoever_asks_first() -> None:
    calls: list[int] = []

    def read() -> str:
        calls.append(1)
        time.sleep(0.2)
        return "read"

    once = CudaOnce(read)
    once.start()
    results = []
    threads = [threading.Thread(target=lambda: results.append(once())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert results == ["read"] * 4 and len(calls) == 1 and once.reads == 1


def test_a_failed_read_of_the_cuda_attributes_is_asked_again_later() -> None:
    """A read that failed (cuInit slow at boot) was kept for the server's whole life, every
    later session's GPUDirect readings spoiled until a restart (found in a review): it is
    asked again after RETRY_SECONDS; an answer is kept."""
    now = [0.0]
    answers = iter(["the CUDA driver did not answer: timed out after 20 s", ()])
    once = readings.CudaOnce(lambda: next(answers), clock=lambda: now[0])
    assert once() == "the CUDA driver did not answer: timed out after 20 s"
    now[0] = readings.RETRY_SECONDS - 1
    assert isinstance(once(), str) and once.reads == 1
    now[0] = readings.RETRY_SECONDS + 1
    assert once() == () and once.reads == 2
    now[0] = 10 * readings.RETRY_SECONDS
    assert once() == () and once.reads == 2
