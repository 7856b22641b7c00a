"""The worker's soak room: its windows, its stops and the document it always leaves."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from sparkdiag.probe.worker import contract, dtypes, kernels, output, soak
from tests.support import skip_unless_installed
from tests.support.worker import SOAK_ARGS, WORKER, cpu_info, progress_lines, run_worker

skip_unless_installed("torch")


@pytest.mark.worker
def test_soak_runs_its_windows_and_completes() -> None:
    started = time.monotonic()
    proc, doc = run_worker([*SOAK_ARGS, "--soak-seconds", "2"])
    assert doc["schema"] == "sparkdiag-probe/2" and doc["suite"] == "soak"
    assert doc["status"] == "ok" and doc["results"] == []
    section = doc["soak"]
    assert section["stopped"] == "completed" and section["reason"] is None
    assert 2.0 <= section["elapsed_seconds"] < time.monotonic() - started
    windows = section["windows"]
    assert [w["index"] for w in windows] == list(range(len(windows)))
    assert len(windows) >= 4  # the cold one, then every 0.5 s of a 2 s load
    assert windows[0]["phase"] == "cold" and windows[0]["elapsed_seconds"] == 0.0
    assert windows[0]["load_delivered"] is None
    elapsed = [w["elapsed_seconds"] for w in windows]
    assert elapsed == sorted(elapsed) and elapsed[-1] >= 2.0
    for w in windows[1:]:
        assert w["phase"] == "load" and w["load_delivered"] > 0
        assert w["load_conditions"]["samples"] == 0  # no NVML on cpu: unknown, not zero
    for w in windows:
        got = [(r["dtype"], r["kind"]) for r in w["results"]]
        dtypes = ["int4", "bf16", "fp16", "fp8", "nvfp4"]
        assert got == [(d, "decode") for d in dtypes] + [(d, "llm") for d in dtypes]
        for r in w["results"]:
            if r["dtype"] in ("int4", "bf16", "fp16"):
                assert r["status"] == "ok" and r["delivered"] > 0, r
        assert w["ratios"]["int4/bf16"] is not None
        assert w["conditions"]["max_gpu_temperature_celsius"] is None
    load = section["load"]
    assert load["shape"] == "256x256x256" and load["iterations"] > 0 and load["delivered"] > 0
    assert doc["gpu_busy_seconds"] >= load["seconds"]
    # one progress line per window, each the window as the document has it
    lines = progress_lines(proc.stderr)
    assert [line["soak_window"] for line in lines] == windows


@pytest.mark.worker
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_soak_stops_on_a_signal_and_still_prints_its_document(sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), *SOAK_ARGS, "--soak-seconds", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("sparkdiag-progress "):
                break  # the cold window is measured and the load is starting
        sent = time.monotonic()
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert time.monotonic() - sent < 30
    assert proc.returncode == 0
    doc = json.loads(out)
    section = doc["soak"]
    assert section["stopped"] == "interrupted", section
    assert section["reason"] == f"{sig.name} received"
    assert len(section["windows"]) >= 1 and section["elapsed_seconds"] < 60
    assert doc["status"] == "ok"


def test_soak_stop_reason() -> None:
    limits = {"gpu_slowdown_celsius": 89.0, "memory_max_celsius": 95.0}

    def sample(gpu: float | None, mem: float | None, reasons: int | None = 0x4) -> Any:
        return {"gpu_temperature": gpu, "memory_temperature": mem, "reasons": reasons}

    assert soak.soak_stop_reason(sample(83.0, 89.0), limits, 5.0) is None
    stopped, why = soak.soak_stop_reason(sample(84.0, 60.0), limits, 5.0)
    assert stopped == "threshold" and why == "GPU 84 °C within 5 °C of its slowdown threshold 89 °C"
    stopped, why = soak.soak_stop_reason(sample(70.0, 90.0), limits, 5.0)
    assert stopped == "threshold" and why.startswith("memory 90 °C")
    assert soak.soak_stop_reason(sample(30.0, None, 0x44), limits, 5.0)[0] == "hw_thermal_slowdown"
    assert soak.soak_stop_reason(sample(30.0, None, 0x8), limits, 5.0) == (
        "hw_slowdown",
        "hardware slowdown (clock event reasons 0x8)",
    )
    # unknown readings or limits never stop it (GB10 has no memory temperature)
    assert soak.soak_stop_reason(sample(None, None, None), limits, 5.0) is None
    assert soak.soak_stop_reason(sample(99.0, 99.0), dict.fromkeys(limits), 5.0) is None


class HeatingNvml:
    """An NVML stand-in whose GPU warms up by one degree per sample."""

    def __init__(self, start: float, reasons: int = 0x1, slowdown: float | None = 89.0) -> None:
        self.temperature = start
        self.reasons = reasons
        self.slowdown = slowdown

    def sample(self) -> dict[str, float | int | None]:
        self.temperature += 1.0
        return {
            "gpu_temperature": self.temperature,
            "memory_temperature": None,
            "reasons": self.reasons,
            "sm_clock_hz": 1.98e9,
            "memory_clock_hz": 3.2e9,
            "power_w": 650.0,
        }

    def thresholds(self) -> dict[str, float | None]:
        return {"gpu_slowdown_celsius": self.slowdown, "memory_max_celsius": None}


@pytest.mark.parametrize(
    ("nvml_args", "stopped"),
    [((78.0,), "threshold"), ((40.0, 0x40), "hw_thermal_slowdown"), ((40.0, 0x8), "hw_slowdown")],
)
def test_soak_stops_before_the_heat(nvml_args: tuple[Any, ...], stopped: str) -> None:
    nvml = HeatingNvml(*nvml_args)
    args = contract.parse_args([*SOAK_ARGS, "--soak-seconds", "60", "--window-seconds", "0.2"])
    doc = output.empty_document(0.0)
    started = time.monotonic()
    soak.run_soak(cpu_info(), args, nvml, doc, True, soak.StopRequest())
    assert time.monotonic() - started < 30
    section = doc["soak"]
    assert section["stopped"] == stopped, section["reason"]
    assert doc["status"] == "ok"
    assert section["thresholds"] == {"gpu_slowdown_celsius": 89.0, "memory_max_celsius": None}
    if stopped == "threshold":  # at the first sample a margin below the limit
        assert section["reason"] == "GPU 84 °C within 5 °C of its slowdown threshold 89 °C"
    conditions = doc["conditions"]
    assert conditions["samples"] > 0 and conditions["mean_memory_clock_hertz"] == 3.2e9
    for window in section["windows"]:
        assert window["conditions"]["samples"] >= 2  # one before and one after, at least
        assert window["conditions"]["max_gpu_temperature_celsius"] is not None


def test_soak_without_a_slowdown_threshold_uses_the_fallback() -> None:
    assert soak.soak_thresholds(HeatingNvml(40.0, slowdown=None)) == {
        "gpu_slowdown_celsius": soak.FALLBACK_GPU_LIMIT_CELSIUS,
        "memory_max_celsius": None,
    }
    assert soak.soak_thresholds(None) == {"gpu_slowdown_celsius": None, "memory_max_celsius": None}


def test_soak_error_still_leaves_a_document(monkeypatch: pytest.MonkeyPatch) -> None:
    released: list[str] = []
    real_release = kernels.KernelRun.release

    def release(self: Any) -> None:
        released.append(self.spec.dtype)
        real_release(self)

    def broken_chunk(self: Any, seconds: float) -> float:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(kernels.KernelRun, "release", release)
    monkeypatch.setattr(soak.SoakLoad, "chunk", broken_chunk)
    args = contract.parse_args([*SOAK_ARGS, "--soak-seconds", "60"])
    doc = output.empty_document(0.0)
    soak.run_soak(cpu_info(), args, None, doc, True, soak.StopRequest())
    section = doc["soak"]
    assert section["stopped"] == "error" and "illegal memory access" in section["reason"]
    assert doc["status"] == "error" and doc["reason"].startswith("soak failed")
    assert len(section["windows"]) == 1  # the cold window ran before the load broke
    assert sorted(set(released)) == ["bf16", "fp16", "fp8", "int4", "nvfp4"]
    assert section["load"]["iterations"] == 0


def test_soak_on_a_gpu_without_nvml_refuses(torch: Any) -> None:
    """Without temperatures the soak cannot keep its safety margin: it does not start."""
    gpu = dtypes.DeviceInfo(torch, "cuda:0", True, (9, 0), 132, 60 * 1024**2, (2, 11))
    args = contract.parse_args(["--soak-seconds", "600"])
    doc = output.empty_document(0.0)
    soak.run_soak(gpu, args, None, doc, False, soak.StopRequest())
    assert doc["status"] == "error" and "needs NVML" in doc["reason"]
    assert doc["soak"]["stopped"] == "error" and doc["soak"]["windows"] == []


def test_soak_arguments() -> None:
    a = contract.parse_args(["--soak-seconds", "30"])
    assert a.suite == "hot" and a.window_seconds == 5.0 and a.soak_margin_celsius == 5.0
    assert contract.parse_args(["--soak-seconds", "30", "--suite", "check"]).suite == "check"
    for bad in (["--soak-seconds", "0"], ["--window-seconds", "0"], ["--soak-load-edge", "0"]):
        with pytest.raises(contract.UsageError):
            contract.parse_args(bad)
