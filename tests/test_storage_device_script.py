"""scripts/device/storage_h200.sh (run on the lent H200 by the integrator) here, in its dry mode
on this machine's disk: every file it promises under $OUT/storage, no step failed, nothing left
in the directory it measured."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.storage

SCRIPT = ROOT / "scripts" / "device" / "storage_h200.sh"


def test_device_script_dry(tmp_path: Path) -> None:
    fio = shutil.which("fio")
    if fio is None:
        pytest.skip("fio not installed (apt-get install fio)")
    out, measured = tmp_path / "out", tmp_path / "measured"
    env = dict(os.environ, OUT=str(out), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry", "--fio", fio, "--dir", str(measured)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    storage = out / "storage"
    assert (storage / "errors.txt").read_text() == "", result.stdout
    probe = json.loads((storage / "probe.json").read_text())
    assert probe["schema"] == "sparkdiag-storage-report/1"
    assert {f["direction"] for f in probe["figures"]} == {"read", "write"}
    rounds = json.loads((storage / "fio.json").read_text())["rounds"]
    assert len(rounds) == 2 and all(r["fio_read"] > 0 and r["probe_read"] > 0 for r in rounds)
    rows = {r["name"]: r for r in json.loads((storage / "check.json").read_text())["checks"]}
    assert rows["storage-speed"]["status"] == "pass"
    assert "sparkdiag_storage_throughput_bytes_per_second{" in (storage / "nvme.prom").read_text()
    assert "cost:" in (storage / "probe.txt").read_text()
    assert "median probe/fio read" in result.stdout
    assert not measured.exists() or list(measured.iterdir()) == []
