"""Container against native: the same probe on both sides, alternately, and the gap between them.

:func:`compare` runs the probe worker natively (``[*native, worker.py, *args]``) and inside a
container (the container command with the worker's source on standard input, so nothing has to be
installed in the image), in alternating cycles: native, container, native, container, ... One
warm-up pair comes first and is not counted (a cold GPU runs faster for its first seconds, and
the first container start pays for caches); then ``rounds`` measured pairs. Every cycle is a fresh
process on each side, so process start-up never enters the figures (the worker times kernels).

For every (dtype, shape, beta) both sides' figures are kept per round; the ratio is
median(container) / median(native), its spread the smallest and largest per-round ratio (round i
of the container against round i of native), and the gap ``1 - ratio`` (positive: the container is
slower). The software identity of each side (torch, CUDA, cuBLAS, driver, ...) comes from each
worker document, so a slower library can be told from a slower environment.

A side that fails stops the comparison at once (a broken container is not started N times); the
failure is classified (runtime missing, image missing, no GPU inside, no torch inside, hang,
output that is not the worker's JSON, ...) with what to do about it.

The container command is an argument list and is never given to a shell.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sparkdiag.probe.engine import guards, run_guarded
from sparkdiag.probe.runner import ProbeCycle, run_worker
from sparkdiag.sources.gpu import decode_reasons

SCHEMA = "sparkdiag-compare/1"
DEFAULT_MAX_GAP = 0.15
DEFAULT_ROUNDS = 3
DEFAULT_WARMUP_ROUNDS = 1
DEFAULT_TIMEOUT = 120.0

EXIT_OK = 0  # every measured gap within --max-gap
EXIT_GAP = 1  # the worst gap exceeds --max-gap
EXIT_USAGE = 2  # bad command line (click's own usage errors exit 2 as well)
EXIT_FAILED = 3  # a side failed to run, or nothing was measured on both sides

Role = Literal["native", "container"]
FailureKind = Literal[
    "runtime_missing",  # the container runtime binary (or native interpreter) does not exist
    "runtime_unusable",  # it cannot run containers (daemon down, permissions, no GPU hook)
    "image_missing",
    "no_interpreter",  # the image has no such Python
    "no_gpu",
    "no_torch",
    "timeout",
    "not_json",
    "busy",
    "error",
]

# Components of the worker's ``software`` block, in the order they are shown.
IDENTITY_KEYS = (
    "torch",
    "cuda",
    "cublas",
    "driver",
    "python",
    "gpu_name",
    "compute_capability",
    "gpu_uuid",
    "device",
)
# Libraries that by themselves can make the same kernel faster or slower.
LIBRARY_KEYS = ("torch", "cuda", "cublas")
# A side whose mean SM clock is below this fraction of the other's ran throttled.
CLOCK_DROP = 0.95
THERMAL_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "sw_power_cap")
_DOCKER_LIKE = ("docker", "podman", "nerdctl")

# Runs the container command, passes the worker's source through on standard input (inherited),
# and forwards to its own standard output only the worker's JSON document, the last line that is
# one; anything the image printed around it (the NGC entrypoint prints its banner on standard
# output) goes to standard error. Output without such a line is forwarded unchanged, so that it
# is still reported as "not the worker's JSON". It runs in the worker's process group: the
# runner's timeout kills it together with the container command and whatever that started.
_RELAY = r"""
import json, os, selectors, signal, subprocess, sys, time
cmd = sys.argv[1:]
try:
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE)
except OSError as exc:
    sys.stderr.write(f"cannot start worker {cmd[0]!r}: {exc}\n")
    sys.exit(127)
fd = child.stdout.fileno()
sel = selectors.DefaultSelector()
sel.register(fd, selectors.EVENT_READ)
buf = bytearray()
exited = None
while True:
    if exited is None and child.poll() is not None:
        exited = time.monotonic()
    if exited is not None and time.monotonic() - exited > 1.0:
        break
    if sel.select(0.2):
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        if len(buf) < 16 * 1024 * 1024:
            buf += chunk
code = child.wait()
lines = bytes(buf).splitlines(keepends=True)
found = None
for i in range(len(lines) - 1, -1, -1):
    text = lines[i].strip()
    if text.startswith(b"{"):
        try:
            doc = json.loads(text)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("schema") == "sparkdiag-probe/1":
            found = i
            break
if found is None:
    out, extra = bytes(buf), b""
else:
    out, extra = lines[found], b"".join(lines[:found] + lines[found + 1:])
if extra.strip():
    sys.stderr.buffer.write(extra)
    sys.stderr.buffer.flush()
sys.stdout.buffer.write(out)
sys.stdout.buffer.flush()
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""

