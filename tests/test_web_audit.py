"""The audit of 2026-12-01 (issue 23), case by case: nothing a client sends causes a traceback,
an error line or unbounded memory; EMFILE is one warning per episode; unknown users cost what
the slowest user costs; gzip when asked; one render per snapshot shared by concurrent scrapes;
the limits' defaults come from config.OPTIONS only."""

from __future__ import annotations

import errno
import gzip
import http.client
import inspect
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import bcrypt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from sparkdiag.config import DEFAULTS
from sparkdiag.web import scrape, serving
from sparkdiag.web.basicauth import BasicAuth
from sparkdiag.web.http import ExporterServer
from sparkdiag.web.scrape import RenderCache, accepts_gzip, choose_format
from sparkdiag.web.serving import Limits
from sparkdiag.web.webconfig import load_web_config
from tests.support import assert_clean_error, run_cli, tls_web_config
from tests.support import serving as serving_cm
from tests.support.fuzz import examples

WEB = Path(serving.__file__).parent


class Gauges:
    """A collector with a few families, rendered on each collect."""

    def __init__(self) -> None:
        self.collects = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.collects += 1
        family = GaugeMetricFamily("sparkdiag_test", "A test gauge.", labels=["gpu"])
        for gpu in range(200):
            family.add_metric([str(gpu)], float(gpu))
        yield family


def registry_with(collector: Gauges) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    return registry


def request(server: ExporterServer, headers: dict[str, str]) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    conn.request("GET", "/metrics", headers=headers)
    response = conn.getresponse()
    response.body = response.read()  # type: ignore[attr-defined]
    conn.close()
    return response


