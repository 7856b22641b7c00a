"""Synthetic soak windows, reports and state entries for the soak tests (no tests here)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sparkdiag.probe.document import Conditions, KernelResult, SoakWindow
from sparkdiag.soak.model import GpuSoak, SoakReport, Target
from sparkdiag.soak.state import GpuState, KernelState
from sparkdiag.soak.verdict import judge

DECODE = "1x8192x8192"
LLM = "4096x11008x4096"


def result(dtype: str, value: float | None, shape: str = DECODE) -> KernelResult:
    kind = "decode" if shape == DECODE else "llm"
    if value is None:
        return KernelResult(dtype, shape, kind, 0, "unsupported", f"{dtype} is not here", None)
    return KernelResult(dtype, shape, kind, 0, "ok", None, value, peak=value * 1.02, iters=50)


def window(
    index: int,
    rates: Mapping[str, float | None],
    memory: float | None = None,
    gpu: float | None = None,
    elapsed: float | None = None,
    ratios: Mapping[str, float] | None = None,
    load_memory: float | None = None,
    reasons: int | None = None,
) -> SoakWindow:
    """Window ``index`` (0 is the cold one) with decode results ``{dtype: TFLOPS}``."""
    conditions = Conditions(
        max_gpu_temperature_celsius=gpu,
        max_memory_temperature_celsius=memory,
        clock_event_reasons_seen=reasons,
        mean_sm_clock_hertz=1.98e9,
        min_sm_clock_hertz=1.9e9,
        mean_memory_clock_hertz=3.2e9,
        mean_power_watts=450.0,
        max_power_watts=520.0,
        samples=4,
    )
    load = None
    if index > 0:
        load = Conditions(max_memory_temperature_celsius=load_memory, samples=20)
    return SoakWindow(
        index=index,
        phase="cold" if index == 0 else "load",
        elapsed_seconds=float(index * 5) if elapsed is None else elapsed,
        results=tuple(result(d, v) for d, v in rates.items()),
        ratios=dict(ratios or {}),
        conditions=conditions,
        load_conditions=load,
        load_delivered=None if index == 0 else 700.0,
    )


def heating(
    int4: Sequence[float],
    bf16: Sequence[float],
    memory: Sequence[float | None],
    gpu: Sequence[float | None] | None = None,
) -> list[SoakWindow]:
    """Windows 0..n with int4 and bf16 decode rates at the given temperatures."""
    gpus = gpu if gpu is not None else [None] * len(memory)
    return [
        window(i, {"int4": a, "bf16": b}, memory=m, gpu=g, ratios={"int4/bf16": a / b})
        for i, (a, b, m, g) in enumerate(zip(int4, bf16, memory, gpus, strict=True))
    ]


def gpu_soak(
    windows: Sequence[SoakWindow],
    stopped: str = "completed",
    reason: str | None = None,
    index: int | None = 0,
    uuid: str = "GPU-11111111-2222-3333-4444-555555555555",
) -> GpuSoak:
    label = "cpu" if index is None else f"GPU {index}"
    return GpuSoak(
        target=Target(label, index, uuid if index is not None else None, "NVIDIA H200"),
        stopped=stopped,
        reason=reason,
        elapsed_seconds=windows[-1].elapsed_seconds if windows else None,
        windows=tuple(windows),
        verdict=judge(windows),
        result="ok",
    )


def report(*gpus: GpuSoak, interrupted: str | None = None) -> SoakReport:
    return SoakReport(1.7e9, 1.7e9 + 60, 60.0, 5.0, interrupted, tuple(gpus))


def gpu_state(
    gpu: str = "0",
    uuid: str = "GPU-11111111-2222-3333-4444-555555555555",
    finished_at: float = 1.7e9,
    stopped: str = "completed",
    kernels: Sequence[KernelState] = (),
    sensor: str | None = "memory",
    max_celsius: float | None = 61.0,
    reason: str | None = None,
) -> GpuState:
    return GpuState(
        gpu=gpu,
        uuid=uuid,
        name="NVIDIA H200",
        finished_at=finished_at,
        duration_seconds=300.0,
        elapsed_seconds=300.0,
        stopped=stopped,
        reason=reason,
        sensor=sensor,
        max_celsius=max_celsius,
        kernels=tuple(kernels),
    )


def held(dtype: str = "bf16", lowest: float = 0.97) -> KernelState:
    return KernelState(
        dtype,
        DECODE,
        "decode",
        "held",
        cold=4.0,
        hottest=3.9,
        hottest_celsius=61.0,
        lowest_fraction=lowest,
        max_celsius=61.0,
    )


def fell(dtype: str = "int4", at: float = 87.0) -> KernelState:
    return KernelState(
        dtype,
        DECODE,
        "decode",
        "fell",
        cold=6.4,
        hottest=4.0,
        hottest_celsius=91.0,
        lowest_fraction=0.62,
        fell_fraction=0.84,
        fell_celsius=at,
        max_celsius=91.0,
    )


def failed(dtype: str = "fp8") -> KernelState:
    """A kernel a window of the soak found wrong (or that failed): no throughput verdict."""
    return KernelState(dtype, DECODE, "decode", "error", cold=5.7, max_celsius=84.0)