_IMAGE_MISSING = re.compile(
    r"pull access denied|manifest unknown|no such image|repository does not exist|"
    r"image not known|failed to resolve reference|name unknown|could not open image|"
    r"requested access to the resource is denied|unable to find image.*\n?.*(?:not found|denied)|"
    # podman when the pull itself fails (no registry reachable): the image is not here
    r"initializing source docker://",
    re.I,
)
_IMAGE_NAME = (
    re.compile(r"unable to find image '([^']+)'", re.I),
    re.compile(r"pull access denied for ([^\s,]+)", re.I),
    re.compile(r"manifest for (\S+) not found", re.I),
    re.compile(r"no such image: (\S+)", re.I),
    re.compile(r"Error: (\S+): image not known", re.I),
    re.compile(r"could not open image (\S+?):", re.I),
    re.compile(r"initializing source docker://(\S+?): ", re.I),
)
_PULLING = re.compile(r"unable to find image|pulling from|pulling fs layer|trying to pull", re.I)
_NO_TORCH = re.compile(r"No module named '?torch'?|cannot import torch", re.I)
_DAEMON = re.compile(
    r"cannot connect to the docker daemon|is the docker daemon running|"
    r"permission denied while trying to connect|cannot connect to podman",
    re.I,
)
_NO_GPU_HOOK = re.compile(
    r"could not select device driver|unresolvable CDI devices|nvidia-container-cli", re.I
)
_NO_INTERPRETER = (
    re.compile(r'exec: "([^"]+)": executable file not found', re.I),
    re.compile(r"executable file `([^`]+)` not found", re.I),
    re.compile(r"([^\s:]+): (?:command )?not found", re.I),
)
_TTY = re.compile(r"the input device is not a TTY", re.I)
_FIRST_BYTES = re.compile(r"first bytes: (.*)\)\s*$", re.S)


@dataclass(frozen=True)
class Side:
    """One side as it ran: its command, software identity and the GPU conditions it saw.

    software: the worker's ``software`` block (torch, cuda, cublas, driver, python, gpu_name,
    compute_capability, gpu_uuid, device), from the first measured document; empty when none.
    conditions: ``max_gpu_temperature_celsius`` (highest over the measured rounds),
    ``mean_sm_clock_hertz`` (median of the rounds' means), ``clock_event_reasons`` (names of
    every NVML clock event reason seen); None where NVML did not say (CPU, no NVML).
    """

    role: Role
    command: tuple[str, ...]
    software: Mapping[str, Any]
    conditions: Mapping[str, Any]


@dataclass(frozen=True)
class Cycle:
    """One worker run: ``label`` is "warm-up 1" or "round 2/3"; figures by :attr:`Row.key`."""

    label: str
    warmup: bool
    round: int  # 1-based, counted separately for warm-up and measured rounds
    side: Role
    result: str  # the runner's: ok, timeout, error, unsupported, skipped_busy
    reason: str | None
    returncode: int | None
    wall_seconds: float
    figures: Mapping[str, float]


@dataclass(frozen=True)
class Failure:
    """Why a side could not be measured, and what to do about it."""

    side: Role
    kind: FailureKind
    message: str
    detail: str | None  # the runner's own one-line reason
    label: str  # the cycle that failed
    stderr_tail: str


@dataclass(frozen=True)
class Difference:
    component: str
    native: Any
    container: Any


@dataclass(frozen=True)
class Row:
    """One kernel on both sides. Figures are TFLOPS (TOPS for int8/int4, GB/s for bandwidth).

    ``native`` and ``container`` hold one figure per measured round (None where that round
    did not measure it); the status is ``ok`` when every round measured it, else the first other
    status seen (``unsupported``, ``error``, ``absent``) with its reason.
    """

    dtype: str
    shape: str
    kind: str
    beta: int
    unit: str
    native: tuple[float | None, ...]
    container: tuple[float | None, ...]
    native_status: str
    container_status: str
    native_reason: str | None
    container_reason: str | None

    @property
    def key(self) -> str:
        return row_key(self.dtype, self.shape, self.beta)

    @property
    def native_median(self) -> float | None:
        return _median(self.native)

    @property
    def container_median(self) -> float | None:
        return _median(self.container)

    @property
    def ratio(self) -> float | None:
        """median(container) / median(native); None unless both sides measured it."""
        n, c = self.native_median, self.container_median
        if n is None or c is None or n <= 0:
            return None
        return c / n

    @property
    def round_ratios(self) -> tuple[float, ...]:
        return tuple(
            c / n
            for n, c in zip(self.native, self.container, strict=False)
            if n is not None and c is not None and n > 0
        )

    @property
    def ratio_min(self) -> float | None:
        return min(self.round_ratios) if self.round_ratios else None

    @property
    def ratio_max(self) -> float | None:
        return max(self.round_ratios) if self.round_ratios else None

    @property
    def gap(self) -> float | None:
        """1 - ratio: 0.2 means the container delivers 20 % less than native."""
        ratio = self.ratio
        return None if ratio is None else 1.0 - ratio

    def noisy(self, max_gap: float) -> bool:
        """True when the per-round ratios fall on both sides of the threshold."""
        low, high = self.ratio_min, self.ratio_max
        return low is not None and high is not None and low < 1.0 - max_gap < high

    def verdict(self, max_gap: float) -> str:
        """ok, slower (gap above max_gap), faster (container ahead by more), n/a."""
        gap = self.gap
        if gap is None:
            return "n/a"
        if gap > max_gap:
            return "slower"
        if gap < -max_gap:
            return "faster"
        return "ok"

    def note(self) -> str | None:
        """Why the row has no ratio, in one line."""
        if self.ratio is not None:
            return None
        if self.native_status == self.container_status == "unsupported":
            return f"unsupported on both sides: {self.native_reason or self.container_reason}"
        parts = []
        for role, status, reason in (
            ("native", self.native_status, self.native_reason),
            ("container", self.container_status, self.container_reason),
        ):
            if status != "ok":
                parts.append(f"{role} {status}" + (f": {reason}" if reason else ""))
        return "; ".join(parts) or None


