"""NVML, optional: the conditions a cycle ran under, the soak's thermal limits, and busy detection.

Every reading may be None (no nvidia-ml-py in this Python, no NVML, a MIG instance, a query the
GPU does not answer). pynvml is imported inside :func:`_import_pynvml` only.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkdiag.probe.worker.log import log

# HW_SLOWDOWN, HW_THERMAL_SLOWDOWN and NVML_FI_DEV_MEMORY_TEMP repeat sources/' NVML numbers
# (the worker is one self-contained script): tests/test_nvml_queries.py holds them equal.
HW_SLOWDOWN = 0x8  # clock event reasons (nvmlClocksEventReason*)
HW_THERMAL_SLOWDOWN = 0x40
NVML_SAMPLE_PERIOD = 0.05
NVML_FI_DEV_MEMORY_TEMP = 82


def _import_pynvml() -> Any:
    try:
        import pynvml
    except Exception:  # ImportError, or a broken install
        return None
    return pynvml


class Nvml:
    """The few NVML calls the probe needs; every reading may be None."""

    def __init__(self, mod: Any, handle: Any) -> None:
        self.mod = mod
        self.handle = handle
        self._reasons_fn: Any = getattr(mod, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if self._reasons_fn is None:
            self._reasons_fn = getattr(mod, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

    @classmethod
    def open(cls, cuda_index: int) -> Nvml | None:
        mod = _import_pynvml()
        if mod is None:
            return None
        try:
            mod.nvmlInit()
        except Exception as exc:
            log(f"NVML unavailable: {exc}")
            return None
        try:
            handle = cls._handle_for_cuda_index(mod, cuda_index)
        except Exception as exc:
            log(f"NVML has no handle for CUDA device {cuda_index}: {exc}")
            handle = None
        if handle is None:
            _shutdown(mod)
            return None
        return cls(mod, handle)

    @staticmethod
    def _handle_for_cuda_index(mod: Any, cuda_index: int) -> Any:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return mod.nvmlDeviceGetHandleByIndex(cuda_index)
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if cuda_index >= len(entries):
            return None
        entry = entries[cuda_index]
        if entry.isdigit():
            return mod.nvmlDeviceGetHandleByIndex(int(entry))
        if entry.startswith("GPU-"):
            return mod.nvmlDeviceGetHandleByUUID(entry)
        return None  # MIG instances and other forms: no device-level reading

    def rebind(self, uuid: str) -> None:
        self.handle = self.mod.nvmlDeviceGetHandleByUUID(uuid)

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self.mod, name)(*args)
        except Exception:
            return None

    def uuid(self) -> str | None:
        value = self._call("nvmlDeviceGetUUID", self.handle)
        return _text(value)

    def name(self) -> str | None:
        return _text(self._call("nvmlDeviceGetName", self.handle))

    def driver_version(self) -> str | None:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def compute_pids(self) -> set[int] | None:
        """PIDs of compute (and MPS) processes on the device; None when unknown."""
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", self.handle)
        if procs is None:
            return None
        pids = {int(p.pid) for p in procs}
        mps = self._call("nvmlDeviceGetMPSComputeRunningProcesses", self.handle)
        if mps:
            pids.update(int(p.pid) for p in mps)
        return pids

    def utilization(self) -> float | None:
        rates = self._call("nvmlDeviceGetUtilizationRates", self.handle)
        return None if rates is None else float(rates.gpu) / 100.0

    def memory_temperature(self) -> float | None:
        values = self._call("nvmlDeviceGetFieldValues", self.handle, [NVML_FI_DEV_MEMORY_TEMP])
        if not values:
            return None
        v = values[0]
        if int(getattr(v, "nvmlReturn", 1)) != 0:
            return None
        kind = int(v.valueType)
        raw = {
            0: v.value.dVal,
            1: v.value.uiVal,
            2: v.value.ulVal,
            3: v.value.ullVal,
            4: v.value.sllVal,
            5: v.value.siVal,
        }.get(kind)
        if raw is None or raw == 0:  # a constant 0 means "not supported" (GB10)
            return None
        return float(raw)

    def max_sm_clock_mhz(self) -> int | None:
        """Highest SM clock in MHz (nvidia-smi --query-gpu=clocks.max.sm)."""
        value = self._call("nvmlDeviceGetMaxClockInfo", self.handle, 1)  # NVML_CLOCK_SM
        return None if value is None else int(value)

    def sample(self) -> dict[str, float | int | None]:
        temp = self._call("nvmlDeviceGetTemperature", self.handle, 0)  # NVML_TEMPERATURE_GPU
        clock = self._call("nvmlDeviceGetClockInfo", self.handle, 1)  # NVML_CLOCK_SM, MHz
        mem_clock = self._call("nvmlDeviceGetClockInfo", self.handle, 2)  # NVML_CLOCK_MEM, MHz
        power = self._call("nvmlDeviceGetPowerUsage", self.handle)  # mW
        reasons = None if self._reasons_fn is None else _safe(self._reasons_fn, self.handle)
        return {
            "gpu_temperature": None if temp is None else float(temp),
            "memory_temperature": self.memory_temperature(),
            "reasons": None if reasons is None else int(reasons),
            "sm_clock_hz": None if clock is None else float(clock) * 1e6,
            "memory_clock_hz": None if not mem_clock else float(mem_clock) * 1e6,
            "power_w": None if power is None else float(power) / 1000.0,
        }

    def thresholds(self) -> dict[str, float | None]:
        """GPU slowdown and memory maximum temperatures in °C, None where NVML has none
        (nvidia-smi -q -d TEMPERATURE: "GPU Slowdown Temp", "Memory Max Operating Temp")."""
        slowdown = self._call("nvmlDeviceGetTemperatureThreshold", self.handle, 1)
        memory_max = self._call("nvmlDeviceGetTemperatureThreshold", self.handle, 2)
        return {
            "gpu_slowdown_celsius": float(slowdown) if slowdown else None,
            "memory_max_celsius": float(memory_max) if memory_max else None,
        }

    def shutdown(self) -> None:
        _shutdown(self.mod)


def _safe(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def _shutdown(mod: Any) -> None:
    with contextlib.suppress(Exception):
        mod.nvmlShutdown()


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class ConditionSampler:
    """Samples NVML on a background thread while the suite runs."""

    def __init__(self, nvml: Nvml | None, period: float = NVML_SAMPLE_PERIOD) -> None:
        self.nvml = nvml
        self.period = period
        self.samples: list[dict[str, float | int | None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.nvml is None:
            return
        self._take()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()

    def take(self) -> None:
        """One sample now (also between the background thread's)."""
        self._take()

    def _take(self) -> None:
        if self.nvml is not None:
            try:
                self.samples.append(self.nvml.sample())
            except Exception as exc:
                log(f"NVML sample failed: {exc}")

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self._take()

    def stop(self) -> dict[str, Any]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=2.0)
            self._take()
        return summarize_conditions(self.samples)


