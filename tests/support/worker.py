"""What the probe worker's tests share: running the real worker, a CPU device, a simulated GPU.

The rooms of ``sparkdiag/probe/worker/`` are tested as the modules they are; the worker as a
whole is run as the one script it is sent as (``python3 sparkdiag/probe/worker``: its
``__main__.py`` assembles it), so every end-to-end test runs what a probe cycle runs.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from sparkdiag.probe.runner import worker_path
from sparkdiag.probe.worker.cli import ASSUMED_L2_BYTES
from sparkdiag.probe.worker.contract import PROGRESS_PREFIX
from sparkdiag.probe.worker.dtypes import DeviceInfo, torch_version_tuple
from tests.support import run_python

WORKER = worker_path()
CPU_ARGS = ["--small", "--device", "cpu", "--budget-seconds", "0.5"]
SOAK_ARGS = ["--device", "cpu", "--small", "--window-seconds", "0.5"]


def run_worker(
    args: list[str], timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run the worker, which must exit 0; the process and its document (read here, independent
    of the runner's schema check)."""
    proc = run_python(WORKER, *args, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc: dict[str, Any] = json.loads(proc.stdout)
    return proc, doc


def worker_document(args: list[str], timeout: float = 120) -> dict[str, Any]:
    """The document of a worker run that exits 0."""
    return run_worker(args, timeout)[1]


def progress_lines(stderr: str) -> list[dict[str, Any]]:
    """The JSON objects of the worker's progress lines."""
    return [
        json.loads(line[len(PROGRESS_PREFIX) :])
        for line in stderr.splitlines()
        if line.startswith(PROGRESS_PREFIX)
    ]


def cpu_info() -> DeviceInfo:
    """The CPU as the worker opens it; the test is skipped where torch is not installed."""
    torch = pytest.importorskip("torch")

    return DeviceInfo(
        torch=torch,
        device="cpu",
        is_cuda=False,
        capability=None,
        sm_count=0,
        l2_bytes=ASSUMED_L2_BYTES,
        torch_version=torch_version_tuple(torch.__version__),
    )


class SimulatedStream:
    """A CUDA stream as a timeline in milliseconds: what the GPU branch of time_batch sees."""

    def __init__(self) -> None:
        self.t = 0.0
        self.synchronized = 0
        self.slept_cycles: list[int] = []
        self.records = 0
        self.slices: dict[int, float] = {}  # record number -> ms the GPU is away before it
        self.captured: list[float] | None = None  # kernels captured into a graph, not run

    def run(self, ms: float) -> None:
        if self.captured is not None:
            self.captured.append(ms)
        else:
            self.t += ms


class SimulatedCuda:
    def __init__(self, stream: SimulatedStream) -> None:
        self.stream = stream
        outer = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.t: float | None = None

            def record(self) -> None:
                stream = outer.stream
                stream.run(stream.slices.get(stream.records, 0.0))
                stream.records += 1
                self.t = stream.t

            def elapsed_time(self, other: Event) -> float:
                assert self.t is not None and other.t is not None
                return other.t - self.t

        class CUDAGraph:
            def __init__(self) -> None:
                self.kernels: list[float] = []
                self.replays = 0
                self.was_reset = False

            def replay(self) -> None:
                self.replays += 1
                for ms in self.kernels:
                    outer.stream.run(ms)

            def reset(self) -> None:
                self.was_reset = True

        @contextlib.contextmanager
        def graph(g: CUDAGraph) -> Iterator[None]:
            outer.stream.captured = g.kernels
            try:
                yield
            finally:
                outer.stream.captured = None
            outer.graphs.append(g)

        self.Event = Event
        self.CUDAGraph = CUDAGraph
        self.graph = graph
        self.graphs: list[Any] = []

    def _sleep(self, cycles: int) -> None:
        self.stream.slept_cycles.append(cycles)
        self.stream.run(cycles / 1e9 * 1e3)  # the simulated GPU runs at 1 GHz

    def synchronize(self) -> None:
        self.stream.synchronized += 1


def simulated_gpu(l2_bytes: int = 0) -> tuple[DeviceInfo, SimulatedStream, SimulatedCuda]:
    """An H200-like device (cc 9.0, 132 SMs, 1 GHz) whose torch is only a simulated CUDA."""
    stream = SimulatedStream()
    cuda = SimulatedCuda(stream)
    fake_torch = type("FakeTorch", (), {"cuda": cuda})()
    info = DeviceInfo(fake_torch, "cuda:0", True, (9, 0), 132, l2_bytes, (2, 11), 1e9)
    return info, stream, cuda
