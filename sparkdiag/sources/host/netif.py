"""Network interfaces, RDMA devices and ConnectX-7 functions read from sysfs (``--path.sysfs``)::

    /sys/class/net/IF -> ../../devices/pci0000:00/0000:00:00.0/0000:01:00.1/net/IF
    /sys/class/net/IF/{mtu,speed,carrier,operstate}     "1500", "200000" (Mb/s), "1", "up"
    /sys/bus/pci/devices/ADDR/{vendor,device}            "0x15b3", "0x1021" (ConnectX-7)
    /sys/bus/pci/devices/ADDR/net/IF                     the interfaces of that function
    /sys/bus/pci/devices/ADDR/infiniband/DEV/ports/N/{state,link_layer}   "4: ACTIVE", "Ethernet"

The PCI function behind an interface is found from where ``class/net/IF`` points (its
grandparent directory is the PCI function; ``devices/virtual/net/IF`` is a veth, a bridge or
``lo``), so the fake trees need no ``device`` back-links (which would make symlink cycles).
On a DGX Spark each QSFP port is two PCI functions in two domains (``0000:01:00.1`` and
``0002:01:00.1``), each with its own interface and RDMA device (``enp1s0f1np1`` /
``rocep1s0f1`` and ``enP2p1s0f1np1`` / ``roceP2p1s0f1``): see
``tests/fixtures/sysfs/dgx-spark/README.txt``.

The addresses of the interfaces are not in sysfs: :func:`interface_addresses` asks the kernel
over rtnetlink (``ip -o addr``), in the network namespace of this process.

Nothing here raises for one bad file: an unreadable or garbled attribute is ``None``.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from sparkdiag.snapshot import PcieLink
from sparkdiag.sources.files import KIB, read_text_limited
from sparkdiag.sources.host.sysfs import read_link

CONNECTX7 = ("0x15b3", "0x1021")  # PCI vendor (Mellanox/NVIDIA) and device id of the ConnectX-7
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class NetInterface:
    """One network interface as sysfs shows it.

    name: ``enp1s0f1np1``
    mtu: bytes (``cat /sys/class/net/IF/mtu``)
    speed_mbps: the negotiated rate in Mb/s (``cat /sys/class/net/IF/speed``, ``ethtool IF``
        "Speed:"); None when the kernel reports none (-1, link down, a virtual device without one)
    carrier: the physical link is up (``cat /sys/class/net/IF/carrier``); None when unreadable
        (the interface is administratively down)
    operstate: ``up``, ``down``, ``lowerlayerdown``, ``unknown`` ...
    pci_address: the PCI function behind it (``0000:01:00.1``); None for a virtual interface
    """

    name: str
    mtu: int | None
    speed_mbps: int | None
    carrier: bool | None
    operstate: str | None
    pci_address: str | None

    @property
    def up(self) -> bool:
        """The link carries traffic: carrier present (operstate may read ``unknown`` on veth)."""
        return self.carrier is True and self.operstate not in ("down", "lowerlayerdown", "dormant")


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device: ``state`` ``ACTIVE``/``DOWN``..., ``link_layer``
    ``Ethernet`` (RoCE) or ``InfiniBand`` (``cat /sys/class/infiniband/DEV/ports/N/state``)."""

    number: int
    state: str | None
    link_layer: str | None


@dataclass(frozen=True)
class NicFunction:
    """One ConnectX-7 PCI function: its interfaces, RDMA devices and PCIe link.

    Same readings as ``lspci -d 15b3:1021``, ``ls /sys/bus/pci/devices/ADDR/net`` and
    ``ibdev2netdev``.
    """

    address: str
    interfaces: tuple[NetInterface, ...]
    rdma: tuple[str, ...]
    rdma_ports: tuple[RdmaPort, ...]
    link: PcieLink | None

    @property
    def rdma_active(self) -> bool:
        return any(port.state == "ACTIVE" for port in self.rdma_ports)


def _attr(path: Path) -> str | None:
    try:
        return read_text_limited(path, 4 * KIB, "ascii").strip()
    except OSError:  # missing, EINVAL (speed or carrier of a device that is down), not a file
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _pci_parent(device_dir: Path) -> str | None:
    """The PCI function owning ``.../ADDR/net/IF`` (or ``.../ADDR/infiniband/DEV``)."""
    try:
        real = device_dir.resolve()
    except (OSError, RuntimeError):
        return None
    owner = real.parent.parent.name
    return owner if _PCI_ADDRESS.match(owner) else None


