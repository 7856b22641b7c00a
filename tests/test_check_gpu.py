"""Per-GPU checks of ``sparkdiag check`` (presence, versions, idle, temperatures, clock event
reasons, the GPU's PCIe link, modes), each driven to each of its outcomes by fixtures."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from sparkdiag.check.model import GpuProbe, TorchInfo
from sparkdiag.check.version_checks import (
    MAJOR_MINIMUM,
    TOOLKIT_DRIVERS,
    driver_cuda,
    parse_version,
)
from tests.support.check import (
    CHECK,
    NVML,
    SYSFS,
    context,
    derived,
    empty_sysfs,
    nvml_fixture,
    only,
    poll,
    probe_doc,
    probed,
)

NOT_SUPPORTED = {"error": "NOT_SUPPORTED"}


# -- nvml and gpus ------------------------------------------------------------------------------


def test_nvml_passes_with_driver(tmp_path: Path) -> None:
    r = only(CHECK["nvml"](context(poll(NVML / "h200-idle.json"))))
    assert (r.status, r.finding) == ("pass", "NVML up, driver 580.159.04")


def test_nvml_missing_on_a_machine_without_gpu_is_a_skip(tmp_path: Path) -> None:
    snap = poll(NVML / "no-nvml.json", sysfs=empty_sysfs(tmp_path))
    r = only(CHECK["nvml"](context(snap)))
    assert r.status == "skip"
    assert "LIBRARY_NOT_FOUND" in r.finding and r.finding.endswith("no NVIDIA driver here")
    assert "install the NVIDIA driver" in r.action


def test_nvml_missing_fails_when_gpus_are_expected(tmp_path: Path) -> None:
    snap = poll(NVML / "no-nvml.json", sysfs=empty_sysfs(tmp_path))
    r = only(CHECK["nvml"](context(snap, expect_gpus=1)))
    assert r.status == "fail" and "--expect-gpus 1" in r.finding
    assert "nvidia-smi" in r.action


def test_nvml_missing_fails_when_the_nvidia_driver_is_bound(tmp_path: Path) -> None:
    # The lent H200 VM's sysfs: the GPU at 0000:00:06.0 is bound to the nvidia driver.
    snap = poll(NVML / "no-nvml.json", sysfs=SYSFS / "h200-vm")
    r = only(CHECK["nvml"](context(snap)))
    assert r.status == "fail"
    assert "nvidia driver is bound to 0000:00:06.0" in r.finding


def _unbound_h200(tmp_path: Path) -> Path:
    """The lent H200 VM's sysfs with its GPU bound to no driver."""
    root = tmp_path / "sysfs"
    shutil.copytree(SYSFS / "h200-vm", root, symlinks=True)
    (root / "devices" / "pci0000:00" / "0000:00:06.0" / "driver").unlink()
    return root


def _driver_not_loaded(tmp_path: Path) -> Path:
    """A fixture whose nvmlInit answers DRIVER_NOT_LOADED: the library is there, the kernel
    module is not (as at boot)."""
    path = tmp_path / "not-loaded.json"
    doc = {"format": "sparkdiag-nvml-fixture/1", "description": "kernel module not loaded",
           "driver_version": "", "nvml": {"error": "DRIVER_NOT_LOADED"}, "devices": []}  # fmt: skip
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_nvml_down_with_an_unbound_gpu_on_the_bus_fails(tmp_path: Path) -> None:
    """The kernel module not loaded (as at boot): the GPU is on the bus, bound to no driver,
    and the row was a SKIP "no NVIDIA driver here" advising to install one."""
    snap = poll(_driver_not_loaded(tmp_path), sysfs=_unbound_h200(tmp_path))
    r = only(CHECK["nvml"](context(snap)))
    assert r.status == "fail"
    assert "yet 1 NVIDIA GPU is on the PCI bus (0000:00:06.0)" in r.finding
    assert "lsmod | grep nvidia" in r.action and "install" not in r.action


