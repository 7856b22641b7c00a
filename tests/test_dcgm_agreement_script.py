"""scripts/device/dcgm_agreement.py (run on the H200 by the lead) here, on NVML fixtures beside a
fake nvidia-smi that prints what the real one would for the same GPU: the verdicts, the exit
status and the one archive it leaves under $OUT."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.support import NVML, ROOT

SCRIPT = ROOT / "scripts" / "device" / "dcgm_agreement.py"
FAKE = ROOT / "tests" / "support" / "dcgm_scripts" / "fake_nvidia_smi.py"
# What nvidia-smi --query-gpu=... --format=csv,noheader,nounits prints for the H200 of
# tests/fixtures/nvml/h200-load.json (power with its two decimals)
H200 = {
    "index": "0",
    "uuid": "GPU-979ad365-0b73-a0ac-74a2-3520b773d460",
    "name": "NVIDIA H200",
    "pci.bus_id": "00000000:00:06.0",
    "driver_version": "580.159.04",
    "temperature.gpu": "60",
    "temperature.memory": "52",
    "clocks.sm": "1455",
    "clocks.mem": "3201",
    "power.draw": "692.30",
    "utilization.gpu": "99",
    "utilization.memory": "24",
    "utilization.encoder": "0",
    "utilization.decoder": "0",
    "memory.used": "1010",
    "memory.free": "142145",
}
# ... and for the GB10 of gb10-idle.json: memory temperature, memory clock and memory N/A
GB10 = {
    "index": "0",
    "uuid": "GPU-5b4c1f0e-6a2d-4e8b-9c31-0d2e7f6a9b10",
    "name": "NVIDIA GB10",
    "pci.bus_id": "0000000F:01:00.0",
    "driver_version": "580.126.09",
    "temperature.gpu": "36",
    "clocks.sm": "2418",
    "power.draw": "3.00",
    "utilization.gpu": "0",
}


def run(
    tmp_path: Path, fixture: str, smi: list[dict[str, str]], program: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]:
    out = tmp_path / "out"
    wrapper = tmp_path / "nvidia-smi"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, OUT=str(out), FAKE_NVIDIA_SMI=json.dumps(smi))
    result = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--rounds", "2",
            "--nvidia-smi", str(program or wrapper),
            f"--sparkdiag-arg=--nvml-fixture={NVML / f'{fixture}.json'}",
            # serve polls every 0.1 s and is scraped from its second poll (GPM in), not after
            # the 2 s the script waits on the device
            "--settle", "0", "--serve-arg=--poll-interval=0.1",
        ],
        capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    archive = out / "dcgm_agreement.tgz"
    assert archive.is_file(), result.stdout + result.stderr
    unpacked = tmp_path / "unpacked"
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    agreement = unpacked / "agreement.json"
    doc = json.loads(agreement.read_text()) if agreement.exists() else {}
    return result, doc, unpacked


def verdicts(doc: dict[str, Any], round_: int = 2) -> dict[str, str]:
    return {r["nvidia_smi"]: r["verdict"] for r in doc["rows"] if r["round"] == round_}


def test_h200_agrees(tmp_path: Path) -> None:
    result, doc, files = run(tmp_path, "h200-load", [H200])
    assert result.returncode == 0, result.stdout + result.stderr
    got = verdicts(doc)
    judged = [
        "uuid",
        "name",
        "pci.bus_id",
        "driver_version",
        "temperature.gpu",
        "temperature.memory",
        "clocks.sm",
        "clocks.mem",
        "power.draw",
    ]
    assert {field: got[field] for field in judged} == dict.fromkeys(judged, "ok")
    assert got["memory.used"] == "shown (ok)"
    assert got["utilization.gpu"] == "shown (ok)"
    assert len(doc["rows"]) == 2 * 15
    # the daemon polled past GPM's first sample: the profiling fields are in
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in doc["exported"]
    assert doc["dump_returncode"] == 0 and "DCGM_FI_DEV_GPU_TEMP" in doc["dump_exported"]
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in doc["exported"]
    assert sorted(p.name for p in files.iterdir()) == [
        "agreement.json",
        "agreement.md",
        "dump.prom",
        "nvidia-smi.csv",
        "scrape-first.prom",
        "scrape-last.prom",
        "serve.log",
    ]
    table = (files / "agreement.md").read_text()
    assert table in result.stdout
    assert (
        "| 2 | 0 | clocks.sm | DCGM_FI_DEV_SM_CLOCK | 1455 | 1455 / 1455 | rel 0.05 | ok |" in table
    )
    assert "judged rows agreeing: 18 of 18" in table
    assert "dcgm_agreement rc=0" in result.stdout


def test_h200_disagreement_is_found(tmp_path: Path) -> None:
    wrong = {**H200, "temperature.gpu": "63", "clocks.sm": "1540", "power.draw": "660.00"}
    del wrong["temperature.memory"]  # nvidia-smi N/A while sparkdiag exports one
    wrong["name"] = "NVIDIA H100"
    result, doc, _ = run(tmp_path, "h200-load", [wrong])
    assert result.returncode == 1, result.stdout + result.stderr
    got = verdicts(doc)
    assert got["temperature.gpu"] == "DIFFERS"  # 3 °C apart
    assert got["clocks.sm"] == "DIFFERS"  # 5.5 % apart
    assert got["power.draw"] == "ok"  # 4.9 % apart
    assert got["temperature.memory"] == "smi N/A"
    assert got["name"] == "DIFFERS"
    assert {r["nvidia_smi"] for r in doc["failures"]} == {
        "temperature.gpu",
        "clocks.sm",
        "temperature.memory",
        "name",
    }
    assert "judged rows agreeing: 10 of 18" in result.stdout  # 4 rows wrong in each round


def test_gb10_what_nvidia_smi_cannot_read_sparkdiag_leaves_out(tmp_path: Path) -> None:
    result, doc, _ = run(tmp_path, "gb10-idle", [GB10])
    assert result.returncode == 0, result.stdout + result.stderr
    got = verdicts(doc)
    assert got["temperature.memory"] == "both N/A"
    assert got["clocks.mem"] == "both N/A"
    assert got["temperature.gpu"] == "ok"
    # nvidia-smi says "Not Supported" for memory; sparkdiag shows the host's: shown, not judged
    assert got["memory.used"] == "shown (smi N/A)"
    assert "DCGM_FI_DEV_MEMORY_TEMP" in doc["left_out"]


@pytest.mark.parametrize("program", ["/nonexistent/nvidia-smi"])
def test_cannot_run_is_status_2_with_the_reason_kept(tmp_path: Path, program: str) -> None:
    result, doc, files = run(tmp_path, "h200-load", [H200], program=Path(program))
    assert result.returncode == 2, result.stdout + result.stderr
    assert doc == {}
    assert "No such file" in (files / "error.txt").read_text()
    assert (files / "serve.log").exists()
