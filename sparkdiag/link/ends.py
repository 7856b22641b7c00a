"""One end of a path, described from this machine's readings, and as the listening side sends
it in its hello (and the measuring side reads it back, from JSON it does not trust)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sparkdiag.jsonvalues import as_float, as_int, as_str
from sparkdiag.link.model import End
from sparkdiag.link.readings import FabricReadings
from sparkdiag.link.verdict import pcie_gbps, pcie_short
from sparkdiag.sources.host.netif import InterfaceAddress
from sparkdiag.sources.host.sysfs import read_link


def local_end(
    name: str | None, readings: FabricReadings, sysfs: Path, address: str | None = None
) -> End:
    """The end at interface ``name`` of this machine (an unknown name gives a bare End)."""
    iface = readings.interfaces.get(name) if name else None
    if iface is None:
        return End(interface=name, address=address)
    function = next((f for f in readings.functions if f.address == iface.pci_address), None)
    link = function.link if function is not None else None
    if link is None and iface.pci_address:
        link = read_link(sysfs / "bus" / "pci" / "devices" / iface.pci_address)
    return End(
        interface=name,
        address=address,
        mtu=iface.mtu,
        speed_mbps=iface.speed_mbps,
        pcie_gbps=pcie_gbps(link),
        pcie_short=pcie_short(link),
        cx7=function is not None,
        rdma=function.rdma if function is not None else (),
        up=iface.up,
    )


def describe(
    names: Iterable[str],
    readings: FabricReadings,
    sysfs: Path,
    addresses: Iterable[InterfaceAddress],
) -> list[dict[str, Any]]:
    """The interfaces ``names`` as the hello lists them: each End plus its addresses."""
    by_name: dict[str, list[str]] = {}
    for entry in addresses:
        by_name.setdefault(entry.interface, []).append(str(entry.network))
    out = []
    for name in dict.fromkeys(names):
        end = local_end(name, readings, sysfs).as_json()
        end["speed_mbps"] = (
            readings.interfaces[name].speed_mbps if name in readings.interfaces else None
        )
        end["addresses"] = by_name.get(name, [])
        out.append({k: v for k, v in end.items() if v is not None})
    return out


# What a peer may report for an interface: anything outside is dropped as if not reported (a
# ceiling of "inf Gb/s" or 1e27 Gb/s would make any rate look slow, a tiny one any rate fit).
MAX_SPEED_MBPS = 3_200_000  # 3.2 Tb/s: twice the fastest Ethernet standard (1.6 TbE)
MAX_PCIE_GBPS = 2_000.0  # PCIe 7.0 x16 carries about 1000 Gb/s per direction
MTU_RANGE = (68, 65_536)  # IPv4's minimum; the largest a Linux interface takes
MAX_TEXT = 64  # characters of an interface name, PCIe note or RDMA device name


def _bounded(value: float | None, low: float, high: float) -> float | None:
    return value if value is not None and low <= value <= high else None


def _short(value: str | None) -> str | None:
    return value if value is not None and len(value) <= MAX_TEXT else None


def peer_end(entry: Mapping[str, Any], address: str | None) -> End:
    """An End from one interface of the peer's hello: fields of the wrong type, or outside
    what any interface can be, are dropped."""
    rdma = entry.get("rdma")
    mtu = _bounded(as_int(entry.get("mtu")), *MTU_RANGE)
    speed = _bounded(as_int(entry.get("speed_mbps")), 1, MAX_SPEED_MBPS)
    return End(
        interface=_short(as_str(entry.get("interface"))),
        address=address,
        mtu=None if mtu is None else int(mtu),
        speed_mbps=None if speed is None else int(speed),
        pcie_gbps=_bounded(as_float(entry.get("pcie_gbps")), 0.001, MAX_PCIE_GBPS),
        pcie_short=_short(as_str(entry.get("pcie_below_max"))),
        cx7=entry.get("connectx7") is True,
        rdma=tuple(r for r in rdma[:16] if isinstance(r, str) and len(r) <= MAX_TEXT)
        if isinstance(rdma, list)
        else (),
        up=entry.get("carrier") if isinstance(entry.get("carrier"), bool) else None,
    )
