"""What ``sparkdiag watch`` records: one :class:`Tick` per sampling interval, in a
:class:`Recording` that is saved as JSON (``--record``), diagnosed (:mod:`.diagnose`) and drawn
(:mod:`.plot`). Units are base units; ``None`` means "not measured here", never 0.

Schema 2 adds the job's Python stacks (:class:`StackFrame`, :class:`ThreadInfo`, per tick
:class:`StackTime`), the other processes on the job's GPUs (:class:`OtherProcess`,
:class:`ProcessInfo`) and the job's own share of the GPU; a schema 1 recording loads with none
of them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NamedTuple

from sparkdiag import safeload
from sparkdiag.errors import UsageError

SCHEMA = "sparkdiag-watch-recording/2"
SCHEMA_FAMILY = "sparkdiag-watch-recording/"
SCHEMAS = ("sparkdiag-watch-recording/1", SCHEMA)  # what --replay reads
LOADER_NAMES = ("pt_data_worker",)  # what PyTorch names its DataLoader worker processes


@dataclass(frozen=True, slots=True)
class OtherProcess:
    """A compute process on the GPU that is not the job's, during one tick: its SM utilization
    (NVML's per-process samples over the tick, 0..1; None: no sample) and the GPU memory it
    holds (None: not reported)."""

    pid: int
    sm: float | None = None
    memory_bytes: float | None = None


@dataclass(frozen=True, slots=True)
class GpuTick:
    """One GPU during one tick.

    utilization: mean of the driver's utilization samples taken during the tick (0..1), or the
      instantaneous NVML figure where the driver gave none
    samples: the driver's samples themselves, (seconds since the recording started, 0..1)
    sm_activity, tensor_activity, dram_activity, sm_occupancy: GPM ratios over the tick (0..1)
    reasons: the NVML clock event reasons bitmask at the end of the tick
    reasons_held: for a tick merged from shorter ones (a long watch: ``watch/compact.py``), the
      share of its time each bit of ``reasons`` was read set, as (bit, share) for the bits set
      for less than all of it; empty for a tick as sampled, whose one reading stands for it all
    pcie_tx, pcie_rx: bytes per second the GPU sent (device to host) and received (host to
      device): over the tick from GPM's PCIe rates where the GPU has GPM, else over NVML's
      20 ms window (read every few seconds)
    job_on_gpu: a process of the job is among the GPU's compute processes
    memory_utilization: NVML's memory utilization at the end of the tick (0..1): the share of
      its last sample period in which device memory was read or written (nvidia-smi
      utilization.memory); the stall rule's DRAM figure where the GPU has no GPM
    job_memory_bytes: GPU memory held by the job's processes (NVML's compute processes), where
      the driver reports it
    job_sm: the SM utilization of the job's processes over the tick (NVML's per-process
      samples, summed, 0..1); None where the driver gave none
    others: the compute processes on the GPU outside the job, where NVML lists the job's own
    others_seen: how many of the GPU's compute processes outside the job this PID namespace
      shows (``/proc/PID`` under the rootfs, in the job's PID namespace where that can be read):
      certainly not the job's, whether NVML lists the job's own or not; None where not recorded
      (recordings before this field, or NVML lists no processes)
    others_seen_pids: those processes' pids, at most ``sampler.OTHERS_KEPT`` (who they are: the
      recording's ``tenants``)
    others_unseen: how many compute processes outside the job NVML lists that this PID namespace
      does not show, or shows in another PID namespace than the job's (a container: they may be
      the job's own); None where not recorded
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
    reasons_held: tuple[tuple[int, float], ...] = ()
    temperature: float | None = None
    memory_temperature: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    pcie_tx: float | None = None
    pcie_rx: float | None = None
    job_on_gpu: bool = False
    memory_utilization: float | None = None
    job_memory_bytes: float | None = None
    job_sm: float | None = None
    others: tuple[OtherProcess, ...] = ()
    others_seen: int | None = None
    others_seen_pids: tuple[int, ...] = ()
    others_unseen: int | None = None

    def reasons_share(self, mask: int) -> float:
        """The share of the tick in which a clock event reason of ``mask`` was read set: 1 or 0
        for a tick as sampled; for a merged one the largest share among those reasons (the time
        in which any of them was set is at least that)."""
        bits = (self.reasons or 0) & mask
        if not bits:
            return 0.0
        shares = dict(self.reasons_held)
        return max(shares.get(bit, 1.0) for bit in set_bits(bits))


def set_bits(mask: int) -> list[int]:
    """Each bit set in ``mask``, lowest first (``0x41`` -> ``[0x1, 0x40]``)."""
    return [1 << i for i in range(mask.bit_length()) if mask >> i & 1]


@dataclass(frozen=True, slots=True)
class ProcessLoad:
    """One process of the job during one tick: its CPU (seconds per second, all threads), its
    reads (bytes per second, rchar) and whether it holds a GPU. ``name`` is its main thread's
    (PyTorch names its DataLoader workers ``pt_data_worker``)."""

    pid: int
    name: str
    cpu_cores: float
    read_bps: float | None = None
    on_gpu: bool = False


@dataclass(frozen=True, slots=True)
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
    gpu_thread_id: the busiest thread's id (the kernel's tid)
    writing, reading: the files the job's processes held open for writing (reading) in a tick
      in which they wrote (read) heavily (``places.py``), as the job sees their paths
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
    gpu_thread_id: int | None = None
    writing: tuple[str, ...] = ()
    reading: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
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