@pytest.mark.parametrize("bound", [True, False], ids=["driver-bound", "unbound"])
def test_nvml_library_not_found_says_install_not_load(tmp_path: Path, bound: bool) -> None:
    """Found in a review: NVML's LIBRARY_NOT_FOUND (no libnvidia-ml) said "load the NVIDIA
    driver", which no modprobe does; the library comes from installing the driver."""
    sysfs = SYSFS / "h200-vm" if bound else _unbound_h200(tmp_path)
    for expect in (None, 1):
        r = only(
            CHECK["nvml"](context(poll(NVML / "no-nvml.json", sysfs=sysfs), expect_gpus=expect))
        )
        assert r.status == "fail"
        assert r.action.startswith("install the NVIDIA driver"), r.action
        assert "libnvidia-ml" in r.action and "load the NVIDIA driver" not in r.action


@pytest.mark.parametrize("bound", [True, False], ids=["driver-bound", "unbound"])
def test_gpus_on_bus_without_nvml_does_not_blame_the_gpu(tmp_path: Path, bound: bool) -> None:
    """Found in a review: with NVML down every GPU on the bus was "not listed by NVML" and the
    row told the user to reseat the GPU and have it serviced; the nvml row says what is
    wrong, so this one only counts and refers to it."""
    sysfs = SYSFS / "h200-vm" if bound else _unbound_h200(tmp_path)
    for fixture in (NVML / "no-nvml.json", _driver_not_loaded(tmp_path)):
        r = only(CHECK["gpus-on-bus"](context(poll(fixture, sysfs=sysfs))))
        assert r.status == "skip", r
        assert r.finding.startswith("1 NVIDIA GPU function on the PCI bus"), r.finding
        assert "(see nvml)" in r.finding and "not listed" not in r.finding
        assert not r.action and r.data["pci"] == ["0000:00:06.0"]


def test_gpus_pass_and_count_as_expected() -> None:
    snap = poll(NVML / "h200-x8.json")
    r = only(CHECK["gpus"](context(snap, expect_gpus=8)))
    assert (r.status, r.finding) == ("pass", "8 GPUs visible: 8× NVIDIA H200 (as expected)")


def test_gpus_fewer_than_expected_fail() -> None:
    r = only(CHECK["gpus"](context(poll(NVML / "h200-idle.json"), expect_gpus=2)))
    assert (r.status, r.finding) == ("fail", "1 GPU visible: NVIDIA H200, 2 expected")


def test_gpus_more_than_expected_warn() -> None:
    r = only(CHECK["gpus"](context(poll(NVML / "h200-x8.json"), expect_gpus=4)))
    assert r.status == "warn" and r.finding.endswith("only 4 expected")


def test_gpus_lost_gpu_fails(tmp_path: Path) -> None:
    fixture = nvml_fixture(tmp_path, script=[{"poll": 1, "gpu": 0, "lost": True}])
    r = only(CHECK["gpus"](context(poll(fixture))))
    assert r.status == "fail"
    assert r.finding.startswith("GPU 0 (00000000:00:06.0) lost")
    assert "XID 79" in r.action


def test_gpus_without_nvml_skip(tmp_path: Path) -> None:
    snap = poll(NVML / "no-nvml.json", sysfs=empty_sysfs(tmp_path))
    assert only(CHECK["gpus"](context(snap))).status == "skip"


def test_per_gpu_checks_skip_a_lost_gpu(tmp_path: Path) -> None:
    fixture = nvml_fixture(tmp_path, script=[{"poll": 1, "gpu": 0, "lost": True}])
    r = only(CHECK["idle"](context(poll(fixture))))
    assert r.status == "skip" and r.finding.startswith("GPU lost") and r.gpu == "0"


# -- versions ----------------------------------------------------------------------------------


def test_driver_cuda_table() -> None:
    assert driver_cuda((580, 159, 4)) == (13, 0)
    assert driver_cuda((570, 124, 6)) == (12, 8)
    assert driver_cuda((575, 51, 3)) == (12, 9)
    assert driver_cuda((440, 33)) is None
    assert parse_version("580.126") == (580, 126)
    assert parse_version("n/a") is None


