"""PCIe links: the GPU's (from NVML, checked under load) and the host's NIC and NVMe links (from
sysfs), the latter against what the platform is built for where sparkdiag knows the machine
(:mod:`sparkdiag.platforms`: an ASUS Ascent GX10's second ConnectX-7 at x2 is its design, the
same x2 on a DGX Spark Founders Edition is a fault)."""

from __future__ import annotations

from sparkdiag.check.gpu_checks import each_gpu
from sparkdiag.check.model import CheckContext, CheckResult
from sparkdiag.check.model import gpu_index as _idx
from sparkdiag.platforms import Platform, describe, identify
from sparkdiag.snapshot import GpuSample, PcieLink

HOST_CLASSES = ("network", "nvme")
_GENERATIONS = {2.5e9: 1, 5e9: 2, 8e9: 3, 16e9: 4, 32e9: 5, 64e9: 6}


def _uncompared(pairs: dict[str, tuple[float | None, float | None]]) -> dict[str, str]:
    """{what: why it was not compared} for each (current, maximum) pair that could not be: one
    of the two not read, or the current above its maximum (the two readings disagree). A link
    passes only where its width was compared, and says "max" only of what was: rows read
    "(max)" where no maximum was read (the bad-input review)."""
    why: dict[str, str] = {}
    for what, (current, maximum) in pairs.items():
        if current is None:
            why[what] = f"current {what} not read"
        elif maximum is None:
            why[what] = f"maximum {what} not read"
        elif current > maximum:
            why[what] = f"current {what} above its maximum: the readings disagree"
    return why


def _at_max(compared: dict[str, str], every: tuple[str, ...]) -> str:
    """ "max", or what was at its maximum and why the rest was not compared."""
    if not compared:
        return "max"
    done = [what for what in every if what not in compared]
    return f"max {' and '.join(done)}; " + "; ".join(compared.values())


# -- the GPU's PCIe link ----------------------------------------------------------------------


def _pcie_gpu(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """The GPU's link at its maximum width, and at its maximum speed under load."""
    name = "pcie-gpu"
    gen, width = gpu.pcie_generation, gpu.pcie_width
    if not gen and not width:
        why = (
            "integrated GPU: NVML's Gen1 x1 is meaningless; see pcie-host for the NIC and NVMe"
            if gpu.identity.memory_model == "unified"
            else "link not reported by NVML"
        )
        return CheckResult(name, "skip", why, gpu=_idx(gpu))
    cur_w, max_w = width.get("current"), width.get("max")
    cur_g, max_g = gen.get("current"), gen.get("max")
    loaded = [s.pcie_generation.get("current") for s in _probe_load(ctx, gpu)]
    load_gen = max((g for g in loaded if g is not None), default=None)
    data = {
        "gen": cur_g,
        "max_gen": max_g,
        "width": cur_w,
        "max_width": max_w,
        "gen_under_load": load_gen,
    }
    bus = gpu.identity.pci_bus_id
    action = (
        f"reseat the GPU / check its slot and riser, the BIOS PCIe settings and firmware; "
        f"sudo lspci -vv -s {_short_bus(bus)} shows LnkCap against LnkSta"
    )
    if cur_w is not None and max_w is not None and cur_w < max_w:
        return CheckResult(
            name, "fail", f"{bus} x{cur_w:.0f} of x{max_w:.0f}", action, _idx(gpu), data
        )
    width_text = f"x{cur_w:.0f}" if cur_w is not None else "width unknown"
    if cur_g is None or max_g is None or cur_g >= max_g:
        gen_text = f"Gen{cur_g:.0f}" if cur_g is not None else "speed unknown"
        uncompared = _uncompared({"width": (cur_w, max_w), "generation": (cur_g, max_g)})
        if "width" in uncompared:
            return CheckResult(
                name,
                "skip",
                f"{bus} {gen_text} {width_text}: width not compared ("
                + "; ".join(uncompared.values())
                + ")",
                gpu=_idx(gpu),
                data=data,
            )
        at_max = _at_max(uncompared, ("width", "generation"))
        return CheckResult(
            name, "pass", f"{bus} {gen_text} {width_text} ({at_max})", gpu=_idx(gpu), data=data
        )
    if load_gen is not None:
        if load_gen < max_g:
            return CheckResult(
                name,
                "fail",
                f"{bus} Gen{load_gen:.0f} of Gen{max_g:.0f} under load, {width_text}",
                action,
                _idx(gpu),
                data,
            )
        return CheckResult(
            name,
            "pass",
            f"{bus} Gen{load_gen:.0f} {width_text} under load (Gen{cur_g:.0f} at idle)",
            gpu=_idx(gpu),
            data=data,
        )
    return CheckResult(
        name,
        "pass",
        f"{bus} Gen{cur_g:.0f} of Gen{max_g:.0f} at idle, {width_text} (an idle GPU lowers its "
        "link speed; the probe checks it under load)",
        gpu=_idx(gpu),
        data=data,
    )


def _probe_load(ctx: CheckContext, gpu: GpuSample) -> tuple[GpuSample, ...]:
    probe = ctx.probes.get(gpu.identity.index)
    return probe.load if probe is not None else ()


def _short_bus(bus: str) -> str:
    """NVML's "00000000:01:00.0" -> lspci's "0000:01:00.0"."""
    domain, sep, rest = bus.partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}" if sep and _hex(domain) else bus


