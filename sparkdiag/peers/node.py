"""The GPUs of one node against each other: each GPU's figure over the median of the other GPUs
of the same model, measured in the same context with the same software, kernel by kernel.

``sparkdiag check`` judges the slowest GPU by the median of its kernels' ratios (a slow GPU is
slow at every compute-bound kernel; run-to-run noise is not, and the median of six kernels halves
it); the daemon exports each kernel's ratio as ``sparkdiag_gemm_node_peer_ratio``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sparkdiag.peers.ranking import (
    COMPUTE_KINDS,
    Verdict,
    median,
    ratio_to_rest,
    slowest,
    verdict,
)

GpuKey = tuple[str, str]  # (gpu index as text, uuid)


class Kernel(Protocol):
    """A measured kernel, as the probe's figures and the daemon's cycle records give it."""

    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> str: ...
    @property
    def beta(self) -> int: ...
    @property
    def kind(self) -> str: ...


@dataclass(frozen=True)
class PeerFigure:
    """One GPU's delivered throughput at one kernel, with what makes two GPUs peers."""

    gpu: str
    uuid: str
    model: str  # NVML name: "NVIDIA H200"
    context: str
    software: tuple[str, str, str]  # (driver, torch, cuda), "" where unknown
    dtype: str
    shape: str
    beta: int
    kind: str
    delivered: float

    @classmethod
    def of(
        cls,
        gpu: str,
        uuid: str,
        model: str,
        context: str,
        software: tuple[str, str, str],
        kernel: Kernel,
        delivered: float,
    ) -> PeerFigure:
        """``kernel``'s figure on this GPU."""
        k = kernel
        return cls(gpu, uuid, model, context, software, k.dtype, k.shape, k.beta, k.kind, delivered)

    @property
    def group(self) -> tuple[str, str, tuple[str, str, str], str, str, int]:
        return (self.model, self.context, self.software, self.dtype, self.shape, self.beta)


@dataclass(frozen=True)
class KernelComparison:
    """One kernel across the GPUs of one group: each GPU's figure and its ratio to the rest."""

    model: str
    context: str
    dtype: str
    shape: str
    beta: int
    values: Mapping[GpuKey, float]
    ratios: Mapping[GpuKey, float]  # over the median of the other GPUs

    def rest_median(self, gpu: GpuKey) -> float:
        return median(v for k, v in self.values.items() if k != gpu)


def compare_kernels(figures: Iterable[PeerFigure]) -> list[KernelComparison]:
    """Every compute-bound kernel measured on at least two GPUs of one group (model, context,
    software), in a stable order."""
    groups: dict[tuple[str, str, tuple[str, str, str], str, str, int], dict[GpuKey, float]]
    groups = defaultdict(dict)
    for fig in figures:
        if fig.kind in COMPUTE_KINDS and fig.delivered > 0:
            groups[fig.group][(fig.gpu, fig.uuid)] = fig.delivered
    out = []
    for (model, context, _software, dtype, shape, beta), values in sorted(groups.items()):
        if len(values) >= 2:
            out.append(
                KernelComparison(model, context, dtype, shape, beta, values, ratio_to_rest(values))
            )
    return out


@dataclass(frozen=True)
class NodeVerdict:
    """The GPUs of one model (and context) in a node: the slowest against the rest."""

    model: str
    context: str
    gpus: tuple[GpuKey, ...]
    ratios: Mapping[GpuKey, float]  # each GPU: the median of its kernels' ratios
    kernels: tuple[KernelComparison, ...] = field(default=())

    @property
    def slowest(self) -> tuple[GpuKey, float]:
        found = slowest(self.ratios)
        assert found is not None
        return found

    @property
    def status(self) -> Verdict:
        return verdict(self.slowest[1])

    def kernel_ratios(self, gpu: GpuKey) -> list[tuple[KernelComparison, float]]:
        """That GPU's ratio at every kernel, slowest first."""
        found = [(k, k.ratios[gpu]) for k in self.kernels if gpu in k.ratios]
        return sorted(found, key=lambda item: item[1])


def judge_node(figures: Iterable[PeerFigure]) -> list[NodeVerdict]:
    """One verdict per model and context with at least two GPUs compared (beta=0 kernels)."""
    kernels = [k for k in compare_kernels(figures) if k.beta == 0]
    by_model: dict[tuple[str, str], list[KernelComparison]] = defaultdict(list)
    for kernel in kernels:
        by_model[(kernel.model, kernel.context)].append(kernel)
    verdicts = []
    for (model, context), group in sorted(by_model.items()):
        per_gpu: dict[GpuKey, list[float]] = defaultdict(list)
        for kernel in group:
            for gpu, ratio in kernel.ratios.items():
                per_gpu[gpu].append(ratio)
        ratios = {gpu: median(values) for gpu, values in per_gpu.items()}
        verdicts.append(
            NodeVerdict(model, context, tuple(sorted(ratios, key=_index)), ratios, tuple(group))
        )
    return verdicts


def _index(gpu: GpuKey) -> tuple[int, str]:
    index, uuid = gpu
    return (int(index), uuid) if index.isdigit() else (1 << 30, uuid)