def test_driver_cuda_table_rows_of_11_0_and_13_x() -> None:
    # 11.0 GA shipped with 450.51.05; 450.80.02 is the minor-version-compatibility floor only
    assert driver_cuda((450, 51, 5)) == (11, 0)
    assert driver_cuda((450, 51, 4)) is None
    assert MAJOR_MINIMUM[11] == (450, 80, 2)
    assert driver_cuda((590, 48, 1)) == (13, 1)
    assert driver_cuda((595, 45, 4)) == (13, 2)
    assert driver_cuda((610, 43, 2)) == (13, 3)
    rows = [minimum for minimum, _ in TOOLKIT_DRIVERS]
    assert rows == sorted(rows), "the table must stay ascending"


@pytest.mark.parametrize(
    ("driver", "torch_cuda"),
    [("620.12", "13.4"), ("700.1.2", "14.1"), ("615.20.03", "13.3"), ("640.0", "12.8")],
)
def test_a_driver_newer_than_the_table_never_warns(
    tmp_path: Path, driver: str, torch_cuda: str
) -> None:
    snap = poll(nvml_fixture(tmp_path, driver_version=driver))
    torch = TorchInfo(f"2.14.0+cu{torch_cuda.replace('.', '')}", torch_cuda, "python3")
    r = only(CHECK["versions"](context(snap, torch=torch)))
    assert r.status == "pass", r.finding
    assert r.data["beyond_table"] is True


def test_a_newer_driver_of_the_last_rows_branch_is_still_judged(tmp_path: Path) -> None:
    # 610.x is the 13.3 branch: a torch for a later 13.x runs through minor compatibility
    snap = poll(nvml_fixture(tmp_path, driver_version="610.60.01"))
    torch = TorchInfo("2.14.0+cu134", "13.4", "python3")
    r = only(CHECK["versions"](context(snap, torch=torch)))
    assert r.status == "warn" and "minor version compatibility" in r.finding
    assert r.data["driver_cuda"] == "13.3"


def test_a_driver_newer_than_the_table_with_a_cpu_only_torch_still_fails(tmp_path: Path) -> None:
    snap = poll(nvml_fixture(tmp_path, driver_version="620.12"))
    torch = TorchInfo("2.14.0+cpu", None, "python3")
    assert only(CHECK["versions"](context(snap, torch=torch))).status == "fail"


def test_versions_pass_when_the_driver_supports_torch_cuda() -> None:
    r = only(CHECK["versions"](context(poll(NVML / "h200-idle.json"))))
    assert r.status == "pass"
    assert r.finding == (
        "driver 580.159.04 (CUDA ≤ 13.0) supports torch 2.11.0+cu130 built for CUDA 13.0 "
        "(installed package)"
    )


def test_versions_fail_when_torch_cuda_major_is_newer_than_the_driver(tmp_path: Path) -> None:
    snap = poll(nvml_fixture(tmp_path, driver_version="570.124.06"))
    r = only(CHECK["versions"](context(snap)))
    assert r.status == "fail"
    assert "driver 570.124.06 (CUDA ≤ 12.8) is too old for torch 2.11.0+cu130" in r.finding
    assert "needs driver ≥ 580" in r.finding
    assert "upgrade the NVIDIA driver to ≥ 580" in r.action


def test_versions_warn_on_minor_version_compatibility(tmp_path: Path) -> None:
    snap = poll(nvml_fixture(tmp_path, driver_version="570.124.06"))
    torch = TorchInfo("2.8.0+cu129", "12.9", "python3")
    r = only(CHECK["versions"](context(snap, torch=torch)))
    assert r.status == "warn"
    assert "minor version compatibility" in r.finding


def test_versions_fail_for_a_cpu_only_torch_on_a_gpu_machine() -> None:
    torch = TorchInfo("2.13.0+cpu", None, "python3")
    r = only(CHECK["versions"](context(poll(NVML / "h200-idle.json"), torch=torch)))
    assert r.status == "fail"
    assert "torch 2.13.0+cpu is a CPU-only build" in r.finding


def test_versions_skip_without_torch() -> None:
    torch = TorchInfo(None, None, "/usr/bin/python3")
    r = only(CHECK["versions"](context(poll(NVML / "h200-idle.json"), torch=torch)))
    assert r.status == "skip"
    assert "torch not installed for /usr/bin/python3" in r.finding
    assert "driver 580.159.04 (CUDA ≤ 13.0)" in r.finding


