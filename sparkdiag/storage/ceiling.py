"""What a drive could deliver at most: its PCIe link, and the maker's rated figures where known.

A PCIe link moves ``transfers/s x lanes x encoding / 8`` bytes per second each way: 8b/10b
encoding up to 5 GT/s (Gen1, Gen2), 128b/130b from 8 GT/s (Gen3 to Gen5), 242/256 FLITs at
64 GT/s (Gen6). Gen5 x4 (the DGX Spark's M.2 slot): 32e9 x 4 x 128/130 / 8 = 15.75 GB/s. Packet
headers take a few per cent more, so no drive reaches its link's figure; a figure above it was
not read from the drive (the page cache, or a device that is not what sysfs says).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sparkdiag.snapshot import PcieLink


def link_bytes_per_second(speed_tps: float | None, width: int | None) -> float | None:
    """Bytes per second one direction of a link carries (32e9 T/s, 4 lanes -> 15.75e9)."""
    if not speed_tps or not width or speed_tps <= 0 or width <= 0:
        return None
    if speed_tps <= 5.0e9:
        encoding = 8 / 10
    elif speed_tps <= 32.0e9:
        encoding = 128 / 130
    else:
        encoding = 242 / 256
    return speed_tps * width * encoding / 8


def generation(speed_tps: float | None) -> int | None:
    """The PCIe generation of a link speed (2.5 GT/s is Gen1 ... 64 GT/s Gen6)."""
    table = {2.5e9: 1, 5.0e9: 2, 8.0e9: 3, 16.0e9: 4, 32.0e9: 5, 64.0e9: 6}
    return None if speed_tps is None else table.get(speed_tps)


def describe_link(link: PcieLink) -> str:
    """``Gen5 x4`` (and ``of Gen5 x4`` when it trained below its maximum)."""

    def one(speed: float | None, width: int | None) -> str:
        gen = generation(speed)
        return f"{'Gen' + str(gen) if gen else '?'} x{width if width else '?'}"

    now = one(link.current_speed_tps, link.current_width)
    best = one(link.max_speed_tps, link.max_width)
    return now if now == best else f"{now} (of {best})"


def links_bytes_per_second(links: Iterable[PcieLink]) -> float | None:
    """The sum over the drives' links as they trained (a RAID of several drives can read from
    all at once: an upper bound); None when no link's figure is known."""
    figures = [
        f for link in links
        if (f := link_bytes_per_second(link.current_speed_tps, link.current_width)) is not None
    ]  # fmt: skip
    return sum(figures) if figures else None


@dataclass(frozen=True)
class Rated:
    """A drive model's rated sequential figures (bytes per second) and where they are stated."""

    name: str
    read: float
    write: float
    source: str


# Model-number prefixes (as the drive reports them in /sys/class/nvme/nvmeN/model) -> rated
# sequential figures. Kept to drives sparkdiag's users have, each with its public source.
RATED: dict[str, Rated] = {
    # The DGX Spark's internal 4 TB M.2 2242 drive (Samsung part numbers MZAL8...).
    "SAMSUNG MZAL8": Rated(
        "Samsung PM9E1 (PCIe Gen5 x4)", 14.5e9, 12.6e9,
        "Samsung's PM9E1 4 TB M.2 2242 announcement, 2026-01: up to 14,500 MB/s read and "
        "12,600 MB/s write",
    ),
    "SAMSUNG MZVL2": Rated(
        "Samsung PM9A1 (PCIe Gen4 x4)", 7.0e9, 5.2e9,
        "the same announcement's comparison: PM9A1 2 TB 7 GB/s read, 5.2 GB/s write",
    ),
}  # fmt: skip


def rated(model: str) -> Rated | None:
    """The rated figures of a drive model, by the longest known prefix; None when unknown."""
    matches = [prefix for prefix in RATED if model.upper().startswith(prefix)]
    return RATED[max(matches, key=len)] if matches else None
