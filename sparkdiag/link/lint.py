"""The ConnectX-7 / NCCL configuration lint: a pure function of :class:`FabricReadings`.

Each :class:`Finding` says what was read, the public figure that makes it matter (with its
source) and the fix. The rules, and where their figures come from:

``mtu``
    a ConnectX-7 interface with a carrier below MTU 9000. The interfaces default to 1500
    (NVIDIA/dgx-spark-playbooks#103); two Sparks reached ~3 GB/s NCCL bus bandwidth before MTU
    9000 and both halves in ``NCCL_IB_HCA``, 23.74 GB/s after (#102/#103), and ServeTheHome
    reached 160-198 Gb/s over both ports with jumbo frames.
``hca-one-half``
    on a GB10 machine (each QSFP port is two PCIe Gen5 x4 functions, ``0000:01:00.N`` and
    ``0002:01:00.N``), ``NCCL_IB_HCA`` selects one of the two RDMA devices of a cabled port:
    98 Gb/s with one, 161 Gb/s with both (nccl-tests bus bandwidth on two GX10,
    tonyd2wild/DeepSeek-v4-Flash-Vision-Exp-DSpark-1M-NVFP4-KV-2x-DGX-Spark#35).
``hca-unset``
    the same machine with both halves of a port up and ``NCCL_IB_HCA`` unset: #102 reports that
    NCCL does not aggregate the two halves by itself.
``hca-absent``, ``hca-down``
    ``NCCL_IB_HCA`` names a device that is not here (a stale ``/etc/nccl.conf`` copied into an
    image), or selects only ports that are down: NCCL then falls back to TCP sockets, or (a
    listed port with no peer) dies in ``ibv_modify_qp`` with a timeout (getainode/ainode 0.5.11).
``ifname-absent``, ``ifname-down``
    ``NCCL_SOCKET_IFNAME`` matches no interface here, or only interfaces without a carrier:
    NCCL's bootstrap finds no interface (NCCL documentation, NCCL_SOCKET_IFNAME).
``cma-kho``
    ``CmaFree`` above ``CmaTotal`` (``CmaTotal: 0 kB`` with 919 MiB free): the kernel's Kexec
    HandOver scratch area given to the page allocator as CMA pageblocks, where RDMA memory
    registration (``ibv_reg_mr``) fails with ENOMEM on every start; ``kho=off`` cured it on two
    pairs of Sparks (MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259, HWE kernel 7.0.0).
``nccl-two``
    more than one ``libnccl.so`` visible to the probe's Python: pip's ``nvidia-nccl-cu13`` 2.28.9
    (219 MB) and DGX OS's ``libnccl2`` 2.28.9 (190 MB) are different builds; with the wheel's,
    TP=2 across two Sparks wedged after 20-26 min (a rank spinning at 96 % GPU, ~20 W), with the
    system's it ran a clean 60-min soak (vllm-project/vllm#41725, #42354).
``nccl-conf-key``
    a configuration line whose key has spaces before ``=``: NCCL reads the key as it stands
    (NVIDIA/nccl ``src/misc/param.cc``), so the setting is silently ignored.
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkdiag.link.findings import Finding as Finding
from sparkdiag.link.gpudirect import gpudirect
from sparkdiag.link.interfaces import interfaces
from sparkdiag.link.nccl_list import NcclList as NcclList
from sparkdiag.link.nccl_list import parse_nccl_list as parse_nccl_list
from sparkdiag.link.readings import FabricReadings
from sparkdiag.sources.host.netif import NetInterface

MIN_MTU = 9000
_PORT_DOMAINS = ("0000:01:00.", "0002:01:00.")  # the two PCIe x4 halves of a GB10 QSFP port

MTU_FIGURE = (
    "ConnectX-7 interfaces default to MTU 1500; two DGX Sparks measured ~3 GB/s NCCL bus "
    "bandwidth until MTU 9000 and both port halves in NCCL_IB_HCA, 23.74 GB/s after "
    "(NVIDIA/dgx-spark-playbooks#102/#103); ServeTheHome reached 160-198 Gb/s over both "
    "ports with jumbo frames"
)
HALVES_FIGURE = (
    "each GB10 QSFP port is two PCIe Gen5 x4 endpoints of ~100 Gb/s; NCCL bus bandwidth was "
    "98 Gb/s with one HCA and 161 Gb/s with both (two GX10, tonyd2wild/DeepSeek-v4-Flash-"
    "Vision-Exp-DSpark-1M-NVFP4-KV-2x-DGX-Spark#35); NCCL does not aggregate the halves by "
    "itself (NVIDIA/dgx-spark-playbooks#102)"
)
CMA_FIGURE = (
    "CmaTotal 0 kB with CmaFree 940604 kB on a Spark: the Kexec HandOver scratch area handed out "
    "as CMA pageblocks, where ibv_reg_mr fails with ENOMEM on every NCCL start; 0 failures "
    "after kho=off on two independent pairs (MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259,"
    " Ubuntu HWE kernel 7.0.0)"
)
TWO_NCCL_FIGURE = (
    "pip's nvidia-nccl-cu13 2.28.9 (219 MB) and DGX OS's libnccl2 2.28.9 (190 MB) are different "
    "builds: with the wheel's, TP=2 across two Sparks wedged after 20-26 min (a rank at 96 % GPU, "
    "~20 W); with the system's symlinked over it, a clean 60-min soak "
    "(vllm-project/vllm#41725, #42354)"
)


def _where(origin: str) -> str:
    return "in the environment" if origin == "environment" else f"in {origin}"


def _set_it(name: str, value: str, origin: str) -> str:
    if origin == "environment":
        return f"export {name}={value}"
    return f"set {name}={value} in {origin}"


def halves(readings: FabricReadings) -> dict[str, tuple[str, str]]:
    """GB10 ports: function number -> (RDMA device of ``0000:01:00.N``, of ``0002:01:00.N``),
    where both functions are ConnectX-7 with an RDMA device (the layout of the DGX Spark, the
    ASUS Ascent GX10 and the Dell Pro Max with GB10)."""
    by_address = {f.address: f for f in readings.functions if f.rdma}
    out = {}
    for function in "01234567":
        first = by_address.get(_PORT_DOMAINS[0] + function)
        second = by_address.get(_PORT_DOMAINS[1] + function)
        if first is not None and second is not None:
            out[function] = (first.rdma[0], second.rdma[0])
    return out


def _mtu(readings: FabricReadings) -> list[Finding]:
    low = [
        (i, f.address)
        for f in readings.functions
        for i in f.interfaces
        if i.up
        and i.mtu is not None
        and i.mtu < MIN_MTU
        and all(p.link_layer in (None, "Ethernet") for p in f.rdma_ports)
    ]
    if not low:
        return []
    named = ", ".join(f"{i.name} ({pci}) MTU {i.mtu}" for i, pci in low)
    fix = "; ".join(f"sudo ip link set dev {i.name} mtu {MIN_MTU}" for i, _ in low)
    return [
        Finding(
            "mtu",
            ",".join(i.name for i, _ in low),
            f"ConnectX-7 interface{'s' if len(low) > 1 else ''} with a carrier below MTU "
            f"{MIN_MTU}: {named}",
            MTU_FIGURE,
            f"{fix}, on both machines (and on the switch ports, if any); keep it across reboots "
            f"with 'mtu: {MIN_MTU}' under each interface in the netplan file",
        )
    ]


def _hca(readings: FabricReadings) -> list[Finding]:
    devices = readings.rdma_devices()
    ports = halves(readings)
    cabled = {n: pair for n, pair in ports.items() if all(devices[d][1] for d in pair)}
    setting = readings.nccl.effective.get("NCCL_IB_HCA")
    if setting is None:
        return (
            [
                Finding(
                    "hca-unset",
                    "NCCL_IB_HCA",
                    f"NCCL_IB_HCA is not set while both halves of a ConnectX-7 port are up "
                    f"({' and '.join(pair[0] + ',' + pair[1] for pair in cabled.values())})",
                    HALVES_FIGURE,
                    f"export NCCL_IB_HCA={','.join(next(iter(cabled.values())))} on both machines "
                    "(or put the line in /etc/nccl.conf)",
                )
            ]
            if cabled
            else []
        )
    wanted = parse_nccl_list(setting.value)
    where = _where(setting.origin)
    shadow = f" (it wins over {', '.join(setting.shadowed)})" if setting.shadowed else ""
    selected = [name for name in devices if wanted.selects(name)]
    present = ", ".join(sorted(devices)) or "none"
    findings = []
    unknown = [
        name
        for entry in wanted.entries
        if not wanted.exclude
        for name in [entry[0]]
        if not any(wanted.matches(entry, d, None) for d in devices)
    ]
    if not selected or unknown:
        missing = ", ".join(unknown) if unknown else setting.value
        findings.append(
            Finding(
                "hca-absent",
                "NCCL_IB_HCA",
                f"NCCL_IB_HCA={setting.value} {where}{shadow} names {missing}, which is not an "
                f"RDMA device here (present: {present})",
                "NCCL uses only the HCAs the list selects and falls back to its TCP socket "
                "transport when it selects none (NCCL documentation, NCCL_IB_HCA); a stale "
                "/etc/nccl.conf copied into an image is the usual source",
                "name the devices this machine has (ls /sys/class/infiniband, or ibdev2netdev): "
                + _set_it("NCCL_IB_HCA", ",".join(_suggest(readings)) or "...", setting.origin),
            )
        )
    if selected and not any(devices[name][1] for name in selected):
        findings.append(
            Finding(
                "hca-down",
                "NCCL_IB_HCA",
                f"NCCL_IB_HCA={setting.value} {where} selects only RDMA ports that are not "
                f"ACTIVE: {', '.join(selected)}",
                "NCCL pairs HCAs by list position across ranks; a listed port with no peer made "
                "NCCL die in ibv_modify_qp with a connection timeout (getainode/ainode 0.5.11)",
                "select the ports that are up (cat /sys/class/infiniband/*/ports/1/state): "
                + _set_it("NCCL_IB_HCA", ",".join(_suggest(readings)) or "...", setting.origin),
            )
        )
    for pair in cabled.values():
        chosen = [name for name in pair if name in selected]
        if len(chosen) == 1:
            other = pair[1] if chosen[0] == pair[0] else pair[0]
            findings.append(
                Finding(
                    "hca-one-half",
                    "NCCL_IB_HCA",
                    f"NCCL_IB_HCA={setting.value} {where} selects {chosen[0]} but not {other}, "
                    "the other PCIe x4 half of the same cabled port",
                    HALVES_FIGURE,
                    _set_it("NCCL_IB_HCA", ",".join(pair), setting.origin) + " on both machines",
                )
            )
    return findings


def _suggest(readings: FabricReadings) -> list[str]:
    return [name for name, (_, active) in sorted(readings.rdma_devices().items()) if active]


def _ifname(readings: FabricReadings) -> list[Finding]:
    setting = readings.nccl.effective.get("NCCL_SOCKET_IFNAME")
    if setting is None:
        return []
    wanted = parse_nccl_list(setting.value)
    chosen: Sequence[NetInterface] = [
        i for name, i in readings.interfaces.items() if wanted.selects(name)
    ]
    where = _where(setting.origin)
    up = [i.name for i in readings.interfaces.values() if i.up and i.name != "lo"]
    doc = (
        "NCCL opens its bootstrap and socket connections only on the interfaces "
        "NCCL_SOCKET_IFNAME selects and fails to initialise when none is usable (NCCL "
        "documentation, NCCL_SOCKET_IFNAME; it selects the bootstrap path only, "
        "NVIDIA/dgx-spark-playbooks#102)"
    )
    fix = f"name an interface that is up here ({', '.join(up) or 'none is up'}): " + _set_it(
        "NCCL_SOCKET_IFNAME", up[0] if up else "...", setting.origin
    )
    if not chosen:
        return [
            Finding(
                "ifname-absent",
                "NCCL_SOCKET_IFNAME",
                f"NCCL_SOCKET_IFNAME={setting.value} {where} matches no interface here "
                f"(present: {', '.join(readings.interfaces) or 'none'})",
                doc,
                fix,
            )
        ]
    if not any(i.up for i in chosen):
        return [
            Finding(
                "ifname-down",
                "NCCL_SOCKET_IFNAME",
                f"NCCL_SOCKET_IFNAME={setting.value} {where} matches only interfaces without a "
                f"carrier: {', '.join(i.name for i in chosen)}",
                doc,
                fix,
            )
        ]
    return []


def _cma(readings: FabricReadings) -> list[Finding]:
    total, free = readings.cma_total_bytes, readings.cma_free_bytes
    if total is None or free is None or free <= total:
        return []
    if readings.cmdline is not None and "kho=off" in readings.cmdline.split():
        return []
    return [
        Finding(
            "cma-kho",
            "CmaTotal",
            f"/proc/meminfo: CmaTotal {total / 1024:.0f} kB but CmaFree {free / 1024:.0f} kB, "
            "more than the total: CMA pageblocks the kernel handed out beyond its CMA area",
            CMA_FIGURE,
            "add kho=off to the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub, "
            "sudo update-grub, reboot) and check that CmaFree falls to at most CmaTotal",
        )
    ]


def _libraries(readings: FabricReadings) -> list[Finding]:
    libs = readings.libraries
    if len(libs) < 2:
        return []
    described = "; ".join(
        f"{lib.origin} {lib.package + ' ' if lib.package else ''}{lib.version or 'unknown version'}"
        f" at {lib.path}"
        + (f" ({lib.size_bytes / 1e6:.0f} MB)" if lib.size_bytes and lib.size_bytes >= 1e6 else "")
        for lib in libs
    )
    versions = {lib.version for lib in libs}
    same = (
        "the same version number, but separate files, which can be different builds"
        if len(versions) == 1
        else "their versions differ"
    )
    pip = next((lib for lib in libs if lib.origin == "pip"), None)
    system = next((lib for lib in libs if lib.origin == "system"), None)
    if pip is not None and system is not None:
        fix = (
            "make the processes that talk to each other load one NCCL: for example replace the "
            f"wheel's file by a link to the system's (mv {pip.path} {pip.path}.pipbak; "
            f"ln -s {system.path} {pip.path}), on both machines"
        )
    else:
        fix = "keep one NCCL where the probe's Python and your jobs find it, on both machines"
    return [
        Finding(
            "nccl-two",
            "libnccl.so",
            f"{len(libs)} NCCL libraries visible to the probe's Python ({same}): {described}",
            TWO_NCCL_FIGURE,
            fix,
        )
    ]


def _conf_keys(readings: FabricReadings) -> list[Finding]:
    return [
        Finding(
            "nccl-conf-key",
            key,
            f"{conf.path}: the line for {key} has a space before '=', so NCCL sets a variable "
            f"named {key + ' '!r} and never reads it",
            "NCCL takes the key up to the first '=' as it stands (NVIDIA/nccl "
            "src/misc/param.cc, setEnvFile)",
            f"write it as {key}=VALUE, without spaces, in {conf.path}",
        )
        for conf in readings.nccl.files
        for key in conf.ignored
        if key.startswith("NCCL_")
    ]


def lint(readings: FabricReadings) -> list[Finding]:
    """Every finding, in a fixed order: MTU, HCAs, socket interface (and which one NCCL takes,
    :mod:`sparkdiag.link.interfaces`), CMA, libraries, files, GPUDirect RDMA
    (:mod:`sparkdiag.link.gpudirect`)."""
    return [
        *_mtu(readings),
        *_hca(readings),
        *_ifname(readings),
        *interfaces(readings),
        *_cma(readings),
        *_libraries(readings),
        *_conf_keys(readings),
        *gpudirect(readings),
    ]
