"""Built-in reference figures for known GPUs, for an efficiency against the reference.

Two kinds of figure, per GPU model and dtype:

* ``mamf``: a published *measured* Maximum Achievable Matmul FLOPS, the best
  a tuned matmul reached on that model. What a healthy GPU can really do.
* ``datasheet_dense``: the vendor's theoretical peak *without* sparsity.
  NVIDIA's datasheets mostly quote with-2:4-sparsity figures; those are
  stored halved, and each entry's note says so.

:func:`lookup` prefers a MAMF figure over a datasheet peak; :func:`lookup_all`
returns both. Integer dtypes are in tera-operations per second under the same
``tflops`` name, as in the metric contract. Every entry carries its source;
add a figure only with one. A sparkdiag probe uses its own shape and few
iterations, so expect it to land somewhat below a MAMF figure even when
healthy; the learned baseline, not this table, drives alerts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

ReferenceKind = Literal["mamf", "datasheet_dense"]

# Model names used in the table (what :func:`gpu_model` returns).
H100_SXM = "H100 SXM"
H100_PCIE = "H100 PCIe"
H100_NVL = "H100 NVL"
H200_SXM = "H200 SXM"
H200_NVL = "H200 NVL"
GH200 = "GH200"
A100_SXM = "A100 SXM"
A100_PCIE = "A100 PCIe"
B200 = "B200"
GB10 = "GB10"


@dataclass(frozen=True)
class Reference:
    """One published figure.

    gpu_model: canonical model (``H100 SXM``, ``GB10``, ...)
    dtype: ``bf16``, ``fp16``, ``tf32``, ``fp8``, ``int8``, ``nvfp4``
    tflops: TFLOPS (TOPS for int8), dense
    kind: ``mamf`` (measured) or ``datasheet_dense`` (theoretical, no sparsity)
    source: citation: document or page title, year, URL where known
    note: how the figure was read (shape, software, halving of a sparse figure)
    """

    gpu_model: str
    dtype: str
    tflops: float
    kind: ReferenceKind
    source: str
    note: str = ""

    @property
    def label(self) -> str:
        """The figure's one name, as ``check``, ``probe`` and the docs print it:
        ``MAMF 794.5`` (a measured MAMF) or ``datasheet 989.5`` (a dense datasheet peak),
        in the dtype's unit. One figure per GPU model and dtype (:func:`lookup`)."""
        return f"{'MAMF' if self.kind == 'mamf' else 'datasheet'} {self.tflops:g}"


# -- sources -------------------------------------------------------------------

_MAMF_TABLE = (
    'Stas Bekman, "Machine Learning Engineering Open Book", chapter Accelerators, '
    '"Maximum Achievable Matmul FLOPS comparison table" (version of 2026-08; mean of '
    "100 iterations after 50 warm-ups at the best shape found by mamf-finder.py), "
    "https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md"
    "#maximum-achievable-matmul-flops-comparison-table"
)
_TFLOPS_TABLE = (
    'Stas Bekman, "Machine Learning Engineering Open Book", chapter Accelerators, '
    '"TFLOPS comparison table" (dense, version of 2026-08), '
    "https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md"
    "#tflops-comparison-table"
)
_A100_DATASHEET = (
    "NVIDIA A100 Tensor Core GPU datasheet (2020; 80GB revision 2021), "
    "https://www.nvidia.com/en-us/data-center/a100/"
)
_H100_DATASHEET = (
    "NVIDIA H100 Tensor Core GPU datasheet (2022), https://www.nvidia.com/en-us/data-center/h100/"
)
_H200_DATASHEET = (
    "NVIDIA H200 Tensor Core GPU product page and datasheet (2024), "
    "https://www.nvidia.com/en-us/data-center/h200/"
)
_GH200_PAGE = (
    "NVIDIA GH200 Grace Hopper Superchip specifications (2023), "
    "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/"
)
_HGX_B200 = (
    'NVIDIA HGX platform specifications, "Individual Blackwell GPU Specifications", '
    "HGX B200 column (2024), https://www.nvidia.com/en-us/data-center/hgx/"
)
_DGX_SPARK_PAGE = (
    'NVIDIA DGX Spark product page, specifications: "1 PFLOP - theoretical FP4 TOPS using '
    'the sparsity feature" (2025), https://www.nvidia.com/en-us/products/workstations/dgx-spark/'
)
_SPARK_MAMF = (
    "StorageReview, NVIDIA DGX Spark review (2025): mamf-finder run on a DGX Spark, "
    "bf16 99.8 and fp8 207.7 TFLOPS, https://www.storagereview.com (the review's exact page "
    "address was not located from here)"
)

