"""The code behind each dtype: whether it can run here (its gate) and how its kernel is built
(its prepare: argument sets, the op, a float64 reference), and how a kernel's failure reads.

What is static about a dtype (error bound, decode M, unit) is in ``contract.DTYPES``;
``DTYPE_KERNELS`` below holds the rest, one entry per dtype in the same order. torch is never
imported here: it comes in :class:`DeviceInfo` (``info.torch``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkdiag.probe.worker.contract import DTYPES, INT4_GROUP

SLEEP_CLOCK_HZ = 3.2e9  # above any GPU's SM clock: a prequeue sleep is never too short
UNSUPPORTED_PATTERNS = (
    "not supported",
    "not_supported",
    "not implemented",
    "notimplemented",
    "could not run",
    "only supported",
    "is not available",
    "no kernel image",
    "unsupported",
    # torch's shape checks of a kernel (_int_mm: "self.size(0) needs to be greater than 16"):
    # this shape, not a fault
    "needs to be greater than",
    "to be divisble by",
    "to be divisible by",
)


def torch_version_tuple(version: str) -> tuple[int, int]:
    """'2.11.0+cu130' -> (2, 11)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def classify_exception(exc: BaseException) -> tuple[str, str]:
    """Map an exception from a kernel to ("unsupported"|"error", one-line reason)."""
    text = f"{type(exc).__name__}: {exc}"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if len(first) > 300:
        first = first[:297] + "..."
    lowered = text.lower()
    if isinstance(exc, NotImplementedError) or any(p in lowered for p in UNSUPPORTED_PATTERNS):
        return "unsupported", first
    return "error", first


def classify_kernel_exception(dtype: str, exc: BaseException) -> tuple[str, str]:
    """Like classify_exception, but a dtype whose API is young counts a rejection as unsupported.

    The nvfp4 call cannot be exercised without a Blackwell GPU, and torch has
    changed what it accepts (scale layouts, _scaled_mm_v2); a rejected call
    there is reported as unsupported with its message. A CUDA fault, or a
    wrong result (checked separately), stays an error.
    """
    status, reason = classify_exception(exc)
    spec = DTYPES.get(dtype)
    if (
        spec is not None
        and spec.rejection_is_unsupported
        and status == "error"
        and not any(fault in reason.lower() for fault in RUNTIME_FAULTS)
    ):
        return "unsupported", f"{dtype} call rejected: {reason}"
    return status, reason


# What a kernel that ran and failed says, unlike a call that was refused: CUDA's faults and
# cuBLAS's failures while executing (an nvfp4 CUBLAS_STATUS_EXECUTION_FAILED read
# "unsupported": found in a review)
RUNTIME_FAULTS = (
    "cuda error",
    "cublas_status_execution_failed",
    "cublas_status_internal_error",
    "cublas_status_mapping_error",
    "illegal memory access",
)


# --------------------------------------------------------------------------
# kernels


@dataclass
class KernelSpec:
    dtype: str
    kind: str  # compute | llm | decode | custom shapes are classified into these
    m_candidates: tuple[int, ...]
    n: int
    k: int
    beta: int = 0


@dataclass
class Prepared:
    """One kernel ready to run: argument sets, the op, and its reference."""

    make_set: Callable[[], tuple[Any, ...]]
    fn: Callable[..., Any]
    reference: Callable[[tuple[Any, ...], Any], Any]  # (set, row index tensor) -> float64 rows
    release: Callable[[], None] = lambda: None  # drop what only the reference needed


@dataclass
class DeviceInfo:
    torch: Any
    device: str
    is_cuda: bool
    capability: tuple[int, int] | None
    sm_count: int
    l2_bytes: int
    torch_version: tuple[int, int]
    max_clock_hz: float = SLEEP_CLOCK_HZ  # the SM clock prequeue sleeps are sized for


def _cc_text(info: DeviceInfo) -> str:
    cc = info.capability
    return f"{cc[0]}.{cc[1]}" if cc else "n/a"


def _cc_below(info: DeviceInfo, need: tuple[int, int], needs: str) -> str | None:
    """``needs`` ("tf32 needs compute capability 8.0+") with what the device has, when its
    compute capability is known and below ``need``; else None."""
    if info.capability is not None and info.capability < need:
        return f"{needs}, device has {_cc_text(info)}"
    return None


