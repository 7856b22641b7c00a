"""The systemd unit: verified and hardened (exposure at or under 3.0), checked with systemd."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, required_tool

UNIT = ROOT / "systemd" / "sparkdiag.service"


def systemd_analyze() -> str:
    return required_tool("systemd-analyze", "systemd")


def local_unit(tmp_path: Path) -> Path:
    """The shipped unit with ExecStart pointing at this checkout's sparkdiag, so that verify
    can find the binary; nothing else changes."""
    binary = Path(sys.executable).with_name("sparkdiag")
    if not binary.exists():
        pytest.skip(f"{binary} not installed (pip install -e .)")
    text = UNIT.read_text().replace("/opt/sparkdiag/bin/sparkdiag", str(binary))
    path = tmp_path / "sparkdiag.service"
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


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = systemd_analyze()
    unit = local_unit(tmp_path)
    result = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sparkdiag.service" not in result.stderr, result.stderr  # no warnings about the unit


def test_systemd_security_exposure(tmp_path: Path) -> None:
    tool = systemd_analyze()
    unit = local_unit(tmp_path)
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
        "config.toml",
    } <= written
    assert (tmp_path / "systemd/sparkdiag.service").read_text() == UNIT.read_text()
    with pytest.raises(FileExistsError, match="pass --force"):
        write_assets(tmp_path)
    assert write_assets(tmp_path, force=True)
