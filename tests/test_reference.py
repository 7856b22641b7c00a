"""The built-in table of reference figures and its lookup by NVML device name."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest

from sparkdiag.baseline.reference import (
    REFERENCES,
    Reference,
    efficiency,
    gpu_model,
    lookup,
    lookup_all,
    normalize_dtype,
)
from tests.support import NVML, PROBE, ROOT, sparkdiag_cmd

MODELS = {
    "H100 SXM",
    "H100 PCIe",
    "H100 NVL",
    "H200 SXM",
    "H200 NVL",
    "GH200",
    "A100 SXM",
    "A100 PCIe",
    "B200",
    "GB10",
}
DTYPES = {"bf16", "fp16", "tf32", "fp8", "int8", "nvfp4"}


@pytest.mark.parametrize(
    ("nvml_name", "model"),
    [
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe"),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB10", "GB10"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("nvidia h200", "H200 SXM"),
    ],
)
def test_nvml_names_map_to_models(nvml_name: str, model: str) -> None:
    assert gpu_model(nvml_name) == model


@pytest.mark.parametrize(
    "nvml_name",
    ["NVIDIA GB200", "NVIDIA H20", "NVIDIA H800", "Tesla V100-SXM2-16GB", "NVIDIA L40S", ""],
)
def test_unknown_gpus(nvml_name: str) -> None:
    assert gpu_model(nvml_name) is None
    assert lookup(nvml_name, "bf16") is None
    assert lookup_all(nvml_name, "bf16") == []


def test_known_model_without_sourced_figures_gives_none() -> None:
    assert lookup("NVIDIA H100 NVL", "bf16") is None
    assert lookup("NVIDIA H200 NVL", "bf16") is None


@pytest.mark.parametrize(
    ("nvml_name", "dtype", "kind", "tflops"),
    [
        ("NVIDIA H200", "bf16", "mamf", 794.5),
        ("NVIDIA H200", "fp8", "mamf", 1453.4),
        ("NVIDIA H100 80GB HBM3", "bf16", "mamf", 794.5),
        ("NVIDIA H100 80GB HBM3", "fp8", "mamf", 1402.6),
        ("NVIDIA A100-SXM4-80GB", "bf16", "mamf", 271.2),
        ("NVIDIA A100 80GB PCIe", "bf16", "mamf", 252.9),
        ("NVIDIA B200", "bf16", "mamf", 1745.0),
        ("NVIDIA B200", "fp8", "mamf", 3432.5),
        ("NVIDIA GB10", "bf16", "mamf", 99.8),
        ("NVIDIA GB10", "fp8", "mamf", 207.7),
        ("NVIDIA GH200 480GB", "bf16", "mamf", 828.6),
        ("NVIDIA H100 PCIe", "bf16", "datasheet_dense", 756.5),
        ("NVIDIA H100 PCIe", "fp8", "datasheet_dense", 1513.0),
        ("NVIDIA H100 80GB HBM3", "tf32", "datasheet_dense", 494.5),
        ("NVIDIA H100 80GB HBM3", "int8", "datasheet_dense", 1979.0),
        ("NVIDIA H200", "fp16", "datasheet_dense", 989.5),
        ("NVIDIA A100-SXM4-80GB", "tf32", "datasheet_dense", 156.0),
        ("NVIDIA A100-SXM4-80GB", "int8", "datasheet_dense", 624.0),
        ("NVIDIA B200", "tf32", "datasheet_dense", 1100.0),
        ("NVIDIA B200", "int8", "datasheet_dense", 4500.0),
        ("NVIDIA GB10", "nvfp4", "datasheet_dense", 500.0),
    ],
)
def test_lookup_prefers_the_measured_mamf_then_the_datasheet(
    nvml_name: str, dtype: str, kind: str, tflops: float
) -> None:
    """The measured MAMF where one is sourced, else the datasheet's dense figure."""
    ref = lookup(nvml_name, dtype)
    assert ref is not None
    assert (ref.kind, ref.tflops) == (kind, tflops)


def test_lookup_all_returns_mamf_then_datasheet() -> None:
    refs = lookup_all("NVIDIA H100 80GB HBM3", "bf16")
    assert [r.kind for r in refs] == ["mamf", "datasheet_dense"]
    assert [r.tflops for r in refs] == [794.5, 989.5]
    assert lookup("NVIDIA H100 80GB HBM3", "bf16") == refs[0]


def test_a100_has_no_fp8() -> None:
    assert lookup("NVIDIA A100-SXM4-80GB", "fp8") is None


def test_unknown_dtype() -> None:
    assert lookup("NVIDIA H200", "int4") is None
    assert lookup("NVIDIA H200", "") is None


@pytest.mark.parametrize(
    ("alias", "dtype"),
    [
        ("bfloat16", "bf16"),
        ("torch.bfloat16", "bf16"),
        ("BF16", "bf16"),
        ("float16", "fp16"),
        ("half", "fp16"),
        ("float8_e4m3fn", "fp8"),
        ("int8", "int8"),
    ],
)
def test_dtype_aliases(alias: str, dtype: str) -> None:
    assert normalize_dtype(alias) == dtype
    assert lookup("NVIDIA H200", alias) == lookup("NVIDIA H200", dtype)