def _cuda_gate(info: DeviceInfo, need: tuple[int, int], on_cpu: str, needs: str) -> str | None:
    """The reason a CUDA-only mode cannot run: ``on_cpu`` on a CPU, :func:`_cc_below` on a GPU."""
    return on_cpu if not info.is_cuda else _cc_below(info, need, needs)


def _torch_lacks(info: DeviceInfo, names: tuple[str, ...], said: str) -> str | None:
    """ "torch X has no ``said``" when this torch lacks any of ``names``; else None."""
    if all(hasattr(info.torch, name) for name in names):
        return None
    return f"torch {info.torch.__version__} has no {said}"


def _gate_any(info: DeviceInfo) -> str | None:
    return None


def _gate_tf32(info: DeviceInfo) -> str | None:
    return _cuda_gate(
        info,
        (8, 0),
        "tf32 is a CUDA tensor-core mode; not available on cpu",
        "tf32 needs compute capability 8.0+",
    )


def _gate_fp8(info: DeviceInfo) -> str | None:
    return _cuda_gate(
        info,
        (8, 9),
        "fp8 probe runs on CUDA GPUs of compute capability 8.9+ only, not on cpu",
        "fp8 (torch._scaled_mm) needs compute capability 8.9+",
    ) or _torch_lacks(info, ("float8_e4m3fn", "_scaled_mm"), "float8_e4m3fn/_scaled_mm")


def _gate_int8(info: DeviceInfo) -> str | None:
    return _torch_lacks(info, ("_int_mm",), "torch._int_mm")


def _gate_int4(info: DeviceInfo) -> str | None:
    if not info.is_cuda:
        said = "CPU int4 kernel (_weight_int4pack_mm_for_cpu)"
        return _torch_lacks(info, ("_weight_int4pack_mm_for_cpu",), said)
    return _torch_lacks(info, ("_weight_int4pack_mm",), "torch._weight_int4pack_mm") or _cc_below(
        info, (8, 0), "int4 weight-only GEMM needs compute capability 8.0+"
    )


def _gate_nvfp4(info: DeviceInfo) -> str | None:
    reason = _cuda_gate(
        info,
        (10, 0),
        "nvfp4 needs a CUDA GPU of compute capability 10.0+, not cpu",
        "nvfp4 needs compute capability 10.0+ (Blackwell)",
    )
    if reason is None and info.torch_version < (2, 8):
        reason = f"nvfp4 needs torch 2.8+, have {info.torch.__version__}"
    return reason or _torch_lacks(info, ("float4_e2m1fn_x2",), "float4_e2m1fn_x2")


def _prepare_float(torch_dtype: str) -> Callable[[DeviceInfo, KernelSpec, int], Prepared]:
    """bf16, fp16 and tf32 (float32 under "high" matmul precision): torch.mm / torch.addmm."""

    def prepare_float(info: DeviceInfo, spec: KernelSpec, m: int) -> Prepared:
        torch = info.torch
        dev, n, k = info.device, spec.n, spec.k
        dt = getattr(torch, torch_dtype)
        f64 = torch.float64

        def make() -> tuple[Any, ...]:
            a = torch.randn(m, k, device=dev, dtype=dt)
            w = torch.randn(n, k, device=dev, dtype=dt)  # nn.Linear layout: B = W^T
            if spec.beta:
                return (torch.randn(m, n, device=dev, dtype=dt), a, w)
            return (a, w)

        def mm_beta(c: Any, a: Any, w: Any) -> Any:
            return torch.addmm(c, a, w.t())

        def ref_beta(s: tuple[Any, ...], rows: Any) -> Any:
            c, a, w = s
            return c[rows].to(f64) + a[rows].to(f64) @ w.to(f64).t()

        def mm(a: Any, w: Any) -> Any:
            return torch.mm(a, w.t())

        def ref(s: tuple[Any, ...], rows: Any) -> Any:
            a, w = s
            return a[rows].to(f64) @ w.to(f64).t()

        return Prepared(make, mm_beta, ref_beta) if spec.beta else Prepared(make, mm, ref)

    return prepare_float


