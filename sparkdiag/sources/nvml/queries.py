"""The NVML query catalogue: one declaration per query, read by every backend and the GPU source.

Each :class:`Query` says, in one place:

* ``name``: the query, and the key its answer is stored under in a fixture (``clock/1`` with an
  argument, see :func:`sparkdiag.sources.nvml.api.answer_key`);
* ``call``: the real backend's pynvml call, ``(calls, handle, arg) -> plain JSON value``, where
  ``calls.nv`` is the pynvml module (imported only in ``sources/nvml/driver.py``) and ``calls`` the
  :class:`~sparkdiag.sources.nvml.calls.NvmlCalls` that keeps what versioned and delta calls need;
* ``shape``: the answer's shape (:func:`answer_shape_error`); a fixture answer of another shape
  is refused when the fixture is loaded, never half-used;
* ``args``: the arguments it is asked with, each with the key its answer gets in the snapshot's
  mapping (``{1: "sm"}``: ``clock/1`` is ``clock_hertz["sm"]``); None: no argument;
* ``tier``: how often the GPU source asks it (``poll`` every read, ``slow`` once its answer is
  ~10 s old, ``static`` ~60 s);
* ``delta``: the answer covers the time since the previous call (the recorder primes it);
* ``field``, ``key``, ``convert``, ``dedicated_only``: where the answer lands in the
  :class:`~sparkdiag.snapshot.GpuSample` (:func:`sample_fields`); a query without ``field`` is
  read by hand in ``sources/nvml/gpu.py`` (identity, processes, GPM, NVLink) or by ``watch``.

A new NVML metric of the usual kind (one number, or one per argument) is one declaration here,
a field in ``snapshot.py`` and a row in its collector: the real backend, the fixture replay, the
recorder and the GPU source all read this table. Units of raw answers, and the ``nvidia-smi``
query that gives the same reading, are in the comments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sparkdiag.snapshot import FabricState
from sparkdiag.sources.nvml.activity import KIB, percent_ratio
from sparkdiag.sources.nvml.api import ERROR_NAMES, EVENT_XID_CRITICAL, NVLINK_LINKS
from sparkdiag.sources.nvml.calls import (
    NVLINK_THROUGHPUT_FIELDS,
    NvmlCalls,
    text,
)

Tier = Literal["poll", "slow", "static"]
Call = Callable[[NvmlCalls, Any, int], Any]
Ask = Callable[..., Any]

NVML_FI_DEV_MEMORY_TEMP = 82  # nvml.h; probe/worker/nvml.py repeats it (tests/test_nvml_queries.py)
MHZ = 1e6
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
REMAPPED_ROWS = ("corrected", "uncorrected", "pending", "failure")


@dataclass(frozen=True)
class Query:
    name: str
    call: Call
    shape: str
    args: Mapping[int, str] | None = None
    tier: Tier = "poll"
    delta: bool = False
    field: str | None = None
    key: str | None = None
    convert: Callable[[Any], Any] = float
    dedicated_only: bool = False

    def arguments(self) -> tuple[int | None, ...]:
        """The arguments it is asked with: ``(None,)`` without one."""
        return (None,) if self.args is None else tuple(self.args)


# -- converters from raw answers to snapshot values (None: left out) -----------------------------
def _positive(value: Any) -> float | None:
    return float(value) if float(value) > 0 else None


def _mhz(value: Any) -> float:
    return float(value) * MHZ


def _mhz_positive(value: Any) -> float | None:
    return _mhz(value) if float(value) > 0 else None


def _milli(value: Any) -> float:
    return float(value) / 1000.0


def _pstate(value: Any) -> int | None:
    return None if int(value) > 15 else int(value)


def _utilization(answer: Any) -> dict[str, float]:
    return {k: float(answer[k]) / 100.0 for k in ("gpu", "memory")}


def _memory(answer: Any) -> dict[str, float]:
    return {k: float(answer[k]) for k in ("total", "used", "free")}


def _remapped(rows: Any) -> dict[str, float]:
    return dict(zip(REMAPPED_ROWS, map(float, rows), strict=False))


NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230  # nvml.h
# nvmlDeviceGpuRecoveryAction_t
RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}
# nvmlGpuFabricState_t (0: not supported) and NVML_GPU_FABRIC_HEALTH_SUMMARY_* (0: not supported)
FABRIC_STATES = {1: "not_started", 2: "in_progress", 3: "completed"}
FABRIC_HEALTH = {1: "healthy", 2: "unhealthy", 3: "limited_capacity"}


def _fabric(answer: Any) -> FabricState | None:
    state = FABRIC_STATES.get(int(answer["state"]))
    if state is None:
        return None
    code = int(answer["status"])
    status = "SUCCESS" if code == 0 else ERROR_NAMES.get(code, f"ERROR_{code}")
    return FabricState(state, status, FABRIC_HEALTH.get(int(answer.get("health_summary", 0))))


THRESHOLDS = {0: "shutdown", 1: "slowdown", 2: "memory_max", 3: "gpu_max"}
CLOCKS = {0: "graphics", 1: "sm", 2: "memory", 3: "video"}
APPLICATION_CLOCKS = {0: "graphics", 1: "sm"}  # the domains the applications clock is read for
POLICIES = {
    0: "power",
    1: "thermal",
    2: "sync_boost",
    3: "board_limit",
    4: "low_utilization",
    5: "reliability",
}
LINKS = {link: str(link) for link in NVLINK_LINKS}
# query -> nvmlNvLinkErrorCounter_t (NVML_NVLINK_ERROR_DL_REPLAY, _RECOVERY, _CRC_FLIT, _CRC_DATA)
_NVLINK_COUNTERS = {
    "nvlink_replay_errors": 0,
    "nvlink_recovery_errors": 1,
    "nvlink_crc_flit_errors": 2,
    "nvlink_crc_data_errors": 3,
}
# query -> field id (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _RX)
_NVLINK_DATA = dict(zip(("nvlink_tx_kib", "nvlink_rx_kib"), NVLINK_THROUGHPUT_FIELDS, strict=True))


def _nvlink_counter(counter: int) -> Call:
    return lambda c, h, link: int(c.nv.nvmlDeviceGetNvLinkErrorCounter(h, link, counter))


def _nvlink_throughput(field: int) -> Call:
    return lambda c, h, link: c.nvlink_throughput(h, field, link)


def _pcie_link(name: str, getter: str, field: str, key: str) -> Query:
    """The PCIe link's generation or width (``field``), ``current`` (polled) or ``max`` (static):
    ``getter`` is the pynvml call; 0 is left out, and so is the whole on unified memory."""
    return Query(
        name,
        lambda c, h, _: int(getattr(c.nv, getter)(h)),
        "number",
        tier="static" if key == "max" else "poll",
        field=field,
        key=key,
        convert=_positive,
        dedicated_only=True,
    )


def _video_utilization(engine: str, getter: str) -> Query:
    """The encoder's or decoder's [%, sampling period µs] (``getter``, the pynvml call), as
    ``video_utilization_ratio[engine]``."""
    return Query(
        f"{engine}_utilization",
        lambda c, h, _: [int(v) for v in getattr(c.nv, getter)(h)],
        "numbers:2",
        field="video_utilization_ratio",
        key=engine,
        convert=lambda answer: percent_ratio(answer[0]),
    )


QUERIES: tuple[Query, ...] = (
    # -- identity, read once at start (sources/nvml/gpu.py) --
    # nvidia-smi --query-gpu=name, uuid, pci.bus_id, compute_cap
    Query("name", lambda c, h, _: text(c.nv.nvmlDeviceGetName(h)), "text"),
    Query("uuid", lambda c, h, _: text(c.nv.nvmlDeviceGetUUID(h)), "text"),
    Query("pci_bus_id", lambda c, h, _: text(c.nv.nvmlDeviceGetPciInfo(h).busId), "text"),
    Query(
        "cuda_capability",
        lambda c, h, _: list(c.nv.nvmlDeviceGetCudaComputeCapability(h)),
        "numbers:2",
    ),
    # °C (temperature.gpu); NVML_TEMPERATURE_GPU
    Query(
        "temperature",
        lambda c, h, arg: int(c.nv.nvmlDeviceGetTemperature(h, arg)),
        "number",
        args={0: "gpu"},
        field="temperature_celsius",
    ),
    # °C (temperature.memory); 0 is "not supported" (DCGM reads 0 on GB10's LPDDR5X)
    Query(
        "memory_temperature",
        lambda c, h, _: c.field_value(h, NVML_FI_DEV_MEMORY_TEMP),
        "number",
        field="temperature_celsius",
        key="memory",
        convert=_positive,
    ),
    # °C (temperature.gpu.tlimit ...)
    Query(
        "temperature_threshold",
        lambda c, h, arg: int(c.nv.nvmlDeviceGetTemperatureThreshold(h, arg)),
        "number",
        args=THRESHOLDS,
        tier="static",
        field="threshold_celsius",
        convert=_positive,
    ),
    # MHz (clocks.gr, clocks.sm, clocks.mem, clocks.video)
    Query(
        "clock",
        lambda c, h, arg: int(c.nv.nvmlDeviceGetClockInfo(h, arg)),
        "number",
        args=CLOCKS,
        field="clock_hertz",
        convert=_mhz,
    ),
    # MHz (clocks.max.sm ...)
    Query(
        "max_clock",
        lambda c, h, arg: int(c.nv.nvmlDeviceGetMaxClockInfo(h, arg)),
        "number",
        args=CLOCKS,
        tier="static",
        field="clock_max_hertz",
        convert=_mhz_positive,
    ),
    # MHz: the clock the GPU runs applications at unless a limit holds it lower
    # (clocks.applications.graphics)
    Query(
        "applications_clock",
        lambda c, h, arg: int(c.nv.nvmlDeviceGetApplicationsClock(h, arg)),
        "number",
        args=APPLICATION_CLOCKS,
        tier="static",
        field="clock_applications_hertz",
        convert=_mhz_positive,
    ),
    # MHz: the same, as shipped (clocks.default_applications.graphics); what a healthy GPU
    # sustains under load
    Query(
        "default_applications_clock",
        lambda c, h, arg: int(c.nv.nvmlDeviceGetDefaultApplicationsClock(h, arg)),
        "number",
        args=APPLICATION_CLOCKS,
        tier="static",
        field="clock_default_applications_hertz",
        convert=_mhz_positive,
    ),
    # bitmask (clocks_event_reasons.active)
    Query(
        "clock_event_reasons",
        lambda c, h, _: c.clock_event_reasons(h),
        "number",
        field="clock_event_reasons",
        convert=int,
    ),
    # bitmask (clocks_event_reasons.supported)
    Query(
        "supported_clock_event_reasons",
        lambda c, h, _: c.supported_clock_event_reasons(h),
        "number",
        tier="static",
        field="supported_clock_event_reasons",
        convert=int,
    ),
    # ns since driver load, per policy (nvidia-smi -q -d PERFORMANCE)
    Query(
        "violation_ns",
        lambda c, h, arg: int(c.nv.nvmlDeviceGetViolationStatus(h, arg).violationTime),
        "number",
        args=POLICIES,
        tier="slow",
        field="violation_seconds",
        convert=lambda ns: float(ns) * 1e-9,
    ),
    # mW (power.draw)
    Query(
        "power_mw",
        lambda c, h, _: int(c.nv.nvmlDeviceGetPowerUsage(h)),
        "number",
        field="power_watts",
        convert=_milli,
    ),
    # mW (enforced.power.limit)
    Query(
        "power_limit_mw",
        lambda c, h, _: int(c.nv.nvmlDeviceGetEnforcedPowerLimit(h)),
        "number",
        field="power_limit_watts",
        convert=_milli,
    ),
    # mJ since driver load; slow: it took 3.8 ms per call on the H200
    Query(
        "energy_mj",
        lambda c, h, _: int(c.nv.nvmlDeviceGetTotalEnergyConsumption(h)),
        "number",
        tier="slow",
        field="energy_joules",
        convert=_milli,
    ),
    # {"gpu": %, "memory": %} (utilization.gpu, .memory)
    Query(
        "utilization",
        lambda c, h, _: _rates(c.nv.nvmlDeviceGetUtilizationRates(h)),
        "map:gpu,memory",
        field="utilization_ratio",
        convert=_utilization,
    ),
    # {"total", "used", "free", "reserved"} bytes, v2 where available (memory.total ...);
    # NOT_SUPPORTED on unified memory (GB10)
    Query(
        "memory_info",
        lambda c, h, _: c.memory_info(h),
        "map:total,used,free",
        field="memory_bytes",
        convert=_memory,
        dedicated_only=True,
    ),
    # generation, lanes (pcie.link.gen.current / .max, pcie.link.width.current / .max); left
    # out on unified memory, where the integrated GPU's link is a meaningless Gen1 x1
    _pcie_link("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", "pcie_generation", "current"),
    _pcie_link("pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration", "pcie_generation", "max"),
    _pcie_link("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", "pcie_width", "current"),
    _pcie_link("pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth", "pcie_width", "max"),
    # count (nvidia-smi -q -d PCIE: Replays)
    Query(
        "pcie_replay",
        lambda c, h, _: int(c.nv.nvmlDeviceGetPcieReplayCounter(h)),
        "number",
        tier="slow",
        field="pcie_replay_errors",
    ),
    # count, NVML_AGGREGATE_ECC (ecc.errors.corrected.aggregate.total)
    Query(
        "ecc_total",
        lambda c, h, arg: int(c.nv.nvmlDeviceGetTotalEccErrors(h, arg, c.nv.NVML_AGGREGATE_ECC)),
        "number",
        args={0: "corrected", 1: "uncorrected"},
        tier="slow",
        field="ecc_errors",
    ),
    # [corrected, uncorrected, pending, failure] (nvidia-smi -q -d ROW_REMAPPER)
    Query(
        "remapped_rows",
        lambda c, h, _: list(c.nv.nvmlDeviceGetRemappedRows(h)),
        "numbers:4",
        tier="slow",
        field="remapped_rows",
        convert=_remapped,
    ),
    # 0..15 (pstate)
    Query(
        "pstate",
        lambda c, h, _: int(c.nv.nvmlDeviceGetPerformanceState(h)),
        "number",
        field="performance_state",
        convert=_pstate,
    ),
    # [{"pid", "used_memory"}] (--query-compute-apps)
    Query("compute_processes", lambda c, h, _: c.compute_processes(h), "processes"),
    # 0/1 (persistence_mode)
    Query(
        "persistence_mode",
        lambda c, h, _: int(c.nv.nvmlDeviceGetPersistenceMode(h)),
        "number",
        tier="static",
        field="persistence_mode",
        convert=bool,
    ),
    # 0 default | 2 prohibited | 3 exclusive process (compute_mode)
    Query(
        "compute_mode",
        lambda c, h, _: int(c.nv.nvmlDeviceGetComputeMode(h)),
        "number",
        tier="static",
        field="compute_mode",
        convert=lambda mode: COMPUTE_MODES.get(int(mode)),
    ),
    # [current, pending] (mig.mode.current)
    Query(
        "mig_mode",
        lambda c, h, _: list(c.nv.nvmlDeviceGetMigMode(h)),
        "numbers:2",
        tier="static",
        field="mig_mode",
        convert=lambda mode: bool(mode[0]),
    ),
    # nvmlDeviceGpuRecoveryAction_t (nvidia-smi --query-gpu=gpu_recovery_action): what the
    # driver says the GPU needs after an error; the field is NOT_SUPPORTED on older drivers
    Query(
        "recovery_action",
        lambda c, h, _: int(c.field_value(h, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)),
        "number",
        field="recovery_action",
        convert=lambda code: RECOVERY_ACTIONS.get(int(code), "unknown"),
    ),
    # {"state", "status", "health_mask", "health_summary"} (nvidia-smi -q: "Fabric"); state 0
    # (NVML_GPU_FABRIC_STATE_NOT_SUPPORTED) on a GPU that joins no NVLink fabric: left out
    Query(
        "fabric_info",
        lambda c, h, _: c.fabric_info(h),
        "map:state,status",
        tier="slow",
        field="fabric",
        convert=_fabric,
    ),
    # bitmask; what the daemon's XID counting needs is the XID-critical bit
    Query(
        "supported_event_types",
        lambda c, h, _: int(c.nv.nvmlDeviceGetSupportedEventTypes(h)),
        "number",
        tier="static",
        field="xid_events_supported",
        convert=lambda mask: bool(int(mask) & EVENT_XID_CRITICAL),
    ),
    # -- activity, interconnect and per-process queries (issue 14) --
    # nvmlGpmMetricsGet between this call's sample and the previous call's: SM_UTIL,
    # SM_OCCUPANCY, ANY_TENSOR_UTIL, DRAM_BW_UTIL -> {"sm", "sm_occupancy", "tensor", "dram"} in %
    # (dcgmi dmon -e 1002,1003,1004,1005); NOT_READY at the first call, NOT_SUPPORTED where
    # nvmlGpmQueryDeviceSupport says the GPU has no GPM (before Hopper)
    Query("gpm", lambda c, h, _: c.gpm(h), "numbermap", delta=True),
    # nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES) -> [[timestamp µs, %], ...] since the
    # previous call (nvidia-smi -q -d UTILIZATION: "Samples"); read by watch
    Query("utilization_samples", lambda c, h, _: c.utilization_samples(h), "pairs", delta=True),
    # [{"pid", "sm", "memory", "encoder", "decoder"}] in %, averaged per pid over the samples
    # since the previous call; [] when there is none (nvidia-smi pmon -s u); slow: 1.6 ms a call
    Query(
        "process_utilization",
        lambda c, h, _: c.process_utilization(h),
        "processes",
        tier="slow",
        delta=True,
    ),
    # KB/s over a 20 ms window (nvidia-smi dmon -s t); slow: each call blocks about 20 ms. Not
    # asked where GPM answers pcie_tx and pcie_rx (the GPU source fills the field from those)
    Query(
        "pcie_throughput",
        lambda c, h, arg: int(c.nv.nvmlDeviceGetPcieThroughput(h, arg)),
        "number",
        args={0: "tx", 1: "rx"},
        tier="slow",
        field="pcie_throughput_bytes_per_second",
        convert=lambda kib: float(kib) * KIB,
        dedicated_only=True,
    ),
    # [%, sampling period µs] (utilization.encoder, utilization.decoder)
    _video_utilization("encoder", "nvmlDeviceGetEncoderUtilization"),
    _video_utilization("decoder", "nvmlDeviceGetDecoderUtilization"),
    # 1 active, 0 inactive (nvidia-smi nvlink -s); 3 queries per link, 18 links: slow
    Query(
        "nvlink_state",
        lambda c, h, link: int(c.nv.nvmlDeviceGetNvLinkState(h, link)),
        "number",
        args=LINKS,
        tier="slow",
    ),
    # counts since the counters were last reset (nvidia-smi nvlink -e); 72 calls per GPU, and the
    # error alert looks at 10 minutes, so once a minute is enough
    *(
        Query(name, _nvlink_counter(counter), "number", args=LINKS, tier="static")
        for name, counter in _NVLINK_COUNTERS.items()
    ),
    # KiB of payload since the driver loaded (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _RX;
    # nvidia-smi nvlink -gt d); every link's in one field-values call
    *(
        Query(name, _nvlink_throughput(field), "number", args=LINKS, tier="slow")
        for name, field in _NVLINK_DATA.items()
    ),
)

CATALOGUE: Mapping[str, Query] = {q.name: q for q in QUERIES}
assert len(CATALOGUE) == len(QUERIES), "a query is declared twice"
DELTA_QUERIES = frozenset(q.name for q in QUERIES if q.delta)
# The declarations that fill a snapshot field, in the order they are asked.
SAMPLED = tuple(q for q in QUERIES if q.field is not None)


def _rates(u: Any) -> dict[str, int]:
    return {"gpu": int(u.gpu), "memory": int(u.memory)}


def answer_keys() -> frozenset[str]:
    """Every key a fixture may answer: ``name``, ``clock/1``, ..."""
    return frozenset(
        q.name if arg is None else f"{q.name}/{arg}" for q in QUERIES for arg in q.arguments()
    )


def sample_fields(ask: Ask, dedicated: bool, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The :class:`~sparkdiag.snapshot.GpuSample` fields the declarations fill, asked through
    ``ask(query, arg=None)`` (the GPU source's tiered, unsupported-aware query of one device:
    None when unsupported). A mapping field gets one key per argument (or the declaration's
    ``key``); an answer that ``convert`` turns into None is left out, never 0.
    ``dedicated_only`` queries are not asked on unified memory, nor those in ``skip`` (their
    field filled otherwise)."""
    fields: dict[str, Any] = {}
    for q in SAMPLED:
        if (q.dedicated_only and not dedicated) or q.name in skip:
            continue
        assert q.field is not None
        if q.args is None and q.key is None:
            answer = ask(q.name)
            value = None if answer is None else q.convert(answer)
            if value is not None:  # else the field's default: None, or an empty mapping
                fields[q.field] = value
            continue
        into: dict[str, Any] = fields.setdefault(q.field, {})
        labelled: list[tuple[str, int | None]] = (
            [(str(q.key), None)] if q.args is None else [(k, a) for a, k in q.args.items()]
        )
        for label, arg in labelled:
            answer = ask(q.name) if arg is None else ask(q.name, arg)
            value = None if answer is None else q.convert(answer)
            if value is not None:
                into[label] = value
    return fields


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and abs(value) < 2**63


# The shapes of answers, as the backends return them and fixtures store them:
#   "text": a string; "number": a finite int or float (never a bool); "numbers:N": a list of N
#   numbers; "map:K1,K2": an object with at least those numeric keys; "numbermap": an object of
#   numbers (any keys); "pairs": a list of [number, number]; "processes": a list of objects, each
#   with a positive integer "pid".
def answer_shape_error(query: str, value: Any) -> str | None:
    """Why ``value`` is not a valid answer to ``query`` (None when it is)."""
    declared = CATALOGUE.get(query)
    if declared is None:
        return f"{query!r} is not an NVML query sparkdiag knows"
    shape = declared.shape
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
        # a pid is a positive integer (NVML's is unsigned): a fixture's pid -1 became check's
        # advice "kill -1", which signals every process the user may signal
        ok = isinstance(value, list) and all(
            isinstance(v, dict)
            and isinstance(v.get("pid"), int)
            and not isinstance(v.get("pid"), bool)
            and v["pid"] > 0
            for v in value
        )
    else:  # map:K1,K2
        keys = shape.split(":", 1)[1].split(",")
        ok = isinstance(value, dict) and all(_is_number(value.get(k)) for k in keys)
    return None if ok else f"expected {shape}, got {str(value)[:60]!r}"
