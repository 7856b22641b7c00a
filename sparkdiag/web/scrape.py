"""What a scrape gets: the format and encoding it asked for, rendered once per snapshot.

* Format: the Prometheus text format 0.0.4 (the fast renderer), unless the client refuses it and
  takes OpenMetrics 1.0.0 (Prometheus always accepts text; Go's ``promhttp`` serves text unless
  told otherwise). Whatever the ``Accept`` header holds, the answer is one of the two content
  types below: nothing from the header is copied into the response.
* Encoding: gzip when ``Accept-Encoding`` allows it (Prometheus asks for it): an 8-GPU scrape of
  about 65 KB becomes about 5 KB.
* Cache (:class:`RenderCache`): one render per snapshot and format, and one compression, shared
  by every scrape of that snapshot, including scrapes that arrive while it renders (two
  Prometheus replicas, a burst); an entry is also dropped after ``MAX_AGE`` seconds, so state
  that changes between polls (probe results) shows within that time even if polling stalls.
* A body already made for the newest snapshot (:meth:`RenderCache.ready`) is served by the event
  loop at once, without a hand-off to the render pool.
* Render ahead (:class:`Prerenderer`): each new snapshot wakes a thread that renders, at once,
  every format and encoding a scrape asked for in the last ``WARM_FOR`` seconds (Prometheus:
  text, gzip), so the first scrape after a poll finds its bytes made. It goes through the same
  entry as a scrape: a scrape that arrives while it renders waits for that render, and a scrape
  always asks for the newest snapshot's entry, so nothing served is older than the newest
  snapshot. Nobody scraping: nothing rendered ahead. A regular scraper (Prometheus every 15 s
  against the 1 s poll) is rendered ahead only for the polls that can precede its next scrape
  (:meth:`RenderCache.due`): about two renders per scrape, not fifteen; a scraper that missed
  two of its scrapes is taken as gone, and nothing is rendered ahead until it comes back (its
  next scrape renders). A render that fails is logged (once per run of failures) and not kept:
  the scrape renders again, and gets 500 if that fails too. A snapshot that no scrape is due
  for does not even wake the render-ahead thread.
* The same window (:meth:`RenderCache.window`) tells the poller when a scrape is expected, so
  that the polls nobody reads can be spaced out (``idle-poll-interval``, docs/daemon-cost.md).
"""

from __future__ import annotations

import gzip
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

TEXT = "text"
OPENMETRICS = "openmetrics"
CONTENT_TYPES = {
    TEXT: "text/plain; version=0.0.4; charset=utf-8",
    OPENMETRICS: "application/openmetrics-text; version=1.0.0; charset=utf-8",
}
MAX_AGE = 5.0  # seconds an entry is served at most, whatever the snapshot
GZIP_LEVEL = 6  # docs/web.md: size and cost by level on the 8-GPU scrape
MAX_PARTS = 64  # media ranges or codings looked at in one header
WARM_FOR = 600.0  # seconds after a scrape asked for a format and encoding that it is rendered ahead
SCRAPES_KEPT = 16  # recent scrape times kept to tell when the next one is due
DUE_POLLS = 2.0  # render ahead this many poll intervals before the next scrape can come
GONE_GAPS = 2.0  # a scraper silent for this many of its longest recent gaps is gone
# With no gap of a poll interval or more known yet (one scrape, or only bursts), the seconds
# after the last scrape that every poll counts as due: long enough for Prometheus' second
# scrape at the usual 15-60 s intervals to find its body made.
UNKNOWN_FOR = 60.0
NEVER = (math.inf, -math.inf)  # a window no time falls in: no scrape expected

log = logging.getLogger(__name__)


def _q(params: list[str]) -> tuple[float, dict[str, str]]:
    """The quality value (0 when unparsable) and the other parameters of one header element."""
    q = 1.0
    rest: dict[str, str] = {}
    for param in params:
        key, _, value = param.partition("=")
        key, value = key.strip().lower(), value.strip().strip('"')
        if key == "q":
            try:
                q = float(value)
            except ValueError:
                q = 0.0
            if not math.isfinite(q):
                q = 0.0
        else:
            rest[key] = value
    return q, rest