class StackTime(NamedTuple):
    """A thread spent ``seconds`` of the tick in one stack (indexes into the recording's
    ``threads`` and ``stacks``), entering it ``visits`` times in the tick (each time the sampler
    saw it come into that stack from another: a count of the visits that lasted a sample or
    more, so at most the true count)."""

    thread: int
    stack: int
    seconds: float
    visits: int = 0


@dataclass(frozen=True, slots=True)
class Tick:
    t: float  # seconds since the recording started, at the end of the tick
    dt: float  # the tick's length in seconds
    gpus: tuple[GpuTick, ...] = ()
    job: JobTick = field(default_factory=JobTick)
    host: HostTick = field(default_factory=HostTick)
    stacks: tuple[StackTime, ...] = ()


@dataclass(frozen=True)
class StackFrame:
    """One Python frame as py-spy read it (function, file as the job sees it, line) and the
    text of that line (stripped; "" where the file could not be read)."""

    function: str
    file: str
    line: int
    text: str = ""


@dataclass(frozen=True)
class ThreadInfo:
    """A thread whose stacks were sampled: its process, its id (the kernel's tid) and name."""

    pid: int
    tid: int
    name: str
    process: str = ""

    @property
    def loader(self) -> bool:
        """The thread of a DataLoader worker process."""
        return self.process.startswith(LOADER_NAMES)


@dataclass(frozen=True)
class ProcessInfo:
    """Who a process outside the job is (``ps -o comm=,user=``, its container and pod)."""

    pid: int
    name: str = ""
    user: str = ""
    container_id: str = ""
    pod_uid: str = ""


@dataclass(frozen=True)
class RankInfo:
    """A process of the job whose stacks were sampled, as ``torch.distributed`` numbers it:
    ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` of its environment (torchrun sets them); None
    where it has none (``mp.spawn`` passes the rank as an argument)."""

    pid: int
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None


@dataclass(frozen=True)
class Place:
    """Where the job's files live: a directory it wrote or read in, the mount that holds it
    (mount point, filesystem type, source) and its kind (``network``, ``memory``, ``nvme``,
    ``dm``, ``loop``...: sparkdiag storage's, ``storage/target.py``)."""

    directory: str
    mountpoint: str = ""
    fstype: str = ""
    source: str = ""
    kind: str = ""