_HALVED = "half of the datasheet's with-sparsity figure of {sparse:g}"


def _mamf(model: str, dtype: str, tflops: float, note: str, source: str = _MAMF_TABLE) -> Reference:
    return Reference(model, dtype, tflops, "mamf", source, note)


def _sheet(model: str, dtype: str, sparse: float, source: str) -> Reference:
    """A datasheet figure quoted with sparsity: stored dense, i.e. halved."""
    return Reference(
        model, dtype, sparse / 2, "datasheet_dense", source, _HALVED.format(sparse=sparse)
    )


def _dense(model: str, dtype: str, tflops: float, source: str, note: str) -> Reference:
    """A figure the source already gives without sparsity."""
    return Reference(model, dtype, tflops, "datasheet_dense", source, note)


REFERENCES: tuple[Reference, ...] = (
    # -- measured MAMF -----------------------------------------------------------
    _mamf(A100_SXM, "bf16", 271.2, "best shape 1024x10240x5120, torch 2.6.0+cu126"),
    _mamf(A100_PCIE, "bf16", 252.9, "best shape 2048x5120x6144, torch 2.5.1+cu124"),
    _mamf(H100_SXM, "bf16", 794.5, "best shape 2048x2048x13312, torch 2.7.0+cu126"),
    _mamf(H100_SXM, "fp8", 1402.6, "float8_e4m3fn, best shape 1024x9216x14336, torch 2.7.0+cu126"),
    _mamf(
        H200_SXM,
        "bf16",
        794.5,
        "the table's H100 SXM row (2048x2048x13312, torch 2.7.0+cu126), annotated "
        "'H200 is the same'",
    ),
    _mamf(H200_SXM, "fp8", 1453.4, "float8_e4m3fn, best shape 1280x4096x12032, torch 2.7.1+cu128"),
    _mamf(GH200, "bf16", 828.6, "900 W 141 GiB HBM3e version, best shape 1024x15360x4096"),
    _mamf(GH200, "fp8", 1535.0, "float8_e4m3fn, 900 W 141 GiB HBM3e version"),
    _mamf(B200, "bf16", 1745.0, "best shape 1792x16128x3072, torch 2.7.1+cu128"),
    _mamf(B200, "fp8", 3432.5, "float8_e4m3fn, best shape 15360x4096x3072, torch 2.7.1+cu128"),
    _mamf(GB10, "bf16", 99.8, "DGX Spark (GB10)", source=_SPARK_MAMF),
    _mamf(GB10, "fp8", 207.7, "DGX Spark (GB10)", source=_SPARK_MAMF),
    # -- datasheet peaks, dense ----------------------------------------------------
    # A100: the datasheet gives dense and sparse; SXM and PCIe have the same peaks.
    # A100 has no FP8 tensor cores.
    *(
        _dense(model, dtype, tflops, _A100_DATASHEET, f"dense; {sparse:g} with sparsity")
        for model in (A100_SXM, A100_PCIE)
        for dtype, tflops, sparse in (
            ("tf32", 156.0, 312.0),
            ("bf16", 312.0, 624.0),
            ("fp16", 312.0, 624.0),
            ("int8", 624.0, 1248.0),
        )
    ),
    # H100 SXM and PCIe: the datasheet marks every tensor figure "shown with sparsity".
    _sheet(H100_SXM, "tf32", 989.0, _H100_DATASHEET),
    _sheet(H100_SXM, "bf16", 1979.0, _H100_DATASHEET),
    _sheet(H100_SXM, "fp16", 1979.0, _H100_DATASHEET),
    _sheet(H100_SXM, "fp8", 3958.0, _H100_DATASHEET),
    _sheet(H100_SXM, "int8", 3958.0, _H100_DATASHEET),
    _sheet(H100_PCIE, "tf32", 756.0, _H100_DATASHEET),
    _sheet(H100_PCIE, "bf16", 1513.0, _H100_DATASHEET),
    _sheet(H100_PCIE, "fp16", 1513.0, _H100_DATASHEET),
    _sheet(H100_PCIE, "fp8", 3026.0, _H100_DATASHEET),
    _sheet(H100_PCIE, "int8", 3026.0, _H100_DATASHEET),
    # H200 SXM: same GH100 compute as H100 SXM, same with-sparsity figures.
    _sheet(H200_SXM, "tf32", 989.0, _H200_DATASHEET),
    _sheet(H200_SXM, "bf16", 1979.0, _H200_DATASHEET),
    _sheet(H200_SXM, "fp16", 1979.0, _H200_DATASHEET),
    _sheet(H200_SXM, "fp8", 3958.0, _H200_DATASHEET),
    _sheet(H200_SXM, "int8", 3958.0, _H200_DATASHEET),
    # GH200: per-GPU dense figures as compiled (with NVIDIA's page as source) in the
    # ML Engineering book's TFLOPS table.
    *(
        _dense(
            GH200,
            dtype,
            tflops,
            f"{_GH200_PAGE}; dense figures as listed in {_TFLOPS_TABLE}",
            "dense, per GPU",
        )
        for dtype, tflops in (
            ("tf32", 494.5),
            ("bf16", 989.0),
            ("fp16", 989.0),
            ("fp8", 1979.0),
            ("int8", 1979.0),
        )
    ),
    # B200 (HGX, 1000 W): NVIDIA gives per-GPU figures with sparsity.
    _sheet(B200, "tf32", 2200.0, _HGX_B200),
    _sheet(B200, "bf16", 4500.0, _HGX_B200),
    _sheet(B200, "fp16", 4500.0, _HGX_B200),
    _sheet(B200, "fp8", 9000.0, _HGX_B200),
    _sheet(B200, "int8", 9000.0, _HGX_B200),
    # GB10: NVIDIA publishes only the sparse FP4 figure.
    _sheet(GB10, "nvfp4", 1000.0, _DGX_SPARK_PAGE),
)