@pytest.fixture
def quiet(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Fails the test if anything logged a warning or worse, or any traceback at all."""
    caplog.set_level(logging.DEBUG)
    yield caplog
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [r.getMessage() for r in loud][:5]


# -- content negotiation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "fmt"),
    [
        ("", scrape.TEXT),
        ("application/openmetrics-text; version=abc", scrape.TEXT),
        ("application/openmetrics-text; version=1.0.0", scrape.OPENMETRICS),
        ("application/openmetrics-text", scrape.OPENMETRICS),
        # Prometheus 2.42's header: text is acceptable, so text (the fast renderer)
        (
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
            "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            scrape.TEXT,
        ),
        ("application/openmetrics-text; version=1.0.0, text/plain; q=0", scrape.OPENMETRICS),
        ("application/openmetrics-text; q=nan", scrape.TEXT),
        ("text/html", scrape.TEXT),
    ],
)
def test_formats(accept: str, fmt: str) -> None:
    assert choose_format(accept) == fmt


def test_a_bad_openmetrics_version_gets_text_not_a_500(quiet: pytest.LogCaptureFixture) -> None:
    with serving_cm() as server:
        response = request(server, {"Accept": "application/openmetrics-text; version=abc"})
        assert response.status == 200
        assert response.getheader("Content-Type") == scrape.CONTENT_TYPES[scrape.TEXT]
        # control characters in a header value: refused, never copied into Content-Type
        odd = request(server, {"Accept": "application/openmetrics-text; version=1.0.0\x01"})
        assert odd.status == 400 and b"\x01" not in odd.body  # type: ignore[attr-defined]


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=200), st.text(max_size=100))
def test_property_any_accept_header_gets_one_of_two_content_types(accept: str, coding: str) -> None:
    assert choose_format(accept) in scrape.CONTENT_TYPES
    assert accepts_gzip(coding) in (True, False)


def test_gzip_when_asked() -> None:
    with serving_cm() as server:
        plain = request(server, {})
        zipped = request(server, {"Accept-Encoding": "gzip, deflate"})
        refused = request(server, {"Accept-Encoding": "gzip;q=0, *"})
    assert plain.getheader("Content-Encoding") is None
    assert zipped.getheader("Content-Encoding") == "gzip"
    assert zipped.getheader("Vary") == "Accept, Accept-Encoding"
    assert gzip.decompress(zipped.body) == plain.body  # type: ignore[attr-defined]
    assert refused.getheader("Content-Encoding") is None


# -- one render per snapshot --------------------------------------------------------------------


def test_concurrent_scrapes_share_one_render_per_snapshot() -> None:
    gauges = Gauges()
    snapshot: list[object] = [object()]
    server = ExporterServer(
        ("127.0.0.1", 0),
        registry_with(gauges),
        lambda: (True, "ok"),
        generation=lambda: snapshot[0],
    )
    thread = server.serve_in_thread()
    try:
        bodies: list[bytes] = []
        barrier = threading.Barrier(8)

        def scrape_once() -> None:
            barrier.wait()
            bodies.append(request(server, {"Accept-Encoding": "gzip"}).body)  # type: ignore[attr-defined]

        threads = [threading.Thread(target=scrape_once) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(bodies) == 8 and len(set(bodies)) == 1
        assert gauges.collects == 1 and server.cache.compressions == 1
        snapshot[0] = object()  # the next poll
        request(server, {})
        assert gauges.collects == 2
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_the_cache_expires_even_if_the_snapshot_stalls() -> None:
    now = [0.0]
    renders = []
    cache = RenderCache(
        {scrape.TEXT: lambda: renders.append(1) or b"x"}, lambda: None, clock=lambda: now[0]
    )
    cache.body(scrape.TEXT, False)
    cache.body(scrape.TEXT, False)
    now[0] += scrape.MAX_AGE + 0.1
    cache.body(scrape.TEXT, False)
    assert len(renders) == 2


# -- TLS: no traceback, no memory for silent connections -------------------------------------------


@pytest.fixture(scope="module")
def tls_web(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tls_web_config(tmp_path_factory.mktemp("audit-tls"))


def test_evicting_tls_connections_mid_handshake_logs_nothing(
    tls_web: Path, quiet: pytest.LogCaptureFixture
) -> None:
    with serving_cm(web=load_web_config(tls_web / "web.yml"), max_connections=4) as server:
        socks = []
        for _ in range(12):  # each beyond the 4th evicts the oldest, several mid-handshake
            sock = socket.create_connection(("127.0.0.1", server.server_address[1]))
            sock.sendall(bytes.fromhex("16030100c8") + b"\x01" * 20)  # a ClientHello begun
            socks.append(sock)
        deadline = time.monotonic() + 10
        while server.engine.stats.evicted < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.engine.stats.evicted >= 8
        context = ssl.create_default_context(cafile=str(tls_web / "tls.crt"))
        conn = http.client.HTTPSConnection("127.0.0.1", server.server_address[1], context=context)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
        for sock in socks:
            sock.close()


def test_silent_tls_connections_hold_no_tls_state(tls_web: Path) -> None:
    with serving_cm(web=load_web_config(tls_web / "web.yml")) as server:
        socks = [
            socket.create_connection(("127.0.0.1", server.server_address[1])) for _ in range(50)
        ]
        deadline = time.monotonic() + 10
        while len(server.engine.connections) < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(server.engine.connections) == 50
        assert server.engine.stats.tls_started == 0
        for sock in socks:
            sock.close()


def test_garbage_on_the_tls_port_is_closed_quietly(
    tls_web: Path, quiet: pytest.LogCaptureFixture
) -> None:
    with serving_cm(web=load_web_config(tls_web / "web.yml")) as server:
        for data in (b"\x16\x03\x01\x00\x05hello", b"\x00\x01\x02", bytes(range(256))):
            with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as s:
                s.sendall(data)
                s.settimeout(5)
                try:
                    while s.recv(4096):
                        pass
                except ConnectionResetError:
                    pass


# -- EMFILE -------------------------------------------------------------------------------------


def test_emfile_is_one_warning_per_episode_and_serving_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    failures = [0]
    listener: list[socket.socket | None] = [None]
    real_accept = socket.socket.accept

    def accept(self: socket.socket) -> tuple[socket.socket, object]:
        if self is listener[0] and failures[0] > 0:
            failures[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real_accept(self)

    monkeypatch.setattr(socket.socket, "accept", accept)
    with serving_cm() as server:
        listener[0] = server.socket
        # failures between successful accepts, as when each one evicts an idle connection and
        # the next accept succeeds: one episode (the hostile-client review saw one warning per
        # connection), until FD_WARN_QUIET passes without a failure
        for round_ in range(4):
            if round_ == 3:  # a quiet spell of FD_WARN_QUIET ends it (the pauses: 5-20 ms)
                monkeypatch.setattr(serving, "FD_WARN_QUIET", 0.25)
                time.sleep(0.3)
            failures[0] = 3
            conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=20)
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 200  # answered once accepting resumes
            conn.close()
            assert server.engine.stats.fd_episodes == (1 if round_ < 3 else 2)
        assert server.engine.stats.out_of_fds == 12
    warnings = [r for r in caplog.records if "out of file descriptors" in r.getMessage()]
    assert len(warnings) == 2 and all(r.levelno == logging.WARNING for r in warnings)
    assert not any(r.exc_info for r in caplog.records)


def test_the_connection_cap_follows_the_open_files_limit(tmp_path: Path) -> None:
    """Under a hard limit of 200 open files, 512 connections cannot be: the cap is lowered
    and said once; many idle sockets cause no traceback and scrapes go on."""
    import subprocess
    import sys

    script = tmp_path / "limited.py"
    script.write_text(
        "import resource, logging, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
        "from prometheus_client import CollectorRegistry\n"
        "from sparkdiag.web.http import ExporterServer\n"
        "s = ExporterServer(('127.0.0.1', 0), CollectorRegistry(), lambda: (True, 'ok'))\n"
        "print(s.server_address[1], s.engine.limits.max_connections, flush=True)\n"
        "s.serve_forever()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port_text, cap_text = proc.stdout.readline().split()
        cap = int(cap_text)
        assert 1 <= cap < 200 - serving.RESERVED_FDS
        socks = [socket.create_connection(("127.0.0.1", int(port_text))) for _ in range(cap + 40)]
        conn = http.client.HTTPConnection("127.0.0.1", int(port_text), timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
        for sock in socks:
            sock.close()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert err.count("web.max-connections 512 lowered to") == 1, err[-2000:]
    assert "Traceback" not in err


# -- basic auth ------------------------------------------------------------------------------------


def test_unknown_users_cost_what_the_slowest_user_costs() -> None:
    fast = bcrypt.hashpw(b"a", bcrypt.gensalt(rounds=4))
    slow = bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=7))
    auth = BasicAuth({"fast": fast, "slow": slow})
    assert auth._dummy[4:6] == b"07"  # the dummy hash an unknown user is checked against
    credential = auth.decide("Basic " + __import__("base64").b64encode(b"nobody:x").decode())
    assert not isinstance(credential, bool)

    def fastest(check: Callable[[], bool]) -> float:
        """The quickest of five runs: a loaded machine only ever adds to a run's time (one run
        each failed beside a CI run on both cores)."""
        times = []
        for _ in range(5):
            start = time.perf_counter()
            assert check() is False
            times.append(time.perf_counter() - start)
        return min(times)

    unknown = fastest(lambda: auth.verify(credential))
    cheap = fastest(lambda: bcrypt.checkpw(b"x", fast))
    assert unknown > 4 * cheap  # cost 7 is 8x cost 4: the unknown user paid the slow one


def test_mixed_costs_are_warned_of_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With users at costs 4 and 7 a wrong password for the cheap one answers sooner than one
    for an unknown name (which pays 7): timing tells the name exists (the hostile-client
    review). Loading such a config says so; one cost says nothing."""
    fast = bcrypt.hashpw(b"a", bcrypt.gensalt(rounds=4)).decode()
    slow = bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=7)).decode()
    path = tmp_path / "web.yml"
    with caplog.at_level(logging.WARNING, logger="sparkdiag.web.webconfig"):
        path.write_text(f"basic_auth_users:\n  fast: '{fast}'\n  slow: '{slow}'\n")
        load_web_config(path)
        path.write_text(f"basic_auth_users:\n  fast: '{fast}'\n  other: '{fast}'\n")
        load_web_config(path)
    (said,) = [r.getMessage() for r in caplog.records]
    assert "bcrypt costs 04, 07" in said and "hash them all at one cost" in said


