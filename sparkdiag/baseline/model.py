"""What the baseline store holds, as values: a baseline's key, the baseline, one recorded run,
and the store's errors (:mod:`sparkdiag.baseline.store` keeps them in SQLite)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from sparkdiag.baseline.schema import KEY_COLUMNS
from sparkdiag.errors import SparkdiagError

BaselineSource = Literal["learned", "pinned"]

CONTEXTS = ("native", "container")
# How a figure was measured. "delivered": the total time of back-to-back iterations, gaps
# included (worker schema 2); "median": the median iteration (GEMM figures of schema 1, before
# 2026-12; the int4 ratios since 2026-12-01). A baseline is only ever compared with figures of
# its own method: the two differ on a shared GPU.
METHODS = ("delivered", "median")
METHOD = "delivered"


_SHAPE = re.compile(r"^[0-9]+(?:x[0-9]+)+$")


class BaselineStoreError(SparkdiagError):
    """The baseline database cannot be opened, read or written (exit 3: the work cannot be
    done; the message names the file)."""


class BaselineStoreDamaged(BaselineStoreError):
    """SQLite's check found a damaged page: nothing of the file is trusted, nor written into."""


@dataclass(frozen=True)
class BaselineKey:
    """What a baseline is for: one probe on one GPU under one software identity.

    gpu_uuid: NVML UUID (``nvidia-smi --query-gpu=uuid``)
    dtype: probe dtype label (``bf16``, ``fp8``, ...)
    shape: ``MxNxK`` such as ``8192x8192x8192``
    context: ``native`` or ``container``
    driver, torch, cuda: versions; empty string when unknown
    method: how the figures were measured (``delivered``; ``median`` for old GEMM baselines
        and for the int4 ratios)
    """

    gpu_uuid: str
    dtype: str
    shape: str
    context: str
    driver: str
    torch: str
    cuda: str
    method: str = METHOD

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"BaselineKey.method must be one of {', '.join(METHODS)}")
        for name in KEY_COLUMNS:
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ValueError(f"BaselineKey.{name} must be a string, got {value!r}")
        for name in ("gpu_uuid", "dtype", "shape"):
            if not getattr(self, name).strip():
                raise ValueError(f"BaselineKey.{name} must not be empty")
        if not _SHAPE.fullmatch(self.shape):  # whole: "$" lets a trailing newline through
            raise ValueError(f"BaselineKey.shape must look like 8192x8192x8192, got {self.shape!r}")
        if self.context not in CONTEXTS:
            raise ValueError(
                f"BaselineKey.context must be one of {', '.join(CONTEXTS)}, got {self.context!r}"
            )

    def as_row(self) -> tuple[str, ...]:
        return tuple(getattr(self, name) for name in KEY_COLUMNS)


@dataclass(frozen=True)
class Baseline:
    """The healthy throughput a probe is compared with.

    tflops: TFLOPS (tera-operations per second for integer dtypes)
    source: ``learned`` (median of healthy runs) or ``pinned`` (set by the user)
    runs: healthy runs that went into a learned baseline (0 when pinned)
    created_at, updated_at: unix time in seconds
    """

    key: BaselineKey
    tflops: float
    source: BaselineSource
    runs: int
    created_at: float
    updated_at: float
    note: str = ""


@dataclass(frozen=True)
class RunRecord:
    """One recorded probe result (newest first from :meth:`BaselineStore.runs`)."""

    id: int
    key: BaselineKey
    tflops: float
    healthy: bool
    at: float
    conditions: dict[str, Any] | None


@dataclass(frozen=True)
class Learning:
    """A kernel with runs recorded and no baseline yet (:meth:`BaselineStore.learning_kernels`).

    healthy_runs: the runs that count towards its baseline so far (fewer than ``min_runs``)
    first_at, last_at: its first and latest run, unix time in seconds
    """

    key: BaselineKey
    healthy_runs: int
    first_at: float
    last_at: float