@dataclass(frozen=True)
class Comparison:
    """The outcome of :func:`compare`; ``exit_code(max_gap)`` is the command's exit status."""

    native: Side
    container: Side
    rows: tuple[Row, ...]
    cycles: tuple[Cycle, ...]
    failures: tuple[Failure, ...]
    rounds: int
    warmup_rounds: int
    worker_args: tuple[str, ...]
    container_args: tuple[str, ...]

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    @property
    def measured_rows(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.ratio is not None)

    @property
    def worst_row(self) -> Row | None:
        rows = self.measured_rows
        return max(rows, key=lambda r: r.gap or 0.0) if rows else None

    @property
    def worst_gap(self) -> float | None:
        """The largest gap over every kernel measured on both sides (None when there is none)."""
        row = self.worst_row
        return None if row is None else row.gap

    @property
    def differences(self) -> tuple[Difference, ...]:
        """Software components whose value differs between the sides (both must be known)."""
        if not self.native.software or not self.container.software:
            return ()
        out = []
        for key in IDENTITY_KEYS:
            a, b = self.native.software.get(key), self.container.software.get(key)
            if a != b:
                out.append(Difference(key, a, b))
        return tuple(out)

    @property
    def library_differences(self) -> tuple[Difference, ...]:
        return tuple(d for d in self.differences if d.component in LIBRARY_KEYS)

    def verdict(self, max_gap: float) -> str:
        """failed, no-data, gap or ok."""
        if self.failures:
            return "failed"
        gap = self.worst_gap
        if gap is None:
            return "no-data"
        return "gap" if gap > max_gap else "ok"

    def exit_code(self, max_gap: float) -> int:
        return {"failed": EXIT_FAILED, "no-data": EXIT_FAILED, "gap": EXIT_GAP}.get(
            self.verdict(max_gap), EXIT_OK
        )

    def diagnosis(self, max_gap: float) -> str:
        """Why the sides differ (or fail), as far as the two documents can tell."""
        if self.failures:
            return self.failures[0].message
        worst = self.worst_row
        if worst is None or worst.gap is None:
            return "no kernel was measured on both sides; see each row's note"
        libs = self.library_differences
        lib_text = ", ".join(f"{d.component} {d.native} vs {d.container}" for d in libs)
        if worst.gap <= max_gap:
            text = f"within {max_gap:.0%}: the container delivers what native does"
            if libs:
                text += f" (with different libraries: {lib_text})"
            return text
        reasons: list[str] = []
        uuid_diff = [d for d in self.differences if d.component == "gpu_uuid"]
        if uuid_diff:
            reasons.append(
                "the sides probed different GPUs: pass the same one to both "
                "(--device cuda:N natively, the same device to the container)"
            )
        if libs:
            reasons.append(
                f"the sides run different libraries ({lib_text}): the gap may come from them "
                "rather than from the container; to measure the environment alone, install "
                "natively the torch/CUDA/cuBLAS the image has, and compare again"
            )
        shared = _sharing_text(self.native.conditions, self.container.conditions)
        if shared:
            reasons.append(shared)
        throttled = _throttle_text(self.native.conditions, self.container.conditions)
        if throttled and not shared:
            reasons.append(throttled)
        if not reasons:
            slow = [r for r in self.measured_rows if (r.gap or 0.0) > max_gap]
            if slow and all(r.kind == "decode" for r in slow):
                reasons.append(
                    "same libraries and GPU, and only the small-M (decode) shapes are slower: "
                    "kernel launches are CPU-bound there, so the container's CPU side is the "
                    "bottleneck (CPU quota or cpuset, cgroup throttling, seccomp, emulation)"
                )
            elif slow and all(r.kind == "bandwidth" for r in slow):
                reasons.append(
                    "same libraries and GPU, and only memory bandwidth is lower: look at the "
                    "container's memory placement and limits (NUMA binding, --memory, --shm-size)"
                )
            else:
                reasons.append(
                    "same libraries, same GPU, no throttling seen: the slowdown comes from the "
                    "container environment itself (runtime options, CPU/memory limits, "
                    "--ipc/--shm-size, a virtualised or MPS-shared GPU path)"
                )
        return "; ".join(reasons)

    def to_dict(self, max_gap: float) -> dict[str, Any]:
        """The --json document (schema sparkdiag-compare/1)."""
        worst = self.worst_row
        complete = not self.failures
        return {
            "schema": SCHEMA,
            "verdict": self.verdict(max_gap),
            "exit_code": self.exit_code(max_gap),
            "max_gap": max_gap,
            "worst_gap": self.worst_gap if complete else None,
            "worst": None if worst is None or not complete else worst.key,
            "diagnosis": self.diagnosis(max_gap),
            "rounds": self.rounds,
            "warmup_rounds": self.warmup_rounds,
            "worker_args": list(self.worker_args),
            "container_args": list(self.container_args),
            "native": _side_dict(self.native),
            "container": _side_dict(self.container),
            "differences": [
                {"component": d.component, "native": d.native, "container": d.container}
                for d in self.differences
            ],
            "rows": [_row_dict(r, max_gap) for r in self.rows] if complete else [],
            "cycles": [
                {
                    "label": c.label,
                    "warmup": c.warmup,
                    "round": c.round,
                    "side": c.side,
                    "result": c.result,
                    "reason": c.reason,
                    "returncode": c.returncode,
                    "wall_seconds": c.wall_seconds,
                    "figures": dict(c.figures),
                }
                for c in self.cycles
            ],
            "failures": [
                {
                    "side": f.side,
                    "kind": f.kind,
                    "message": f.message,
                    "detail": f.detail,
                    "cycle": f.label,
                    "stderr_tail": f.stderr_tail,
                }
                for f in self.failures
            ],
        }


