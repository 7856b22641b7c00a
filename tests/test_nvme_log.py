"""The NVMe SMART logs read as root by ``sparkdiag nvme-log`` and left for the daemon
(``--nvme.log-dir``): written whole and readable, read back with their age, left out once too
old, and what check advises when they are not there."""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sparkdiag.exporter.nvme import NvmeCollector
from sparkdiag.sources.host.nvme import NvmeSource, controller_names
from sparkdiag.sources.host.nvme_log import prepare, write_logs
from sparkdiag.sources.host.nvme_tools import fixture_advice, log_dir_reader
from tests.support import FIXTURES, NVML, SYSFS, fixture_snapshot, invoke_cli

SMARTCTL_JSON = FIXTURES / "nvme" / "datacenter-u2" / "nvme0.smartctl.json"
U2 = SYSFS / "nvme-u2"


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_fresh_file_is_read_with_when_it_was_written(tmp_path: Path) -> None:
    (tmp_path / "nvme0.smartctl.json").write_bytes(SMARTCTL_JSON.read_bytes())
    _age(tmp_path / "nvme0.smartctl.json", 120)
    reading = log_dir_reader(tmp_path, 900)("nvme0")
    assert reading.health is not None and reading.note is None
    assert reading.health.available_spare_ratio == 1.0
    assert reading.read_at is not None and 115 < time.time() - reading.read_at < 130


def test_a_file_past_the_max_age_gives_no_health_but_its_age(tmp_path: Path) -> None:
    path = tmp_path / "nvme0.smartctl.json"
    path.write_bytes(SMARTCTL_JSON.read_bytes())
    _age(path, 1000)
    reading = log_dir_reader(tmp_path, 900)("nvme0")
    assert reading.health is None and reading.read_at is not None
    assert reading.note is not None and str(path) in reading.note
    assert "s old (--nvme.log-max-age 900)" in reading.note
    advice = fixture_advice(reading.note, "nvme0")
    assert advice is not None and "sparkdiag-nvme-log.timer" in advice


def test_a_file_dated_ahead_of_the_clock_is_not_trusted(tmp_path: Path) -> None:
    """A clock stepped back (NTP) made a stopped timer's last file read as fresh for as long as
    the step (found in a review: a file dated 2 h ahead read as healthy)."""
    path = tmp_path / "nvme0.smartctl.json"
    path.write_bytes(SMARTCTL_JSON.read_bytes())
    _age(path, -7200)
    reading = log_dir_reader(tmp_path, 900)("nvme0")
    assert reading.health is None and reading.note is not None
    assert "ahead of the clock" in reading.note
    _age(path, -30)  # within a minute: two clocks' disagreement, read
    assert log_dir_reader(tmp_path, 900)("nvme0").health is not None


def test_a_root_daemon_reads_a_drive_without_a_file_with_its_tools(tmp_path: Path) -> None:
    """A daemon run as root by a drop-in keeps --nvme.log-dir from the unit's ExecStart: a drive
    the timer has written nothing for is read by the tools, as before the directory came."""
    from sparkdiag.sources.host.nvme_tools import HealthReading, files_then_tools

    (tmp_path / "nvme0.smartctl.json").write_bytes(SMARTCTL_JSON.read_bytes())
    asked: list[str] = []

    def tools(controller: str) -> HealthReading:
        asked.append(controller)
        return HealthReading(None, {}, {}, "read by the tools")

    read = files_then_tools(log_dir_reader(tmp_path, 900), tools)
    assert read("nvme0").health is not None and asked == []  # the file is there
    assert read("nvme1").note == "read by the tools" and asked == ["nvme1"]
    _age(tmp_path / "nvme0.smartctl.json", 1000)
    assert read("nvme0").note and "s old" in (read("nvme0").note or "")  # stale stays stale
    assert asked == ["nvme1"]


def test_no_file_a_missing_directory_or_garbage_say_so_with_advice(tmp_path: Path) -> None:
    missing = log_dir_reader(tmp_path / "not-yet", 900)("nvme0")  # the timer has not run
    assert missing.health is None and missing.read_at is None
    assert missing.note == f"no nvme-log file for nvme0 in {tmp_path / 'not-yet'}"
    assert "systemctl enable --now sparkdiag-nvme-log.timer" in (fixture_advice(missing.note) or "")
    (tmp_path / "nvme1.nvme-cli.json").write_text("{not json")
    bad = log_dir_reader(tmp_path, 900)("nvme1")
    assert bad.health is None and bad.note and "is not JSON" in bad.note
    assert str(tmp_path / "nvme1.nvme-cli.json") in bad.note
    # the daemon's own "still reading" note is not the timer's business
    assert fixture_advice("SMART log not read yet (the tool still runs)") is None


