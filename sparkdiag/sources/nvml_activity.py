"""The real NVML calls behind the activity, interconnect and per-process queries
(:data:`sparkdiag.sources.nvml_api.ACTIVITY_QUERIES`).

It is handed the ``pynvml`` module object by :class:`sparkdiag.sources.nvml.PynvmlBackend` (the
only module that imports it) and keeps the state that NVML's delta APIs need, so that every
catalogue answer is a plain value:

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

from sparkdiag.sources.nvml_api import (
    NOT_FOUND,
    NOT_READY,
    NOT_SUPPORTED,
    NVLINK_LINKS,
    NvmlCallError,
)

# nvml.h nvmlGpmMetricId_t
GPM_METRICS: dict[str, int] = {"sm": 2, "sm_occupancy": 3, "tensor": 5, "dram": 10}
_NVLINK_ERROR_COUNTERS = {  # nvmlNvLinkErrorCounter_t
    "nvlink_replay_errors": 0,
    "nvlink_recovery_errors": 1,
    "nvlink_crc_flit_errors": 2,
    "nvlink_crc_data_errors": 3,
}
_NVLINK_THROUGHPUT_FIELDS = {"nvlink_tx_kib": 138, "nvlink_rx_kib": 139}  # NVML_FI_DEV_NVLINK_*
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

Dispatch = dict[str, Callable[[Any, int | None], Any]]


def _key(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


@dataclass
class _GpmBuffers:
    previous: Any
    current: Any
    primed: bool = False


class ActivityCalls:
    """The dispatch entries of the activity block, with the state they need between calls."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
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

    def dispatch(self) -> Dispatch:
        nv = self.nv
        table: Dispatch = {
            "gpm": self.gpm,
            "utilization_samples": self.utilization_samples,
            "process_utilization": self.process_utilization,
            "pcie_throughput": lambda h, arg: int(nv.nvmlDeviceGetPcieThroughput(h, int(arg or 0))),
            "encoder_utilization": lambda h, _: [
                int(v) for v in nv.nvmlDeviceGetEncoderUtilization(h)
            ],
            "decoder_utilization": lambda h, _: [
                int(v) for v in nv.nvmlDeviceGetDecoderUtilization(h)
            ],
            "nvlink_state": lambda h, arg: int(nv.nvmlDeviceGetNvLinkState(h, int(arg or 0))),
        }
        for query, counter in _NVLINK_ERROR_COUNTERS.items():
            table[query] = self._error_counter(counter)
        for query, field in _NVLINK_THROUGHPUT_FIELDS.items():
            table[query] = self._link_field(field)
        return table

    # -- GPM ----------------------------------------------------------------------------------
    def gpm(self, handle: Any, _: int | None) -> dict[str, float]:
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
    def utilization_samples(self, handle: Any, _: int | None) -> list[list[float]]:
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

    def process_utilization(self, handle: Any, _: int | None) -> list[dict[str, float]]:
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
    def _error_counter(self, counter: int) -> Callable[[Any, int | None], int]:
        def read(handle: Any, link: int | None) -> int:
            return int(self.nv.nvmlDeviceGetNvLinkErrorCounter(handle, int(link or 0), counter))

        return read

    def _link_field(self, field: int) -> Callable[[Any, int | None], int]:
        def read(handle: Any, link: int | None) -> int:
            code, value = self._link_fields(handle)[(field, int(link or 0))]
            if code != 0:
                raise NvmlCallError(code)
            return value

        return read

    def _link_fields(self, handle: Any) -> dict[tuple[int, int], tuple[int, int]]:
        """Every link's throughput fields in one ``nvmlDeviceGetFieldValues`` call, kept for
        ``FIELD_CACHE_SECONDS``: the GPU source asks them link by link within one poll."""
        key = _key(handle)
        now = time.monotonic()
        cached = self._fields.get(key)
        if cached is not None and now - cached[0] < FIELD_CACHE_SECONDS:
            return cached[1]
        wanted = [(f, link) for f in _NVLINK_THROUGHPUT_FIELDS.values() for link in NVLINK_LINKS]
        answers: dict[tuple[int, int], tuple[int, int]] = {}
        for (field, link), value in zip(
            wanted, self.nv.nvmlDeviceGetFieldValues(handle, wanted), strict=True
        ):
            member = _VALUE_MEMBERS.get(int(value.valueType), "ullVal")
            code = int(value.nvmlReturn)
            answers[(field, link)] = (code, 0 if code else int(getattr(value.value, member)))
        self._fields[key] = (now, answers)
        return answers
