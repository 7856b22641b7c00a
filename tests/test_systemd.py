"""The systemd unit: verified and hardened (exposure at or under 3.0), checked with systemd."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, required_tool

UNIT = ROOT / "systemd" / "sparkdiag.service"
NVME_LOG = ROOT / "systemd" / "sparkdiag-nvme-log.service"
NVME_TIMER = ROOT / "systemd" / "sparkdiag-nvme-log.timer"


def systemd_analyze() -> str:
    return required_tool("systemd-analyze", "systemd")


def local_unit(tmp_path: Path, unit: Path = UNIT) -> Path:
    """A shipped unit with ExecStart pointing at this checkout's sparkdiag, so that verify
    can find the binary; nothing else changes."""
    binary = Path(sys.executable).with_name("sparkdiag")
    if not binary.exists():
        pytest.skip(f"{binary} not installed (pip install -e .)")
    text = unit.read_text().replace("/opt/sparkdiag/bin/sparkdiag", str(binary))
    path = tmp_path / unit.name
    path.write_text(text)
    return path


def test_unit_essentials() -> None:
    text = UNIT.read_text()
    for line in (
        "Type=notify",
        "Restart=on-failure",
        "RestartPreventExitStatus=2",
        "StateDirectory=sparkdiag",
        "ConfigurationDirectory=sparkdiag",
        "WatchdogSec=",
        "ExecStart=/opt/sparkdiag/bin/sparkdiag serve --config /etc/sparkdiag/config.toml",
    ):
        assert re.search(rf"^{re.escape(line)}", text, re.M), line


def test_the_gpu_nodes_are_allowed_by_every_name_of_their_major() -> None:
    """/dev/nvidia0..N are major 195, which /proc/devices names nvidia-frontend or nvidia by
    the driver's build; only nvidia-frontend was allowed, and under DevicePolicy=closed NVML
    would lose every GPU where it is named nvidia (found in a review). The uvm node by name
    too: a path is skipped when the node is made after the unit started."""
    allowed = re.findall(r"^DeviceAllow=(\S+) rw$", UNIT.read_text(), re.M)
    for name in ("char-nvidia-frontend", "char-nvidia", "char-nvidia-uvm", "/dev/nvidiactl"):
        assert name in allowed, name
    assert re.search(r"^DevicePolicy=closed$", UNIT.read_text(), re.M)


@pytest.mark.parametrize("unit", [UNIT, NVME_LOG, NVME_TIMER], ids=lambda p: p.name)
def test_the_units_comments_say_what_the_deploy_doc_says(unit: Path) -> None:
    """The unit's header sent readers to a README section that is in docs/deploy.md, and told
    them to pip install 'sparkdiag[probe]', which deploy.md says finds nothing (not on PyPI)."""
    comments = " ".join(
        line[1:].strip() for line in unit.read_text().splitlines() if line.startswith("#")
    )
    pointers = re.findall(r'see (\S+) "([^"]+)"', comments)
    assert pointers, comments
    for name, heading in pointers:
        doc = (ROOT / name).read_text()
        assert re.search(rf"^#+ {re.escape(heading)}$", doc, re.M), (name, heading)
        section = doc.split(heading, 1)[1].split("\n## ", 1)[0]
        for command in re.findall(r"pip install '[^']+'", comments):
            assert command in section, (command, name)  # deploy.md's own command
    assert "'sparkdiag[" not in comments  # nothing to install by name from an index


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = systemd_analyze()
    units = [local_unit(tmp_path, unit) for unit in (UNIT, NVME_LOG, NVME_TIMER)]
    result = subprocess.run([tool, "verify", *map(str, units)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sparkdiag" not in result.stderr, result.stderr  # no warnings about the units


def test_the_nvme_log_units_serve_the_daemon() -> None:
    """The SMART logs need root, which sparkdiag.service lacks: the root oneshot writes the
    directory the daemon reads, keeps it between runs (a oneshot's RuntimeDirectory goes when it
    ends otherwise) and leaves it readable; it is skipped, not failed, without a tool, and a
    drive not read fails it (a crash must not pass for success); enabling the daemon's unit
    enables the timer, without making the daemon start it (disable must stop it)."""
    helper, daemon = NVME_LOG.read_text(), UNIT.read_text()
    directory = re.search(r"nvme-log --nvme.log-dir (\S+)$", helper, re.M)
    assert directory and directory.group(1) == "/run/sparkdiag-nvme"
    assert f"--nvme.log-dir {directory.group(1)}" in daemon
    for line in (
        "Type=oneshot",
        "RuntimeDirectory=sparkdiag-nvme",
        "RuntimeDirectoryMode=0755",
        "RuntimeDirectoryPreserve=yes",
        "DevicePolicy=closed",
        "DeviceAllow=char-nvme r",
        "CapabilityBoundingSet=CAP_SYS_ADMIN",
        "ConditionPathExists=|/usr/sbin/smartctl",
        "ConditionPathExists=|/usr/sbin/nvme",
    ):
        assert re.search(rf"^{re.escape(line)}$", helper, re.M), line
    assert re.search(r"^User=", helper, re.M) is None  # root: the admin command needs it
    assert "SuccessExitStatus" not in helper
    assert "Wants=sparkdiag-nvme-log.timer" not in daemon
    assert re.search(r"^Also=sparkdiag-nvme-log.timer$", daemon, re.M)
    assert re.search(r"^OnUnitActiveSec=5min$", NVME_TIMER.read_text(), re.M)


@pytest.mark.parametrize("shipped", [UNIT, NVME_LOG], ids=lambda p: p.name)
def test_systemd_security_exposure(tmp_path: Path, shipped: Path) -> None:
    tool = systemd_analyze()
    unit = local_unit(tmp_path, shipped)
    result = subprocess.run(
        [tool, "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
    )
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    exposure = float(match.group(1))
    print(f"systemd-analyze security exposure: {exposure}")
    assert exposure <= 3.0, result.stdout


def test_assets_are_shipped_and_written(tmp_path: Path) -> None:
    from sparkdiag.assets import write_assets

    written = {p.relative_to(tmp_path).as_posix() for p in write_assets(tmp_path)}
    assert {
        "prometheus/sparkdiag-rules.yml",
        "systemd/sparkdiag.service",
        "systemd/sparkdiag-nvme-log.service",
        "systemd/sparkdiag-nvme-log.timer",
        "config.toml",
    } <= written
    assert (tmp_path / "systemd/sparkdiag.service").read_text() == UNIT.read_text()
    with pytest.raises(FileExistsError, match="pass --force"):
        write_assets(tmp_path)
    assert write_assets(tmp_path, force=True)
