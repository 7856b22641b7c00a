"""One source per unit: the worker's dtype table says TOPS or TFLOPS (DtypeSpec.unit), and every
renderer (soak, compare, check, bench) and docs/metrics.md say the same."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sparkdiag.baseline.evaluate import evaluate
from sparkdiag.check.probe_checks import _figure
from sparkdiag.cli import main
from sparkdiag.compare.model import _entries
from sparkdiag.probe.document import parse_document
from sparkdiag.probe.runner import ProbeCycle
from sparkdiag.probe.worker.contract import DTYPES, SCHEMA, throughput_unit
from sparkdiag.soak import render
from tests.support import ROOT

UNITS = {
    "bf16": "TFLOPS",
    "fp16": "TFLOPS",
    "tf32": "TFLOPS",
    "fp8": "TFLOPS",
    "int8": "TOPS",
    "int4": "TOPS",
    "nvfp4": "TFLOPS",
}


def _document(*dtypes: str) -> Any:
    results = [
        {
            "dtype": d,
            "shape": "1x8192x8192",
            "kind": "decode",
            "beta": 0,
            "status": "ok",
            "delivered": 3.5,
            "peak": 3.2,
            "iters": 10,
        }
        for d in dtypes
    ]
    return parse_document({"schema": SCHEMA, "status": "ok", "results": results})


def test_the_table_says_tops_for_integer_dtypes_only() -> None:
    assert {d: spec.unit for d, spec in DTYPES.items()} == UNITS
    assert throughput_unit("int8") == "TOPS" and throughput_unit("bf16") == "TFLOPS"
    assert throughput_unit("fp64") == "TFLOPS"  # a dtype of another worker version


def test_docs_metrics_lists_each_dtype_under_its_unit() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    found = {}
    for unit, names in re.findall(r"(TOPS|TFLOPS) for ((?:`\w+`(?:, )?)+)", text):
        found.update({name: unit for name in re.findall(r"`(\w+)`", names)})
    assert found == UNITS


@pytest.mark.parametrize("dtype", sorted(UNITS))
def test_soak_compare_and_check_print_the_tables_unit(dtype: str) -> None:
    assert render.unit(dtype) == UNITS[dtype]
    assert render.unit(f"{dtype}/bf16") == ""  # a ratio has none
    doc = _document(dtype)
    (entry, *_), *_ = _entries(doc).values()
    assert entry.unit == UNITS[dtype]
    (figure,) = evaluate(doc, "GPU-x", "", "native", None)
    _, shown = _figure(figure)
    assert f"{dtype} 3.5 {UNITS[dtype]} delivered" in shown


def test_bench_prints_the_tables_unit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    doc = _document("int8", "bf16")

    def fake_worker(**kwargs: Any) -> ProbeCycle:
        return ProbeCycle("ok", None, doc, "", 0, 0.1, 1)

    monkeypatch.setattr("sparkdiag.commands.bench.run_worker", fake_worker)
    # a GPU for bench to sweep (without one it refuses, as soak does)
    idle = str(Path(__file__).parent / "fixtures" / "nvml" / "h200-idle.json")
    result = CliRunner().invoke(
        main, ["bench", "--dtype", "int8,bf16", "--m", "16", "--nvml-fixture", idle]
    )
    assert result.exit_code == 0, result.output
    assert "int8: best 3.2 TOPS at 1x8192x8192 (this GPU's MAMF)" in result.output
    assert "bf16: best 3.2 TFLOPS at 1x8192x8192 (this GPU's MAMF)" in result.output
