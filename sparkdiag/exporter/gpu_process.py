"""Per-process GPU metrics (opt-in, ``--process-metrics``): memory and SM utilization of the
top processes of each GPU, labelled with who runs them.

Series exist while the process is on the GPU; sparkdiag's own probe workers are left out. A
label that cannot be read (a process this PID namespace does not show, a process outside any
container) is the empty string; ``sparkdiag_gpu_compute_processes_unseen`` counts the processes
that /proc here does not show at all.
"""

from __future__ import annotations

from collections.abc import Iterator

from sparkdiag.exporter.base import GPU_LABELS, FromSnapshot, gpu_labels
from sparkdiag.exporter.families import GaugeMetricFamily, Metric
from sparkdiag.snapshot import Snapshot

PROCESS_LABELS = [*GPU_LABELS, "pid", "process", "user", "container_id", "pod_uid"]


class GpuProcessCollector(FromSnapshot):
    def families(self, snap: Snapshot) -> Iterator[Metric]:
        memory = GaugeMetricFamily(
            "sparkdiag_gpu_process_memory_bytes",
            "GPU memory used by one compute process, in bytes (the top processes by memory).",
            labels=PROCESS_LABELS,
        )
        sm = GaugeMetricFamily(
            "sparkdiag_gpu_process_sm_utilization_ratio",
            "SM utilization of one compute process over the last sample window, 0..1.",
            labels=PROCESS_LABELS,
        )
        unseen = GaugeMetricFamily(
            "sparkdiag_gpu_compute_processes_unseen",
            "Compute processes NVML lists that /proc here does not show (another PID "
            "namespace): they carry no name, user or container.",
            labels=GPU_LABELS,
        )
        for g in snap.gpus:
            if not g.up or g.processes is None:
                continue
            for p in g.processes:
                if p.pid in snap.excluded_pids:
                    continue
                who = p.identity
                labels = [
                    *gpu_labels(g.identity),
                    str(p.pid),
                    who.name if who else "",
                    who.user if who else "",
                    who.container_id if who else "",
                    who.pod_uid if who else "",
                ]
                if p.used_memory_bytes is not None:
                    memory.add_metric(labels, p.used_memory_bytes)
                if p.sm_utilization_ratio is not None:
                    sm.add_metric(labels, p.sm_utilization_ratio)
            if g.processes_unseen is not None:
                unseen.add_metric(gpu_labels(g.identity), g.processes_unseen)
        yield memory
        yield sm
        yield unseen