def summarize_conditions(samples: Sequence[dict[str, float | int | None]]) -> dict[str, Any]:
    def values(key: str) -> list[float]:
        return [float(v) for s in samples if (v := s.get(key)) is not None]

    gpu_t, mem_t = values("gpu_temperature"), values("memory_temperature")
    clocks, power = values("sm_clock_hz"), values("power_w")
    mem_clocks = values("memory_clock_hz")
    reasons = [int(v) for s in samples if (v := s.get("reasons")) is not None]
    seen = 0
    for r in reasons:
        seen |= r
    return {
        "max_gpu_temperature_celsius": max(gpu_t) if gpu_t else None,
        "max_memory_temperature_celsius": max(mem_t) if mem_t else None,
        "clock_event_reasons_seen": seen if reasons else None,
        "mean_sm_clock_hertz": statistics.fmean(clocks) if clocks else None,
        "min_sm_clock_hertz": min(clocks) if clocks else None,
        "mean_memory_clock_hertz": statistics.fmean(mem_clocks) if mem_clocks else None,
        "mean_power_watts": statistics.fmean(power) if power else None,
        "max_power_watts": max(power) if power else None,
        "samples": len(samples),
    }


# --------------------------------------------------------------------------
# busy detection


@dataclass
class BusyState:
    nvml: Nvml | None
    excluded: set[int]
    threshold: float
    self_pids: set[int] = field(default_factory=set)
    other_pids: list[int] = field(default_factory=list)
    utilization: float | None = None

    def others_now(self) -> list[int]:
        if self.nvml is None:
            return []
        pids = self.nvml.compute_pids() or set()
        return sorted(pids - self.self_pids - self.excluded)

    def check_before_context(self) -> str | None:
        """Before this process has a CUDA context: any compute process, or utilization."""
        if self.nvml is None:
            return None
        self.utilization = self.nvml.utilization()
        self.other_pids = self.others_now()
        reasons = []
        if self.other_pids:
            reasons.append(f"other compute processes on the GPU: pids {self.other_pids}")
        if self.utilization is not None and self.utilization > self.threshold:
            reasons.append(
                f"GPU utilization {self.utilization:.0%} above {self.threshold:.0%} threshold"
            )
        return "; ".join(reasons) or None

    def adopt_own_context(self, before: set[int]) -> None:
        """Count processes that appeared with our context as ours.

        Inside a PID namespace NVML may report this process under a PID that is
        not os.getpid(); whatever appeared between just before and just after
        our context was created is taken to be this worker.
        """
        if self.nvml is None:
            return
        after = self.nvml.compute_pids() or set()
        self.self_pids |= after - before

    def check_during(self) -> str | None:
        others = self.others_now()
        if others:
            self.other_pids = sorted(set(self.other_pids) | set(others))
            return f"other compute processes appeared on the GPU: pids {others}"
        return None