def _hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


check_pcie_gpu = each_gpu("pcie-gpu", _pcie_gpu)


# -- host links (NIC, NVMe) ----------------------------------------------------------------------


def _speed(tps: float | None) -> str:
    if tps is None:
        return "speed unknown"
    gen = _GENERATIONS.get(tps)
    return f"Gen{gen}" if gen is not None else f"{tps / 1e9:g} GT/s"


def _link_result(link: PcieLink, platform: Platform | None, machine: str) -> CheckResult:
    label = f"{link.address} {link.driver or link.device_class}"
    design = platform.design(link.address) if platform is not None else None
    data = {
        "address": link.address,
        "class": link.device_class,
        "driver": link.driver,
        "speed_tps": link.current_speed_tps,
        "max_speed_tps": link.max_speed_tps,
        "width": link.current_width,
        "max_width": link.max_width,
        "platform": machine,
        "design_width": design.width if design is not None else None,
    }
    lspci = f"sudo lspci -vv -s {link.address} shows LnkCap against LnkSta"
    if design is not None:
        fix = (
            f"the {machine} is built to train its {design.what} at x{design.width}: power the "
            "machine off, remove AC power for a minute and start it again; update the OS and "
            "the system firmware; if it stays narrower, contact the vendor's support"
        )
    elif link.driver == "mlx5_core":
        fix = (
            f"{machine}: check how this board wires the ConnectX-7 (the ASUS Ascent GX10 wires "
            "its second ConnectX-7 root port x2 by design); otherwise cold-boot (remove AC "
            "power), update the system firmware and reseat the card where it is socketed"
        )
    else:
        fix = "reseat the device / check its slot, the BIOS PCIe settings and its firmware"
    action = f"{fix}; {lspci}"
    cur_w, max_w = link.current_width, link.max_width
    cur_s, max_s = link.current_speed_tps, link.max_speed_tps
    if design is not None and cur_w is not None and cur_w < design.width:
        return CheckResult(
            "pcie-host",
            "fail",
            f"{label} x{cur_w} of x{max_w or design.width} ({_speed(cur_s)}): the {machine} "
            f"trains its {design.what} at x{design.width}",
            action,
            data=data,
        )
    if cur_w == 0 and design is None:
        # an endpoint present with no trained link (bridges at x0 are empty slots, left out by
        # the source): it passed as "x0 (max)" where no maximum width was read
        of = f" of x{max_w}" if max_w is not None else ""
        return CheckResult(
            "pcie-host",
            "fail",
            f"{label} x0{of}: the link is down (no lane trained)",
            action,
            data=data,
        )
    by_design = design is not None and cur_w is not None and max_w is not None and cur_w < max_w
    if not by_design and cur_w is not None and max_w is not None and cur_w < max_w:
        return CheckResult(
            "pcie-host",
            "fail",
            f"{label} x{cur_w} of x{max_w} ({_speed(cur_s)})",
            action,
            data=data,
        )
    width = f"x{cur_w}" if cur_w is not None else "width unknown"
    if cur_s is not None and max_s is not None and cur_s < max_s:
        return CheckResult(
            "pcie-host",
            "warn",
            f"{label} {_speed(cur_s)} of {_speed(max_s)}, {width}",
            action + " (some devices lower their speed when idle: check again under load)",
            data=data,
        )
    if cur_w is None and cur_s is None:
        return CheckResult("pcie-host", "skip", f"{label}: link not readable", data=data)
    if by_design:
        assert design is not None
        why = design.note or design.what
        return CheckResult(
            "pcie-host",
            "pass",
            f"{label} {_speed(cur_s)} {width} of x{max_w}, as designed: {why}",
            data=data,
        )
    if design is not None and cur_w is not None:
        return CheckResult(
            "pcie-host",
            "pass",
            f"{label} {_speed(cur_s)} {width} (max, as the {machine} is built)",
            data=data,
        )
    uncompared = _uncompared({"width": (cur_w, max_w), "speed": (cur_s, max_s)})
    if "width" in uncompared:
        return CheckResult(
            "pcie-host",
            "skip",
            f"{label} {_speed(cur_s)} {width}: width not compared ("
            + "; ".join(uncompared.values())
            + ")",
            data=data,
        )
    at_max = _at_max(uncompared, ("width", "speed"))
    return CheckResult(
        "pcie-host", "pass", f"{label} {_speed(cur_s)} {width} ({at_max})", data=data
    )


def check_pcie_host(ctx: CheckContext) -> list[CheckResult]:
    """Each NIC and NVMe link at its maximum width (else fail) and speed (else warn); on a known
    platform, at the width its board is built for (narrower fails, the design passes)."""
    links = [link for link in ctx.snapshot.pcie_links if link.device_class in HOST_CLASSES]
    if not links:
        return [CheckResult("pcie-host", "skip", "no NIC or NVMe PCIe link found in sysfs")]
    platform = identify(ctx.snapshot.platform)
    machine = describe(ctx.snapshot.platform)
    return [_link_result(link, platform, machine) for link in links]
