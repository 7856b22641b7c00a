"""GPU health: uncorrected ECC errors, row remapping, XID events in the kernel log."""

from __future__ import annotations

import re
from collections import Counter

from sparkdiag.check.gpu_checks import per_gpu
from sparkdiag.check.model import CheckContext, CheckResult, Status
from sparkdiag.check.model import gpu_index as _idx
from sparkdiag.snapshot import GpuSample

XID_DOCS = "https://docs.nvidia.com/deploy/xid-errors/"
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)[^)]*\): (\d+)")

# XIDs that mean the hardware (or its firmware) is in trouble: fail.
HARDWARE_XIDS = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    64: "row remapping failure",
    74: "NVLink error",
    79: "GPU fell off the bus",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
    154: "GPU recovery action required",
}
# Other XIDs warn: mostly a faulting application, or an event the GPU contained.
OTHER_XIDS = {
    13: "graphics engine exception (often an application fault)",
    31: "GPU memory page fault (often an application fault)",
    43: "GPU stopped processing (often an application fault)",
    45: "preemptive cleanup after an earlier error",
    63: "ECC page retirement or row remapping event",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
}
XID_ACTIONS = {
    79: "reboot (or sudo nvidia-smi -r); if it recurs, check power cables, seating and cooling",
    74: "check the links (nvidia-smi nvlink -s) and reset the GPU (sudo nvidia-smi -r)",
    119: "reset the GPU (sudo nvidia-smi -r) or reboot; update the driver if it recurs",
    120: "reset the GPU (sudo nvidia-smi -r) or reboot; update the driver if it recurs",
    154: "do the recovery action nvidia-smi -q shows (GPU reset or reboot)",
}
MEMORY_ACTION = "reset the GPU (sudo nvidia-smi -r) or reboot; if it recurs, request service"


# -- ECC ---------------------------------------------------------------------------------------


def _ecc(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    errors = gpu.ecc_errors
    if "uncorrected" not in errors:
        return CheckResult("ecc", "skip", "ECC counters not reported (ECC off or unsupported)",
                           gpu=_idx(gpu))  # fmt: skip
    uncorrected = int(errors["uncorrected"])
    corrected = int(errors.get("corrected", 0))
    data = {"uncorrected": uncorrected, "corrected": corrected}
    counts = f"{uncorrected} uncorrected, {corrected} corrected ECC errors (lifetime)"
    if uncorrected == 0:
        return CheckResult("ecc", "pass", counts, gpu=_idx(gpu), data=data)
    rows = gpu.remapped_rows
    repaired = bool(rows) and rows.get("pending", 0) == 0 and rows.get("failure", 0) == 0
    if repaired:
        return CheckResult(
            "ecc", "warn", f"{counts}; row remapping repaired them (none pending)",
            "watch the volatile counters (nvidia-smi -q -d ECC): if they grow, the GPU needs "
            "service",
            _idx(gpu), data,
        )  # fmt: skip
    return CheckResult("ecc", "fail", counts, MEMORY_ACTION, _idx(gpu), data)


def check_ecc(ctx: CheckContext) -> list[CheckResult]:
    """Uncorrected ECC errors: fail, or warn when row remapping has repaired them."""
    return per_gpu("ecc", ctx, _ecc)


# -- row remapping -------------------------------------------------------------------------------


def _row_remap(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    rows = gpu.remapped_rows
    if not rows:
        return CheckResult("row-remap", "skip", "row remapping not reported (no HBM remapping)",
                           gpu=_idx(gpu))  # fmt: skip
    pending, failure = int(rows.get("pending", 0)), int(rows.get("failure", 0))
    remapped = int(rows.get("corrected", 0) + rows.get("uncorrected", 0))
    data = {"pending": pending, "failure": failure, "remapped": remapped}
    if failure:
        return CheckResult(
            "row-remap", "fail", f"row remapping failed ({remapped} rows remapped)",
            "the GPU ran out of spare rows: drain it and request service (RMA)", _idx(gpu), data,
        )  # fmt: skip
    if pending:
        return CheckResult(
            "row-remap", "fail", f"row remap pending ({remapped} rows remapped)",
            "stop the GPU's processes and reset it to apply the remap: sudo nvidia-smi -r -i "
            f"{gpu.identity.index} (or reboot)",
            _idx(gpu), data,
        )  # fmt: skip
    return CheckResult("row-remap", "pass",
                       f"no pending or failed remap ({remapped} rows remapped)",
                       gpu=_idx(gpu), data=data)  # fmt: skip


def check_row_remap(ctx: CheckContext) -> list[CheckResult]:
    """A pending remap (reset needed) or a failed one (service needed) fails."""
    return per_gpu("row-remap", ctx, _row_remap)


# -- XID -----------------------------------------------------------------------------------------


def _bus_key(domain: str, bus: str, device: str) -> tuple[int, int, int]:
    return int(domain, 16), int(bus, 16), int(device, 16)


def _gpu_bus_keys(ctx: CheckContext) -> dict[tuple[int, int, int], int]:
    keys = {}
    for gpu in ctx.snapshot.gpus:
        parts = re.match(r"^([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)", gpu.identity.pci_bus_id)
        if parts:
            keys[_bus_key(*parts.groups())] = gpu.identity.index
    return keys


def parse_xids(lines: tuple[str, ...]) -> list[tuple[str, int]]:
    """(PCI address as the kernel prints it, XID) for every ``NVRM: Xid`` line."""
    found = []
    for line in lines:
        match = _XID.search(line)
        if match:
            domain, bus, device, xid = match.groups()
            found.append((f"{domain}:{bus}:{device}", int(xid)))
    return found


def check_xid(ctx: CheckContext) -> list[CheckResult]:
    """XID events in the kernel log since boot: hardware XIDs fail, others warn."""
    log = ctx.kernel_log
    if log is None or log.lines is None:
        why = log.unreadable if log is not None else "not read"
        return [
            CheckResult("xid", "skip", f"kernel log not readable: {why}",
                        "run as root (or sysctl kernel.dmesg_restrict=0) to check XID events")
        ]  # fmt: skip
    xids = parse_xids(log.lines)
    if not xids:
        return [CheckResult("xid", "pass", f"no XID event in the kernel log ({log.source})")]
    gpu_of = _gpu_bus_keys(ctx)
    counts = Counter(xids)
    parts = []
    for (address, xid), n in counts.most_common():
        what = HARDWARE_XIDS.get(xid) or OTHER_XIDS.get(xid) or "see the XID catalogue"
        index = gpu_of.get(_bus_key(*address.split(":")))
        where = f"{address}" + (f", GPU {index}" if index is not None else "")
        parts.append(f"XID {xid} ×{n} ({where}): {what}")
    hardware = sorted({x for _, x in counts if x in HARDWARE_XIDS})
    status: Status = "fail" if hardware else "warn"
    if hardware:
        action = XID_ACTIONS.get(hardware[0], MEMORY_ACTION)
    else:
        action = (
            "application XIDs point at a crashed job; if they recur without one, reset the GPU "
            "(sudo nvidia-smi -r)"
        )
    data = {
        "events": [{"pci": a, "xid": x, "count": n} for (a, x), n in counts.items()],
        "source": log.source,
    }
    return [
        CheckResult("xid", status, "; ".join(parts) + " (since boot)", f"{action}; {XID_DOCS}",
                    data=data)
    ]  # fmt: skip
