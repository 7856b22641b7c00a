"""Health (ECC, row remapping, XID) and machine-wide checks of ``sparkdiag check``: host PCIe
links, execution context, CPU governor, unified memory. The host readers behind them are tested
in ``tests/test_sources_host_extra.py``."""

from __future__ import annotations

from pathlib import Path

from sparkdiag.check.health_checks import check_ecc, check_row_remap, check_xid, parse_xids
from sparkdiag.check.host_checks import check_context, check_governor, check_unified_memory
from sparkdiag.check.model import CheckResult, KernelLog
from sparkdiag.check.pcie_checks import check_pcie_host
from sparkdiag.snapshot import HostSample, MemoryPressure
from sparkdiag.sources.host import cpufreq
from tests.support.check import (
    NVML,
    ROOTFS,
    SYSFS,
    context,
    copy_tree,
    derived,
    empty_sysfs,
    only,
    poll,
)

GB = 1e9

# -- ECC and row remapping --------------------------------------------------------------------


def test_ecc_outcomes(tmp_path: Path) -> None:
    r = only(check_ecc(context(poll(NVML / "h200-idle.json"))))
    assert (r.status, r.finding) == ("pass", "0 uncorrected, 0 corrected ECC errors (lifetime)")
    bad = derived(tmp_path, **{"ecc_total/1": 3, "remapped_rows": [0, 1, 1, 0]})
    r = only(check_ecc(context(bad)))
    assert (r.status, r.finding) == ("fail", "3 uncorrected, 0 corrected ECC errors (lifetime)")
    assert "nvidia-smi -r" in r.action


def test_ecc_repaired_by_row_remapping_warns(tmp_path: Path) -> None:
    snap = derived(tmp_path, **{"ecc_total/1": 2, "remapped_rows": [0, 2, 0, 0]})
    r = only(check_ecc(context(snap)))
    assert r.status == "warn" and "row remapping repaired them" in r.finding


def test_ecc_not_reported_on_gb10_skips() -> None:
    assert only(check_ecc(context(poll(NVML / "gb10-idle.json")))).status == "skip"


def test_row_remap_outcomes(tmp_path: Path) -> None:
    r = only(check_row_remap(context(poll(NVML / "h200-idle.json"))))
    assert (r.status, r.finding) == ("pass", "no pending or failed remap (0 rows remapped)")
    r = only(check_row_remap(context(derived(tmp_path, remapped_rows=[0, 1, 1, 0]))))
    assert (r.status, r.finding) == ("fail", "row remap pending (1 rows remapped)")
    assert r.action.endswith("sudo nvidia-smi -r -i 0 (or reboot)")
    (tmp_path / "b").mkdir()
    r = only(check_row_remap(context(derived(tmp_path / "b", remapped_rows=[3, 5, 0, 1]))))
    assert (r.status, r.finding) == ("fail", "row remapping failed (8 rows remapped)")
    assert "RMA" in r.action
    assert only(check_row_remap(context(poll(NVML / "gb10-idle.json")))).status == "skip"


# -- XID -----------------------------------------------------------------------------------------

