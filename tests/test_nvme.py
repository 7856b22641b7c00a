"""NVMe drives: the tools' JSON (public recordings, tests/fixtures/nvme/README.md), the sysfs
trees of the same drives, the block-device chains under a filesystem, the source that refreshes
the health log off the poll, the collector, and the check rows. The real smartctl and nvme-cli
run here against a drive that is not there."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sparkdiag.check.model import CheckContext
from sparkdiag.check.storage_checks import check_nvme_health, check_nvme_temperature
from sparkdiag.exporter.nvme import NvmeCollector
from sparkdiag.snapshot import NvmeController, NvmeHealth
from sparkdiag.sources.host import nvme as nvme_source
from sparkdiag.sources.host.blockdev import block_chain, io_bytes, named_chain
from sparkdiag.sources.host.mounts import find_mount, parse_mountinfo
from sparkdiag.sources.host.nvme import NvmeSource, controller_names, read_controller
from sparkdiag.sources.host.nvme_tools import (
    HealthReading,
    fixture_reader,
    parse_nvme_cli,
    parse_smartctl,
    tool_reader,
)
from tests.support import FIXTURES, NVML, SYSFS, assert_clean_error, fixture_snapshot, invoke_cli

NVME = FIXTURES / "nvme"
M2, U2 = SYSFS / "nvme-client-m2", SYSFS / "nvme-u2"


def load(name: str) -> object:
    return json.loads((NVME / name).read_text())


def test_smartctl_json_of_the_client_m2_drive() -> None:
    reading = parse_smartctl(load("client-m2/nvme0.smartctl.json"))
    health = reading.health
    assert health is not None and reading.note is None
    assert health.critical_warning == 0 and health.media_errors == 0
    assert health.percentage_used_ratio == pytest.approx(0.16)
    assert health.available_spare_ratio == 1.0 and health.available_spare_threshold_ratio == 0.1
    assert health.unsafe_shutdowns == 1 and health.error_log_entries == 0
    assert health.power_on_seconds == 10423 * 3600
    assert health.written_bytes == 113662783 * 512000
    assert health.warning_temperature_seconds == 0 and health.critical_temperature_seconds == 0
    assert health.thermal_transitions == {} and health.source == "smartctl"  # smartctl 7.3
    assert reading.temperatures == {"composite": 29, "1": 29, "2": 30}
    assert reading.thresholds == {}  # recorded without -c: none in the answer


def test_smartctl_json_of_the_datacenter_u2_drive() -> None:
    reading = parse_smartctl(load("datacenter-u2/nvme0.smartctl.json"), "fixture")
    assert reading.health is not None and reading.health.percentage_used_ratio == 0.03
    assert reading.temperatures == {"composite": 22, "1": 22, "2": 31}
    assert reading.health.source == "fixture"


def test_smartctl_thresholds_and_thermal_management_when_present() -> None:
    doc = load("client-m2/nvme0.smartctl.json")
    assert isinstance(doc, dict)
    doc["nvme_composite_temperature_threshold"] = {"warning": 82, "critical": 85}
    doc["nvme_smart_health_information_log"] |= {
        "thermal_mgmt_temperature_1_transition_count": 3,
        "thermal_mgmt_temperature_1_total_time": 120,
        "warning_temp_time": 7,
    }
    reading = parse_smartctl(doc)
    assert reading.thresholds == {"warning": 82, "critical": 85}
    assert reading.health is not None
    assert reading.health.thermal_transitions == {"1": 3} and reading.health.thermal_seconds == {
        "1": 120
    }
    assert reading.health.warning_temperature_seconds == 7 * 60


def test_smartctl_answer_without_a_log_says_why() -> None:
    said = "Smartctl open device: /dev/nvme0 failed: Permission denied"
    doc = {"smartctl": {"messages": [{"string": said, "severity": "error"}]}}
    reading = parse_smartctl(doc)
    assert (
        reading.health is None and reading.note is not None and "Permission denied" in reading.note
    )


def test_nvme_cli_json_in_kelvin() -> None:
    reading = parse_nvme_cli(load("nvme-cli/nvme0.nvme-cli.json"))
    health = reading.health
    assert health is not None and health.source == "nvme-cli"
    assert reading.temperatures == {"composite": 36, "1": 36, "2": 39}
    assert health.unsafe_shutdowns == 27 and health.error_log_entries == 1
    assert health.thermal_transitions == {"1": 0, "2": 0} and health.thermal_seconds == {
        "1": 0,
        "2": 0,
    }
    verbose = {**load("nvme-cli/nvme0.nvme-cli.json"), "critical_warning": {"value": 4}}  # type: ignore[dict-item]
    assert parse_nvme_cli(verbose).health.critical_warning == 4  # type: ignore[union-attr]


def test_nvme_cli_2_7_spells_the_composite_temperature_with_a_capital() -> None:
    """nvme-cli 2.7 alone printed ``"Temperature"`` (kelvin, as every other version's
    ``"temperature"``) and, with ``-H``, the critical warning's ``"Value"``; 2.7.1 reverted
    both (tests/fixtures/nvme/README.md). A drive read with 2.7 had no composite temperature."""
    reading = parse_nvme_cli(load("nvme-cli-2.7/nvme0.nvme-cli.json"))
    assert reading.health is not None and reading.health.media_errors == 12
    assert reading.temperatures == {"composite": 36, "1": 36, "2": 39}
    assert fixture_reader(NVME / "nvme-cli-2.7")("nvme0").temperatures["composite"] == 36
    verbose = {**load("nvme-cli-2.7/nvme0.nvme-cli.json"), "critical_warning": {"Value": 4}}  # type: ignore[dict-item]
    assert parse_nvme_cli(verbose).health.critical_warning == 4  # type: ignore[union-attr]


@pytest.mark.parametrize("value", [None, 0, "309", "36 C", True, 1e300])
def test_a_composite_temperature_nvme_cli_cannot_have_given_is_left_out(value: object) -> None:
    """Every nvme-cli prints the composite temperature as a whole number of kelvin; anything
    else (absent, a string, 0 K: no sensor) is no reading, never 0 °C."""
    for key in ("temperature", "Temperature"):
        doc = load("nvme-cli/nvme0.nvme-cli.json")
        assert isinstance(doc, dict)
        del doc["temperature"]
        if value is not None:
            doc[key] = value
        reading = parse_nvme_cli(doc)
        assert reading.health is not None and "composite" not in reading.temperatures
        assert reading.temperatures == {"1": 36, "2": 39}


def test_the_real_tools_on_a_drive_that_is_not_there() -> None:
    if not (shutil.which("smartctl") or shutil.which("nvme")):
        pytest.skip("neither smartmontools nor nvme-cli installed")
    if not Path("/sys").is_dir():
        pytest.skip("no /sys")
    reader, uses = tool_reader(Path("/"), Path("/sys"))
    assert reader is not None and uses
    reading = reader("nvme97")
    assert reading.health is None and reading.note
    assert "No such" in reading.note and "Usage" not in reading.note  # nvme-cli: not its help


def test_no_tool_runs_for_a_fake_sysfs() -> None:
    reader, why = tool_reader(Path("/"), M2)
    assert reader is None and "is not /sys" in why and "--nvme.fixture" in why


def test_controllers_from_the_sysfs_trees() -> None:
    assert controller_names(M2) == ["nvme0"]
    m2 = read_controller(M2, "nvme0")
    assert m2 is not None
    assert (m2.model, m2.pci_address, m2.transport) == (
        "SAMSUNG MZVL21T0HCLR-00B00",
        "0000:01:00.0",
        "pcie",
    )
    assert m2.temperature_celsius == {"composite": 28.85, "1": 28.85, "2": 29.85}
    assert m2.threshold_celsius == {}  # none in the public recording
    u2 = read_controller(U2, "nvme0")
    assert u2 is not None and u2.threshold_celsius == {"warning": 79.85, "critical": 82.85}
    assert read_controller(M2, "nvme9") is None


def test_hwmon_under_the_pci_function_and_garbage_values(tmp_path: Path) -> None:
    """Kernels before 5.6 hang hwmon under the PCI function; an unsupported reading (-273 °C)
    is left out, never exported."""
    ctrl = tmp_path / "class" / "nvme" / "nvme3"
    hwmon = ctrl / "device" / "hwmon" / "hwmon7"
    hwmon.mkdir(parents=True)
    (hwmon / "temp1_input").write_text("41850\n")
    (hwmon / "temp2_input").write_text("-273150\n")
    (hwmon / "temp1_crit").write_text("banana\n")
    controller = read_controller(tmp_path, "nvme3")
    assert controller is not None
    assert controller.temperature_celsius == {"composite": 41.85}
    assert controller.threshold_celsius == {} and controller.model == ""


def test_the_block_chain_of_a_partition_leads_to_the_drive_and_its_link() -> None:
    chain = block_chain(M2, 259, 2)
    assert chain is not None
    assert (chain.device, chain.kind, chain.disks, chain.controllers) == (
        "nvme0n1p2",
        "nvme",
        ("nvme0n1",),
        ("nvme0",),
    )
    assert chain.pci_addresses == ("0000:01:00.0",)
    assert chain.layers == ("nvme0n1p2 partition", "nvme0n1 nvme disk")
    assert io_bytes(M2, "nvme0n1p2") == (8000000 * 512, 5600000 * 512)
    assert block_chain(M2, 8, 1) is None and named_chain(M2, "../etc") is None


def _block(
    root: Path,
    name: str,
    *,
    under: str = "virtual/block",
    files: dict[str, str] | None = None,
    slaves: tuple[str, ...] = (),
) -> Path:
    device = root / "devices" / under / name
    device.mkdir(parents=True)
    for rel, text in (files or {}).items():
        (device / rel).parent.mkdir(parents=True, exist_ok=True)
        (device / rel).write_text(text + "\n")
    (device / "slaves").mkdir()
    for slave in slaves:
        (device / "slaves" / slave).symlink_to(root / "class" / "block" / slave)
    link = root / "class" / "block" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(device)
    return device


def test_dm_crypt_over_raid1_over_two_nvme_drives(tmp_path: Path) -> None:
    root = tmp_path
    for n in (0, 1):
        pci = f"0000:0{n + 1}:00.0"
        _block(root, f"nvme{n}n1", under=f"pci0000:00/{pci}/nvme/nvme{n}")
        (root / "class" / "nvme").mkdir(parents=True, exist_ok=True)
        (root / "class" / "nvme" / f"nvme{n}").symlink_to(
            root / "devices" / f"pci0000:00/{pci}/nvme/nvme{n}"
        )
        (root / "devices" / f"pci0000:00/{pci}/nvme/nvme{n}" / "device").symlink_to(
            root / "devices" / f"pci0000:00/{pci}"
        )
    _block(root, "md0", files={"md/level": "raid1"}, slaves=("nvme0n1", "nvme1n1"))
    dm = _block(
        root, "dm-0", files={"dm/name": "cryptdata", "dm/uuid": "CRYPT-LUKS2-abc"}, slaves=("md0",)
    )
    (root / "dev" / "block").mkdir(parents=True)
    (root / "dev" / "block" / "253:0").symlink_to(dm)
    chain = block_chain(root, 253, 0)
    assert chain is not None
    assert (chain.device, chain.kind) == ("dm-0", "dm")
    assert chain.disks == ("nvme0n1", "nvme1n1") and chain.controllers == ("nvme0", "nvme1")
    assert chain.pci_addresses == ("0000:01:00.0", "0000:02:00.0")
    assert chain.layers[:2] == ("dm-0 crypt (cryptdata)", "md0 raid1")


def test_a_loop_device_names_its_file_and_a_multipath_head_its_controllers(tmp_path: Path) -> None:
    _block(tmp_path, "loop3", files={"loop/backing_file": "/var/lib/images/disk.img"})
    chain = named_chain(tmp_path, "loop3")
    assert (
        chain is not None
        and chain.kind == "loop"
        and chain.backing_file == "/var/lib/images/disk.img"
    )
    head = _block(tmp_path, "nvme0n1", under="virtual/nvme-subsystem/nvme-subsys0")
    (head / "multipath").mkdir()
    (head / "multipath" / "nvme0c2n1").write_text("")
    chain = named_chain(tmp_path, "nvme0n1")
    assert chain is not None and chain.kind == "nvme" and chain.controllers == ("nvme2",)


def test_mountinfo_finds_the_mount_of_a_path() -> None:
    text = (
        "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
        "40 22 259:3 / /data\\040set rw shared:2 - xfs /dev/nvme1n1 rw\n"
        "41 22 0:55 / /mnt/nas rw - nfs4 nas:/export/ckpt rw,vers=4.2\n"
        "42 22 259:2 /srv /data\\040set/bind ro - ext4 /dev/nvme0n1p2 rw\n"
        "bad line\n"
    )
    mounts = parse_mountinfo(text)
    assert [m.mountpoint for m in mounts] == ["/", "/data set", "/mnt/nas", "/data set/bind"]
    assert find_mount(mounts, "/data set/x").source == "/dev/nvme1n1"  # type: ignore[union-attr]
    nas = find_mount(mounts, "/mnt/nas/run1")
    assert nas is not None and nas.kind == "network"
    bind = find_mount(mounts, "/data set/bind/y", (259, 2))
    assert bind is not None and bind.read_only and bind.fstype == "ext4"
    assert find_mount(mounts, "/data setx").mountpoint == "/"  # type: ignore[union-attr]


def test_the_source_reads_health_at_once_first_then_in_the_background() -> None:
    calls: list[str] = []
    gate = threading.Event()

    def reader(name: str) -> HealthReading:
        calls.append(name)
        if len(calls) > 1:
            gate.wait(5)
        return fixture_reader(NVME / "datacenter-u2")(name)

    source = NvmeSource(U2, reader, interval=0.0)
    first = source.read()  # the first read waits: dump and check see health
    assert first[0].health is not None and first[0].health.source == "fixture"
    second = source.read()  # stale at once (interval 0): refreshed in a thread, not waited for
    assert second[0].health is not None  # the last reading, while the tool runs
    gate.set()
    assert source.read(wait=True)[0].health is not None and len(calls) >= 2


def test_a_hung_tool_holds_the_first_read_only_briefly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvme_source, "FIRST_WAIT", 0.2)
    gate = threading.Event()

    def hung(name: str) -> HealthReading:
        gate.wait(10)
        return fixture_reader(NVME / "datacenter-u2")(name)

    started = time.monotonic()
    [drive] = NvmeSource(U2, hung).read()
    assert time.monotonic() - started < 2
    assert (
        drive.health is None and drive.health_note == "SMART log not read yet (the tool still runs)"
    )
    assert drive.temperature_celsius["composite"] == 21.85  # sysfs does not wait for the tool
    gate.set()


def test_without_a_tool_the_drives_say_why() -> None:
    controllers = NvmeSource(M2, None, "neither smartctl nor nvme is installed").read()
    assert controllers[0].health is None
    assert (
        controllers[0].health_note == "SMART health skipped: neither smartctl nor nvme is installed"
    )
    assert controllers[0].temperature_celsius["composite"] == 28.85


def test_a_fixture_directory_without_the_drive_or_with_garbage(tmp_path: Path) -> None:
    assert "no fixture for nvme0" in (fixture_reader(tmp_path)("nvme0").note or "")
    (tmp_path / "nvme0.smartctl.json").write_text("{not json")
    assert "is not JSON" in (fixture_reader(tmp_path)("nvme0").note or "")


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ('{"nvme_smart_health_information_log": {"critical', " is not JSON: Unterminated string"),
        ("{not json", " is not JSON: Expecting property name enclosed in double quotes"),
        ("[]", ": smartctl: no NVMe health log in its answer"),
    ],
    ids=["truncated", "invalid", "no-log"],
)
def test_a_bad_fixture_file_is_named_with_advice_for_a_fixture(
    tmp_path: Path, content: str, error: str
) -> None:
    """Before: check's nvme-health row for a truncated or invalid --nvme.fixture file advised
    "install smartmontools (or nvme-cli) and run as root"."""
    fixture = tmp_path / "nvme"
    fixture.mkdir()
    (fixture / "nvme0.smartctl.json").write_text(content)
    result = invoke_cli(
        "check", "--quick", "--json", "--state-dir", str(tmp_path / "state"), "--path.sysfs",
        str(U2), "--nvme.fixture", str(fixture), "--nvml-fixture", str(NVML / "no-nvml.json"),
    )  # fmt: skip
    rows = [r for r in json.loads(result.stdout)["checks"] if r["name"] == "nvme-health"]
    (row,) = rows
    assert row["status"] == "skip"
    assert f"SMART log not read (fixture {fixture}/nvme0.smartctl.json{error}" in row["finding"]
    assert "smartmontools" not in row["action"]
    assert row["action"].startswith("fix or record again the fixture file named (smartctl")
    assert "leave --nvme.fixture out to read the drive" in row["action"]


def test_a_fixture_directory_without_the_drive_says_what_to_add(tmp_path: Path) -> None:
    drive = replace(_drive(), health=None, health_note=f"no fixture for nvme0 in {tmp_path}")
    [row] = check_nvme_health(_ctx(tmp_path, drive))
    assert row.action.startswith("add nvme0.smartctl.json (smartctl --json -a /dev/nvme0)")


@pytest.mark.parametrize("command", ["dump", "check"])
@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_a_missing_nvme_fixture_is_exit_2_naming_the_flag(
    tmp_path: Path, command: str, kind: str
) -> None:
    """As a missing --nvml-fixture or --probe.fixture is (README's exit table): it was exit 0,
    with an INFO line, and every drive read "no fixture"."""
    fixture = tmp_path / "nvme"
    if kind == "a file":
        fixture.write_text("{}")
    own = ["--quick", "--state-dir", str(tmp_path / "state")] if command == "check" else []
    result = invoke_cli(
        command, *own, "--path.sysfs", str(U2), "--nvme.fixture", str(fixture),
        "--nvml-fixture", str(NVML / "no-nvml.json"),
    )  # fmt: skip
    why = "is not a directory" if kind == "a file" else "does not exist"
    assert_clean_error(result, 2, "Invalid value for '--nvme.fixture'", f"{fixture} {why}")
    assert result.stdout == ""


def _collect(controllers: tuple[NvmeController, ...], tmp_path: Path) -> CollectorRegistry:
    snap = replace(fixture_snapshot("h200-idle", tmp_path), nvme=controllers)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NvmeCollector(lambda: snap))
    return registry


def test_the_collector_exports_identity_temperatures_and_health(tmp_path: Path) -> None:
    source = NvmeSource(U2, fixture_reader(NVME / "datacenter-u2"))
    registry = _collect(source.read(), tmp_path)
    d = {"device": "nvme0"}
    info = {
        **d,
        "model": "SAMSUNG MZQL23T8HCLS-00A07",
        "firmware": "",
        "pci_address": "0000:c1:00.0",
    }
    assert registry.get_sample_value("sparkdiag_nvme_info", info) == 1
    assert (
        registry.get_sample_value(
            "sparkdiag_nvme_temperature_celsius", {**d, "sensor": "composite"}
        )
        == 21.85
    )
    assert (
        registry.get_sample_value(
            "sparkdiag_nvme_temperature_threshold_celsius", {**d, "threshold": "warning"}
        )
        == 79.85
    )
    assert registry.get_sample_value("sparkdiag_nvme_critical_warning", d) == 0
    assert registry.get_sample_value("sparkdiag_nvme_media_errors_total", d) == 0
    assert registry.get_sample_value("sparkdiag_nvme_percentage_used_ratio", d) == 0.03
    assert registry.get_sample_value("sparkdiag_nvme_available_spare_ratio", d) == 1.0
    assert registry.get_sample_value("sparkdiag_nvme_unsafe_shutdowns_total", d) == 1
    assert (
        registry.get_sample_value(
            "sparkdiag_nvme_thermal_throttle_seconds_total", {**d, "level": "warning"}
        )
        == 0
    )
    # smartctl 7.3 does not give the thermal management counters: no sample, not 0
    assert (
        registry.get_sample_value(
            "sparkdiag_nvme_thermal_management_seconds_total", {**d, "level": "1"}
        )
        is None
    )
    labels = {name for m in registry.collect() for sample in m.samples for name in sample.labels}
    assert labels == {"device", "model", "firmware", "pci_address", "sensor", "threshold", "level"}


def test_a_drive_without_health_exports_only_identity_and_temperature(tmp_path: Path) -> None:
    registry = _collect(NvmeSource(M2, None, "no tool").read(), tmp_path)
    assert (
        registry.get_sample_value(
            "sparkdiag_nvme_temperature_celsius", {"device": "nvme0", "sensor": "2"}
        )
        == 29.85
    )
    assert registry.get_sample_value("sparkdiag_nvme_critical_warning", {"device": "nvme0"}) is None


def _ctx(tmp_path: Path, *drives: NvmeController) -> CheckContext:
    return CheckContext(snapshot=replace(fixture_snapshot("h200-idle", tmp_path), nvme=drives))


def _drive(**health: object) -> NvmeController:
    base = NvmeSource(U2, fixture_reader(NVME / "datacenter-u2")).read()[0]
    assert base.health is not None
    return replace(base, health=replace(base.health, **health))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("health", "status", "needle"),
    [
        ({}, "pass", "3% used, spare 100%, 0 media errors, 1 unsafe shutdowns"),
        (
            {"critical_warning": 0x0C},
            "fail",
            "critical warning 0x0c (reliability degraded, media read-only)",
        ),
        ({"media_errors": 3.0}, "warn", "3 media errors"),
        ({"available_spare_ratio": 0.15}, "warn", "spare 15% left"),
        ({"available_spare_ratio": 0.2}, "pass", "spare 20%"),  # at 20 %: not under
        ({"percentage_used_ratio": 0.9}, "warn", "90% of its endurance used"),
        ({"percentage_used_ratio": 0.89}, "pass", "89% used"),
    ],
)
def test_nvme_health_row(
    tmp_path: Path, health: dict[str, object], status: str, needle: str
) -> None:
    [row] = check_nvme_health(_ctx(tmp_path, _drive(**health)))
    assert row.status == status and needle in row.finding, row


def test_nvme_health_row_skips_without_a_log_and_without_drives(tmp_path: Path) -> None:
    drive = replace(_drive(), health=None, health_note="SMART health skipped: no tool")
    [row] = check_nvme_health(_ctx(tmp_path, drive))
    assert row.status == "skip" and "no tool" in row.finding and "smartmontools" in row.action
    [row] = check_nvme_health(_ctx(tmp_path))
    assert row.status == "skip" and "no NVMe drive" in row.finding
    ctx = CheckContext(snapshot=fixture_snapshot("h200-idle", tmp_path))  # never read
    assert check_nvme_health(ctx)[0].finding == "NVMe drives were not read"


@pytest.mark.parametrize(
    ("composite", "status", "needle"),
    [
        (45.0, "pass", "45 °C (warning 80 °C, critical 83 °C)"),
        (79.0, "pass", "79 °C"),
        (79.85, "warn", "throttling"),
        (83.0, "fail", "at its critical temperature"),
    ],
)
def test_nvme_temperature_row(tmp_path: Path, composite: float, status: str, needle: str) -> None:
    drive = _drive()
    drive = replace(
        drive, temperature_celsius={**drive.temperature_celsius, "composite": composite}
    )
    [row] = check_nvme_temperature(_ctx(tmp_path, drive))
    assert row.status == status and needle in row.finding, row


def test_nvme_temperature_row_counts_lifetime_minutes_above_warning(tmp_path: Path) -> None:
    [row] = check_nvme_temperature(_ctx(tmp_path, _drive(warning_temperature_seconds=5400.0)))
    assert row.status == "pass" and "90 min above warning over its life" in row.finding


def test_health_dataclass_defaults_are_unsupported_not_zero() -> None:
    health = NvmeHealth()
    assert health.media_errors is None and health.critical_warning is None
    assert os.path.exists(NVME / "README.md")


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("critical_warning", -1, "critical_warning"),  # was FAIL, every bit named, '0x-1'
        ("critical_warning", 2**70, "critical_warning"),
        ("percentage_used", 1e308, "percentage_used_ratio"),  # printed as 309 digits
        ("percentage_used", 256, "percentage_used_ratio"),
        ("available_spare", -5, "available_spare_ratio"),  # 'spare -5% left'
        ("available_spare", 101, "available_spare_ratio"),
        ("media_errors", 10**400, "media_errors"),  # OverflowError: the read thread's warning
        ("media_errors", -3, "media_errors"),
    ],
)
def test_values_a_log_cannot_hold_are_no_reading(key: str, value: int, field: str) -> None:
    doc = load("client-m2/nvme0.smartctl.json")
    doc["nvme_smart_health_information_log"][key] = value
    reading = parse_smartctl(doc)
    assert reading.health is not None
    assert getattr(reading.health, field) is None
    assert reading.health.unsafe_shutdowns == 1  # the rest of the log stands


def test_a_composite_temperature_out_of_any_range_is_no_reading() -> None:
    doc = load("client-m2/nvme0.smartctl.json")
    doc["nvme_smart_health_information_log"]["temperature"] = 1e300
    assert "composite" not in parse_smartctl(doc).temperatures


def test_nvme_cli_2_prints_its_128_bit_counters_as_strings(tmp_path: Path) -> None:
    """nvme-cli 2.x (``obj_add_uint128``) prints data units, hours, shutdowns, media errors and
    error-log entries as JSON strings: 12 media errors passed as healthy, and ``dump`` had no
    media, unsafe-shutdown, power-on or written series. tests/fixtures/nvme/nvme-cli2 is the
    nvme-cli fixture in that format, with 12 media errors."""
    reading = parse_nvme_cli(load("nvme-cli2/nvme0.nvme-cli.json"))
    health = reading.health
    assert health is not None and health.media_errors == 12 and health.unsafe_shutdowns == 27
    assert health.error_log_entries == 1 and health.power_on_seconds == 912 * 3600
    assert health.written_bytes == 10054124 * 512000
    assert reading.temperatures == {"composite": 36, "1": 36, "2": 39}
    odd = json.loads((NVME / "nvme-cli2" / "nvme0.nvme-cli.json").read_text())
    odd.update(unsafe_shutdowns="-3", num_err_log_entries="0x1f", power_on_hours="nan")
    odd["media_errors"] = "1.5"
    strange = parse_nvme_cli(odd).health
    assert strange is not None and strange.media_errors == 1.5
    assert (strange.unsafe_shutdowns, strange.error_log_entries, strange.power_on_seconds) == (
        None, None, None)  # fmt: skip
    machine = ("--path.sysfs", str(U2), "--nvme.fixture", str(NVME / "nvme-cli2"),
               "--nvml-fixture", str(NVML / "no-nvml.json"))  # fmt: skip
    checked = invoke_cli("check", "--quick", "--json", "--state-dir", str(tmp_path), *machine)
    (row,) = [r for r in json.loads(checked.stdout)["checks"] if r["name"] == "nvme-health"]
    assert row["status"] == "warn" and "12 media errors" in row["finding"], row
    dumped = invoke_cli("dump", *machine)
    assert dumped.returncode == 0, dumped.stderr
    series = {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in dumped.stdout.splitlines()
              if line.startswith("sparkdiag_nvme_") and '{device="nvme0"}' in line}  # fmt: skip
    assert float(series["sparkdiag_nvme_media_errors_total"]) == 12
    assert float(series["sparkdiag_nvme_unsafe_shutdowns_total"]) == 27
    assert "sparkdiag_nvme_power_on_seconds_total" in series
    assert "sparkdiag_nvme_written_bytes_total" in series
