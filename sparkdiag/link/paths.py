"""Which paths to measure: this machine's ConnectX-7 interfaces with a carrier, each paired with
the peer's address on the same network (the peer's interface of the same name first), or the
interfaces given, or the route to the peer itself."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkdiag.errors import UsageError
from sparkdiag.jsonvalues import as_map, as_str
from sparkdiag.link.ends import local_end, peer_end
from sparkdiag.link.model import End
from sparkdiag.link.readings import FabricReadings
from sparkdiag.link.session import Control, LinkError, Options
from sparkdiag.sources.host.netif import InterfaceAddress, interface_of, plain_address


@dataclass(frozen=True)
class Plan:
    """One path to measure: this machine's end, the peer's (from its hello), or why it cannot
    be measured."""

    local: End
    peer: End
    failed: str | None = None

    @property
    def peer_address(self) -> str:
        return self.peer.address or ""

    @staticmethod
    def make(local: End, peer_address: str, entry: Mapping[str, Any]) -> Plan:
        return Plan(local, peer_end(entry, peer_address))

    @staticmethod
    def cannot(local: End, why: str) -> Plan:
        return Plan(local, End(), why)


def _networks(name: str, addresses: Sequence[InterfaceAddress]) -> list[InterfaceAddress]:
    """The addresses of ``name`` to pair on: IPv4 ones (169.254/16 included: the playbooks'
    automatic addressing) and IPv6 ones that need no scope (not fe80::/10)."""
    return [
        a
        for a in addresses
        if a.interface == name and (a.network.version == 4 or not a.network.ip.is_link_local)
    ]


def _peer_entries(hello_msg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    entries = hello_msg.get("interfaces")
    return [as_map(e) for e in entries] if isinstance(entries, list) else []


def _peer_address_on(
    name: str, mine: Sequence[InterfaceAddress], entries: Sequence[Mapping[str, Any]]
) -> tuple[str, str, Mapping[str, Any]] | None:
    """(local address, peer address, peer interface) for a peer address on a network of one of
    ``mine``; the peer's interface of the same name first."""
    found = []
    for entry in entries:
        listed = entry.get("addresses")
        for text in listed if isinstance(listed, list) else []:
            try:
                theirs = ipaddress.ip_interface(str(text)).ip
            except ValueError:
                continue
            for local in mine:
                if theirs in local.network.network and theirs != local.network.ip:
                    found.append(
                        (entry.get("interface") != name, local.address, str(theirs), entry)
                    )
    if not found:
        return None
    found.sort(key=lambda item: item[0])
    _, local_address, peer_address, entry = found[0]
    return local_address, peer_address, entry


def no_carrier(name: str) -> str:
    return (
        f"{name} has no carrier: the cable is unplugged or the port at the other end is down "
        f"(ip link show {name} says NO-CARRIER or DOWN)"
    )


@dataclass(frozen=True)
class Selection:
    """The local interfaces to measure over (empty: the route to the peer), and the ConnectX-7
    interfaces left out for want of a carrier."""

    names: tuple[str, ...]
    left_out: tuple[str, ...] = ()


def select_interfaces(options: Options, readings: FabricReadings) -> Selection:
    """Decided before any traffic: ``--interface`` (each must exist: UsageError), none with
    ``--address-only``, else every ConnectX-7 interface with a carrier. Raises LinkError when
    every interface chosen lacks a carrier."""
    if options.interfaces:
        for name in options.interfaces:
            if name not in readings.interfaces:
                present = ", ".join(readings.interfaces) or "none"
                raise UsageError(
                    f"{name}: no such interface here (present: {present})", flag="--interface"
                )
        if not any(readings.interfaces[name].up for name in options.interfaces):
            raise LinkError("; ".join(no_carrier(name) for name in options.interfaces))
        return Selection(tuple(options.interfaces))
    if options.address_only:
        return Selection(())
    cx7 = [i.name for f in readings.functions for i in f.interfaces]
    up = tuple(
        name for name in cx7 if readings.interfaces.get(name, None) and readings.interfaces[name].up
    )
    if cx7 and not up:
        raise LinkError(
            f"no ConnectX-7 interface has a carrier ({', '.join(cx7)}): plug the QSFP cable in "
            "at both ends (or give --address-only to measure the route to the peer instead)"
        )
    return Selection(up, tuple(name for name in cx7 if name not in up))


def plan_paths(
    control: Control,
    selection: Selection,
    readings: FabricReadings,
    addresses: Sequence[InterfaceAddress],
    sysfs: Path,
) -> list[Plan]:
    """Each selected interface paired with the peer's address on its network (see the module),
    or the route to the peer; a path that cannot be measured says why."""
    entries = _peer_entries(control.hello)
    arrived = as_str(control.hello.get("arrived_on"))
    arrived_entry = next((e for e in entries if e.get("interface") == arrived), {})
    plans = []
    peer_host = plain_address(control.sock.getpeername()[0])
    for name in selection.names:
        end = local_end(name, readings, sysfs)
        if not readings.interfaces[name].up:
            plans.append(Plan.cannot(end, no_carrier(name)))
            continue
        mine = _networks(name, addresses)
        if not mine:
            why = (
                f"{name} has no IP address: give it one on both machines (netplan, or "
                f"sudo ip addr add ADDR/24 dev {name}) to measure it"
            )
            plans.append(Plan.cannot(end, why))
            continue
        pair = _peer_address_on(name, mine, entries)
        if pair is None:
            host = ipaddress.ip_address(peer_host)
            source = next((a.address for a in mine if host in a.network.network), None)
            pair = (source, peer_host, arrived_entry) if source else None
        if pair is None:
            nets = ", ".join(str(a.network.network) for a in mine)
            why = (
                f"the peer reports no address on {name}'s network ({nets}): give its interface "
                "on this link an address there"
            )
            plans.append(Plan.cannot(end, why))
            continue
        local_address, peer_address, entry = pair
        plans.append(
            Plan.make(local_end(name, readings, sysfs, local_address), peer_address, entry)
        )
    if not selection.names:
        local_address = plain_address(control.sock.getsockname()[0])
        route = interface_of(local_address, list(addresses))
        plans.append(
            Plan.make(local_end(route, readings, sysfs, local_address), peer_host, arrived_entry)
        )
    return plans
