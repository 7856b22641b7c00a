"""The stateful side of the real NVML calls: what the catalogue's pynvml calls
(:data:`sparkdiag.sources.nvml.queries.CATALOGUE`) need to keep between calls.

It is handed the ``pynvml`` module object by
:class:`sparkdiag.sources.nvml.driver.PynvmlBackend` (the only module that imports it), so that
every catalogue answer is a plain value:

* versioned functions are looked up once and the answer kept: the clock event reasons
  (``nvmlDeviceGetCurrentClocksEventReasons``, falling back to the deprecated
  ``...ThrottleReasons``) and ``nvmlDeviceGetMemoryInfo`` v2 (falling back to v1 once v2 is
  refused);
* one field value (``nvmlDeviceGetFieldValues``) is decoded by its ``valueType``, its own return
  code raised as the call's error;
* GPM (``nvmlGpmMetricsGet``) compares two samples taken with ``nvmlGpmSampleGet``. Each device
  gets two sample buffers, allocated at its first ``gpm`` query; every call takes a new sample
  into one buffer and compares it with the previous call's, then the buffers swap roles. The
  first call only takes a sample and raises NOT_READY.
* the NVLink throughput fields of all 18 links are read in one ``nvmlDeviceGetFieldValues``
  call per device and handed out link by link (36 calls would cost 36 round trips);
* ``nvmlDeviceGetSamples`` and ``nvmlDeviceGetProcessUtilization`` return what the driver
  sampled after a timestamp; the last timestamp seen per device is kept, so each call answers
  with the samples since the previous one. "No sample" (NOT_FOUND) is an empty list, not an
  unsupported query.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkdiag.sources.nvml.api import (
    ERROR_CODES,
    FUNCTION_NOT_FOUND,
    NOT_FOUND,
    NOT_READY,
    NOT_SUPPORTED,
    NVLINK_LINKS,
    NvmlCallError,
)

# nvml.h nvmlGpmMetricId_t
# pcie_tx/pcie_rx: PCIe traffic from and to the GPU in MiB/s over the two samples (Hopper and
# later): on the H200 a pageable host-to-device loop read rx 3142, a device-to-host one tx 1308,
# a matmul loop both under 3 (docs/device/2026-12-03/explore). watch reads them for copies.
GPM_METRICS: dict[str, int] = {
    "sm": 2,
    "sm_occupancy": 3,
    "tensor": 5,
    "dram": 10,
    "pcie_tx": 20,
    "pcie_rx": 21,
}
NVLINK_THROUGHPUT_FIELDS = (138, 139)  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _RX
_GPU_UTILIZATION_SAMPLES = 1  # NVML_GPU_UTILIZATION_SAMPLES
FIELD_CACHE_SECONDS = 1.0
_VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


def _key(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def text(value: Any) -> str:
    """A string NVML returned as bytes (older nvidia-ml-py) or str."""
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _GpmBuffers:
    previous: Any
    current: Any
    primed: bool = False


class NvmlCalls:
    """The pynvml module (``nv``) and the state the catalogue's calls keep between calls."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        # nvmlDeviceGetCurrentClocksEventReasons replaced ...ThrottleReasons (deprecated, R535).
        self._reasons_fn: Callable[[Any], int] | None = getattr(
            nv, "nvmlDeviceGetCurrentClocksEventReasons", None
        ) or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        self._supported_reasons_fn: Callable[[Any], int] | None = getattr(
            nv, "nvmlDeviceGetSupportedClocksEventReasons", None
        ) or getattr(nv, "nvmlDeviceGetSupportedClocksThrottleReasons", None)
        self._memory_v2 = hasattr(nv, "nvmlMemory_v2")
        self._fabric_structs = ["c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t"]
        self._gpm: dict[int, _GpmBuffers] = {}
        self._samples_seen: dict[int, int] = {}
        self._process_seen: dict[int, int] = {}
        self._fields: dict[int, tuple[float, dict[tuple[int, int], tuple[int, int]]]] = {}

    def close(self) -> None:
        """Free the GPM sample buffers (call before nvmlShutdown)."""
        for buffers in self._gpm.values():
            for sample in (buffers.previous, buffers.current):
                with contextlib.suppress(self.nv.NVMLError):
                    self.nv.nvmlGpmSampleFree(sample)
        self._gpm.clear()

    # -- versioned functions ------------------------------------------------------------------
    def clock_event_reasons(self, handle: Any) -> int:
        if self._reasons_fn is None:
            raise NvmlCallError(FUNCTION_NOT_FOUND)
        return int(self._reasons_fn(handle))

    def supported_clock_event_reasons(self, handle: Any) -> int:
        if self._supported_reasons_fn is None:
            raise NvmlCallError(FUNCTION_NOT_FOUND)
        return int(self._supported_reasons_fn(handle))

    def memory_info(self, handle: Any) -> dict[str, int]:
        nv = self.nv
        if self._memory_v2:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
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
        m = nv.nvmlDeviceGetMemoryInfo(handle)
        return {"total": int(m.total), "used": int(m.used), "free": int(m.free)}

    def field_value(self, handle: Any, field: int) -> float:
        """One ``nvmlDeviceGetFieldValues`` field, decoded by its ``valueType``; the field's own
        return code (NOT_SUPPORTED where the driver lacks it) raised as the call's error."""
        (value,) = self.nv.nvmlDeviceGetFieldValues(handle, [field])
        if int(value.nvmlReturn) != 0:
            raise NvmlCallError(int(value.nvmlReturn))
        name = _VALUE_MEMBERS.get(int(value.valueType))
        if name is None:
            raise NvmlCallError(NOT_SUPPORTED, f"unknown NVML value type {int(value.valueType)}")
        return float(getattr(value.value, name))

    def fabric_info(self, handle: Any) -> dict[str, int]:
        """The GPU's NVLink fabric registration (``nvidia-smi -q``: "Fabric"): state, the
        registration's NVML return code, and where the driver has it (v3) the health mask and
        summary. ``nvmlDeviceGetGpuFabricInfoV`` with the v3 struct, falling back to v2, then
        to the deprecated ``nvmlDeviceGetGpuFabricInfo``; versions the driver refuses are not
        tried again."""
        nv = self.nv
        for struct_name in self._fabric_structs:
            struct = getattr(nv, struct_name, None)
            if struct is None or not hasattr(nv, "nvmlDeviceGetGpuFabricInfoV"):
                continue
            info = struct()
            try:
                nv.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
            except nv.NVMLError as exc:
                if int(exc.value) not in (
                    FUNCTION_NOT_FOUND,
                    ERROR_CODES["ARGUMENT_VERSION_MISMATCH"],
                ):
                    raise
                self._fabric_structs = [s for s in self._fabric_structs if s != struct_name]
                continue
            return {
                "state": int(info.state),
                "status": int(info.status),
                "health_mask": int(info.healthMask),
                "health_summary": int(getattr(info, "healthSummary", 0)),
            }
        info = nv.c_nvmlGpuFabricInfo_t()
        nv.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        return {"state": int(info.state), "status": int(info.status)}

    def compute_processes(self, handle: Any) -> list[dict[str, int | None]]:
        out: list[dict[str, int | None]] = []
        for p in self.nv.nvmlDeviceGetComputeRunningProcesses(handle):
            used = getattr(p, "usedGpuMemory", None)
            out.append({"pid": int(p.pid), "used_memory": None if used is None else int(used)})
        return out

    # -- GPM ----------------------------------------------------------------------------------
    def gpm(self, handle: Any) -> dict[str, float]:
        nv = self.nv
        key = _key(handle)
        buffers = self._gpm.get(key)
        if buffers is None:
            support = nv.nvmlGpmQueryDeviceSupport(handle)
            if not int(support.isSupportedDevice):
                raise NvmlCallError(NOT_SUPPORTED, "GPM is not supported on this GPU")
            buffers = _GpmBuffers(nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc())
            self._gpm[key] = buffers
        nv.nvmlGpmSampleGet(handle, buffers.current)
        if not buffers.primed:
            buffers.primed = True
            buffers.previous, buffers.current = buffers.current, buffers.previous
            raise NvmlCallError(NOT_READY, "first GPM sample taken; metrics from the next call")
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = buffers.previous
        request.sample2 = buffers.current
        for i, metric in enumerate(GPM_METRICS.values()):
            request.metrics[i].metricId = metric
        try:
            nv.nvmlGpmMetricsGet(request)
        finally:
            buffers.previous, buffers.current = buffers.current, buffers.previous
        return {
            name: float(request.metrics[i].value)
            for i, name in enumerate(GPM_METRICS)
            if int(request.metrics[i].nvmlReturn) == 0
        }

    # -- sample buffers -----------------------------------------------------------------------
    def utilization_samples(self, handle: Any) -> list[list[float]]:
        nv = self.nv
        key = _key(handle)
        since = self._samples_seen.get(key, 0)
        try:
            value_type, samples = nv.nvmlDeviceGetSamples(handle, _GPU_UTILIZATION_SAMPLES, since)
        except nv.NVMLError as exc:
            if int(exc.value) == NOT_FOUND:
                return []
            raise
        member = _VALUE_MEMBERS.get(int(value_type), "uiVal")
        out = [
            [int(s.timeStamp), float(getattr(s.sampleValue, member))]
            for s in samples
            if int(s.timeStamp) > since
        ]
        if out:
            self._samples_seen[key] = max(int(t) for t, _ in out)
        return out

    def process_utilization(self, handle: Any) -> list[dict[str, float]]:
        nv = self.nv
        key = _key(handle)
        since = self._process_seen.get(key, 0)
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(handle, since)
        except nv.NVMLError as exc:
            if int(exc.value) in (0, NOT_FOUND):  # pynvml raises "success" for zero samples
                return []
            raise
        sums: dict[int, list[float]] = {}
        latest = since
        for s in samples:
            stamp = int(s.timeStamp)
            if stamp <= since:
                continue
            latest = max(latest, stamp)
            acc = sums.setdefault(int(s.pid), [0.0, 0.0, 0.0, 0.0, 0.0])
            acc[0] += float(s.smUtil)
            acc[1] += float(s.memUtil)
            acc[2] += float(s.encUtil)
            acc[3] += float(s.decUtil)
            acc[4] += 1
        self._process_seen[key] = latest
        return [
            {
                "pid": pid,
                "sm": acc[0] / acc[4],
                "memory": acc[1] / acc[4],
                "encoder": acc[2] / acc[4],
                "decoder": acc[3] / acc[4],
            }
            for pid, acc in sorted(sums.items())
        ]

    # -- NVLink -------------------------------------------------------------------------------
    def nvlink_throughput(self, handle: Any, field: int, link: int) -> int:
        """One link's throughput field (KiB since the driver loaded), from the one call that
        reads every link's (:meth:`_link_fields`)."""
        code, value = self._link_fields(handle)[(field, link)]
        if code != 0:
            raise NvmlCallError(code)
        return value

    def _link_fields(self, handle: Any) -> dict[tuple[int, int], tuple[int, int]]:
        """Every link's throughput fields in one ``nvmlDeviceGetFieldValues`` call, kept for
        ``FIELD_CACHE_SECONDS``: the GPU source asks them link by link within one poll."""
        key = _key(handle)
        now = time.monotonic()
        cached = self._fields.get(key)
        if cached is not None and now - cached[0] < FIELD_CACHE_SECONDS:
            return cached[1]
        wanted = [(f, link) for f in NVLINK_THROUGHPUT_FIELDS for link in NVLINK_LINKS]
        answers: dict[tuple[int, int], tuple[int, int]] = {}
        for (field, link), value in zip(
            wanted, self.nv.nvmlDeviceGetFieldValues(handle, wanted), strict=True
        ):
            member = _VALUE_MEMBERS.get(int(value.valueType), "ullVal")
            code = int(value.nvmlReturn)
            answers[(field, link)] = (code, 0 if code else int(getattr(value.value, member)))
        self._fields[key] = (now, answers)
        return answers
