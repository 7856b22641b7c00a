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


SCRIPT2 = ROOT / "scripts" / "device" / "storage2_h200.sh"


def test_final_call_script_dry_stays_in_budget_and_archives_everything(tmp_path: Path) -> None:
    """scripts/device/storage2_h200.sh --dry: one archive with every file, the GPU path saying
    why it was skipped (CPU torch), the paired round and the contrast, the table last, within
    its 45 s, vm.nr_hugepages put back."""
    fio = shutil.which("fio")
    if fio is None:
        pytest.skip("fio not installed (apt-get install fio)")
    out, measured = tmp_path / "out", tmp_path / "measured"
    hugepages = Path("/proc/sys/vm/nr_hugepages").read_text()
    env = dict(os.environ, OUT=str(out), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    result = subprocess.run(
        ["bash", str(SCRIPT2), "--dry", "--fio", fio, "--dir", str(measured)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert Path("/proc/sys/vm/nr_hugepages").read_text() == hugepages
    listed = subprocess.run(["tar", "tzf", str(out / "storage2.tgz")], capture_output=True,
                            text=True, check=True).stdout.split()  # fmt: skip
    names = {Path(n).name for n in listed}
    assert {"storage.json", "fio.json", "fio.txt", "table.txt", "env.txt", "log.txt",
            "errors.txt"} <= names  # fmt: skip
    assert [n for n in os.listdir(out) if n != "storage2.tgz"] == []
    table = result.stdout[result.stdout.index("storage2: ") :]
    assert "GPU path: unsupported" in table and "probe/fio write" in table
    assert "cause of call b" in table and "fio read, 4 KiB pages" in table
    spent = int(table.split(" s of the 45 s budget")[0].split()[-1])
    assert spent <= 45 and "; 0 error(s)" in table, table
    assert not measured.exists() or list(measured.iterdir()) == []
