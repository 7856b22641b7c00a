"""What a cycle runs and in what order: the kernels of a suite sized to the device, the groups
timed together, and the GPU-time budget shared out among them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkdiag.probe.worker.contract import BUDGET_PLANNING_FRACTION, DTYPES
from sparkdiag.probe.worker.dtypes import DeviceInfo, KernelSpec

LLM_SHAPE = (4096, 11008, 4096)
SMALL_COMPUTE = (256, 256, 256)
SMALL_LLM = (256, 688, 256)
DECODE_NK = 8192
SMALL_DECODE_NK = 256


def compute_cube(capability: tuple[int, int], sm_count: int) -> int:
    """Edge of the compute-bound cube so one bf16 iteration takes >= ~1 ms."""
    if capability >= (8, 0) and sm_count >= 100:  # A100, H100, H200, B200
        return 8192
    if capability >= (8, 0) or sm_count >= 40:  # GB10 (48 SMs), consumer parts
        return 4096
    return 2048


def order_by_kind(specs: Sequence[KernelSpec]) -> list[KernelSpec]:
    """Every compute kernel first, then the LLM and the decode ones (stable within a kind)."""
    rank = {"compute": 0, "llm": 1, "decode": 2}
    return sorted(specs, key=lambda s: rank.get(s.kind, 3))


def plan_groups(specs: Sequence[KernelSpec], together: Sequence[str]) -> list[list[KernelSpec]]:
    """Kernels in the order they run, as groups timed together.

    Kernels of a kind not in ``together`` run alone, first, in plan order; then one group
    per kind in ``together`` (in that order) holds all kernels of that kind.
    """
    groups: list[list[KernelSpec]] = [[s] for s in specs if s.kind not in together]
    for kind in together:
        group = [s for s in specs if s.kind == kind]
        if group:
            groups.append(group)
    return groups


def plan_suite(
    info: DeviceInfo,
    dtypes: Sequence[str],
    small: bool,
    shapes: Sequence[Any],
    kinds: Sequence[str] = ("compute", "llm", "decode"),
) -> list[KernelSpec]:
    """The kernels to probe, per dtype: the compute cube (and its beta=1 variant where the
    dtype has one), the LLM shape and the decode shape, those of ``kinds`` only. Custom
    ``shapes`` replace them all, each classified as decode (M <= 32), llm or compute."""
    specs: list[KernelSpec] = []
    if shapes:
        for dtype in dtypes:
            for m, n, k in shapes:
                kind = "decode" if m <= 32 else ("llm" if (m, n, k) == LLM_SHAPE else "compute")
                specs.append(KernelSpec(dtype, kind, (m,), n, k))
        return specs
    if small:
        cube_shape, llm, nk = SMALL_COMPUTE, SMALL_LLM, SMALL_DECODE_NK
    else:
        cube = compute_cube(info.capability or (0, 0), info.sm_count)
        cube_shape, llm, nk = (cube, cube, cube), LLM_SHAPE, DECODE_NK
    for dtype in dtypes:
        table = DTYPES[dtype]
        cm, cn, ck = cube_shape
        if not small:
            cm = cn = ck = table.compute_edge(cm)
        if "compute" in kinds:
            specs.append(KernelSpec(dtype, "compute", (cm,), cn, ck))
            if table.beta_variant:
                specs.append(KernelSpec(dtype, "compute", (cm,), cn, ck, beta=1))
        if "llm" in kinds:
            specs.append(KernelSpec(dtype, "llm", (llm[0],), llm[1], llm[2]))
        if "decode" in kinds:
            specs.append(KernelSpec(dtype, "decode", table.decode_m, nk, nk))
    return specs


@dataclass
class Budget:
    """GPU-busy time left for the kernels still to run, shared out by weight: compute-bound
    kernels get more (their batch must span the power-cap controller's swings), memory-bound
    ones less (many short iterations fit in little time). Plans for ``fraction`` of the
    seconds, keeping headroom for warm-ups and minimum iteration counts."""

    seconds: float
    kernels_left: int
    busy: float = 0.0
    weight_left: float = 0.0
    fraction: float = BUDGET_PLANNING_FRACTION

    def share(self, weight: float = 1.0) -> float:
        target = self.seconds * self.fraction
        total = self.weight_left if self.weight_left > 0 else max(1, self.kernels_left)
        return max(0.0, target - self.busy) * weight / total

    def done(self, weight: float = 1.0) -> None:
        self.kernels_left = max(0, self.kernels_left - 1)
        self.weight_left = max(0.0, self.weight_left - weight)