XID_79 = (
    "NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)
XID_13 = "NVRM: Xid (PCI:0000:00:06): 13, Graphics Exception: ESR 0x404600=0x80000002"


def test_xid_none_passes() -> None:
    log = KernelLog(("Linux version 6.8", "nvidia: module loaded"), "/dev/kmsg")
    r = only(check_xid(context(poll(NVML / "h200-idle.json"), kernel_log=log)))
    assert (r.status, r.finding) == ("pass", "no XID event in the kernel log (/dev/kmsg)")


def test_xid_hardware_event_fails_and_names_the_gpu() -> None:
    log = KernelLog((XID_79,), "/dev/kmsg")
    r = only(check_xid(context(poll(NVML / "h200-idle.json"), kernel_log=log)))
    assert r.status == "fail"
    assert r.finding == (
        "XID 79 ×1 (0000:00:06, GPU 0): GPU has fallen off the bus [critical] (since boot)"
    )
    assert "power the machine off and on" in r.action and "xid-errors" in r.action


def test_xid_application_event_warns() -> None:
    log = KernelLog((XID_13, XID_13), "dmesg")
    r = only(check_xid(context(poll(NVML / "h200-idle.json"), kernel_log=log)))
    assert r.status == "warn"
    assert r.finding.startswith("XID 13 ×2 (0000:00:06, GPU 0): graphics engine exception")


def test_xid_unreadable_kernel_log_skips() -> None:
    log = KernelLog(None, "/dev/kmsg", "cannot open /dev/kmsg: Operation not permitted")
    r = only(check_xid(context(poll(NVML / "h200-idle.json"), kernel_log=log)))
    assert r.status == "skip" and "Operation not permitted" in r.finding
    assert "dmesg_restrict" in r.action


def test_parse_xids_of_kmsg_and_dmesg_lines() -> None:
    lines = (f"[  12.5] {XID_79}", XID_13, "unrelated")
    assert parse_xids(lines) == [("0000:00:06", 79), ("0000:00:06", 13)]


# -- host PCIe links -----------------------------------------------------------------------------


FE = "NVIDIA DGX Spark Founders Edition"


def _second_cx7_at(tmp_path: Path, tree: str, lanes: int, dmi: bool = True) -> Path:
    """A copy of a GB10 sysfs tree whose second ConnectX-7 (both functions, its root port)
    trained at ``lanes``; without DMI when ``dmi`` is False (an unidentified machine)."""
    root = copy_tree(SYSFS / tree, tmp_path / f"{tree}-x{lanes}")
    for address in ("0002:00:00.0", "0002:01:00.0", "0002:01:00.1"):
        width = root / "bus" / "pci" / "devices" / address / "current_link_width"
        width.resolve().write_text(f"{lanes}\n")
    if not dmi:
        (root / "class" / "dmi" / "id").unlink()
    return root


def _host_links(sysfs: Path) -> dict[str, CheckResult]:
    snap = poll(NVML / "gb10-idle.json", sysfs=sysfs)
    return {r.finding.split()[0]: r for r in check_pcie_host(context(snap))}


def test_pcie_host_on_a_healthy_founders_edition_passes_and_names_it() -> None:
    results = _host_links(SYSFS / "dgx-spark")
    assert set(results) == {
        "0000:01:00.0",
        "0000:01:00.1",
        "0002:01:00.0",
        "0002:01:00.1",  # ConnectX-7
        "0004:01:00.0",
        "0007:01:00.0",
        "0009:01:00.0",  # NVMe, 10GbE, Wi-Fi
    }
    assert all(r.status == "pass" for r in results.values())
    assert (
        results["0002:01:00.1"].finding
        == f"0002:01:00.1 mlx5_core Gen5 x4 (max, as the {FE} is built)"
    )
    assert results["0002:01:00.1"].data["platform"] == FE
    assert results["0007:01:00.0"].finding == "0007:01:00.0 r8127 Gen4 x1 (max)"
    # the Wi-Fi is a network-class device: judged like the NICs
    assert results["0009:01:00.0"].finding == "0009:01:00.0 mt7925e Gen3 x1 (max)"


def test_pcie_host_x2_on_a_founders_edition_is_a_fault(tmp_path: Path) -> None:
    results = _host_links(_second_cx7_at(tmp_path, "dgx-spark", 2))
    for address in ("0002:01:00.0", "0002:01:00.1"):
        bad = results[address]
        assert bad.status == "fail"
        assert bad.finding == (
            f"{address} mlx5_core x2 of x4 (Gen5): the {FE} trains its second ConnectX-7 root "
            "port at x4"
        )
        assert "remove AC power" in bad.action and f"lspci -vv -s {address}" in bad.action
        assert bad.data["design_width"] == 4
    assert results["0000:01:00.0"].status == "pass"


def test_pcie_host_x2_on_an_ascent_gx10_is_its_design(tmp_path: Path) -> None:
    results = _host_links(SYSFS / "asus-gx10")
    assert all(r.status == "pass" for r in results.values())
    assert results["0002:01:00.0"].finding == (
        "0002:01:00.0 mlx5_core Gen5 x2 of x4, as designed: the ASUS Ascent GX10 wires its second "
        "ConnectX-7 root port with two lanes (board design, not a fault)"
    )
    assert results["0000:01:00.0"].finding == (
        "0000:01:00.0 mlx5_core Gen5 x4 (max, as the ASUS Ascent GX10 is built)"
    )
    # narrower than the design is still a fault, on the GX10 too
    worse = _host_links(_second_cx7_at(tmp_path, "asus-gx10", 1))["0002:01:00.0"]
    assert worse.status == "fail"
    assert worse.finding.endswith(
        "the ASUS Ascent GX10 trains its second ConnectX-7 root port at x2"
    )


def test_pcie_host_x2_on_an_unidentified_machine_fails_without_blaming_firmware(
    tmp_path: Path,
) -> None:
    bad = _host_links(_second_cx7_at(tmp_path, "dgx-spark", 2, dmi=False))["0002:01:00.0"]
    assert (bad.status, bad.finding) == ("fail", "0002:01:00.0 mlx5_core x2 of x4 (Gen5)")
    assert "ASUS Ascent GX10 wires its second ConnectX-7 root port x2 by design" in bad.action
    assert "firmware fault" not in bad.action
    assert bad.data["platform"] == "an unidentified machine (no DMI)"


def test_pcie_host_speed_below_max_warns(tmp_path: Path) -> None:
    tree = copy_tree(SYSFS / "dgx-spark", tmp_path / "sysfs")
    nvme = tree / "bus" / "pci" / "devices" / "0004:01:00.0" / "current_link_speed"
    nvme.resolve().write_text("16.0 GT/s PCIe\n")  # the Samsung PM9E1 is a Gen5 x4 drive
    snap = poll(NVML / "gb10-idle.json", sysfs=tree)
    r = next(r for r in check_pcie_host(context(snap)) if r.finding.startswith("0004:01:00.0"))
    assert (r.status, r.finding) == ("warn", "0004:01:00.0 nvme Gen4 of Gen5, x4")


def test_pcie_host_without_nic_or_nvme_skips(tmp_path: Path) -> None:
    snap = poll(NVML / "h200-idle.json", sysfs=empty_sysfs(tmp_path))
    assert only(check_pcie_host(context(snap))).status == "skip"


# -- context -------------------------------------------------------------------------------------


def test_context_native_passes() -> None:
    snap = poll(NVML / "h200-idle.json", rootfs=ROOTFS / "native")
    r = only(check_context(context(snap)))
    assert (r.status, r.finding) == ("pass", "native (no container detected)")


def test_context_native_with_one_kind_of_sign_says_what_it_saw() -> None:
    """The lent VM has /.dockerenv and a stale /run/systemd/container: native by the rule (one
    kind of sign is not enough), and the row said "no container detected" of it."""
    snap = poll(NVML / "h200-idle.json", rootfs=ROOTFS / "lent-vm")
    r = only(check_context(context(snap)))
    assert (r.status, r.finding) == (
        "pass",
        "native: one kind of container sign only, not enough (/.dockerenv exists; "
        "/run/systemd/container names docker, but /run is not a tmpfs (image leftover))",
    )


def test_context_container_warns_with_how_to_measure_the_gap() -> None:
    snap = poll(NVML / "h200-idle.json", rootfs=ROOTFS / "docker")
    r = only(check_context(context(snap)))
    assert r.status == "warn"
    assert r.finding.startswith("inside a container (docker: /.dockerenv")
    assert "sparkdiag compare -- docker run -i --rm --gpus all <image> python3 -" in r.action


def test_context_unknown_skips() -> None:
    from dataclasses import replace

    snap = replace(poll(NVML / "h200-idle.json"), context=None)
    assert only(check_context(context(snap))).status == "skip"


# -- CPU governor --------------------------------------------------------------------------------


def _cpus(tmp_path: Path, *governors: str) -> Path:
    root = tmp_path / "sysfs-cpu"
    for n, governor in enumerate(governors):
        d = root / "devices" / "system" / "cpu" / f"cpu{n}" / "cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text(governor + "\n")
    (root / "devices" / "system" / "cpu" / "cpufreq").mkdir(parents=True, exist_ok=True)
    return root


def test_governor_performance_passes(tmp_path: Path) -> None:
    governors, note = cpufreq.read_governors(_cpus(tmp_path, "performance", "performance"))
    assert governors == {"cpu0": "performance", "cpu1": "performance"} and note == ""
    snap = poll(NVML / "h200-idle.json")
    r = only(check_governor(context(snap, governors=governors)))
    assert (r.status, r.finding) == ("pass", "performance on all 2 CPUs")


def test_governor_powersave_warns(tmp_path: Path) -> None:
    governors, _ = cpufreq.read_governors(_cpus(tmp_path, "schedutil", "schedutil", "performance"))
    r = only(check_governor(context(poll(NVML / "h200-idle.json"), governors=governors)))
    assert r.status == "warn"
    assert r.finding == "schedutil on 2, performance on 1 of 3 CPUs (not performance)"
    assert r.action.startswith("sudo cpupower frequency-set -g performance")


def test_governor_without_cpufreq_skips(tmp_path: Path) -> None:
    governors, note = cpufreq.read_governors(empty_sysfs(tmp_path))
    assert governors is None
    r = only(
        check_governor(context(poll(NVML / "h200-idle.json"), governors=None, governor_note=note))
    )
    assert r.status == "skip" and "devices/system/cpu" in r.finding


# -- unified memory ------------------------------------------------------------------------------


def _gb10(total: float, available: float, free: float, cached: float) -> str:
    memory = {
        "total": total * GB,
        "available": available * GB,
        "free": free * GB,
        "cached": cached * GB,
    }
    snap = poll(
        NVML / "gb10-idle.json", sysfs=SYSFS / "dgx-spark", host=HostSample(memory_bytes=memory)
    )
    r = only(check_unified_memory(context(snap)))
    return f"{r.status}: {r.finding} | {r.action}"


def test_unified_memory_with_headroom_passes() -> None:
    assert _gb10(128, 110, 100, 8).startswith(
        "pass: available 110.0 of 128.0 GB (86%), free 100.0 GB, page cache 8.0 GB"
    )


def test_unified_memory_full_page_cache_warns_with_drop_caches() -> None:
    text = _gb10(128, 100, 40, 58)
    assert text.startswith("warn: available 100.0 of 128.0 GB (78%), free 40.0 GB, page cache 58.0")
    assert "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches" in text


def test_unified_memory_low_available_warns_and_very_low_fails() -> None:
    assert _gb10(128, 25, 20, 4).startswith("warn: available 25.0 of 128.0 GB (20%)")
    assert _gb10(128, 9, 5, 3).startswith("fail: available 9.0 of 128.0 GB (7%)")


def _spark_memory(rootfs: str) -> CheckResult:
    """unified-memory on a GB10 whose host memory and PSI come from a fixture root."""
    snap = poll(NVML / "gb10-idle.json", sysfs=SYSFS / "dgx-spark", rootfs=ROOTFS / rootfs)
    return only(check_unified_memory(context(snap)))


def test_unified_memory_of_an_idle_spark_passes() -> None:
    r = _spark_memory("dgx-spark")
    assert (r.status, r.finding) == (
        "pass",
        "available 126.5 of 130.7 GB (97%), free 121.8 GB, page cache 3.9 GB; "
        "stalled on memory 0% (some) / 0% (full) of the last minute",
    )
    assert r.data["platform"] == "NVIDIA DGX Spark Founders Edition"


def test_unified_memory_under_sustained_pressure_fails() -> None:
    r = _spark_memory("dgx-spark-pressure")
    assert r.status == "fail"
    assert r.finding == (
        "available 6.3 of 130.7 GB (5%), free 0.9 GB, page cache 2.4 GB; "
        "stalled on memory 61% (some) / 23% (full) of the last minute"
    )
    assert "every task is waiting for memory" in r.action
    assert "drop_caches" in r.action
    assert r.data["swap_in_pages"] == 1834471.0


def _psi(some: float, full: float) -> CheckResult:
    memory = {"total": 128 * GB, "available": 100 * GB, "free": 90 * GB, "cached": 4 * GB}
    host = HostSample(
        memory_bytes=memory,
        pressure=MemoryPressure(averages={"some": {"60s": some}, "full": {"60s": full}}),
    )
    snap = poll(NVML / "gb10-idle.json", sysfs=SYSFS / "dgx-spark", host=host)
    return only(check_unified_memory(context(snap)))


def test_unified_memory_pressure_thresholds() -> None:
    # plenty available, but the kernel stalls on memory: PSI is what says so
    assert _psi(0.10, 0.10).status == "fail"
    assert _psi(0.35, 0.09).status == "warn"  # near miss of the failure: some task waits
    assert _psi(0.10, 0.0).status == "warn"
    assert _psi(0.09, 0.0).status == "pass"  # near miss of the warning


def test_unified_memory_skips_on_a_dedicated_gpu_and_without_host_memory() -> None:
    r = only(check_unified_memory(context(poll(NVML / "h200-idle.json"))))
    assert (r.status, r.finding) == (
        "skip",
        "not a unified-memory machine (GPU has its own memory)",
    )
    from dataclasses import replace

    snap = replace(poll(NVML / "gb10-idle.json"), host=None)
    assert only(check_unified_memory(context(snap))).finding == "host memory not readable"


def _one_link(**fields: object) -> CheckResult:
    """pcie-host's row for one NIC link on an unidentified machine (no DMI in the fixture)."""
    from dataclasses import replace

    from sparkdiag.snapshot import PcieLink

    link = {
        "address": "0000:03:00.0",
        "device_class": "network",
        "driver": "",
        "current_speed_tps": 16e9,
        "max_speed_tps": 16e9,
        "current_width": 16,
        "max_width": 16,
        **fields,
    }
    snap = replace(poll(NVML / "h200-idle.json"), pcie_links=(PcieLink(**link),))  # type: ignore[arg-type]
    return only(check_pcie_host(context(snap)))


def test_pcie_host_endpoint_at_x0_fails_even_without_a_maximum() -> None:
    """A NIC with no trained lane passed as "x0 (max)" when its max_link_width was not read."""
    r = _one_link(current_width=0, max_width=None, max_speed_tps=None)
    assert (r.status, r.finding) == (
        "fail",
        "0000:03:00.0 network x0: the link is down (no lane trained)",
    )
    assert "lspci -vv -s 0000:03:00.0" in r.action


def test_pcie_host_passes_only_on_what_it_compared() -> None:
    """ "(max)" was said of a link whose maxima were never read; now a width not compared skips,
    and a pass names what was not compared."""
    r = _one_link(max_width=None, max_speed_tps=None)
    assert (r.status, r.finding) == (
        "skip",
        "0000:03:00.0 network Gen4 x16: width not compared (maximum width not read; maximum "
        "speed not read)",
    )
    r = _one_link(current_width=None)
    assert r.status == "skip" and "current width not read" in r.finding
    r = _one_link(current_width=16, max_width=8)
    assert r.status == "skip" and "above its maximum" in r.finding
    r = _one_link(max_speed_tps=None)
    assert (r.status, r.finding) == (
        "pass",
        "0000:03:00.0 network Gen4 x16 (max width; maximum speed not read)",
    )
    assert _one_link().finding == "0000:03:00.0 network Gen4 x16 (max)"
