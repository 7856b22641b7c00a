"""The verdict on one path: the best throughput of each direction against what the link can
carry, and the likely cause when it falls short. A pure function of what was measured.

The ceiling of an end is the Ethernet rate it negotiated (``/sys/class/net/IF/speed``), or the
data rate of the PCIe link behind it where that is lower: a DGX Spark's ConnectX-7 interface
negotiates 200 GbE but sits on a PCIe Gen5 x4 link, 32 GT/s x 4 lanes x 128/130 = 126 Gb/s
(ServeTheHome: "a PCIe Gen5 x4 link is roughly 100Gbps"). The path's ceiling is the lower of its
two ends.

``fit``: the slower direction reaches :data:`FIT_RATIO` of the ceiling. NVIDIA's own per-rail
check on a Spark passes at 80 Gb/s, 0.63 of 126, and its guide measures 92.57 and 97.28 Gb/s
(0.73, 0.77) with ``ib_write_bw``; the degraded initialization state it describes delivers
8-25 Gb/s (0.06-0.20) by TCP and RDMA alike (NVIDIA/dgx-spark-playbooks,
performance_benchmarking_guide.md, check-connectx-bandwidth; PR #108: 12.86 Gb/s TCP, 13.23 Gb/s
``ib_write_bw``). 0.5 leaves room below NVIDIA's pass mark for a TCP measurement taken from
Python, and is still 2.5 times the top of the degraded band.
``degraded``: below that; ``failed``: nothing measured (no carrier, the peer's address did not
answer as the same ``link serve``, every transfer failed); ``unrated``: neither end knows its
rate (a virtual interface without one), so the figures are reported but not judged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sparkdiag.link.lint import MIN_MTU
from sparkdiag.link.model import DIRECTIONS, End, Throughput
from sparkdiag.snapshot import PcieLink

FIT_RATIO = 0.5
DEGRADED_BAND_GBPS = (8.0, 25.0)  # NVIDIA's degraded ConnectX-7 initialization signature
SPARK_ETHERNET_MBPS = 200000

RECOVERY = (
    "keep the QSFP cables where they are and reboot both machines, then test again in both "
    "directions; if the cap stays, shut both down, unplug each one's USB-C power and its "
    "adapter from the wall for at least 60 s, power up and test again; update DGX OS and the "
    "firmware first if they are behind (NVIDIA/dgx-spark-playbooks, connect-two-sparks "
    "performance guide, 'Detect a degraded ConnectX-7 initialization')"
)


def pcie_gbps(link: PcieLink | None) -> float | None:
    """Data rate of a PCIe link in Gb/s: GT/s x lanes x 128/130 (Gen3 and later) or 8/10."""
    if link is None or not link.current_speed_tps or not link.current_width:
        return None
    encoding = 128 / 130 if link.current_speed_tps >= 8e9 else 0.8
    return link.current_speed_tps * link.current_width * encoding / 1e9


def pcie_short(link: PcieLink | None) -> str | None:
    """``x2 of x4`` or ``16 of 32 GT/s`` where the link trained below its maximum, else None."""
    if link is None:
        return None
    parts = []
    if link.current_width and link.max_width and link.current_width < link.max_width:
        parts.append(f"x{link.current_width} of x{link.max_width}")
    if (
        link.current_speed_tps
        and link.max_speed_tps
        and link.current_speed_tps < link.max_speed_tps
    ):
        parts.append(f"{link.current_speed_tps / 1e9:g} of {link.max_speed_tps / 1e9:g} GT/s")
    return ", ".join(parts) or None


def _rate(gbps: float) -> str:
    return f"{gbps:.3g} Gb/s" if gbps < 10 else f"{gbps:.1f} Gb/s"


def _measured(throughput: Sequence[Throughput]) -> dict[str, Throughput]:
    best: dict[str, Throughput] = {}
    for t in throughput:
        if t.gbps and (t.direction not in best or t.gbps > (best[t.direction].gbps or 0)):
            best[t.direction] = t
    return best


def judge(
    local: End,
    peer: End,
    throughput: Sequence[Throughput],
    peer_lint: Sequence[Mapping[str, Any]] = (),
) -> tuple[str, str, str | None, str]:
    """(verdict, finding, likely cause or None, action) for one path."""
    best = _measured(throughput)
    if not best:
        errors = "; ".join(sorted({t.error for t in throughput if t.error})) or "no bytes arrived"
        return (
            "failed",
            f"nothing measured: {errors}",
            None,
            "check that the peer's 'sparkdiag link serve' still runs and that nothing between "
            "the two blocks the port",
        )
    shown = ", ".join(
        f"{d.replace('-', ' ')} {_rate(t.gbps or 0)} ({t.method})"
        for d in DIRECTIONS
        if (t := best.get(d))
    )
    rates = [c for c in (local.ceiling_gbps, peer.ceiling_gbps) if c]
    if not rates:
        return (
            "unrated",
            f"{shown}; neither end reports a negotiated rate to judge it against",
            None,
            "read the figures yourself, or test over an interface with a rate "
            "(cat /sys/class/net/IF/speed)",
        )
    ceiling = min(rates)
    slowest = min(best.values(), key=lambda t: t.gbps or 0)
    ratio = (slowest.gbps or 0) / ceiling
    missing = [d.replace("-", " ") for d in DIRECTIONS if d not in best]
    gap = f"; {', '.join(missing)} not measured" if missing else ""
    finding = f"{shown}: {ratio:.0%} of the {_rate(ceiling)} ceiling{gap}"
    if ratio >= FIT_RATIO:
        return "fit", finding, None, ""
    cause, action = _cause(local, peer, slowest.gbps or 0, peer_lint)
    return "degraded", finding, cause, action


def _cause(
    local: End, peer: End, gbps: float, peer_lint: Sequence[Mapping[str, Any]]
) -> tuple[str, str]:
    """The likeliest cause of a degraded path, and what to do."""
    ends = (("this machine", local), ("the peer", peer))
    low, high = DEGRADED_BAND_GBPS
    cx7 = [name for name, end in ends if end.cx7]
    healthy_links = all(
        end.speed_mbps in (None, SPARK_ETHERNET_MBPS) and end.pcie_short is None
        for _, end in ends
        if end.cx7
    )
    if cx7 and low <= gbps <= high and healthy_links:
        return (
            f"the degraded ConnectX-7 initialization state: {_rate(gbps)} is in its 8-25 Gb/s "
            "band while the links negotiate 200 GbE and PCIe Gen5 x4 (NVIDIA's guide; "
            "NVIDIA/dgx-spark-playbooks PR #108: 12.86 Gb/s TCP, 13.23 Gb/s RDMA)",
            RECOVERY,
        )
    for name, end in ends:
        if end.pcie_short:
            return (
                f"the PCIe link behind {end.interface or 'the interface'} on {name} trained "
                f"at {end.pcie_short}",
                "reseat the card or cable, check the firmware and BIOS, and see the pcie-host "
                "row of 'sparkdiag check' on that machine",
            )
    for name, end in ends:
        if end.cx7 and end.mtu is not None and end.mtu < MIN_MTU:
            return (
                f"MTU {end.mtu} on {end.interface or 'the interface'} ({name}): ConnectX-7 "
                "interfaces default to 1500 and two Sparks reached full rate only with 9000 "
                "(NVIDIA/dgx-spark-playbooks#102/#103)",
                f"sudo ip link set dev {end.interface or 'IF'} mtu {MIN_MTU} on both machines "
                "(and 'mtu: 9000' in the netplan file); 'sparkdiag link lint' lists the rest",
            )
    mtu = [f for f in peer_lint if f.get("code") == "mtu"]
    if mtu:
        return f"the peer's lint: {mtu[0].get('finding')}", str(mtu[0].get("fix", ""))
    return (
        "no configuration finding explains it",
        "check the cable and both ends' error counters (ethtool -S IF: discards, symbol "
        "errors), install iperf3 on both machines to rule out the measuring tool, and run "
        "'sparkdiag link lint' on both",
    )
