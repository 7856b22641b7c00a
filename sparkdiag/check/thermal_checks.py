"""Temperatures and clock event reasons, per GPU."""

from __future__ import annotations

from typing import Any

from sparkdiag.check.gpu_checks import each_gpu
from sparkdiag.check.model import CheckContext, CheckResult, Status
from sparkdiag.check.model import gpu_index as _idx
from sparkdiag.snapshot import GpuSample
from sparkdiag.sources.nvml.gpu import UNHEALTHY_REASONS, decode_reasons

MEMORY_HOT_C = 85.0  # HBM: the memory controller throttles above this (CONTEXT.md)
MEMORY_WARM_C = 80.0
GPU_MARGIN_C = 5.0  # warn this close to the slowdown threshold
# Without a slowdown threshold (GB10 reports only shutdown, near 105 °C).
SHUTDOWN_FAIL_MARGIN_C = 15.0
SHUTDOWN_WARN_MARGIN_C = 25.0
FALLBACK_FAIL_C, FALLBACK_WARN_C = 90.0, 80.0

# What each unhealthy reason (sources.gpu.UNHEALTHY_REASONS, on which check fails) means.
FAIL_REASONS = {
    "hw_slowdown": "hardware slowdown (power or thermal emergency)",
    "sw_thermal_slowdown": "thermal slowdown (software)",
    "hw_thermal_slowdown": "thermal slowdown (hardware)",
    "hw_power_brake_slowdown": "power brake (external power-supply signal)",
}
THERMAL_ACTION = (
    "cool the GPU: check airflow, fans and inlet temperature; wait until the reason clears "
    "(nvidia-smi -q -d PERFORMANCE) before benchmarking"
)
REASON_ACTIONS = {
    "hw_slowdown": "check power cables and cooling; nvidia-smi -q -d PERFORMANCE shows the cause",
    "sw_thermal_slowdown": THERMAL_ACTION,
    "hw_thermal_slowdown": THERMAL_ACTION,
    "hw_power_brake_slowdown": "the power supply or BMC asserts the power brake: check the PSUs "
    "and the chassis power capping",
}


# No running GPU reads outside this: below it is a datacenter's coldest storage, above it every
# GPU has shut itself down (slowdown near 90 °C, shutdown near 105 °C). A reading outside it is
# the sensor or the driver misreporting: -300 °C passed as cool, 1e9 °C failed with advice
# about airflow.
PLAUSIBLE_C = (-40.0, 150.0)


def _c(value: float) -> str:
    return f"{value:.0f} °C"


def _implausible(name: str, what: str, temp: float, gpu: GpuSample) -> CheckResult | None:
    """The warning for a reading no GPU can have; None for a plausible one."""
    low, high = PLAUSIBLE_C
    if low <= temp <= high:
        return None
    return CheckResult(
        name,
        "warn",
        f"{what} reads {temp:g} °C, outside {low:.0f} to {high:.0f} °C: the sensor or the "
        "driver misreports it",
        f"compare with nvidia-smi -q -d TEMPERATURE -i {gpu.identity.index}; if it reads the "
        "same, reset the GPU or reload the driver: until then heat cannot be judged",
        _idx(gpu),
        {"celsius": temp, "plausible": list(PLAUSIBLE_C)},
    )


Step = tuple[Status, bool, str]  # a status, whether the reading reached it, the finding


def _ladder(
    name: str,
    gpu: GpuSample,
    data: dict[str, Any],
    action: str,
    steps: list[Step],
    passed: str,
) -> CheckResult:
    """The first step (status, reached, finding) reached, with ``action``; else a pass that
    says ``passed``."""
    for status, reached, finding in steps:
        if reached:
            return CheckResult(name, status, finding, action, _idx(gpu), data)
    return CheckResult(name, "pass", passed, gpu=_idx(gpu), data=data)


# -- temperatures ------------------------------------------------------------------------------


