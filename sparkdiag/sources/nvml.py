"""The real NVML backend: the only module that imports ``pynvml`` (the nvidia-ml-py package).

It answers the query catalogue of :mod:`sparkdiag.sources.nvml_api` with plain values, translating
``pynvml.NVMLError`` into :class:`NvmlCallError`. Versioned functions are looked up once, at
:meth:`PynvmlBackend.init`, and the answer is cached.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from typing import Any

from sparkdiag.sources import host
from sparkdiag.sources.nvml_activity import ActivityCalls
from sparkdiag.sources.nvml_api import (
    ERROR_CODES,
    EVENT_XID_CRITICAL,
    FUNCTION_NOT_FOUND,
    NOT_SUPPORTED,
    QUERIES,
    NvmlCallError,
    NvmlEvent,
    NvmlUnavailable,
)

log = logging.getLogger(__name__)

_MEMORY_TEMPERATURE_FIELD = 82  # NVML_FI_DEV_MEMORY_TEMP
_MAX_EVENTS_PER_POLL = 1024


def _handle_key(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class PynvmlBackend:
    """NVML through nvidia-ml-py. Construct cheaply; :meth:`init` does the work."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._index_by_handle: dict[int, int] = {}
        self._event_set: Any = None
        self._reasons_fn: Callable[[Any], int] | None = None
        self._supported_reasons_fn: Callable[[Any], int] | None = None
        self._memory_v2: bool = True
        self._dispatch: dict[str, Callable[[Any, int | None], Any]] = {}
        self._activity: ActivityCalls | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            raise NvmlUnavailable(f"the pynvml module is not installed ({exc})") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {exc}") from exc
        except OSError as exc:  # pragma: no cover - ctypes load failure
            raise NvmlUnavailable(f"libnvidia-ml could not be loaded: {exc}") from exc
        self._nvml = pynvml
        self._resolve_versioned()
        self._build_dispatch()
        self._open_event_set()

    def shutdown(self) -> None:
        if self._nvml is None:
            return
        try:
            if self._activity is not None:
                self._activity.close()
                self._activity = None
            if self._event_set is not None:
                self._nvml.nvmlEventSetFree(self._event_set)
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)
        self._nvml = None
        self._handles.clear()

    def _resolve_versioned(self) -> None:
        nv = self._nvml
        # nvmlDeviceGetCurrentClocksEventReasons replaced ...ThrottleReasons (deprecated, R535).
        self._reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        self._supported_reasons_fn = getattr(
            nv, "nvmlDeviceGetSupportedClocksEventReasons", None
        ) or getattr(nv, "nvmlDeviceGetSupportedClocksThrottleReasons", None)
        self._memory_v2 = hasattr(nv, "nvmlMemory_v2")

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise NvmlCallError(int(exc.value), str(exc)) from None

    # -- the catalogue -----------------------------------------------------------------------
    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._call(self._nvml.nvmlDeviceGetHandleByIndex, index)
            self._handles[index] = handle
            self._index_by_handle[_handle_key(handle)] = index
        return handle

    def driver_version(self) -> str:
        return str(self._call(self._nvml.nvmlSystemGetDriverVersion))

    def device_count(self) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetCount))

    def query(self, index: int, query: str, arg: int | None = None) -> Any:
        fn = self._dispatch.get(query)
        if fn is None:
            raise KeyError(f"unknown NVML query {query!r}")
        handle = self._handle(index)
        try:
            return fn(handle, arg)
        except self._nvml.NVMLError as exc:
            raise NvmlCallError(int(exc.value), str(exc)) from None

    def _build_dispatch(self) -> None:
        nv = self._nvml

        def memory_temperature(h: Any, _: int | None) -> float:
            (value,) = nv.nvmlDeviceGetFieldValues(h, [_MEMORY_TEMPERATURE_FIELD])
            if value.nvmlReturn != 0:
                raise NvmlCallError(int(value.nvmlReturn))
            return _field_value(value)

        def reasons(h: Any, _: int | None) -> int:
            if self._reasons_fn is None:
                raise NvmlCallError(FUNCTION_NOT_FOUND)
            return int(self._reasons_fn(h))

        def supported_reasons(h: Any, _: int | None) -> int:
            if self._supported_reasons_fn is None:
                raise NvmlCallError(FUNCTION_NOT_FOUND)
            return int(self._supported_reasons_fn(h))

        def memory_info(h: Any, _: int | None) -> dict[str, int]:
            if self._memory_v2:
                try:
                    m = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
                    return {
                        "total": int(m.total),
                        "used": int(m.used),
                        "free": int(m.free),
                        "reserved": int(m.reserved),
                    }
                except nv.NVMLError as exc:
                    if int(exc.value) not in (
                        FUNCTION_NOT_FOUND,
                        ERROR_CODES["ARGUMENT_VERSION_MISMATCH"],
                    ):
                        raise
                    self._memory_v2 = False
            m = nv.nvmlDeviceGetMemoryInfo(h)
            return {"total": int(m.total), "used": int(m.used), "free": int(m.free)}

        def utilization(h: Any, _: int | None) -> dict[str, int]:
            u = nv.nvmlDeviceGetUtilizationRates(h)
            return {"gpu": int(u.gpu), "memory": int(u.memory)}

        def processes(h: Any, _: int | None) -> list[dict[str, int | None]]:
            out: list[dict[str, int | None]] = []
            for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                used = getattr(p, "usedGpuMemory", None)
                out.append({"pid": int(p.pid), "used_memory": None if used is None else int(used)})
            return out

        def pci_bus_id(h: Any, _: int | None) -> str:
            bus_id = nv.nvmlDeviceGetPciInfo(h).busId
            return bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)

        def violation(h: Any, arg: int | None) -> int:
            return int(nv.nvmlDeviceGetViolationStatus(h, arg).violationTime)

        def ecc(h: Any, arg: int | None) -> int:
            return int(nv.nvmlDeviceGetTotalEccErrors(h, arg, nv.NVML_AGGREGATE_ECC))

        def simple(
            fn: Callable[[Any], Any], cast: Callable[[Any], Any] = int
        ) -> Callable[[Any, int | None], Any]:
            return lambda h, _: cast(fn(h))

        def with_arg(fn: Callable[[Any, int], Any]) -> Callable[[Any, int | None], Any]:
            return lambda h, arg: int(fn(h, int(arg or 0)))

        self._dispatch = {
            "name": simple(nv.nvmlDeviceGetName, _text),
            "uuid": simple(nv.nvmlDeviceGetUUID, _text),
            "pci_bus_id": pci_bus_id,
            "cuda_capability": simple(nv.nvmlDeviceGetCudaComputeCapability, list),
            "temperature": with_arg(nv.nvmlDeviceGetTemperature),
            "memory_temperature": memory_temperature,
            "temperature_threshold": with_arg(nv.nvmlDeviceGetTemperatureThreshold),
            "clock": with_arg(nv.nvmlDeviceGetClockInfo),
            "max_clock": with_arg(nv.nvmlDeviceGetMaxClockInfo),
            "applications_clock": with_arg(nv.nvmlDeviceGetApplicationsClock),
            "default_applications_clock": with_arg(nv.nvmlDeviceGetDefaultApplicationsClock),
            "clock_event_reasons": reasons,
            "supported_clock_event_reasons": supported_reasons,
            "violation_ns": violation,
            "power_mw": simple(nv.nvmlDeviceGetPowerUsage),
            "power_limit_mw": simple(nv.nvmlDeviceGetEnforcedPowerLimit),
            "energy_mj": simple(nv.nvmlDeviceGetTotalEnergyConsumption),
            "utilization": utilization,
            "memory_info": memory_info,
            "pcie_gen": simple(nv.nvmlDeviceGetCurrPcieLinkGeneration),
            "pcie_max_gen": simple(nv.nvmlDeviceGetMaxPcieLinkGeneration),
            "pcie_width": simple(nv.nvmlDeviceGetCurrPcieLinkWidth),
            "pcie_max_width": simple(nv.nvmlDeviceGetMaxPcieLinkWidth),
            "pcie_replay": simple(nv.nvmlDeviceGetPcieReplayCounter),
            "ecc_total": ecc,
            "remapped_rows": simple(nv.nvmlDeviceGetRemappedRows, list),
            "pstate": simple(nv.nvmlDeviceGetPerformanceState),
            "compute_processes": processes,
            "persistence_mode": simple(nv.nvmlDeviceGetPersistenceMode),
            "compute_mode": simple(nv.nvmlDeviceGetComputeMode),
            "mig_mode": simple(nv.nvmlDeviceGetMigMode, list),
            "supported_event_types": simple(nv.nvmlDeviceGetSupportedEventTypes),
        }
        self._activity = ActivityCalls(nv)
        self._dispatch.update(self._activity.dispatch())
        missing = set(QUERIES) - set(self._dispatch)
        assert not missing, f"queries without an NVML call: {missing}"

    # -- events ------------------------------------------------------------------------------
    def _open_event_set(self) -> None:
        """Register XID-critical events on every device that supports them.

        Reading them later (:meth:`poll_events`) uses ``nvmlEventSetWait(set, 0)``: it returns at
        once, so the poller never blocks on it.
        """
        nv = self._nvml
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.info("NVML events unavailable (%s): XID errors will not be counted", exc)
            return
        try:
            count = self.device_count()
        except NvmlCallError:
            return
        for index in range(count):
            try:
                handle = self._handle(index)
                supported = int(nv.nvmlDeviceGetSupportedEventTypes(handle))
                if supported & EVENT_XID_CRITICAL:
                    nv.nvmlDeviceRegisterEvents(handle, EVENT_XID_CRITICAL, self._event_set)
            except (nv.NVMLError, NvmlCallError) as exc:
                log.info("GPU %d: XID events not registered (%s)", index, exc)

    def poll_events(self) -> list[NvmlEvent]:
        if self._event_set is None or self._nvml is None:
            return []
        nv = self._nvml
        events: list[NvmlEvent] = []
        for _ in range(_MAX_EVENTS_PER_POLL):
            try:
                data = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError as exc:
                if int(exc.value) != ERROR_CODES["TIMEOUT"]:
                    log.debug("nvmlEventSetWait: %s", exc)
                break
            index = self._index_by_handle.get(_handle_key(data.device), -1)
            events.append(
                NvmlEvent(
                    gpu=index,
                    event_type=int(data.eventType),
                    data=int(data.eventData),
                    timestamp=time.time(),
                )
            )
        return events

    def advance(self) -> None:
        return None

    def host_memory_total(self) -> int | None:
        return host.memory_total()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field_value(value: Any) -> float:
    """Decode an ``nvmlFieldValue_t`` by its ``valueType``."""
    kind = int(value.valueType)
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    name = member.get(kind)
    if name is None:
        raise NvmlCallError(NOT_SUPPORTED, f"unknown NVML value type {kind}")
    return float(getattr(value.value, name))
