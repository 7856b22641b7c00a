"""XID events: NVIDIA's XID catalog as facts (code, meaning, recommended action), their severity
tiers, and the kernel-log lines that report them.

The resolution buckets are the catalog's "immediate action" per code, for Ampere and newer GPUs
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html; NVIDIA's own NVSentinel
ships the same mapping). sparkdiag groups the buckets into three tiers:

* ``critical``: the GPU must be reset, the machine power-cycled or the node serviced
  (RESET_GPU, RESTART_BM, the XID 48 and NVLink workflows, ...);
* ``warning``: the application that hit it must restart, the GPU itself needs nothing
  (RESTART_APP); also codes this table does not know (look them up);
* ``info``: the catalog says to ignore it (IGNORE: a row remap recorded, a high corrected-error
  rate that has its own rate rule, events that follow another XID).

A burst of XIDs is one incident (NVIDIA Fleet Intelligence: one incident until 3 minutes pass
without one): :data:`INCIDENT_GAP_SECONDS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Tier = Literal["critical", "warning", "info"]
TIERS: tuple[Tier, ...] = ("critical", "warning", "info")
CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
INCIDENT_GAP_SECONDS = 180.0


@dataclass(frozen=True)
class Bucket:
    """One of the catalog's resolution buckets: its tier and what to do."""

    tier: Tier
    action: str  # what to do, one clause ("{gpu}" is the NVML index where known)


# The catalog's immediate-action buckets, by their names (lower case, as label values).
BUCKETS: dict[str, Bucket] = {
    "reset_gpu": Bucket(
        "critical",
        "stop the GPU's processes and reset it (sudo nvidia-smi -r -i {gpu}); reboot if the error "
        "persists, and have the GPU serviced if it persists after a reboot",
    ),
    "restart_bm": Bucket(
        "critical",
        "the GPU no longer answers over PCIe: power the machine off and on (a reset or reboot is "
        "not enough); reseat the GPU and check its power cables if it recurs",
    ),
    "workflow_xid_48": Bucket(
        "critical",
        "reset the GPU (sudo nvidia-smi -r -i {gpu}); drain the node first if XID 63 or 64 came "
        "with it, and run NVIDIA's field diagnostics if nvidia-smi -q shows the SRAM threshold "
        "exceeded",
    ),
    "workflow_nvlink_err": Bucket(
        "critical",
        "reset the GPU or reboot the node, read the link counters (nvidia-smi nvlink -e), and "
        "have the GPU or its NVLink serviced if it recurs",
    ),
    "workflow_nvlink5_err": Bucket(
        "critical",
        "reset the GPU, read the sub-code in the kernel log and the link counters (nvidia-smi "
        "nvlink -e), and have it serviced if it recurs",
    ),
    "restart_vm": Bucket("critical", "restart the virtual machine the GPU is passed to"),
    "check_mechanicals": Bucket(
        "critical", "check the GPU's power connectors, seating and cooling"
    ),
    "update_swfw": Bucket("critical", "update the NVIDIA driver and the GPU firmware"),
    "restart_app": Bucket(
        "warning",
        "restart the application that hit it; the GPU itself needs nothing (if it recurs "
        "without an application fault, run sparkdiag check)",
    ),
    "workflow_xid_45": Bucket(
        "warning", "it follows an earlier error: act on the XID logged before it"
    ),
    "check_uvm": Bucket(
        "warning",
        "read the unified-memory (nvidia-uvm) messages in dmesg and restart the application",
    ),
    "follow_recovery_action": Bucket(
        "warning",
        "do the GPU's recovery action (sparkdiag check names it; nvidia-smi -q shows 'GPU "
        "Recovery Action')",
    ),
    "ignore": Bucket("info", "informational: nothing to do"),
    "unknown": Bucket(
        "warning", f"not in sparkdiag's copy of NVIDIA's XID catalog: look it up ({CATALOG_URL})"
    ),
}


def _codes(*codes: int | range) -> tuple[int, ...]:
    out: list[int] = []
    for c in codes:
        out.extend(c if isinstance(c, range) else (c,))
    return tuple(out)


