"""A dtype that runs slower than a wider one: the software picked kernels that are not the
GPU's native ones.

On tensor cores that run a dtype natively, halving the width doubles the dense peak: an H200
delivered fp8 1300 against bf16 760 TFLOPS (1.71x, CONTEXT.md, measured 2026-11-30); GB10's
mamf-finder figures are fp8 207.7 and bf16 99.8 (2.08x). So where the dtype table says the GPU
runs the narrower dtype (its gate lets the probe run it there), the narrower one delivering
less than the wider one at a compute shape says its kernel is not the native path: an NVFP4
GEMM on a library with no sm_121a code, an fp8 one that dequantises to bf16. The pairs and the
threshold are the ``SparkdiagDtypeSlowerThanWider`` rule's (tests/test_native_rules.py holds
them equal).

Which dtypes the GPU runs is read from the probe worker's dtype table (``DTYPE_KERNELS``:
each entry's gate), asked as if torch had every API, so that only the compute capability decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from sparkdiag.probe.worker.dtypes import DTYPE_KERNELS, DeviceInfo

# (narrower, wider): the narrower one should be faster wherever the GPU runs it natively
PAIRS: tuple[tuple[str, str], ...] = (("nvfp4", "fp8"), ("fp8", "bf16"))
SLOWER = 1.0  # narrower / wider below this: the alert and the check row
DECODE_M = 32  # shapes with M at most this are decode shapes (memory-bound), left out


class _AnyTorch:
    """Stands in for torch in the dtype table's gates: every API is there, version 99.0."""

    __version__ = "99.0"

    def __getattr__(self, name: str) -> object:
        return object()


def runs_natively(dtype: str, capability: tuple[int, int]) -> bool:
    """Whether the dtype table's gate lets ``dtype`` run on a GPU of ``capability`` (fp8 from
    8.9, nvfp4 from 10.0); False for a dtype the table does not know."""
    spec = DTYPE_KERNELS.get(dtype)
    if spec is None:
        return False
    info = DeviceInfo(
        torch=_AnyTorch(),
        device="cuda",
        is_cuda=True,
        capability=capability,
        sm_count=1,
        l2_bytes=0,
        torch_version=(99, 0),
    )
    return spec.gate(info) is None


def is_compute_shape(shape: str) -> bool:
    """``8192x8192x8192`` yes; ``1x8192x8192`` (M <= 32, a decode shape) no."""
    first = shape.split("x", 1)[0]
    return first.isdigit() and int(first) > DECODE_M


@dataclass(frozen=True)
class Order:
    """``dtype`` against ``wider`` at ``shape``: both delivered figures and their ratio."""

    dtype: str
    wider: str
    shape: str
    tflops: float
    wider_tflops: float

    @property
    def ratio(self) -> float:
        return self.tflops / self.wider_tflops

    @property
    def slower(self) -> bool:
        return self.ratio < SLOWER

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def orders(delivered: Iterable[tuple[str, str, float]], capability: tuple[int, int]) -> list[Order]:
    """Each pair of :data:`PAIRS` at each compute shape where both were measured
    (``delivered``: (dtype, shape, TFLOPS)) and the GPU runs the narrower dtype natively."""
    figures = {(d, s): v for d, s, v in delivered if v > 0 and is_compute_shape(s)}
    out = []
    for narrow, wide in PAIRS:
        if not runs_natively(narrow, capability):
            continue
        for (dtype, shape), value in sorted(figures.items()):
            wider = figures.get((wide, shape))
            if dtype == narrow and wider is not None:
                out.append(Order(narrow, wide, shape, value, wider))
    return out