@dataclass(frozen=True)
class StoreSpeed:
    """What ``sparkdiag storage`` last measured on a mount point (``storage.json`` in the state
    directory, read when the watch began): bytes per second written and read (O_DIRECT, 1 MiB,
    8 threads; None where it has no figure) and when it finished (unix seconds)."""

    mountpoint: str
    device: str = ""
    kind: str = ""
    finished_at: float = 0.0
    write_bps: float | None = None
    read_bps: float | None = None


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
    ``job_cpus``: how many CPUs the job may run on (its affinity at the start), None unknown.
    ``frames``, ``stacks`` (frame indexes, outermost first) and ``threads``: the tables each
    tick's ``stacks`` point into; ``stack_sampler`` says how they were sampled ("" when they
    were not); ``tenants``: who the other processes on the job's GPUs are (and those this PID
    namespace shows on a GPU the job is not on: ``GpuTick.others_seen_pids``); ``cwd``: the job's
    working directory (its files are named relative to it); ``places``: where the directories
    of the files it wrote and read heavily live; ``stores``: what sparkdiag storage measured
    on this machine's mount points; ``ranks``: the distributed rank of each process sampled."""

    started_at: float  # unix seconds
    interval: float
    job: str  # the command line, or "pid N (name)"
    gpus: tuple[GpuInfo, ...]
    ticks: tuple[Tick, ...]
    ended_by: str = "exit"
    exit_status: int | None = None
    pressure_scope: str = "host"  # "cgroup": the job's own; "shared-cgroup": with others in it
    skipped: tuple[str, ...] = ()
    job_cpus: int | None = None
    frames: tuple[StackFrame, ...] = ()
    stacks: tuple[tuple[int, ...], ...] = ()
    threads: tuple[ThreadInfo, ...] = ()
    stack_sampler: str = ""
    tenants: tuple[ProcessInfo, ...] = ()
    cwd: str = ""
    places: tuple[Place, ...] = ()
    stores: tuple[StoreSpeed, ...] = ()
    ranks: tuple[RankInfo, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **_plain(self)}

    def save(self, path: Path) -> int:
        """Write the recording to ``path`` whole or not at all: a regular file (or a new name)
        through a file beside it renamed over it, removed when the write fails (a full disk
        left a truncated recording that --replay refused, over the last good one); anything
        else (a FIFO, a device) written directly. Returns the bytes written."""
        data = (json.dumps(self.to_json(), separators=(",", ":")) + "\n").encode("utf-8")
        target = path.resolve()
        if target.exists() and not target.is_file():
            path.write_bytes(data)
            return len(data)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except PermissionError:  # a file that may be written in a folder that may not
            path.write_bytes(data)
            return len(data)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        return len(data)


