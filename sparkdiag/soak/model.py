"""What a soak produced, per GPU, and the records written from it: the JSON record, the CSV rows
and the state file's entries."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkdiag.probe.document import Conditions, SoakWindow, Software
from sparkdiag.soak.state import GpuState, KernelState
from sparkdiag.soak.verdict import SoakVerdict, Verdict

RECORD_SCHEMA = "sparkdiag-soak/1"

# Why a soak stopped, for a GPU it never soaked (the worker's own reasons are in its document).
NOT_RUN = ("skipped", "unsupported")


@dataclass(frozen=True)
class Target:
    """Where one worker soaks: a GPU (pinned by uuid), or the device given with --device."""

    label: str  # "GPU 0", "cpu", "cuda:1"
    index: int | None = None  # NVML index
    uuid: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class GpuSoak:
    """One worker's soak: its windows (from its document, else the progress lines it printed
    before it was stopped), why it stopped, and the verdict.

    result, worker_reason: the runner's classification of the worker (ok, error, timeout, ...)
    """

    target: Target
    stopped: str
    reason: str | None
    elapsed_seconds: float | None
    windows: tuple[SoakWindow, ...]
    verdict: SoakVerdict
    result: str
    worker_reason: str | None = None
    worker_pid: int | None = None
    stderr_tail: str = ""
    software: Software | None = None
    thresholds: Mapping[str, float] = field(default_factory=dict)

    @property
    def device(self) -> str:
        if self.software is not None and self.software.device:
            return self.software.device
        return "cpu" if self.target.label == "cpu" else "cuda"

    @property
    def name(self) -> str:
        sw = self.software
        return self.target.name or (sw.gpu_name if sw and sw.gpu_name else "") or self.device

    @property
    def uuid(self) -> str:
        sw = self.software
        return self.target.uuid or (sw.gpu_uuid if sw and sw.gpu_uuid else "") or ""

    @property
    def gpu_label(self) -> str:
        """The ``gpu`` label: the NVML index, or ``cpu``."""
        if self.target.index is not None:
            return str(self.target.index)
        return "cpu" if self.device == "cpu" else self.target.label


@dataclass(frozen=True)
class SoakReport:
    """Every GPU's soak in one run of the command."""

    started_at: float
    finished_at: float
    duration_seconds: float
    window_seconds: float
    interrupted: str | None  # the signal that stopped the command, None when it ran to the end
    gpus: tuple[GpuSoak, ...]


# -- the JSON record ----------------------------------------------------------------------------


def _verdict_json(v: Verdict) -> dict[str, Any]:
    body = {k: val for k, val in asdict(v).items() if k != "points"}
    body["hottest_fraction"] = v.hottest_fraction
    return body


def window_json(w: SoakWindow) -> dict[str, Any]:
    body = asdict(w)
    body["ratios"] = dict(w.ratios)
    return body


def record_json(report: SoakReport) -> dict[str, Any]:
    """The JSON record (schema ``sparkdiag-soak/1``): the run, and per GPU why it stopped, its
    verdict and every window as the worker measured it."""
    return {
        "schema": RECORD_SCHEMA,
        "started_at": report.started_at,
        "finished_at": report.finished_at,
        "duration_seconds": report.duration_seconds,
        "window_seconds": report.window_seconds,
        "interrupted": report.interrupted,
        "gpus": [
            {
                "gpu": g.gpu_label,
                "uuid": g.uuid,
                "name": g.name,
                "device": g.device,
                "stopped": g.stopped,
                "reason": g.reason,
                "elapsed_seconds": g.elapsed_seconds,
                "result": g.result,
                "worker_reason": g.worker_reason,
                "worker_pid": g.worker_pid,
                "stderr_tail": g.stderr_tail if g.result in ("error", "timeout") else "",
                "software": g.software.as_dict() if g.software else None,
                "thresholds": dict(g.thresholds),
                "sensor": g.verdict.sensor,
                "min_celsius": g.verdict.min_celsius,
                "max_celsius": g.verdict.max_celsius,
                "verdicts": [_verdict_json(v) for v in g.verdict.kernels],
                "ratios": [_verdict_json(v) for v in g.verdict.ratios],
                "windows": [window_json(w) for w in g.windows],
            }
            for g in report.gpus
        ],
    }


# -- the CSV ------------------------------------------------------------------------------------

CSV_COLUMNS = (
    "gpu",
    "uuid",
    "window",
    "phase",
    "elapsed_seconds",
    "dtype",
    "shape",
    "kind",
    "status",
    "delivered_tflops",
    "of_cold",
    "int4_bf16",
    "int4_fp16",
    "gpu_temperature_celsius",
    "memory_temperature_celsius",
    "sm_clock_mhz",
    "min_sm_clock_mhz",
    "memory_clock_mhz",
    "clock_event_reasons",
    "power_watts",
    "max_power_watts",
    "load_tflops",
    "load_gpu_temperature_celsius",
    "load_memory_temperature_celsius",
    "reason",
)


def _mhz(hertz: float | None) -> float | None:
    return None if hertz is None else hertz / 1e6


def csv_rows(report: SoakReport) -> list[list[Any]]:
    """One row per window and kernel, in CSV_COLUMNS order (None for an empty cell).

    The conditions are those of the window's measurement (max temperatures, mean clocks and
    power, every clock event reason seen, as hex); ``load_*`` those of the sustained load before
    it; ``of_cold`` is delivered over the kernel's cold rate.
    """
    rows: list[list[Any]] = []
    for g in report.gpus:
        cold = {(v.dtype, v.shape): v.cold for v in g.verdict.kernels}
        for w in g.windows:
            c: Conditions = w.conditions
            load = w.load_conditions or Conditions()
            reasons = c.clock_event_reasons_seen
            for r in w.results:
                base = cold.get((r.dtype, r.shape))
                rows.append(
                    [
                        g.gpu_label,
                        g.uuid,
                        w.index,
                        w.phase,
                        w.elapsed_seconds,
                        r.dtype,
                        r.shape,
                        r.kind,
                        r.status,
                        r.delivered,
                        r.delivered / base if r.delivered is not None and base else None,
                        w.ratios.get("int4/bf16"),
                        w.ratios.get("int4/fp16"),
                        c.max_gpu_temperature_celsius,
                        c.max_memory_temperature_celsius,
                        _mhz(c.mean_sm_clock_hertz),
                        _mhz(c.min_sm_clock_hertz),
                        _mhz(c.mean_memory_clock_hertz),
                        None if reasons is None else f"{reasons:#x}",
                        c.mean_power_watts,
                        c.max_power_watts,
                        w.load_delivered,
                        load.max_gpu_temperature_celsius,
                        load.max_memory_temperature_celsius,
                        r.reason if r.status != "ok" else None,
                    ]
                )
    return rows


# -- the state file -----------------------------------------------------------------------------


def state_entry(g: GpuSoak, finished_at: float, duration: float) -> GpuState:
    """What the state directory keeps of one GPU's soak."""
    return GpuState(
        gpu=g.gpu_label,
        uuid=g.uuid,
        name=g.name,
        finished_at=finished_at,
        duration_seconds=duration,
        elapsed_seconds=g.elapsed_seconds,
        stopped=g.stopped,
        reason=g.reason,
        sensor=g.verdict.sensor,
        max_celsius=g.verdict.max_celsius,
        kernels=tuple(KernelState.kept(v) for v in g.verdict.kernels),
    )
