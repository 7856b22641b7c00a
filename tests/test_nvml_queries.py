"""The NVML query catalogue (one declaration per query) and the constants the probe worker
repeats from it.

The catalogue is read by the real backend (each declaration's pynvml call), the fixture replay
(keys and shapes), the recorder (arguments, delta) and the GPU source (tier, snapshot field):
these tests hold the declarations consistent with each other, with the snapshot and with what
each pynvml call returns. The probe worker must stay one self-contained script (it is sent over
stdin into containers), so probe/worker/nvml.py repeats a few NVML numbers; the last tests hold
them equal to the sources' and to nvidia-ml-py's own.
"""

from __future__ import annotations

import ctypes
import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from sparkdiag.probe.worker import nvml as worker
from sparkdiag.snapshot import GpuIdentity, GpuSample
from sparkdiag.sources.nvml.api import NOT_READY, NvmlCallError
from sparkdiag.sources.nvml.calls import NvmlCalls
from sparkdiag.sources.nvml.fixture import VALID_KEYS, FixtureBackend
from sparkdiag.sources.nvml.gpu import CLOCK_EVENT_REASONS, GpuSource
from sparkdiag.sources.nvml.queries import (
    CATALOGUE,
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    NVML_FI_DEV_MEMORY_TEMP,
    QUERIES,
    SAMPLED,
    answer_shape_error,
    sample_fields,
)
from tests.support import CountingBackend

SHAPE = re.compile(r"text|number|numbermap|pairs|processes|numbers:\d+|map:\w+(,\w+)*")
SAMPLE_FIELDS = {f.name: f for f in dataclasses.fields(GpuSample)}


def test_every_shape_is_one_the_checker_knows() -> None:
    for q in QUERIES:
        assert SHAPE.fullmatch(q.shape), f"{q.name}: {q.shape}"


def test_every_declared_field_is_a_snapshot_field_and_keys_do_not_collide() -> None:
    seen: dict[tuple[str, str], str] = {}
    for q in SAMPLED:
        assert q.field in SAMPLE_FIELDS, q.name
        labels = [q.key] if q.args is None else list(q.args.values())
        for label in labels:
            if label is None:
                continue
            assert (q.field, label) not in seen, f"{q.name} and {seen[(q.field, label)]}"
            seen[(q.field, label)] = q.name
    # a field filled by several declarations is a mapping, each declaration giving its keys
    for name in {q.field for q in SAMPLED}:
        filling = [q for q in SAMPLED if q.field == name]
        if len(filling) > 1:
            assert all(q.key is not None or q.args is not None for q in filling), name


def test_fixture_keys_are_the_declared_arguments() -> None:
    assert "clock/1" in VALID_KEYS and "name" in VALID_KEYS and "clock" not in VALID_KEYS
    assert len(VALID_KEYS) == sum(len(q.arguments()) for q in QUERIES)


def test_the_gpu_source_asks_each_query_by_its_declared_tier(
    nvml_fixture: Callable[[str], Path],
) -> None:
    """Within ten seconds only the poll tier is asked again; after ten the slow one; after sixty
    the static one."""
    now = [0.0]
    backend = CountingBackend(nvml_fixture("h200-idle"))
    source = GpuSource(backend, clock=lambda: now[0])
    assert source.start()
    source.read()

    def asked_after(seconds: float) -> set[str]:
        backend.asked.clear()
        now[0] += seconds
        source.read()
        return {query for (_, query, _) in backend.asked}

    tiers = {q.name: q.tier for q in QUERIES}
    sampled = {q.name for q in SAMPLED}
    poll = asked_after(1.0)
    assert {tiers[q] for q in poll} == {"poll"}
    recorded = {key.split("/")[0] for key in backend.doc["devices"][0]["answers"]}
    assert {q for q in sampled & recorded if tiers[q] == "poll"} <= poll
    slow = asked_after(10.0)
    assert {tiers[q] for q in slow} == {"poll", "slow"}
    assert "ecc_total" in slow and "temperature_threshold" not in slow
    assert "temperature_threshold" in asked_after(60.0)


