"""scripts/device/native_lint.py in its CPU mode: the lint on the fixture site-packages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, ROOTFS

SITE = ROOTFS / "dgx-spark-vllm" / "usr/local/lib/python3.12/dist-packages"


def test_native_lint_script_writes_its_outputs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "scripts/device/native_lint.py", "--out", str(tmp_path),
         "--site", str(SITE), "--capability", "9.0", "--cuobjdump", "/nonexistent"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = tmp_path / "native"
    assert "5 libraries with GPU code of 6 shared libraries" in done.stdout
    verdicts = json.loads((out / "verdicts.json").read_text())
    assert {v["sm"] for v in verdicts} == {"sm_90", "sm_121"}  # GB10 judged too (what if)
    rows = json.loads((out / "cuobjdump.json").read_text())
    assert all(r["cuobjdump"] == "not run: no cuobjdump" for r in rows)
    assert len(list((out / "traces").glob("*.json.gz"))) == 4
    assert (out / "table.txt").read_text().startswith("library")
