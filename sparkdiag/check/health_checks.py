"""GPU health: uncorrected ECC errors, row remapping, XID events in the kernel log (by the tiers of
NVIDIA's XID catalog), the recovery action the driver asks for, the NVLink fabric registration."""

from __future__ import annotations

import re
from collections import Counter

from sparkdiag.check.gpu_checks import each_gpu
from sparkdiag.check.model import CheckContext, CheckResult, Status
from sparkdiag.check.model import gpu_index as _idx
from sparkdiag.snapshot import GpuSample
from sparkdiag.sources.nvml.xid import CATALOG_URL, parse_kernel_xids
from sparkdiag.sources.nvml.xid import describe as describe_xid

parse_xids = parse_kernel_xids  # the name tests and older callers use

MEMORY_ACTION = "reset the GPU (sudo nvidia-smi -r) or reboot; if it recurs, request service"


# -- ECC ---------------------------------------------------------------------------------------


def _ecc(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """Uncorrected ECC errors: fail, or warn when row remapping has repaired them."""
    errors = gpu.ecc_errors
    if "uncorrected" not in errors:
        return CheckResult(
            "ecc", "skip", "ECC counters not reported (ECC off or unsupported)", gpu=_idx(gpu)
        )
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
            "ecc",
            "warn",
            f"{counts}; row remapping repaired them (none pending)",
            "watch the volatile counters (nvidia-smi -q -d ECC): if they grow, the GPU needs "
            "service",
            _idx(gpu),
            data,
        )
    return CheckResult("ecc", "fail", counts, MEMORY_ACTION, _idx(gpu), data)


check_ecc = each_gpu("ecc", _ecc)


# -- row remapping -------------------------------------------------------------------------------


