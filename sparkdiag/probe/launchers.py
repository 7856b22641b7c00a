"""Launchers: how one probe cycle on one GPU is run (the real worker, in a container, replayed).

A launcher is called with the GPU and an ``on_start(pid)`` callback (so that the daemon keeps its
own worker out of the busy checks) and returns the cycle. The daemon's scheduler, ``probe`` and
``check`` all run their cycles through one of these.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from sparkdiag.errors import UsageError
from sparkdiag.probe.document import DocumentError, WorkerDocument, parse_document
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.probe.runner import ProbeCycle, ProbeResult, classify, run_worker
from sparkdiag.snapshot import GpuSample
from sparkdiag.sources.files import MIB, read_text_limited

log = logging.getLogger(__name__)


class ProbeFixtureError(UsageError, ValueError):
    """A ``--probe.fixture`` file cannot be replayed; the message names the file and why."""

    flag = "--probe.fixture"


class Launcher(Protocol):
    def __call__(self, gpu: GpuSample, on_start: Callable[[int], None]) -> ProbeCycle: ...


def pinned_env(uuid: str) -> dict[str, str]:
    """This process's environment with only the GPU ``uuid`` visible to CUDA (as ``cuda:0``)."""
    return dict(os.environ, CUDA_VISIBLE_DEVICES=uuid)


class WorkerLauncher:
    """Runs the real worker on one GPU, chosen by uuid through CUDA_VISIBLE_DEVICES."""

    def __init__(self, python: Sequence[str], timeout: float, request: WorkerRequest) -> None:
        self.python = tuple(python)
        self.timeout = timeout
        self.request = request if request.device is not None else request.on_device("cuda:0")

    def __call__(self, gpu: GpuSample, on_start: Callable[[int], None]) -> ProbeCycle:
        env = pinned_env(gpu.identity.uuid)
        return run_worker(self.python, self.request, self.timeout, env=env, on_start=on_start)


class FixtureLauncher:
    """Replays worker documents recorded on real GPUs (``--probe.fixture``), one per cycle.

    The file is a worker document, or ``{"format": "sparkdiag-probe-fixture/1", "cycles":
    [doc, ...]}`` whose documents of ``suite`` (the worker's ``suite``; a document without one
    is of the default suite) are replayed in turn, the last one repeating. A GPU whose uuid some
    documents name (``software.gpu_uuid``) replays those only, so that one file can give each
    GPU of a node its own figures; a GPU no document names replays them all. Raises
    :class:`ProbeFixtureError` (naming the file) when it cannot be used or holds no document of
    that suite.
    """

    def __init__(self, path: Path, suite: str = "default") -> None:
        try:
            doc = json.loads(read_text_limited(path, 16 * MIB))
        except OSError as exc:
            raise ProbeFixtureError(f"cannot read {path}: {exc.strerror or exc}") from None
        except (ValueError, RecursionError) as exc:
            raise ProbeFixtureError(f"{path} is not valid JSON: {exc}") from None
        cycles = doc.get("cycles") if isinstance(doc, dict) and "cycles" in doc else [doc]
        if not isinstance(cycles, list):
            raise ProbeFixtureError(f"{path}: 'cycles' must be a list of worker documents")
        if not cycles:
            raise ProbeFixtureError(f"{path}: no cycles")
        try:
            documents = [parse_document(c) for c in cycles]
        except DocumentError as exc:
            raise ProbeFixtureError(f"{path}: not a worker document: {exc}") from None
        self.cycles: list[WorkerDocument] = [
            d for d in documents if (d.suite or "default") == suite
        ]
        if not self.cycles:
            raise ProbeFixtureError(f"{path}: no cycle of the {suite} suite")
        self.counts: dict[str, int] = {}  # per GPU uuid: each GPU replays the cycles in turn
        self.path = path

    def __call__(self, gpu: GpuSample | None, on_start: Callable[[int], None]) -> ProbeCycle:
        key = gpu.identity.uuid if gpu is not None else ""
        count = self.counts.get(key, 0)
        cycles = [d for d in self.cycles if key and d.software.gpu_uuid == key] or self.cycles
        doc = replace(cycles[min(count, len(cycles) - 1)], finished_at=time.time())
        if count == 0 and gpu is not None:
            self._say_other_gpu(gpu, doc)
        self.counts[key] = count + 1
        result, reason = classify(0, doc, b"{}", "")
        return ProbeCycle(result, reason, doc, "", 0, 0.0, None)

    def _say_other_gpu(self, gpu: GpuSample, doc: WorkerDocument) -> None:
        """Figures recorded on one GPU model replayed for another (an H200 probe fixture beside a
        GB10 NVML fixture) are judged against the other's references and baselines: said once
        per GPU, as the figures are still used."""
        recorded = doc.software.gpu_name
        if recorded and gpu.identity.name and recorded != gpu.identity.name:
            log.warning(
                "probe fixture %s was recorded on %s, replayed for GPU %d (%s): its figures "
                "are judged against that GPU's references and baselines",
                self.path,
                recorded,
                gpu.identity.index,
                gpu.identity.name,
            )


def container_cycle(
    command: Sequence[str],
    request: WorkerRequest,
    timeout: float,
    on_start: Callable[[int], None] | None = None,
) -> ProbeCycle:
    """:func:`run_in_container`, its failure (if any) said as ``compare`` says it: the reason of
    a cycle that cannot be used is the diagnosis (image missing, no GPU inside, ...)."""
    # only a container probe needs these: the native daemon does not load them
    from sparkdiag.probe.container import container_command, run_in_container
    from sparkdiag.probe.diagnosis import diagnose, missing_runtime

    argv = container_command(command)
    missing = missing_runtime(argv)
    if missing is not None:
        return ProbeCycle("error", missing.message, None, "", None, 0.0, None)
    cycle = run_in_container(argv, request, timeout, on_start=on_start)
    if cycle.result == "timeout" and cycle.returncode is None:
        # the runner could not kill it (stuck in the driver?): its own reason says so, where the
        # diagnosis would say it was killed
        return cycle
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
        cycle = container_cycle(self.command, request, self.timeout, on_start=on_start)
        return other_gpu(cycle, gpu.identity.uuid)


def other_gpu(cycle: ProbeCycle, uuid: str) -> ProbeCycle:
    """``cycle`` as an error where the worker ran on another GPU than ``uuid``: a container
    that sees only some GPUs (``--gpus device=3``, CUDA_VISIBLE_DEVICES in the image) numbers
    them from 0, so ``cuda:N`` there was another GPU, whose figures went into this GPU's series
    and its container-against-native gap (found in a review)."""
    doc = cycle.document
    ran = doc.software.gpu_uuid if doc is not None else None
    if cycle.result != "ok" or not ran or not uuid or ran == uuid:
        return cycle
    return replace(
        cycle,
        result="error",
        reason=(
            f"the container's worker ran on {ran}, not on {uuid}: the container sees other "
            "GPUs than NVML numbers here (--gpus device=..., CUDA_VISIBLE_DEVICES in the "
            "image); give it every GPU (--gpus all) or the probe one container per GPU"
        ),
    )
