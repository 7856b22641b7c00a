"""What a new allocation can get: /proc/meminfo's parts, the processes holding the GPU, the
gpu-memory row, the collector, and the rules that hold the Python figures (dtypes, 10 %)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from sparkdiag.check import memory_checks
from sparkdiag.check.host_checks import check_unified_memory
from sparkdiag.check.memory_checks import check_gpu_memory
from sparkdiag.exporter.memory import GpuMemoryCollector
from sparkdiag.native import dtypes
from sparkdiag.snapshot import HostSample
from sparkdiag.sources.host.meminfo import meminfo_bytes, obtainable, read_host_memory
from sparkdiag.sources.host.procfs import device_holders
from tests.support import ROOT, ROOTFS
from tests.support.check import NVML, SYSFS, context, only, poll

GIB = 1024**3
SPARK = ROOTFS / "dgx-spark-vllm"
RULES = (ROOT / "prometheus" / "sparkdiag-rules.yml").read_text(encoding="utf-8")


def test_obtainable_is_free_plus_clean_unmapped_file_pages() -> None:
    host = read_host_memory(SPARK)
    assert host.obtainable_bytes is not None
    # 40 GiB free + (61.5 GiB file LRU - 1.5 GiB dirty - 9 GiB mapped)
    assert round(host.obtainable_bytes / GIB, 2) == 91.09
    parts = {k: round(v / GIB, 2) for k, v in host.page_cache_bytes.items()}
    assert parts == {
        "total": 62.09,
        "reclaimable": 51.09,
        "dirty": 1.5,
        "mapped": 9.0,
        "shmem": 0.5,
        "unevictable": 0.03,
    }
    # MemAvailable counts the dirty and mapped pages too: it says more than can be had
    assert host.memory_bytes["available"] > host.obtainable_bytes


def test_obtainable_never_counts_more_than_the_file_lists_and_needs_its_fields() -> None:
    text = (
        "MemFree: 1000 kB\nActive(file): 100 kB\nInactive(file): 50 kB\nDirty: 80 kB\n"
        "Writeback: 40 kB\nMapped: 90 kB\nCached: 400 kB\nShmem: 250 kB\n"
    )
    got, parts = obtainable(meminfo_bytes(text))
    assert got == 1000 * 1024  # dirty + mapped exceed the lists: nothing comes back
    assert parts["reclaimable"] == 0 and parts["shmem"] == 250 * 1024
    got, parts = obtainable(meminfo_bytes("MemFree: 1000 kB\nCached: 400 kB\n"))
    assert got is None and parts == {"total": 400 * 1024}


def test_a_kernel_without_the_fields_leaves_obtainable_out() -> None:
    host = read_host_memory(ROOTFS / "dgx-spark")  # the older fixture: no LRU fields
    assert host.obtainable_bytes is None


def test_processes_holding_the_gpu_from_proc() -> None:
    holders = device_holders(SPARK)
    assert [(h.pid, h.name) for h in holders] == [(3345, "VLLM::EngineCor"), (3210, "python3")]
    engine = holders[0]
    assert engine.devices == ("/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl")
    assert engine.rss_bytes == 17 * GIB
    assert engine.mapped_bytes == 16 * GIB + 4 * 1024**2
    assert device_holders(ROOTFS / "missing") == []


def test_an_unreadable_rollup_falls_back_to_status(tmp_path: Path) -> None:
    proc = tmp_path / "proc" / "77"
    (proc / "fd").mkdir(parents=True)
    (proc / "fd" / "3").symlink_to("/dev/nvidia0")
    (proc / "comm").write_text("job\n")
    (proc / "status").write_text("Name:\tjob\nVmRSS:\t2048 kB\n")
    (holder,) = device_holders(tmp_path)
    assert (holder.rss_bytes, holder.mapped_bytes) == (2048 * 1024, None)


def _spark(host: HostSample | None = None, holders: bool = True) -> object:
    snap = poll(NVML / "gb10-idle.json", sysfs=SYSFS / "dgx-spark", rootfs=SPARK, host=host)
    return context(snap, device_holders=tuple(device_holders(SPARK)) if holders else None)


def test_gpu_memory_row_of_a_spark_whose_page_cache_holds_most_of_memory() -> None:
    r = only(check_gpu_memory(_spark()))  # type: ignore[arg-type]
    assert r.status == "warn"
    assert r.finding.startswith(
        "the page cache holds 62.1 GiB of 121.7 GiB; a new allocation can get 91.1 GiB of "
        "121.7 GiB (40.0 GiB free + 51.1 GiB of clean page cache); holding the GPU: pid 3345 "
        "(VLLM::EngineCor) 17.0 GiB resident"
    )
    assert r.action.startswith(
        "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches before loading a model larger than "
        "40.0 GiB"
    )
    assert r.data["processes"][0]["mapped_bytes"] == 16 * GIB + 4 * 1024**2
    # the unified-memory row leaves the page cache's advice to this one
    assert only(check_unified_memory(_spark())).status == "pass"  # type: ignore[arg-type]


def _host(free: float, reclaimable: float, cache: float) -> HostSample:
    return HostSample(
        memory_bytes={"total": 121.7 * GIB, "free": free * GIB, "available": free * GIB},
        obtainable_bytes=(free + reclaimable) * GIB,
        page_cache_bytes={"total": cache * GIB, "reclaimable": reclaimable * GIB},
    )


def test_gpu_memory_thresholds() -> None:
    assert only(check_gpu_memory(_spark(_host(100, 3, 4), False))).status == "pass"  # type: ignore[arg-type]
    low = only(check_gpu_memory(_spark(_host(10, 1, 2), False)))  # type: ignore[arg-type]
    assert low.status == "fail" and "stop or shrink" in low.action
    assert only(check_gpu_memory(_spark(_host(25, 2, 4), False))).status == "warn"  # type: ignore[arg-type]
    # near miss: 12.2 of 121.7 is just above 10 %, and still under 25 %
    assert only(check_gpu_memory(_spark(_host(12, 0.2, 1), False))).status == "warn"  # type: ignore[arg-type]


def test_no_drop_caches_advice_for_a_cache_it_cannot_free() -> None:
    """A page cache of 62 GiB, 60 of it tmpfs and /dev/shm (Shmem), warned and advised a
    drop_caches that frees 0.5 GiB (found in a review): the advice follows what it frees."""
    shm = HostSample(
        memory_bytes={"total": 121.7 * GIB, "free": 55 * GIB, "available": 55 * GIB},
        obtainable_bytes=55.5 * GIB,
        page_cache_bytes={"total": 62 * GIB, "reclaimable": 0.5 * GIB, "shmem": 60 * GIB},
    )
    r = only(check_gpu_memory(_spark(shm, False)))  # type: ignore[arg-type]
    assert r.status == "pass" and "drop_caches" not in r.action
    dirty = replace(shm, page_cache_bytes={"total": 62 * GIB, "reclaimable": 10 * GIB,
                                           "dirty": 20 * GIB})  # fmt: skip
    r = only(check_gpu_memory(_spark(dirty, False)))  # type: ignore[arg-type]
    assert r.status == "warn" and r.action.startswith("sync; echo 3")  # sync makes it clean


def test_gpu_memory_on_a_dedicated_gpu_is_nvml_free() -> None:
    r = only(check_gpu_memory(context(poll(NVML / "h200-idle.json"))))
    assert r.status == "pass" and r.finding.endswith("(NVML free)")
    assert r.data["model"] == "dedicated"


def test_the_collector_exports_obtainable_for_both_kinds() -> None:
    registry = CollectorRegistry(auto_describe=False)
    spark = poll(NVML / "gb10-idle.json", sysfs=SYSFS / "dgx-spark", rootfs=SPARK)
    registry.register(GpuMemoryCollector(lambda: spark))
    uuid = spark.gpus[0].identity.uuid
    got = registry.get_sample_value(
        "sparkdiag_gpu_memory_obtainable_bytes", {"gpu": "0", "uuid": uuid}
    )
    assert got == spark.host.obtainable_bytes  # type: ignore[union-attr]
    assert registry.get_sample_value("sparkdiag_host_page_cache_bytes", {"state": "dirty"}) == (
        1.5 * GIB
    )
    h200 = poll(NVML / "h200-idle.json")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuMemoryCollector(lambda: h200))
    labels = {"gpu": "0", "uuid": h200.gpus[0].identity.uuid}
    free = h200.gpus[0].memory_bytes["free"]
    assert registry.get_sample_value("sparkdiag_gpu_memory_obtainable_bytes", labels) == free
    registry = CollectorRegistry(auto_describe=False)
    no_host = replace(spark, host=None)
    registry.register(GpuMemoryCollector(lambda: no_host))
    assert (
        registry.get_sample_value(
            "sparkdiag_gpu_memory_obtainable_bytes", {"gpu": "0", "uuid": uuid}
        )
        is None
    )


def _rule(name: str) -> str:
    start = RULES.index(f"- alert: {name}")
    return RULES[start : RULES.index("annotations:", start)]


def test_the_rules_hold_the_python_figures() -> None:
    slower = _rule("SparkdiagDtypeSlowerThanWider")
    for narrow, wide in dtypes.PAIRS:
        assert f"sparkdiag:gemm_tflops:{narrow}_over_{wide}" in slower
        assert f'"dtype", "{narrow}"' in slower and f'"wider", "{wide}"' in slower
        record = RULES.index(f"- record: sparkdiag:gemm_tflops:{narrow}_over_{wide}")
        body = RULES[record : record + 400]
        assert f'dtype="{narrow}"' in body and f'dtype="{wide}"' in body
    assert slower.count(f"< {dtypes.SLOWER:g}") == len(dtypes.PAIRS)
    decode = re.escape('{shape!~"([1-9]|[12][0-9]|3[0-2])x[0-9]+x[0-9]+"}')
    assert len(re.findall(decode, slower)) == len(dtypes.PAIRS)
    assert dtypes.DECODE_M == 32
    low = _rule("SparkdiagGpuMemoryObtainableLow")
    assert f"< {memory_checks.OBTAINABLE_FAIL:.2f}" in low
    assert 'memory_model="unified"' in low
