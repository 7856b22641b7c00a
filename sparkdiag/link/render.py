"""Text for a terminal: the link test's report and the lint's findings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sparkdiag import terminal
from sparkdiag.link.findings import Finding
from sparkdiag.link.gpudirect import state as gpudirect_state
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


def _field(label: str, text: str, width: int) -> list[str]:
    """``  label       text``, the text wrapped under itself."""
    return terminal.hang(f"  {label:<11} ", text, width)


def _path(path: PathResult, width: int) -> list[str]:
    local, peer = path.local, path.peer
    head = f"{local.interface or '?'} {local.address or ''} -> {peer.address or '?'}"
    if peer.interface:
        head += f" ({peer.interface})"
    lines = [terminal.safe(head.replace("  ", " "))]  # the peer's names come from the peer
    if path.verdict == "failed" and not path.throughput:
        lines += _field("failed", path.finding, width)
        return lines
    lines += _field("here", _end(local), width)
    lines += _field("peer", _end(peer), width)
    if path.latency is not None:
        lat = path.latency
        lines += _field(
            "latency",
            f"median {lat.median_us:.0f} µs, p99 {lat.p99_us:.0f} µs, min "
            f"{lat.min_us:.0f} µs ({lat.round_trips} TCP round trips)",
            width,
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
            lines += _field(direction.replace("-", " "), " · ".join(shown), width)
    lines += _field(path.verdict, path.finding, width)
    if path.cause:
        lines += _field("cause", path.cause, width)
    if path.action:
        lines += _field("do", path.action, width)
    for note in path.notes:
        lines += _field("note", note, width)
    return lines


def _codes(findings: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(str(f.get("code")) for f in findings) or "none"


def report_text(report: LinkReport, width: int | None = None) -> str:
    """The link test's report within ``width`` columns (the terminal's by default)."""
    width = terminal.width() if width is None else width
    host = (
        f" (host {report.peer_host}, sparkdiag {report.peer_version})" if report.peer_host else ""
    )
    lines = terminal.wrap(f"peer {report.peer}:{report.port}{host}", width, "", "    ")
    for path in report.paths:
        lines += _path(path, width)
    tools = "; ".join(f"{tool} {status}" for tool, status in report.tools.items())
    lines += terminal.wrap(f"tcp-sockets ran{'; ' + tools if tools else ''}", width, "tools: ")
    lines += terminal.wrap(
        f"lint here: {_codes(report.lint_local)}; lint on the peer: {_codes(report.lint_peer)}",
        width,
        "",
        "    ",
    )
    for note in report.notes:
        lines += terminal.wrap(note, width, "note: ")
    lines.append(
        f"verdict: {report.verdict} ({report.seconds:.1f} s, exit status {report.exit_code})"
    )
    return "\n".join(lines) + "\n"


def readings_text(readings: FabricReadings, width: int | None = None) -> list[str]:
    width = terminal.width() if width is None else width
    lines: list[str] = []

    def para(text: str) -> None:
        lines.extend(terminal.wrap(text, width, "", "    "))

    if readings.functions:
        for f in readings.functions:
            names = ", ".join(
                f"{i.name} ({'up' if i.up else 'no carrier'}, MTU {i.mtu})" for i in f.interfaces
            )
            rdma = ", ".join(f.rdma) or "no RDMA device"
            para(f"ConnectX-7 {f.address}: {names or 'no interface'}; {rdma}")
    else:
        para("no ConnectX-7 (PCI 15b3:1021) on this machine")
    for name, setting in readings.nccl.effective.items():
        para(f"{name}={setting.value} ({setting.origin})")
    for lib in readings.libraries:
        version = lib.version or "unknown version"
        para(
            f"NCCL {version} ({lib.origin}{', ' + lib.package if lib.package else ''}): {lib.path}"
        )
    if readings.cma_total_bytes is not None:
        free = (
            f", CmaFree {readings.cma_free_bytes / 1024:.0f} kB"
            if readings.cma_free_bytes is not None
            else ""
        )
        para(f"CmaTotal {readings.cma_total_bytes / 1024:.0f} kB{free}")
    if readings.functions:
        para(gpudirect_state(readings))
    return lines


def lint_text(
    readings: FabricReadings, findings: Sequence[Finding], width: int | None = None
) -> str:
    """The fabric's readings and the lint's findings within ``width`` columns (the terminal's by
    default): each finding, why (the measured figure) and the fix."""
    width = terminal.width() if width is None else width
    lines = readings_text(readings, width)
    lines.append("")
    if not findings:
        lines.append("no findings")
    for finding in findings:
        lines += terminal.wrap(f"{finding.code}: {finding.finding}", width, "", "    ")
        lines += terminal.wrap(finding.figure, width, "  why: ")
        lines += terminal.wrap(finding.fix, width, "  fix: ")
    return "\n".join(lines) + "\n"
