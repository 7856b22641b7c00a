"""XID events: NVIDIA's XID catalog as facts (code, meaning, recommended action), their severity
tiers, the kernel-log lines that report them, and those that say a GPU was set up again since
(:func:`kernel_gpu_resets`).

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
    # the same inside 'sparkdiag check', where ``action`` would send the reader to check itself;
    # None: ``action`` reads right there too
    in_check: str | None = None


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
        "restart the application that hit it; the GPU itself needs nothing (if it recurs "
        "without an application fault, this run's ecc, row-remap and recovery-action rows say "
        "whether the GPU is at fault)",
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
        "do the GPU's recovery action (the recovery-action row names it; nvidia-smi -q shows "
        "'GPU Recovery Action')",
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

    def action(self, gpu: int | str = "N", *, in_check: bool = False) -> str:
        """What to do, for GPU ``gpu``; ``in_check``: as a row of 'sparkdiag check' says it."""
        bucket = BUCKETS[self.bucket]
        text = bucket.in_check if in_check and bucket.in_check is not None else bucket.action
        return text.format(gpu=gpu)


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
    return [(event.address, event.code) for event in kernel_xid_events(lines)]


# -- resets in the kernel log ----------------------------------------------------------------
#
# The lines after which a GPU's earlier XIDs no longer describe it: the driver set it up again.
# Where each comes from (NVIDIA's open-gpu-kernel-modules, 595.45.04, and Linux):
#
# * "NVRM: loading NVIDIA UNIX ... Kernel Module  580.95.05 ...": the driver was loaded
#   (kernel-open/nvidia/nv.c, nvidia_init_module, at NV_DBG_ERRORS, which the default debug
#   level prints). It can only be loaded again once nothing holds a GPU, and it sets every GPU
#   up anew: it stands for every GPU.
# * "nvidia 0000:18:00.0: enabling device (0000 -> 0003)": the nvidia driver probed the device
#   and turned on its memory decoding (Linux drivers/pci/setup-res.c, pci_enable_resources,
#   pci_info). It is written when the device comes up with decoding off: at boot, and after
#   the device was removed and found again (echo 1 > .../remove, then a rescan) or reset to
#   its power-on state.
# * "nvidia 0000:18:00.0: ready 1023ms after FLR" (or "after bus reset"): the PCI core reset
#   the device and waited for it (Linux drivers/pci/pci.c, pci_dev_wait). Written only when
#   the device took over a second to answer (below that it is pci_dbg).
# * "NVRM: GPU at PCI:0000:18:00: GPU-<uuid>": written once per life of the driver's GPU object,
#   just before that life's first XID (src/nvidia/src/kernel/gpu/rc/kernel_rc.c,
#   _krcLogUuidOnce); the object is made when the driver initialises the GPU (RmInitAdapter ->
#   gpumgrAttachGpu) and dropped when it shuts it down (RmShutdownAdapter). Seen again after
#   an XID of that GPU, it says the GPU was initialised again in between.
#
# A reset by 'nvidia-smi -r' writes no line at the driver's default level (its "NVRM: Trigger
# FLR" lines are NV_DBG_INFO): NVIDIA's own NVSentinel writes a syslog line of its own
# ("GPU reset executed: GPU-...", ADR-020) to tell a reset happened. Where none of the lines
# above follows an XID, nothing in the log says that the GPU was reset.

_PCI = r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})"
_DRIVER_LOADED = re.compile(r"NVRM: loading NVIDIA UNIX\b")
_PROBED = re.compile(r"(?:^|[\s\]])nvidia " + _PCI + r"\.[0-7]: enabling device \(")
_RESET_WAITED = re.compile(
    r"(?:^|[\s\]])\S+ " + _PCI + r"\.[0-7]: ready \d+ms after (?:FLR|AF_FLR|bus reset)\s*$"
)
_UUID_LOGGED = re.compile(r"NVRM: GPU at PCI:" + _PCI + r": GPU-[0-9A-Fa-f-]+\s*$")

BusKey = tuple[int, int, int]  # (domain, bus, device)


def bus_key(address: str) -> BusKey | None:
    """(domain, bus, device) of a PCI address as the kernel (``0000:18:00``, ``0000:18:00.0``)
    or NVML (``00000000:18:00.0``) writes it; None when it is neither."""
    match = re.match(r"^" + _PCI, address.strip())
    if match is None:
        return None
    domain, bus, device = (int(part, 16) for part in match.groups())
    return domain, bus, device


@dataclass(frozen=True)
class KernelXid:
    """One ``NVRM: Xid`` line: the GPU's PCI address as the kernel prints it, the code, and the
    line's place in the log (its records are in the order the kernel wrote them)."""

    address: str
    code: int
    line: int


@dataclass(frozen=True)
class GpuReset:
    """A line after which a GPU was set up again (the comment above :data:`_DRIVER_LOADED`)."""

    line: int
    key: BusKey | None  # None: every GPU (the driver was loaded)
    how: str  # what the log says happened, as a clause


def kernel_xid_events(lines: tuple[str, ...]) -> list[KernelXid]:
    """Every ``NVRM: Xid`` line of a kernel log, in order."""
    found = []
    for number, line in enumerate(lines):
        match = _KERNEL_XID.search(line)
        if match:
            domain, bus, device, xid = match.groups()
            found.append(KernelXid(f"{domain}:{bus}:{device}", int(xid), number))
    return found


def kernel_gpu_resets(lines: tuple[str, ...]) -> list[GpuReset]:
    """The lines of a kernel log after which a GPU was set up again, in order: the driver
    loaded, the device probed or reset by the PCI core, the GPU initialised again (its UUID
    logged anew after an XID of it). See the comment above :data:`_DRIVER_LOADED`."""
    resets: list[GpuReset] = []
    xid_seen: set[BusKey] = set()
    for number, record in enumerate(lines):
        # a /dev/kmsg record of a device's message goes on with its properties, one a line
        # (" SUBSYSTEM=pci", " DEVICE=+pci:0000:18:00.0"): the message is the first line
        line = record.partition("\n")[0]
        if "NVRM: Xid" in line:
            match = _KERNEL_XID.search(line)
            if match:
                xid_seen.add(_key(match))
            continue
        if _DRIVER_LOADED.search(line):
            resets.append(GpuReset(number, None, "the NVIDIA driver was loaded again"))
            continue
        for pattern, how in (
            (_PROBED, "the nvidia driver probed it again (enabling device)"),
            (_RESET_WAITED, "the PCI core reset it"),
        ):
            match = pattern.search(line)
            if match:
                resets.append(GpuReset(number, _key(match), how))
                break
        else:
            match = _UUID_LOGGED.search(line)
            if match and _key(match) in xid_seen:
                resets.append(
                    GpuReset(
                        number,
                        _key(match),
                        "the driver initialised it again (its UUID logged anew)",
                    )
                )
    return resets


def _key(match: re.Match[str]) -> BusKey:
    domain, bus, device = (int(part, 16) for part in match.groups()[:3])
    return domain, bus, device


def last_reset(resets: list[GpuReset], address: str) -> GpuReset | None:
    """The last of ``resets`` that concerns the GPU at ``address`` (kernel or NVML form)."""
    key = bus_key(address)
    for reset in reversed(resets):
        if reset.key is None or reset.key == key:
            return reset
    return None