def choose_format(accept: str | None) -> str:
    """:data:`TEXT` or :data:`OPENMETRICS` for an ``Accept`` header."""
    if not accept or not accept.strip():
        return TEXT
    text_ok = openmetrics_ok = False
    for part in accept.split(",")[:MAX_PARTS]:
        media, *params = part.split(";")
        media = media.strip().lower()
        q, rest = _q(params)
        if q <= 0:
            continue
        version = rest.get("version")
        if media in ("*/*", "text/*") or (media == "text/plain" and version in (None, "0.0.4")):
            text_ok = True
        elif media == "application/openmetrics-text" and version in (None, "1.0.0"):
            openmetrics_ok = True
    return OPENMETRICS if openmetrics_ok and not text_ok else TEXT


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether ``Accept-Encoding`` allows gzip (RFC 9110 12.5.3: ``*`` stands for the rest)."""
    if not accept_encoding:
        return False
    star = False
    for part in accept_encoding.split(",")[:MAX_PARTS]:
        coding, *params = part.split(";")
        coding = coding.strip().lower()
        q, _ = _q(params)
        if coding in ("gzip", "x-gzip"):
            return q > 0
        if coding == "*":
            star = q > 0
    return star


@dataclass(eq=False)
class _Entry:
    generation: object
    made: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    plain: bytes | None = None
    compressed: bytes | None = None


_UNCACHED = object()


class RenderCache:
    """Bodies for ``/metrics``: ``renderers[format]()`` run once per ``generation()`` (the
    snapshot object: a new one each poll) and shared; without ``generation`` every call renders.
    Thread-safe: called from the render pool."""

    def __init__(
        self,
        renderers: Mapping[str, Callable[[], bytes]],
        generation: Callable[[], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.renderers = dict(renderers)
        self.generation = generation
        self.clock = clock
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._asked: dict[tuple[str, bool], float] = {}  # (format, gzip) -> last asked
        self._scrapes: deque[float] = deque(maxlen=SCRAPES_KEPT)  # when scrapes came
        self.renders = 0  # renders done (for tests and benchmarks)
        self.compressions = 0

    def body(self, fmt: str, compress: bool) -> bytes:
        self._note(fmt, compress)
        return self._fill(self._entry(fmt), fmt, compress)

    def ready(self, fmt: str, compress: bool) -> bytes | None:
        """The newest snapshot's body if it is made already, else None; never renders and never
        waits (the event loop serves it inline)."""
        if self.generation is None:
            return None
        generation = self.generation()
        with self._lock:
            entry = self._entries.get(fmt)
        if entry is None or entry.generation is not generation:
            return None
        if self.clock() - entry.made > MAX_AGE:
            return None
        made = entry.compressed if compress else entry.plain
        if made is not None:  # else the scrape goes on to body(), which notes it
            self._note(fmt, compress)
        return made

    def _note(self, fmt: str, compress: bool) -> None:
        now = self.clock()
        with self._lock:
            self._asked[fmt, compress] = now
            self._scrapes.append(now)

    def window(self, poll_interval: float) -> tuple[float, float]:
        """(from, to) in ``clock`` seconds: the times at which a snapshot may be the one the
        next scrape gets. From the last scrape plus the shortest gap between recent scrapes
        (gaps under one poll interval left out: those scrapes share a snapshot) less
        ``DUE_POLLS`` poll intervals; to the last scrape plus ``GONE_GAPS`` of the longest
        gap and ``DUE_POLLS`` poll intervals, after which the scraper is taken as gone. With
        no gap known yet (one scrape, or bursts), from the last scrape for ``UNKNOWN_FOR``
        seconds; nobody scraped yet: :data:`NEVER`; the poll interval unknown: always."""
        if poll_interval <= 0:  # not known yet (the first snapshot published)
            return -math.inf, math.inf
        with self._lock:
            times = list(self._scrapes)
        if not times:
            return NEVER
        last, ahead = times[-1], DUE_POLLS * poll_interval
        gaps = [b - a for a, b in itertools.pairwise(times) if b - a >= poll_interval]
        if not gaps:
            return last, last + UNKNOWN_FOR
        return last + min(gaps) - ahead, last + GONE_GAPS * max(gaps) + ahead

    def due(self, poll_interval: float) -> bool:
        """Whether a snapshot published now may be the one the next scrape gets
        (:meth:`window`): a scraper as regular as Prometheus is rendered ahead for the last
        polls before its scrape only; irregular scrapes, every poll; a gone scraper, none."""
        start, end = self.window(poll_interval)
        return start <= self.clock() <= end

    def wanted(self, poll_interval: float) -> bool:
        """Whether a render ahead of a snapshot published now has anything to do: a scrape is
        due and some format was asked for within ``WARM_FOR``."""
        if not self.due(poll_interval):
            return False
        now = self.clock()
        with self._lock:
            return any(now - asked <= WARM_FOR for asked in self._asked.values())

    def prerender(self) -> int:
        """Make the current snapshot's bodies of every format and encoding asked for in the
        last ``WARM_FOR`` seconds, now, unless a scrape did already; returns how many bodies
        this call made (renders and compressions). Raises what a renderer raises."""
        if self.generation is None:
            return 0
        now = self.clock()
        wanted: dict[str, bool] = {}  # format -> whether gzip was asked for too
        with self._lock:
            asked_for = list(self._asked.items())
        for (fmt, compress), asked in asked_for:
            if now - asked <= WARM_FOR:
                wanted[fmt] = wanted.get(fmt, False) or compress
        before = self.renders + self.compressions
        for fmt, compress in wanted.items():
            self._fill(self._entry(fmt), fmt, compress)
        return self.renders + self.compressions - before

    def _fill(self, entry: _Entry, fmt: str, compress: bool) -> bytes:
        with entry.lock:
            if entry.plain is None:
                entry.plain = self.renderers[fmt]()
                self.renders += 1
            if not compress:
                return entry.plain
            if entry.compressed is None:
                entry.compressed = gzip.compress(entry.plain, GZIP_LEVEL, mtime=0)
                self.compressions += 1
            return entry.compressed

    def _entry(self, fmt: str) -> _Entry:
        now = self.clock()
        if self.generation is None:
            return _Entry(_UNCACHED, now)
        generation = self.generation()
        with self._lock:
            entry = self._entries.get(fmt)
            if entry is None or entry.generation is not generation or now - entry.made > MAX_AGE:
                entry = _Entry(generation, now)
                self._entries[fmt] = entry
            return entry


class Prerenderer:
    """Runs :meth:`RenderCache.prerender` in its own thread after each :meth:`published` (the
    poller's listener) for which :meth:`RenderCache.wanted` says a scrape is due; wake-ups
    during a render make one more. ``poll_interval``: the poller's (the daemon sets it); 0
    infers it from the last two publications."""

    def __init__(self, cache: RenderCache, poll_interval: float = 0.0) -> None:
        self.cache = cache
        self.poll_interval = poll_interval
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._failing = False
        self._published: deque[float] = deque(maxlen=2)  # the last two publications
        self.runs = 0  # publications handled, failed and skipped ones included (for tests)
        self.skipped = 0  # publications with no scrape due or nothing asked (nothing rendered)

    def published(self, _snapshot: object = None) -> None:
        """A new snapshot is the latest: render it ahead if a scrape is due (the thread starts
        at the first such snapshot; the others do not wake it)."""
        if self.cache.generation is None:
            return
        with self._lock:
            if self._closed:
                return
            self._published.append(self.cache.clock())
        if not self.cache.wanted(self._poll_interval()):
            with self._lock:
                self.skipped += 1
                self.runs += 1
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="http-prerender", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _poll_interval(self) -> float:
        if self.poll_interval > 0:
            return self.poll_interval
        with self._lock:
            times = list(self._published)
        return times[1] - times[0] if len(times) == 2 else 0.0

    def close(self) -> None:
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            try:
                self.cache.prerender()
            except Exception as exc:
                level = logging.DEBUG if self._failing else logging.ERROR
                log.log(
                    level,
                    "rendering /metrics ahead failed: %s: %s (each scrape renders "
                    "again; more failures of this run at debug level)",
                    type(exc).__name__,
                    exc,
                )
                log.debug("rendering /metrics ahead failed", exc_info=True)
                self._failing = True
            else:
                if self._failing:
                    log.info("rendering /metrics ahead works again")
                self._failing = False
            finally:
                self.runs += 1