# -- matching --------------------------------------------------------------------

_DTYPE_ALIASES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "tf32": "tf32",
    "fp8": "fp8",
    "float8_e4m3fn": "fp8",
    "e4m3": "fp8",
    "int8": "int8",
    "nvfp4": "nvfp4",
    "fp4": "nvfp4",
}


def normalize_dtype(dtype: str) -> str:
    """``bfloat16`` -> ``bf16``, ``float8_e4m3fn`` -> ``fp8``, ...; unknown names lower-cased."""
    name = dtype.strip().lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(name, name)


def _word(token: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Z0-9]){token}(?![A-Z0-9])")


_GB10 = _word("GB10")
_GH200 = _word("GH200")
_B200 = _word("B200")
_H200 = _word("H200")
_H100 = _word("H100")
_A100 = _word("A100")
_PCIE = _word("PCIE")
_NVL = _word("NVL")


def gpu_model(gpu_name: str) -> str | None:
    """The table's model for an NVML device name, or None when unknown.

    Accepts what ``nvidia-smi --query-gpu=name`` prints: ``NVIDIA H200``,
    ``NVIDIA H100 80GB HBM3`` (SXM), ``NVIDIA H100 PCIe``, ``NVIDIA H100 NVL``,
    ``NVIDIA A100-SXM4-80GB``, ``NVIDIA A100 80GB PCIe``, ``NVIDIA B200``,
    ``NVIDIA GH200 480GB``, ``NVIDIA GB10``. GB200 and other models are unknown.
    """
    name = gpu_name.upper().replace("_", " ")
    if _GB10.search(name):
        return GB10
    if _GH200.search(name):
        return GH200
    if _B200.search(name):
        return B200
    if _H200.search(name):
        return H200_NVL if _NVL.search(name) else H200_SXM
    if _H100.search(name):
        if _PCIE.search(name):
            return H100_PCIE
        return H100_NVL if _NVL.search(name) else H100_SXM
    if _A100.search(name):
        return A100_PCIE if _PCIE.search(name) else A100_SXM
    return None


def lookup_all(gpu_name: str, dtype: str) -> list[Reference]:
    """Every figure for this GPU and dtype, measured MAMF first, then datasheet."""
    model = gpu_model(gpu_name)
    if model is None:
        return []
    wanted = normalize_dtype(dtype)
    found = [ref for ref in REFERENCES if ref.gpu_model == model and ref.dtype == wanted]
    return sorted(found, key=lambda ref: 0 if ref.kind == "mamf" else 1)


def lookup(gpu_name: str, dtype: str) -> Reference | None:
    """The best reference: a measured MAMF figure if there is one, else the datasheet peak."""
    found = lookup_all(gpu_name, dtype)
    return found[0] if found else None


def efficiency(tflops: float, reference: Reference) -> float:
    """``tflops`` as a fraction of the reference (1.0 = reaches it)."""
    return tflops / reference.tflops
