"""``gpu-memory``: the memory a new allocation on each GPU can get now, before a model load.

On a unified-memory GPU (GB10) that is host memory: free memory plus the page cache's clean,
unmapped file pages (:func:`sparkdiag.sources.host.meminfo.obtainable`), with the processes that
hold the GPU and their resident memory read from /proc (NVML reports no framebuffer there).
The page cache gives its pages back to the kernel's allocator, but a CUDA allocation on GB10
has failed with NV_ERR_NO_MEMORY while it held the memory (tobias-weiss.org, "Taming OOM on
DGX Spark"; sovgrid.org, "Five DGX Spark disasters": an OOM at 95 GB until the caches were
dropped); so a model larger than what is free without the cache needs the cache dropped
first. On a dedicated-memory GPU it is NVML's free framebuffer.
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkdiag.check.gpu_checks import each_gpu
from sparkdiag.check.model import CheckContext, CheckResult
from sparkdiag.check.model import gpu_index as _idx
from sparkdiag.snapshot import GpuSample
from sparkdiag.sources.host.procfs import DeviceHolder

GIB = 1024.0**3
# What a new allocation can get, as a share of the memory: under 10 % fails (the
# SparkdiagGpuMemoryObtainableLow alert's figure), under 25 % warns.
OBTAINABLE_FAIL = 0.10
OBTAINABLE_WARN = 0.25
# The page cache that drop_caches frees (clean, or dirty until sync) at 20 % of the memory or
# more: advise dropping it before a model load that needs more than the free memory
# (host_checks.UNIFIED_WARN_CACHE, the same figure).
CACHE_WARN = 0.20
DROP_CACHES = "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches"
SHOWN_HOLDERS = 3


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def _holders(holders: Sequence[DeviceHolder]) -> str:
    shown = []
    for h in holders[:SHOWN_HOLDERS]:
        rss = f" {_gib(h.rss_bytes)} resident" if h.rss_bytes is not None else ""
        shown.append(f"pid {h.pid} ({h.name}){rss}")
    more = f" and {len(holders) - SHOWN_HOLDERS} more" if len(holders) > SHOWN_HOLDERS else ""
    return ", ".join(shown) + more


def _dedicated(gpu: GpuSample) -> CheckResult:
    free, total = gpu.memory_bytes.get("free"), gpu.memory_bytes.get("total")
    if free is None or not total:
        return CheckResult("gpu-memory", "skip", "NVML reports no memory figures", gpu=_idx(gpu))
    text = f"a new allocation can get {_gib(free)} of {_gib(total)} (NVML free)"
    data = {"obtainable_bytes": free, "total_bytes": total, "model": "dedicated"}
    if free < OBTAINABLE_FAIL * total:
        return CheckResult(
            "gpu-memory",
            "warn",
            text,
            "another process holds the GPU's memory: see the idle row (nvidia-smi "
            "--query-compute-apps=pid,used_memory --format=csv)",
            _idx(gpu),
            data,
        )
    return CheckResult("gpu-memory", "pass", text, gpu=_idx(gpu), data=data)


def gpu_memory(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """What a new allocation can get now: on unified memory free memory plus clean, unmapped
    page cache, and the page cache to drop before a large model load."""
    if gpu.identity.memory_model != "unified":
        return _dedicated(gpu)
    host = ctx.snapshot.host
    total = host.memory_bytes.get("total") if host is not None else None
    free = host.memory_bytes.get("free") if host is not None else None
    got = host.obtainable_bytes if host is not None else None
    if host is None or not total or free is None or got is None:
        return CheckResult(
            "gpu-memory", "skip", "/proc/meminfo lacks the fields needed", gpu=_idx(gpu)
        )
    cache = host.page_cache_bytes
    holders = ctx.device_holders or ()
    data = {
        "model": "unified",
        "obtainable_bytes": got,
        "free_bytes": free,
        "total_bytes": total,
        "page_cache_bytes": dict(cache),
        "processes": [
            {
                "pid": h.pid,
                "name": h.name,
                "devices": list(h.devices),
                "rss_bytes": h.rss_bytes,
                "mapped_bytes": h.mapped_bytes,
            }
            for h in holders
        ],
    }
    reclaimable = cache.get("reclaimable", 0.0)
    text = (
        f"a new allocation can get {_gib(got)} of {_gib(total)} ({_gib(free)} free + "
        f"{_gib(reclaimable)} of clean page cache)"
    )
    if holders:
        text += f"; holding the GPU: {_holders(holders)}"
    cached = cache.get("total", 0.0)
    # what drop_caches gives back: the clean unmapped file pages, and the dirty ones once sync
    # has written them. The total also holds tmpfs and /dev/shm (Shmem) and mapped pages,
    # which it never frees: 60 GiB of Shmem advised a drop_caches that freed 0.5 (a review)
    droppable = reclaimable + cache.get("dirty", 0.0)
    if got < OBTAINABLE_FAIL * total:
        return CheckResult(
            "gpu-memory",
            "fail",
            text,
            "stop or shrink what holds the memory (the processes above; a model server's GPU "
            f"memory share or KV cache), then {DROP_CACHES}",
            _idx(gpu),
            data,
        )
    if droppable >= CACHE_WARN * total:
        return CheckResult(
            "gpu-memory",
            "warn",
            f"the page cache holds {_gib(cached)} of {_gib(total)}; {text}",
            f"{DROP_CACHES} before loading a model larger than {_gib(free)} (what is free "
            "without the cache: CUDA allocations on GB10 have failed while the cache held the "
            "memory)",
            _idx(gpu),
            data,
        )
    if got < OBTAINABLE_WARN * total:
        return CheckResult(
            "gpu-memory",
            "warn",
            text,
            "little is left for a model: stop or shrink what holds the memory",
            _idx(gpu),
            data,
        )
    return CheckResult("gpu-memory", "pass", text, gpu=_idx(gpu), data=data)


check_gpu_memory = each_gpu("gpu-memory", gpu_memory)
