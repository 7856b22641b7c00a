"""The daemon's container probe (``probe.container-command``): the worker in a container, run
the one way :mod:`sparkdiag.probe.container` runs it, and a failing container said the way
``sparkdiag compare`` says it (image missing, no GPU inside, ...)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from sparkdiag.compare.causes import diagnose, missing_runtime
from sparkdiag.probe.container import container_command, run_in_container
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.probe.runner import ProbeCycle, ProbeResult
from sparkdiag.snapshot import GpuSample


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


class ContainerLauncher:
    """Runs the worker inside a container, exactly as ``sparkdiag compare`` does: its source goes
    to ``[*command, "-"]`` on standard input (``docker run -i --rm --gpus all IMAGE python3``),
    so the image needs only torch, and a failing container is diagnosed the same way (image
    missing, no GPU inside, ...). With ``--gpus all`` the container sees every GPU; the worker
    orders CUDA devices by PCI bus id, so ``cuda:N`` there is NVML's GPU N here."""

    def __init__(self, command: Sequence[str], timeout: float, request: WorkerRequest) -> None:
        argv = list(command)
        if argv and argv[-1] == "-":
            argv.pop()  # the runner adds the "-" itself
        if not argv:
            raise ValueError("the container command is empty")
        self.command = tuple(argv)
        self.timeout = timeout
        self.request = replace(request, probe_when="always")

    def __call__(self, gpu: GpuSample, on_start: Callable[[int], None]) -> ProbeCycle:
        request = self.request.on_device(f"cuda:{gpu.identity.index}")
        return container_cycle(self.command, request, self.timeout, on_start=on_start)
