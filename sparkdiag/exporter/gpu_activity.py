"""GPU activity and interconnects: GPM activity (SM, tensor, DRAM) and SM occupancy, encoder and
decoder utilization, PCIe throughput, and NVLink state, errors and data per link.

Each series exists only where the GPU reports the value: no GPM before Hopper, no NVLink on a
PCIe card without bridges, no NVML PCIe throughput on an integrated GPU (GB10).
"""

from __future__ import annotations

from collections.abc import Iterator

from sparkdiag.exporter.base import GPU_LABELS, FromSnapshot, gpu_labels
from sparkdiag.exporter.families import CounterMetricFamily, GaugeMetricFamily, Metric
from sparkdiag.snapshot import Snapshot


class GpuActivityCollector(FromSnapshot):
    def families(self, snap: Snapshot) -> Iterator[Metric]:
        gpus = [g for g in snap.gpus if g.up]

        activity = GaugeMetricFamily(
            "sparkdiag_gpu_activity_ratio",
            "Fraction of time (0..1) over the last poll interval, from GPM: sm = SMs busy, "
            "tensor = any tensor pipe busy, dram = DRAM bandwidth used of its maximum.",
            labels=[*GPU_LABELS, "engine"],
        )
        occupancy = GaugeMetricFamily(
            "sparkdiag_gpu_sm_occupancy_ratio",
            "Resident warps over the maximum the SMs hold (0..1), over the last poll interval.",
            labels=GPU_LABELS,
        )
        video = GaugeMetricFamily(
            "sparkdiag_gpu_video_utilization_ratio",
            "Encoder and decoder utilization, 0..1.",
            labels=[*GPU_LABELS, "engine"],
        )
        pcie = GaugeMetricFamily(
            "sparkdiag_gpu_pcie_throughput_bytes_per_second",
            "GPU PCIe traffic in bytes per second: from GPM between two polls (Hopper and "
            "later), else over NVML's 20 ms window (read every 10 s).",
            labels=[*GPU_LABELS, "direction"],
        )
        for g in gpus:
            labels = gpu_labels(g.identity)
            for engine, value in sorted(g.activity_ratio.items()):
                activity.add_metric([*labels, engine], value)
            if g.sm_occupancy_ratio is not None:
                occupancy.add_metric(labels, g.sm_occupancy_ratio)
            for engine, value in sorted(g.video_utilization_ratio.items()):
                video.add_metric([*labels, engine], value)
            for direction, value in sorted(g.pcie_throughput_bytes_per_second.items()):
                pcie.add_metric([*labels, direction], value)
        yield activity
        yield occupancy
        yield video
        yield pcie

        up = GaugeMetricFamily(
            "sparkdiag_gpu_nvlink_up",
            "1 while the NVLink is active, 0 when it is not; one series per link NVML reports.",
            labels=[*GPU_LABELS, "link"],
        )
        errors = CounterMetricFamily(
            "sparkdiag_gpu_nvlink_errors",
            "NVLink data-link errors since the counters were last reset: replay, recovery, "
            "crc_flit, crc_data.",
            labels=[*GPU_LABELS, "link", "type"],
        )
        data = CounterMetricFamily(
            "sparkdiag_gpu_nvlink_data_bytes",
            "NVLink payload bytes since the driver loaded, per direction (tx, rx).",
            labels=[*GPU_LABELS, "link", "direction"],
        )
        for g in gpus:
            labels = gpu_labels(g.identity)
            for link in g.nvlinks:
                name = str(link.link)
                up.add_metric([*labels, name], 1 if link.up else 0)
                for kind, count in sorted(link.errors.items()):
                    errors.add_metric([*labels, name, kind], count)
                for direction, value in sorted(link.data_bytes.items()):
                    data.add_metric([*labels, name, direction], value)
        yield up
        yield errors
        yield data