def test_sample_fields_leave_out_what_is_unsupported_or_converted_to_none() -> None:
    answers: dict[tuple[str, int | None], Any] = {
        ("clock", 1): 1980,
        ("clock", 2): 0,  # a clock of 0 is a reading (idle), kept
        ("max_clock", 2): 0,  # a maximum of 0 is not: left out
        ("memory_temperature", None): 0,  # 0 °C: GB10 has no memory sensor
        ("pstate", None): 32,  # NVML_PSTATE_UNKNOWN
        ("utilization", None): {"gpu": 100, "memory": 3},
        ("pcie_gen", None): 5,
    }
    fields = sample_fields(lambda query, arg=None: answers.get((query, arg)), dedicated=False)
    assert fields == {
        "clock_hertz": {"sm": 1980e6, "memory": 0.0},
        "utilization_ratio": {"gpu": 1.0, "memory": 0.03},
        # mapping fields with no answer are empty, scalar ones absent (their default None)
        **{name: {} for name in _mapping_fields() - {"clock_hertz", "utilization_ratio"}},
    }

    def pcie(query: str, arg: int | None = None) -> int | None:
        return 5 if query.startswith("pcie_") else None

    assert "pcie_generation" not in sample_fields(pcie, dedicated=False)  # not asked
    assert sample_fields(pcie, dedicated=True)["pcie_generation"] == {"current": 5.0, "max": 5.0}


def _mapping_fields() -> set[str]:
    """Declared fields filled key by key (and left empty on a device without them), leaving out
    those only asked on dedicated memory."""
    return {
        q.field
        for q in SAMPLED
        if q.field and (q.args is not None or q.key is not None) and not q.dedicated_only
    }


# -- each declaration's pynvml call, over a fake nvidia-ml-py --------------------------------------


class _FakeError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def _field(value: int, code: int = 0) -> Any:
    return SimpleNamespace(nvmlReturn=code, valueType=3, value=SimpleNamespace(ullVal=value))


class _Metric(ctypes.Structure):
    _fields_ = [
        ("metricId", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_double),
    ]


class _MetricsGet(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", ctypes.c_void_p),
        ("sample2", ctypes.c_void_p),
        ("metrics", _Metric * 16),
    ]


