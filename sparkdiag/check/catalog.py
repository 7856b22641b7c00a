"""The list of checks, in the order they are reported, and the loop that runs them.

Each check is ``(CheckContext) -> list[CheckResult]`` and lives in the ``*_checks`` module of its
kind: ``gpu_checks`` (presence, idle, modes), ``thermal_checks`` (temperatures, clock event
reasons), ``pcie_checks`` (PCIe links of the GPU and the host), ``health_checks`` (ECC, row
remapping, XID, recovery action, NVLink fabric), ``stall_checks`` (busy while nothing moves),
``host_checks`` (context, governor, unified memory), ``memory_checks`` (what a new allocation
can get), ``native_checks`` (the software's native code, the dtype order under load),
``version_checks``, ``probe_checks``,
``power_checks`` and ``peer_checks`` (under load; ``peer_checks`` also reads the baseline
store's held learning), ``soak_checks`` (the latest ``sparkdiag soak``), ``store_checks`` (the
baseline store), ``storage_checks`` (NVMe health and temperature; a directory's speed with
``--storage DIR``) and ``network_checks`` (ConnectX-7 lint, link to ``--peer``). The other modules
of the package are the
machinery: ``model``, ``gather``, ``probe_run``, this catalogue and ``report``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sparkdiag.check.gpu_checks import (
    check_compute_mode,
    check_gpus,
    check_gpus_on_bus,
    check_idle,
    check_mig,
    check_nvml,
    check_persistence,
)
from sparkdiag.check.health_checks import (
    check_ecc,
    check_fabric,
    check_recovery_action,
    check_row_remap,
    check_xid,
)
from sparkdiag.check.host_checks import check_context, check_governor, check_unified_memory
from sparkdiag.check.memory_checks import check_gpu_memory
from sparkdiag.check.model import CheckContext, CheckResult
from sparkdiag.check.native_checks import check_dtype_order, check_native_code
from sparkdiag.check.network_checks import check_cx7_config, check_link_peer
from sparkdiag.check.pcie_checks import check_pcie_gpu, check_pcie_host
from sparkdiag.check.peer_checks import check_baseline_learning, check_peers
from sparkdiag.check.power_checks import check_power_under_load
from sparkdiag.check.probe_checks import check_int4_decode, check_probe, check_sm_clock
from sparkdiag.check.soak_checks import check_soak
from sparkdiag.check.stall_checks import check_stall
from sparkdiag.check.storage_checks import (
    check_nvme_health,
    check_nvme_temperature,
    check_storage_speed,
)
from sparkdiag.check.store_checks import check_baseline_store
from sparkdiag.check.thermal_checks import (
    check_clock_reasons,
    check_gpu_temperature,
    check_memory_temperature,
)
from sparkdiag.check.version_checks import check_versions

log = logging.getLogger(__name__)

Check = Callable[[CheckContext], list[CheckResult]]

CHECKS: tuple[tuple[str, Check], ...] = (
    ("nvml", check_nvml),
    ("gpus", check_gpus),
    ("gpus-on-bus", check_gpus_on_bus),
    ("versions", check_versions),
    ("idle", check_idle),
    ("stall", check_stall),
    ("gpu-temperature", check_gpu_temperature),
    ("memory-temperature", check_memory_temperature),
    ("clock-reasons", check_clock_reasons),
    ("pcie-gpu", check_pcie_gpu),
    ("pcie-host", check_pcie_host),
    ("nvme-health", check_nvme_health),
    ("nvme-temperature", check_nvme_temperature),
    ("ecc", check_ecc),
    ("row-remap", check_row_remap),
    ("xid", check_xid),
    ("recovery-action", check_recovery_action),
    ("fabric", check_fabric),
    ("persistence", check_persistence),
    ("compute-mode", check_compute_mode),
    ("mig", check_mig),
    ("context", check_context),
    ("cpu-governor", check_governor),
    ("unified-memory", check_unified_memory),
    ("gpu-memory", check_gpu_memory),
    ("native-code", check_native_code),
    ("baseline-store", check_baseline_store),
    ("baseline-learning", check_baseline_learning),
    ("probe", check_probe),
    ("sm-clock", check_sm_clock),
    ("power-under-load", check_power_under_load),
    ("int4-decode", check_int4_decode),
    ("dtype-order", check_dtype_order),
    ("peers", check_peers),
    ("soak", check_soak),
    ("storage-speed", check_storage_speed),
    ("cx7-config", check_cx7_config),
    ("link-peer", check_link_peer),
)
# Checks that need the GPU under load; --quick reports them as skipped.
LOAD_CHECKS = frozenset(
    {"probe", "sm-clock", "power-under-load", "int4-decode", "dtype-order", "peers"}
)


def run_checks(
    ctx: CheckContext, checks: tuple[tuple[str, Check], ...] = CHECKS
) -> list[CheckResult]:
    """Every check's results in order. A check that raises is reported as a warning (a sparkdiag
    bug must not hide the other checks, nor pass silently)."""
    results: list[CheckResult] = []
    for name, check in checks:
        try:
            results.extend(check(ctx))
        except Exception as exc:
            log.debug("check %s raised", name, exc_info=True)
            results.append(
                CheckResult(
                    name,
                    "warn",
                    f"the check itself failed: {type(exc).__name__}: {exc}",
                    "a sparkdiag bug: please report it with the output of --log-level debug",
                )
            )
    return results