FAKE_TOOL = """#!/bin/sh
# smartctl --json -a /dev/nvmeN: the recorded answer for nvme0; nvme1's read fails as a
# drive that does not answer does (smartctl prints JSON without a health log)
case "$3" in
  */nvme0) /bin/cat {fixture} ;;
  *) echo '{{"smartctl": {{"messages": [{{"string": "Read NVMe Identify Controller failed"}}]}}}}'
     ;;
esac
"""


def _fake_smartctl(tmp_path: Path) -> str:
    tool = tmp_path / "bin" / "smartctl"
    tool.parent.mkdir()
    tool.write_text(FAKE_TOOL.format(fixture=SMARTCTL_JSON))
    tool.chmod(0o755)
    return str(tool)


def _sysfs(tmp_path: Path, names: tuple[str, ...]) -> Path:
    """A sysfs tree with these controllers, each a copy of the U.2 drive's."""
    root = tmp_path / "sys"
    for name in names:
        controller = root / "class" / "nvme" / name
        controller.mkdir(parents=True)
        for attr in ("model", "firmware_rev", "transport"):
            source = U2 / "class" / "nvme" / "nvme0" / attr
            if source.is_file():
                (controller / attr).write_bytes(source.read_bytes())
    return root


def test_write_logs_keeps_what_a_tool_read_and_removes_what_it_did_not(tmp_path: Path) -> None:
    out = tmp_path / "run" / "sparkdiag-nvme"
    old_umask = os.umask(0o077)  # the unit's: the directory is the daemon's to read all the same
    try:
        prepare(out)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    sysfs = _sysfs(tmp_path, ("nvme0", "nvme1"))
    assert controller_names(sysfs) == ["nvme0", "nvme1"]
    (out / "nvme0.nvme-cli.json").write_text("{}")  # the other tool's, from an earlier run
    last = out / "nvme1.smartctl.json"  # nvme1 read last time, not now
    last.write_bytes(SMARTCTL_JSON.read_bytes())
    _age(last, 400)
    (out / "nvme7.smartctl.json").write_text("{}")  # a drive that is gone
    (out / "notes.txt").write_text("kept")  # not ours
    written = write_logs(out, sysfs, Path("/"), _fake_smartctl(tmp_path), None)
    assert [(w.controller, w.tool) for w in written] == [("nvme0", "smartctl"), ("nvme1", None)]
    assert written[1].note and "Identify Controller failed" in written[1].note
    names = ["notes.txt", "nvme0.smartctl.json", "nvme1.smartctl.json"]
    assert sorted(p.name for p in out.iterdir()) == names
    # the drive not read keeps its last file, untouched: it ages until the daemon drops it and
    # SparkdiagNvmeSmartLogStale fires (removed, the drive's alerts went with nothing to say so)
    assert 395 < time.time() - last.stat().st_mtime < 420
    kept = out / "nvme0.smartctl.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o644  # the daemon's dynamic user reads it
    assert json.loads(kept.read_text()) == json.loads(SMARTCTL_JSON.read_text())
    assert written[0].as_json() == {
        "device": "nvme0", "file": str(kept), "tool": "smartctl", "note": None,
    }  # fmt: skip
    # and the daemon's reader takes it as the tool's own reading
    reading = log_dir_reader(out, 900)("nvme0")
    assert reading.health is not None and reading.health.percentage_used_ratio == 0.03


def test_the_daemon_exports_the_age_and_drops_a_stale_log(tmp_path: Path) -> None:
    path = tmp_path / "nvme0.smartctl.json"
    path.write_bytes(SMARTCTL_JSON.read_bytes())

    def scrape() -> CollectorRegistry:
        drives = NvmeSource(U2, log_dir_reader(tmp_path, 900)).read(wait=True)
        snap = replace(fixture_snapshot("h200-idle", tmp_path), nvme=drives, timestamp=time.time())
        registry = CollectorRegistry(auto_describe=False)
        registry.register(NvmeCollector(lambda: snap))
        return registry

    d = {"device": "nvme0"}
    _age(path, 60)
    fresh = scrape()
    age = fresh.get_sample_value("sparkdiag_nvme_smart_log_age_seconds", d)
    assert age is not None and 55 < age < 75
    assert fresh.get_sample_value("sparkdiag_nvme_critical_warning", d) == 0
    _age(path, 1200)
    stale = scrape()
    age = stale.get_sample_value("sparkdiag_nvme_smart_log_age_seconds", d)
    assert age is not None and 1195 < age < 1215  # what SparkdiagNvmeSmartLogStale reads
    assert stale.get_sample_value("sparkdiag_nvme_critical_warning", d) is None
    composite = {**d, "sensor": "composite"}
    assert stale.get_sample_value("sparkdiag_nvme_temperature_celsius", composite) is not None


def test_a_fixtures_log_has_no_age(tmp_path: Path) -> None:
    from sparkdiag.sources.host.nvme_tools import fixture_reader

    drives = NvmeSource(U2, fixture_reader(SMARTCTL_JSON.parent)).read(wait=True)
    assert drives[0].health is not None and drives[0].health_read_at is None


