"""Known machines and what they are built for: the table that host links are judged against.

A PCIe link that trains narrower than the device's maximum is a fault on one board and the
design on another. The GB10 machines show it: NVIDIA's DGX Spark Founders Edition trains all four
ConnectX-7 functions at PCIe Gen5 x4, while the ASUS Ascent GX10 wires its second ConnectX-7
root port with two lanes, so ``0002:01:00.0`` reads x2 of x4 there by design. Without a table
sparkdiag would call the GX10's design a fault, or (worse) excuse the same x2 on a Founders
Edition.

A platform is recognised from its DMI strings (:func:`sparkdiag.sources.host.dmi.read_platform`),
compared without case, spaces or underscores (the kernel's DMI modalias drops spaces, so public
reports spell the same name both ways). Sources of every entry are in :data:`PLATFORMS` and in
``tests/fixtures/sysfs/dgx-spark/README.txt``. A machine not in the table has its links judged
against their own maximum, as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sparkdiag.snapshot import PlatformIdentity

GEN5 = 32e9  # transfers per second


@dataclass(frozen=True)
class LinkDesign:
    """How a board wires one PCI function: the width and speed it is built to train at.

    addresses: the PCI functions (``0002:01:00.0``) and their root port
    what: what the link is, in words ("second ConnectX-7 root port")
    width: lanes the board provides; the link is healthy at this width or wider
    speed_tps: the speed it is built for, in transfers per second
    note: why the width is below the device's maximum, when it is (shown in findings)
    """

    addresses: tuple[str, ...]
    what: str
    width: int
    speed_tps: float
    note: str = ""


@dataclass(frozen=True)
class Platform:
    """One known machine: its name, how to recognise it and how its links are built."""

    key: str
    name: str
    matches: Callable[[PlatformIdentity], bool]
    links: tuple[LinkDesign, ...]
    source: str

    def design(self, address: str) -> LinkDesign | None:
        """The design of the link at ``address``, or None where the table says nothing."""
        for link in self.links:
            if address in link.addresses:
                return link
        return None


def _norm(text: str) -> str:
    """``"NVIDIA_DGX_Spark"``, ``"DGX Spark"`` -> ``"nvidiadgxspark"``, ``"dgxspark"``."""
    return re.sub(r"[^0-9a-z]", "", text.casefold())


def _is_dgx_spark(dmi: PlatformIdentity) -> bool:
    # Founders Edition: sys_vendor "NVIDIA", product_name "NVIDIA_DGX_Spark", board "P4242";
    # early units: product "DGXSpark" (canonical/secboot#560, DMI modaliases of both).
    return _norm(dmi.vendor) == "nvidia" and _norm(dmi.product) in ("nvidiadgxspark", "dgxspark")


def _is_ascent_gx10(dmi: PlatformIdentity) -> bool:
    # hostnamectl on a GX10: "Hardware Vendor: ASUSTeK COMPUTER INC.", "Hardware Model: GX10".
    product = _norm(dmi.product)
    return "asustek" in _norm(dmi.vendor) and (
        product.startswith("gx10") or "ascentgx10" in product
    )


_CX7_FIRST = ("0000:00:00.0", "0000:01:00.0", "0000:01:00.1")
_CX7_SECOND = ("0002:00:00.0", "0002:01:00.0", "0002:01:00.1")


def _gb10_links(second_width: int, second_note: str = "") -> tuple[LinkDesign, ...]:
    """A GB10 board's two ConnectX-7 root ports, both built for PCIe Gen5: the first four lanes
    wide, the second ``second_width`` (``second_note`` says why when it is narrower)."""
    return (
        LinkDesign(_CX7_FIRST, "first ConnectX-7 root port", 4, GEN5),
        LinkDesign(_CX7_SECOND, "second ConnectX-7 root port", second_width, GEN5, second_note),
    )


PLATFORMS: tuple[Platform, ...] = (
    Platform(
        key="dgx-spark",
        name="NVIDIA DGX Spark Founders Edition",
        matches=_is_dgx_spark,
        links=_gb10_links(4),
        source=(
            "ServeTheHome, 'The NVIDIA GB10 ConnectX-7 200GbE networking is really different' "
            "(two PCIe Gen5 x4 links, 0000:01:00.0/.1 and 0002:01:00.0/.1); DMI strings from "
            "canonical/secboot#560"
        ),
    ),
    Platform(
        key="asus-ascent-gx10",
        name="ASUS Ascent GX10",
        matches=_is_ascent_gx10,
        links=_gb10_links(
            2,
            "the ASUS Ascent GX10 wires its second ConnectX-7 root port with two lanes "
            "(board design, not a fault)",
        ),
        source=(
            "owners' reports of the GX10's second ConnectX-7 root port at x2 (shared/CONTEXT.md); "
            "DMI strings from hostnamectl on a GX10 (ASUSTeK COMPUTER INC., GX10)"
        ),
    ),
)


def identify(dmi: PlatformIdentity | None) -> Platform | None:
    """The known platform these DMI strings name, or None (unknown machine, or no DMI)."""
    if dmi is None:
        return None
    for platform in PLATFORMS:
        if platform.matches(dmi):
            return platform
    return None


def describe(dmi: PlatformIdentity | None) -> str:
    """The machine in words, for findings: the platform's name, else its DMI strings."""
    platform = identify(dmi)
    if platform is not None:
        return platform.name
    if dmi is None:
        return "an unidentified machine (no DMI)"
    shown = " ".join(part for part in (dmi.vendor, dmi.product) if part) or "no DMI name"
    return f"{shown} (not in sparkdiag's platform table)"
