"""The dcgm-exporter-compatible series (``--compat.dcgm``) on snapshots polled from fixtures:
names, units, labels, what is left out, and that each value is its sparkdiag series converted."""

from __future__ import annotations

import dataclasses
import re
import socket
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from sparkdiag.exporter.dcgm import FIELDS, XID_ERRORS, DcgmCollector
from sparkdiag.exporter.registry import build_registry, render
from sparkdiag.snapshot import GpuProcess, ProcessIdentity, Snapshot
from sparkdiag.sources.host.hostname import node_name
from sparkdiag.sources.host.meminfo import read_host_memory
from sparkdiag.sources.nvml.fixture import FixtureBackend
from sparkdiag.sources.nvml.gpu import GpuSource
from sparkdiag.telemetry.poller import Poller
from tests.support import NVML, ROOT, ROOTFS

SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"
HOST = "node-a"
H200_LABELS = {
    "gpu": "0",
    "UUID": "GPU-979ad365-0b73-a0ac-74a2-3520b773d460",
    "pci_bus_id": "00000000:00:06.0",
    "device": "nvidia0",
    "modelName": "NVIDIA H200",
    "Hostname": HOST,
    "DCGM_FI_DRIVER_VERSION": "580.159.04",
}
GB10_LABELS = {
    "gpu": "0",
    "UUID": "GPU-5b4c1f0e-6a2d-4e8b-9c31-0d2e7f6a9b10",
    "pci_bus_id": "0000000F:01:00.0",
    "device": "nvidia0",
    "modelName": "NVIDIA GB10",
    "Hostname": HOST,
    "DCGM_FI_DRIVER_VERSION": "580.126.09",
}
NAMES = {field.name for field in FIELDS} | {XID_ERRORS}


def snapshot(path: Path, rootfs: str = "lent-vm", polls: int = 1) -> Snapshot:
    source = GpuSource(FixtureBackend(path))
    source.start()
    poller = Poller(source, None, lambda: read_host_memory(ROOTFS / rootfs), None)
    for _ in range(polls):
        snap = poller.poll_once()
    return snap


def registry(snap: Snapshot, compat: bool = True, host: str = HOST) -> CollectorRegistry:
    reg = build_registry(lambda: snap)
    if compat:  # the collector build_registry(compat_dcgm=True) adds, with a known Hostname
        reg.register(DcgmCollector(lambda: snap, host))
    return reg


