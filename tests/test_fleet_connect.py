"""``--prometheus-timeout`` is one deadline from the name's lookup to the last byte, however many
addresses the name has (the review of 2026-12): ``socket.create_connection`` gave each address
the whole timeout, and the lookup none. Listeners whose accept queue is full never answer a new
connection (Linux drops its SYN), as an unroutable address does."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sparkdiag.peers.httpget import FetchError, get
from tests.support.fleet import answer, raw_server

TIMEOUT = 1.0


@contextlib.contextmanager
def full_listener() -> Iterator[int]:
    """The port of a listener that accepts nothing and whose backlog is full."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filling = []
    try:
        for _ in range(4):
            client = socket.socket()
            client.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                client.connect(listener.getsockname())
            filling.append(client)
        time.sleep(0.1)
        yield listener.getsockname()[1]
    finally:
        for client in filling:
            client.close()
        listener.close()


def addresses(*ports: int) -> list[tuple[Any, ...]]:
    return [
        (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))
        for port in ports
    ]


def test_several_addresses_that_never_answer_share_one_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three such addresses took three times the timeout; now the first takes it all and the
    others are not tried, and the line says the timeout that was kept."""
    with full_listener() as a, full_listener() as b, full_listener() as c:
        monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kw: addresses(a, b, c))
        started = time.monotonic()
        with pytest.raises(FetchError) as caught:
            get("http://prometheus.example:9090/", {}, TIMEOUT, None, 1 << 20)
        took = time.monotonic() - started
    assert caught.value.kind == "timeout"
    assert str(caught.value) == f"no connection within {TIMEOUT:g} s (1 of its 3 addresses tried)"
    assert took < TIMEOUT + 0.5, took


def test_a_refused_address_leaves_the_time_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused address costs nothing: the next is tried with the time left, and answers."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refused_port = closed.getsockname()[1]
    closed.close()

    def ok(head: bytes, sock: socket.socket) -> None:
        sock.sendall(answer("200 OK", b"{}"))

    with raw_server(ok) as server:
        monkeypatch.setattr(
            socket, "getaddrinfo", lambda *args, **kw: addresses(refused_port, server.port)
        )
        got = get("http://prometheus.example:9090/", {}, TIMEOUT, None, 1 << 20)
    assert got.status == 200 and got.body == b"{}"


def test_a_name_that_takes_too_long_to_resolve_is_cut_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """getaddrinfo takes no timeout: a resolver that did not answer held the query for as
    long as it retried, whatever --prometheus-timeout said."""

    def slow(*args: Any, **kw: Any) -> list[tuple[Any, ...]]:
        time.sleep(3 * TIMEOUT)
        return []

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    started = time.monotonic()
    with pytest.raises(FetchError) as caught:
        get("http://prometheus.example:9090/", {}, TIMEOUT, None, 1 << 20)
    took = time.monotonic() - started
    assert caught.value.kind == "timeout"
    assert str(caught.value) == (
        f"the host name 'prometheus.example' was not resolved within {TIMEOUT:g} s"
    )
    assert took < TIMEOUT + 0.5, took
