"""scripts/device/soak.sh (run on the H200 by the lead) on this machine's CPU with a tiny soak:
every file it promises under $OUT, the served sparkdiag_soak_* series (none for a CPU) and
check's soak row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.worker

SCRIPT = ROOT / "scripts" / "device" / "soak.sh"


def test_device_script_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    result = subprocess.run(
        ["bash", str(SCRIPT), "--device", "cpu", "--small", "--duration", "2", "--window", "0.5"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, check=False,
    )  # fmt: skip
    record = json.loads((out / "soak.json").read_text())
    (gpu,) = record["gpus"]
    assert gpu["stopped"] == "completed", result.stdout + result.stderr
    assert {v["status"] for v in gpu["verdicts"]} <= {"ran", "unsupported"}  # a CPU: no verdict
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = (out / "verdict.txt").read_text()
    assert "stopped: completed after 2 s of load" in verdict
    assert f"soak rc={result.returncode}" in result.stdout
    assert (out / "soak.csv").read_text().startswith("gpu,uuid,window,phase,elapsed_seconds")
    for name in ("soak-time.png", "soak-temperature.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "soak-state.json").read_text())["gpus"][0]["gpu"] == "cpu"
    assert (out / "soak-metrics.prom").read_text() == ""  # a CPU soak is no GPU's: not served
    check_rows = result.stdout.split("== sparkdiag check --quick")[1]
    assert "CPU test soak" in check_rows and "cooling" not in check_rows
    assert verdict in (out / "log.txt").read_text()