def _row_remap(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """A pending remap (reset needed) or a failed one (service needed) fails."""
    rows = gpu.remapped_rows
    if not rows:
        return CheckResult(
            "row-remap", "skip", "row remapping not reported (no HBM remapping)", gpu=_idx(gpu)
        )
    pending, failure = int(rows.get("pending", 0)), int(rows.get("failure", 0))
    remapped = int(rows.get("corrected", 0) + rows.get("uncorrected", 0))
    data = {"pending": pending, "failure": failure, "remapped": remapped}
    if failure:
        return CheckResult(
            "row-remap",
            "fail",
            f"row remapping failed ({remapped} rows remapped)",
            "the GPU ran out of spare rows: drain it and request service (RMA)",
            _idx(gpu),
            data,
        )
    if pending:
        return CheckResult(
            "row-remap",
            "fail",
            f"row remap pending ({remapped} rows remapped)",
            "stop the GPU's processes and reset it to apply the remap: sudo nvidia-smi -r -i "
            f"{gpu.identity.index} (or reboot)",
            _idx(gpu),
            data,
        )
    return CheckResult(
        "row-remap",
        "pass",
        f"no pending or failed remap ({remapped} rows remapped)",
        gpu=_idx(gpu),
        data=data,
    )


check_row_remap = each_gpu("row-remap", _row_remap)


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


_RANK = {"critical": 0, "warning": 1, "info": 2}
_STATUS: dict[str, Status] = {"critical": "fail", "warning": "warn", "info": "pass"}


def check_xid(ctx: CheckContext) -> list[CheckResult]:
    """XID events in the kernel log since boot, by the tier NVIDIA's XID catalog gives each code
    (:mod:`sparkdiag.sources.nvml.xid`): a critical one fails, a warning one warns, informational
    ones pass; the action is the catalog's for the worst code seen."""
    log = ctx.kernel_log
    if log is None or log.lines is None:
        why = log.unreadable if log is not None else "not read"
        return [
            CheckResult(
                "xid",
                "skip",
                f"kernel log not readable: {why}",
                "run as root (or sysctl kernel.dmesg_restrict=0) to check XID events",
            )
        ]
    xids = parse_xids(log.lines)
    if not xids:
        return [CheckResult("xid", "pass", f"no XID event in the kernel log ({log.source})")]
    gpu_of = _gpu_bus_keys(ctx)
    counts = Counter(xids)
    ranked = sorted(
        counts.items(), key=lambda item: (_RANK[describe_xid(item[0][1]).tier], -item[1])
    )
    parts = []
    for (address, code), n in ranked:
        info = describe_xid(code)
        index = gpu_of.get(_bus_key(*address.split(":")))
        where = f"{address}" + (f", GPU {index}" if index is not None else "")
        parts.append(f"XID {code} ×{n} ({where}): {info.meaning} [{info.tier}]")
    (worst_address, worst_code), _ = ranked[0]
    worst = describe_xid(worst_code)
    index = gpu_of.get(_bus_key(*worst_address.split(":")))
    action = ""
    if worst.tier != "info":
        action = f"XID {worst_code}: {worst.action('N' if index is None else index)}; {CATALOG_URL}"
    data = {
        "events": [
            {
                "pci": a,
                "xid": x,
                "count": n,
                "severity": describe_xid(x).tier,
                "action": describe_xid(x).bucket,
            }
            for (a, x), n in counts.items()
        ],
        "source": log.source,
    }
    suffix = " (since boot)" if worst.tier != "info" else " (since boot; informational only)"
    return [CheckResult("xid", _STATUS[worst.tier], "; ".join(parts) + suffix, action, data=data)]


# -- the driver's recovery action, the NVLink fabric ---------------------------------------------

RECOVERY_ACTION_TODO = {
    "gpu_reset": "stop the GPU's processes and reset it: sudo nvidia-smi -r -i {gpu}",
    "node_reboot": "drain the node and reboot it",
    "drain_p2p": "stop peer-to-peer (NVLink) traffic to this GPU: drain the jobs that use it",
    "drain_and_reset": "drain the jobs that use it, then reset it: sudo nvidia-smi -r -i {gpu}",
    "recover_imex_domain": "recover the IMEX domain (restart the nvidia-imex service of the "
    "domain)",
    "bus_reset": "reset the GPU's PCIe bus: drain it, then reboot if a bus reset is not "
    "available to you",
    "system_reboot": "drain the node and reboot it",
    "unknown": "read nvidia-smi -q ('GPU Recovery Action') and do what it says",
}


def _recovery(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """The recovery action the driver asks for (none, reset, reboot, drain ...): any but
    none fails, with what to do."""
    action = gpu.recovery_action
    if action is None:
        return CheckResult(
            "recovery-action",
            "skip",
            "the driver reports no recovery action for this GPU",
            gpu=_idx(gpu),
        )
    data = {"recovery_action": action}
    if action == "none":
        return CheckResult(
            "recovery-action",
            "pass",
            "the driver asks for no recovery action",
            gpu=_idx(gpu),
            data=data,
        )
    todo = RECOVERY_ACTION_TODO.get(action, RECOVERY_ACTION_TODO["unknown"])
    return CheckResult(
        "recovery-action",
        "fail",
        f"the driver asks for a recovery action: {action.replace('_', ' ')}",
        todo.format(gpu=gpu.identity.index) + "; the GPU is not usable until then",
        _idx(gpu),
        data,
    )


check_recovery_action = each_gpu("recovery-action", _recovery)


FABRIC_ACTION = (
    "check the fabric manager (systemctl status nvidia-fabricmanager; its log in "
    "/var/log/fabricmanager.log) and nvidia-smi -q | grep -A4 Fabric; restart it, then reset "
    "the GPUs (sudo nvidia-smi -r) or reboot"
)


def _fabric(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """The NVLink fabric registration (NVSwitch systems): anything but completed, successful
    and healthy fails."""
    fabric = gpu.fabric
    if fabric is None:
        return CheckResult(
            "fabric", "skip", "the GPU joins no NVLink fabric (no NVSwitch)", gpu=_idx(gpu)
        )
    data = {"state": fabric.state, "status": fabric.status, "health": fabric.health}
    health = f", health {fabric.health.replace('_', ' ')}" if fabric.health else ""
    if fabric.state != "completed":
        return CheckResult(
            "fabric",
            "fail",
            f"NVLink fabric registration {fabric.state.replace('_', ' ')}: the GPU cannot run "
            "work over NVLink yet" + health,
            FABRIC_ACTION,
            _idx(gpu),
            data,
        )
    if fabric.status != "SUCCESS":
        return CheckResult(
            "fabric",
            "fail",
            f"NVLink fabric registration failed ({fabric.status}){health}",
            FABRIC_ACTION,
            _idx(gpu),
            data,
        )
    if fabric.health in ("unhealthy", "limited_capacity"):
        return CheckResult(
            "fabric", "fail", f"NVLink fabric registered{health}", FABRIC_ACTION, _idx(gpu), data
        )
    return CheckResult(
        "fabric", "pass", f"NVLink fabric registered{health}", gpu=_idx(gpu), data=data
    )


check_fabric = each_gpu("fabric", _fabric)
