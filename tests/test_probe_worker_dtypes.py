"""The worker's dtype table: the static facts (contract.DTYPES), the code behind each dtype
(dtypes.DTYPE_KERNELS: gates and prepare functions) and how a kernel's failure reads."""

from __future__ import annotations

import math
from typing import Any

import pytest

from sparkdiag.probe.worker import contract, dtypes, kernels, nvml, plan
from tests.support import skip_unless_installed
from tests.support.worker import cpu_info

skip_unless_installed("torch")


def test_classify_exception() -> None:
    assert dtypes.classify_exception(NotImplementedError("x"))[0] == "unsupported"
    status, reason = dtypes.classify_exception(
        RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul")
    )
    assert status == "unsupported" and reason.startswith("RuntimeError: CUDA error")
    assert (
        dtypes.classify_exception(RuntimeError("Could not run 'aten::_int_mm'"))[0] == "unsupported"
    )
    assert dtypes.classify_exception(RuntimeError("CUDA out of memory. Tried"))[0] == "error"
    assert len(dtypes.classify_exception(RuntimeError("y" * 1000))[1]) <= 300
    rejected = dtypes.classify_kernel_exception(
        "nvfp4", RuntimeError("Invalid scaling configuration")
    )
    assert rejected[0] == "unsupported" and "nvfp4 call rejected" in rejected[1]
    cuda_fault = RuntimeError("CUDA error: misaligned address")
    assert dtypes.classify_kernel_exception("nvfp4", cuda_fault)[0] == "error"
    assert dtypes.classify_kernel_exception("bf16", RuntimeError("Invalid scaling"))[0] == "error"
    # a kernel that ran and failed, said without "CUDA error" (a review): an error
    for text in ("cuBLAS failed: CUBLAS_STATUS_EXECUTION_FAILED", "an illegal memory access"):
        assert dtypes.classify_kernel_exception("nvfp4", RuntimeError(text))[0] == "error"


def test_relative_error_catches_a_wrong_result(torch: Any) -> None:
    ref = torch.randn(8, 64, dtype=torch.float64)
    assert kernels.max_row_relative_error(torch, ref.clone(), ref) == 0.0
    bad = ref.clone()
    bad[3] *= 1.1  # one wrong row is enough
    err = kernels.max_row_relative_error(torch, bad.to(torch.bfloat16), ref)
    assert err == pytest.approx(0.1, rel=0.05)
    assert not kernels.within_bound(err, contract.DTYPES["bf16"].error_bound)
    good = kernels.max_row_relative_error(torch, ref.to(torch.bfloat16), ref)
    assert kernels.within_bound(good, contract.DTYPES["bf16"].error_bound)
    nan = ref.clone()
    nan[0, 0] = math.nan
    assert kernels.max_row_relative_error(torch, nan, ref) == math.inf
    assert not kernels.within_bound(math.nan, 1.0)
    assert not kernels.within_bound(None, 1.0)
    assert kernels.within_bound(0.0, contract.DTYPES["int8"].error_bound)
    assert not kernels.within_bound(1e-9, contract.DTYPES["int8"].error_bound)


def test_int4_quantisation_round_trip(torch: Any) -> None:
    gen = torch.Generator().manual_seed(7)
    wt = torch.randn(16, 256, generator=gen).to(torch.bfloat16)
    q, sz, deq = dtypes._quantize_int4(torch, wt, 128)
    assert q.dtype == torch.int32 and int(q.min()) >= 0 and int(q.max()) <= 15
    assert tuple(sz.shape) == (2, 16, 2) and sz.dtype == torch.bfloat16
    rel = float((deq - wt.double()).norm() / wt.double().norm())
    # 4-bit quantisation error (step/sqrt(12) ~ 0.1 sigma for a normal group), not the kernel's
    assert 0.05 < rel < 0.15


def test_gates(torch: Any) -> None:
    def info(cc: tuple[int, int], version: tuple[int, int] = (2, 11)) -> Any:
        return dtypes.DeviceInfo(torch, "cuda:0", True, cc, 132, 60 * 1024**2, version)

    assert dtypes.gate(info((9, 0)), "fp8") is None
    assert "8.9" in dtypes.gate(info((8, 0)), "fp8")
    assert "10.0" in dtypes.gate(info((9, 0)), "nvfp4")
    assert "2.8" in dtypes.gate(info((10, 0), (2, 7)), "nvfp4")
    assert dtypes.gate(info((12, 1)), "nvfp4") is None
    assert dtypes.gate(cpu_info(), "bf16") is None
    assert "cpu" in dtypes.gate(cpu_info(), "tf32")


def test_dtype_table() -> None:
    assert (
        contract.ALL_DTYPES
        == tuple(contract.DTYPES)
        == ("bf16", "fp16", "tf32", "fp8", "int8", "int4", "nvfp4")
    )
    assert contract.DTYPES["int8"].error_bound == 0.0  # int32 accumulation is exact
    assert [d for d, s in contract.DTYPES.items() if s.beta_variant] == ["bf16"]
    assert [d for d, s in contract.DTYPES.items() if s.matmul_precision] == ["tf32"]
    assert contract.DTYPES["int4"].compute_edge(8192) == 4096
    assert contract.DTYPES["int4"].compute_edge(1024) == 1024
    for spec in contract.DTYPES.values():
        assert spec.decode_m == tuple(sorted(spec.decode_m)) and spec.decode_m[0] == 1


def test_a_new_dtype_is_an_entry_in_each_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp64 added with its static facts (contract.DTYPES) and its code (dtypes.DTYPE_KERNELS,
    reusing the float prepare function) runs end to end."""
    monkeypatch.setitem(contract.DTYPES, "fp64", contract.DtypeSpec(1e-9, (1,)))
    kernel = dtypes.DtypeKernel(dtypes._gate_any, dtypes._prepare_float("float64"))
    monkeypatch.setitem(dtypes.DTYPE_KERNELS, "fp64", kernel)
    info = cpu_info()
    specs = plan.plan_suite(info, ["fp64"], True, [])
    assert [(s.kind, s.beta) for s in specs] == [("compute", 0), ("llm", 0), ("decode", 0)]
    args = contract.parse_args(["--device", "cpu", "--warmup", "1", "--iters", "2"])
    budget = plan.Budget(1.0, 1)
    result = kernels.run_kernel(info, specs[0], args, budget, nvml.BusyState(None, set(), 0.1))
    assert result["status"] == "ok", result
    assert result["error_bound"] == 1e-9 and result["max_rel_error"] <= 1e-9


def test_the_two_dtype_tables_name_the_same_dtypes_in_the_same_order() -> None:
    assert tuple(dtypes.DTYPE_KERNELS) == tuple(contract.DTYPES) == contract.ALL_DTYPES


def test_torchs_shape_checks_read_as_unsupported() -> None:
    """_int_mm on CUDA refuses M <= 16 ("self.size(0) needs to be greater than 16, but got 1"),
    which a --shape of M 1 met: the cycle failed with an error (found in a review)."""
    for text in (
        "self.size(0) needs to be greater than 16, but got 1",
        "Expected both dimensions of mat2 to be divisble by 16 but got torch.Size([4104, 8192])",
    ):
        assert dtypes.classify_kernel_exception("int8", RuntimeError(text))[0] == "unsupported"
