"""The worker's NVML room: the conditions a cycle ran under, and busy detection."""

from __future__ import annotations

import os

import pytest

from sparkdiag.probe.worker import nvml


def test_summarize_conditions() -> None:
    samples = [
        {
            "gpu_temperature": 40.0,
            "memory_temperature": None,
            "reasons": 0x1,
            "sm_clock_hz": 1.0e9,
            "power_w": 100.0,
        },
        {
            "gpu_temperature": 55.0,
            "memory_temperature": None,
            "reasons": 0x4,
            "sm_clock_hz": 2.0e9,
            "power_w": 300.0,
        },
    ]
    c = nvml.summarize_conditions(samples)
    assert c["max_gpu_temperature_celsius"] == 55.0
    assert c["max_memory_temperature_celsius"] is None  # unsupported, not 0
    assert c["clock_event_reasons_seen"] == 0x5
    assert c["mean_sm_clock_hertz"] == pytest.approx(1.5e9)
    assert c["mean_power_watts"] == pytest.approx(200.0)
    assert c["samples"] == 2
    assert nvml.summarize_conditions([])["clock_event_reasons_seen"] is None


class FakeNvml:
    """Stands in for the NVML wrapper (not for a subprocess)."""

    def __init__(self, pids: set[int], utilization: float | None) -> None:
        self.pids = pids
        self.util = utilization

    def compute_pids(self) -> set[int]:
        return set(self.pids)

    def utilization(self) -> float | None:
        return self.util


def test_busy_detection() -> None:
    me = os.getpid()
    nv = FakeNvml({77}, 0.0)
    busy = nvml.BusyState(nv, {me}, 0.1, self_pids={me})
    assert "pids [77]" in busy.check_before_context()
    busy = nvml.BusyState(nv, {me, 77}, 0.1, self_pids={me})  # --exclude-pid 77
    assert busy.check_before_context() is None
    nv.util = 0.5
    assert "50%" in busy.check_before_context()
    nv.util = 0.05
    assert busy.check_before_context() is None
    # our context appears under a PID we do not know (PID namespace): it is ours
    before = nv.compute_pids()
    nv.pids |= {9001}
    busy.adopt_own_context(before)
    assert busy.check_during() is None
    nv.pids |= {1234}
    assert "1234" in busy.check_during()
    assert busy.other_pids == [1234]
    assert nvml.BusyState(None, set(), 0.1).check_before_context() is None


def test_a_display_server_is_not_another_compute_process() -> None:
    """A run that saw another compute process does not teach a baseline (found in a review;
    baseline/evaluate.py). A display server holds a graphics context, which NVML lists apart
    (``nvmlDeviceGetGraphicsRunningProcesses``): the worker reads the compute and MPS lists only,
    so a GPU driving a desktop is idle to it and still learns its baselines."""

    class Proc:
        def __init__(self, pid: int) -> None:
            self.pid = pid

    class Rates:
        gpu = 2

    class FakePynvml:
        @staticmethod
        def nvmlDeviceGetComputeRunningProcesses(_handle: object) -> list[Proc]:
            return []

        @staticmethod
        def nvmlDeviceGetMPSComputeRunningProcesses(_handle: object) -> list[Proc]:
            return []

        @staticmethod
        def nvmlDeviceGetGraphicsRunningProcesses(_handle: object) -> list[Proc]:
            return [Proc(1500)]  # Xorg

        @staticmethod
        def nvmlDeviceGetUtilizationRates(_handle: object) -> Rates:
            return Rates()

    me = os.getpid()
    busy = nvml.BusyState(nvml.Nvml(FakePynvml(), "handle"), {me}, 0.1, self_pids={me})
    assert busy.check_before_context() is None
    assert busy.other_pids == []
