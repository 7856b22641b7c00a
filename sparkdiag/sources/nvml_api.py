"""The narrow NVML interface the GPU source is written against.

Two backends implement it: :class:`sparkdiag.sources.nvml.PynvmlBackend` (the real library) and
:class:`sparkdiag.sources.fixture.FixtureBackend` (recorded answers replayed from JSON). The
interface is a fixed catalogue of *queries*, each mapping to one NVML call and returning a plain
JSON value, so that a recorder can store every answer (errors included) and a fixture can replay
it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

# NVML return codes (nvml.h), kept here so that no module but sources/nvml.py imports pynvml.
ERROR_NAMES: Mapping[int, str] = {
    1: "UNINITIALIZED",
    2: "INVALID_ARGUMENT",
    3: "NOT_SUPPORTED",
    4: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED",
    6: "NOT_FOUND",
    7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER",
    9: "DRIVER_NOT_LOADED",
    10: "TIMEOUT",
    11: "IRQ_ISSUE",
    12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND",
    14: "CORRUPTED_INFOROM",
    15: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH",
    19: "IN_USE",
    20: "MEMORY",
    21: "NO_DATA",
    22: "VGPU_ECC_NOT_SUPPORTED",
    23: "INSUFFICIENT_RESOURCES",
    24: "FREQ_NOT_SUPPORTED",
    25: "ARGUMENT_VERSION_MISMATCH",
    26: "DEPRECATED",
    27: "NOT_READY",
    28: "GPU_NOT_FOUND",
    29: "INVALID_STATE",
    999: "UNKNOWN",
}
ERROR_CODES: Mapping[str, int] = {name: code for code, name in ERROR_NAMES.items()}


def error_code(name: str) -> int | None:
    """The code of an error name as :class:`NvmlCallError` writes it (``NOT_SUPPORTED``, or
    ``ERROR_42`` for a code without a name); None when the name is neither."""
    if name in ERROR_CODES:
        return ERROR_CODES[name]
    if name.startswith("ERROR_") and name[6:].isdigit():
        return int(name[6:])
    return None


NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
# Errors after which the device no longer answers: it is reported down (sparkdiag_gpu_up 0).
LOST_CODES = frozenset({GPU_IS_LOST, 16, 28, 999})
# Errors that mean "this value is not available here": the field is None, the sample left out.
UNAVAILABLE_CODES = frozenset({NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, FUNCTION_NOT_FOUND, 21, 26})


class NvmlCallError(Exception):
    """One NVML call failed with an NVML return code."""

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = code
        self.name = ERROR_NAMES.get(code, f"ERROR_{code}")
        super().__init__(message or f"NVML_ERROR_{self.name} ({code})")


class NvmlUnavailable(Exception):
    """NVML cannot be used at all: library missing, driver not loaded, no permission."""


@dataclass(frozen=True)
class NvmlEvent:
    """One event read from the NVML event set (``nvmlEventSetWait``)."""

    gpu: int  # NVML index
    event_type: int  # nvmlEventType* bitmask
    data: int  # the XID number for XID-critical events
    timestamp: float  # unix seconds when sparkdiag read it


EVENT_XID_CRITICAL = 0x8
EVENT_CLOCK = 0x10

# The query catalogue: name -> the arguments it is asked with (None: no argument).
# Each entry documents the NVML call, the unit of the raw answer and the matching nvidia-smi query.
QUERIES: Mapping[str, tuple[int, ...] | None] = {
    # nvmlDeviceGetName -> str (nvidia-smi --query-gpu=name)
    "name": None,
    # nvmlDeviceGetUUID -> str (uuid)
    "uuid": None,
    # nvmlDeviceGetPciInfo().busId -> str (pci.bus_id)
    "pci_bus_id": None,
    # nvmlDeviceGetCudaComputeCapability -> [major, minor] (compute_cap)
    "cuda_capability": None,
    # nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU) -> °C (temperature.gpu)
    "temperature": (0,),
    # nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_MEMORY_TEMP]) -> °C (temperature.memory)
    "memory_temperature": None,
    # nvmlDeviceGetTemperatureThreshold(h, 0 shutdown | 1 slowdown | 2 mem max | 3 gpu max) -> °C
    "temperature_threshold": (0, 1, 2, 3),
    # nvmlDeviceGetClockInfo(h, 0 graphics | 1 sm | 2 mem | 3 video) -> MHz (clocks.sm ...)
    "clock": (0, 1, 2, 3),
    # nvmlDeviceGetMaxClockInfo -> MHz (clocks.max.sm ...)
    "max_clock": (0, 1, 2, 3),
    # nvmlDeviceGetApplicationsClock(h, 0 graphics | 1 sm) -> MHz: the clock the GPU runs
    # applications at unless a limit holds it lower (clocks.applications.graphics)
    "applications_clock": (0, 1),
    # nvmlDeviceGetDefaultApplicationsClock(h, 0 graphics | 1 sm) -> MHz: the same, as shipped
    # (clocks.default_applications.graphics); what a healthy GPU sustains under load
    "default_applications_clock": (0, 1),
    # nvmlDeviceGetCurrentClocksEventReasons (fallback ...ThrottleReasons) -> bitmask
    # (clocks_event_reasons.active)
    "clock_event_reasons": None,
    # nvmlDeviceGetSupportedClocksEventReasons (fallback ...ThrottleReasons) -> bitmask
    "supported_clock_event_reasons": None,
    # nvmlDeviceGetViolationStatus(h, policy).violationTime -> ns, policies 0..5
    "violation_ns": (0, 1, 2, 3, 4, 5),
    # nvmlDeviceGetPowerUsage -> mW (power.draw)
    "power_mw": None,
    # nvmlDeviceGetEnforcedPowerLimit -> mW (enforced.power.limit)
    "power_limit_mw": None,
    # nvmlDeviceGetTotalEnergyConsumption -> mJ since driver load
    "energy_mj": None,
    # nvmlDeviceGetUtilizationRates -> {"gpu": %, "memory": %} (utilization.gpu, .memory)
    "utilization": None,
    # nvmlDeviceGetMemoryInfo (v2 where available) -> {"total", "used", "free", "reserved"} bytes
    "memory_info": None,
    # nvmlDeviceGetCurrPcieLinkGeneration / Max... -> generation (pcie.link.gen.current / .max)
    "pcie_gen": None,
    "pcie_max_gen": None,
    # nvmlDeviceGetCurrPcieLinkWidth / Max... -> lanes (pcie.link.width.current / .max)
    "pcie_width": None,
    "pcie_max_width": None,
    # nvmlDeviceGetPcieReplayCounter -> count
    "pcie_replay": None,
    # nvmlDeviceGetTotalEccErrors(h, 0 corrected | 1 uncorrected, NVML_AGGREGATE_ECC) -> count
    # (ecc.errors.corrected.aggregate.total)
    "ecc_total": (0, 1),
    # nvmlDeviceGetRemappedRows -> [corrected, uncorrected, pending, failure]
    "remapped_rows": None,
    # nvmlDeviceGetPerformanceState -> 0..15 (pstate)
    "pstate": None,
    # nvmlDeviceGetComputeRunningProcesses -> [{"pid", "used_memory"}] (--query-compute-apps)
    "compute_processes": None,
    # nvmlDeviceGetPersistenceMode -> 0/1 (persistence_mode)
    "persistence_mode": None,
    # nvmlDeviceGetComputeMode -> 0 default | 2 prohibited | 3 exclusive process (compute_mode)
    "compute_mode": None,
    # nvmlDeviceGetMigMode -> [current, pending] (mig.mode.current)
    "mig_mode": None,
    # nvmlDeviceGetSupportedEventTypes -> bitmask
    "supported_event_types": None,
}

# -- Activity, interconnect and per-process queries (issue 14) ---------------------------------
# Hopper and Blackwell GPUs have 18 NVLinks each; a link NVML does not report is NOT_SUPPORTED.
NVLINK_LINKS: tuple[int, ...] = tuple(range(18))
# NVML error code the real backend raises for a delta query's first call (nothing to compare with
# yet): neither unsupported nor lost, so the GPU source asks again at the next poll.
NOT_READY = 27
ACTIVITY_QUERIES: Mapping[str, tuple[int, ...] | None] = {
    # nvmlGpmMetricsGet between this call's nvmlGpmSampleGet and the previous call's, metrics
    # SM_UTIL, SM_OCCUPANCY, ANY_TENSOR_UTIL, DRAM_BW_UTIL -> {"sm", "sm_occupancy", "tensor",
    # "dram"} in % (dcgmi dmon -e 1002,1003,1004,1005); NOT_READY at the first call, NOT_SUPPORTED
    # where nvmlGpmQueryDeviceSupport says the GPU has no GPM (before Hopper).
    "gpm": None,
    # nvmlDeviceGetSamples(h, NVML_GPU_UTILIZATION_SAMPLES, last seen) -> [[timestamp µs, %], ...]
    # the driver's samples since the previous call (nvidia-smi -q -d UTILIZATION: "Samples")
    "utilization_samples": None,
    # nvmlDeviceGetProcessUtilization(h, last seen) -> [{"pid", "sm", "memory", "encoder",
    # "decoder"}] in %, averaged per pid over the samples since the previous call; [] when there
    # is none (nvidia-smi pmon -s u)
    "process_utilization": None,
    # nvmlDeviceGetPcieThroughput(h, 0 tx | 1 rx) -> KB/s over a 20 ms window; each call blocks
    # about 20 ms (nvidia-smi dmon -s t)
    "pcie_throughput": (0, 1),
    # nvmlDeviceGetEncoderUtilization / ...DecoderUtilization -> [%, sampling period µs]
    # (utilization.encoder, utilization.decoder)
    "encoder_utilization": None,
    "decoder_utilization": None,
    # nvmlDeviceGetNvLinkState(h, link) -> 1 active, 0 inactive (nvidia-smi nvlink -s)
    "nvlink_state": NVLINK_LINKS,
    # nvmlDeviceGetNvLinkErrorCounter(h, link, NVML_NVLINK_ERROR_DL_REPLAY | _RECOVERY |
    # _CRC_FLIT | _CRC_DATA) -> count since the counters were last reset (nvidia-smi nvlink -e)
    "nvlink_replay_errors": NVLINK_LINKS,
    "nvlink_recovery_errors": NVLINK_LINKS,
    "nvlink_crc_flit_errors": NVLINK_LINKS,
    "nvlink_crc_data_errors": NVLINK_LINKS,
    # nvmlDeviceGetFieldValues(h, [(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX | _RX, link)]) -> KiB
    # of payload since the driver loaded (nvidia-smi nvlink -gt d)
    "nvlink_tx_kib": NVLINK_LINKS,
    "nvlink_rx_kib": NVLINK_LINKS,
}
# Queries whose answer covers the time since the previous call to the same query and device:
# the recorder asks them once to prime them before it records the second answer.
DELTA_QUERIES = frozenset({"gpm", "utilization_samples", "process_utilization"})
QUERIES = {**QUERIES, **ACTIVITY_QUERIES}


# The shape of each query's answer, as the backends return it and fixtures store it. A fixture
# whose answer has another shape is refused when it is loaded (FixtureError), never half-used.
#   "text": a string; "number": a finite int or float (never a bool); "numbers:N": a list of N
#   numbers;
#   "map:K1,K2": an object with at least those numeric keys; "numbermap": an object of numbers
#   (any keys); "pairs": a list of [number, number]; "processes": a list of objects, each with
#   an integer "pid".
ANSWER_SHAPES: Mapping[str, str] = {
    "name": "text",
    "uuid": "text",
    "pci_bus_id": "text",
    "cuda_capability": "numbers:2",
    "temperature": "number",
    "memory_temperature": "number",
    "temperature_threshold": "number",
    "clock": "number",
    "max_clock": "number",
    "clock_event_reasons": "number",
    "supported_clock_event_reasons": "number",
    "violation_ns": "number",
    "power_mw": "number",
    "power_limit_mw": "number",
    "energy_mj": "number",
    "utilization": "map:gpu,memory",
    "memory_info": "map:total,used,free",
    "pcie_gen": "number",
    "pcie_max_gen": "number",
    "pcie_width": "number",
    "pcie_max_width": "number",
    "pcie_replay": "number",
    "ecc_total": "number",
    "remapped_rows": "numbers:4",
    "pstate": "number",
    "compute_processes": "processes",
    "persistence_mode": "number",
    "compute_mode": "number",
    "mig_mode": "numbers:2",
    "supported_event_types": "number",
    "applications_clock": "number",
    "default_applications_clock": "number",
    # the activity block
    "gpm": "numbermap",
    "utilization_samples": "pairs",
    "process_utilization": "processes",
    "pcie_throughput": "number",
    "encoder_utilization": "numbers:2",
    "decoder_utilization": "numbers:2",
    "nvlink_state": "number",
    "nvlink_replay_errors": "number",
    "nvlink_recovery_errors": "number",
    "nvlink_crc_flit_errors": "number",
    "nvlink_crc_data_errors": "number",
    "nvlink_tx_kib": "number",
    "nvlink_rx_kib": "number",
}


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and abs(value) < 2**63


def answer_shape_error(query: str, value: Any) -> str | None:
    """Why ``value`` is not a valid answer to ``query`` (None when it is)."""
    shape = ANSWER_SHAPES.get(query)
    if shape is None:
        return f"{query!r} has no declared answer shape"
    ok: bool
    if shape == "text":
        ok = isinstance(value, str)
    elif shape == "number":
        ok = _is_number(value)
    elif shape.startswith("numbers:"):
        count = int(shape.split(":", 1)[1])
        ok = isinstance(value, list) and len(value) == count and all(map(_is_number, value))
    elif shape == "numbermap":
        ok = isinstance(value, dict) and all(map(_is_number, value.values()))
    elif shape == "pairs":
        ok = isinstance(value, list) and all(
            isinstance(v, list) and len(v) == 2 and all(map(_is_number, v)) for v in value
        )
    elif shape == "processes":
        ok = isinstance(value, list) and all(
            isinstance(v, dict) and isinstance(v.get("pid"), int) for v in value
        )
    else:  # map:K1,K2
        keys = shape.split(":", 1)[1].split(",")
        ok = isinstance(value, dict) and all(_is_number(value.get(k)) for k in keys)
    return None if ok else f"expected {shape}, got {str(value)[:60]!r}"


def answer_key(query: str, arg: int | None) -> str:
    """The key a query's answer is stored under in a fixture: ``"clock/1"`` or ``"name"``."""
    return query if arg is None else f"{query}/{arg}"


class NvmlBackend(Protocol):
    """What the GPU source needs from NVML. Every method may raise :class:`NvmlCallError`."""

    def init(self) -> None:
        """Initialise; raise :class:`NvmlUnavailable` when NVML cannot be used at all."""

    def shutdown(self) -> None: ...

    def driver_version(self) -> str: ...

    def device_count(self) -> int: ...

    def query(self, index: int, query: str, arg: int | None = None) -> Any:
        """Answer one catalogue query for the device at ``index``."""

    def poll_events(self) -> list[NvmlEvent]:
        """Return the events that arrived since the last call, without blocking."""

    def advance(self) -> None:
        """Called once at the start of each poll (fixtures step their script; hardware: no-op)."""

    def host_memory_total(self) -> int | None:
        """Host MemTotal in bytes, to tell unified memory from dedicated."""