def row_key(dtype: str, shape: str, beta: int) -> str:
    """``bf16 8192x8192x8192``, with `` beta=1`` for the accumulate runs."""
    return f"{dtype} {shape}" + (f" beta={beta}" if beta else "")


def container_command(cmd: Sequence[str]) -> tuple[str, ...]:
    """The container command as the runner wants it: without the interpreter's trailing "-".

    Users write the command that reads a script from standard input, ending in ``-`` (``docker
    run -i --rm --gpus all IMAGE python3 -``); the runner appends ``-`` and the worker's
    arguments itself, so one trailing ``-`` is dropped. A command without it is taken as is.
    """
    argv = tuple(str(a) for a in cmd)
    if argv and argv[-1] == "-":
        argv = argv[:-1]
    if not argv:
        raise ValueError("the container command is empty: give the command that starts Python")
    return argv


def compare(
    container: Sequence[str],
    native: Sequence[str] = (sys.executable,),
    rounds: int = DEFAULT_ROUNDS,
    worker_args: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT,
    on_progress: Callable[[str], None] | None = None,
    warmup_rounds: int = DEFAULT_WARMUP_ROUNDS,
    kill_grace: float = 2.0,
) -> Comparison:
    """Run the probe natively and in the container alternately and compare the figures.

    ``container`` is the argument list that starts Python inside the container and reads a
    script from standard input (a trailing ``-`` is optional, see :func:`container_command`);
    the worker's source is written to its standard input. ``native`` is the native interpreter
    command; it runs the worker file. Both are injectable, which the tests use. ``worker_args``
    go to both sides; when they name no ``--device``, the container gets the device the native
    worker chose (so a container without a GPU fails fast instead of measuring its CPU).

    Order: ``warmup_rounds`` unmeasured pairs, then ``rounds`` measured pairs, native first in
    each pair (A B A B ...). Every cycle has ``timeout`` seconds; at the timeout the side's
    whole process group is killed. The first failed cycle on either side ends the comparison.
    """
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    if warmup_rounds < 0:
        raise ValueError("warmup_rounds must be 0 or more")
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    container_cmd = container_command(container)
    native_cmd = tuple(str(a) for a in native)
    if not native_cmd:
        raise ValueError("the native interpreter command is empty")
    args = tuple(str(a) for a in worker_args)
    container_args: tuple[str, ...] | None = args if _has_option(args, "--device") else None
    progress = on_progress or (lambda _message: None)

    cycles: list[Cycle] = []
    failures: list[Failure] = []
    measured: dict[Role, list[dict[str, Any]]] = {"native": [], "container": []}
    first: dict[Role, dict[str, Any]] = {}  # each side's first document, failed or not
    native_doc: dict[str, Any] | None = None

    missing = _missing_runtime(container_cmd)
    if missing is not None:
        failures.append(missing)

    schedule = [(True, i + 1) for i in range(warmup_rounds)]
    schedule += [(False, i + 1) for i in range(rounds)]
    for warmup, number in schedule:
        if failures:
            break
        label = f"warm-up {number}" if warmup else f"round {number}/{rounds}"
        sides: tuple[Role, Role] = ("native", "container")
        for side in sides:
            progress(f"{label}: {side}…")
            if side == "native":
                cycle = _run(native_cmd, args, False, timeout, kill_grace)
                command = native_cmd
            else:
                if container_args is None:
                    container_args = _pin_device(args, native_doc)
                    if "--device" in container_args:
                        device = container_args[container_args.index("--device") + 1]
                        progress(f"both sides probe {device} (the device native chose)")
                relayed = functools.partial(_relayed, container_args, timeout, kill_grace)
                # a container that outlives a timed-out cycle is killed
                cycle = run_guarded(container_cmd, relayed)
                command = container_cmd
            cycles.append(
                Cycle(
                    label=label,
                    warmup=warmup,
                    round=number,
                    side=side,
                    result=cycle.result,
                    reason=cycle.reason,
                    returncode=cycle.returncode,
                    wall_seconds=cycle.wall_seconds,
                    figures=_figures(cycle.document),
                )
            )
            progress(f"{label}: {side} {cycle.result} in {cycle.wall_seconds:.1f} s")
            if cycle.document is not None:
                first.setdefault(side, cycle.document)
            failure = diagnose(side, cycle, command, timeout, label, native_doc)
            if failure is not None:
                failures.append(failure)
                break
            assert cycle.document is not None
            if side == "native" and native_doc is None:
                native_doc = cycle.document
            if not warmup:
                measured[side].append(cycle.document)

    pairs = min(len(measured["native"]), len(measured["container"]))
    rows = _rows(measured["native"][:pairs], measured["container"][:pairs])
    return Comparison(
        native=_side("native", native_cmd, measured["native"], first.get("native")),
        container=_side("container", container_cmd, measured["container"], first.get("container")),
        rows=rows,
        cycles=tuple(cycles),
        failures=tuple(failures),
        rounds=rounds,
        warmup_rounds=warmup_rounds,
        worker_args=args,
        container_args=container_args if container_args is not None else args,
    )