def dcgm_samples(reg: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in reg.collect():
        for s in family.samples:
            if s.name.startswith("DCGM_"):
                out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(reg: CollectorRegistry, name: str, labels: dict[str, str]) -> float | None:
    return reg.get_sample_value(name, labels)


def test_off_by_default_nothing_dcgm_is_exported() -> None:
    snap = snapshot(NVML / "h200-load.json")
    reg = build_registry(lambda: snap)
    assert not dcgm_samples(reg)
    assert b"DCGM_" not in render(reg)


def test_build_registry_adds_the_collector_with_the_node_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NODE_NAME", "spark-07")
    snap = snapshot(NVML / "h200-load.json")
    reg = build_registry(lambda: snap, compat_dcgm=True)
    labels = dcgm_samples(reg)["DCGM_FI_DEV_GPU_TEMP"][0][0]
    assert labels["Hostname"] == "spark-07"
    # and the sparkdiag series are still all there, unchanged, before the DCGM ones
    plain = render(build_registry(lambda: snap))
    with_dcgm = render(reg)
    assert with_dcgm.startswith(plain)


def test_node_name_prefers_node_name_then_the_host_name() -> None:
    assert node_name({"NODE_NAME": " gpu-node-3 "}) == "gpu-node-3"
    assert node_name({}) == socket.gethostname()
    assert node_name({"NODE_NAME": ""}) == socket.gethostname()


def test_h200_load_values_in_dcgm_units() -> None:
    reg = registry(snapshot(NVML / "h200-load.json"))
    expected = {
        "DCGM_FI_DEV_SM_CLOCK": 1455.0,  # MHz, as NVML gives it
        "DCGM_FI_DEV_MEM_CLOCK": 3201.0,
        "DCGM_FI_DEV_GPU_TEMP": 60.0,
        "DCGM_FI_DEV_MEMORY_TEMP": 52.0,
        "DCGM_FI_DEV_POWER_USAGE": 692.307,  # 692307 mW
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 23871430.0,  # mJ, as NVML gives it
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 1.0,
        "DCGM_FI_DEV_GPU_UTIL": 99.0,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 24.0,
        "DCGM_FI_DEV_ENC_UTIL": 0.0,
        "DCGM_FI_DEV_FB_USED": 1010.0,  # 1059913728 B // MiB
        "DCGM_FI_DEV_FB_FREE": 142145.0,  # 149049966592 B // MiB (142145.4)
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.9342295337388201,  # GPM 93.42 %
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.17475074949065766,
        "DCGM_FI_PROF_SM_ACTIVE": 0.9624739088482822,
        "DCGM_FI_PROF_PCIE_TX_BYTES": 7273 * 1024.0,  # NVML KiB/s
        "DCGM_FI_PROF_PCIE_RX_BYTES": 15947 * 1024.0,
    }
    got = {name: value(reg, name, H200_LABELS) for name in expected}
    assert got == pytest.approx(expected, rel=0, abs=0)


def test_each_value_is_its_sparkdiag_series_converted() -> None:
    """Temperature, power and SM clock exactly; the others exactly after DCGM's unit."""
    reg = registry(snapshot(NVML / "h200-load.json"))
    ours = {"gpu": "0", "uuid": H200_LABELS["UUID"]}

    def spark(name: str, **extra: str) -> float:
        found = reg.get_sample_value(name, {**ours, **extra})
        assert found is not None, (name, extra)
        return found

    pairs = {
        "DCGM_FI_DEV_GPU_TEMP": spark("sparkdiag_gpu_temperature_celsius", sensor="gpu"),
        "DCGM_FI_DEV_MEMORY_TEMP": spark("sparkdiag_gpu_temperature_celsius", sensor="memory"),
        "DCGM_FI_DEV_POWER_USAGE": spark("sparkdiag_gpu_power_watts"),
        "DCGM_FI_DEV_SM_CLOCK": spark("sparkdiag_gpu_clock_hertz", clock="sm") / 1e6,
        "DCGM_FI_DEV_MEM_CLOCK": spark("sparkdiag_gpu_clock_hertz", clock="memory") / 1e6,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": round(
            spark("sparkdiag_gpu_energy_joules_total") * 1000
        ),
        "DCGM_FI_DEV_GPU_UTIL": round(spark("sparkdiag_gpu_utilization_ratio", engine="gpu") * 100),
        "DCGM_FI_DEV_FB_USED": spark("sparkdiag_gpu_memory_bytes", state="used") // 2**20,
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION": round(
            spark("sparkdiag_gpu_violation_seconds_total", policy="low_utilization") * 1e9
        ),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": spark("sparkdiag_gpu_activity_ratio", engine="tensor"),
        "DCGM_FI_PROF_SM_OCCUPANCY": spark("sparkdiag_gpu_sm_occupancy_ratio"),
    }
    for name, converted in pairs.items():
        assert value(reg, name, H200_LABELS) == converted, name


def test_labels_are_dcgm_exporters() -> None:
    samples = dcgm_samples(registry(snapshot(NVML / "h200-load.json")))
    # every field the lent (PCIe) H200 answers: no NVLink there, no XID yet
    nvlink = {f.name for f in FIELDS if "NVLINK" in f.name}
    assert set(samples) == NAMES - nvlink - {XID_ERRORS}
    for name, series in samples.items():
        assert [labels for labels, _ in series] == [H200_LABELS], name