def _prepare_fp8(info: DeviceInfo, spec: KernelSpec, m: int) -> Prepared:
    """e4m3 inputs, unit scales, bf16 output: torch._scaled_mm with fast accumulation."""
    torch = info.torch
    dev, n, k = info.device, spec.n, spec.k
    e4m3 = torch.float8_e4m3fn
    one = torch.ones((), device=dev, dtype=torch.float32)

    def make() -> tuple[Any, ...]:
        a = torch.randn(m, k, device=dev).to(e4m3)
        w = torch.randn(n, k, device=dev).to(e4m3)
        return (a, w)

    def fn(a: Any, w: Any) -> Any:
        out = torch._scaled_mm(
            a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True
        )
        return out[0] if isinstance(out, tuple) else out  # torch < 2.5 returned (out, amax)

    def ref(s: tuple[Any, ...], rows: Any) -> Any:
        a, w = s
        return a[rows].to(torch.float64) @ w.to(torch.float64).t()

    return Prepared(make, fn, ref)


def _prepare_int8(info: DeviceInfo, spec: KernelSpec, m: int) -> Prepared:
    """int8 inputs, int32 accumulation: torch._int_mm (A row-major, B column-major)."""
    torch = info.torch
    dev, n, k = info.device, spec.n, spec.k

    def make() -> tuple[Any, ...]:
        a = (torch.randn(m, k, device=dev) * 40).round().clamp(-127, 127).to(torch.int8)
        w = (torch.randn(n, k, device=dev) * 40).round().clamp(-127, 127).to(torch.int8)
        return (a, w)

    def fn(a: Any, w: Any) -> Any:
        return torch._int_mm(a, w.t())

    def ref(s: tuple[Any, ...], rows: Any) -> Any:
        a, w = s
        return a[rows].to(torch.float64) @ w.to(torch.float64).t()

    return Prepared(make, fn, ref)


