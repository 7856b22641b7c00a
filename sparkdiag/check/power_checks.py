"""Power under a full probe load: the GB10's ~30 W power-safety mode.

Owners report a power-delivery defect that caps a whole GB10 machine near 30 W; clocks and
throughput collapse with it, and only a replacement (RMA) helps. A healthy GB10 draws several
times that under a GEMM load, so a GPU that never rises above the cap while the probe keeps it
busy is in that mode. The USB-PD slow state (see the sm-clock check) also keeps the power low;
its remedy (remove AC power, check the adapter and cable) comes first, so this check's action
asks for it before the RMA.
"""

from __future__ import annotations

from sparkdiag.check.model import CheckContext, CheckResult, GpuProbe
from sparkdiag.check.probe_checks import LOADED_UTILIZATION, _idx, _not_ok, is_gb10, per_probe
from sparkdiag.platforms import describe

# The cap is ~30 W for the whole machine, so the GPU's own reading stays below it; 35 W leaves
# room for the reading's coarseness and for a cap a little above 30 W. A healthy GB10 under a
# full load draws far more (GX10 owners saw 85-90 W under an inference load).
POWER_SAFETY_WATTS = 35.0
NAME = "power-under-load"
RMA_ACTION = (
    "a power-delivery defect caps the whole machine near 30 W: first power it off, remove AC "
    "power for a minute and check the USB-C power adapter and its cable (the USB-PD slow state "
    "looks alike and clears that way); if it stays capped near 30 W, contact NVIDIA or the "
    "vendor's support for a replacement (RMA)"
)


def _power(ctx: CheckContext, probe: GpuProbe) -> CheckResult:
    skip = _not_ok(NAME, probe)
    if skip is not None:
        return skip
    mean = probe.document.conditions.mean_power_watts if probe.document else None
    loaded = [
        s.power_watts
        for s in probe.load
        if s.power_watts is not None and s.utilization_ratio.get("gpu", 0.0) >= LOADED_UTILIZATION
    ]
    readings = [float(w) for w in (mean, *loaded) if w is not None]
    if not readings:
        return CheckResult(NAME, "skip", "no power reading during the probe", gpu=_idx(probe))
    peak = max(readings)
    data: dict[str, object] = {
        "peak_watts": peak,
        "worker_mean_watts": mean,
        "loaded_polls": len(loaded),
        "threshold_watts": POWER_SAFETY_WATTS,
    }
    if not is_gb10(probe.gpu):
        return CheckResult(
            NAME,
            "skip",
            f"up to {peak:.0f} W under load; the ~30 W power-safety mode is a GB10 failure, "
            "not judged on this GPU",
            gpu=_idx(probe),
            data=data,
        )
    machine = describe(ctx.snapshot.platform)
    data["platform"] = machine
    if peak <= POWER_SAFETY_WATTS:
        return CheckResult(
            NAME,
            "fail",
            f"power never above {peak:.0f} W under a full probe load: the GB10 ~30 W "
            f"power-safety mode ({machine})",
            RMA_ACTION,
            _idx(probe),
            data,
        )
    return CheckResult(
        NAME, "pass", f"up to {peak:.0f} W under load ({machine})", gpu=_idx(probe), data=data
    )


def check_power_under_load(ctx: CheckContext) -> list[CheckResult]:
    """On a GB10, power under the probe's full load rises above ~30 W; at or below 35 W it fails
    (the power-safety mode: RMA). Other GPUs are not judged."""
    return per_probe(NAME, ctx, _power)