def _gpu_temperature(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """GPU temperature against its slowdown threshold (fail at it, warn 5 °C below); a reading
    outside -40 to 150 °C warns as the sensor misreporting."""
    name = "gpu-temperature"
    temp = gpu.temperature_celsius.get("gpu")
    if temp is None:
        return CheckResult(name, "skip", "GPU temperature not reported", gpu=_idx(gpu))
    implausible = _implausible(name, "GPU", temp, gpu)
    if implausible is not None:
        return implausible
    slowdown = gpu.threshold_celsius.get("slowdown")
    shutdown = gpu.threshold_celsius.get("shutdown")
    data = {"celsius": temp, "slowdown": slowdown, "shutdown": shutdown}
    action = (
        "improve airflow / check fans and inlet temperature; let the GPU cool down before "
        "benchmarking"
    )
    steps: list[Step]
    if slowdown is not None:
        steps = [
            ("fail", temp >= slowdown, f"GPU {_c(temp)} ≥ slowdown {_c(slowdown)}"),
            (
                "warn",
                temp >= slowdown - GPU_MARGIN_C,
                f"GPU {_c(temp)}, within {GPU_MARGIN_C:.0f} °C of slowdown {_c(slowdown)}",
            ),
        ]
        return _ladder(name, gpu, data, action, steps, f"GPU {_c(temp)} (slowdown {_c(slowdown)})")
    if shutdown is not None:
        fail_at, warn_at = shutdown - SHUTDOWN_FAIL_MARGIN_C, shutdown - SHUTDOWN_WARN_MARGIN_C
        limit = f"shutdown {_c(shutdown)}, no slowdown threshold reported"
    else:
        fail_at, warn_at = FALLBACK_FAIL_C, FALLBACK_WARN_C
        limit = "no threshold reported"
    steps = [
        ("fail", temp >= fail_at, f"GPU {_c(temp)} ≥ {_c(fail_at)} ({limit})"),
        ("warn", temp >= warn_at, f"GPU {_c(temp)} ≥ {_c(warn_at)} ({limit})"),
    ]
    return _ladder(name, gpu, data, action, steps, f"GPU {_c(temp)} ({limit})")


check_gpu_temperature = each_gpu("gpu-temperature", _gpu_temperature)


def _memory_temperature(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """Memory temperature against 85 °C and its own limit (warn from 80 °C); a reading outside
    -40 to 150 °C warns as the sensor misreporting."""
    name = "memory-temperature"
    temp = gpu.temperature_celsius.get("memory")
    if temp is None:
        why = (
            "unified LPDDR5X memory has no sensor"
            if gpu.identity.memory_model == "unified"
            else "NVML does not report it on this GPU"
        )
        return CheckResult(name, "skip", f"memory temperature not reported ({why})", gpu=_idx(gpu))
    implausible = _implausible(name, "memory", temp, gpu)
    if implausible is not None:
        return implausible
    limit = gpu.threshold_celsius.get("memory_max")
    data = {"celsius": temp, "memory_max": limit, "hot": MEMORY_HOT_C}
    action = (
        f"improve airflow / check fans; wait until memory < {MEMORY_WARM_C:.0f} °C before "
        "benchmarking (hot memory throttles: 4-bit and memory-bound kernels collapse)"
    )
    steps: list[Step] = []
    if limit is not None:
        steps.append(("fail", temp >= limit, f"memory {_c(temp)} ≥ its limit {_c(limit)}"))
    steps += [
        ("fail", temp >= MEMORY_HOT_C, f"memory {_c(temp)} ≥ {_c(MEMORY_HOT_C)}"),
        ("warn", temp >= MEMORY_WARM_C, f"memory {_c(temp)}, close to {_c(MEMORY_HOT_C)}"),
    ]
    shown = f" (limit {_c(limit)})" if limit is not None else ""
    return _ladder(name, gpu, data, action, steps, f"memory {_c(temp)}{shown}")


check_memory_temperature = each_gpu("memory-temperature", _memory_temperature)


# -- clock event reasons ----------------------------------------------------------------------


def _clock_reasons(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """Clock event reasons: thermal, hardware slowdown and power brake fail; power cap at
    idle and application clocks warn; gpu_idle is fine."""
    name = "clock-reasons"
    mask = gpu.clock_event_reasons
    if mask is None:
        return CheckResult(name, "skip", "clock event reasons not reported", gpu=_idx(gpu))
    names = decode_reasons(mask)
    data = {"mask": mask, "reasons": names}
    shown = f"{', '.join(names) or 'none'} (0x{mask:x})"
    failing = [r for r in names if r in FAIL_REASONS]
    if failing:
        temps = ", ".join(f"{k} {_c(v)}" for k, v in gpu.temperature_celsius.items())
        what = "; ".join(FAIL_REASONS[r] for r in failing)
        return CheckResult(
            name,
            "fail",
            f"{shown}: {what}" + (f" at {temps}" if temps else ""),
            REASON_ACTIONS[failing[0]],
            _idx(gpu),
            data,
        )
    if "sw_power_cap" in names and ctx.busy(gpu) is None:
        power = ""
        if gpu.power_watts is not None and gpu.power_limit_watts is not None:
            power = f" ({gpu.power_watts:.0f} of {gpu.power_limit_watts:.0f} W)"
        return CheckResult(
            name,
            "warn",
            f"{shown}: power cap active at idle{power}",
            "check the power limit (nvidia-smi -q -d POWER) and restore the default: "
            "sudo nvidia-smi -pl <default limit in W>",
            _idx(gpu),
            data,
        )
    if "applications_clocks_setting" in names:
        return CheckResult(
            name,
            "warn",
            f"{shown}: application clocks hold the GPU below max",
            "sudo nvidia-smi -rac (reset application clocks)",
            _idx(gpu),
            data,
        )
    note = " (power cap under load is normal)" if "sw_power_cap" in names else ""
    return CheckResult(name, "pass", shown + note, gpu=_idx(gpu), data=data)


check_clock_reasons = each_gpu("clock-reasons", _clock_reasons)


assert set(FAIL_REASONS) == UNHEALTHY_REASONS
