"""What one ``sparkdiag link test`` measured: per path (a local interface and the peer's address
on the same link) the latency, the throughput of every method in each direction, the rates the
two ends negotiated, and the verdict. Units: Gb/s are 10^9 bits per second, latencies in µs.
A value that was not measured or is not known is left out of the JSON, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkdiag.errors import Exit

FORMAT = "sparkdiag-link-test/1"
DIRECTIONS = ("to-peer", "from-peer")
VERDICTS = ("fit", "unrated", "degraded", "failed")  # best first
EXIT = {
    "fit": Exit.OK,
    "unrated": Exit.ATTENTION,
    "degraded": Exit.ATTENTION,
    "failed": Exit.FAILED,
}


def _drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


@dataclass(frozen=True)
class End:
    """One end of a path as that machine reads it: its interface and address, MTU, the Ethernet
    rate it negotiated (Mb/s), the data rate of the PCIe link behind it (Gb/s), whether that
    link trained below its maximum, whether it is a ConnectX-7, its RDMA devices."""

    interface: str | None = None
    address: str | None = None
    mtu: int | None = None
    speed_mbps: int | None = None
    pcie_gbps: float | None = None
    pcie_short: str | None = None  # "x2 of x4", "16 of 32 GT/s": the link trained below its max
    cx7: bool = False
    rdma: tuple[str, ...] = ()
    up: bool | None = None

    @property
    def ceiling_gbps(self) -> float | None:
        """The most this end can carry: the negotiated rate, or the PCIe link if lower."""
        rates = [r for r in (self.speed_mbps and self.speed_mbps / 1000, self.pcie_gbps) if r]
        return min(rates) if rates else None

    def as_json(self) -> dict[str, Any]:
        return _drop_none(
            {
                "interface": self.interface,
                "address": self.address,
                "mtu": self.mtu,
                "negotiated_gbps": self.speed_mbps / 1000 if self.speed_mbps else None,
                "pcie_gbps": round(self.pcie_gbps, 2) if self.pcie_gbps else None,
                "pcie_below_max": self.pcie_short,
                "connectx7": self.cx7,
                "rdma": list(self.rdma) or None,
                "carrier": self.up,
                "ceiling_gbps": round(c, 2) if (c := self.ceiling_gbps) else None,
            }
        )


@dataclass(frozen=True)
class Throughput:
    """One method in one direction: ``tcp-sockets`` (sparkdiag's own, N parallel streams),
    ``iperf3`` (TCP) or ``ib_write_bw`` (RDMA write); ``gbps`` as counted by the receiver."""

    method: str
    direction: str
    gbps: float | None
    seconds: float
    streams: int | None = None
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return _drop_none(
            {
                "method": self.method,
                "direction": self.direction,
                "gbps": round(self.gbps, 3) if self.gbps is not None else None,
                "seconds": round(self.seconds, 3),
                "streams": self.streams,
                "error": self.error,
            }
        )


@dataclass(frozen=True)
class Latency:
    """TCP round trips of 32 bytes (Python at both ends): median, 99th percentile, minimum."""

    median_us: float
    p99_us: float
    min_us: float
    round_trips: int

    def as_json(self) -> dict[str, Any]:
        return {
            "median_us": round(self.median_us, 1),
            "p99_us": round(self.p99_us, 1),
            "min_us": round(self.min_us, 1),
            "round_trips": self.round_trips,
        }


@dataclass(frozen=True)
class PathResult:
    """One path: its two ends, what was measured, the verdict (fit, degraded, failed, or
    unrated when neither end knows its rate), the finding in one line, the likely cause when
    degraded, and what to do."""

    local: End
    peer: End
    verdict: str
    finding: str
    action: str = ""
    cause: str | None = None
    latency: Latency | None = None
    throughput: tuple[Throughput, ...] = ()
    notes: tuple[str, ...] = ()

    def best(self, direction: str) -> Throughput | None:
        measured = [t for t in self.throughput if t.direction == direction and t.gbps]
        return max(measured, key=lambda t: t.gbps or 0.0) if measured else None

    @property
    def ceiling_gbps(self) -> float | None:
        rates = [c for c in (self.local.ceiling_gbps, self.peer.ceiling_gbps) if c]
        return min(rates) if rates else None

    def as_json(self) -> dict[str, Any]:
        best = {d: round(b.gbps, 3) for d in DIRECTIONS if (b := self.best(d)) and b.gbps}
        ratio = None
        if best and self.ceiling_gbps:
            ratio = round(min(best.values()) / self.ceiling_gbps, 3)
        return _drop_none(
            {
                "local": self.local.as_json(),
                "peer": self.peer.as_json(),
                "ceiling_gbps": round(c, 2) if (c := self.ceiling_gbps) else None,
                "latency": self.latency.as_json() if self.latency else None,
                "throughput": [t.as_json() for t in self.throughput],
                "best_gbps": best or None,
                "ratio": ratio,
                "verdict": self.verdict,
                "finding": self.finding,
                "cause": self.cause,
                "action": self.action or None,
                "notes": list(self.notes) or None,
            }
        )


@dataclass(frozen=True)
class LinkReport:
    """The whole run against one peer."""

    peer: str
    port: int
    paths: tuple[PathResult, ...]
    seconds: float
    peer_host: str | None = None
    peer_version: str | None = None
    tools: Mapping[str, str] = field(default_factory=dict)
    lint_local: tuple[Mapping[str, Any], ...] = ()
    lint_peer: tuple[Mapping[str, Any], ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def verdict(self) -> str:
        if not self.paths:
            return "failed"
        return max((p.verdict for p in self.paths), key=VERDICTS.index)

    @property
    def exit_code(self) -> int:
        return int(EXIT[self.verdict])

    def as_json(self) -> dict[str, Any]:
        return _drop_none(
            {
                "format": FORMAT,
                "peer": self.peer,
                "port": self.port,
                "peer_host": self.peer_host,
                "peer_version": self.peer_version,
                "verdict": self.verdict,
                "exit_status": self.exit_code,
                "seconds": round(self.seconds, 2),
                "paths": [p.as_json() for p in self.paths],
                "tools": dict(self.tools),
                "lint": {"local": list(self.lint_local), "peer": list(self.lint_peer)},
                "notes": list(self.notes) or None,
            }
        )
