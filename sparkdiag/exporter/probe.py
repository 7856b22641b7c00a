"""GEMM and memory-bandwidth probe results: METRICS.md's "GEMM and memory probes" table.

Throughput, baseline, efficiency, the conditions during the probe and its busy time all come
from the last successful cycle (they stay while later cycles are skipped as busy or fail; the
run counters and the last-success timestamp tell those apart).
Accumulate runs (beta=1) are exported apart, as ``sparkdiag_gemm_accumulate_tflops``, so that
every ``sparkdiag_gemm_*`` series stays one per GPU, dtype, shape and context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from sparkdiag.baseline.keeper import OPERATIONS, StoreHealth
from sparkdiag.exporter.base import GPU_LABELS as GPU
from sparkdiag.exporter.base import FromProbeView, by_label
from sparkdiag.exporter.families import CounterMetricFamily, GaugeMetricFamily, Metric
from sparkdiag.scheduling.probe_state import RESULTS, CycleRecord, ProbeView
from sparkdiag.sources.nvml.gpu import CLOCK_EVENT_REASONS

GEMM = [*GPU, "dtype", "shape", "context"]


class ProbeCollector(FromProbeView):
    def __init__(
        self, view: Callable[[], ProbeView], store: Callable[[], StoreHealth] | None = None
    ) -> None:
        super().__init__(view)
        self.store = store

    def families(self, view: ProbeView) -> Iterator[Metric]:
        if self.store is not None:
            yield from _store_families(self.store())

        def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        interval = gauge(
            "sparkdiag_probe_interval_seconds",
            "Configured seconds between probe cycles (present while the probe is enabled).",
            ["context"],
        )
        yield by_label(interval, view.intervals)

        runs = CounterMetricFamily(
            "sparkdiag_probe_runs", "Probe cycles by outcome.", labels=[*GPU, "context", "result"]
        )
        seen = {(g, u, c) for (g, u, c, _) in view.runs} | set(view.last)
        for gpu, uuid, context in sorted(seen):
            for result in RESULTS:  # every outcome from 0, so increase() sees the first one
                runs.add_metric(
                    [gpu, uuid, context, result], view.runs.get((gpu, uuid, context, result), 0)
                )
        yield runs

        tflops = gauge(
            "sparkdiag_gemm_tflops",
            "Delivered throughput of the last successful probe: the work of back-to-back "
            "iterations over their total time, gaps included (TFLOPS; TOPS for integer dtypes).",
            GEMM,
        )
        peak = gauge(
            "sparkdiag_gemm_peak_tflops",
            "Peak throughput of the last successful probe: from the median iteration, comparable "
            "with mamf-finder (TFLOPS; TOPS for integer dtypes). Never alerted on alone.",
            GEMM,
        )
        accumulate = gauge(
            "sparkdiag_gemm_accumulate_tflops",
            "Delivered throughput of the last successful probe with beta=1 (C += A @ B).",
            GEMM,
        )
        baseline = gauge(
            "sparkdiag_gemm_baseline_tflops",
            "The healthy baseline the probe is compared with (learned or pinned).",
            GEMM,
        )
        efficiency = gauge("sparkdiag_gemm_efficiency_ratio", "Last over baseline.", GEMM)
        reference = gauge(
            "sparkdiag_gemm_reference_tflops",
            "Published reference for this GPU model and dtype (MAMF or datasheet dense peak).",
            GEMM,
        )
        for (gpu, uuid, context), cycle in sorted(view.last_success.items()):
            for fig in cycle.figures:
                if fig.delivered is None:
                    continue
                labels = [gpu, uuid, fig.dtype, fig.shape, context]
                if fig.beta:
                    accumulate.add_metric(labels, fig.delivered)
                    continue
                tflops.add_metric(labels, fig.delivered)
                if fig.peak is not None:
                    peak.add_metric(labels, fig.peak)
                if fig.baseline is not None:
                    baseline.add_metric(labels, fig.baseline.tflops)
                ratio = fig.efficiency
                if ratio is not None:
                    efficiency.add_metric(labels, ratio)
                if fig.reference is not None and fig.kind == "compute":
                    reference.add_metric(labels, fig.reference.tflops)
        yield from (tflops, peak, accumulate, baseline, efficiency, reference)

        def per_cycle(name: str, doc: str, value: Callable[[CycleRecord], float | None]) -> Metric:
            """One series a GPU and context: ``value`` of its last successful cycle, if any."""
            family = gauge(name, doc, [*GPU, "context"])
            for key, cycle in sorted(view.last_success.items()):
                number = value(cycle)
                if number is not None:
                    family.add_metric(list(key), number)
            return family

        yield per_cycle(
            "sparkdiag_memory_bandwidth_bytes_per_second",
            "Device memory copy bandwidth delivered by back-to-back copies, bytes read plus "
            "written per second.",
            lambda cycle: cycle.bandwidth_bytes_per_second,
        )
        yield per_cycle(
            "sparkdiag_probe_last_success_timestamp_seconds",
            "Unix time at the end of the last successful probe.",
            lambda cycle: cycle.finished_at,
        )
        # The conditions of the same cycle the throughput figures come from, so that an alert
        # joining efficiency with "hot during the probe" compares one cycle with itself.
        yield per_cycle(
            "sparkdiag_probe_duration_seconds",
            "GPU-busy time of the last probe cycle, seconds.",
            lambda cycle: cycle.busy_seconds,
        )
        yield from cycle_conditions("sparkdiag_probe", "the last probe cycle", view.last_success)
        yield per_cycle(
            "sparkdiag_probe_sm_clock_hertz",
            "Mean SM clock during the last probe cycle.",
            lambda cycle: cycle.mean_sm_clock_hertz,
        )
        yield per_cycle(
            "sparkdiag_probe_power_watts",
            "Mean power during the last probe cycle.",
            lambda cycle: cycle.mean_power_watts,
        )
        yield from _ratio_families(view)
        yield software_family(view.last_success)


SOFTWARE = ("torch", "cuda", "cublas", "driver")


def software_family(records: Mapping[tuple[str, str, str], CycleRecord]) -> Metric:
    """``sparkdiag_probe_software_info``: what the last successful probe of each GPU and context
    ran with (the worker's own report; "" where it could not tell), so that the fleet rules
    compare a GPU only with peers measured by the same torch, CUDA and driver."""
    info = GaugeMetricFamily(
        "sparkdiag_probe_software_info",
        "Software the last successful probe of this GPU ran with (torch, CUDA, cuBLAS, driver; "
        "empty where unknown). Value 1.",
        labels=[*GPU, "context", *SOFTWARE],
    )
    for (gpu, uuid, context), cycle in sorted(records.items()):
        versions = [str(cycle.software.get(name) or "") for name in SOFTWARE]
        info.add_metric([gpu, uuid, context, *versions], 1.0)
    return info


def _store_families(health: StoreHealth) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "sparkdiag_baseline_store_up",
        "1 while the baseline store can be opened and written, 0 while it cannot (full disk, "
        "damaged or unwritable file): probes then run without learning or comparing baselines.",
    )
    up.add_metric([], 1.0 if health.up else 0.0)
    yield up
    errors = CounterMetricFamily(
        "sparkdiag_baseline_store_errors",
        "Failed opens and writes of the baseline store since the daemon started.",
        labels=["operation"],
    )
    for operation in OPERATIONS:
        errors.add_metric([operation], health.errors.get(operation, 0))
    yield errors


def cycle_conditions(
    prefix: str, which: str, records: Mapping[tuple[str, str, str], CycleRecord]
) -> Iterator[Metric]:
    """``PREFIX_temperature_celsius`` and ``PREFIX_clock_event_active`` of each record: the
    conditions of the same cycle its figures come from, so that an alert joining a figure with
    "hot during the probe" compares one cycle with itself."""
    temperature = GaugeMetricFamily(
        f"{prefix}_temperature_celsius",
        f"Highest temperature seen during {which}.",
        labels=[*GPU, "sensor", "context"],
    )
    reasons = GaugeMetricFamily(
        f"{prefix}_clock_event_active",
        f"1 when the clock event reason was active at any time during {which}.",
        labels=[*GPU, "reason", "context"],
    )
    for (gpu, uuid, context), cycle in sorted(records.items()):
        for sensor, value in sorted(cycle.max_temperature_celsius.items()):
            temperature.add_metric([gpu, uuid, sensor, context], value)
        if cycle.clock_event_reasons_seen is not None:
            for name, bit in CLOCK_EVENT_REASONS.items():
                active = 1 if cycle.clock_event_reasons_seen & bit else 0
                reasons.add_metric([gpu, uuid, name, context], active)
    yield from (temperature, reasons)


RATIO = [*GPU, "versus", "shape", "context"]


def ratio_families(
    prefix: str, which: str, records: Mapping[tuple[str, str, str], CycleRecord]
) -> Iterator[Metric]:
    """int4 over bf16/fp16 at the decode shape, its cool baseline, and their quotient."""
    value = GaugeMetricFamily(
        f"{prefix}_int4_ratio",
        f"int4 over a 16-bit dtype ('versus') at the decode shape, from the median iterations, "
        f"in {which}: contention leaves it, heat that slows int4 lowers it.",
        labels=RATIO,
    )
    baseline = GaugeMetricFamily(
        f"{prefix}_int4_ratio_baseline",
        "The same ratio as learned on a cool, idle GPU (the periodic probe's cool cycles).",
        labels=RATIO,
    )
    efficiency = GaugeMetricFamily(
        f"{prefix}_int4_ratio_efficiency",
        "The ratio over its cool baseline: 1.0 while int4 holds up as it does when cool.",
        labels=RATIO,
    )
    for (gpu, uuid, context), cycle in sorted(records.items()):
        for fig in cycle.ratios:
            labels = [gpu, uuid, fig.versus, fig.shape, context]
            value.add_metric(labels, fig.value)
            if fig.baseline is not None:
                baseline.add_metric(labels, fig.baseline.tflops)
            if fig.efficiency is not None:
                efficiency.add_metric(labels, fig.efficiency)
    yield from (value, baseline, efficiency)


def _ratio_families(view: ProbeView) -> Iterator[Metric]:
    yield from ratio_families("sparkdiag_gemm", "the last successful probe", view.last_success)
