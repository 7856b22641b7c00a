"""Text for a terminal: the link test's report and the lint's findings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sparkdiag.link.lint import Finding
from sparkdiag.link.model import DIRECTIONS, End, LinkReport, PathResult
from sparkdiag.link.readings import FabricReadings


def _gbps(value: float) -> str:
    return f"{value:.3g} Gb/s" if value < 10 else f"{value:.1f} Gb/s"


def _end(end: End) -> str:
    parts = []
    if end.speed_mbps:
        parts.append(f"negotiated {_gbps(end.speed_mbps / 1000)}")
    if end.pcie_gbps:
        parts.append(
            f"PCIe {_gbps(end.pcie_gbps)}" + (f" ({end.pcie_short})" if end.pcie_short else "")
        )
    if end.mtu:
        parts.append(f"MTU {end.mtu}")
    return ", ".join(parts) or "rate unknown"


def _path(path: PathResult) -> list[str]:
    local, peer = path.local, path.peer
    head = f"{local.interface or '?'} {local.address or ''} -> {peer.address or '?'}"
    if peer.interface:
        head += f" ({peer.interface})"
    lines = [head.replace("  ", " ")]
    if path.verdict == "failed" and not path.throughput:
        lines.append(f"  failed      {path.finding}")
        return lines
    lines.append(f"  here        {_end(local)}")
    lines.append(f"  peer        {_end(peer)}")
    if path.latency is not None:
        lat = path.latency
        lines.append(
            f"  latency     median {lat.median_us:.0f} µs, p99 {lat.p99_us:.0f} µs, min "
            f"{lat.min_us:.0f} µs ({lat.round_trips} TCP round trips)"
        )
    for direction in DIRECTIONS:
        shown = []
        for t in path.throughput:
            if t.direction != direction:
                continue
            streams = f", {t.streams} streams" if t.streams and t.method != "iperf3" else ""
            shown.append(
                f"{t.method} {_gbps(t.gbps)}{streams}"
                if t.gbps
                else f"{t.method} failed: {t.error}"
            )
        if shown:
            lines.append(f"  {direction.replace('-', ' '):<11} " + " · ".join(shown))
    lines.append(f"  {path.verdict:<11} {path.finding}")
    if path.cause:
        lines.append(f"  cause       {path.cause}")
    if path.action:
        lines.append(f"  do          {path.action}")
    lines += [f"  note        {note}" for note in path.notes]
    return lines


def _codes(findings: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(str(f.get("code")) for f in findings) or "none"


def report_text(report: LinkReport) -> str:
    host = (
        f" (host {report.peer_host}, sparkdiag {report.peer_version})" if report.peer_host else ""
    )
    lines = [f"peer {report.peer}:{report.port}{host}"]
    for path in report.paths:
        lines += _path(path)
    tools = "; ".join(f"{tool} {status}" for tool, status in report.tools.items())
    lines.append(f"tools: tcp-sockets ran{'; ' + tools if tools else ''}")
    lines.append(
        f"lint here: {_codes(report.lint_local)}; lint on the peer: {_codes(report.lint_peer)}"
    )
    lines += [f"note: {note}" for note in report.notes]
    lines.append(
        f"verdict: {report.verdict} ({report.seconds:.1f} s, exit status {report.exit_code})"
    )
    return "\n".join(lines) + "\n"


def readings_text(readings: FabricReadings) -> list[str]:
    lines = []
    if readings.functions:
        for f in readings.functions:
            names = ", ".join(
                f"{i.name} ({'up' if i.up else 'no carrier'}, MTU {i.mtu})" for i in f.interfaces
            )
            rdma = ", ".join(f.rdma) or "no RDMA device"
            lines.append(f"ConnectX-7 {f.address}: {names or 'no interface'}; {rdma}")
    else:
        lines.append("no ConnectX-7 (PCI 15b3:1021) on this machine")
    for name, setting in readings.nccl.effective.items():
        lines.append(f"{name}={setting.value} ({setting.origin})")
    for lib in readings.libraries:
        version = lib.version or "unknown version"
        lines.append(
            f"NCCL {version} ({lib.origin}{', ' + lib.package if lib.package else ''}): {lib.path}"
        )
    if readings.cma_total_bytes is not None:
        free = (
            f", CmaFree {readings.cma_free_bytes / 1024:.0f} kB"
            if readings.cma_free_bytes is not None
            else ""
        )
        lines.append(f"CmaTotal {readings.cma_total_bytes / 1024:.0f} kB{free}")
    return lines


def lint_text(readings: FabricReadings, findings: Sequence[Finding]) -> str:
    lines = readings_text(readings)
    lines.append("")
    if not findings:
        lines.append("no findings")
    for finding in findings:
        lines.append(f"{finding.code}: {finding.finding}")
        lines.append(f"  why: {finding.figure}")
        lines.append(f"  fix: {finding.fix}")
    return "\n".join(lines) + "\n"