def _plain(value: Any) -> Any:
    """What :func:`dataclasses.asdict` makes of a recording (dataclasses as dicts; tuples,
    named tuples and lists as such), without its deep copy of every number and string: a
    recording holds only dataclasses, tuples, lists, dicts and JSON scalars. The 449 kB
    compile-recompile recording took 0.108 s through asdict, 0.017 s here."""
    names = _FIELD_NAMES.get(type(value))
    if names is None and hasattr(type(value), "__dataclass_fields__"):
        names = _FIELD_NAMES[type(value)] = tuple(f.name for f in fields(value))
    if names is not None:
        out = {}
        for name in names:
            item = getattr(value, name)
            out[name] = item if type(item) in _SCALARS else _plain(item)
        return out
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*[_plain(item) for item in value])
    if isinstance(value, (tuple, list)):
        return type(value)(item if type(item) in _SCALARS else _plain(item) for item in value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_SCALARS = frozenset({int, float, str, bool, type(None)})


class RecordingError(UsageError, ValueError):
    """A recording file cannot be read; the message says which and why."""

    flag = "--replay"


def _build(cls: Any, data: Any) -> Any:
    """``cls`` from a recording's object, each field of the type its annotation gives (a field
    of another type, as a string where a number goes, made diagnose raise a TypeError deep
    inside: 25 of 300 single-field changes, in the bad-input review); fields it does not know
    are left out (a newer recording)."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} must be an object")
    kinds = _field_kinds(cls)
    built = {}
    for key, value in data.items():
        if key in kinds:
            built[key] = _checked(value, kinds[key], f"{cls.__name__}.{key}")
    return cls(**built)


_KINDS: dict[Any, dict[str, tuple[type, ...]]] = {}
_BASIC = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


def _field_kinds(cls: Any) -> dict[str, tuple[type, ...]]:
    """Per field, the Python types a recording's value may have (from the annotation's text,
    ``from __future__`` keeps them strings): a number, a string, a flag, a list for a tuple, an
    object for a dict; ``| None`` adds None; any other annotation takes anything."""
    if cls not in _KINDS:
        kinds: dict[str, tuple[type, ...]] = {}
        for f in fields(cls):
            parts = [p.strip() for p in str(f.type).split("|")]
            allowed: list[type] = []
            for part in parts:
                head = part.split("[", 1)[0]
                if part in _BASIC:
                    allowed += _BASIC[part]
                elif head == "tuple":
                    allowed += [list, tuple]
                elif head == "dict":
                    allowed.append(dict)
                elif part == "None":
                    allowed.append(type(None))
                else:
                    allowed = []  # a type of its own: left to its builder
                    break
            if allowed:
                kinds[f.name] = tuple(allowed)
        _KINDS[cls] = kinds
    return _KINDS[cls]


_JSON_NAMES = {int: "a whole number", float: "a number", str: "a string", bool: "true or false",
               list: "a list", tuple: "a list", dict: "an object", type(None): "null"}  # fmt: skip


def _checked(value: Any, allowed: tuple[type, ...], name: str) -> Any:
    """``value`` when it is of one of the ``allowed`` Python types (an int where a float goes,
    as a float), else a TypeError naming the field, what it holds and what it may hold."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    wrong = isinstance(value, bool) and bool not in allowed  # True is an int to Python
    if wrong or not isinstance(value, allowed):
        kinds = [t for t in allowed if not (t is int and float in allowed)]  # "a number" says it
        held = repr(value) if number else _JSON_NAMES.get(type(value), "something else")
        raise TypeError(f"{name} is {held}, not {' or '.join(_JSON_NAMES[t] for t in kinds)}")
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _number(value: Any, name: str) -> float:
    """A finite JSON number: float() took "nan" and "1e999" as strings (the review of the
    field checks: a recording of "t": "nan" replayed as healthy, and --json wrote NaN)."""
    number: float = _checked(value, (int, float), name)
    if not math.isfinite(number):
        raise ValueError(f"{name} is {value}, not a finite number")
    return number


def _whole(value: Any, name: str) -> int | None:
    """A whole number or null."""
    whole: int | None = _checked(value, (int, type(None)), name)
    return whole


def _gpu_tick(data: Any) -> GpuTick:
    tick: GpuTick = _build(GpuTick, data)
    samples = tuple(
        (_number(t, "GpuTick.samples"), _number(v, "GpuTick.samples")) for t, v in tick.samples
    )
    others = tuple(_build(OtherProcess, o) for o in tick.others)
    pids = tuple(_checked(p, (int,), "GpuTick.others_seen_pids") for p in tick.others_seen_pids)
    held = tuple(
        (_checked(bit, (int,), "GpuTick.reasons_held"), _number(share, "GpuTick.reasons_held"))
        for bit, share in tick.reasons_held
    )
    return replace(tick, samples=samples, others=others, others_seen_pids=pids, reasons_held=held)


def _tick(data: Any) -> Tick:
    return Tick(
        t=_number(data["t"], "Tick.t"),
        dt=_number(data["dt"], "Tick.dt"),
        gpus=tuple(_gpu_tick(g) for g in data.get("gpus", ())),
        job=_job_tick(data.get("job", {})),
        host=_build(HostTick, data.get("host", {})),
        stacks=tuple(
            StackTime(
                int(s[0]), int(s[1]), _number(s[2], "Tick.stacks"), int(s[3]) if len(s) > 3 else 0
            )
            for s in data.get("stacks", ())
        ),
    )


