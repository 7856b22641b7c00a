"""GPU telemetry from NVML: every metric of METRICS.md's "GPU telemetry" table.

A value the device does not support has no sample (never 0). A lost GPU keeps its
``sparkdiag_gpu_info``, ``sparkdiag_gpu_up 0`` and its XID counters (a counter that vanished
would read as a reset), and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from sparkdiag.exporter.base import GPU_LABELS, FromSnapshot, gpu_labels
from sparkdiag.exporter.families import CounterMetricFamily, GaugeMetricFamily, Metric
from sparkdiag.snapshot import GpuSample, Snapshot
from sparkdiag.sources.nvml.gpu import CLOCK_EVENT_REASONS
from sparkdiag.sources.nvml.xid import describe as describe_xid

ALL_REASONS_MASK = sum(CLOCK_EVENT_REASONS.values())

# name, help, extra label, the sample's mapping, counter?
_LABELLED: list[tuple[str, str, str, Callable[[GpuSample], Mapping[str, float]], bool]] = [
    (
        "sparkdiag_gpu_temperature_celsius",
        "Current temperature by sensor (gpu, memory).",
        "sensor",
        lambda g: g.temperature_celsius,
        False,
    ),
    (
        "sparkdiag_gpu_temperature_threshold_celsius",
        "NVML temperature thresholds.",
        "threshold",
        lambda g: g.threshold_celsius,
        False,
    ),
    (
        "sparkdiag_gpu_clock_hertz",
        "Current clock frequency in hertz.",
        "clock",
        lambda g: g.clock_hertz,
        False,
    ),
    (
        "sparkdiag_gpu_clock_max_hertz",
        "Maximum clock frequency in hertz.",
        "clock",
        lambda g: g.clock_max_hertz,
        False,
    ),
    (
        "sparkdiag_gpu_clock_applications_hertz",
        "Applications clock in hertz: the clock work runs at unless a limit holds it lower.",
        "clock",
        lambda g: g.clock_applications_hertz,
        False,
    ),
    (
        "sparkdiag_gpu_clock_default_applications_hertz",
        "Default applications clock in hertz: what a healthy GPU sustains under load.",
        "clock",
        lambda g: g.clock_default_applications_hertz,
        False,
    ),
    (
        "sparkdiag_gpu_violation_seconds",
        "Time clocks were held below the requested level, per policy, in seconds.",
        "policy",
        lambda g: g.violation_seconds,
        True,
    ),
    (
        "sparkdiag_gpu_utilization_ratio",
        "NVML utilization, 0..1.",
        "engine",
        lambda g: g.utilization_ratio,
        False,
    ),
    (
        "sparkdiag_gpu_memory_bytes",
        "Framebuffer memory in bytes; absent on unified memory.",
        "state",
        lambda g: g.memory_bytes,
        False,
    ),
    (
        "sparkdiag_gpu_pcie_link_generation",
        "GPU PCIe link generation as NVML reports it.",
        "state",
        lambda g: g.pcie_generation,
        False,
    ),
    (
        "sparkdiag_gpu_pcie_link_width",
        "GPU PCIe link width in lanes as NVML reports it.",
        "state",
        lambda g: g.pcie_width,
        False,
    ),
    (
        "sparkdiag_gpu_ecc_errors",
        "Aggregate ECC errors since the counters were last cleared.",
        "type",
        lambda g: g.ecc_errors,
        True,
    ),
    (
        "sparkdiag_gpu_remapped_rows",
        "Row remapping state (counts; pending and failure are 0/1).",
        "type",
        lambda g: g.remapped_rows,
        False,
    ),
]

_SCALAR: list[tuple[str, str, Callable[[GpuSample], float | None], bool]] = [
    ("sparkdiag_gpu_power_watts", "Power draw in watts.", lambda g: g.power_watts, False),
    (
        "sparkdiag_gpu_power_limit_watts",
        "Enforced power limit in watts.",
        lambda g: g.power_limit_watts,
        False,
    ),
    (
        "sparkdiag_gpu_energy_joules",
        "Energy consumed since the driver was loaded, in joules.",
        lambda g: g.energy_joules,
        True,
    ),
    (
        "sparkdiag_gpu_pcie_replay_errors",
        "PCIe replay counter.",
        lambda g: g.pcie_replay_errors,
        True,
    ),
    (
        "sparkdiag_gpu_performance_state",
        "Performance state, 0 (maximum) to 15.",
        lambda g: None if g.performance_state is None else float(g.performance_state),
        False,
    ),
]


def _family(
    name: str, doc: str, labels: list[str], counter: bool
) -> GaugeMetricFamily | CounterMetricFamily:
    if counter:
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


class GpuCollector(FromSnapshot):
    def families(self, snap: Snapshot) -> Iterator[Metric]:
        if not snap.gpus:
            return
        gpus = snap.gpus
        up_gpus = [g for g in gpus if g.up]

        info = GaugeMetricFamily(
            "sparkdiag_gpu_info",
            "GPU identity; value is 1.",
            labels=[
                *GPU_LABELS,
                "name",
                "pci_bus_id",
                "driver_version",
                "cuda_capability",
                "memory_model",
            ],
        )
        up = GaugeMetricFamily(
            "sparkdiag_gpu_up",
            "1 while NVML answers for this GPU, 0 once it is lost.",
            labels=GPU_LABELS,
        )
        for g in gpus:
            ident = g.identity
            info.add_metric(
                [
                    *gpu_labels(ident),
                    ident.name,
                    ident.pci_bus_id,
                    ident.driver_version,
                    ident.cuda_capability,
                    ident.memory_model,
                ],
                1,
            )
            up.add_metric(gpu_labels(ident), 1 if g.up else 0)
        yield info
        yield up

        for name, doc, label, get, counter in _LABELLED:
            fam = _family(name, doc, [*GPU_LABELS, label], counter)
            for g in up_gpus:
                for key, value in sorted(get(g).items()):
                    fam.add_metric([*gpu_labels(g.identity), key], value)
            yield fam

        for name, doc, get_value, counter in _SCALAR:
            fam = _family(name, doc, GPU_LABELS, counter)
            for g in up_gpus:
                scalar = get_value(g)
                if scalar is not None:
                    fam.add_metric(gpu_labels(g.identity), scalar)
            yield fam

        reasons = GaugeMetricFamily(
            "sparkdiag_gpu_clock_event_active",
            "Clock event (throttle) reason active now (1) or not (0); one series per reason the "
            "GPU supports.",
            labels=[*GPU_LABELS, "reason"],
        )
        for g in up_gpus:
            if g.clock_event_reasons is None:
                continue
            supported = g.supported_clock_event_reasons
            mask = ALL_REASONS_MASK if supported is None else supported
            for reason, bit in CLOCK_EVENT_REASONS.items():
                if mask & bit:
                    reasons.add_metric(
                        [*gpu_labels(g.identity), reason], 1 if g.clock_event_reasons & bit else 0
                    )
        yield reasons

        procs = GaugeMetricFamily(
            "sparkdiag_gpu_compute_processes",
            "Compute processes on the GPU, excluding sparkdiag's own probe.",
            labels=GPU_LABELS,
        )
        for g in up_gpus:
            if g.compute_pids is not None:
                others = [p for p in g.compute_pids if p not in snap.excluded_pids]
                procs.add_metric(gpu_labels(g.identity), len(others))
        yield procs

        xid = CounterMetricFamily(
            "sparkdiag_gpu_xid_errors",
            "XID events seen since the daemon started, with the severity tier and the immediate "
            "action NVIDIA's XID catalog gives the code.",
            labels=[*GPU_LABELS, "xid", "severity", "action"],
        )
        xid_last = GaugeMetricFamily(
            "sparkdiag_gpu_xid_last_timestamp_seconds",
            "Unix time of the last XID event.",
            labels=GPU_LABELS,
        )
        by_index = {g.identity.index: g.identity for g in gpus}
        for (index, code), count in sorted(snap.xid.counts.items()):
            if index in by_index:
                known = describe_xid(code)
                xid.add_metric(
                    [*gpu_labels(by_index[index]), str(code), known.tier, known.bucket], count
                )
        for index, ts in sorted(snap.xid.last_timestamp.items()):
            if index in by_index:
                xid_last.add_metric(gpu_labels(by_index[index]), ts)
        yield xid
        yield xid_last
