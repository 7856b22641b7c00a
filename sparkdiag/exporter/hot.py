"""The hot probe (:mod:`sparkdiag.scheduling.hot_probe`): what it measured on a hot or busy GPU,
and why it ran.

Every series comes from the last successful hot probe of each GPU, with the conditions of that
same probe, so that ``SparkdiagThermalInt4Degradation`` joins a ratio with the heat it was
measured in. The int4 ratio's efficiency (the ratio over the same ratio learned cool) is what
the alert reads: contention alone does not move it, heat that collapses 4-bit GEMMs does.
"""

from __future__ import annotations

from collections.abc import Iterator

from sparkdiag.exporter.base import GPU_LABELS as GPU
from sparkdiag.exporter.base import FromProbeView
from sparkdiag.exporter.families import CounterMetricFamily, GaugeMetricFamily, Metric
from sparkdiag.exporter.probe import GEMM, cycle_conditions, ratio_families
from sparkdiag.scheduling.hot_probe import TRIGGERS
from sparkdiag.scheduling.probe_state import RESULTS, ProbeView

WHICH = "the last hot probe"


class HotProbeCollector(FromProbeView):
    def families(self, view: ProbeView) -> Iterator[Metric]:
        runs = CounterMetricFamily(
            "sparkdiag_hot_probe_runs",
            "Hot probes by what triggered them (threshold, thermal_reason, hot_rate) and outcome.",
            labels=[*GPU, "context", "trigger", "result"],
        )
        seen = {(g, u, c) for (g, u, c, _t, _r) in view.hot_runs}
        for gpu, uuid, context in sorted(seen):
            for trigger in TRIGGERS:
                for result in RESULTS:
                    count = view.hot_runs.get((gpu, uuid, context, trigger, result), 0)
                    runs.add_metric([gpu, uuid, context, trigger, result], count)
        yield runs
        tflops = GaugeMetricFamily(
            "sparkdiag_hot_probe_tflops",
            f"Delivered throughput in {WHICH} (TFLOPS; TOPS for integer dtypes).",
            labels=GEMM,
        )
        when = GaugeMetricFamily(
            "sparkdiag_hot_probe_timestamp_seconds",
            f"Unix time at the end of {WHICH}.",
            labels=[*GPU, "context"],
        )
        busy = GaugeMetricFamily(
            "sparkdiag_hot_probe_busy",
            f"1 when another process computed on the GPU (or it was busy) as {WHICH} started.",
            labels=[*GPU, "context"],
        )
        for (gpu, uuid, context), cycle in sorted(view.hot_last.items()):
            when.add_metric([gpu, uuid, context], cycle.finished_at)
            if cycle.busy is not None:
                busy.add_metric([gpu, uuid, context], 1.0 if cycle.busy else 0.0)
            for fig in cycle.figures:
                if fig.delivered is not None and not fig.beta:
                    tflops.add_metric([gpu, uuid, fig.dtype, fig.shape, context], fig.delivered)
        yield from (tflops, when, busy)
        yield from ratio_families("sparkdiag_hot_probe", WHICH, view.hot_last)
        yield from cycle_conditions("sparkdiag_hot_probe", WHICH, view.hot_last)