def test_gb10_leaves_out_what_it_does_not_support() -> None:
    reg = registry(snapshot(NVML / "gb10-idle.json", rootfs="dgx-spark"))
    samples = dcgm_samples(reg)
    absent = {
        "DCGM_FI_DEV_MEMORY_TEMP",  # LPDDR5X has no sensor (NVML and DCGM read 0)
        "DCGM_FI_DEV_MEM_CLOCK",  # N/A
        "DCGM_FI_DEV_MEM_COPY_UTIL",  # stays 0 under load on a Spark: not a reading
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_PROF_SM_ACTIVE",  # no GPM in the GB10 fixture
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",  # integrated GPU: no NVML PCIe throughput
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        *(f.name for f in FIELDS if "NVLINK" in f.name),
        XID_ERRORS,
    }
    assert set(samples) == NAMES - absent
    assert value(reg, "DCGM_FI_DEV_GPU_TEMP", GB10_LABELS) == 36.0
    assert value(reg, "DCGM_FI_DEV_SM_CLOCK", GB10_LABELS) == 2418.0
    assert value(reg, "DCGM_FI_DEV_POWER_USAGE", GB10_LABELS) == 3.0
    assert value(reg, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", GB10_LABELS) == 1843000.0


def test_gb10_framebuffer_is_the_host_memory_it_allocates_from() -> None:
    """/proc/meminfo of the dgx-spark root: MemTotal 127600748 kB, MemAvailable 123522867 kB."""
    snap = snapshot(NVML / "gb10-idle.json", rootfs="dgx-spark")
    reg = registry(snap)
    assert snap.host is not None
    total, available = (snap.host.memory_bytes[k] for k in ("total", "available"))
    assert (total, available) == (127600748 * 1024, 123522867 * 1024)
    assert value(reg, "DCGM_FI_DEV_FB_FREE", GB10_LABELS) == 120627.0  # 123522867 kB / 1024
    assert value(reg, "DCGM_FI_DEV_FB_USED", GB10_LABELS) == 3982.0  # (total - available) / MiB
    # the sparkdiag series it comes from
    assert reg.get_sample_value("sparkdiag_host_memory_bytes", {"state": "available"}) == available
    # no framebuffer without host memory either: nothing is made up
    bare = registry(dataclasses.replace(snap, host=None))
    assert "DCGM_FI_DEV_FB_USED" not in dcgm_samples(bare)
    assert "DCGM_FI_DEV_FB_FREE" not in dcgm_samples(bare)


def test_gb10_with_memory_info_answering_the_host_total_is_still_unified() -> None:
    reg = registry(snapshot(NVML / "gb10-memtotal.json", rootfs="dgx-spark"))
    assert value(reg, "DCGM_FI_DEV_FB_USED", GB10_LABELS) == 3982.0
    assert "DCGM_FI_DEV_MEM_COPY_UTIL" not in dcgm_samples(reg)


def test_gpu_util_percent_is_whole_where_nvml_gave_a_whole_percent(tmp_path: Path) -> None:
    # 0.29 * 100 is 28.999999999999996 in floating point; DCGM reports 29
    derived = tmp_path / "util.json"
    derived.write_text(
        '{"format": "sparkdiag-nvml-fixture/1", "base": "%s",'
        ' "devices": [{"from": 0, "set": {"utilization": {"gpu": 29, "memory": 57}}}]}'
        % (NVML / "h200-idle.json")
    )
    reg = registry(snapshot(derived))
    assert value(reg, "DCGM_FI_DEV_GPU_UTIL", H200_LABELS) == 29.0
    assert value(reg, "DCGM_FI_DEV_MEM_COPY_UTIL", H200_LABELS) == 57.0


def test_eight_gpus_each_with_its_index_and_device() -> None:
    samples = dcgm_samples(registry(snapshot(NVML / "h200-x8.json")))
    temps = samples["DCGM_FI_DEV_GPU_TEMP"]
    assert [(labels["gpu"], labels["device"]) for labels, _ in temps] == [
        (str(i), f"nvidia{i}") for i in range(8)
    ]
    assert len({labels["UUID"] for labels, _ in temps}) == 8
    assert len({labels["pci_bus_id"] for labels, _ in temps}) == 8


def test_nvlink_error_totals_sum_the_links() -> None:
    snap = snapshot(SCENARIOS / "nvlink-degraded.json", rootfs="gpu-host")
    reg = registry(snap)
    for g in snap.gpus:
        labels = {**H200_LABELS, "gpu": str(g.identity.index), "UUID": g.identity.uuid}
        labels.update(pci_bus_id=g.identity.pci_bus_id, device=f"nvidia{g.identity.index}")
        for name, kind in (
            ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "replay"),
            ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "crc_flit"),
        ):
            total = sum(link.errors[kind] for link in g.nvlinks)
            assert len(g.nvlinks) == 18
            assert value(reg, name, labels) == total, (g.identity.index, name)


# -- pod labels ------------------------------------------------------------------------------


def _with_processes(snap: Snapshot, pods: list[tuple[int, str]]) -> Snapshot:
    def proc(pid: int, pod: str) -> GpuProcess:
        who = ProcessIdentity(name="python3", user="root", container_id="", pod_uid=pod)
        return GpuProcess(pid=pid, used_memory_bytes=1e9, sm_utilization_ratio=0.5, identity=who)

    gpu = dataclasses.replace(snap.gpus[0], processes=tuple(proc(pid, pod) for pid, pod in pods))
    return dataclasses.replace(snap, gpus=(gpu,))


POD_A = "3f2e1d0c-b9a8-4f7e-8d6c-5b4a39281706"
POD_B = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


