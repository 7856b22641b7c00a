"""Memory a new allocation on each GPU can get (``sparkdiag_gpu_memory_obtainable_bytes``) and
the page cache's parts (``sparkdiag_host_page_cache_bytes``).

On a unified-memory GPU (GB10) NVML has no framebuffer figures: what an allocation can get is
host memory, free plus the page cache's clean, unmapped file pages
(:func:`sparkdiag.sources.host.meminfo.obtainable`). On a dedicated-memory GPU it is NVML's free
framebuffer.
"""

from __future__ import annotations

from collections.abc import Iterator

from sparkdiag.exporter.base import GPU_LABELS, FromSnapshot, by_label, gpu_labels
from sparkdiag.exporter.families import GaugeMetricFamily, Metric
from sparkdiag.snapshot import Snapshot


class GpuMemoryCollector(FromSnapshot):
    def families(self, snap: Snapshot) -> Iterator[Metric]:
        obtainable = GaugeMetricFamily(
            "sparkdiag_gpu_memory_obtainable_bytes",
            "Memory a new allocation on this GPU can get now: NVML's free framebuffer on a "
            "dedicated-memory GPU; on unified memory (GB10) free host memory plus the page "
            "cache's clean, unmapped file pages (docs/metrics.md).",
            labels=GPU_LABELS,
        )
        host = snap.host
        for gpu in snap.gpus:
            if not gpu.up:
                continue
            if gpu.identity.memory_model == "unified":
                value = host.obtainable_bytes if host is not None else None
            else:
                value = gpu.memory_bytes.get("free")
            if value is not None:
                obtainable.add_metric(gpu_labels(gpu.identity), value)
        yield obtainable
        if host is not None and host.page_cache_bytes:
            cache = GaugeMetricFamily(
                "sparkdiag_host_page_cache_bytes",
                "The page cache by part: total (Cached + Buffers), reclaimable (clean, unmapped "
                "file pages), dirty (Dirty + Writeback), mapped, shmem (tmpfs, shared memory), "
                "unevictable; on unified-memory GPUs (GB10) it competes with CUDA allocations.",
                labels=["state"],
            )
            yield by_label(cache, host.page_cache_bytes)
