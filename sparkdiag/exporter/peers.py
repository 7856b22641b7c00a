"""The GPUs of this node against each other, and baselines held out of learning.

``sparkdiag_gemm_node_peer_ratio``: at each compute-bound kernel (the compute cube and the LLM
shape; not the decode shape), a GPU's delivered throughput in its last successful probe over the
median of the other GPUs of the same model in this node (same context and probe software),
present where at least two such GPUs have a figure. ``sparkdiag check`` judges the same ratios
(the median of a GPU's kernels: 3.5 % below warns, 7 % fails); across a fleet the rules compare
hour medians instead (``SparkdiagGpuSlowerThanPeers``).

``sparkdiag_gemm_baseline_held``: while a compute-bound kernel's baseline is still being learned
(the decode shape is never held), 1 when its
last run was held out of it (far below the peers and the published reference:
baseline/learning.py), 0 when it counted; absent once the baseline is frozen or pinned.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from sparkdiag.exporter.base import GPU_LABELS as GPU
from sparkdiag.exporter.base import FromProbeView
from sparkdiag.exporter.families import GaugeMetricFamily, Metric
from sparkdiag.peers.node import PeerFigure, compare_kernels
from sparkdiag.peers.ranking import COMPUTE_KINDS
from sparkdiag.scheduling.probe_state import CycleRecord, ProbeView

KERNEL = [*GPU, "dtype", "shape", "context"]


def peer_figures(records: Mapping[tuple[str, str, str], CycleRecord]) -> list[PeerFigure]:
    """Every delivered figure of the last successful cycles, as peer figures."""
    out = []
    for (gpu, uuid, context), record in sorted(records.items()):
        driver, torch, cuda = (
            str(record.software.get(k) or "") for k in ("driver", "torch", "cuda")
        )
        model, software = record.gpu_name, (driver, torch, cuda)
        out += [
            PeerFigure.of(gpu, uuid, model, context, software, f, f.delivered)
            for f in record.figures
            if f.delivered is not None and model
        ]
    return out


class PeerCollector(FromProbeView):
    def families(self, view: ProbeView) -> Iterator[Metric]:
        ratio = GaugeMetricFamily(
            "sparkdiag_gemm_node_peer_ratio",
            "Delivered throughput of this GPU's last successful probe over the median of the "
            "other GPUs of the same model in this node (same context and software), at a "
            "compute-bound kernel.",
            labels=KERNEL,
        )
        for kernel in compare_kernels(peer_figures(view.last_success)):
            if kernel.beta:
                continue
            for (gpu, uuid), value in sorted(kernel.ratios.items()):
                ratio.add_metric([gpu, uuid, kernel.dtype, kernel.shape, kernel.context], value)
        yield ratio

        held = GaugeMetricFamily(
            "sparkdiag_gemm_baseline_held",
            "While the kernel's baseline is learned: 1 when its last run was held out of it (far "
            "below the peers and the published reference), 0 when it counted.",
            labels=KERNEL,
        )
        for (gpu, uuid, context), record in sorted(view.last_success.items()):
            for fig in record.figures:
                vetted = fig.kind in COMPUTE_KINDS and fig.beta == 0 and fig.delivered is not None
                if vetted and (fig.learning or fig.held):
                    held.add_metric(
                        [gpu, uuid, fig.dtype, fig.shape, context], 1.0 if fig.held else 0.0
                    )
        yield held
