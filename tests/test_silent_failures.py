"""The silent failures (issue 20): the stalled-GPU signature, NVIDIA GPU functions on the bus
against NVML's list, the driver's recovery action and fabric state, XIDs by the tiers of
NVIDIA's XID catalog; their readings, series, check rows and the daemon's log line, on
fixtures (NVML, sysfs, kernel logs). The alerts' promtool tests are prometheus/tests/silent.yml.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sparkdiag.check.catalog import CHECKS
from sparkdiag.check.gather import Sources, gather
from sparkdiag.check.gpu_checks import check_gpus_on_bus, pci_key
from sparkdiag.check.health_checks import check_fabric, check_recovery_action, check_xid
from sparkdiag.check.model import CheckContext, KernelLog
from sparkdiag.check.stall_checks import STALL_SAMPLES, check_stall
from sparkdiag.exporter.registry import build_registry
from sparkdiag.snapshot import Snapshot
from sparkdiag.sources.host.kernel_log import read_kernel_log
from sparkdiag.sources.host.sysfs import PcieSource
from sparkdiag.sources.nvml.xid import BUCKETS, INCIDENT_GAP_SECONDS, XIDS, describe
from sparkdiag.telemetry.build import build_poller
from sparkdiag.telemetry.stall import StallLog, stall_signature
from tests.support import invoke_cli
from tests.support.check import GOOD_TORCH, NVML, ROOTFS, SYSFS, context, only, poll, settings

H200_0 = {"gpu": "0", "uuid": "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"}
MISSING = (
    *("--nvml-fixture", str(NVML / "h200-x8-one-missing.json")),
    *("--path.sysfs", str(SYSFS / "h200-x8"), "--path.rootfs", str(ROOTFS / "native")),
)


def _registry(snap: Snapshot) -> CollectorRegistry:
    return build_registry(lambda: snap)


def _value(snap: Snapshot, name: str, labels: dict[str, str] | None = None) -> float | None:
    return _registry(snap).get_sample_value(name, labels or {})


# -- NVIDIA GPU functions on the bus ------------------------------------------------------------


def test_gpu_functions_are_nvidia_display_and_3d_controllers_only() -> None:
    eight = PcieSource(SYSFS / "h200-x8").gpu_functions()
    assert eight == tuple(f"0000:{bus}:00.0" for bus in (18, 28, 38, 48, 58, 68, 78, 88))
    # the GB10's own root ports are NVIDIA functions too (10de:22ce, class 0x0604): not GPUs
    assert PcieSource(SYSFS / "dgx-spark").gpu_functions() == ("000f:01:00.0",)
    assert PcieSource(SYSFS / "h200-vm").gpu_functions() == ("0000:00:06.0",)


def test_pci_addresses_of_nvml_and_sysfs_compare_equal() -> None:
    assert pci_key("0000000F:01:00.0") == pci_key("000f:01:00.0") == (15, 1, 0, 0)
    assert pci_key("00000000:58:00.0") == pci_key("0000:58:00.0")
    assert pci_key("garbage") is None


def test_eight_on_the_bus_seven_in_nvml_is_exported_and_fails_naming_the_missing_one() -> None:
    snap = poll(NVML / "h200-x8-one-missing.json", sysfs=SYSFS / "h200-x8")
    assert _value(snap, "sparkdiag_gpu_pci_devices") == 8
    assert sum(g.up for g in snap.gpus) == 7
    r = only(check_gpus_on_bus(context(snap)))
    assert r.status == "fail"
    assert r.finding == "8 NVIDIA GPU functions on the PCI bus, 1 not listed by NVML: 0000:58:00.0"
    assert "lspci -vv -s 0000:58:00.0" in r.action and r.data["missing"] == ["0000:58:00.0"]


def test_every_gpu_on_the_bus_listed_passes() -> None:
    snap = poll(NVML / "h200-x8.json", sysfs=SYSFS / "h200-x8")
    r = only(check_gpus_on_bus(context(snap)))
    assert (r.status, r.finding) == (
        "pass",
        "8 NVIDIA GPU functions on the PCI bus, every one listed by NVML",
    )
    gb10 = poll(NVML / "gb10-idle.json", sysfs=SYSFS / "dgx-spark")
    assert only(check_gpus_on_bus(context(gb10))).status == "pass"


def test_nvml_down_with_a_gpu_on_the_bus_is_counted_not_blamed() -> None:
    """The GPU is counted and exported; with NVML down the nvml row fails (found in a review:
    this row failed too, telling the user to reseat a GPU that only lacked its driver)."""
    snap = poll(NVML / "no-nvml.json", sysfs=SYSFS / "dgx-spark")
    assert _value(snap, "sparkdiag_gpu_pci_devices") == 1
    r = only(check_gpus_on_bus(context(snap)))
    assert r.status == "skip" and "(see nvml)" in r.finding
    assert only(dict(CHECKS)["nvml"](context(snap))).status == "fail"


def test_a_container_counts_only_the_gpus_it_is_given(tmp_path: Path) -> None:
    """sysfs in a container shows the host's bus; /proc/driver/nvidia/gpus the given GPUs. A
    container without that list exports no count (never a false 'missing')."""
    import shutil

    root = tmp_path / "container"
    shutil.copytree(ROOTFS / "docker", root, symlinks=True)
    fixture = NVML / "h200-x8.json"
    without = poll(fixture, sysfs=SYSFS / "h200-x8", rootfs=root)
    assert without.context is not None and without.context.context == "container"
    assert without.gpu_pci_devices is None
    assert _value(without, "sparkdiag_gpu_pci_devices") is None
    assert only(check_gpus_on_bus(context(without))).status == "skip"
    for address in ("0000:18:00.0", "0000:28:00.0"):
        (root / "proc/driver/nvidia/gpus" / address).mkdir(parents=True)
    given = poll(fixture, sysfs=SYSFS / "h200-x8", rootfs=root)
    assert given.gpu_pci_devices == ("0000:18:00.0", "0000:28:00.0")


def test_check_quick_fails_naming_the_missing_gpu_and_dump_shows_the_pci_count() -> None:
    done = invoke_cli("check", "--quick", "--json", *MISSING, timeout=60)
    assert done.returncode != 0, done.stdout
    report = json.loads(done.stdout)
    assert (report["status"], report["exit_code"]) == ("fail", done.returncode)
    rows = {r["name"]: r for r in report["checks"]}
    assert rows["gpus-on-bus"]["status"] == "fail"
    assert "0000:58:00.0" in rows["gpus-on-bus"]["finding"]
    dumped = invoke_cli("dump", *MISSING, timeout=60)
    assert dumped.returncode == 0, dumped.stderr
    assert "\nsparkdiag_gpu_pci_devices 8.0\n" in dumped.stdout


# -- recovery action and fabric -----------------------------------------------------------------


def _recovery_snapshot() -> Snapshot:
    return poll(NVML / "h200-x8-recovery.json", sysfs=SYSFS / "h200-x8")


ACTIONS = [
    "none",
    "gpu_reset",
    "node_reboot",
    "drain_p2p",
    "drain_and_reset",
    "recover_imex_domain",
    "bus_reset",
    "system_reboot",
]


def test_every_recovery_action_value_is_exported_as_a_state_set() -> None:
    snap = _recovery_snapshot()
    reg = _registry(snap)
    for gpu in snap.gpus:
        labels = {"gpu": str(gpu.identity.index), "uuid": gpu.identity.uuid}
        assert gpu.recovery_action == ACTIONS[gpu.identity.index]
        for action in ACTIONS:
            expected = 1.0 if action == ACTIONS[gpu.identity.index] else 0.0
            got = reg.get_sample_value(
                "sparkdiag_gpu_recovery_action", {**labels, "action": action}
            )
            assert got == expected, (gpu.identity.index, action)


def test_recovery_action_check_names_what_to_do() -> None:
    results = {r.gpu: r for r in check_recovery_action(context(_recovery_snapshot()))}
    assert results["0"].status == "pass"
    assert all(results[str(i)].status == "fail" for i in range(1, 8))
    assert results["1"].finding == "the driver asks for a recovery action: gpu reset"
    assert "sudo nvidia-smi -r -i 1" in results["1"].action
    assert "reboot" in results["2"].action and "drain" in results["3"].action


def test_fabric_states_health_and_registration() -> None:
    snap = _recovery_snapshot()
    reg = _registry(snap)

    def state(i: int, value: str) -> float | None:
        labels = {"gpu": str(i), "uuid": snap.gpus[i].identity.uuid, "state": value}
        return reg.get_sample_value("sparkdiag_gpu_fabric_state", labels)

    def failed(i: int) -> float | None:
        labels = {"gpu": str(i), "uuid": snap.gpus[i].identity.uuid}
        return reg.get_sample_value("sparkdiag_gpu_fabric_registration_failed", labels)

    assert state(0, "completed") == 1 and failed(0) == 0
    assert state(1, "not_started") == 1 and failed(1) is None
    assert state(2, "in_progress") == 1
    assert state(3, "completed") == 1 and failed(3) == 1
    health = {"gpu": "5", "uuid": snap.gpus[5].identity.uuid, "health": "unhealthy"}
    assert reg.get_sample_value("sparkdiag_gpu_fabric_health", health) == 1
    # state NOT_SUPPORTED (GPU 6) and no fabric call (GPU 7): left out, not 0
    assert state(6, "completed") is None and state(7, "completed") is None
    results = {r.gpu: r for r in check_fabric(context(snap))}
    assert results["0"].status == "pass"
    assert [results[str(i)].status for i in range(1, 6)] == ["fail"] * 5
    assert results["3"].finding == "NVLink fabric registration failed (UNKNOWN)"
    assert "nvidia-fabricmanager" in results["1"].action
    assert results["6"].status == results["7"].status == "skip"


def test_gb10_and_the_recorded_h200_report_neither() -> None:
    for fixture, sysfs in (("gb10-idle", "dgx-spark"), ("h200-idle", "h200-vm")):
        snap = poll(NVML / f"{fixture}.json", sysfs=SYSFS / sysfs)
        (gpu,) = snap.gpus
        assert gpu.recovery_action is None and gpu.fabric is None
        assert (
            _value(snap, "sparkdiag_gpu_recovery_action", {**_labels(snap), "action": "none"})
            is None
        )
        assert only(check_recovery_action(context(snap))).status == "skip"
        assert only(check_fabric(context(snap))).status == "skip"


def _labels(snap: Snapshot) -> dict[str, str]:
    gpu = snap.gpus[0].identity
    return {"gpu": str(gpu.index), "uuid": gpu.uuid}


# -- XID tiers ---------------------------------------------------------------------------------


def test_xid_catalog_tiers() -> None:
    assert {c: describe(c).tier for c in (79, 48, 74, 95, 119)} == dict.fromkeys(
        (79, 48, 74, 95, 119), "critical"
    )
    assert (describe(13).tier, describe(31).tier, describe(94).tier) == ("warning",) * 3
    assert (describe(63).tier, describe(92).tier, describe(43).tier) == ("info",) * 3
    assert describe(79).bucket == "restart_bm" and "power the machine off" in describe(79).action()
    unknown = describe(999)
    assert (unknown.tier, unknown.bucket) == ("warning", "unknown")
    assert "analyzing-xid-catalog" in unknown.action()
    assert {bucket for _, bucket in XIDS.values()} <= BUCKETS.keys()


@pytest.mark.parametrize(
    ("root", "status", "first"),
    [
        ("xid-critical", "fail", "XID 79 ×2 (0000:00:06, GPU 0): GPU has fallen off the bus [crit"),
        ("xid-warning", "warn", "XID 31 ×1 (0000:00:06, GPU 0): GPU memory page fault"),
        ("xid-info", "pass", "XID 63 ×1 (0000:00:06, GPU 0): ECC page retirement"),
    ],
)
def test_kernel_log_fixture_per_tier(root: str, status: str, first: str) -> None:
    log = read_kernel_log(ROOTFS / root)
    r = only(check_xid(context(poll(NVML / "h200-idle.json"), kernel_log=log)))
    assert r.status == status and r.finding.startswith(first), r.finding
    if status == "pass":
        assert r.finding.endswith("(since boot; informational only)") and r.action == ""
    else:
        assert "analyzing-xid-catalog" in r.action
    if root == "xid-critical":
        assert r.action.startswith("XID 79: the GPU no longer answers over PCIe: power the machine")
        assert {e["severity"] for e in r.data["events"]} == {"critical", "warning"}


def _xid_fixture(tmp_path: Path, events: list[tuple[int, int, float]]) -> Path:
    """h200-idle with XID events scripted at (poll, code, timestamp)."""
    doc = {
        "format": "sparkdiag-nvml-fixture/1",
        "base": str(NVML / "h200-idle.json"),
        "script": [
            {"poll": p, "gpu": 0, "event": {"type": 8, "data": code, "timestamp": ts}}
            for p, code, ts in events
        ],
    }
    path = tmp_path / "xids.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_a_burst_of_xids_is_one_incident_until_three_minutes_pass(tmp_path: Path) -> None:
    t0 = 1_800_000_000.0
    gap = INCIDENT_GAP_SECONDS
    path = _xid_fixture(
        tmp_path,
        [
            (2, 79, t0),
            (3, 79, t0 + 20),
            (4, 79, t0 + 20 + gap - 1),  # one burst
            (5, 79, t0 + 20 + 2 * gap),
            (6, 13, t0 + 20 + 2 * gap),
        ],
    )
    snap = poll(path, polls=6)
    reg = _registry(snap)

    def incidents(severity: str) -> float | None:
        return reg.get_sample_value(
            "sparkdiag_gpu_xid_incidents_total", {**H200_0, "severity": severity}
        )

    assert (incidents("critical"), incidents("warning"), incidents("info")) == (2, 1, 0)
    xid79 = {**H200_0, "xid": "79", "severity": "critical", "action": "restart_bm"}
    assert reg.get_sample_value("sparkdiag_gpu_xid_errors_total", xid79) == 4
    last = {**H200_0, "severity": "warning"}
    assert (
        reg.get_sample_value("sparkdiag_gpu_xid_incident_last_timestamp_seconds", last)
        == t0 + 20 + 2 * gap
    )


def test_incident_counters_start_at_zero_only_where_xid_events_are_delivered(
    tmp_path: Path,
) -> None:
    snap = poll(NVML / "h200-idle.json")
    assert (
        _value(snap, "sparkdiag_gpu_xid_incidents_total", {**H200_0, "severity": "critical"}) == 0
    )
    path = tmp_path / "no-events.json"
    path.write_text(
        json.dumps(
            {
                "format": "sparkdiag-nvml-fixture/1",
                "base": str(NVML / "h200-idle.json"),
                "devices": [{"from": 0, "set": {"supported_event_types": 0x10}}],
            }
        ),
        encoding="utf-8",
    )
    quiet = poll(path)
    assert (
        _value(quiet, "sparkdiag_gpu_xid_incidents_total", {**H200_0, "severity": "critical"})
        is None
    )


# -- the stalled GPU ---------------------------------------------------------------------------


def test_the_h200_spin_and_the_wedged_gb10_match_the_signature() -> None:
    (spin,) = poll(NVML / "h200-stalled.json", polls=2).gpus
    stall = stall_signature(spin)
    assert stall is not None and stall.basis == "gpm"
    assert (stall.utilization, stall.sm, stall.tensor) == (1.0, 0.0076, 0.0)
    (wedged,) = poll(NVML / "gb10-stalled.json", sysfs=SYSFS / "dgx-spark").gpus
    stall = stall_signature(wedged)
    assert stall is not None and (stall.basis, stall.power_watts) == ("power", 20.0)


def test_work_idle_and_low_power_states_do_not_match(tmp_path: Path) -> None:
    (working,) = poll(NVML / "h200-load.json").gpus
    (idle,) = poll(NVML / "h200-idle.json").gpus
    (gb10_load,) = poll(NVML / "gb10-load.json", polls=2).gpus
    assert stall_signature(working) is stall_signature(idle) is stall_signature(gb10_load) is None
    # the USB-PD slow state: 19.5 W under load at 799 MHz (Blackwellboy/model-serving-minefield
    # #55) is SlowState's: the clock is held down, it is not a kernel that waits
    slow = _derived(tmp_path, "gb10-stalled.json", {"clock/1": 799, "power_mw": 19500})
    assert stall_signature(slow.gpus[0]) is None
    # a trickle of tensor work is work
    trickle = _derived(
        tmp_path, "h200-stalled.json", {"gpm": {"sm": 5, "tensor": 0.2, "dram": 0.1}}
    )
    assert stall_signature(trickle.gpus[0]) is None
    # a dedicated GPU without GPM is not judged by power
    no_gpm = _derived(tmp_path, "h200-stalled.json", {"gpm": {"error": "NOT_SUPPORTED"}})
    assert stall_signature(no_gpm.gpus[0]) is None


def _derived(tmp_path: Path, base: str, answers: dict[str, Any]) -> Snapshot:
    path = tmp_path / f"derived-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(
        json.dumps(
            {
                "format": "sparkdiag-nvml-fixture/1",
                "base": str(NVML / base),
                "devices": [{"from": 0, "set": answers}],
            }
        ),
        encoding="utf-8",
    )
    return poll(path, sysfs=SYSFS / "dgx-spark")


def _gathered(fixture: str, sysfs: str = "h200-vm") -> tuple[CheckContext, list[float]]:
    slept: list[float] = []
    ctx = gather(
        settings(NVML / fixture, SYSFS / sysfs),
        quick=True,
        sources=Sources(torch=GOOD_TORCH, kernel_log=KernelLog((), "test"), sleep=slept.append),
    )
    return ctx, slept


def test_check_samples_a_busy_gpu_and_fails_a_stall() -> None:
    ctx, slept = _gathered("h200-stalled.json")
    assert len(slept) == STALL_SAMPLES
    r = only(check_stall(ctx))
    assert r.status == "fail"
    assert r.finding.startswith("stalled for 3 s: utilization 100% while SM activity is 0.76%")
    assert "py-spy dump" in r.action and r.data["basis"] == "gpm"
    ctx, _ = _gathered("gb10-stalled.json", "dgx-spark")
    r = only(check_stall(ctx))
    assert r.status == "fail" and "20 W" in r.finding


def test_check_passes_work_and_does_not_sample_an_idle_gpu() -> None:
    ctx, slept = _gathered("h200-idle.json")
    assert slept == []  # nothing busy: no time spent
    assert only(check_stall(ctx)).finding == "not stalled: utilization 0%"
    ctx, slept = _gathered("h200-load.json")
    r = only(check_stall(ctx))
    assert r.status == "pass" and r.finding.startswith("busy and working over 3 s (dram 17%")
    assert "stall" in dict(CHECKS) and "gpus-on-bus" in dict(CHECKS)


def test_the_daemon_logs_a_stall_episode_once(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    log = StallLog(after=60.0, clock=lambda: now[0])
    stalled = poll(NVML / "h200-stalled.json", polls=2)
    idle = poll(NVML / "h200-idle.json")
    caplog.set_level(logging.INFO, logger="sparkdiag.telemetry.stall")

    def feed(snap: Snapshot, seconds: int) -> None:
        for _ in range(seconds):
            log(snap)
            now[0] += 1.0

    feed(stalled, 59)
    assert not caplog.records  # not yet a minute
    feed(stalled, 120)
    feed(idle, 10)  # a blip
    feed(stalled, 30)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert (
        "GPU 0 (GPU-979ad365-0b73-a0ac-74a2-3520b773d460): stalled for 60 s" in warnings[0].message
    )
    feed(idle, 61)
    ended = [r for r in caplog.records if "no longer stalled" in r.message]
    assert len(ended) == 1
    feed(stalled, 61)  # a new episode is logged again
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_build_poller_wires_the_gpu_functions() -> None:
    poller = build_poller(settings(NVML / "h200-x8.json", SYSFS / "h200-x8"))
    try:
        assert poller.poll_once().gpu_pci_devices is not None
    finally:
        poller.gpu.stop()
