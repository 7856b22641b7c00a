"""Exporter identity, NVML status, per-collector status, execution context and host memory."""

from __future__ import annotations

import platform
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from sparkdiag import __version__
from sparkdiag.exporter.base import SnapshotProvider


class SystemCollector:
    def __init__(self, snapshot: SnapshotProvider) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        if snap is None:
            return
        info = GaugeMetricFamily(
            "sparkdiag_build_info",
            "sparkdiag build identity; value is 1.",
            labels=["version", "python", "nvml_driver"],
        )
        info.add_metric([__version__, platform.python_version(), snap.driver_version], 1)
        yield info

        yield GaugeMetricFamily(
            "sparkdiag_nvml_up",
            "1 when NVML initialised and answers, else 0.",
            value=1 if snap.nvml_up else 0,
        )

        success = GaugeMetricFamily(
            "sparkdiag_collector_success",
            "1 when the collector's last run succeeded.",
            labels=["collector"],
        )
        duration = GaugeMetricFamily(
            "sparkdiag_collector_duration_seconds",
            "Duration of the collector's last run in seconds.",
            labels=["collector"],
        )
        for name, status in sorted(snap.collectors.items()):
            success.add_metric([name], 1 if status.success else 0)
            duration.add_metric([name], status.duration_seconds)
        yield success
        yield duration

        if snap.context is not None:
            ctx = GaugeMetricFamily(
                "sparkdiag_context_info",
                "Where this daemon runs (native or container, and the runtime); value is 1.",
                labels=["context", "runtime"],
            )
            ctx.add_metric([snap.context.context, snap.context.runtime], 1)
            yield ctx

        if snap.host is not None and snap.host.memory_bytes:
            mem = GaugeMetricFamily(
                "sparkdiag_host_memory_bytes",
                "Host memory by state (total, available, free, cached); on unified-memory GPUs "
                "(GB10) this is also the GPU's memory.",
                labels=["state"],
            )
            for state, value in sorted(snap.host.memory_bytes.items()):
                mem.add_metric([state], value)
            yield mem

        yield GaugeMetricFamily(
            "sparkdiag_last_poll_timestamp_seconds",
            "Unix time of the telemetry poll this scrape renders.",
            value=snap.timestamp,
        )
