"""GpuSource over recorded NVML fixtures: units, unsupported values, unified memory, lost GPUs."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkdiag.snapshot import GpuIdentity, GpuSample
from sparkdiag.sources.nvml.fixture import FixtureBackend
from sparkdiag.sources.nvml.gpu import GpuSource, decode_reasons
from sparkdiag.sources.nvml.queries import CATALOGUE
from tests.support import CountingBackend

H200_UUID = "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"
GB10_UUID = "GPU-5b4c1f0e-6a2d-4e8b-9c31-0d2e7f6a9b10"
SECOND_UUID = "GPU-00000000-0000-0000-0000-000000000001"


def _read_one(source: GpuSource) -> GpuSample:
    samples = source.read()
    assert len(samples) == 1
    return samples[0]


def _poll(source: GpuSource, times: int = 1) -> tuple[GpuSample, ...]:
    """Advance the fixture script ``times`` polls (as the poller does) and read once."""
    for _ in range(times):
        source.backend.advance()
    return source.read()


# ---- H200, idle (a real recording) ------------------------------------------------------------


@pytest.fixture
def h200_idle(started_source: Callable[[str], GpuSource]) -> GpuSample:
    """GPU 0 of the recorded idle H200, read once."""
    return _read_one(started_source("h200-idle"))


def test_h200_idle_identity(started_source: Callable[[str], GpuSource]) -> None:
    source = started_source("h200-idle")
    assert source.nvml_up is True
    assert source.unavailable_reason is None
    assert source.driver_version == "580.159.04"
    assert source.identities == [
        GpuIdentity(
            index=0,
            uuid=H200_UUID,
            name="NVIDIA H200",
            pci_bus_id="00000000:00:06.0",
            driver_version="580.159.04",
            cuda_capability="9.0",
            memory_model="dedicated",
        )
    ]
    sample = _read_one(source)
    assert sample.identity == source.identities[0]
    assert sample.up is True
    assert sample.error is None


def test_h200_idle_temperatures_and_thresholds(h200_idle: GpuSample) -> None:
    assert h200_idle.temperature_celsius == {"gpu": 36.0, "memory": 39.0}
    assert h200_idle.threshold_celsius == {
        "shutdown": 95.0,
        "slowdown": 89.0,
        "memory_max": 95.0,
        "gpu_max": 87.0,
    }


def test_h200_idle_clocks_in_hertz(h200_idle: GpuSample) -> None:
    assert h200_idle.clock_hertz == {
        "graphics": 345e6,
        "sm": 345e6,
        "memory": 3201e6,
        "video": 765e6,
    }
    assert h200_idle.clock_max_hertz == {
        "graphics": 1980e6,
        "sm": 1980e6,
        "memory": 3201e6,
        "video": 1545e6,
    }


def test_h200_idle_clock_events_and_violations(h200_idle: GpuSample) -> None:
    assert h200_idle.clock_event_reasons == 1
    assert h200_idle.supported_clock_event_reasons == 511
    assert decode_reasons(h200_idle.clock_event_reasons) == ["gpu_idle"]
    assert set(h200_idle.violation_seconds) == {
        "power",
        "thermal",
        "sync_boost",
        "board_limit",
        "low_utilization",
        "reliability",
    }
    assert h200_idle.violation_seconds["low_utilization"] == pytest.approx(24.348871232, rel=1e-12)
    for policy in ("power", "thermal", "sync_boost", "board_limit", "reliability"):
        assert h200_idle.violation_seconds[policy] == 0.0


def test_h200_idle_power_energy_utilization(h200_idle: GpuSample) -> None:
    assert h200_idle.power_watts == pytest.approx(77.935, rel=1e-12)
    assert h200_idle.power_limit_watts == 700.0
    assert h200_idle.energy_joules == pytest.approx(2832.298, rel=1e-12)
    assert h200_idle.utilization_ratio == {"gpu": 0.0, "memory": 0.0}


def test_h200_idle_memory_pcie_ecc(h200_idle: GpuSample) -> None:
    # "reserved" is in the recording but not exported.
    assert h200_idle.memory_bytes == {"total": 150754820096.0, "used": 0.0, "free": 150109880320.0}
    assert h200_idle.pcie_generation == {"current": 5.0, "max": 5.0}
    assert h200_idle.pcie_width == {"current": 16.0, "max": 16.0}
    assert h200_idle.pcie_replay_errors == 1.0
    assert h200_idle.ecc_errors == {"corrected": 0.0, "uncorrected": 0.0}
    assert h200_idle.remapped_rows == {
        "corrected": 0.0,
        "uncorrected": 0.0,
        "pending": 0.0,
        "failure": 0.0,
    }


def test_h200_idle_state_and_modes(h200_idle: GpuSample) -> None:
    assert h200_idle.performance_state == 0
    assert h200_idle.compute_pids == ()
    assert h200_idle.persistence_mode is True
    assert h200_idle.compute_mode == "default"
    assert h200_idle.mig_mode is False


def test_h200_load(started_source: Callable[[str], GpuSource]) -> None:
    sample = _read_one(started_source("h200-load"))
    assert sample.clock_event_reasons == 4
    assert decode_reasons(4) == ["sw_power_cap"]
    assert sample.clock_hertz["sm"] == 1455e6
    assert sample.compute_pids == (547,)
    assert sample.utilization_ratio == {"gpu": 0.99, "memory": 0.24}
    assert sample.power_watts == pytest.approx(692.307, rel=1e-12)
    assert sample.temperature_celsius == {"gpu": 60.0, "memory": 52.0}
    assert sample.memory_bytes["used"] == 1059913728.0


def test_decode_reasons_order_and_bits() -> None:
    assert decode_reasons(0) == []
    assert decode_reasons(0x21) == ["gpu_idle", "sw_thermal_slowdown"]
    assert decode_reasons(0x1FF) == [
        "gpu_idle",
        "applications_clocks_setting",
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
        "display_clock_setting",
    ]
    # Bits NVML may add later are ignored rather than mis-named.
    assert decode_reasons(0x200) == []


def test_h200_x8_reads_every_device(started_source: Callable[[str], GpuSource]) -> None:
    source = started_source("h200-x8")
    samples = source.read()
    assert [s.identity.index for s in samples] == list(range(8))
    assert len({s.identity.uuid for s in samples}) == 8
    assert [s.temperature_celsius["gpu"] for s in samples] == [float(t) for t in range(38, 46)]
    assert samples[7].identity.pci_bus_id == "00000000:88:00.0"
    assert all(s.up for s in samples)


# ---- GB10 (unified memory, integrated GPU) ----------------------------------------------------


def test_gb10_identity_is_unified(started_source: Callable[[str], GpuSource]) -> None:
    source = started_source("gb10-idle")
    assert source.identities == [
        GpuIdentity(
            index=0,
            uuid=GB10_UUID,
            name="NVIDIA GB10",
            pci_bus_id="0000000F:01:00.0",
            driver_version="580.126.09",
            cuda_capability="12.1",
            memory_model="unified",
        )
    ]


def test_gb10_leaves_unsupported_values_out(started_source: Callable[[str], GpuSource]) -> None:
    sample = _read_one(started_source("gb10-idle"))
    assert sample.up is True
    assert sample.memory_bytes == {}
    # LPDDR5X has no sensor: NVML reads 0, which is "not supported", not 0 °C.
    assert sample.temperature_celsius == {"gpu": 36.0}
    assert sample.threshold_celsius == {"shutdown": 105.0}
    assert sample.power_watts == 3.0
    assert sample.power_limit_watts is None
    # The integrated GPU's NVML link (Gen1 x1) is meaningless: left out.
    assert sample.pcie_generation == {}
    assert sample.pcie_width == {}
    assert sample.ecc_errors == {}
    assert sample.remapped_rows == {}
    assert sample.mig_mode is None
    assert sample.performance_state == 8
    assert sample.clock_max_hertz == {"sm": 3003e6, "graphics": 3003e6}  # memory, video: N/A
    assert sample.clock_hertz == {"sm": 2418e6, "graphics": 2418e6}
    assert sample.clock_applications_hertz == {"sm": 2418e6, "graphics": 2418e6}
    assert sample.clock_default_applications_hertz == {"sm": 2418e6, "graphics": 2418e6}


def test_applications_clocks_are_read_with_the_static_fields(h200_idle: GpuSample) -> None:
    assert h200_idle.clock_applications_hertz == {"sm": 1980e6, "graphics": 1980e6}
    assert h200_idle.clock_default_applications_hertz == {"sm": 1980e6, "graphics": 1980e6}
    assert CATALOGUE["applications_clock"].tier == CATALOGUE["default_applications_clock"].tier
    assert CATALOGUE["applications_clock"].tier == "static"


def test_gb10_memory_total_equal_to_host_is_still_unified(
    started_source: Callable[[str], GpuSource],
) -> None:
    source = started_source("gb10-memtotal")
    # The fixture really answers memory info, with the host's MemTotal as the total.
    assert source.backend.query(0, "memory_info")["total"] == 127600748 * 1024
    assert source.backend.host_memory_total() == 127600748 * 1024
    assert source.identities[0].memory_model == "unified"
    sample = _read_one(source)
    assert sample.memory_bytes == {}
    assert sample.pcie_generation == {}


def test_memory_total_far_from_host_total_is_dedicated(derive_fixture: Callable[..., Path]) -> None:
    # 150.75 GB of HBM against a host of 135.15 GB: 11.5 % apart, well outside the 2 % tolerance.
    path = derive_fixture("h200-idle")
    source = GpuSource(FixtureBackend(path))
    assert source.start()
    assert source.identities[0].memory_model == "dedicated"


# ---- unsupported queries are remembered -------------------------------------------------------


def test_unsupported_queries_are_asked_once(nvml_fixture: Callable[[str], Path]) -> None:
    backend = CountingBackend(nvml_fixture("gb10-idle"))
    source = GpuSource(backend)
    assert source.start()
    for _ in range(4):
        sample = _read_one(source)
        assert sample.power_limit_watts is None
        assert sample.threshold_celsius == {"shutdown": 105.0}
    # NOT_SUPPORTED: asked at the first read only.
    for key in (
        (0, "power_limit_mw", None),
        (0, "temperature_threshold", 1),
        (0, "temperature_threshold", 2),
        (0, "temperature_threshold", 3),
        (0, "ecc_total", 0),
        (0, "ecc_total", 1),
        (0, "remapped_rows", None),
        (0, "mig_mode", None),
    ):
        assert backend.asked[key] == 1, key
    # Supported and fast-changing: asked at every read.
    for key in (
        (0, "temperature", 0),
        (0, "power_mw", None),
        (0, "clock", 1),
        (0, "pstate", None),
    ):
        assert backend.asked[key] == 4, key
    # Static (a threshold): asked at the first read, then once its answer is 60 s old.
    assert backend.asked[(0, "temperature_threshold", 0)] == 1
    # Memory info decides the memory model once at start; a unified GPU is not asked again.
    assert backend.asked[(0, "memory_info", None)] == 1
    # The integrated GPU's PCIe link is never asked on unified memory.
    assert backend.asked[(0, "pcie_gen", None)] == 0


@pytest.mark.parametrize(
    ("error", "times_asked"),
    [
        ("NOT_SUPPORTED", 1),
        ("NO_PERMISSION", 1),
        ("FUNCTION_NOT_FOUND", 1),
        ("NOT_FOUND", 1),
        # A transient error is not "unsupported": it is asked again next poll.
        ("TIMEOUT", 3),
        ("NOT_READY", 3),
    ],
)
def test_which_errors_are_remembered_as_unsupported(
    derive_fixture: Callable[..., Path],
    error: str,
    times_asked: int,
) -> None:
    path = derive_fixture("h200-idle", devices=[{"from": 0, "set": {"power_mw": {"error": error}}}])
    backend = CountingBackend(path)
    source = GpuSource(backend)
    assert source.start()
    for _ in range(3):
        sample = _read_one(source)
        assert sample.up is True
        assert sample.power_watts is None
        assert sample.power_limit_watts == 700.0
    assert backend.asked[(0, "power_mw", None)] == times_asked


def test_a_query_with_no_recorded_answer_is_unsupported(
    write_fixture: Callable[..., Path],
) -> None:
    path = write_fixture(
        {
            "driver_version": "1.0",
            "devices": [{"answers": {"name": "Minimal", "uuid": "GPU-min", "temperature/0": 30}}],
        }
    )
    source = GpuSource(FixtureBackend(path))
    assert source.start()
    ident = source.identities[0]
    assert (ident.name, ident.uuid, ident.pci_bus_id, ident.cuda_capability) == (
        "Minimal",
        "GPU-min",
        "",
        "",
    )
    assert ident.memory_model == "unified"  # memory info NOT_SUPPORTED
    sample = _read_one(source)
    assert sample == GpuSample(identity=ident, up=True, temperature_celsius={"gpu": 30.0})


# ---- lost GPUs --------------------------------------------------------------------------------


def test_scripted_gpu_lost_at_poll_12(nvml_fixture: Callable[[str], Path]) -> None:
    backend = CountingBackend(nvml_fixture("h200-scripted"))
    source = GpuSource(backend)
    assert source.start()
    identity = source.identities[0]
    (before,) = _poll(source, 11)
    assert before.up is True
    (lost,) = _poll(source)
    assert lost.up is False
    assert lost.identity == identity
    assert lost.identity.uuid == H200_UUID
    assert lost.error is not None and "GPU_IS_LOST" in lost.error
    assert lost.temperature_celsius == {}
    assert lost.clock_event_reasons is None
    # The lost device costs one call per poll (uuid), not one per query.
    backend.asked.clear()
    (still_lost,) = _poll(source)
    assert still_lost.up is False
    assert sum(backend.asked.values()) == 1


@pytest.mark.parametrize("relative", [False, True], ids=["absolute-base", "relative-base"])
def test_lost_gpu_does_not_stop_other_devices(
    tmp_path: Path,
    write_fixture: Callable[..., Path],
    nvml_fixture: Callable[[str], Path],
    relative: bool,
) -> None:
    idle = nvml_fixture("h200-idle")
    base = os.path.relpath(idle, tmp_path) if relative else str(idle.resolve())
    path = write_fixture(
        {
            "base": base,
            "devices": [
                {"from": 0},
                {"from": 0, "set": {"uuid": SECOND_UUID, "pci_bus_id": "00000000:00:07.0"}},
            ],
            "script": [{"poll": 2, "gpu": 1, "lost": True}],
        }
    )
    source = GpuSource(FixtureBackend(path))
    assert source.start()
    assert [i.uuid for i in source.identities] == [H200_UUID, SECOND_UUID]

    first = _poll(source)
    assert [s.up for s in first] == [True, True]
    assert first[1].temperature_celsius == {"gpu": 36.0, "memory": 39.0}

    for _ in range(3):
        gpu0, gpu1 = _poll(source)
        assert gpu0.up is True
        assert gpu0.temperature_celsius == {"gpu": 36.0, "memory": 39.0}
        assert gpu0.power_watts == pytest.approx(77.935)
        assert gpu1.up is False
        assert gpu1.identity.uuid == SECOND_UUID
        assert gpu1.identity.pci_bus_id == "00000000:00:07.0"
        assert gpu1.error is not None and "GPU_IS_LOST" in gpu1.error


def test_gpu_lost_before_start_keeps_index_with_empty_identity(
    derive_fixture: Callable[..., Path],
) -> None:
    # The script is stepped to poll 1 (GPU lost) before start() reads the identities.
    path = derive_fixture("h200-idle", script=[{"poll": 1, "gpu": 0, "lost": True}])
    backend = FixtureBackend(path)
    backend.advance()
    source = GpuSource(backend)
    assert source.start()
    ident = source.identities[0]
    assert (ident.index, ident.uuid, ident.name) == (0, "", "")
    (sample,) = source.read()
    assert sample.up is False


# ---- NVML unavailable -------------------------------------------------------------------------


def test_no_nvml(nvml_fixture: Callable[[str], Path]) -> None:
    source = GpuSource(FixtureBackend(nvml_fixture("no-nvml")))
    assert source.start() is False
    assert source.nvml_up is False
    assert source.unavailable_reason is not None
    assert "LIBRARY_NOT_FOUND" in source.unavailable_reason
    assert source.identities == []
    assert source.read() == ()
    assert source.events() == []
    source.stop()  # harmless without NVML


def test_stop_marks_nvml_down(started_source: Callable[[str], GpuSource]) -> None:
    source = started_source("h200-idle")
    source.stop()
    assert source.nvml_up is False
    assert source.read() == ()


# ---- scripted changes through the source ------------------------------------------------------


def test_scripted_changes_reach_the_sample(started_source: Callable[[str], GpuSource]) -> None:
    source = started_source("h200-scripted")
    (poll1,) = _poll(source)
    assert poll1.temperature_celsius == {"gpu": 36.0, "memory": 39.0}
    assert poll1.pcie_width == {"current": 16.0, "max": 16.0}
    (poll6,) = _poll(source, 5)
    assert poll6.pcie_width == {"current": 8.0, "max": 16.0}
    assert poll6.temperature_celsius == {"gpu": 67.0, "memory": 73.5}
    assert poll6.clock_event_reasons == 1
    (poll8,) = _poll(source, 2)
    assert poll8.clock_event_reasons == 32
    assert decode_reasons(32) == ["sw_thermal_slowdown"]
    assert poll8.clock_hertz["sm"] == 1110e6
    assert poll8.clock_hertz["graphics"] == 1110e6
    (poll10,) = _poll(source, 2)
    assert poll10.temperature_celsius == {"gpu": 84.0, "memory": 92.0}


def test_static_and_slow_queries_are_refreshed_on_their_own_schedule(
    nvml_fixture: Callable[[str], Path],
) -> None:
    backend = CountingBackend(nvml_fixture("h200-idle"))
    now = [0.0]
    source = GpuSource(backend, static_seconds=5.0, slow_seconds=2.0, clock=lambda: now[0])
    assert source.start()
    for second in range(10):  # one read a second, whatever the poll interval would be
        now[0] = float(second)
        sample = _read_one(source)
        assert sample.threshold_celsius["slowdown"] == 89.0  # cached answers are still exported
        assert sample.ecc_errors == {"corrected": 0.0, "uncorrected": 0.0}
    assert backend.asked[(0, "temperature_threshold", 1)] == 2  # reads 1 and 6
    assert backend.asked[(0, "max_clock", 1)] == 2
    assert backend.asked[(0, "ecc_total", 1)] == 5  # reads 1, 3, 5, 7, 9
    assert backend.asked[(0, "violation_ns", 0)] == 5
    assert backend.asked[(0, "clock_event_reasons", None)] == 10
