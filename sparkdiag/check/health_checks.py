"""GPU health: uncorrected ECC errors, row remapping, XID events in the kernel log (by the tiers of
NVIDIA's XID catalog), the recovery action the driver asks for, the NVLink fabric registration."""

from __future__ import annotations

from collections import Counter

from sparkdiag.check.gpu_checks import each_gpu
from sparkdiag.check.model import CheckContext, CheckResult, Status
from sparkdiag.check.model import gpu_index as _idx
from sparkdiag.snapshot import GpuSample
from sparkdiag.sources.nvml.xid import (
    CATALOG_URL,
    BusKey,
    GpuReset,
    bus_key,
    kernel_gpu_resets,
    kernel_xid_events,
    last_reset,
    parse_kernel_xids,
)
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


def _gpu_bus_keys(ctx: CheckContext) -> dict[BusKey, int]:
    keys = {}
    for gpu in ctx.snapshot.gpus:
        key = bus_key(gpu.identity.pci_bus_id)
        if key is not None:
            keys[key] = gpu.identity.index
    return keys


_RANK = {"critical": 0, "warning": 1, "info": 2}
_STATUS: dict[str, Status] = {"critical": "fail", "warning": "warn", "info": "pass"}
_STATUS_RANK: dict[Status, int] = {"fail": 0, "warn": 1, "pass": 2, "skip": 3}
_RESET_ACTIONS = ("reset_gpu", "workflow_xid_48", "workflow_nvlink_err", "workflow_nvlink5_err")


def check_xid(ctx: CheckContext) -> list[CheckResult]:
    """XID events in the kernel log since boot, by the tier NVIDIA's XID catalog gives each code
    (:mod:`sparkdiag.sources.nvml.xid`): a critical one fails, a warning one warns, informational
    ones pass; the action is the catalog's for the worst code seen. An event logged before the
    kernel log shows its GPU set up again (the driver loaded, the GPU probed or reset by the
    PCI core, initialised again: :func:`sparkdiag.sources.nvml.xid.kernel_gpu_resets`) warns at
    most: it was logged before the last reset of that GPU. 'nvidia-smi -r' writes no line there:
    after one, the XID fails until the driver is loaded again or the machine rebooted."""
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
    events = kernel_xid_events(log.lines)
    if not events:
        return [CheckResult("xid", "pass", f"no XID event in the kernel log ({log.source})")]
    gpu_of = _gpu_bus_keys(ctx)
    resets = kernel_gpu_resets(log.lines)
    # (address, code, the reset it was logged before or None) -> how many
    counts: Counter[tuple[str, int, GpuReset | None]] = Counter()
    for event in events:
        reset = last_reset(resets, event.address)
        counts[event.address, event.code, reset if reset and reset.line > event.line else None] += 1

    def status(code: int, before: GpuReset | None) -> Status:
        tier = describe_xid(code).tier
        return "warn" if before is not None and tier != "info" else _STATUS[tier]

    ranked = sorted(
        counts.items(),
        key=lambda item: (  # the worst first; of one status, what still stands first
            _STATUS_RANK[status(item[0][1], item[0][2])],
            item[0][2] is not None,
            _RANK[describe_xid(item[0][1]).tier],
            -item[1],
        ),
    )

    def index_of(address: str) -> int | None:
        key = bus_key(address)
        return None if key is None else gpu_of.get(key)

    def gpu_name(address: str) -> str:
        index = index_of(address)
        return f"GPU {index}" if index is not None else f"the GPU at {address}"

    parts = []
    reset_of: dict[str, str] = {}  # GPU -> how the log shows its last reset
    for (address, code, before), n in ranked:
        info = describe_xid(code)
        index = index_of(address)
        where = f"{address}" + (f", GPU {index}" if index is not None else "")
        part = f"XID {code} ×{n} ({where}): {info.meaning} [{info.tier}]"
        if before is not None:
            part += f", logged before the last reset of {gpu_name(address)}"
            reset_of.setdefault(gpu_name(address), before.how)
        parts.append(part)
    (worst_address, worst_code, worst_before), _ = ranked[0]
    worst = describe_xid(worst_code)
    worst_status = status(worst_code, worst_before)
    index = index_of(worst_address)
    todo = worst.action("N" if index is None else index, in_check=True)
    action = ""
    if worst_before is not None and worst.tier != "info":
        action = (
            f"XID {worst_code} came before the last reset of {gpu_name(worst_address)}: nothing "
            f"to do unless it comes back; then: {todo}; {CATALOG_URL}"
        )
    elif worst.tier != "info":
        action = f"XID {worst_code}: {todo}; {CATALOG_URL}"
        if worst.bucket in _RESET_ACTIONS:
            action += (
                "; nvidia-smi -r leaves no line in the kernel log: after one, this row fails "
                "until the driver is loaded again (or the machine rebooted)"
            )
    data = {
        "events": [
            {
                "pci": a,
                "xid": x,
                "count": n,
                "severity": describe_xid(x).tier,
                "action": describe_xid(x).bucket,
                "before_reset": before is not None,
            }
            for (a, x, before), n in counts.items()
        ],
        "source": log.source,
    }
    suffix = " (since boot)" if worst_status != "pass" else " (since boot; informational only)"
    suffix += "".join(f"; the last reset of {gpu}: {how}" for gpu, how in reset_of.items())
    return [CheckResult("xid", worst_status, "; ".join(parts) + suffix, action, data=data)]


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
