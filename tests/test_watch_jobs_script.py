"""scripts/device/watch_jobs.py (run on the H200 by the lead) on this machine's CPU with tiny
settings: every job runs alone and watched, the table and files are written, and a failing job
is reported without stopping the others."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.worker

SCRIPT = ROOT / "scripts" / "device" / "watch_jobs.py"


def test_jobs_alone_and_watched_on_cpu_with_a_failing_job(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--scale", "tiny", "--seconds", "0.5",
         "--interval", "0.1", "--jobs", "broken,launch", "--pairs", "2", "--pin", "0",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr  # one job failed
    summary = json.loads((out / "watch_jobs.json").read_text())
    broken, launch = summary["rows"]
    assert "this job fails on purpose" in broken["error"]
    assert "overheads" not in broken  # stopped after the failing pair
    assert launch["error"] == ""
    assert launch["alone_per_second"] > 0 and launch["watched_per_second"] > 0
    assert launch["unit"] == "kernels" and len(launch["overheads"]) == 2  # --pairs 2
    assert launch["overhead"] == pytest.approx(sum(launch["overheads"]) / 2)  # their median
    assert summary["pin"] == 0 and summary["pairs"] == 2
    assert launch["diagnosis"] == "no-gpu"  # no NVML on this machine
    diagnosis = json.loads((out / "launch.diagnosis.json").read_text())
    assert diagnosis["schema"] == "sparkdiag-watch/1" and diagnosis["exit_status"] == 0
    assert (out / "launch.recording.json").is_file()
    assert (out / "launch.png").read_bytes()[:4] == b"\x89PNG"
    text = (out / "watch_jobs.txt").read_text()
    assert text.splitlines()[0].split()[:5] == ["job", "expected", "diagnosis", "lost", "overhead"]
    assert "launch" in text and "cpu-bound-launcher" in text
    assert text in result.stdout


def test_each_job_runs_alone_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    for name in ("healthy", "starved", "checkpoint", "fp32"):
        path = tmp_path / f"{name}.json"
        subprocess.run(
            [sys.executable, str(SCRIPT), "job", name, "--seconds", "0.3", "--device", "cpu",
             "--scale", "tiny", "--result", str(path)],
            check=True, timeout=120, cwd=ROOT,
        )  # fmt: skip
        doc = json.loads(path.read_text())
        assert doc["job"] == name and doc["steps"] > 0 and doc["per_second"] > 0
