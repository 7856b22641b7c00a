"""/metrics rendered ahead for each new snapshot (issue 23's "a render done once per snapshot"):
the first scrape after a poll is served from bytes made when the snapshot was published; a
scrape during that render waits for it; nothing served is older than the newest snapshot; a
failed render is logged and the scrape gets 500 as before; nobody scraping, nothing rendered."""

from __future__ import annotations

import gzip
import http.client
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from sparkdiag.web import scrape
from sparkdiag.web.http import ExporterServer
from sparkdiag.web.scrape import RenderCache


class PollGauge:
    """A collector showing the current poll number; it can be made to wait or fail."""

    def __init__(self) -> None:
        self.poll = 0
        self.collects = 0
        self.entered = threading.Event()  # set when a collect starts
        self.gate: threading.Event | None = None  # a collect waits for it when set
        self.fail = False

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.collects += 1
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail:
            raise RuntimeError("collector broke")
        family = GaugeMetricFamily("sparkdiag_test_poll", "The poll rendered.")
        family.add_metric([], float(self.poll))
        yield family


class Poller:
    """What the daemon's poller is to the server: a latest snapshot and a listener."""

    def __init__(self, gauge: PollGauge, server: Callable[[], ExporterServer]) -> None:
        self.gauge = gauge
        self.latest: object = object()
        self.server = server

    def poll(self, *, publish: bool = True) -> int:
        self.gauge.poll += 1
        self.latest = object()
        if publish:
            self.server().published(self.latest)
        return self.gauge.poll


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ExporterServer, Poller, PollGauge]]:
    """A server whose every snapshot is due for a render ahead (polls and scrapes milliseconds
    apart would otherwise read as a scraper not due yet: RenderCache.due, tested alone below)."""
    monkeypatch.setattr(scrape, "DUE_POLLS", 1e9)
    gauge = PollGauge()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(gauge)  # type: ignore[arg-type]
    holder: list[ExporterServer] = []
    poller = Poller(gauge, lambda: holder[0])
    server = ExporterServer(
        ("127.0.0.1", 0), registry, lambda: (True, "ok"), generation=lambda: poller.latest
    )
    holder.append(server)
    thread = server.serve_in_thread()
    try:
        yield server, poller, gauge
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


PROMETHEUS = {"Accept-Encoding": "gzip"}


