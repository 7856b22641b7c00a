"""Measuring one path: the latency, the throughput of sparkdiag's own TCP streams in each
direction, and ``iperf3`` and ``ib_write_bw`` where both machines have them."""

from __future__ import annotations

import itertools
import socket
import statistics
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkdiag.jsonvalues import as_float, as_int
from sparkdiag.link import tools
from sparkdiag.link.model import Latency, Throughput
from sparkdiag.link.paths import Plan
from sparkdiag.link.session import Control, Options, connect_error, endpoint, open_socket
from sparkdiag.link.streams import Counter, receive, send_until
from sparkdiag.link.wire import (
    HELLO_TIMEOUT,
    PING_BYTES,
    PING_MAX,
    LineReader,
    ProtocolError,
    hello,
    send,
)

TCP = "tcp-sockets"
PING_SECONDS = 0.5


def _latency(sock: socket.socket, reader: LineReader) -> Latency | None:
    message = b"p" * PING_BYTES
    samples: list[float] = []
    sock.settimeout(5.0)
    pending = reader.rest
    deadline = time.monotonic() + PING_SECONDS
    for index in itertools.count():
        if index >= PING_MAX or time.monotonic() > deadline:
            break
        start = time.perf_counter()
        sock.sendall(message)
        got = len(pending)
        pending = b""
        while got < PING_BYTES:
            chunk = sock.recv(PING_BYTES - got)
            if not chunk:
                return None
            got += len(chunk)
        if index >= 10:  # warm-up
            samples.append((time.perf_counter() - start) * 1e6)
    if not samples:
        return None
    ordered = sorted(samples)
    return Latency(
        median_us=statistics.median(ordered),
        p99_us=ordered[max(0, -(-len(ordered) * 99 // 100) - 1)],
        min_us=ordered[0],
        round_trips=len(ordered),
    )


class PathMeasure:
    """Measures one planned path over the session's control connection."""

    def __init__(self, control: Control, plan: Plan, options: Options) -> None:
        self.control = control
        self.plan = plan
        self.options = options
        self.ids = itertools.count(1)
        self.device = plan.local.interface
        self.source = plan.local.address

    def _open(self, timeout: float) -> socket.socket:
        return open_socket(
            self.plan.peer_address, self.options.port, timeout, self.source, self.device
        )

    def ping(self) -> tuple[Latency | None, str | None]:
        where = endpoint(self.plan.peer_address, self.options.port)
        try:
            sock = self._open(self.options.connect_timeout)
        except OSError as exc:
            return None, connect_error(exc, where, self.options.connect_timeout)
        with sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = LineReader(sock)
            try:
                send(sock, hello("ping", session=self.control.token))
                answer = reader.read(HELLO_TIMEOUT)
            except (TimeoutError, ProtocolError, ConnectionError, OSError) as exc:
                return None, f"{where} did not answer as the peer's 'link serve' ({exc})"
            if answer.get("session") != self.control.token:
                return None, (
                    f"{where} answered, but not as the same 'link serve' process as "
                    "the peer named: nothing was sent to it"
                )
            try:
                return _latency(sock, reader), None
            except OSError as exc:
                return None, f"{where}: the latency exchange failed ({exc})"

    def tcp(self, direction: str) -> Throughput:
        seconds, streams = self.options.seconds, self.options.streams
        test = f"t{next(self.ids)}"
        kind = "sink" if direction == "to-peer" else "source"
        ready = self.control.ask({"op": kind, "test": test, "streams": streams, "seconds": seconds})
        if ready.get("error"):
            return Throughput(TCP, direction, None, seconds, streams, str(ready["error"])[:200])
        socks = []
        try:
            for _ in range(streams):
                sock = self._open(self.options.connect_timeout)
                socks.append(sock)
                send(sock, hello("data", session=self.control.token, test=test))
        except OSError as exc:
            for sock in socks:
                sock.close()
            self.control.ask({"op": "result", "test": test})
            return Throughput(TCP, direction, None, seconds, streams, f"data connection: {exc}")
        counter = Counter()
        deadline = time.monotonic() + seconds
        sent: list[int] = []

        def sender(sock: socket.socket) -> None:
            sent.append(send_until(sock, deadline))

        if direction == "to-peer":
            workers = [threading.Thread(target=sender, args=(s,), daemon=True) for s in socks]
        else:
            workers = [
                threading.Thread(target=receive, args=(s, counter, b"", seconds + 30), daemon=True)
                for s in socks
            ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(seconds + 40)
        for sock in socks:
            sock.close()
        result = self.control.ask({"op": "result", "test": test}, timeout=seconds + 30)
        joined = as_int(result.get("connected"))
        if joined is not None and joined > streams:  # the token travels in clear (docs/link.md)
            why = (
                f"{joined} data connections joined a test of {streams}: another machine used "
                "the session's token; the figure is not believed"
            )
            return Throughput(TCP, direction, None, seconds, streams, why)
        if direction == "to-peer":
            gbps, window, error = _counted(result, sum(sent), seconds)
        else:
            gbps, window = counter.gbps(), counter.seconds
            error = None if gbps else "no bytes arrived"
        return Throughput(TCP, direction, gbps, window or seconds, streams, error)

    def iperf3(self, direction: str) -> Throughput:
        seconds, streams = self.options.seconds, self.options.streams
        answer = self.control.ask(
            {
                "op": "tool",
                "tool": tools.IPERF3,
                "address": self.plan.peer_address,
                "seconds": seconds,
            }
        )
        port = as_int(answer.get("port"))
        if port is None:
            return Throughput(
                tools.IPERF3,
                direction,
                None,
                seconds,
                streams,
                str(answer.get("error", "no port"))[:200],
            )
        argv = tools.iperf3_client(
            self.plan.peer_address, port, seconds, streams, direction == "from-peer", self.source
        )
        run = tools.run(argv, seconds + 15)
        gbps, error = tools.parse_iperf3(run.output)
        if run.returncode is None:
            error = f"iperf3 ran past {seconds + 15:g} s and was killed"
        return Throughput(tools.IPERF3, direction, gbps, seconds, streams, error)

    def ib_write_bw(self, direction: str) -> Throughput:
        """RDMA writes from the sending side's device into the receiving side's: the peer's
        ``ib_write_bw`` is the server for "to peer", this machine's for "from peer"."""
        seconds = self.options.seconds
        mine, theirs = self.plan.local.rdma[0], self.plan.peer.rdma[0]
        request = {"op": "tool", "tool": tools.IB_WRITE_BW, "device": theirs, "seconds": seconds}

        def result(gbps: float | None, error: str) -> Throughput:
            return Throughput(
                tools.IB_WRITE_BW, direction, gbps, seconds, None, None if gbps else error
            )

        if direction == "to-peer":
            answer = self.control.ask({**request, "role": "server"})
            port = as_int(answer.get("port"))
            if port is None:
                return result(None, str(answer.get("error", "no port"))[:200])
            run = tools.run(
                tools.ib_write_bw(mine, port, seconds, self.plan.peer_address), seconds + 20
            )
            return result(tools.parse_ib_write_bw(run.output), f"no result (exit {run.returncode})")
        port = tools.free_port("0.0.0.0")
        server = tools.Process(tools.ib_write_bw(mine, port, seconds))
        if not server.wait_listening("0.0.0.0", port, 5.0):
            server.kill()
            return result(None, "ib_write_bw did not start here")
        answer = self.control.ask(
            {**request, "role": "client", "address": self.source, "port": port},
            timeout=seconds + 30,
        )
        local = tools.parse_ib_write_bw(server.finish(5.0).output)
        reported = as_float(answer.get("gbps"))
        if reported is not None and not 0 < reported <= MAX_GBPS:
            reported = None  # not a rate any link has: the peer's figure is not taken
        error = str(answer.get("error", "no result"))[:200]
        return result(local or reported, error)


MAX_GBPS = 3200.0  # no link carries more (twice 1.6 TbE): a peer's figure above is refused
# The share of a TCP test's seconds the peer's arrival window must cover: the bytes are sent for
# the whole test, so they arrive across it; a shorter window is a figure made up, refused
MIN_WINDOW = 0.5


def _counted(
    result: Mapping[str, Any], sent: int, seconds: float
) -> tuple[float | None, float, str | None]:
    """(Gb/s, window, error) from what the peer says it counted of the ``sent`` bytes: a count
    above what was sent, or a window outside the measurement, is refused, not believed."""
    counted = as_int(result.get("bytes"))
    window = as_float(result.get("seconds")) or 0.0
    if result.get("error") or counted is None:
        return None, 0.0, str(result.get("error") or "the peer counted nothing")[:200]
    if not 0 <= counted <= sent:
        return None, 0.0, f"the peer reported {str(counted)[:30]} bytes, more than the {sent} sent"
    if not 0 < window <= seconds + 30:
        return None, 0.0, "no bytes arrived" if not counted else "the peer reported no window"
    if window < seconds * MIN_WINDOW:  # sent for the whole test: they arrive across most of it
        return (
            None,
            0.0,
            f"the peer reported its bytes arrived within {window:.3g} s of a {seconds:g} s test",
        )
    gbps = counted * 8 / window / 1e9
    if not gbps <= MAX_GBPS:
        return None, 0.0, f"the peer reported {gbps:.3g} Gb/s, more than any link carries"
    return gbps, window, None


@dataclass
class ToolChoice:
    """Which tools run on which paths, in words for the report."""

    here: Mapping[str, bool]
    there: Mapping[str, Any]
    status: dict[str, str] = field(default_factory=dict)

    def usable(self, tool: str, path: Plan, options: Options) -> bool:
        if not options.use_tools:
            self.status.setdefault(tool, "not run (--no-tools)")
            return False
        if not self.here.get(tool):
            self.status.setdefault(tool, "not installed here")
            return False
        if self.there.get(tool) is not True:
            self.status.setdefault(tool, "not installed on the peer")
            return False
        if tool == tools.IB_WRITE_BW and not (path.local.rdma and path.peer.rdma):
            self.status.setdefault(tool, "no RDMA device at both ends of the path")
            return False
        self.status[tool] = "ran"
        return True
