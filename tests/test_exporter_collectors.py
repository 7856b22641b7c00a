"""The exporter's collectors on snapshots polled from fixtures, read back sample by sample."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from sparkdiag import __version__
from sparkdiag.exporter.gpu import GpuCollector
from sparkdiag.exporter.registry import build_registry, render
from sparkdiag.snapshot import ExecutionContext, HostSample, Snapshot
from sparkdiag.sources.host.dmi import read_platform
from sparkdiag.sources.host.meminfo import read_host_memory
from sparkdiag.sources.host.sysfs import PcieSource
from sparkdiag.sources.nvml.fixture import FixtureBackend
from sparkdiag.sources.nvml.gpu import CLOCK_EVENT_REASONS, GpuSource
from sparkdiag.telemetry.poller import Poller

SPARK_SYSFS = Path(__file__).parent / "fixtures" / "sysfs" / "dgx-spark"
GX10_SYSFS = Path(__file__).parent / "fixtures" / "sysfs" / "asus-gx10"
ROOTFS = Path(__file__).parent / "fixtures" / "rootfs"
H200 = {"gpu": "0", "uuid": "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"}
GB10 = {"gpu": "0", "uuid": "GPU-5b4c1f0e-6a2d-4e8b-9c31-0d2e7f6a9b10"}
NATIVE = ExecutionContext(context="native", runtime="none", evidence=("test",))
HOST = HostSample(
    memory_bytes={"total": 128849018880.0, "available": 100e9, "free": 90e9, "cached": 5e9}
)
POLL_TIME = 1764434372.25


def _snapshot(
    path: Path,
    polls: int = 1,
    excluded: frozenset[int] = frozenset(),
    context: ExecutionContext | None = NATIVE,
    sysfs: Path = SPARK_SYSFS,
    read_host: Callable[[], HostSample] = lambda: HOST,
) -> Snapshot:
    source = GpuSource(FixtureBackend(path))
    source.start()
    poller = Poller(
        source,
        read_pcie=PcieSource(sysfs).read,
        read_host=read_host,
        context=context,
        excluded_pids=lambda: excluded,
        clock=lambda: POLL_TIME,
        platform=read_platform(sysfs),
    )
    for _ in range(polls):
        snapshot = poller.poll_once()
    return snapshot


def _registry(snapshot: Snapshot | None) -> CollectorRegistry:
    return build_registry(lambda: snapshot)


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample called ``name``, keyed by its sorted labels."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == name
    }


@pytest.fixture
def fixture_registry(nvml_fixture: Callable[[str], Path]) -> Callable[..., CollectorRegistry]:
    def build(name: str, **kwargs: object) -> CollectorRegistry:
        return _registry(_snapshot(nvml_fixture(name), **kwargs))  # type: ignore[arg-type]

    return build


# ---- GPU identity and state -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "gpu", "info"),
    [
        ("h200-idle", H200, ("NVIDIA H200", "00000000:00:06.0", "580.159.04", "9.0", "dedicated")),
        ("gb10-idle", GB10, ("NVIDIA GB10", "0000000F:01:00.0", "580.126.09", "12.1", "unified")),
    ],
    ids=["h200", "gb10"],
)
def test_gpu_info_and_up(
    fixture_registry: Callable[..., CollectorRegistry],
    fixture: str,
    gpu: dict[str, str],
    info: tuple[str, str, str, str, str],
) -> None:
    registry = fixture_registry(fixture)
    keys = ("name", "pci_bus_id", "driver_version", "cuda_capability", "memory_model")
    labels = {**gpu, **dict(zip(keys, info, strict=True))}
    assert registry.get_sample_value("sparkdiag_gpu_info", labels) == 1.0
    assert len(_samples(registry, "sparkdiag_gpu_info")) == 1
    assert registry.get_sample_value("sparkdiag_gpu_up", gpu) == 1.0


def test_temperatures_and_thresholds(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    registry = fixture_registry("h200-idle")
    temp = "sparkdiag_gpu_temperature_celsius"
    assert registry.get_sample_value(temp, {**H200, "sensor": "gpu"}) == 36.0
    assert registry.get_sample_value(temp, {**H200, "sensor": "memory"}) == 39.0
    threshold = "sparkdiag_gpu_temperature_threshold_celsius"
    expected = {"shutdown": 95.0, "slowdown": 89.0, "memory_max": 95.0, "gpu_max": 87.0}
    for name, value in expected.items():
        assert registry.get_sample_value(threshold, {**H200, "threshold": name}) == value


def test_clocks(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    registry = fixture_registry("h200-idle")
    assert registry.get_sample_value("sparkdiag_gpu_clock_hertz", {**H200, "clock": "sm"}) == 345e6
    assert (
        registry.get_sample_value("sparkdiag_gpu_clock_hertz", {**H200, "clock": "memory"})
        == 3201e6
    )
    assert (
        registry.get_sample_value("sparkdiag_gpu_clock_max_hertz", {**H200, "clock": "sm"})
        == 1980e6
    )
    assert len(_samples(registry, "sparkdiag_gpu_clock_hertz")) == 4


def test_clock_event_active_per_supported_reason(
    fixture_registry: Callable[..., CollectorRegistry],
) -> None:
    registry = fixture_registry("h200-idle")
    series = _samples(registry, "sparkdiag_gpu_clock_event_active")
    assert len(series) == 9  # supported mask 511: all nine reasons
    for reason in CLOCK_EVENT_REASONS:
        value = registry.get_sample_value(
            "sparkdiag_gpu_clock_event_active", {**H200, "reason": reason}
        )
        assert value == (1.0 if reason == "gpu_idle" else 0.0), reason


def test_clock_event_active_under_load(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    registry = fixture_registry("h200-load")
    active = {
        dict(labels)["reason"]
        for labels, value in _samples(registry, "sparkdiag_gpu_clock_event_active").items()
        if value == 1.0
    }
    assert active == {"sw_power_cap"}


def test_clock_event_series_limited_to_supported_reasons(
    derive_fixture: Callable[..., Path],
) -> None:
    path = derive_fixture(
        "h200-idle", devices=[{"from": 0, "set": {"supported_clock_event_reasons": 0x25}}]
    )
    registry = _registry(_snapshot(path))
    reasons = {
        dict(labels)["reason"]: value
        for labels, value in _samples(registry, "sparkdiag_gpu_clock_event_active").items()
    }
    assert reasons == {"gpu_idle": 1.0, "sw_power_cap": 0.0, "sw_thermal_slowdown": 0.0}


def test_violation_counter(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    registry = fixture_registry("h200-idle")
    name = "sparkdiag_gpu_violation_seconds_total"
    assert registry.get_sample_value(name, {**H200, "policy": "low_utilization"}) == pytest.approx(
        24.348871232, rel=1e-12
    )
    assert registry.get_sample_value(name, {**H200, "policy": "power"}) == 0.0
    assert len(_samples(registry, name)) == 6
    assert (
        registry.get_sample_value(
            "sparkdiag_gpu_violation_seconds", {**H200, "policy": "low_utilization"}
        )
        is None
    )


def test_power_and_energy(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    registry = fixture_registry("h200-idle")
    assert registry.get_sample_value("sparkdiag_gpu_power_watts", H200) == pytest.approx(77.935)
    assert registry.get_sample_value("sparkdiag_gpu_power_limit_watts", H200) == 700.0
    assert registry.get_sample_value("sparkdiag_gpu_energy_joules_total", H200) == pytest.approx(
        2832.298, rel=1e-12
    )
    assert registry.get_sample_value("sparkdiag_gpu_energy_joules", H200) is None


def test_utilization(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    registry = fixture_registry("h200-load")
    name = "sparkdiag_gpu_utilization_ratio"
    assert registry.get_sample_value(name, {**H200, "engine": "gpu"}) == 0.99
    assert registry.get_sample_value(name, {**H200, "engine": "memory"}) == 0.24


def test_memory_bytes_h200(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    registry = fixture_registry("h200-idle")
    name = "sparkdiag_gpu_memory_bytes"
    assert registry.get_sample_value(name, {**H200, "state": "total"}) == 150754820096.0
    assert registry.get_sample_value(name, {**H200, "state": "used"}) == 0.0
    assert registry.get_sample_value(name, {**H200, "state": "free"}) == 150109880320.0
    assert registry.get_sample_value(name, {**H200, "state": "reserved"}) is None


@pytest.mark.parametrize("name", ["gb10-idle", "gb10-memtotal"])
def test_gb10_leaves_unsupported_out(
    fixture_registry: Callable[..., CollectorRegistry], name: str
) -> None:
    registry = fixture_registry(name)
    for state in ("total", "used", "free"):
        assert (
            registry.get_sample_value("sparkdiag_gpu_memory_bytes", {**GB10, "state": state})
            is None
        )
    temp = "sparkdiag_gpu_temperature_celsius"
    assert registry.get_sample_value(temp, {**GB10, "sensor": "gpu"}) == 36.0
    assert registry.get_sample_value(temp, {**GB10, "sensor": "memory"}) is None
    assert registry.get_sample_value("sparkdiag_gpu_power_limit_watts", GB10) is None
    assert registry.get_sample_value("sparkdiag_gpu_power_watts", GB10) == 3.0
    assert _samples(registry, "sparkdiag_gpu_pcie_link_generation") == {}
    assert _samples(registry, "sparkdiag_gpu_pcie_link_width") == {}
    assert _samples(registry, "sparkdiag_gpu_ecc_errors_total") == {}
    assert _samples(registry, "sparkdiag_gpu_remapped_rows") == {}
    assert registry.get_sample_value("sparkdiag_gpu_performance_state", GB10) == 8.0
    thresholds = _samples(registry, "sparkdiag_gpu_temperature_threshold_celsius")
    assert list(thresholds.values()) == [105.0]


def test_gpu_pcie_ecc_and_state(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    registry = fixture_registry("h200-idle")
    for state in ("current", "max"):
        labels = {**H200, "state": state}
        assert registry.get_sample_value("sparkdiag_gpu_pcie_link_generation", labels) == 5.0
        assert registry.get_sample_value("sparkdiag_gpu_pcie_link_width", labels) == 16.0
    assert registry.get_sample_value("sparkdiag_gpu_pcie_replay_errors_total", H200) == 1.0
    for kind in ("corrected", "uncorrected"):
        assert (
            registry.get_sample_value("sparkdiag_gpu_ecc_errors_total", {**H200, "type": kind})
            == 0.0
        )
    assert len(_samples(registry, "sparkdiag_gpu_remapped_rows")) == 4
    assert registry.get_sample_value("sparkdiag_gpu_performance_state", H200) == 0.0


def test_compute_processes_exclude_own_probe(nvml_fixture: Callable[[str], Path]) -> None:
    name = "sparkdiag_gpu_compute_processes"
    load = nvml_fixture("h200-load")
    assert _registry(_snapshot(load)).get_sample_value(name, H200) == 1.0
    assert _registry(_snapshot(load, excluded=frozenset({547}))).get_sample_value(name, H200) == 0.0
    assert _registry(_snapshot(load, excluded=frozenset({548}))).get_sample_value(name, H200) == 1.0
    idle = nvml_fixture("h200-idle")
    assert _registry(_snapshot(idle)).get_sample_value(name, H200) == 0.0


# ---- XID events and lost GPUs -----------------------------------------------------------------


def test_xid_counter(nvml_fixture: Callable[[str], Path]) -> None:
    scripted = nvml_fixture("h200-scripted")
    xid = {**H200, "xid": "79", "severity": "critical", "action": "restart_bm"}
    before_xid = _registry(_snapshot(scripted, polls=4))
    assert before_xid.get_sample_value("sparkdiag_gpu_xid_errors_total", xid) is None
    assert before_xid.get_sample_value("sparkdiag_gpu_xid_last_timestamp_seconds", H200) is None

    start = time.time()
    registry = _registry(_snapshot(scripted, polls=7))
    end = time.time()
    assert registry.get_sample_value("sparkdiag_gpu_xid_errors_total", xid) == 1.0
    assert len(_samples(registry, "sparkdiag_gpu_xid_errors_total")) == 1
    last = registry.get_sample_value("sparkdiag_gpu_xid_last_timestamp_seconds", H200)
    assert last is not None
    assert start <= last <= end


def test_lost_gpu(nvml_fixture: Callable[[str], Path]) -> None:
    registry = _registry(_snapshot(nvml_fixture("h200-scripted"), polls=12))
    assert registry.get_sample_value("sparkdiag_gpu_up", H200) == 0.0
    info = _samples(registry, "sparkdiag_gpu_info")
    assert list(info.values()) == [1.0]
    assert dict(next(iter(info)))["name"] == "NVIDIA H200"
    assert (
        registry.get_sample_value("sparkdiag_gpu_temperature_celsius", {**H200, "sensor": "gpu"})
        is None
    )
    per_gpu = {
        s.name for family in registry.collect() for s in family.samples if s.labels.get("gpu")
    }
    # Identity, up, and the XID counters (a counter must not vanish and restart) stay.
    assert per_gpu == {
        "sparkdiag_gpu_info",
        "sparkdiag_gpu_up",
        "sparkdiag_gpu_xid_errors_total",
        "sparkdiag_gpu_xid_last_timestamp_seconds",
        "sparkdiag_gpu_xid_incidents_total",
        "sparkdiag_gpu_xid_incident_last_timestamp_seconds",
    }
    assert registry.get_sample_value("sparkdiag_nvml_up") == 1.0


def test_eight_gpus(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    registry = fixture_registry("h200-x8")
    up = _samples(registry, "sparkdiag_gpu_up")
    assert sorted(dict(labels)["gpu"] for labels in up) == [str(i) for i in range(8)]
    assert set(up.values()) == {1.0}
    assert (
        registry.get_sample_value(
            "sparkdiag_gpu_temperature_celsius",
            {"gpu": "7", "uuid": "GPU-979ad365-0b73-a0ac-74a2-3520b773d467", "sensor": "gpu"},
        )
        == 45.0
    )


# ---- host PCIe links --------------------------------------------------------------------------


def test_pcie_host_links_from_spark_sysfs(
    fixture_registry: Callable[..., CollectorRegistry],
) -> None:
    registry = fixture_registry("gb10-idle")
    cx7 = {"device": "0002:01:00.0", "class": "network", "driver": "mlx5_core"}
    width = "sparkdiag_pcie_link_width"
    speed = "sparkdiag_pcie_link_transfers_per_second"
    assert registry.get_sample_value(width, {**cx7, "state": "current"}) == 4.0
    assert registry.get_sample_value(width, {**cx7, "state": "max"}) == 4.0
    assert registry.get_sample_value(speed, {**cx7, "state": "current"}) == 32e9
    assert registry.get_sample_value(speed, {**cx7, "state": "max"}) == 32e9
    gpu = {"device": "000f:01:00.0", "class": "display", "driver": "nvidia"}
    assert registry.get_sample_value(speed, {**gpu, "state": "current"}) == 32e9
    wifi = {"device": "0009:01:00.0", "class": "network", "driver": "mt7925e"}
    assert registry.get_sample_value(width, {**wifi, "state": "current"}) == 1.0
    devices = {dict(labels)["device"] for labels in _samples(registry, width)}
    assert len(devices) == 14
    assert "0006:00:00.0" not in devices  # the empty root port


def test_platform_and_the_widths_its_links_are_built_for(
    fixture_registry: Callable[..., CollectorRegistry],
) -> None:
    expected = "sparkdiag_pcie_link_expected_width"
    cx7 = {"device": "0002:01:00.0", "class": "network", "driver": "mlx5_core"}
    port = {"device": "0002:00:00.0", "class": "bridge", "driver": "pcieport"}
    spark = fixture_registry("gb10-idle")
    dmi = {"vendor": "NVIDIA", "product": "NVIDIA_DGX_Spark", "board": "P4242"}
    assert spark.get_sample_value("sparkdiag_platform_info", dmi) == 1.0
    assert spark.get_sample_value(expected, cx7) == 4.0
    assert spark.get_sample_value(expected, port) == 4.0
    # only the links the platform table describes (the four ConnectX-7 functions, their ports)
    assert len(_samples(spark, expected)) == 6
    gx10 = fixture_registry("gb10-idle", sysfs=GX10_SYSFS)
    dmi = {"vendor": "ASUSTeK COMPUTER INC.", "product": "GX10", "board": ""}
    assert gx10.get_sample_value("sparkdiag_platform_info", dmi) == 1.0
    assert gx10.get_sample_value(expected, cx7) == 2.0
    assert gx10.get_sample_value("sparkdiag_pcie_link_width", {**cx7, "state": "current"}) == 2
    assert gx10.get_sample_value(expected, {**cx7, "device": "0000:01:00.0"}) == 4.0


def test_no_platform_without_dmi(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    registry = fixture_registry("h200-idle", sysfs=SPARK_SYSFS.parent / "h200-vm")
    assert _samples(registry, "sparkdiag_platform_info") == {}
    assert _samples(registry, "sparkdiag_pcie_link_expected_width") == {}


def test_applications_clocks(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    apps = "sparkdiag_gpu_clock_applications_hertz"
    default = "sparkdiag_gpu_clock_default_applications_hertz"
    h200 = fixture_registry("h200-idle")
    for clock in ("sm", "graphics"):
        assert h200.get_sample_value(apps, {**H200, "clock": clock}) == 1980e6
        assert h200.get_sample_value(default, {**H200, "clock": clock}) == 1980e6
    gb10 = fixture_registry("gb10-idle")
    assert gb10.get_sample_value(apps, {**GB10, "clock": "sm"}) == 2418e6
    assert gb10.get_sample_value(default, {**GB10, "clock": "sm"}) == 2418e6
    assert len(_samples(gb10, apps)) == 2  # sm and graphics; NVML has no memory domain here
    clock = "sparkdiag_gpu_clock_hertz"
    assert gb10.get_sample_value(clock, {**GB10, "clock": "memory"}) is None  # N/A on GB10
    assert (
        gb10.get_sample_value("sparkdiag_gpu_clock_max_hertz", {**GB10, "clock": "memory"}) is None
    )
    assert gb10.get_sample_value(clock, {**GB10, "clock": "sm"}) == 2418e6


def test_memory_pressure_and_swap_ins_from_procfs(
    fixture_registry: Callable[..., CollectorRegistry],
) -> None:
    registry = fixture_registry(
        "gb10-idle", read_host=lambda: read_host_memory(ROOTFS / "dgx-spark-pressure")
    )
    ratio = "sparkdiag_host_memory_pressure_ratio"
    assert registry.get_sample_value(ratio, {"kind": "full", "window": "60s"}) == 0.2306
    assert registry.get_sample_value(ratio, {"kind": "some", "window": "10s"}) == 0.7132
    assert len(_samples(registry, ratio)) == 6
    stalled = "sparkdiag_host_memory_pressure_stalled_seconds_total"
    assert registry.get_sample_value(stalled, {"kind": "full"}) == 402.118226
    assert registry.get_sample_value("sparkdiag_host_swap_in_pages_total") == 1834471.0
    memory = "sparkdiag_host_memory_bytes"
    assert registry.get_sample_value(memory, {"state": "total"}) == 127600748 * 1024.0
    assert registry.get_sample_value(memory, {"state": "available"}) == 6123520 * 1024.0
    assert registry.get_sample_value(memory, {"state": "cached"}) == (2210344 + 180224) * 1024.0


def test_no_pressure_series_where_the_kernel_has_no_psi(
    fixture_registry: Callable[..., CollectorRegistry],
) -> None:
    registry = fixture_registry("gb10-idle")  # HOST: memory only
    assert _samples(registry, "sparkdiag_host_memory_pressure_ratio") == {}
    assert _samples(registry, "sparkdiag_host_swap_in_pages_total") == {}


# ---- exporter and environment -----------------------------------------------------------------


def test_context_build_and_host(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    registry = fixture_registry("h200-idle")
    assert (
        registry.get_sample_value(
            "sparkdiag_context_info", {"context": "native", "runtime": "none"}
        )
        == 1.0
    )
    assert len(_samples(registry, "sparkdiag_context_info")) == 1
    build = {
        "version": __version__,
        "python": platform.python_version(),
        "nvml_driver": "580.159.04",
    }
    assert registry.get_sample_value("sparkdiag_build_info", build) == 1.0
    assert registry.get_sample_value("sparkdiag_nvml_up") == 1.0
    assert registry.get_sample_value("sparkdiag_host_memory_bytes", {"state": "total"}) == (
        128849018880.0
    )
    assert registry.get_sample_value("sparkdiag_last_poll_timestamp_seconds") == POLL_TIME


def test_container_context(nvml_fixture: Callable[[str], Path]) -> None:
    ctx = ExecutionContext(context="container", runtime="docker")
    registry = _registry(_snapshot(nvml_fixture("h200-idle"), context=ctx))
    assert (
        registry.get_sample_value(
            "sparkdiag_context_info", {"context": "container", "runtime": "docker"}
        )
        == 1.0
    )
    assert (
        _samples(
            _registry(_snapshot(nvml_fixture("h200-idle"), context=None)), "sparkdiag_context_info"
        )
        == {}
    )


def test_collector_success_and_duration(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    registry = fixture_registry("h200-idle")
    for collector in ("nvml", "pcie", "host"):
        labels = {"collector": collector}
        assert registry.get_sample_value("sparkdiag_collector_success", labels) == 1.0
        duration = registry.get_sample_value("sparkdiag_collector_duration_seconds", labels)
        assert duration is not None
        assert 0.0 <= duration < 5.0
    assert len(_samples(registry, "sparkdiag_collector_success")) == 3


def test_no_nvml(fixture_registry: Callable[..., CollectorRegistry]) -> None:
    registry = fixture_registry("no-nvml")
    assert registry.get_sample_value("sparkdiag_nvml_up") == 0.0
    assert registry.get_sample_value("sparkdiag_collector_success", {"collector": "nvml"}) == 0.0
    assert registry.get_sample_value("sparkdiag_collector_success", {"collector": "pcie"}) == 1.0
    names = {s.name for family in registry.collect() for s in family.samples}
    assert not any(name.startswith("sparkdiag_gpu_") for name in names)
    # Host PCIe links do not need NVML.
    assert "sparkdiag_pcie_link_width" in names
    build = {"version": __version__, "python": platform.python_version(), "nvml_driver": ""}
    assert registry.get_sample_value("sparkdiag_build_info", build) == 1.0


def test_no_snapshot_yet_renders_nothing() -> None:
    registry = _registry(None)
    assert registry.get_sample_value("sparkdiag_nvml_up") is None
    assert generate_latest(registry) == b""


# ---- rendering --------------------------------------------------------------------------------


def _families_without_samples(text: str) -> list[str]:
    types: dict[str, str] = {}
    sample_names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            sample_names.add(line.split("{", 1)[0].split(" ", 1)[0])
    empty = []
    for name, kind in types.items():
        # prometheus_client names a counter's TYPE line with or without "_total" by version.
        suffixes = ("", "_total") if kind == "counter" else ("",)
        if not any(name + suffix in sample_names for suffix in suffixes):
            empty.append(name)
    return empty


@pytest.mark.parametrize(
    ("name", "polls"),
    [("h200-idle", 1), ("h200-load", 1), ("gb10-idle", 1), ("no-nvml", 1), ("h200-scripted", 12)],
)
def test_no_family_without_samples(
    nvml_fixture: Callable[[str], Path], name: str, polls: int
) -> None:
    registry = _registry(_snapshot(nvml_fixture(name), polls=polls))
    text = render(registry).decode()
    assert text == generate_latest(registry).decode()
    assert "# TYPE" in text
    assert _families_without_samples(text) == []


def test_family_check_would_catch_an_empty_family(nvml_fixture: Callable[[str], Path]) -> None:
    text = "# HELP a_b x\n# TYPE a_b gauge\n# HELP c x\n# TYPE c counter\nc_total 1.0\n"
    assert _families_without_samples(text) == ["a_b"]
    # The GPU collector alone (without build_registry's filter) does yield empty families on GB10.
    snapshot = _snapshot(nvml_fixture("gb10-idle"))
    bare = CollectorRegistry(auto_describe=False)
    bare.register(GpuCollector(lambda: snapshot))
    empty = _families_without_samples(generate_latest(bare).decode())
    assert "sparkdiag_gpu_memory_bytes" in empty
    assert "sparkdiag_gpu_remapped_rows" in empty


def test_every_scrape_is_rendered_fresh(nvml_fixture: Callable[[str], Path]) -> None:
    source = GpuSource(FixtureBackend(nvml_fixture("h200-scripted")))
    source.start()
    poller = Poller(source, read_pcie=None, read_host=None, context=None)
    registry = build_registry(lambda: poller.latest)
    name = "sparkdiag_gpu_temperature_celsius"
    labels = {**H200, "sensor": "memory"}
    poller.poll_once()
    assert registry.get_sample_value(name, labels) == 39.0  # the idle recording
    poller.poll_once()
    assert registry.get_sample_value(name, labels) == 55.0
    assert registry.get_sample_value("sparkdiag_collector_success", {"collector": "pcie"}) is None


@pytest.mark.parametrize(
    ("name", "sm_mhz", "watts"),
    [("gb10-load", 2360, 88.0), ("gb10-slow-state", 650, 41.0), ("gb10-power-safety", 610, 24.0)],
)
def test_gb10_under_load_exports_what_the_slow_state_alert_compares(
    nvml_fixture: Callable[[str], Path], name: str, sm_mhz: int, watts: float
) -> None:
    # poll 1 is idle, poll 2 on is the loaded state the fixture scripts
    registry = _registry(_snapshot(nvml_fixture(name), polls=2))
    clock = {**GB10, "clock": "sm"}
    assert registry.get_sample_value("sparkdiag_gpu_clock_hertz", clock) == sm_mhz * 1e6
    default = "sparkdiag_gpu_clock_default_applications_hertz"
    assert registry.get_sample_value(default, clock) == 2418e6
    util = {**GB10, "engine": "gpu"}
    assert registry.get_sample_value("sparkdiag_gpu_utilization_ratio", util) == 1.0
    assert registry.get_sample_value("sparkdiag_gpu_performance_state", GB10) == 0.0
    assert registry.get_sample_value("sparkdiag_gpu_power_watts", GB10) == watts
    active = _samples(registry, "sparkdiag_gpu_clock_event_active")
    assert len(active) == 9 and set(active.values()) == {0.0}  # no reason explains the clock
