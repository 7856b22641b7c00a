"""The latest soak's verdict per GPU, kept in the state directory beside baselines.sqlite.

``sparkdiag soak`` writes ``soak.json`` (atomically: a temporary file in the same directory,
fsync, rename); the daemon exports it (``sparkdiag_soak_*``, :mod:`sparkdiag.exporter.soak`) and
``sparkdiag check`` reports its age and result (:mod:`sparkdiag.check.soak_checks`). A soak
replaces the entries of the GPUs it ran on (by uuid) and keeps the others, so that soaking GPU 1
does not forget GPU 0's verdict. Reading never trusts the file: a damaged one is an error with
its path, a wrong-typed value is dropped.

This module imports no third-party package (only the standard library, :mod:`sparkdiag.statedir`,
:mod:`sparkdiag.jsonvalues` and the verdict's dataclasses), so that the exporter and the check can
read the file without the soak command's dependencies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from sparkdiag.errors import SparkdiagError
from sparkdiag.jsonvalues import as_float, as_str
from sparkdiag.soak.verdict import KernelFigures, Verdict
from sparkdiag.statedir import (
    StateDirError,
    read_json_state,
    state_file,
    update_json_state,
)

FILENAME = "soak.json"
SCHEMA = "sparkdiag-soak-state/1"
MAX_BYTES = 1 << 20  # a few KiB per GPU; read no more than this


class SoakStateError(SparkdiagError):
    """The state file cannot be read or written; the message names the path and why."""


@dataclass(frozen=True)
class KernelState(KernelFigures):
    """One kernel's verdict (see :class:`sparkdiag.soak.verdict.Verdict`); TFLOPS (TOPS for
    integer dtypes), temperatures in °C on the entry's ``sensor``."""

    max_celsius: float | None = None

    @classmethod
    def kept(cls, verdict: Verdict) -> KernelState:
        """What the state file keeps of a kernel's verdict: the fields the two share."""
        return cls(**{f.name: getattr(verdict, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class GpuState:
    """The latest soak of one GPU (``gpu`` is the NVML index as text, ``cpu`` for a CPU run;
    ``uuid`` is empty for a CPU run)."""

    gpu: str
    uuid: str
    name: str
    finished_at: float  # Unix seconds
    duration_seconds: float  # asked for (--duration)
    elapsed_seconds: float | None  # of load, until it stopped
    stopped: str  # completed, threshold, hw_thermal_slowdown, hw_slowdown, interrupted, error
    reason: str | None
    sensor: str | None  # memory, gpu; None: no temperature was read
    max_celsius: float | None
    kernels: tuple[KernelState, ...] = ()

    @property
    def degraded(self) -> tuple[KernelState, ...]:
        return tuple(k for k in self.kernels if k.status == "fell")

    @property
    def failed(self) -> tuple[KernelState, ...]:
        """Kernels a window of the soak found wrong, or that failed."""
        return tuple(k for k in self.kernels if k.status == "error")

    @property
    def judged(self) -> tuple[KernelState, ...]:
        return tuple(k for k in self.kernels if k.status in ("held", "fell"))

    @property
    def key(self) -> str:
        return self.uuid or self.gpu

    @property
    def is_cpu(self) -> bool:
        """A ``--device cpu`` test soak: it has no thermal verdict and is no GPU's record."""
        return self.gpu == "cpu"


@dataclass(frozen=True)
class SoakState:
    gpus: tuple[GpuState, ...] = ()


@dataclass(frozen=True)
class StateReport:
    """What ``check`` found: ``ok`` (with the state), ``absent`` (no soak yet) or ``unusable``
    (``detail`` says why)."""

    state: Literal["ok", "absent", "unusable"]
    path: Path | None
    detail: str
    soak: SoakState | None = None


def state_path(state_dir: Path | None) -> Path:
    """``soak.json`` in ``state_dir`` (default: the state directory); StateDirError when there is
    no state directory to be found."""
    return state_file(state_dir, FILENAME)


def read_state(path: Path) -> SoakState | None:
    """The state file, or None when there is none; SoakStateError when it cannot be used."""
    doc = read_json_state(path, MAX_BYTES, "a soak state file", SCHEMA, SoakStateError)
    if doc is None:
        return None
    gpus = doc.get("gpus")
    parsed = (_gpu(g) for g in (gpus if isinstance(gpus, list) else []))
    return SoakState(tuple(g for g in parsed if g is not None))


def write_state(path: Path, entries: Iterable[GpuState]) -> SoakState:
    """Replace the entries of these GPUs (by uuid; ``cpu`` for a CPU run), keep the others, and
    write the file atomically. Returns what was written; SoakStateError when it cannot be."""
    new = list(entries)
    keys = {e.key for e in new}

    def change() -> tuple[dict[str, Any], SoakState]:
        try:
            old = read_state(path)
        except SoakStateError:
            old = None  # a damaged file is replaced by this soak's verdict
        kept = [g for g in (old.gpus if old else ()) if g.key not in keys]
        state = SoakState(tuple(sorted([*kept, *new], key=lambda g: (not g.gpu.isdigit(), g.gpu))))
        return {"schema": SCHEMA, "gpus": [_gpu_json(g) for g in state.gpus]}, state

    return update_json_state(path, change, SoakStateError)  # another soak's GPUs are kept


def inspect_state(state_dir: Path | None) -> StateReport:
    """What ``check`` reports: the state, none yet, or why it cannot be read."""
    try:
        path = state_path(state_dir)
    except StateDirError as exc:
        return StateReport("unusable", None, str(exc))
    try:
        state = read_state(path)
    except SoakStateError as exc:
        return StateReport("unusable", path, str(exc))
    if state is None or not state.gpus:
        return StateReport("absent", path, f"no soak has been run yet ({path} does not exist)")
    return StateReport("ok", path, f"{len(state.gpus)} GPU(s)", state)


# -- parsing ------------------------------------------------------------------------------------


def _kernel(raw: Any) -> KernelState | None:
    if not isinstance(raw, Mapping):
        return None
    dtype, shape, status = (as_str(raw.get(key)) for key in ("dtype", "shape", "status"))
    if not dtype or shape is None or not status:
        return None
    return KernelState(
        dtype=dtype,
        shape=shape,
        kind=as_str(raw.get("kind")) or "",
        status=status,
        cold=as_float(raw.get("cold")),
        hottest=as_float(raw.get("hottest")),
        hottest_celsius=as_float(raw.get("hottest_celsius")),
        lowest_fraction=as_float(raw.get("lowest_fraction")),
        fell_fraction=as_float(raw.get("fell_fraction")),
        fell_celsius=as_float(raw.get("fell_celsius")),
        max_celsius=as_float(raw.get("max_celsius")),
    )


def _gpu(raw: Any) -> GpuState | None:
    if not isinstance(raw, Mapping):
        return None
    gpu, finished = as_str(raw.get("gpu")), as_float(raw.get("finished_at"))
    stopped = as_str(raw.get("stopped"))
    if not gpu or finished is None or not stopped:
        return None
    kernels = raw.get("kernels")
    parsed = (_kernel(k) for k in (kernels if isinstance(kernels, list) else []))
    return GpuState(
        gpu=gpu,
        uuid=as_str(raw.get("uuid")) or "",
        name=as_str(raw.get("name")) or "",
        finished_at=finished,
        duration_seconds=as_float(raw.get("duration_seconds")) or 0.0,
        elapsed_seconds=as_float(raw.get("elapsed_seconds")),
        stopped=stopped,
        reason=as_str(raw.get("reason")),
        sensor=as_str(raw.get("sensor")),
        max_celsius=as_float(raw.get("max_celsius")),
        kernels=tuple(k for k in parsed if k is not None),
    )


def _gpu_json(gpu: GpuState) -> dict[str, Any]:
    body = asdict(gpu)
    body["kernels"] = [asdict(k) for k in gpu.kernels]
    return body