def _run(
    python: Sequence[str],
    args: Sequence[str],
    stdin_script: bool,
    timeout: float,
    kill_grace: float,
) -> ProbeCycle:
    """run_worker, and should we be interrupted meanwhile, the worker's group killed with us."""
    started: list[int] = []
    try:
        return run_worker(
            python,
            args,
            timeout=timeout,
            stdin_script=stdin_script,
            kill_grace=kill_grace,
            on_start=started.append,
        )
    except BaseException:
        # KeyboardInterrupt or SystemExit from a signal handler: the worker runs in its own
        # session and would outlive us. It is not reaped yet, so its PID still names its group.
        for pid in started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        raise


def _relayed(
    args: Sequence[str], timeout: float, kill_grace: float, container: Sequence[str]
) -> ProbeCycle:
    """The container side: its command behind the relay (see ``_RELAY``)."""
    return _run((sys.executable, "-I", "-c", _RELAY, *container), args, True, timeout, kill_grace)


def _has_option(args: Sequence[str], name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in args)


def _pin_device(args: tuple[str, ...], native_doc: Mapping[str, Any] | None) -> tuple[str, ...]:
    device = _software(native_doc).get("device")
    if isinstance(device, str) and device:
        return (*args, "--device", device)
    return args


def _software(doc: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not doc:
        return {}
    software = doc.get("software")
    return software if isinstance(software, Mapping) else {}


def _missing_runtime(cmd: Sequence[str]) -> Failure | None:
    """Fail before any cycle when the runtime binary cannot be found or run."""
    binary = cmd[0]
    if shutil.which(binary) is not None:
        return None
    path = Path(binary)
    if os.sep in binary and path.exists():
        why = f"container runtime {binary!r} is not an executable file"
    elif os.sep in binary:
        why = f"container runtime {binary!r} does not exist"
    else:
        why = f"container runtime {binary!r} not found on PATH"
    return Failure(
        side="container",
        kind="runtime_missing",
        message=why + " (install it, or give its full path)",
        detail=None,
        label="before the first cycle",
        stderr_tail="",
    )


def _usable(cycle: ProbeCycle) -> bool:
    """A document with at least one measured figure (kernel-level errors stay in the rows)."""
    doc = cycle.document
    if doc is None or cycle.result in ("timeout", "skipped_busy"):
        return False
    return bool(_figures(doc))


def diagnose(
    side: Role,
    cycle: ProbeCycle,
    command: Sequence[str],
    timeout: float,
    label: str = "",
    native_doc: Mapping[str, Any] | None = None,
) -> Failure | None:
    """Classify a cycle that cannot be used; None when it can (for the container, only when
    it ran on the kind of device native ran on)."""
    doc = cycle.document
    stderr = cycle.stderr_tail
    runtime = Path(command[0]).name if command else "?"
    where = "inside the container" if side == "container" else f"of native {command[0]!r}"

    def failed(kind: FailureKind, message: str) -> Failure:
        return Failure(side, kind, message, cycle.reason, label, stderr)

    if cycle.result == "timeout":
        message = f"{side} did not answer within {timeout:g} s; killed with its process group"
        if side == "container":
            if _PULLING.search(stderr):
                message += (
                    f"; {runtime} was still pulling the image: pull it first"
                    f" ({_pull_hint(runtime, _image_name(stderr, command))}) or raise --timeout"
                )
            if guards(command):
                message += f" and the container stopped ({runtime} kill)"
            elif runtime in _DOCKER_LIKE:
                message += (
                    f" (the engine may keep the container running: check '{runtime} ps'"
                    " and run with --rm)"
                )
        return failed("timeout", message)

    start_failed = cycle.returncode is None or (
        cycle.returncode == 127 and "cannot start worker" in stderr
    )
    if start_failed:
        text = f"{cycle.reason or ''} {stderr}"
        what = "container runtime" if side == "container" else "native interpreter"
        if "Errno 2" in text or "No such file" in text:
            return failed("runtime_missing", f"{what} {command[0]!r} not found on PATH")
        if "Errno 13" in text or "Permission denied" in text:
            return failed("runtime_missing", f"{what} {command[0]!r} is not executable")
        return failed("runtime_missing", f"cannot start the {side} command: {cycle.reason}")

    if cycle.result == "skipped_busy":
        return failed(
            "busy",
            f"the GPU was busy during the {side} cycle ({cycle.reason}); stop the other job, "
            "or pass --probe-when always to measure anyway",
        )

    doc_reason = str(doc.get("reason") or "") if doc else ""
    if _NO_TORCH.search(doc_reason) or (doc is None and _NO_TORCH.search(stderr)):
        if side == "container":
            return failed(
                "no_torch",
                "the interpreter inside the container has no torch; use an image with PyTorch, "
                "e.g. an NGC PyTorch image (nvcr.io/nvidia/pytorch:<yy.mm>-py3)",
            )
        return failed(
            "no_torch",
            f"the native interpreter {' '.join(command)!r} has no torch: pass --native-python "
            "with the Python of the install to compare (for instance a virtual environment's)",
        )

    if side == "container" and doc is None:
        if _DAEMON.search(stderr):
            return failed(
                "runtime_unusable",
                f"{runtime} cannot reach its daemon: start it, or add your user to its group "
                f"({_error_excerpt(stderr)})",
            )
        if _NO_GPU_HOOK.search(stderr):
            return failed(
                "runtime_unusable",
                f"{runtime} cannot hand a GPU to the container: install and configure the NVIDIA "
                "Container Toolkit (nvidia-ctk runtime configure) and restart the engine "
                f"({_error_excerpt(stderr)})",
            )
        if _IMAGE_MISSING.search(stderr):
            image = _image_name(stderr, command)
            return failed(
                "image_missing",
                f"image not found: {image or '(see below)'} ({_pull_hint(runtime, image)})",
            )
        if _TTY.search(stderr):
            return failed(
                "error",
                "the container command asks for a terminal (-t/--tty): drop it, sparkdiag "
                "sends the worker through a pipe (keep -i)",
            )
        interpreter = _missing_interpreter(stderr, cycle.returncode)
        if interpreter is not None:
            return failed(
                "no_interpreter",
                f"no interpreter {interpreter!r} inside the container: end the command with the "
                "image's Python (python3, python or a full path) and '-'",
            )

    if doc is not None and side == "container":
        no_gpu = _no_gpu(doc, native_doc, runtime)
        if no_gpu is not None:
            return failed("no_gpu", no_gpu)

    if _usable(cycle):
        return None

    if doc is None:
        if cycle.returncode == 0:
            shown = _FIRST_BYTES.search(cycle.reason or "")
            if shown is None:
                hint = ""
                if side == "container" and runtime in _DOCKER_LIKE and not _interactive(command):
                    hint = f": {runtime} needs -i to pass standard input into the container"
                return failed("not_json", f"{side} printed nothing on standard output{hint}")
            return failed(
                "not_json",
                f"{side} printed something that is not sparkdiag's worker JSON: "
                f"first bytes {shown.group(1)}",
            )
        return failed("error", f"{side} failed {where}: {cycle.reason}")
    if doc_reason.startswith("usage:"):
        return failed("error", f"the worker rejected its arguments: {doc_reason}")
    return failed("error", f"{side} measured nothing: {cycle.reason or doc_reason}")


def _no_gpu(
    doc: Mapping[str, Any], native_doc: Mapping[str, Any] | None, runtime: str
) -> str | None:
    """The container's worker had no GPU where the native one had one."""
    native_device = str(_software(native_doc).get("device") or "")
    software = _software(doc)
    device = str(software.get("device") or "")
    reason = str(doc.get("reason") or "")
    unavailable = doc.get("status") == "unsupported" and "not available" in reason
    if not (unavailable or (native_device.startswith("cuda") and device == "cpu")):
        return None
    cuda = software.get("cuda")
    if software.get("torch") and cuda is None and unavailable:
        return (
            f"the torch inside the container ({software.get('torch')}) is a CPU-only build: use "
            "a CUDA build of PyTorch, e.g. an NGC PyTorch image"
        )
    return (
        "no GPU inside the container: "
        + _gpu_hint(runtime)
        + (f" (worker: {reason})" if reason else "")
    )


def _gpu_hint(runtime: str) -> str:
    hints = {
        "docker": "add --gpus all (docker)",
        "nerdctl": "add --gpus all (nerdctl)",
        "podman": "add --device nvidia.com/gpu=all (podman, CDI)",
        "apptainer": "add --nv (apptainer)",
        "singularity": "add --nv (singularity)",
        "enroot": "start it with the NVIDIA hooks, e.g. --env NVIDIA_VISIBLE_DEVICES=all (enroot)",
    }
    return hints.get(
        runtime,
        "add --gpus all (docker) or --device nvidia.com/gpu=all (podman), --nv (apptainer)",
    )


def _pull_hint(runtime: str, image: str | None) -> str:
    name = image or "IMAGE"
    if runtime in ("apptainer", "singularity"):
        return f"{runtime} pull docker://{name}" if image else f"check the image path ({runtime})"
    if runtime == "enroot":
        return f"enroot import docker://{name} && enroot create"
    return f"{runtime if runtime in _DOCKER_LIKE else 'docker'} pull {name}"


def _image_name(stderr: str, command: Sequence[str]) -> str | None:
    """The image as the runtime named it; else the word before the interpreter in CMD."""
    for pattern in _IMAGE_NAME:
        found = pattern.search(stderr)
        if found:
            return found.group(1).rstrip(".:'\"")
    for i in range(len(command) - 1, 1, -1):
        if Path(command[i]).name.startswith("python"):
            before = command[i - 1]
            return None if before.startswith("-") else before
    return None


def _missing_interpreter(stderr: str, returncode: int | None) -> str | None:
    for pattern in _NO_INTERPRETER[:2]:
        found = pattern.search(stderr)
        if found:
            return found.group(1)
    if returncode == 127:
        found = _NO_INTERPRETER[2].search(stderr)
        if found:
            return found.group(1)
    return None


def _interactive(command: Sequence[str]) -> bool:
    for arg in command[1:]:
        if arg in ("-i", "--interactive", "--interactive=true"):
            return True
        if re.fullmatch(r"-[a-zA-Z]*i[a-zA-Z]*", arg):
            return True
    return False


def _error_excerpt(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no message"


def _figures(doc: Mapping[str, Any] | None) -> dict[str, float]:
    """Every measured figure of a document, by row key (bandwidth in GB/s)."""
    if not doc:
        return {}
    out: dict[str, float] = {}
    for result in doc.get("results") or []:
        if not isinstance(result, Mapping) or result.get("status") != "ok":
            continue
        value = result.get("tflops")
        if isinstance(value, (int, float)) and value > 0:
            key = row_key(str(result.get("dtype")), str(result.get("shape")), _beta(result))
            out[key] = float(value)
    bandwidth = doc.get("bandwidth")
    if isinstance(bandwidth, Mapping) and bandwidth.get("status") == "ok":
        value = bandwidth.get("bytes_per_second")
        if isinstance(value, (int, float)) and value > 0:
            out[row_key("bandwidth", "copy", 0)] = float(value) / 1e9
    return out


def _beta(result: Mapping[str, Any]) -> int:
    try:
        return int(result.get("beta") or 0)
    except (TypeError, ValueError):
        return 0


@dataclass
class _Entry:
    dtype: str
    shape: str
    kind: str
    beta: int
    unit: str


def _entries(doc: Mapping[str, Any]) -> dict[str, tuple[_Entry, str, str | None, float | None]]:
    """key -> (entry, status, reason, figure) for one document."""
    out: dict[str, tuple[_Entry, str, str | None, float | None]] = {}
    for result in doc.get("results") or []:
        if not isinstance(result, Mapping):
            continue
        dtype, shape, beta = str(result.get("dtype")), str(result.get("shape")), _beta(result)
        unit = "TOPS" if dtype in ("int8", "int4") else "TFLOPS"
        entry = _Entry(dtype, shape, str(result.get("kind") or ""), beta, unit)
        status = str(result.get("status") or "error")
        value = result.get("tflops")
        figure = float(value) if status == "ok" and isinstance(value, (int, float)) else None
        reason = result.get("reason")
        out[row_key(dtype, shape, beta)] = (entry, status, reason and str(reason), figure)
    bandwidth = doc.get("bandwidth")
    if isinstance(bandwidth, Mapping):
        entry = _Entry("bandwidth", "copy", "bandwidth", 0, "GB/s")
        status = str(bandwidth.get("status") or "error")
        value = bandwidth.get("bytes_per_second")
        figure = float(value) / 1e9 if status == "ok" and isinstance(value, (int, float)) else None
        reason = bandwidth.get("reason")
        out[row_key("bandwidth", "copy", 0)] = (entry, status, reason and str(reason), figure)
    return out


def _rows(
    native_docs: Sequence[Mapping[str, Any]], container_docs: Sequence[Mapping[str, Any]]
) -> tuple[Row, ...]:
    native = [_entries(d) for d in native_docs]
    container = [_entries(d) for d in container_docs]
    order: dict[str, _Entry] = {}
    for per_round in (*native, *container):
        for key, (entry, *_rest) in per_round.items():
            order.setdefault(key, entry)

    def side(per_rounds: list[dict[str, Any]], key: str) -> tuple[list[float | None], str, Any]:
        values: list[float | None] = []
        status, reason = "ok", None
        for per_round in per_rounds:
            item = per_round.get(key)
            if item is None:
                values.append(None)
                if status == "ok":
                    status, reason = "absent", "not in this side's results"
                continue
            _entry, st, why, figure = item
            values.append(figure if st == "ok" else None)
            if st != "ok" and status == "ok":
                status, reason = st, why
        return values, status, reason

    rows = []
    for key, entry in order.items():
        n_values, n_status, n_reason = side(native, key)
        c_values, c_status, c_reason = side(container, key)
        rows.append(
            Row(
                dtype=entry.dtype,
                shape=entry.shape,
                kind=entry.kind,
                beta=entry.beta,
                unit=entry.unit,
                native=tuple(n_values),
                container=tuple(c_values),
                native_status=n_status,
                container_status=c_status,
                native_reason=n_reason,
                container_reason=c_reason,
            )
        )
    return tuple(rows)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _side(
    role: Role,
    command: tuple[str, ...],
    docs: Sequence[Mapping[str, Any]],
    first: Mapping[str, Any] | None,
) -> Side:
    """A side's identity from its first measured document (else its first document at all)."""
    software = dict(_software(docs[0] if docs else first))
    temps: list[float] = []
    clocks: list[float] = []
    mask: int | None = None
    others: set[int] = set()
    for doc in docs:
        busy = doc.get("busy")
        if isinstance(busy, Mapping):
            others.update(p for p in busy.get("other_pids") or () if isinstance(p, int))
        conditions = doc.get("conditions")
        if not isinstance(conditions, Mapping):
            continue
        temp = conditions.get("max_gpu_temperature_celsius")
        clock = conditions.get("mean_sm_clock_hertz")
        seen = conditions.get("clock_event_reasons_seen")
        if isinstance(temp, (int, float)):
            temps.append(float(temp))
        if isinstance(clock, (int, float)):
            clocks.append(float(clock))
        if isinstance(seen, int):
            mask = (mask or 0) | seen
    return Side(
        role=role,
        command=command,
        software=software,
        conditions={
            "max_gpu_temperature_celsius": max(temps) if temps else None,
            "mean_sm_clock_hertz": statistics.median(clocks) if clocks else None,
            "clock_event_reasons": None if mask is None else decode_reasons(mask),
            "other_pids": sorted(others),
        },
    )


def _sharing_text(native: Mapping[str, Any], container: Mapping[str, Any]) -> str | None:
    """A line when other processes computed on the GPU during the container's rounds only."""
    extra = sorted(set(container.get("other_pids") or ()) - set(native.get("other_pids") or ()))
    if not extra:
        return None
    return (
        f"another process computed on the GPU during the container's rounds (pid "
        f"{', '.join(map(str, extra))}): the two sides did not have the GPU alike; stop it and "
        "compare again (leave --probe-when at idle to have such rounds skipped)"
    )


def _throttle_text(native: Mapping[str, Any], container: Mapping[str, Any]) -> str | None:
    """A line when the container's rounds ran at clearly lower clocks or throttled."""
    parts = []
    n_clock, c_clock = native.get("mean_sm_clock_hertz"), container.get("mean_sm_clock_hertz")
    if (
        isinstance(n_clock, float)
        and isinstance(c_clock, float)
        and 0 < c_clock < CLOCK_DROP * n_clock
    ):
        parts.append(
            f"the container's rounds ran at a lower SM clock "
            f"({c_clock / 1e6:.0f} vs {n_clock / 1e6:.0f} MHz)"
        )
    n_reasons = set(native.get("clock_event_reasons") or ())
    c_reasons = set(container.get("clock_event_reasons") or ())
    new = sorted((c_reasons - n_reasons) & set(THERMAL_REASONS))
    if new:
        parts.append("only the container's rounds saw " + ", ".join(new))
    if not parts:
        return None
    return (
        " and ".join(parts)
        + ": the GPU throttled (heat or power), which is not the container's doing; let it cool, "
        "and compare again"
    )


def _side_dict(side: Side) -> dict[str, Any]:
    return {
        "command": list(side.command),
        "software": dict(side.software),
        "conditions": dict(side.conditions),
    }


def _row_dict(row: Row, max_gap: float) -> dict[str, Any]:
    return {
        "dtype": row.dtype,
        "shape": row.shape,
        "kind": row.kind,
        "beta": row.beta,
        "unit": row.unit,
        "native_median": row.native_median,
        "container_median": row.container_median,
        "ratio": row.ratio,
        "ratio_min": row.ratio_min,
        "ratio_max": row.ratio_max,
        "gap": row.gap,
        "verdict": row.verdict(max_gap),
        "noisy": row.noisy(max_gap),
        "native": list(row.native),
        "container": list(row.container),
        "native_status": row.native_status,
        "container_status": row.container_status,
        "note": row.note(),
    }
