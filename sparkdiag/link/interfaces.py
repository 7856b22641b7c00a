"""Which interface NCCL's sockets take, against the ConnectX-7's: rules of the lint
(:mod:`sparkdiag.link.lint`), pure functions of :class:`~sparkdiag.link.readings.FabricReadings`.

NCCL opens its bootstrap connections, and its socket transport when RDMA is off or fails, on
the interfaces ``NCCL_SOCKET_IFNAME`` selects; unset, it leaves out ``lo`` and ``docker*``
unless nothing else is there and favours names starting with ``ib`` (NCCL documentation,
NCCL_SOCKET_IFNAME), so on a DGX Spark, whose ConnectX-7 interfaces are named ``enp1s0f*np*``
and ``enP2p1s0f*np*``, it can take the Realtek 10GbE port (r8127) or the Wi-Fi (mt7925e).

``ifname-not-cx7``
    ``NCCL_SOCKET_IFNAME`` selects interfaces that are up, none of them a ConnectX-7's, while a
    ConnectX-7 interface is up;
``ifname-unset``
    it is unset while a ConnectX-7 interface and another physical interface (Ethernet, Wi-Fi)
    are both up;
``route-not-cx7``
    the routing table sends traffic for ``--peer`` through an interface that is not a
    ConnectX-7's (the peer's address is on the management network, or a route prefers it).
"""

from __future__ import annotations

from sparkdiag.link.findings import Finding
from sparkdiag.link.nccl_list import parse_nccl_list
from sparkdiag.link.readings import FabricReadings
from sparkdiag.sources.host.netif import NetInterface

WRONG_PATH_FIGURE = (
    "NCCL's sockets run over the interface NCCL_SOCKET_IFNAME selects (unset: not lo or "
    "docker*, names starting with 'ib' first; NCCL documentation); two Sparks moved ~96 Gb/s of "
    "200 over untuned TCP on their ConnectX-7 (catharsis.net.au), while the Realtek port is "
    "10 GbE and the Wi-Fi slower still"
)
DRIVERS = {
    "r8127": "Realtek 10GbE",
    "r8169": "Realtek 1GbE",
    "igb": "Intel 1GbE",
    "e1000e": "Intel 1GbE",
    "mt7925e": "MediaTek Wi-Fi",
}


def describe(readings: FabricReadings, interface: NetInterface) -> str:
    """``enP7s7 (Realtek 10GbE, r8127, 10 Gb/s)``, ``wlP9s9 (Wi-Fi, mt7925e)``."""
    driver, wireless = readings.kinds.get(interface.name, (None, False))
    parts = []
    if wireless:
        parts.append("Wi-Fi")
    elif driver in DRIVERS:
        parts.append(DRIVERS[driver])
    if driver:
        parts.append(driver)
    if interface.speed_mbps:
        parts.append(f"{interface.speed_mbps / 1000:g} Gb/s")
    return f"{interface.name} ({', '.join(parts)})" if parts else interface.name


def _cx7(readings: FabricReadings) -> tuple[set[str], list[str]]:
    names = {i.name for f in readings.functions for i in f.interfaces}
    up = sorted(i.name for f in readings.functions for i in f.interfaces if i.up)
    return names, up


def _others_up(readings: FabricReadings, cx7: set[str]) -> list[NetInterface]:
    return [
        i
        for name, i in sorted(readings.interfaces.items())
        if i.up and name not in cx7 and i.pci_address is not None
    ]


def interfaces(readings: FabricReadings) -> list[Finding]:
    """The module's rules, in its order."""
    cx7, cx7_up = _cx7(readings)
    if not cx7_up:
        return []
    findings = []
    setting = readings.nccl.effective.get("NCCL_SOCKET_IFNAME")
    fix = f"export NCCL_SOCKET_IFNAME={','.join(cx7_up)} on both machines"
    if setting is not None:
        wanted = parse_nccl_list(setting.value)
        chosen = [i for n, i in sorted(readings.interfaces.items()) if wanted.selects(n) and i.up]
        chosen = [i for i in chosen if i.name != "lo"]
        if chosen and not any(i.name in cx7 for i in chosen):
            where = "in the environment" if setting.origin == "environment" else setting.origin
            findings.append(
                Finding(
                    "ifname-not-cx7",
                    "NCCL_SOCKET_IFNAME",
                    f"NCCL_SOCKET_IFNAME={setting.value} ({where}) selects "
                    f"{', '.join(describe(readings, i) for i in chosen)}, not a ConnectX-7 "
                    f"interface (up: {', '.join(cx7_up)})",
                    WRONG_PATH_FIGURE,
                    fix,
                )
            )
    else:
        others = _others_up(readings, cx7)
        if others:
            findings.append(
                Finding(
                    "ifname-unset",
                    "NCCL_SOCKET_IFNAME",
                    "NCCL_SOCKET_IFNAME is not set while "
                    f"{', '.join(describe(readings, i) for i in others)} "
                    f"{'is' if len(others) == 1 else 'are'} up beside the ConnectX-7 "
                    f"interfaces ({', '.join(cx7_up)}): NCCL can take either",
                    WRONG_PATH_FIGURE,
                    fix,
                )
            )
    route = readings.peer_route
    name = route[1] if route is not None else None
    if route is not None and name is not None and name not in cx7:
        peer = route[0]
        through = readings.interfaces.get(name)
        shown = describe(readings, through) if through is not None else name
        findings.append(
            Finding(
                "route-not-cx7",
                peer,
                f"traffic to {peer} leaves through {shown}, not a ConnectX-7 interface",
                WRONG_PATH_FIGURE,
                "give the peer by its address on the ConnectX-7 link (ip -br addr show "
                f"{cx7_up[0]} on the peer), or put both machines' ConnectX-7 interfaces on "
                "their own subnet",
            )
        )
    return findings
