"""The run loop of ``sparkdiag compare``, and the one way a worker runs inside a container.

:func:`compare` runs the probe worker natively (``[*native, worker.py, *args]``) and inside a
container (the container command with the worker's source on standard input, so nothing has to be
installed in the image), in alternating cycles: native, container, native, container, ... One
warm-up pair comes first and is not counted (a cold GPU runs faster for its first seconds, and
the first container start pays for caches); then ``rounds`` measured pairs. Every cycle is a fresh
process on each side, so process start-up never enters the figures (the worker times kernels).
A side that fails stops the comparison at once (a broken container is not started N times).

:func:`run_in_container` is what the daemon's container probe (``probe.container-command``) runs
too, and :func:`container_cycle` classifies a failure the way ``compare`` does.

The container command is an argument list and is never given to a shell.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import replace

from sparkdiag.probe.compare.diagnosis import diagnose, missing_runtime
from sparkdiag.probe.compare.model import (
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP_ROUNDS,
    Comparison,
    Cycle,
    Failure,
    Role,
    build_rows,
    build_side,
    figures,
)
from sparkdiag.probe.document import SCHEMA, WorkerDocument
from sparkdiag.probe.engine import run_guarded
from sparkdiag.probe.request import DEFAULT_REQUEST, WorkerRequest
from sparkdiag.probe.runner import DEFAULT_TIMEOUT, ProbeCycle, ProbeResult, run_worker

# Runs the container command, passes the worker's source through on standard input (inherited),
# and forwards to its own standard output only the worker's JSON document, the last line that is
# one; anything the image printed around it (the NGC entrypoint prints its banner on standard
# output) goes to standard error. Output without such a line is forwarded unchanged, so that it
# is still reported as "not the worker's JSON". It runs in the worker's process group: the
# runner's timeout kills it together with the container command and whatever that started; and
# should sparkdiag itself die (kill -9), the relay sees its parent change and ends its group
# (SIGTERM first, which docker and podman pass on to the container; SIGKILL 5 s later).
_RELAY = r"""
import json, os, selectors, signal, subprocess, sys, time
SCHEMA, cmd = sys.argv[1], sys.argv[2:]
parent = os.getppid()
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
    if os.getppid() != parent:  # sparkdiag died (kill -9): end the whole group, relay last
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(0, signal.SIGTERM)
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        os.killpg(0, signal.SIGKILL)
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
        if isinstance(doc, dict) and doc.get("schema") == SCHEMA:
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


def run_in_container(
    command: Sequence[str],
    request: WorkerRequest,
    timeout: float,
    kill_grace: float = 2.0,
    on_start: Callable[[int], None] | None = None,
) -> ProbeCycle:
    """One worker cycle inside the container: its source on standard input, through the relay
    that keeps only the worker's document on standard output; a container that outlives an
    abandoned cycle is stopped (engine.run_guarded)."""

    def relayed(argv: Sequence[str]) -> ProbeCycle:
        relay = (sys.executable, "-I", "-c", _RELAY, SCHEMA, *argv)
        return run_worker(
            relay,
            request,
            timeout=timeout,
            stdin_script=True,
            kill_grace=kill_grace,
            on_start=on_start,
        )

    return run_guarded(container_command(command), relayed)


def container_cycle(
    command: Sequence[str],
    request: WorkerRequest,
    timeout: float,
    on_start: Callable[[int], None] | None = None,
) -> ProbeCycle:
    """:func:`run_in_container`, its failure (if any) said as ``compare`` says it: the reason of
    a cycle that cannot be used is the diagnosis (image missing, no GPU inside, ...)."""
    argv = container_command(command)
    missing = missing_runtime(argv)
    if missing is not None:
        return ProbeCycle("error", missing.message, None, "", None, 0.0, None)
    cycle = run_in_container(argv, request, timeout, on_start=on_start)
    failure = diagnose("container", cycle, argv, timeout, "container probe")
    if failure is None or cycle.result == "skipped_busy":
        return cycle
    result: ProbeResult = "timeout" if failure.kind == "timeout" else "error"
    return replace(cycle, result=result, reason=failure.message)


def compare(
    container: Sequence[str],
    native: Sequence[str] = (sys.executable,),
    rounds: int = DEFAULT_ROUNDS,
    request: WorkerRequest = DEFAULT_REQUEST,
    timeout: float = DEFAULT_TIMEOUT,
    on_progress: Callable[[str], None] | None = None,
    warmup_rounds: int = DEFAULT_WARMUP_ROUNDS,
    kill_grace: float = 2.0,
) -> Comparison:
    """Run the probe natively and in the container alternately and compare the figures.

    ``container`` is the argument list that starts Python inside the container and reads a
    script from standard input (a trailing ``-`` is optional, see :func:`container_command`);
    the worker's source is written to its standard input. ``native`` is the native interpreter
    command; it runs the worker file. Both are injectable, which the tests use. ``request``
    goes to both sides; when it names no device, the container gets the device the native
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
    container_request = request if request.device is not None else None
    progress = on_progress or (lambda _message: None)

    cycles: list[Cycle] = []
    failures: list[Failure] = []
    measured: dict[Role, list[WorkerDocument]] = {"native": [], "container": []}
    first: dict[Role, WorkerDocument] = {}  # each side's first document, failed or not
    native_doc: WorkerDocument | None = None

    missing = missing_runtime(container_cmd)
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
                cycle = run_worker(native_cmd, request, timeout=timeout, kill_grace=kill_grace)
                command = native_cmd
            else:
                if container_request is None:
                    device = native_doc.software.device if native_doc else None
                    container_request = request.on_device(device) if device else request
                    if device:
                        progress(f"both sides probe {device} (the device native chose)")
                cycle = run_in_container(container_cmd, container_request, timeout, kill_grace)
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
                    figures=figures(cycle.document),
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
    rows = build_rows(measured["native"][:pairs], measured["container"][:pairs])
    return Comparison(
        native=build_side("native", native_cmd, measured["native"], first.get("native")),
        container=build_side(
            "container", container_cmd, measured["container"], first.get("container")
        ),
        rows=rows,
        cycles=tuple(cycles),
        failures=tuple(failures),
        rounds=rounds,
        warmup_rounds=warmup_rounds,
        worker_args=tuple(request.argv()),
        container_args=tuple((container_request or request).argv()),
    )
