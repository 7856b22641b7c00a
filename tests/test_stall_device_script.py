"""scripts/device/stall.py (run on the H200 by the lead) and its reusable Prometheus start,
scripts/device/prom_session.py: the shortened rules change exactly one line, the fixture mode's
scripted phases replay the stall signature at the right polls, and (slow: a real Prometheus,
about 100 s) the whole script on fixtures fires SparkdiagGpuStalled in the spin phase only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from sparkdiag.sources.nvml.fixture import FixtureBackend
from sparkdiag.sources.nvml.gpu import GpuSource
from sparkdiag.telemetry.stall import stall_signature
from tests.support import ROOT

sys.path.insert(0, str(ROOT / "scripts" / "device"))
import prom_session
import stall

RULES = (ROOT / "prometheus" / "sparkdiag-rules.yml").read_text(encoding="utf-8")


def test_only_the_stalled_alerts_for_is_shortened() -> None:
    short = prom_session.shorten_for(RULES, {"SparkdiagGpuStalled": "30s"})
    changed = [
        (a, b) for a, b in zip(RULES.splitlines(), short.splitlines(), strict=True) if a != b
    ]
    assert changed == [("        for: 10m", "        for: 30s")]
    stalled = short.split("- alert: SparkdiagGpuStalled", 1)[1].split("- alert:", 1)[0]
    assert "for: 30s" in stalled
    with pytest.raises(ValueError, match="SparkdiagNoSuchAlert"):
        prom_session.shorten_for(RULES, {"SparkdiagNoSuchAlert": "1s"})


def test_the_fixture_mode_scripts_the_phases_at_their_polls(tmp_path: Path) -> None:
    phases = {"idle": 3.0, "spin": 4.0, "idle2": 2.0, "train": 2.0}
    path = tmp_path / "phases.json"
    stall.phase_fixture(path, phases)
    source = GpuSource(FixtureBackend(path))
    assert source.start()
    seen = []
    for _ in range(int(1 + stall.LEAD_SECONDS + sum(phases.values()))):
        source.backend.advance()
        (gpu,) = source.read()
        seen.append(stall_signature(gpu) is not None)
    start = int(stall.LEAD_SECONDS)  # poll 1 + LEAD_SECONDS is index LEAD_SECONDS
    assert not any(seen[: start + 3])  # lead and idle
    assert all(seen[start + 3 : start + 7])  # spin
    assert not any(seen[start + 7 :])  # idle2 and train


def test_the_verdict_needs_every_phase_right() -> None:
    good = {
        "idle": {"firing_during": [], "check": {"status": ["pass"]}},
        "spin": {"firing_during": ["SparkdiagGpuStalled"], "check": {"status": ["fail"]}},
        "idle2": {
            "firing_during": ["SparkdiagGpuStalled"],
            "firing_at_end": [],
            "check": {"status": ["pass"]},
        },
        "train": {"firing_during": [], "check": {"status": ["pass"]}},
    }
    assert stall._verdict(good)["ok"] is True
    bad = {
        **good,
        "train": {"firing_during": ["SparkdiagGpuStalled"], "check": {"status": ["pass"]}},
    }
    assert stall._verdict(bad) == {**stall._verdict(good), "train_silent": False, "ok": False}


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs the prometheus binary")
@pytest.mark.prometheus
def test_the_script_on_fixtures(tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/device/stall.py"), "--fixture",
         "--phases", "idle=8,spin=40,idle2=10,train=15", "--stalled-for", "15s"],
        capture_output=True, text=True, timeout=400, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(tmp_path / "stall.tar.gz") as tar:
        names = set(tar.getnames())
        summary = json.load(tar.extractfile("summary.json"))  # type: ignore[arg-type]
    assert {
        "summary.txt",
        "timeline.jsonl",
        "rules-shortened.yml",
        "serve.log",
        "check-spin.json",
        "dump.prom",
    } <= names
    per = summary["per_phase"]
    assert "SparkdiagGpuStalled" in per["spin"]["firing_during"]
    assert "SparkdiagGpuStalled" not in per["idle"]["firing_during"] + per["train"]["firing_during"]
    assert per["spin"]["check"]["status"] == ["fail"]