def test_versions_skip_without_driver(tmp_path: Path) -> None:
    snap = poll(NVML / "no-nvml.json", sysfs=empty_sysfs(tmp_path))
    assert only(CHECK["versions"](context(snap))).status == "skip"


def test_versions_prefer_the_probe_workers_software_block() -> None:
    doc = probe_doc()
    doc["software"]["torch"], doc["software"]["cuda"] = "2.12.0+cu132", "13.2"
    snap = poll(NVML / "h200-idle.json")
    r = only(CHECK["versions"](probed(snap, doc)))
    assert r.status == "warn"  # 13.2 is newer than driver 580's 13.0: minor compatibility
    assert "torch 2.12.0+cu132 built for CUDA 13.2 (probe worker)" in r.finding


# -- idle ----------------------------------------------------------------------------------------


def test_idle_passes_on_an_idle_gpu() -> None:
    r = only(CHECK["idle"](context(poll(NVML / "h200-idle.json"))))
    assert (r.status, r.finding) == ("pass", "no other compute process, utilization 0%")


def test_idle_fails_on_a_busy_gpu(tmp_path: Path) -> None:
    snap = derived(
        tmp_path,
        compute_processes=[{"pid": 4242, "used_memory": 1}],
        utilization={"gpu": 87, "memory": 30},
    )
    r = only(CHECK["idle"](context(snap, process_names={4242: "python"})))
    assert r.status == "fail"
    assert r.finding == "pid 4242 (python) computing on the GPU, utilization 87%"
    assert r.action.startswith("stop pid 4242 (python): kill 4242")


def test_idle_ignores_sparkdiags_own_process(tmp_path: Path) -> None:
    snap = derived(tmp_path, compute_processes=[{"pid": 4242, "used_memory": 1}])
    r = only(CHECK["idle"](context(snap, own_pids=frozenset({4242}))))
    assert r.status == "pass"


def test_idle_warns_on_utilization_without_a_visible_process(tmp_path: Path) -> None:
    snap = derived(tmp_path, utilization={"gpu": 45, "memory": 10})
    r = only(CHECK["idle"](context(snap)))
    assert r.status == "warn"
    assert r.finding == "utilization 45% with no compute process visible here"


def test_idle_skips_when_nothing_is_reported(tmp_path: Path) -> None:
    snap = derived(tmp_path, compute_processes=NOT_SUPPORTED, utilization=NOT_SUPPORTED)
    assert only(CHECK["idle"](context(snap))).status == "skip"


# -- temperatures --------------------------------------------------------------------------------


def test_gpu_temperature_outcomes(tmp_path: Path) -> None:
    def run(temp: int) -> tuple[str, str]:
        snap = poll(nvml_fixture(tmp_path, set={"temperature/0": temp}, name=f"t{temp}.json"))
        r = only(CHECK["gpu-temperature"](context(snap)))
        return r.status, r.finding

    assert run(40) == ("pass", "GPU 40 °C (slowdown 89 °C)")
    assert run(86) == ("warn", "GPU 86 °C, within 5 °C of slowdown 89 °C")
    assert run(90) == ("fail", "GPU 90 °C ≥ slowdown 89 °C")


def test_gpu_temperature_of_gb10_against_its_shutdown_threshold(tmp_path: Path) -> None:
    r = only(CHECK["gpu-temperature"](context(poll(NVML / "gb10-idle.json"))))
    assert (r.status, r.finding) == (
        "pass",
        "GPU 36 °C (shutdown 105 °C, no slowdown threshold reported)",
    )
    hot = derived(tmp_path, "gb10-idle.json", **{"temperature/0": 92})
    r = only(CHECK["gpu-temperature"](context(hot)))
    assert r.status == "fail" and r.finding.startswith("GPU 92 °C ≥ 90 °C (shutdown 105 °C")


def test_gpu_temperature_skips_when_not_reported(tmp_path: Path) -> None:
    snap = derived(tmp_path, **{"temperature/0": NOT_SUPPORTED})
    assert only(CHECK["gpu-temperature"](context(snap))).status == "skip"