def _quantize_int4(torch: Any, w: Any, group: int) -> tuple[Any, Any, Any]:
    """Asymmetric per-group 4-bit quantisation of W [N, K] (bf16).

    Returns (q int32 [N, K] in 0..15, scales_and_zeros bf16 [K/group, N, 2],
    dequantised W float64 [N, K]) with w ~= (q - 8) * scale + zero, using the
    bf16-rounded scale and zero the kernel sees.
    """
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    lo = g.amin(dim=-1, keepdim=True)
    hi = g.amax(dim=-1, keepdim=True)
    scale = ((hi - lo) / 15.0).clamp_min(1e-6).to(torch.bfloat16).float()
    zero = (lo + 8.0 * scale).to(torch.bfloat16).float()
    q = ((g - (zero - 8.0 * scale)) / scale).round().clamp(0, 15)
    deq = ((q.double() - 8.0) * scale.double() + zero.double()).reshape(n, k)
    sz = torch.stack([scale.reshape(n, k // group), zero.reshape(n, k // group)], dim=-1)
    sz = sz.transpose(0, 1).contiguous().to(torch.bfloat16)
    return q.reshape(n, k).to(torch.int32), sz, deq


def _prepare_int4(info: DeviceInfo, spec: KernelSpec, m: int) -> Prepared:
    """Weight-only int4 (group 128, bf16 activations): torch._weight_int4pack_mm. K is a
    multiple of the group: KernelRun's setup (kernels.py) reports any other shape unsupported
    (contract.shape_problem) before it prepares."""
    torch = info.torch
    dev, n, k = info.device, spec.n, spec.k
    deq_cache: dict[int, Any] = {}

    if info.is_cuda:
        inner_k_tiles = 8

        def pack(q: Any) -> Any:
            if info.torch_version >= (2, 5):  # uint8 [N, K/2], two nibbles per byte
                q8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
                return torch._convert_weight_to_int4pack(q8, inner_k_tiles)
            return torch._convert_weight_to_int4pack(q, inner_k_tiles)  # int32 [N, K]

        def mm(x: Any, packed: Any, sz: Any) -> Any:
            return torch._weight_int4pack_mm(x, packed, INT4_GROUP, sz)

    else:

        def pack(q: Any) -> Any:
            return torch._convert_weight_to_int4pack_for_cpu(q, 1)

        def mm(x: Any, packed: Any, sz: Any) -> Any:
            return torch._weight_int4pack_mm_for_cpu(x, packed, INT4_GROUP, sz)

    def make() -> tuple[Any, ...]:
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        q, sz, deq = _quantize_int4(torch, w, INT4_GROUP)
        packed = pack(q)
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        if not deq_cache:  # the reference is checked on the first set only
            deq_cache[id(packed)] = deq
        return (x, packed, sz)

    def ref(s: tuple[Any, ...], rows: Any) -> Any:
        x, packed, _ = s
        deq = deq_cache.get(id(packed))
        if deq is None:
            raise RuntimeError("int4 reference is kept for the first buffer set only")
        return x[rows].to(torch.float64) @ deq.t()

    return Prepared(make, mm, ref, deq_cache.clear)


# e2m1 code -> value (sign in bit 3)
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _prepare_nvfp4(info: DeviceInfo, spec: KernelSpec, m: int) -> Prepared:
    """NVFP4: e2m1 values packed two per byte along K, e4m3 scales per 16 elements.

    All block scales are 1.0, so the swizzled ("blocked") scale layout cannot
    change the result, and A and B are packed along K with the same nibble
    order, so the dot products do not depend on it either: the reference only
    needs the decoded e2m1 values.
    """
    torch = info.torch
    dev, n, k = info.device, spec.n, spec.k
    if k % 32:
        raise ValueError("nvfp4 needs K divisible by 32")
    table = torch.tensor(list(_E2M1) + [-v for v in _E2M1], device=dev, dtype=torch.float64)
    magnitudes = torch.tensor(_E2M1, device=dev, dtype=torch.float32)

    def encode(x: Any) -> tuple[Any, Any]:
        """Round normal samples to the nearest e2m1 code; returns (packed uint8, float64)."""
        mag = (x.abs().unsqueeze(-1) - magnitudes).abs().argmin(dim=-1)
        codes = (mag + (x < 0).long() * 8).to(torch.uint8)
        packed = codes[..., ::2] | (codes[..., 1::2] << 4)
        return packed.contiguous(), table[codes.long()]

    def scales(rows: int) -> Any:
        r = (rows + 127) // 128 * 128
        c = (k // 16 + 3) // 4 * 4
        return torch.ones(r * c, device=dev, dtype=torch.float32).to(torch.float8_e4m3fn)

    decoded: dict[int, tuple[Any, Any]] = {}

    def make() -> tuple[Any, ...]:
        a_packed, a_val = encode(torch.randn(m, k, device=dev) * 2)
        w_packed, w_val = encode(torch.randn(n, k, device=dev) * 2)
        a = a_packed.view(torch.float4_e2m1fn_x2)
        w = w_packed.view(torch.float4_e2m1fn_x2)
        if not decoded:
            decoded[id(a)] = (a_val, w_val)
        return (a, w, scales(m), scales(n))

    def fn(a: Any, w: Any, sa: Any, sb: Any) -> Any:
        return torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

    def ref(s: tuple[Any, ...], rows: Any) -> Any:
        vals = decoded.get(id(s[0]))
        if vals is None:
            raise RuntimeError("nvfp4 reference is kept for the first buffer set only")
        a_val, w_val = vals
        return a_val[rows] @ w_val.t()

    return Prepared(make, fn, ref, decoded.clear)


# --------------------------------------------------------------------------
# the dtype table


@dataclass(frozen=True)
class DtypeKernel:
    """The code of one dtype (its static facts: ``contract.DTYPES``).

    gate: why the dtype cannot run on this device, or None when it should be tried
    prepare: builds the kernel (argument sets, op, reference) for a spec at a given M
    """

    gate: Callable[[DeviceInfo], str | None]
    prepare: Callable[[DeviceInfo, KernelSpec, int], Prepared]


DTYPE_KERNELS: dict[str, DtypeKernel] = {
    "bf16": DtypeKernel(_gate_any, _prepare_float("bfloat16")),
    "fp16": DtypeKernel(_gate_any, _prepare_float("float16")),
    "tf32": DtypeKernel(_gate_tf32, _prepare_float("float32")),
    "fp8": DtypeKernel(_gate_fp8, _prepare_fp8),
    "int8": DtypeKernel(_gate_int8, _prepare_int8),
    "int4": DtypeKernel(_gate_int4, _prepare_int4),
    "nvfp4": DtypeKernel(_gate_nvfp4, _prepare_nvfp4),
}


def gate(info: DeviceInfo, dtype: str) -> str | None:
    """Reason why the dtype cannot run here, or None when it should be tried."""
    return DTYPE_KERNELS[dtype].gate(info)


def prepare(info: DeviceInfo, spec: KernelSpec, m: int) -> Prepared:
    """The kernel of ``spec`` at M=``m``: argument sets, the op and its float64 reference."""
    return DTYPE_KERNELS[spec.dtype].prepare(info, spec, m)