class FakePynvml:
    """The nvidia-ml-py functions the catalogue calls, answering like one idle H200 (the types
    nvidia-ml-py returns: bytes or str, ctypes-like structs, tuples). Any other
    ``nvmlDeviceGet*`` returns 7."""

    NVMLError = _FakeError
    NVML_AGGREGATE_ECC = 1
    NVML_GPM_METRICS_GET_VERSION = 1
    c_nvmlGpmMetricsGet_t = _MetricsGet
    nvmlMemory_v2 = 0x2000028

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if not name.startswith("nvmlDeviceGet"):
            raise AttributeError(name)

        def call(*args: Any) -> int:
            self.calls.append((name, args[1:]))
            return 7

        return call

    def nvmlDeviceGetName(self, h: Any) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return "GPU-1"

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        return SimpleNamespace(busId=b"00000000:19:00.0")

    def nvmlDeviceGetCudaComputeCapability(self, h: Any) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetFieldValues(self, h: Any, fields: list[Any]) -> list[Any]:
        self.calls.append(("nvmlDeviceGetFieldValues", (fields,)))
        answers = {NVML_FI_DEV_MEMORY_TEMP: 41, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 1}
        return [_field(answers.get(f, 1000)) for f in fields]

    class c_nvmlGpuFabricInfo_v3_t(ctypes.Structure):  # nvidia-ml-py names it so
        _fields_ = [
            ("version", ctypes.c_uint),
            ("clusterUuid", ctypes.c_uint8 * 16),
            ("status", ctypes.c_uint),
            ("cliqueId", ctypes.c_uint32),
            ("state", ctypes.c_uint),
            ("healthMask", ctypes.c_uint32),
            ("healthSummary", ctypes.c_uint8),
        ]

    def nvmlDeviceGetGpuFabricInfoV(self, h: Any, info: Any) -> int:
        struct = info._obj  # a ctypes.byref() of the struct
        struct.state, struct.status, struct.healthSummary = 3, 0, 1
        return 0

    def nvmlDeviceGetViolationStatus(self, h: Any, policy: int) -> Any:
        return SimpleNamespace(violationTime=123)

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        return SimpleNamespace(gpu=99, memory=24)

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int = 1) -> Any:
        return SimpleNamespace(total=10, used=4, free=6, reserved=0)

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        return (0, 0, 0, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        return [SimpleNamespace(pid=4242, usedGpuMemory=1 << 30)]

    def nvmlDeviceGetMigMode(self, h: Any) -> tuple[int, int]:
        return (0, 0)

    def nvmlDeviceGetEncoderUtilization(self, h: Any) -> tuple[int, int]:
        return (0, 167000)

    nvmlDeviceGetDecoderUtilization = nvmlDeviceGetEncoderUtilization

    def nvmlDeviceGetSamples(self, h: Any, kind: int, since: int) -> tuple[int, list[Any]]:
        return 1, [SimpleNamespace(timeStamp=since + 1, sampleValue=SimpleNamespace(uiVal=50))]

    def nvmlDeviceGetProcessUtilization(self, h: Any, since: int) -> list[Any]:
        return [
            SimpleNamespace(
                pid=4242, timeStamp=since + 1, smUtil=9, memUtil=1, encUtil=0, decUtil=0
            )
        ]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return 0x1

    def nvmlDeviceGetSupportedClocksEventReasons(self, h: Any) -> int:
        return 0x1FF

    def nvmlGpmQueryDeviceSupport(self, h: Any) -> Any:
        return SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self) -> int:
        return 100

    def nvmlGpmSampleGet(self, h: Any, sample: int) -> None:
        return None

    def nvmlGpmMetricsGet(self, request: _MetricsGet) -> None:
        for i in range(request.numMetrics):
            request.metrics[i].value = 1.5


def _answer(calls: NvmlCalls, name: str, arg: int | None) -> Any:
    q = CATALOGUE[name]
    try:
        return q.call(calls, ctypes.c_void_p(0x1234), 0 if arg is None else arg)
    except NvmlCallError as exc:  # GPM's first call only takes a sample
        assert exc.code == NOT_READY and q.delta, name
        return q.call(calls, ctypes.c_void_p(0x1234), 0 if arg is None else arg)


def test_every_call_answers_its_declared_shape_over_nvidia_ml_py_types() -> None:
    calls = NvmlCalls(FakePynvml())
    for q in QUERIES:
        for arg in q.arguments():
            answer = _answer(calls, q.name, arg)
            assert answer_shape_error(q.name, answer) is None, (q.name, arg, answer)


def test_calls_pass_their_argument_to_nvml() -> None:
    nv = FakePynvml()
    calls = NvmlCalls(nv)
    _answer(calls, "clock", 2)
    _answer(calls, "ecc_total", 1)
    _answer(calls, "nvlink_crc_flit_errors", 5)
    assert nv.calls == [
        ("nvmlDeviceGetClockInfo", (2,)),
        ("nvmlDeviceGetTotalEccErrors", (1, 1)),
        ("nvmlDeviceGetNvLinkErrorCounter", (5, 2)),
    ]
    assert _answer(calls, "memory_temperature", None) == 41.0
    assert nv.calls[-1] == ("nvmlDeviceGetFieldValues", ([82],))


