"""The GPU source's activity, interconnect and per-process readings that one declaration cannot
map to one snapshot field (GPM's four metrics, 126 NVLink answers per GPU, the processes),
turned from catalogue answers (:data:`sparkdiag.sources.nvml.queries.CATALOGUE`) into snapshot
values.

Each function takes ``ask(query, arg=None)``, the GPU source's cached, unsupported-aware query
of one device, and returns base units: ratios 0..1, bytes, bytes per second. What NVML does not
support is left out, never 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparkdiag.snapshot import GpuProcess, NvlinkSample, ProcessIdentity
from sparkdiag.sources.nvml.api import NVLINK_LINKS

log = logging.getLogger(__name__)

Ask = Callable[..., Any]

# GPM answer key -> activity_ratio key ("sm_occupancy" has its own field)
GPM_ACTIVITY = {"sm": "sm", "tensor": "tensor", "dram": "dram"}
# GPM answer key (MiB/s between two samples) -> pcie_throughput_bytes_per_second key
GPM_PCIE = {"pcie_tx": "tx", "pcie_rx": "rx"}
MIB = 1024.0 * 1024.0
NVLINK_ERRORS = {
    "replay": "nvlink_replay_errors",
    "recovery": "nvlink_recovery_errors",
    "crc_flit": "nvlink_crc_flit_errors",
    "crc_data": "nvlink_crc_data_errors",
}
NVLINK_DATA = {"tx": "nvlink_tx_kib", "rx": "nvlink_rx_kib"}
KIB = 1024.0


def percent_ratio(percent: Any) -> float:
    """An NVML percentage as a ratio, clamped to 0..1."""
    return min(max(float(percent) / 100.0, 0.0), 1.0)


@dataclass(frozen=True)
class GpmReading:
    """What one GPM answer gives: activity ratios ("sm", "tensor", "dram"), SM occupancy, and
    PCIe traffic in bytes per second ("tx", "rx"; both or neither) averaged between the two
    samples. Empty without GPM (before Hopper, or its first call)."""

    activity: dict[str, float]
    occupancy: float | None
    pcie: dict[str, float]


def read_gpm(ask: Ask) -> GpmReading:
    """The device's GPM metrics since the poll before (one ``gpm`` query: each takes a sample)."""
    gpm = ask("gpm")
    if not isinstance(gpm, Mapping):
        return GpmReading({}, None, {})
    activity = {key: percent_ratio(gpm[name]) for name, key in GPM_ACTIVITY.items() if name in gpm}
    occupancy = gpm.get("sm_occupancy")
    pcie = {key: max(float(gpm[name]), 0.0) * MIB for name, key in GPM_PCIE.items() if name in gpm}
    return GpmReading(
        activity,
        None if occupancy is None else percent_ratio(occupancy),
        pcie if len(pcie) == len(GPM_PCIE) else {},
    )


def read_nvlinks(ask: Ask) -> tuple[NvlinkSample, ...]:
    """Every NVLink NVML reports a state for: up or not, error counters, data bytes."""
    links: list[NvlinkSample] = []
    for link in NVLINK_LINKS:
        state = ask("nvlink_state", link)
        if state is None:
            continue
        errors = {
            kind: float(value)
            for kind, query in NVLINK_ERRORS.items()
            if (value := ask(query, link)) is not None
        }
        data = {
            direction: float(value) * KIB
            for direction, query in NVLINK_DATA.items()
            if (value := ask(query, link)) is not None
        }
        links.append(NvlinkSample(link=link, up=bool(state), errors=errors, data_bytes=data))
    return tuple(links)


Describe = Callable[[Sequence[int]], Mapping[int, ProcessIdentity]]


@dataclass(frozen=True)
class ProcessOptions:
    """Per-process metrics: at most ``top`` processes per GPU (by memory), ``describe`` names
    them (pid -> identity, leaving out the pids it cannot see)."""

    top: int
    describe: Describe


def read_processes(
    ask: Ask, listed: Sequence[Mapping[str, Any]], options: ProcessOptions
) -> tuple[tuple[GpuProcess, ...], int]:
    """The top processes of one GPU by used memory, with their SM utilization and identity, and
    how many of all listed processes ``describe`` could not see."""
    pids = [int(p["pid"]) for p in listed]
    if not pids:
        return (), 0
    identities = options.describe(pids)
    unseen = sum(1 for pid in pids if pid not in identities)
    util = ask("process_utilization") or []
    sm = {int(u["pid"]): percent_ratio(u["sm"]) for u in util if "sm" in u}

    def memory(p: Mapping[str, Any]) -> float:
        used = p.get("used_memory")
        return -1.0 if used is None else float(used)

    ranked = sorted(listed, key=lambda p: (-memory(p), int(p["pid"])))[: options.top]
    processes = tuple(
        GpuProcess(
            pid=int(p["pid"]),
            used_memory_bytes=None if p.get("used_memory") is None else float(p["used_memory"]),
            sm_utilization_ratio=sm.get(int(p["pid"])),
            identity=identities.get(int(p["pid"])),
        )
        for p in ranked
    )
    return processes, unseen
