"""The run loop of ``sparkdiag compare``.

:func:`compare` runs the probe worker natively (``[*native, probe/worker, *args]``) and inside a
container (the container command with the worker's source on standard input, so nothing has to be
installed in the image), in alternating cycles: native, container, native, container, ... One
warm-up pair comes first and is not counted (a cold GPU runs faster for its first seconds, and
the first container start pays for caches); then ``rounds`` measured pairs. Every cycle is a fresh
process on each side, so process start-up never enters the figures (the worker times kernels).
A side that fails stops the comparison at once (a broken container is not started N times).

The container side runs through :func:`sparkdiag.probe.container.run_in_container`, as the daemon's
container probe does (:class:`sparkdiag.probe.launchers.ContainerLauncher`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from sparkdiag.compare.model import (
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP_ROUNDS,
    Comparison,
    Cycle,
    build_rows,
    build_side,
    figures,
)
from sparkdiag.probe.container import container_command, run_in_container
from sparkdiag.probe.diagnosis import Failure, Role, diagnose, missing_runtime
from sparkdiag.probe.document import WorkerDocument
from sparkdiag.probe.request import DEFAULT_REQUEST, WorkerRequest
from sparkdiag.probe.runner import DEFAULT_TIMEOUT, run_worker


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
    interrupted: str | None = None
    try:
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

    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM or SIGHUP (lifecycle.Interrupted)
        # the side running was killed with its process group on the way out; the pairs
        # measured before are kept and reported (they were lost: the hostile review)
        interrupted = getattr(exc, "signal_name", None) or "SIGINT"

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
        interrupted=interrupted,
    )