def test_the_answers_of_every_call_build_a_sample() -> None:
    calls = NvmlCalls(FakePynvml())
    fields = sample_fields(lambda query, arg=None: _answer(calls, query, arg), dedicated=True)
    identity = GpuIdentity(0, "GPU-1", "NVIDIA H200", "00000000:19:00.0", "580", "9.0", "dedicated")
    sample = GpuSample(identity=identity, up=True, **fields)
    assert sample.temperature_celsius == {"gpu": 7.0, "memory": 41.0}
    assert sample.power_watts == 0.007 and sample.performance_state == 7
    assert sample.utilization_ratio == {"gpu": 0.99, "memory": 0.24}
    assert sample.pcie_throughput_bytes_per_second == {"tx": 7 * 1024.0, "rx": 7 * 1024.0}
    assert sample.compute_mode is None  # 7 is no compute mode NVML defines: left out
    assert sample.recovery_action == "gpu_reset"
    assert sample.fabric is not None and (sample.fabric.state, sample.fabric.health) == (
        "completed",
        "healthy",
    )


def test_recorded_fixtures_replay_through_the_declarations(
    nvml_fixture: Callable[[str], Path],
) -> None:
    """The recorded H200 answers fill every declared field the H200 supports."""
    source = GpuSource(FixtureBackend(nvml_fixture("h200-load")))
    assert source.start()
    (sample,) = source.read()
    filled = {q.field for q in SAMPLED if getattr(sample, str(q.field)) not in (None, {})}
    assert {"temperature_celsius", "clock_hertz", "power_watts", "ecc_errors"} <= filled
    assert sample.temperature_celsius.keys() == {"gpu", "memory"}


# -- the constants probe/worker/nvml.py repeats --------------------------------------------------


def test_worker_memory_temperature_field_is_nvmls() -> None:
    assert worker.NVML_FI_DEV_MEMORY_TEMP == NVML_FI_DEV_MEMORY_TEMP
    assert pynvml.NVML_FI_DEV_MEMORY_TEMP == NVML_FI_DEV_MEMORY_TEMP


@pytest.mark.parametrize(
    ("worker_bit", "reason", "nvml_name"),
    [
        ("HW_SLOWDOWN", "hw_slowdown", "nvmlClocksEventReasonHwSlowdown"),
        ("HW_THERMAL_SLOWDOWN", "hw_thermal_slowdown", "nvmlClocksEventReasonHwThermalSlowdown"),
    ],
)
def test_worker_clock_reason_bits_are_the_sources_and_nvmls(
    worker_bit: str, reason: str, nvml_name: str
) -> None:
    assert getattr(worker, worker_bit) == CLOCK_EVENT_REASONS[reason]
    assert getattr(pynvml, nvml_name) == CLOCK_EVENT_REASONS[reason]


def test_every_clock_event_reason_bit_is_nvmls() -> None:
    names: Mapping[str, str] = {
        "gpu_idle": "GpuIdle",
        "applications_clocks_setting": "ApplicationsClocksSetting",
        "sw_power_cap": "SwPowerCap",
        "hw_slowdown": "HwSlowdown",
        "sync_boost": "SyncBoost",
        "sw_thermal_slowdown": "SwThermalSlowdown",
        "hw_thermal_slowdown": "HwThermalSlowdown",
        "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
        "display_clock_setting": "DisplayClockSetting",
    }
    assert names.keys() == CLOCK_EVENT_REASONS.keys()
    for reason, suffix in names.items():
        assert getattr(pynvml, f"nvmlClocksEventReason{suffix}") == CLOCK_EVENT_REASONS[reason]


@pytest.mark.parametrize("pid", [-1, 0, True, 1.5, "42"])
def test_a_process_pid_is_a_positive_integer(pid: object) -> None:
    """A fixture's compute process with pid -1 was replayed, and check advised "kill -1" (every
    process the user may signal); NVML's pid is unsigned, so such a fixture is refused."""
    assert answer_shape_error("compute_processes", [{"pid": pid, "used_memory": 1}]) is not None
    assert answer_shape_error("compute_processes", [{"pid": 42, "used_memory": 1}]) is None
