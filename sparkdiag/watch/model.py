"""What ``sparkdiag watch`` records: one :class:`Tick` per sampling interval, in a
:class:`Recording` that is saved as JSON (``--record``), diagnosed (:mod:`.diagnose`) and drawn
(:mod:`.plot`). Units are base units; ``None`` means "not measured here", never 0.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from sparkdiag import safeload
from sparkdiag.errors import UsageError

SCHEMA = "sparkdiag-watch-recording/1"


@dataclass(frozen=True)
class GpuTick:
    """One GPU during one tick.

    utilization: mean of the driver's utilization samples taken during the tick (0..1), or the
      instantaneous NVML figure where the driver gave none
    samples: the driver's samples themselves, (seconds since the recording started, 0..1)
    sm_activity, tensor_activity, dram_activity, sm_occupancy: GPM ratios over the tick (0..1)
    reasons: the NVML clock event reasons bitmask at the end of the tick
    pcie_tx, pcie_rx: bytes per second over NVML's 20 ms window (read every few seconds)
    job_on_gpu: a process of the job is among the GPU's compute processes
    memory_utilization: NVML's memory utilization at the end of the tick (0..1): the share of
      its last sample period in which device memory was read or written (nvidia-smi
      utilization.memory); the stall rule's DRAM figure where the GPU has no GPM
    job_memory_bytes: GPU memory held by the job's processes (NVML's compute processes), where
      the driver reports it
    """

    index: int
    utilization: float | None = None
    samples: tuple[tuple[float, float], ...] = ()
    sm_activity: float | None = None
    tensor_activity: float | None = None
    dram_activity: float | None = None
    sm_occupancy: float | None = None
    sm_clock_hz: float | None = None
    sm_clock_max_hz: float | None = None
    reasons: int | None = None
    temperature: float | None = None
    memory_temperature: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    pcie_tx: float | None = None
    pcie_rx: float | None = None
    job_on_gpu: bool = False
    memory_utilization: float | None = None
    job_memory_bytes: float | None = None


@dataclass(frozen=True)
class ProcessLoad:
    """One process of the job during one tick: its CPU (seconds per second, all threads), its
    reads (bytes per second, rchar) and whether it holds a GPU. ``name`` is its main thread's
    (PyTorch names its DataLoader workers ``pt_data_worker``)."""

    pid: int
    name: str
    cpu_cores: float
    read_bps: float | None = None
    on_gpu: bool = False


@dataclass(frozen=True)
class JobTick:
    """The job's process tree during one tick (rates over the tick; None at the first tick).

    cpu_cores: CPU seconds per second of the whole tree (2.0 = two cores busy)
    gpu_thread: how busy the busiest thread of the processes that hold the GPU (or of the whole
      tree where that is not known) was: the fraction of the tick it ran on a CPU or waited in a
      run queue for one (on a CPU only, where the kernel has no schedstat); gpu_thread_name its
      name
    other_cpu_cores: CPU of the tree's processes that are not on the GPU (data loader workers)
    read_bps, write_bps: bytes per second read and written by the tree (/proc/PID/io rchar and
      wchar: every read and write call, page cache included)
    loads: the busiest processes of the tree (at most ``sampler.TOP_PROCESSES``, those using
      some CPU or reading), busiest first
    """

    processes: int = 0
    threads: int = 0
    cpu_cores: float | None = None
    gpu_thread: float | None = None
    gpu_thread_name: str = ""
    other_cpu_cores: float | None = None
    read_bps: float | None = None
    write_bps: float | None = None
    loads: tuple[ProcessLoad, ...] = ()


@dataclass(frozen=True)
class HostTick:
    """Host (or the job's cgroup) pressure during one tick.

    memory_stall, memory_full, io_stall, cpu_stall: PSI, the fraction of the tick during which
      some (full: every non-idle) task waited on that resource
    swap_bps: bytes per second swapped in and out
    available_bytes: MemAvailable at the end of the tick
    """

    memory_stall: float | None = None
    memory_full: float | None = None
    io_stall: float | None = None
    cpu_stall: float | None = None
    swap_bps: float | None = None
    available_bytes: float | None = None


@dataclass(frozen=True)
class Tick:
    t: float  # seconds since the recording started, at the end of the tick
    dt: float  # the tick's length in seconds
    gpus: tuple[GpuTick, ...] = ()
    job: JobTick = field(default_factory=JobTick)
    host: HostTick = field(default_factory=HostTick)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_model: str  # "dedicated" or "unified"


@dataclass(frozen=True)
class Recording:
    """A whole watch. ``ended_by``: "exit" (the job ended), "duration", "interrupt" (Ctrl-C),
    "gone" (the watched pid disappeared). ``skipped``: what could not be sampled here, and why.
    ``job_cpus``: how many CPUs the job may run on (its affinity at the start), None unknown."""

    started_at: float  # unix seconds
    interval: float
    job: str  # the command line, or "pid N (name)"
    gpus: tuple[GpuInfo, ...]
    ticks: tuple[Tick, ...]
    ended_by: str = "exit"
    exit_status: int | None = None
    pressure_scope: str = "host"  # "cgroup" when PSI is the job's cgroup's
    skipped: tuple[str, ...] = ()
    job_cpus: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), separators=(",", ":")) + "\n", "utf-8")


class RecordingError(UsageError, ValueError):
    """A recording file cannot be read; the message says which and why."""

    flag = "--replay"


def _build(cls: Any, data: Any) -> Any:
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} must be an object")
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in known})


def _gpu_tick(data: Any) -> GpuTick:
    tick: GpuTick = _build(GpuTick, data)
    return GpuTick(
        **{**asdict(tick), "samples": tuple((float(t), float(v)) for t, v in tick.samples)}
    )


def _job_tick(data: Any) -> JobTick:
    tick: JobTick = _build(JobTick, data)
    return JobTick(**{**asdict(tick), "loads": tuple(_build(ProcessLoad, p) for p in tick.loads)})


def from_json(doc: Any) -> Recording:
    """A :class:`Recording` from :meth:`Recording.to_json`'s document; RecordingError if bad."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise RecordingError(f"not a sparkdiag watch recording (schema {SCHEMA!r} expected)")
    try:
        ticks = tuple(
            Tick(
                t=float(t["t"]),
                dt=float(t["dt"]),
                gpus=tuple(_gpu_tick(g) for g in t.get("gpus", ())),
                job=_job_tick(t.get("job", {})),
                host=_build(HostTick, t.get("host", {})),
            )
            for t in doc["ticks"]
        )
        return Recording(
            started_at=float(doc["started_at"]),
            interval=float(doc["interval"]),
            job=str(doc["job"]),
            gpus=tuple(_build(GpuInfo, g) for g in doc["gpus"]),
            ticks=ticks,
            ended_by=str(doc.get("ended_by", "exit")),
            exit_status=doc.get("exit_status"),
            pressure_scope=str(doc.get("pressure_scope", "host")),
            skipped=tuple(str(s) for s in doc.get("skipped", ())),
            job_cpus=None if doc.get("job_cpus") is None else int(doc["job_cpus"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordingError(f"malformed watch recording: {exc}") from None


MAX_RECORDING_BYTES = 64 << 20  # an hour of ticks at 1 s is a few MiB


def load(path: Path) -> Recording:
    try:
        doc = safeload.load_json(path, MAX_RECORDING_BYTES)
    except OSError as exc:
        raise RecordingError(f"cannot read {path}: {exc.strerror or exc}") from None
    except safeload.LoadError as exc:
        raise RecordingError(f"{path}: {exc}") from None
    try:
        return from_json(doc)
    except RecordingError as exc:
        raise RecordingError(f"{path}: {exc}") from None
