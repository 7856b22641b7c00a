"""What only a load can show: delivered throughput against the stored baseline and the built-in
reference, the SM clock under load against what the GPU sustains, and int4 against bf16/fp16 at
the decode shape."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable

from sparkdiag.baseline.evaluate import GemmFigure
from sparkdiag.baseline.reference import GB10, gpu_model
from sparkdiag.check.model import CheckContext, CheckResult, GpuProbe, Status, no_gpu_skip, worst
from sparkdiag.platforms import describe
from sparkdiag.probe.document import Conditions
from sparkdiag.probe.runner import worker_path
from sparkdiag.probe.worker.contract import throughput_unit
from sparkdiag.snapshot import GpuSample
from sparkdiag.sources.nvml.gpu import UNHEALTHY_REASONS, decode_reasons

BASELINE_FAIL = 0.85  # below this fraction of the stored baseline: fail
MAMF_WARN = 0.60  # below this fraction of a published MAMF figure: warn
# SM clock under load below this fraction of what the GPU sustains (its default applications
# clock where NVML gives one, else its maximum). A healthy GB10 runs 2359-2483 MHz around its
# 2418 MHz applications clock (98-103 %) but only 79-83 % of its 3003 MHz maximum, so against
# the maximum it failed; its USB-PD slow state runs 500-850 MHz (21-35 %). An H200's default
# applications clock is its maximum (1980 MHz), so its judgment is unchanged.
CLOCK_FRACTION = 0.80
LOADED_UTILIZATION = 0.5  # a poll during the probe counts as "under load" from here
USB_PD_ACTION = (
    "the GB10's USB-C power negotiation left it in a slow state, which survives nvidia-smi -r "
    "and reboots: power the machine off, remove AC power (unplug the power adapter from the "
    "wall) for a minute, check the USB-C power adapter and its cable (the one that came with "
    "the machine, firmly seated), then start it again and rerun sparkdiag check"
)

ProbeCheck = Callable[[CheckContext, GpuProbe], CheckResult]


def per_probe(name: str, ctx: CheckContext, check: ProbeCheck) -> list[CheckResult]:
    """Run ``check`` on every probed GPU; a GPU without a probe result is a skip with why."""
    if not ctx.gpus_up():
        return [no_gpu_skip(name, ctx.snapshot)]
    if ctx.probe_skipped is not None:
        return [CheckResult(name, "skip", ctx.probe_skipped)]
    results = []
    for gpu in ctx.gpus_up():
        index = str(gpu.identity.index)
        probe = ctx.probes.get(gpu.identity.index)
        if probe is None:
            results.append(CheckResult(name, "skip", "not probed", gpu=index))
        elif probe.skipped is not None:
            results.append(CheckResult(name, "skip", probe.skipped, gpu=index))
        else:
            results.append(check(ctx, probe))
    return results


def _idx(probe: GpuProbe) -> str:
    return str(probe.gpu.identity.index)


def _not_ok(name: str, probe: GpuProbe) -> CheckResult | None:
    """A skip for checks that need a finished probe, when the probe did not finish."""
    cycle = probe.cycle
    if cycle is not None and cycle.result in ("ok", "error") and cycle.document:
        return None
    result = cycle.result if cycle is not None else "not run"
    return CheckResult(
        name, "skip", f"no probe result ({result}; see the probe check)", gpu=_idx(probe)
    )


# -- throughput ------------------------------------------------------------------------------


def _tf(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.3g}"


def _figure(fig: GemmFigure) -> tuple[Status, str]:
    assert fig.delivered is not None
    status: Status = "pass"
    notes = []
    ref_eff = fig.reference_efficiency
    if fig.reference is not None and ref_eff is not None:
        notes.append(f"{ref_eff:.2f} of {fig.reference.label}")
        if fig.reference.kind == "mamf" and ref_eff < MAMF_WARN:
            status = "warn"
    eff = fig.efficiency
    if fig.baseline is not None and eff is not None:
        notes.append(f"{eff:.2f} of baseline {_tf(fig.baseline.tflops)}")
        if eff < BASELINE_FAIL:
            status = "fail"
    unit = throughput_unit(fig.dtype)
    peak = f", peak {_tf(fig.peak)}" if fig.peak is not None else ""
    shown = f"{fig.dtype} {_tf(fig.delivered)} {unit} delivered{peak}"
    return status, shown + (f" ({', '.join(notes)})" if notes else " (no baseline or reference)")


def _probe(ctx: CheckContext, probe: GpuProbe) -> CheckResult:
    cycle = probe.cycle
    gpu = probe.gpu.identity
    if cycle is None:
        return CheckResult("probe", "skip", "not probed", gpu=_idx(probe))
    reason = cycle.reason or ""
    by_hand = (
        f"run the worker by hand to see why: CUDA_VISIBLE_DEVICES={gpu.uuid} "
        f"{shlex.quote(sys.executable)} {shlex.quote(str(worker_path()))} --dtype bf16"
    )
    if cycle.result == "unsupported":
        return CheckResult(
            "probe",
            "skip",
            f"probe unsupported here: {reason}",
            "check that torch sees the GPU: python -c 'import torch; "
            "print(torch.cuda.is_available())'",
            _idx(probe),
        )
    if cycle.result == "skipped_busy":
        return CheckResult(
            "probe",
            "warn",
            f"probe skipped: {reason}",
            "rerun when nothing else uses the GPU",
            _idx(probe),
        )
    if cycle.result == "timeout":
        return CheckResult(
            "probe",
            "warn",
            f"probe timed out: {reason}",
            "rerun with --probe.timeout 60; if it hangs again, the GPU may be "
            f"stuck: reset it (sudo nvidia-smi -r -i {gpu.index})",
            _idx(probe),
        )
    if cycle.result == "error":
        return CheckResult("probe", "fail", f"probe failed: {reason}", by_hand, _idx(probe))
    figures = [
        f
        for f in probe.figures
        if f.kind == "compute"
        and f.beta == 0
        and f.status == "ok"
        and f.delivered is not None
        and not f.dtype.startswith("int")
    ]
    if not figures:
        return CheckResult("probe", "skip", "no compute-bound result to compare", gpu=_idx(probe))
    judged = [_figure(f) for f in figures]
    status = worst([s for s, _ in judged])
    finding = f"at {figures[0].shape}: " + "; ".join(text for _, text in judged)
    data = {
        "wall_seconds": cycle.wall_seconds,
        "figures": [
            {
                "dtype": f.dtype,
                "shape": f.shape,
                "delivered_tflops": f.delivered,
                "peak_tflops": f.peak,
                "baseline": f.baseline.tflops if f.baseline else None,
                "efficiency": f.efficiency,
                "reference": f.reference.tflops if f.reference else None,
                "reference_kind": f.reference.kind if f.reference else None,
                "reference_efficiency": f.reference_efficiency,
            }
            for f in figures
        ],
        "baseline_note": probe.baseline_note,
    }
    action = ""
    if status == "fail":
        action = (
            "throughput below the baseline this GPU reached when healthy: read the temperature, "
            "clock and idle rows; reset the GPU or reboot; rerun"
        )
    elif status == "warn":
        action = (
            "far below what this GPU model reaches: read the clock and temperature rows; check "
            "power limit (nvidia-smi -q -d POWER) and that nothing else runs"
        )
    return CheckResult("probe", status, finding, action, _idx(probe), data)


def check_probe(ctx: CheckContext) -> list[CheckResult]:
    """Delivered GEMM throughput: below 0.85 of the stored baseline fails, below 0.6 of a
    published MAMF figure warns; a worker error (wrong result) fails."""
    return per_probe("probe", ctx, _probe)


# -- SM clock under load ---------------------------------------------------------------------


def sustained_clock(gpu: GpuSample) -> tuple[float | None, str]:
    """The SM clock ``gpu`` should sustain under load, in hertz, and what it is: the default
    applications clock (SM, else graphics) where NVML gives one, else the maximum SM clock."""
    default = gpu.clock_default_applications_hertz
    for domain in ("sm", "graphics"):
        if default.get(domain):
            return default[domain], "default applications clock"
    return gpu.clock_max_hertz.get("sm"), "maximum"


def is_gb10(gpu: GpuSample) -> bool:
    return gpu_model(gpu.identity.name) == GB10


def _sm_clock(ctx: CheckContext, probe: GpuProbe) -> CheckResult:
    name = "sm-clock"
    skip = _not_ok(name, probe)
    if skip is not None:
        return skip
    conditions = probe.document.conditions if probe.document else Conditions()
    mean = conditions.mean_sm_clock_hertz
    loaded = [
        s.clock_hertz["sm"]
        for s in probe.load
        if "sm" in s.clock_hertz and s.utilization_ratio.get("gpu", 0.0) >= LOADED_UTILIZATION
    ]
    candidates = [float(v) for v in (mean, max(loaded, default=None)) if v is not None]
    target, what = sustained_clock(probe.gpu)
    maximum = probe.gpu.clock_max_hertz.get("sm")
    if not candidates:
        return CheckResult(
            name, "skip", "the probe recorded no SM clock (no NVML in the worker)", gpu=_idx(probe)
        )
    if not target:
        return CheckResult(
            name, "skip", "neither applications nor maximum SM clock reported", gpu=_idx(probe)
        )
    observed = max(candidates)
    ratio = observed / target
    seen_mask = conditions.clock_event_reasons_seen or 0
    for sample in probe.load:
        seen_mask |= sample.clock_event_reasons or 0
    seen = decode_reasons(seen_mask)
    data = {
        "sm_clock_hertz": observed,
        "sustained_hertz": target,
        "sustained_is": what,
        "max_hertz": maximum,
        "ratio": ratio,
        "worker_mean_hertz": mean,
        "reasons_seen": seen,
    }
    of = f"{target / 1e6:.0f} MHz"
    if what != "maximum":
        of = f"its {of} applications clock"
        if maximum is not None and round(maximum / 1e6) != round(target / 1e6):
            of += f", max {maximum / 1e6:.0f}"
    # 79.96 % must not read "80%" beside a failure at 80 %
    pct = f"{ratio:.1%}" if ratio < CLOCK_FRACTION <= round(ratio, 2) else f"{ratio:.0%}"
    text = f"SM clock {observed / 1e6:.0f} MHz under load ({pct} of {of})"
    thermal = [r for r in seen if r in UNHEALTHY_REASONS]
    if ratio >= CLOCK_FRACTION:
        if thermal:
            return CheckResult(
                name,
                "warn",
                f"{text}, {', '.join(thermal)} seen",
                "cool the GPU (airflow, fans) before long benchmarks",
                _idx(probe),
                data,
            )
        return CheckResult(name, "pass", text, gpu=_idx(probe), data=data)
    if thermal:
        return CheckResult(
            name,
            "fail",
            f"{text}, {', '.join(thermal)} seen",
            "cool the GPU: check airflow, fans and inlet temperature",
            _idx(probe),
            data,
        )
    if "sw_power_cap" in seen or "applications_clocks_setting" in seen:
        power = conditions.mean_power_watts
        limit = probe.gpu.power_limit_watts
        at = f" at {power:.0f} of {limit:.0f} W" if power is not None and limit else ""
        capped = "power-capped" if "sw_power_cap" in seen else "held by application clocks"
        return CheckResult(
            name,
            "warn",
            f"{text}, {capped}{at}",
            "normal at the power limit under full load; if the limit was lowered, restore it "
            "(nvidia-smi -q -d POWER; sudo nvidia-smi -pl <W>); application clocks: "
            "sudo nvidia-smi -rac",
            _idx(probe),
            data,
        )
    if is_gb10(probe.gpu):
        machine = describe(ctx.snapshot.platform)
        data["platform"] = machine
        return CheckResult(
            name,
            "fail",
            f"{text} with no clock event reason: the GB10 USB-PD slow state ({machine})",
            USB_PD_ACTION,
            _idx(probe),
            data,
        )
    return CheckResult(
        name,
        "fail",
        f"{text} with no clock event reason: stuck in a slow state",
        f"reset the GPU (sudo nvidia-smi -r -i {probe.gpu.identity.index}) or reboot; if it "
        "stays slow, update the driver and firmware",
        _idx(probe),
        data,
    )


def check_sm_clock(ctx: CheckContext) -> list[CheckResult]:
    """The SM clock during the probe reaches 80 % of what the GPU sustains (its default
    applications clock, else its maximum); below it fails (thermal, or no reason at all: a GPU
    stuck in a slow state, on a GB10 its USB-PD slow state) or warns (power cap)."""
    return per_probe("sm-clock", ctx, _sm_clock)


# -- int4 at the decode shape ----------------------------------------------------------------


def _int4_decode(ctx: CheckContext, probe: GpuProbe) -> CheckResult:
    name = "int4-decode"
    skip = _not_ok(name, probe)
    if skip is not None:
        return skip
    decode = {f.dtype: f for f in probe.figures if f.kind == "decode" and f.beta == 0}
    int4 = decode.get("int4")
    if int4 is None:
        return CheckResult(name, "skip", "int4 not probed", gpu=_idx(probe))
    if int4.delivered is None:
        return CheckResult(
            name, "skip", f"int4 {int4.status}: {int4.reason or 'no result'}", gpu=_idx(probe)
        )
    others = [f for d, f in decode.items() if d in ("bf16", "fp16") and f.delivered is not None]
    if not others:
        return CheckResult(
            name, "skip", "no bf16/fp16 decode result to compare with", gpu=_idx(probe)
        )
    best = max(others, key=lambda f: f.delivered or 0.0)
    assert best.delivered is not None
    # the worker's interleaved rounds (suite check/hot) give the ratio under one set of
    # conditions; a document without them falls back to the two figures
    measured = probe.document.ratios.get(f"int4/{best.dtype}") if probe.document else None
    ratio = measured if measured is not None else int4.delivered / best.delivered
    data = {
        "shape": int4.shape,
        "int4_tflops": int4.delivered,
        "other": best.dtype,
        "other_tflops": best.delivered,
        "ratio": ratio,
        "interleaved": measured is not None,
    }
    units = throughput_unit("int4"), throughput_unit(best.dtype)
    values = f"{_tf(int4.delivered)} {units[0]} against {_tf(best.delivered)} {units[1]}"
    if measured is not None and int4.peak and best.peak:
        # the worker's ratio is taken from the median iterations: show the figures it divides
        values = (
            f"{_tf(int4.peak)} {units[0]} against {_tf(best.peak)} {units[1]}, median iterations"
        )
    if ratio < 1.0:
        return CheckResult(
            name,
            "warn",
            f"int4 slower than {best.dtype} at decode {int4.shape}: {ratio:.2f}× ({values})",
            "int4 weight-only should beat 16-bit when memory-bound: check the memory "
            "temperature and SM clock rows, that no other process shares the GPU, and the "
            "torch version (its int4 kernels)",
            _idx(probe),
            data,
        )
    return CheckResult(
        name,
        "pass",
        f"int4 {ratio:.2f}× {best.dtype} at decode {int4.shape} ({values})",
        gpu=_idx(probe),
        data=data,
    )


def check_int4_decode(ctx: CheckContext) -> list[CheckResult]:
    """int4 against the faster of bf16/fp16 at the decode shape (M=1): slower warns."""
    return per_probe("int4-decode", ctx, _int4_decode)