def test_memory_temperature_outcomes(tmp_path: Path) -> None:
    def run(temp: float, **more: object) -> tuple[str, str, str]:
        fixture = nvml_fixture(
            tmp_path, set={"memory_temperature": temp, **more}, name=f"m{temp}{len(more)}.json"
        )
        r = only(CHECK["memory-temperature"](context(poll(fixture))))
        return r.status, r.finding, r.action

    assert run(43.0)[:2] == ("pass", "memory 43 °C (limit 95 °C)")
    assert run(82.0)[:2] == ("warn", "memory 82 °C, close to 85 °C")
    status, finding, action = run(91.0)
    assert (status, finding) == ("fail", "memory 91 °C ≥ 85 °C")
    assert "wait until memory < 80 °C before benchmarking" in action
    limited = run(84.0, **{"temperature_threshold/2": 84})
    assert limited[:2] == ("fail", "memory 84 °C ≥ its limit 84 °C")


def test_memory_temperature_of_gb10_is_not_reported() -> None:
    r = only(CHECK["memory-temperature"](context(poll(NVML / "gb10-idle.json"))))
    assert r.status == "skip"
    assert "unified LPDDR5X memory has no sensor" in r.finding


# -- clock event reasons -------------------------------------------------------------------------


def _reasons(tmp_path: Path, mask: int, **more: object) -> tuple[str, str, str]:
    fixture = nvml_fixture(
        tmp_path, set={"clock_event_reasons": mask, **more}, name=f"r{mask}{len(more)}.json"
    )
    r = only(CHECK["clock-reasons"](context(poll(fixture))))
    return r.status, r.finding, r.action


def test_clock_reasons_gpu_idle_passes(tmp_path: Path) -> None:
    assert _reasons(tmp_path, 0x1)[:2] == ("pass", "gpu_idle (0x1)")
    assert _reasons(tmp_path, 0x0)[:2] == ("pass", "none (0x0)")


def test_clock_reasons_thermal_slowdown_fails(tmp_path: Path) -> None:
    status, finding, action = _reasons(tmp_path, 0x20, **{"temperature/0": 88})
    assert status == "fail"
    assert finding.startswith("sw_thermal_slowdown (0x20): thermal slowdown (software) at gpu 88")
    assert "airflow" in action


def test_clock_reasons_hw_slowdown_and_power_brake_fail(tmp_path: Path) -> None:
    status, finding, _ = _reasons(tmp_path, 0x8)
    assert status == "fail" and "hardware slowdown" in finding
    status, finding, action = _reasons(tmp_path, 0x81)
    assert status == "fail" and "power brake" in finding and "PSU" in action


def test_clock_reasons_power_cap_at_idle_warns(tmp_path: Path) -> None:
    status, finding, action = _reasons(tmp_path, 0x5)
    assert status == "warn"
    assert finding == "gpu_idle, sw_power_cap (0x5): power cap active at idle (78 of 700 W)"
    assert "sudo nvidia-smi -pl" in action


def test_clock_reasons_power_cap_under_load_passes(tmp_path: Path) -> None:
    status, finding, _ = _reasons(
        tmp_path,
        0x4,
        compute_processes=[{"pid": 506, "used_memory": 1}],
        utilization={"gpu": 100, "memory": 24},
    )
    assert status == "pass" and "power cap under load is normal" in finding


def test_clock_reasons_application_clocks_warn(tmp_path: Path) -> None:
    status, _, action = _reasons(tmp_path, 0x2)
    assert status == "warn" and "nvidia-smi -rac" in action


def test_clock_reasons_skip_when_not_reported(tmp_path: Path) -> None:
    snap = derived(tmp_path, clock_event_reasons=NOT_SUPPORTED)
    assert only(CHECK["clock-reasons"](context(snap))).status == "skip"


# -- the GPU's PCIe link -------------------------------------------------------------------------


def test_pcie_gpu_at_maximum_passes() -> None:
    r = only(CHECK["pcie-gpu"](context(poll(NVML / "h200-idle.json"))))
    assert (r.status, r.finding) == ("pass", "00000000:00:06.0 Gen5 x16 (max)")


def test_pcie_gpu_lane_degraded_fails(tmp_path: Path) -> None:
    r = only(CHECK["pcie-gpu"](context(derived(tmp_path, pcie_width=8))))
    assert (r.status, r.finding) == ("fail", "00000000:00:06.0 x8 of x16")
    assert "lspci -vv -s 0000:00:06.0" in r.action