def test_check_reads_the_log_directory_and_says_what_to_do_without_it(tmp_path: Path) -> None:
    base = ["--quick", "--json", "--state-dir", str(tmp_path / "state"), "--path.sysfs", str(U2),
            "--nvml-fixture", str(NVML / "no-nvml.json")]  # fmt: skip
    logs = tmp_path / "logs"
    logs.mkdir()
    empty = invoke_cli("check", *base, "--nvme.log-dir", str(logs))
    row = next(r for r in json.loads(empty.stdout)["checks"] if r["name"] == "nvme-health")
    assert row["status"] == "skip" and "no nvme-log file for nvme0" in row["finding"]
    assert "sparkdiag-nvme-log.timer" in row["action"]
    (logs / "nvme0.smartctl.json").write_bytes(SMARTCTL_JSON.read_bytes())
    read = invoke_cli("check", *base, "--nvme.log-dir", str(logs))
    row = next(r for r in json.loads(read.stdout)["checks"] if r["name"] == "nvme-health")
    assert row["status"] == "pass", row
    # --no-nvme.smart reads no log at all, from a directory either
    off = invoke_cli("check", *base, "--nvme.log-dir", str(logs), "--no-nvme.smart")
    row = next(r for r in json.loads(off.stdout)["checks"] if r["name"] == "nvme-health")
    assert row["status"] == "skip" and "--no-nvme.smart" in row["finding"]


def test_the_command_refuses_a_sysfs_that_is_not_this_machines(tmp_path: Path) -> None:
    result = invoke_cli("nvme-log", "--path.sysfs", str(U2), "--nvme.log-dir", str(tmp_path))
    assert result.returncode == 3, result.stderr
    assert "is not /sys: the tools read /dev" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_command_on_this_machine_with_a_fake_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever NVMe drives this machine has: a line (or a JSON row) for each, each read by the
    fake smartctl (nvme0 answers, any other does not) or its file removed."""
    if not Path("/sys/class").is_dir():
        pytest.skip("no /sys")
    tool = _fake_smartctl(tmp_path)
    monkeypatch.setenv("PATH", str(Path(tool).parent))
    out = tmp_path / "out"
    result = invoke_cli("nvme-log", "--nvme.log-dir", str(out), "--json")
    names = controller_names(Path("/sys"))
    doc = json.loads(result.stdout)
    assert [d["device"] for d in doc["drives"]] == names
    assert result.returncode == (1 if set(names) - {"nvme0"} else 0), result.stderr
    expected = ["nvme0.smartctl.json"] if "nvme0" in names else []
    assert sorted(p.name for p in out.iterdir()) == expected
    text = invoke_cli("nvme-log", "--nvme.log-dir", str(out))
    if not names:
        assert "no NVMe drive under /sys/class/nvme: nothing to read" in text.stdout
    for name in names:
        assert f"{name}: " in text.stdout


def test_check_run_as_you_names_the_timers_directory(tmp_path: Path) -> None:
    """check run without root cannot read the SMART log; where the root timer's directory is
    there, its row says to read that (as check's baseline-store row names the service's state
    directory), not to install smartmontools, which is there."""
    root = tmp_path / "root"
    (root / "run" / "sparkdiag-nvme").mkdir(parents=True)
    base = ["--quick", "--json", "--state-dir", str(tmp_path / "state"), "--path.sysfs", str(U2),
            "--nvml-fixture", str(NVML / "no-nvml.json")]  # fmt: skip

    def row(*more: str) -> dict[str, str]:
        doc = json.loads(invoke_cli("check", *base, *more).stdout)
        found: dict[str, str] = next(r for r in doc["checks"] if r["name"] == "nvme-health")
        return found

    seen = row("--path.rootfs", str(root))
    assert seen["status"] == "skip"
    timer = root / "run" / "sparkdiag-nvme"
    assert f"the root timer leaves the SMART logs in {timer}" in seen["action"], seen
    assert f"--nvme.log-dir {timer}" in seen["action"]
    assert "install smartmontools" in row()["action"]  # no timer directory under /: as before
    given = row("--path.rootfs", str(root), "--nvme.log-dir", str(timer))  # read: no hint
    assert "no nvme-log file for nvme0" in given["finding"] and "root timer that" in given["action"]


def test_the_timers_directory_is_one_path_everywhere() -> None:
    from sparkdiag.config import OPTIONS_BY_ATTR
    from sparkdiag.sources.host.nvme_tools import TIMER_DIR
    from tests.support import ROOT

    assert OPTIONS_BY_ATTR["nvme_log_dir"].default_for("nvme-log") == TIMER_DIR
    for unit in ("sparkdiag.service", "sparkdiag-nvme-log.service"):
        assert f"--nvme.log-dir {TIMER_DIR}" in (ROOT / "systemd" / unit).read_text(), unit