# code -> (meaning, bucket). Codes the catalog marks unused on current GPUs are left out
# (they are "unknown" here, as the catalog's own answer for them is to contact support).
_ENGINE_ERRORS = {
    "copy engine error": _codes(39, 40, 41, 70, 71, 72, 75, 76, 77, 85, range(126, 136)),
    "video decoder (NVDEC) error": _codes(68, 83, 84, 88, 89, 96, 97, 98),
    "JPEG decoder (NVJPG) error": _codes(82, range(99, 106)),
    "optical flow engine (OFA) error": _codes(86, 139),
}
XIDS: dict[int, tuple[str, str]] = {
    8: ("GPU stopped processing (channel idle timeout)", "restart_app"),
    11: ("invalid or corrupted push buffer stream", "restart_app"),
    13: ("graphics engine exception (often an application fault)", "restart_app"),
    25: ("illegal notify in the graphics engine", "restart_app"),
    31: ("GPU memory page fault (often an application fault)", "restart_app"),
    32: ("invalid or corrupted push buffer stream (PBDMA)", "restart_app"),
    37: ("firmware method not implemented (FECS)", "ignore"),
    38: ("firmware watchdog timeout (FECS)", "ignore"),
    43: ("GPU stopped processing (a channel reset after an earlier error)", "ignore"),
    44: ("graphics engine fault during a context switch", "ignore"),
    45: ("preemptive cleanup after an earlier error", "workflow_xid_45"),
    46: ("GPU stopped processing (timeout)", "reset_gpu"),
    48: ("double-bit ECC error", "workflow_xid_48"),
    54: ("clocks reduced for lack of power", "check_mechanicals"),
    60: ("security engine (SEC2) error", "restart_app"),
    62: ("internal micro-controller halt", "reset_gpu"),
    63: ("ECC page retirement or row remapping recorded", "ignore"),
    64: ("ECC page retirement or row remapping failure", "reset_gpu"),
    66: ("firmware register access violation (FECS)", "ignore"),
    67: ("firmware verification violation (FECS)", "ignore"),
    69: ("graphics engine class error", "restart_app"),
    74: ("NVLink error", "workflow_nvlink_err"),
    78: ("vGPU start error", "update_swfw"),
    79: ("GPU has fallen off the bus", "restart_bm"),
    80: ("push buffer CRC mismatch", "restart_app"),
    92: ("high single-bit ECC error rate", "ignore"),
    93: ("InfoROM erase limit exceeded", "ignore"),
    94: ("contained ECC error (the application that used the memory must restart)", "restart_app"),
    95: ("uncontained ECC error", "reset_gpu"),
    109: ("context switch timeout", "reset_gpu"),
    110: ("security fault", "reset_gpu"),
    119: ("GSP RPC timeout", "reset_gpu"),
    120: ("GSP error", "reset_gpu"),
    121: ("C2C link error, corrected", "ignore"),
    136: ("link training failure", "reset_gpu"),
    137: ("NVLink FLA privilege error", "ignore"),
    140: ("unrecovered ECC error", "reset_gpu"),
    141: ("fast path error", "ignore"),
    143: ("GPU initialisation error", "reset_gpu"),
    **{code: ("NVLink 5 error", "workflow_nvlink5_err") for code in range(144, 151)},
    151: ("key rotation error", "restart_vm"),
    154: ("GPU recovery action changed", "follow_recovery_action"),
    155: ("NVLink software-defined error", "reset_gpu"),
    156: ("resource retirement event", "reset_gpu"),
    157: ("resource retirement failure", "ignore"),
    158: ("GPU fatal timeout", "reset_gpu"),
    159: ("CHI non-data error", "check_uvm"),
    160: ("channel retirement event", "restart_bm"),
    161: ("channel retirement failure", "ignore"),
    **{
        code: (meaning, "restart_app")
        for meaning, codes in _ENGINE_ERRORS.items()
        for code in codes
    },
}


@dataclass(frozen=True)
class XidInfo:
    code: int
    meaning: str
    bucket: str  # a key of BUCKETS
    tier: Tier

    def action(self, gpu: int | str = "N") -> str:
        return BUCKETS[self.bucket].action.format(gpu=gpu)


def describe(code: int) -> XidInfo:
    """What the catalog says of ``code``; a code it does not list is tier ``warning``."""
    meaning, bucket = XIDS.get(code, ("not in sparkdiag's copy of the catalog", "unknown"))
    return XidInfo(code, meaning, bucket, BUCKETS[bucket].tier)


# "NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus."
_KERNEL_XID = re.compile(
    r"NVRM: Xid \(PCI:([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)[^)]*\): (\d+)"
)


def parse_kernel_xids(lines: tuple[str, ...]) -> list[tuple[str, int]]:
    """(PCI address as the kernel prints it, XID) for every ``NVRM: Xid`` line of a kernel log
    (``dmesg | grep -i xid``)."""
    found = []
    for line in lines:
        match = _KERNEL_XID.search(line)
        if match:
            domain, bus, device, xid = match.groups()
            found.append((f"{domain}:{bus}:{device}", int(xid)))
    return found