def _stack_tables(doc: dict[str, Any]) -> dict[str, Any]:
    """The stack and tenant tables of a schema 2 recording (empty for schema 1), every index
    checked: a tick may not point past a table."""
    frames = tuple(_build(StackFrame, f) for f in doc.get("frames", ()))
    stacks = tuple(tuple(int(i) for i in s) for s in doc.get("stacks", ()))
    if any(not 0 <= i < len(frames) for s in stacks for i in s):
        raise ValueError("a stack names a frame the recording does not hold")
    return {
        "frames": frames,
        "stacks": stacks,
        "threads": tuple(_build(ThreadInfo, t) for t in doc.get("threads", ())),
        "stack_sampler": str(doc.get("stack_sampler", "")),
        "tenants": tuple(_build(ProcessInfo, p) for p in doc.get("tenants", ())),
        "cwd": str(doc.get("cwd", "")),
        "places": tuple(_build(Place, p) for p in doc.get("places", ())),
        "stores": tuple(_build(StoreSpeed, p) for p in doc.get("stores", ())),
        "ranks": tuple(_build(RankInfo, p) for p in doc.get("ranks", ())),
    }


def _job_tick(data: Any) -> JobTick:
    tick: JobTick = _build(JobTick, data)
    return replace(
        tick,
        loads=tuple(_build(ProcessLoad, p) for p in tick.loads),
        writing=tuple(str(p) for p in tick.writing),
        reading=tuple(str(p) for p in tick.reading),
    )


def from_json(doc: Any) -> Recording:
    """A :class:`Recording` from :meth:`Recording.to_json`'s document; RecordingError if bad."""
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if isinstance(schema, str) and schema.startswith(SCHEMA_FAMILY) and schema not in SCHEMAS:
        raise RecordingError(
            f"recorded as {schema!r} by a newer sparkdiag (this one reads "
            f"{', '.join(map(repr, SCHEMAS))}): replay it with the sparkdiag that recorded it "
            "(pip install -U sparkdiag)"
        )
    if not isinstance(doc, dict) or schema not in SCHEMAS:
        raise RecordingError(f"not a sparkdiag watch recording (schema {SCHEMA!r} expected)")
    try:
        ticks = tuple(_tick(t) for t in doc["ticks"])
        tables = _stack_tables(doc)
        if any(
            not (0 <= s.thread < len(tables["threads"]) and 0 <= s.stack < len(tables["stacks"]))
            for t in ticks
            for s in t.stacks
        ):
            raise ValueError("a tick names a thread or stack the recording does not hold")
        return Recording(
            started_at=_number(doc["started_at"], "started_at"),
            interval=_number(doc["interval"], "interval"),
            job=str(doc["job"]),
            gpus=tuple(_build(GpuInfo, g) for g in doc["gpus"]),
            ticks=ticks,
            ended_by=str(doc.get("ended_by", "exit")),
            exit_status=_whole(doc.get("exit_status"), "exit_status"),
            pressure_scope=str(doc.get("pressure_scope", "host")),
            skipped=tuple(str(s) for s in doc.get("skipped", ())),
            job_cpus=_whole(doc.get("job_cpus"), "job_cpus"),
            **tables,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordingError(f"malformed watch recording: {exc}") from None


MAX_RECORDING_BYTES = 64 << 20  # a tick is about 1 KB: 9 h at 0.5 s of a one-process job


def load(path: Path) -> Recording:
    with safeload.reading(path, RecordingError):
        doc = safeload.load_json(path, MAX_RECORDING_BYTES)
    try:
        return from_json(doc)
    except RecordingError as exc:
        raise RecordingError(f"{path}: {exc}") from None
