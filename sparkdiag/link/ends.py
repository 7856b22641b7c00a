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
from sparkdiag.sources.netif import InterfaceAddress
from sparkdiag.sources.sysfs import read_link


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


def peer_end(entry: Mapping[str, Any], address: str | None) -> End:
    """An End from one interface of the peer's hello (fields of the wrong type are dropped)."""
    rdma = entry.get("rdma")
    return End(
        interface=as_str(entry.get("interface")),
        address=address,
        mtu=as_int(entry.get("mtu")),
        speed_mbps=as_int(entry.get("speed_mbps")),
        pcie_gbps=as_float(entry.get("pcie_gbps")),
        pcie_short=as_str(entry.get("pcie_below_max")),
        cx7=entry.get("connectx7") is True,
        rdma=tuple(r for r in rdma if isinstance(r, str)) if isinstance(rdma, list) else (),
        up=entry.get("carrier") if isinstance(entry.get("carrier"), bool) else None,
    )
