"""scripts/device/probe_truth.py, run for real on CPU torch with tiny settings.

On the H200 it measures the probe's spread, contention and hot-suite ratios; here every part
runs on CPU (the competing process is a CPU matmul loop) so that its plumbing, its time limit,
its partial results and its tables are proven before the device runs it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support import alive, run_python, skip_unless_installed

pytestmark = pytest.mark.worker

skip_unless_installed("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device" / "probe_truth.py"
TINY = [
    *("--device", "cpu", "--small", "--cycles", "2", "--repeats", "1", "--heat-seconds", "1"),
    "--worker-arg=--dtype=bf16,fp16,int4",
    "--worker-arg=--budget-seconds=0.3",
]


@pytest.fixture(scope="module")
def pt() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("probe_truth_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["probe_truth_script"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("probe_truth_script", None)


def _run(out: Path, *args: str, timeout: float = 120) -> tuple[str, dict[str, Any]]:
    """Run the script with ``--out OUT``; its stdout and the record it wrote there."""
    proc = run_python(SCRIPT, *args, "--out", str(out), timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout, json.loads((out / "probe_truth.json").read_text())


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("truth")
    stdout, record = _run(out, *TINY, timeout=600)
    table = (out / "probe_truth.txt").read_text()
    assert table in stdout  # the tables are printed too
    return record, table


def test_idle_part(full_run: tuple[dict[str, Any], str]) -> None:
    record, table = full_run
    idle = record["parts"]["idle"]
    assert "error" not in idle and "stopped" not in idle
    assert [c["cycle"] for c in idle["cycles"]] == [1, 2]
    assert all(c["status"] == "ok" for c in idle["cycles"])
    rows = idle["table"]["rows"]
    assert {"bf16 256x256x256", "bf16 256x256x256 beta=1", "int4 1x256x256"} <= set(rows)
    for row in rows.values():
        assert row["n"] == 2
        assert row["delivered_cv_percent"] is not None and row["delivered_cv_percent"] >= 0
    assert len(idle["table"]["gpu_busy_seconds"]) == 2
    assert "== idle: 2 default-suite cycles" in table and "GPU-busy seconds per cycle" in table


def test_contention_part(full_run: tuple[dict[str, Any], str]) -> None:
    record, table = full_run
    contention = record["parts"]["contention"]
    assert "error" not in contention
    assert [r["condition"] for r in contention["runs"]] == ["idle", "busy"]
    busy = contention["runs"][1]
    # the worker saw the competing process (on CPU: no NVML, so no pids) and measured anyway
    assert busy["status"] == "ok"
    for key, row in contention["table"].items():
        assert row["delivered_ratio"] == pytest.approx(
            row["busy_delivered"] / row["idle_delivered"]
        ), key
    assert "bf16 1x256x256" in contention["table"]
    assert "device copy GB/s" in contention["table"]
    assert "== contention" in table


def test_hot_part(full_run: tuple[dict[str, Any], str]) -> None:
    record, table = full_run
    hot = record["parts"]["hot"]
    assert "error" not in hot, hot.get("error")
    assert [r["condition"] for r in hot["runs"]] == ["idle", "busy", "after heat"]
    for run in hot["runs"]:
        assert run["status"] == "ok", run
        assert run["int4/bf16"] > 0 and run["int4/fp16"] > 0
    heat = hot["runs"][2]
    assert heat["heat_seconds"] == 1 and heat["load_stopped_after_worker_start"] > 0
    assert set(hot["table"]) == {"idle", "busy", "after heat"}
    soak = hot["soak"]
    assert soak["stopped"] == "completed" and len(soak["windows"]) >= 2
    assert all(w["int4/bf16"] for w in soak["windows"])
    assert "== hot suite" in table and "soak (the worker's own bf16 load" in table
    # every competing process was stopped and reaped
    assert len(record["load_pids"]) == 3  # contention, hot busy, hot heat
    assert not any(alive(pid) for pid in record["load_pids"])


def test_time_limit_keeps_what_was_measured(tmp_path: Path) -> None:
    stdout, record = _run(tmp_path, *TINY, "--parts", "a", "--cycles", "50", "--part-seconds", "12")
    idle = record["parts"]["idle"]
    assert idle["stopped"] == "time limit"
    assert 1 <= len(idle["cycles"]) < 50
    assert idle["table"]["rows"]["bf16 256x256x256"]["n"] == len(idle["cycles"])
    assert "idle: time limit" in stdout


def test_a_broken_part_does_not_stop_the_others(tmp_path: Path) -> None:
    args = ["--device", "cpu", "--parts", "idle,contention", "--python", "/nonexistent/python3"]
    _, record = _run(tmp_path, *args)
    for name in ("idle", "contention"):
        assert "FileNotFoundError" in record["parts"][name]["error"]
    assert "finished_at" in record
    assert not any(alive(pid) for pid in record.get("load_pids", []))


def test_bad_part_name_is_a_usage_error() -> None:
    proc = run_python(SCRIPT, "--parts", "idle,warm", timeout=60)
    assert proc.returncode == 2 and "unknown part 'warm'" in proc.stderr


def test_helpers(pt: ModuleType) -> None:
    assert pt.cv_percent([1.0, 1.0]) == 0.0
    assert pt.cv_percent([9.0, 11.0]) == pytest.approx(10.0)
    assert pt.cv_percent([5.0]) is None
    assert pt.ratio(1.0, 2.0) == 0.5 and pt.ratio(None, 2.0) is None and pt.ratio(1.0, 0) is None
    assert pt.median([None, 3.0, 1.0, float("nan")]) == 2.0
    assert pt.FIRST_KERNEL.match("sparkdiag-probe: int4 decode 1x8192x8192\n")
    assert not pt.FIRST_KERNEL.match("sparkdiag-probe: soak: int4 decode 1x8192x8192\n")
    assert not pt.FIRST_KERNEL.match("sparkdiag-probe: NVML unavailable: x\n")
    doc = {
        "results": [
            {
                "dtype": "bf16",
                "shape": "8x8x8",
                "beta": 1,
                "status": "ok",
                "delivered": 2.0,
                "peak": 3.0,
            },
            {"dtype": "fp8", "shape": "8x8x8", "beta": 0, "status": "unsupported"},
        ],
        "bandwidth": {"status": "ok", "delivered": 4e12, "peak": 5e12},
        "transfers": [
            {
                "memory": "pinned",
                "direction": "h2d",
                "size_bytes": 256 * 1024**2,
                "status": "ok",
                "delivered": 5.5e10,
            },
            {
                "memory": "pageable",
                "direction": "d2h",
                "size_bytes": 65536,
                "status": "unsupported",
                "delivered": None,
            },
        ],
    }
    assert pt.figures(doc) == {
        "bf16 8x8x8 beta=1": (2.0, 3.0),
        "device copy GB/s": (4000.0, 5000.0),
        "pinned h2d 256 MiB GB/s": (55.0, None),
    }


def test_tables(pt: ModuleType) -> None:
    cycles = [
        {"figures": {"bf16 8x8x8": (9.0, 10.0)}, "gpu_busy_seconds": 1.5},
        {"figures": {"bf16 8x8x8": (11.0, 10.0)}, "gpu_busy_seconds": 1.7},
    ]
    spread = pt.spread_table(cycles)
    row = spread["rows"]["bf16 8x8x8"]
    assert row["delivered_median"] == 10.0 and row["delivered_cv_percent"] == pytest.approx(10)
    assert row["peak_cv_percent"] == 0.0 and spread["gpu_busy_max"] == 1.7
    runs = [
        {"condition": "idle", "figures": {"k": (10.0, 10.0)}},
        {"condition": "busy", "figures": {"k": (4.0, 9.5)}},
        {"condition": "idle", "figures": {"k": (12.0, 10.0), "only idle": (1.0, 1.0)}},
        {"condition": "busy", "figures": {"k": (6.0, 10.5)}},
    ]
    table = pt.contention_table(runs)
    assert table["k"]["delivered_ratio"] == pytest.approx(5.0 / 11.0)
    assert table["k"]["peak_ratio"] == pytest.approx(1.0)
    assert table["only idle"]["busy_delivered"] is None
    assert table["only idle"]["delivered_ratio"] is None
    record = {"parts": {"idle": {"cycles": cycles, "table": spread}}}
    text = pt.render(record)
    assert "bf16 8x8x8" in text and "10.00" in text  # the CV column