def test_pcie_gpu_low_speed_at_idle_is_legitimate(tmp_path: Path) -> None:
    r = only(CHECK["pcie-gpu"](context(derived(tmp_path, pcie_gen=1))))
    assert r.status == "pass"
    assert r.finding.startswith("00000000:00:06.0 Gen1 of Gen5 at idle, x16")


def test_pcie_gpu_low_speed_under_load_fails(tmp_path: Path) -> None:
    idle = derived(tmp_path, pcie_gen=1)
    loaded = poll(nvml_fixture(tmp_path, set={"pcie_gen": 4}, name="load.json"))
    gpu = idle.gpus[0]
    ctx = context(idle, probes={0: GpuProbe(gpu, load=(idle.gpus[0], loaded.gpus[0]))})
    r = only(CHECK["pcie-gpu"](ctx))
    assert (r.status, r.finding) == ("fail", "00000000:00:06.0 Gen4 of Gen5 under load, x16")


def test_pcie_gpu_full_speed_under_load_passes(tmp_path: Path) -> None:
    idle = derived(tmp_path, pcie_gen=1)
    loaded = poll(NVML / "h200-load.json")
    ctx = context(idle, probes={0: GpuProbe(idle.gpus[0], load=(loaded.gpus[0],))})
    r = only(CHECK["pcie-gpu"](ctx))
    assert (r.status, r.finding) == ("pass", "00000000:00:06.0 Gen5 x16 under load (Gen1 at idle)")


def test_pcie_gpu_of_gb10_is_skipped() -> None:
    r = only(CHECK["pcie-gpu"](context(poll(NVML / "gb10-idle.json"))))
    assert r.status == "skip" and "integrated GPU" in r.finding


# -- modes ---------------------------------------------------------------------------------------


def test_persistence_outcomes(tmp_path: Path) -> None:
    assert only(CHECK["persistence"](context(poll(NVML / "h200-idle.json")))).status == "pass"
    r = only(CHECK["persistence"](context(derived(tmp_path, persistence_mode=0))))
    assert r.status == "warn" and r.finding.startswith("persistence mode off")
    assert r.action.startswith("sudo nvidia-smi -i 0 -pm 1")
    off = poll(nvml_fixture(tmp_path, set={"persistence_mode": NOT_SUPPORTED}, name="p.json"))
    assert only(CHECK["persistence"](context(off))).status == "skip"


def test_compute_mode_outcomes(tmp_path: Path) -> None:
    r = only(CHECK["compute-mode"](context(poll(NVML / "h200-idle.json"))))
    assert (r.status, r.finding) == ("pass", "compute mode default")
    r = only(CHECK["compute-mode"](context(derived(tmp_path, compute_mode=2))))
    assert r.status == "fail" and "prohibited" in r.finding and "-c DEFAULT" in r.action
    excl = poll(nvml_fixture(tmp_path, set={"compute_mode": 3}, name="x.json"))
    r = only(CHECK["compute-mode"](context(excl)))
    assert (r.status, r.finding) == (
        "pass",
        "compute mode exclusive_process (one process at a time)",
    )


def test_mig_outcomes(tmp_path: Path) -> None:
    assert only(CHECK["mig"](context(poll(NVML / "h200-idle.json")))).finding == "MIG off"
    r = only(CHECK["mig"](context(derived(tmp_path, mig_mode=[1, 1]))))
    assert r.status == "warn" and r.finding.startswith("MIG on")
    assert "-mig 0" in r.action
    r = only(CHECK["mig"](context(poll(NVML / "gb10-idle.json"))))
    assert (r.status, r.finding) == ("skip", "MIG not supported")


def test_multi_gpu_results_are_one_per_gpu() -> None:
    results = CHECK["gpu-temperature"](context(poll(NVML / "h200-x8.json")))
    assert [r.gpu for r in results] == [str(i) for i in range(8)]


def test_fixture_helpers_write_valid_fixtures(tmp_path: Path) -> None:
    path = nvml_fixture(tmp_path, set={"temperature/0": 50})
    assert json.loads(path.read_text())["devices"][0]["set"] == {"temperature/0": 50}
    snap = replace(poll(path), excluded_pids=frozenset({1}))
    assert snap.gpus[0].temperature_celsius["gpu"] == 50.0