def test_a_cost_above_the_cap_exits_2_naming_the_user(tmp_path: Path) -> None:
    hashed = "$2y$15$" + bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=4)).decode()[7:]
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  carol: '{hashed}'\n")
    result = run_cli("serve", "--web.config.file", str(path), "--no-probe.enabled")
    assert_clean_error(result, 2, "basic_auth_users.carol", "cost 15 is out of range")


# -- any request head ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_server() -> Iterator[ExporterServer]:
    with serving_cm(timeout=2.0) as server:
        yield server


_heads = st.one_of(
    st.binary(max_size=300),
    st.builds(
        lambda method, target, version, lines: (
            f"{method} {target} {version}\r\n".encode("latin-1", "replace") + lines + b"\r\n"
        ),
        st.sampled_from(["GET", "HEAD", "POST", "BREW", "get", ""]),
        st.text(max_size=30),
        st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "HTTP/1.1x", ""]),
        st.lists(st.binary(max_size=40).map(lambda b: b + b"\r\n"), max_size=5).map(b"".join),
    ),
)


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(_heads)
def test_property_any_request_head_is_answered_or_closed_never_500(
    shared_server: ExporterServer, head: bytes
) -> None:
    with socket.create_connection(("127.0.0.1", shared_server.server_address[1]), timeout=5) as s:
        s.sendall(head + b"\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", data):
        assert status != b"500"


# -- defaults --------------------------------------------------------------------------------------


def test_the_limits_defaults_come_from_config_options() -> None:
    params = inspect.signature(ExporterServer).parameters
    assert params["max_connections"].default == DEFAULTS["web_max_connections"]
    assert params["max_requests"].default == DEFAULTS["web_max_requests"]
    assert params["timeout"].default == DEFAULTS["web_read_timeout"]
    assert Limits().max_connections == DEFAULTS["web_max_connections"]
    assert Limits().timeout == DEFAULTS["web_read_timeout"]
    written = str(DEFAULTS["web_max_connections"])
    for module in WEB.glob("*.py"):
        assert not re.search(rf"\b{written}\b", module.read_text()), module.name


def test_healthz_ages_the_poll_on_the_monotonic_clock() -> None:
    """/healthz aged the poll by the wall clock: a step back of an hour left a hung poller
    healthy for the hour, a step forward read a fresh poll as stale (found in a review)."""
    import time
    from types import SimpleNamespace

    from sparkdiag.web.http import health_check

    snap = SimpleNamespace(timestamp=time.time() + 3600.0, poll=7)  # the wall clock stepped
    fresh = health_check(lambda: snap, 1.0, lambda: time.monotonic() - 0.5)
    ok, detail = fresh()
    assert ok and detail == "ok: poll 7, 0.5 s ago"
    hung = health_check(lambda: snap, 1.0, lambda: time.monotonic() - 20.0)
    ok, detail = hung()
    assert not ok and detail.startswith("stale: last poll 20.0 s ago (limit 5 s)")
    assert health_check(lambda: None, 1.0, lambda: None)() == (
        False,
        "starting: no poll has completed yet",
    )