def read_interface(directory: Path) -> NetInterface:
    """One interface from its sysfs directory (``/sys/class/net/IF`` or ``ADDR/net/IF``).

    Units: bytes (mtu), Mb/s (speed). Same readings as ``ip link show IF`` (mtu, state,
    NO-CARRIER) and ``ethtool IF`` (Speed). A speed of -1 or 0, or none, is None.
    """
    speed = _int(_attr(directory / "speed"))
    carrier = _attr(directory / "carrier")
    return NetInterface(
        name=directory.name,
        mtu=_int(_attr(directory / "mtu")),
        speed_mbps=speed if speed is not None and speed > 0 else None,
        carrier=None if carrier not in ("0", "1") else carrier == "1",
        operstate=_attr(directory / "operstate"),
        pci_address=_pci_parent(directory),
    )


def read_interfaces(sysfs: Path) -> dict[str, NetInterface]:
    """Every interface under ``sysfs/class/net``, by name; {} when the directory is missing.

    Same reading as ``ip -br link``. Raises FileNotFoundError when ``sysfs`` does not exist.
    """
    if not sysfs.is_dir():
        raise FileNotFoundError(f"sysfs root {sysfs} is not a directory")
    try:
        names = sorted(os.listdir(sysfs / "class" / "net"))
    except OSError:
        return {}
    return {name: read_interface(sysfs / "class" / "net" / name) for name in names}


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _rdma_ports(device: Path) -> tuple[RdmaPort, ...]:
    ports = []
    for number in _listdir(device / "ports"):
        if not number.isdigit():
            continue
        state = _attr(device / "ports" / number / "state")  # "4: ACTIVE"
        ports.append(
            RdmaPort(
                int(number),
                state.partition(":")[2].strip() or state if state else None,
                _attr(device / "ports" / number / "link_layer"),
            )
        )
    return tuple(ports)


def read_connectx7(sysfs: Path) -> tuple[NicFunction, ...]:
    """Every ConnectX-7 function (PCI ``15b3:1021``) under ``sysfs/bus/pci/devices``, by address.

    Same reading as ``lspci -D -d 15b3:1021`` with ``ibdev2netdev``. Empty on a machine without
    one, or where sysfs has no PCI bus.
    """
    devices = sysfs / "bus" / "pci" / "devices"
    found = []
    for address in _listdir(devices):
        directory = devices / address
        if (_attr(directory / "vendor"), _attr(directory / "device")) != CONNECTX7:
            continue
        rdma = _listdir(directory / "infiniband")
        found.append(
            NicFunction(
                address=address,
                interfaces=tuple(
                    read_interface(directory / "net" / name) for name in _listdir(directory / "net")
                ),
                rdma=tuple(rdma),
                rdma_ports=tuple(
                    port for name in rdma for port in _rdma_ports(directory / "infiniband" / name)
                ),
                link=read_link(directory),
            )
        )
    return tuple(found)


# -- addresses, over rtnetlink ---------------------------------------------------------------

_RTM_GETADDR = 22
_RTM_NEWADDR = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_DONE, _NLMSG_ERROR = 3, 2
_IFA_ADDRESS, _IFA_LOCAL = 1, 2


@dataclass(frozen=True)
class InterfaceAddress:
    """One address of an interface: ``interface`` ``enp1s0f1np1``, ``network``
    ``192.168.200.12/24`` (an :class:`ipaddress.IPv4Interface` or IPv6 one)."""

    interface: str
    network: ipaddress.IPv4Interface | ipaddress.IPv6Interface

    @property
    def address(self) -> str:
        return str(self.network.ip)