@pytest.mark.parametrize(
    ("pods", "excluded", "expected"),
    [
        ([(10, POD_A), (11, POD_A)], frozenset(), POD_A),  # one pod holds the GPU
        ([(10, POD_A), (11, "")], frozenset(), POD_A),  # beside a process outside any pod
        ([(10, POD_A), (11, POD_B)], frozenset(), None),  # two pods share it: no pod label
        ([(10, POD_A), (11, POD_B)], frozenset({11}), POD_A),  # 11 is sparkdiag's own probe
        ([(10, "")], frozenset(), None),
        ([], frozenset(), None),
    ],
)
def test_pod_uid_where_every_process_on_the_gpu_runs_in_one_pod(
    pods: list[tuple[int, str]], excluded: frozenset[int], expected: str | None
) -> None:
    base = snapshot(NVML / "h200-load.json")
    snap = dataclasses.replace(_with_processes(base, pods), excluded_pids=excluded)
    samples = dcgm_samples(registry(snap))
    for name, series in samples.items():
        (labels, _) = series[0]
        assert labels.get("pod_uid") == expected, name


def test_pod_uid_from_the_cgroup_of_a_real_process_tree() -> None:
    """The derived two-H200 fixture with per-process metrics over gpu-host's /proc: GPU 0 runs
    a docker process, a process of Kubernetes pod 3f2e1d0c-... and one /proc does not show;
    GPU 1 a docker and a native process."""
    from sparkdiag.sources.host.procfs import ProcessIdentities
    from sparkdiag.sources.nvml.activity import ProcessOptions

    root = ROOTFS / "gpu-host"
    options = ProcessOptions(10, ProcessIdentities(root))
    source = GpuSource(FixtureBackend(SCENARIOS / "nvlink-degraded.json"), processes=options)
    assert source.start()
    snap = Poller(source, None, None, None).poll_once()
    temps = dcgm_samples(registry(snap))["DCGM_FI_DEV_GPU_TEMP"]
    assert [labels.get("pod_uid") for labels, _ in temps] == [POD_A, None]


# -- XID, lost GPUs ---------------------------------------------------------------------------


def test_xid_is_the_last_code_with_err_code_and_survives_the_loss() -> None:
    scripted = NVML / "h200-scripted.json"  # XID 79 at poll 5, GPU lost at poll 12
    assert XID_ERRORS not in dcgm_samples(registry(snapshot(scripted, polls=4)))
    after = dcgm_samples(registry(snapshot(scripted, polls=7)))
    assert after[XID_ERRORS] == [({**H200_LABELS, "err_code": "79"}, 79.0)]
    lost = dcgm_samples(registry(snapshot(scripted, polls=12)))
    # a lost GPU answers nothing; its last XID stays, as sparkdiag's own XID series do
    assert set(lost) == {XID_ERRORS}
    assert lost[XID_ERRORS] == [({**H200_LABELS, "err_code": "79"}, 79.0)]


def test_no_hostname_no_label() -> None:
    reg = registry(snapshot(NVML / "h200-idle.json"), host="")
    labels = dcgm_samples(reg)["DCGM_FI_DEV_GPU_TEMP"][0][0]
    assert "Hostname" not in labels
    assert labels["device"] == "nvidia0"


def test_nothing_without_nvml() -> None:
    snap = snapshot(NVML / "no-nvml.json")
    assert not snap.nvml_up
    assert not dcgm_samples(registry(snap))


# -- the exposition ---------------------------------------------------------------------------


def test_exposition_parses_and_counters_keep_dcgm_names() -> None:
    text = render(registry(snapshot(NVML / "h200-load.json"))).decode()
    families = {
        f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("DCGM_")
    }
    counters = {f.name for f in FIELDS if f.counter}
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in counters
    for name in counters:
        assert f"# TYPE {name} untyped\n" in text
        assert not re.search(rf"^{name}_total", text, re.MULTILINE)
        assert families[name].type == "unknown"
    assert families["DCGM_FI_DEV_GPU_TEMP"].type == "gauge"
    assert re.search(r"^DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\{.*\} 2\.387143e\+07$", text, re.M)


def test_every_field_is_in_the_mapping_table_of_the_docs() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    section = text[text.index("## dcgm-exporter compatible series") :]
    first_cells = re.findall(r"^\| (`DCGM_FI_[^|]+)\|", section, re.MULTILINE)
    documented = {name for cell in first_cells for name in re.findall(r"`(DCGM_FI_\w+)`", cell)}
    assert documented >= NAMES, sorted(NAMES - documented)
    # and every row that says "not exported" names a field that is not
    not_exported = [line for line in section.splitlines() if "| not exported |" in line]
    for line in not_exported:
        (name,) = re.findall(r"^\| `(DCGM_FI_\w+)`", line)
        assert name not in NAMES, name
    assert len(not_exported) == 4