@pytest.mark.parametrize("ref", REFERENCES, ids=lambda r: f"{r.gpu_model}-{r.dtype}-{r.kind}")
def test_every_entry_is_sourced_and_sane(ref: Reference) -> None:
    assert ref.source.strip()
    assert math.isfinite(ref.tflops) and ref.tflops > 0
    assert ref.kind in ("mamf", "datasheet_dense")
    assert ref.gpu_model in MODELS
    assert ref.dtype in DTYPES


def test_no_duplicate_entries() -> None:
    keys = [(r.gpu_model, r.dtype, r.kind) for r in REFERENCES]
    assert len(keys) == len(set(keys))


def test_minimum_coverage() -> None:
    covered = {(r.gpu_model, r.dtype) for r in REFERENCES}
    for model in ("H100 SXM", "H200 SXM", "B200"):
        for dtype in ("bf16", "fp16", "tf32", "fp8", "int8"):
            assert (model, dtype) in covered
    for model in ("A100 SXM", "A100 PCIe"):
        for dtype in ("bf16", "fp16", "tf32", "int8"):
            assert (model, dtype) in covered
    assert ("GB10", "bf16") in covered and ("GB10", "fp8") in covered


def test_datasheet_figures_are_dense_not_sparse() -> None:
    sheet = {(r.gpu_model, r.dtype): r.tflops for r in REFERENCES if r.kind == "datasheet_dense"}
    # NVIDIA's H100 SXM datasheet says 1,979 for bf16 *with sparsity*; dense is half.
    assert sheet["H100 SXM", "bf16"] < 1000
    assert sheet["H200 SXM", "bf16"] < 1000
    assert sheet["H100 PCIe", "bf16"] < 800
    assert sheet["A100 SXM", "bf16"] == 312.0
    assert sheet["B200", "bf16"] < 2500
    # Within one GPU, 8-bit is twice 16-bit, which is about twice tf32: a figure taken
    # with sparsity next to one without would break the ratio.
    for (model, dtype), value in sheet.items():
        if dtype in ("fp8", "int8"):
            assert value == pytest.approx(2 * sheet[model, "bf16"], rel=0.01), model
        if dtype == "fp16":
            assert value == sheet[model, "bf16"], model
        if dtype == "tf32":
            assert value == pytest.approx(sheet[model, "bf16"] / 2, rel=0.03), model


def test_measured_never_exceeds_the_dense_peak() -> None:
    sheet = {(r.gpu_model, r.dtype): r.tflops for r in REFERENCES if r.kind == "datasheet_dense"}
    for ref in REFERENCES:
        if ref.kind == "mamf" and (ref.gpu_model, ref.dtype) in sheet:
            assert ref.tflops < sheet[ref.gpu_model, ref.dtype], ref


def test_sparse_halving_is_noted() -> None:
    ref = lookup_all("NVIDIA H100 80GB HBM3", "bf16")[1]
    assert "1979" in ref.note and "sparsity" in ref.note
    assert "nvidia.com" in ref.source


def test_efficiency() -> None:
    ref = lookup("NVIDIA H200", "bf16")
    assert ref is not None
    assert efficiency(686.0, ref) == pytest.approx(686.0 / 794.5)


def test_each_figure_has_one_name() -> None:
    """``MAMF 794.5`` / ``datasheet 989.5``: the name check, probe and the docs print."""
    h200 = lookup("NVIDIA H200", "bf16")
    assert h200 is not None and h200.label == "MAMF 794.5"
    fp16 = lookup("NVIDIA H200", "fp16")
    assert fp16 is not None and fp16.label == "datasheet 989.5"
    # one figure per GPU model and dtype of each kind, so the name picks out one figure
    keys = [(r.gpu_model, r.dtype, r.kind) for r in REFERENCES]
    assert len(keys) == len(set(keys))


def test_probe_check_and_docs_name_the_h200_reference_the_same(tmp_path: Path) -> None:
    """Issue 21 item 10: one reference figure per GPU model, named the same by probe, check,
    the README and docs/probe.md; mamf-finder's run at 8192³ on the lent H200 is never it."""
    fixtures = ["--nvml-fixture", str(NVML / "h200-idle.json")]
    fixtures += ["--probe.fixture", str(PROBE / "h200-default.json"), "--state-dir", str(tmp_path)]
    probe = subprocess.run(sparkdiag_cmd("probe", *fixtures), capture_output=True, text=True)
    check = subprocess.run(sparkdiag_cmd("check", *fixtures), capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    # both wrap to the terminal's width (100 columns here): compare the words
    probe_words, check_words = (" ".join(done.stdout.split()) for done in (probe, check))
    assert "MAMF 794.5" in probe_words and "MAMF 1453.4" in probe_words
    assert "0.91 of MAMF 794.5" in check_words and "0.93 of MAMF 1453.4" in check_words
    docs = (ROOT / "docs" / "probe.md").read_text() + (ROOT / "README.md").read_text()
    assert "MAMF 794.5" in docs
    assert "MAMF 666" not in docs and "MAMF 665" not in docs


def test_the_docs_table_of_reference_figures_is_the_code_table() -> None:
    """docs/probe.md's table names each MAMF figure as the code does, and no other."""
    page = (ROOT / "docs" / "probe.md").read_text()
    table = page[page.index("| GPU model (NVML name) |") :].split("\n\n")[0]
    shown = set(re.findall(r"MAMF [\d.]+", table))
    mamf = {r.label for r in REFERENCES if r.kind == "mamf"}
    assert shown == mamf