def parse_addr_dump(data: bytes, names: dict[int, str]) -> list[InterfaceAddress]:
    """The addresses in an rtnetlink ``RTM_NEWADDR`` dump (``ip -o addr`` as bytes).

    ``names`` maps interface indexes to names. IFA_LOCAL is preferred to IFA_ADDRESS (they differ
    only on point-to-point links, where IFA_ADDRESS is the far end).
    """
    out = []
    offset = 0
    while offset + 16 <= len(data):
        length, kind, _flags, _seq, _pid = struct.unpack_from("=IHHII", data, offset)
        if length < 16 or offset + length > len(data):
            break
        if kind == _RTM_NEWADDR and length >= 24:
            family, prefix, _ifa_flags, _scope, index = struct.unpack_from(
                "=BBBBI", data, offset + 16
            )
            attrs: dict[int, bytes] = {}
            at = offset + 24
            while at + 4 <= offset + length:
                size, attr = struct.unpack_from("=HH", data, at)
                if size < 4:
                    break
                attrs[attr] = data[at + 4 : at + size]
                at += (size + 3) & ~3
            raw = attrs.get(_IFA_LOCAL) or attrs.get(_IFA_ADDRESS)
            name = names.get(index)
            if raw is not None and name is not None:
                if family == socket.AF_INET and len(raw) == 4:
                    ip = ipaddress.IPv4Address(raw)
                    out.append(InterfaceAddress(name, ipaddress.IPv4Interface((ip, prefix))))
                elif family == socket.AF_INET6 and len(raw) == 16:
                    ip6 = ipaddress.IPv6Address(raw)
                    out.append(InterfaceAddress(name, ipaddress.IPv6Interface((ip6, prefix))))
        offset += (length + 3) & ~3
    return out


def interface_addresses() -> list[InterfaceAddress]:
    """Every address of every interface in this network namespace.

    Same reading as ``ip -o addr show``. Empty where rtnetlink cannot be opened (a sandbox).
    """
    try:
        names = {index: name for index, name in socket.if_nameindex()}
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:  # NETLINK_ROUTE
            sock.settimeout(2.0)
            body = struct.pack("=BBBBI", socket.AF_UNSPEC, 0, 0, 0, 0)  # struct ifaddrmsg
            flags = _NLM_F_REQUEST | _NLM_F_DUMP
            sock.send(struct.pack("=IHHII", 16 + len(body), _RTM_GETADDR, flags, 1, 0) + body)
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                kinds = _kinds(chunk)
                if _NLMSG_DONE in kinds or _NLMSG_ERROR in kinds:
                    break
    except OSError:
        return []
    return parse_addr_dump(b"".join(chunks), names)


def _kinds(chunk: bytes) -> set[int]:
    kinds = set()
    offset = 0
    while offset + 16 <= len(chunk):
        length, kind = struct.unpack_from("=IH", chunk, offset)
        kinds.add(kind)
        if length < 16:
            break
        offset += (length + 3) & ~3
    return kinds


def plain_address(address: str) -> str:
    """``::ffff:10.0.0.1`` (an IPv4 peer of a dual-stack socket) -> ``10.0.0.1``; a scope
    (``%eth0``) is dropped; anything else as it is."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def interface_of(address: str, addresses: list[InterfaceAddress]) -> str | None:
    """The interface holding ``address`` (the local end of a connected socket), or None."""
    try:
        wanted = ipaddress.ip_address(plain_address(address))
    except ValueError:
        return None
    for entry in addresses:
        if entry.network.ip == wanted:
            return entry.interface
    return None


def interface_kind(sysfs: Path, name: str) -> tuple[str | None, bool]:
    """(driver, wireless) of interface ``name``: the driver bound to its PCI function
    (``mlx5_core``, ``r8127``, ``mt7925e``; None for a virtual interface) and whether it is
    Wi-Fi (``class/net/IF/wireless`` or ``phy80211`` exists).

    Same reading as ``ethtool -i IF`` (driver:) and ``iw dev`` (the Wi-Fi interfaces).
    """
    base = sysfs / "class" / "net" / name
    wireless = (base / "wireless").exists() or (base / "phy80211").exists()
    pci = _pci_parent(base)
    if pci is None:
        return None, wireless
    try:
        driver: str | None = os.readlink(sysfs / "bus" / "pci" / "devices" / pci / "driver")
    except OSError:
        driver = None
    return (driver.rstrip("/").rsplit("/", 1)[-1] if driver else None), wireless


def route_interface(host: str) -> tuple[str, str | None] | None:
    """(peer address, the interface this machine's routing table sends to it by) for ``host``;
    None when the name does not resolve or no route leads there. A UDP socket is connected
    (the kernel picks the route and the source address; nothing is sent) and its source address
    is matched against the interfaces' addresses.

    Same reading as ``ip route get ADDRESS`` (its ``dev``).
    """
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for family, kind, proto, _name, address in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.connect(address)
                local = str(sock.getsockname()[0])
        except OSError:
            continue
        return plain_address(str(address[0])), interface_of(local, interface_addresses())
    return None