def get(server: ExporterServer, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    try:
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        body = response.read()
        if response.getheader("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return response.status, body
    finally:
        conn.close()


def shown(body: bytes) -> int:
    for line in body.splitlines():
        if line.startswith(b"sparkdiag_test_poll "):
            return int(float(line.split()[1]))
    raise AssertionError(body[:200])


def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def poll_and_wait(server: ExporterServer, poller: Poller) -> int:
    """A new snapshot, published; returns its poll once the render ahead has run."""
    runs = server.prerenderer.runs
    poll = poller.poll()
    until(lambda: server.prerenderer.runs > runs)
    return poll


def test_the_first_scrape_after_a_poll_is_served_from_bytes_rendered_ahead(
    served: tuple[ExporterServer, Poller, PollGauge],
) -> None:
    server, poller, gauge = served
    assert get(server, PROMETHEUS)[0] == 200  # the scrape says what it asks for: text, gzip
    assert (server.cache.renders, server.cache.compressions) == (1, 1)
    for _ in range(3):
        poll = poll_and_wait(server, poller)
        made = (server.cache.renders, server.cache.compressions)
        status, body = get(server, PROMETHEUS)
        assert status == 200 and shown(body) == poll
        assert (server.cache.renders, server.cache.compressions) == made  # nothing at scrape time
        assert gauge.collects == made[0]
    assert (server.cache.renders, server.cache.compressions) == (4, 4)


def test_a_scrape_during_the_render_ahead_waits_for_it_and_renders_nothing(
    served: tuple[ExporterServer, Poller, PollGauge],
) -> None:
    server, poller, gauge = served
    get(server, PROMETHEUS)
    gauge.gate, gauge.entered = threading.Event(), threading.Event()
    poll = poller.poll()
    assert gauge.entered.wait(10)  # the render ahead has begun and waits
    answers: list[tuple[int, bytes]] = []
    scraper = threading.Thread(target=lambda: answers.append(get(server, PROMETHEUS)))
    scraper.start()
    scraper.join(0.3)
    assert scraper.is_alive() and not answers  # waiting for that render
    gauge.gate.set()
    scraper.join(10)
    assert answers and answers[0][0] == 200 and shown(answers[0][1]) == poll
    assert gauge.collects == 2 and server.cache.compressions == 2  # one each per snapshot


def test_nothing_served_is_older_than_the_newest_snapshot(
    served: tuple[ExporterServer, Poller, PollGauge],
) -> None:
    server, poller, _ = served
    get(server, PROMETHEUS)
    for i in range(30):
        # published or not yet (the poller sets latest before it calls its listeners), with
        # the render ahead running or not: the scrape right after gets this poll
        poll = poller.poll(publish=i % 3 != 0)
        for headers in (PROMETHEUS, {}):
            status, body = get(server, headers)
            assert status == 200 and shown(body) == poll


def test_a_failed_render_ahead_is_logged_once_per_run_and_the_scrape_gets_500(
    served: tuple[ExporterServer, Poller, PollGauge], caplog: pytest.LogCaptureFixture
) -> None:
    server, poller, gauge = served
    caplog.set_level(logging.DEBUG)
    get(server, {})
    gauge.fail = True
    for _ in range(2):
        poll_and_wait(server, poller)
        assert get(server, {})[0] == 500
    ahead = [r for r in caplog.records if r.getMessage().startswith("rendering /metrics ahead")]
    assert [r.levelno for r in ahead if r.levelno >= logging.ERROR] == [logging.ERROR]
    assert "RuntimeError: collector broke" in ahead[0].getMessage()
    served_errors = [r for r in caplog.records if r.getMessage().startswith("serving /metrics")]
    assert len([r for r in served_errors if r.levelno == logging.ERROR]) == 2  # as before
    gauge.fail = False
    poll = poll_and_wait(server, poller)
    assert any(r.getMessage() == "rendering /metrics ahead works again" for r in caplog.records)
    status, body = get(server, {})
    assert status == 200 and shown(body) == poll


def test_nothing_is_rendered_ahead_that_no_scrape_asked_for(
    served: tuple[ExporterServer, Poller, PollGauge],
) -> None:
    server, poller, gauge = served
    poller.poll()
    until(lambda: server.prerenderer.runs == 1)
    assert gauge.collects == 0  # nobody scraped yet
    get(server, {})  # plain text only
    poller.poll()
    until(lambda: server.prerenderer.runs == 2)
    assert (server.cache.renders, server.cache.compressions) == (2, 0)


def test_a_format_not_asked_for_within_warm_for_is_no_longer_rendered_ahead() -> None:
    now = [0.0]
    generation: list[object] = [object()]
    made: list[str] = []
    cache = RenderCache(
        {
            scrape.TEXT: lambda: made.append("text") or b"t",
            scrape.OPENMETRICS: lambda: made.append("om") or b"o",
        },
        lambda: generation[0],
        clock=lambda: now[0],
    )
    cache.body(scrape.TEXT, True)
    now[0] = scrape.WARM_FOR / 2
    cache.body(scrape.OPENMETRICS, False)
    generation[0] = object()
    assert cache.prerender() == 3  # text and its gzip, OpenMetrics
    assert cache.prerender() == 0  # made already
    now[0] = scrape.WARM_FOR + 1
    generation[0] = object()
    assert cache.prerender() == 1 and made[-1] == "om"  # text not asked for since
    now[0] = 2 * scrape.WARM_FOR
    generation[0] = object()
    assert cache.prerender() == 0


def test_without_a_generation_nothing_is_rendered_ahead() -> None:
    made: list[int] = []
    cache = RenderCache({scrape.TEXT: lambda: made.append(1) or b"x"})
    cache.body(scrape.TEXT, False)
    prerenderer = scrape.Prerenderer(cache)
    prerenderer.published()
    prerenderer.close()
    assert cache.prerender() == 0 and made == [1] and prerenderer.runs == 0


def test_a_body_made_already_is_answered_without_the_render_pool(
    served: tuple[ExporterServer, Poller, PollGauge], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, poller, _ = served
    routed: list[str] = []
    route = server._route

    def counting(request: Any) -> Any:
        routed.append(request.path)
        return route(request)

    monkeypatch.setattr(server, "_route", counting)
    get(server, PROMETHEUS)  # nothing made yet: rendered in the pool
    assert routed == ["/metrics"]
    get(server, PROMETHEUS)  # the same snapshot: its bytes, on the event loop
    poll = poll_and_wait(server, poller)
    status, body = get(server, PROMETHEUS)  # rendered ahead: on the event loop too
    assert status == 200 and shown(body) == poll
    assert routed == ["/metrics"]
    poll = poller.poll(publish=False)  # a new snapshot nobody rendered yet: the pool again
    assert shown(get(server, PROMETHEUS)[1]) == poll and routed == ["/metrics"] * 2
    get(server, {"Accept": "application/openmetrics-text; version=1.0.0"})  # not made yet
    assert len(routed) == 3


def test_a_regular_scraper_is_rendered_ahead_only_for_the_polls_before_its_next_scrape() -> None:
    now = [0.0]
    cache = RenderCache({scrape.TEXT: lambda: b"x"}, lambda: None, clock=lambda: now[0])
    assert not cache.due(1.0)  # nobody scraped: no scrape expected
    for t in (0.0, 0.02, 15.0, 30.0, 30.3):  # every 15 s, with a second scraper close behind
        now[0] = t
        cache.body(scrape.TEXT, True)
    due = []
    for tenth in range(303, 460):
        now[0] = tenth / 10
        due.append((now[0], cache.due(1.0)))
    # the last scrape (30.3) + the shortest gap of a poll or more (0.02 -> 15.0) - 2 polls
    assert next(t for t, d in due if d) == 43.3
    assert all(d for t, d in due if t >= 43.3)
    # missed two scrapes (the longest gap, 15.0, twice, + 2 polls): gone, nothing due
    now[0] = 30.3 + 2 * 15.0 + 2.0
    assert cache.due(1.0)
    now[0] += 0.1
    assert not cache.due(1.0) and cache.window(1.0) == pytest.approx((43.28, 62.3))
    now[0] = 40.0
    cache.body(scrape.TEXT, True)  # an irregular scrape: the shortest gap is 9.7 s now
    now[0] = 46.5
    assert not cache.due(1.0) and cache.due(2.0)  # 40 + 9.7 - 2 poll intervals
    now[0] = 40.5
    cache.body(scrape.TEXT, True)  # 0.5 s after: under a poll interval, not a gap
    now[0] = 48.0
    assert not cache.due(1.0)  # 40.5 + 9.7 - 2 = 48.2
    now[0] = 48.3
    assert cache.due(1.0)


def test_a_poller_slower_than_the_scrapes_renders_every_snapshot_ahead() -> None:
    now = [0.0]
    cache = RenderCache({scrape.TEXT: lambda: b"x"}, lambda: None, clock=lambda: now[0])
    for t in (0.0, 5.0, 10.0):
        now[0] = t
        cache.body(scrape.TEXT, False)
    now[0] = 10.1
    assert cache.due(3.0)  # 5 s scrapes, 3 s polls: 10 + 5 - 6 < 10.1
    assert cache.due(0.0)  # the poll interval not known yet


def test_a_regular_scraper_skips_the_renders_ahead_nobody_will_scrape(
    served: tuple[ExporterServer, Poller, PollGauge], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, poller, gauge = served
    monkeypatch.setattr(scrape, "DUE_POLLS", 2.0)  # the real rule (the fixture turns it off)
    period, poll = 0.6, 0.05
    for _ in range(3):  # a scraper every 0.6 s
        started = time.monotonic()
        get(server, PROMETHEUS)
        time.sleep(max(0.0, period - (time.monotonic() - started)))
    last = time.monotonic()
    get(server, PROMETHEUS)
    renders = server.cache.renders
    while time.monotonic() - last < period - 0.02:  # polls every 0.05 s until the next scrape
        poll_and_wait(server, poller)
        time.sleep(poll)
    assert server.prerenderer.skipped >= 3  # right after the scrape: not rendered ahead
    assert server.cache.renders - renders < server.prerenderer.runs
    made = server.cache.renders
    status, body = get(server, PROMETHEUS)  # the next scrape: rendered ahead, in time
    assert status == 200 and shown(body) == gauge.poll
    assert server.cache.renders == made


def test_a_lone_scrape_is_rendered_ahead_for_a_while_then_no_more() -> None:
    now = [100.0]
    cache = RenderCache({scrape.TEXT: lambda: b"x"}, lambda: None, clock=lambda: now[0])
    assert cache.window(1.0) == scrape.NEVER and not cache.wanted(1.0)
    cache.body(scrape.TEXT, True)
    cache.body(scrape.TEXT, True)  # a burst: no gap of a poll interval
    now[0] = 100.0 + scrape.UNKNOWN_FOR
    assert cache.due(1.0) and cache.wanted(1.0)
    now[0] += 0.5
    assert not cache.due(1.0) and not cache.wanted(1.0)
    now[0] = 10.0  # the poll interval unknown: always due
    assert cache.window(0.0) == (-math.inf, math.inf)


def test_a_gone_scraper_no_longer_wakes_the_render_ahead(
    served: tuple[ExporterServer, Poller, PollGauge], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, poller, gauge = served
    monkeypatch.setattr(scrape, "DUE_POLLS", 2.0)
    monkeypatch.setattr(scrape, "UNKNOWN_FOR", 0.3)
    server.prerenderer.poll_interval = 0.05
    get(server, PROMETHEUS)
    assert poll_and_wait(server, poller) == gauge.poll
    renders = server.cache.renders
    assert shown(get(server, PROMETHEUS)[1]) == gauge.poll
    assert server.cache.renders == renders  # served from the render ahead
    time.sleep(0.35)  # longer than UNKNOWN_FOR after the last scrape: no scraper expected
    skipped = server.prerenderer.skipped
    for _ in range(3):
        poll_and_wait(server, poller)
    assert server.prerenderer.skipped == skipped + 3
    assert server.cache.renders == renders  # nothing rendered for nobody
