"""Exporter identity, NVML status, per-collector status, execution context and host memory."""

from __future__ import annotations

import platform
from collections.abc import Iterator

from sparkdiag import __version__
from sparkdiag.exporter.base import FromSnapshot, by_label
from sparkdiag.exporter.families import CounterMetricFamily, GaugeMetricFamily, Metric
from sparkdiag.snapshot import HostSample, Snapshot


class SystemCollector(FromSnapshot):
    def families(self, snap: Snapshot) -> Iterator[Metric]:
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

        if snap.platform is not None:
            platform_info = GaugeMetricFamily(
                "sparkdiag_platform_info",
                "The machine as DMI names it (sys_vendor, product_name, board_name); value is 1.",
                labels=["vendor", "product", "board"],
            )
            dmi = snap.platform
            platform_info.add_metric([dmi.vendor, dmi.product, dmi.board], 1)
            yield platform_info

        if snap.host is not None and snap.host.memory_bytes:
            mem = GaugeMetricFamily(
                "sparkdiag_host_memory_bytes",
                "Host memory by state (total, available, free, cached); on unified-memory GPUs "
                "(GB10) this is also the GPU's memory.",
                labels=["state"],
            )
            yield by_label(mem, snap.host.memory_bytes)
        if snap.host is not None:
            yield from _pressure(snap.host)

        yield GaugeMetricFamily(
            "sparkdiag_last_poll_timestamp_seconds",
            "Unix time of the telemetry poll this scrape renders.",
            value=snap.timestamp,
        )


def _pressure(host: HostSample) -> Iterator[Metric]:
    """Memory pressure (PSI) and swap-ins: on unified memory (GB10) these say the GPU's memory is
    short before allocations fail."""
    if host.pressure is not None:
        ratio = GaugeMetricFamily(
            "sparkdiag_host_memory_pressure_ratio",
            "Share of wall time tasks were stalled waiting for memory (PSI, "
            "/proc/pressure/memory), over the kernel's 10, 60 and 300 s windows: some = at least "
            "one task, full = all non-idle tasks.",
            labels=["kind", "window"],
        )
        for kind, windows in sorted(host.pressure.averages.items()):
            for window, value in sorted(windows.items(), key=lambda kv: int(kv[0][:-1])):
                ratio.add_metric([kind, window], value)
        yield ratio
        stalled = CounterMetricFamily(
            "sparkdiag_host_memory_pressure_stalled_seconds",
            "Time tasks were stalled waiting for memory since boot (PSI total), by kind.",
            labels=["kind"],
        )
        yield by_label(stalled, host.pressure.stalled_seconds)
    if host.swap_in_pages is not None:
        yield CounterMetricFamily(
            "sparkdiag_host_swap_in_pages",
            "Pages swapped in since boot (pswpin of /proc/vmstat); its rate is vmstat's si.",
            value=host.swap_in_pages,
        )