def test_pcie_gpu_passes_only_where_its_width_was_compared(tmp_path: Path) -> None:
    """ "Gen5 x16 (max)" was said where NVML gave no maximum, and "x64 (max)" of a x16 link."""
    unread = {"error": "NOT_SUPPORTED"}
    r = only(CHECK["pcie-gpu"](context(derived(tmp_path, pcie_max_width=unread))))
    assert (r.status, r.finding) == (
        "skip",
        "00000000:00:06.0 Gen5 x16: width not compared (maximum width not read)",
    )
    (tmp_path / "b").mkdir()
    r = only(CHECK["pcie-gpu"](context(derived(tmp_path / "b", pcie_width=64))))
    assert r.status == "skip" and "current width above its maximum" in r.finding
    (tmp_path / "c").mkdir()
    r = only(CHECK["pcie-gpu"](context(derived(tmp_path / "c", pcie_max_gen=unread))))
    assert (r.status, r.finding) == (
        "pass",
        "00000000:00:06.0 Gen5 x16 (max width; maximum generation not read)",
    )


@pytest.mark.parametrize(("key", "value"), [("temperature/0", -300), ("temperature/0", 1e9)])
def test_an_implausible_temperature_warns_as_a_misreading(
    tmp_path: Path, key: str, value: float
) -> None:
    """-300 °C passed as a cool GPU and 1e9 °C failed with advice about airflow: neither is a
    temperature a running GPU has, so the row says the sensor or driver misreports it."""
    r = only(CHECK["gpu-temperature"](context(derived(tmp_path, **{key: value}))))
    assert r.status == "warn"
    assert (
        r.finding
        == f"GPU reads {value:g} °C, outside -40 to 150 °C: the sensor or the driver misreports it"
    )
    assert "nvidia-smi -q -d TEMPERATURE -i 0" in r.action and "airflow" not in r.action


def test_an_implausible_memory_temperature_warns(tmp_path: Path) -> None:
    r = only(CHECK["memory-temperature"](context(derived(tmp_path, memory_temperature=5000.0))))
    assert (r.status, r.finding) == (
        "warn",
        "memory reads 5000 °C, outside -40 to 150 °C: the sensor or the driver misreports it",
    )


def _gpu_bound_to(tmp_path: Path, driver: str) -> Path:
    """The lent H200 VM's sysfs with its GPU (0000:00:06.0) bound to ``driver``."""
    root = tmp_path / driver
    shutil.copytree(SYSFS / "h200-vm", root, symlinks=True)
    link = root / "devices" / "pci0000:00" / "0000:00:06.0" / "driver"
    link.unlink()
    link.symlink_to(f"../../../bus/pci/drivers/{driver}")
    return root


def test_nvml_down_with_the_gpu_passed_through_to_a_vm_skips(tmp_path: Path) -> None:
    """A KVM host whose GPU is bound to vfio-pci: the GPU is a virtual machine's, and loading
    the NVIDIA driver (the fail row's advice) would take it from the VM."""
    snap = poll(NVML / "no-nvml.json", sysfs=_gpu_bound_to(tmp_path, "vfio-pci"))
    r = only(CHECK["nvml"](context(snap)))
    assert r.status == "skip"
    assert "bound to vfio-pci (0000:00:06.0), passed through to a virtual machine" in r.finding
    assert "inside the virtual machine" in r.action
    assert only(CHECK["nvml"](context(snap, expect_gpus=1))).status == "fail"
    bus = only(CHECK["gpus-on-bus"](context(snap)))
    assert bus.status == "pass", bus.finding
    assert "1 bound to vfio-pci, passed through to virtual machines" in bus.finding


def test_nvml_down_with_nouveau_holding_the_gpu_says_so(tmp_path: Path) -> None:
    snap = poll(NVML / "no-nvml.json", sysfs=_gpu_bound_to(tmp_path, "nouveau"))
    r = only(CHECK["nvml"](context(snap)))
    assert r.status == "fail"
    assert r.finding.endswith("on the PCI bus (0000:00:06.0, bound to nouveau)")
    assert "blacklist" in r.action
