"""The daemon's probe scheduler: a cycle every interval (with jitter), one GPU after another.

Never steals the GPU: with ``when="idle"`` a GPU that the latest telemetry shows busy (a compute
process other than sparkdiag's own worker, or utilization above the threshold) is skipped
without starting a worker, and the worker checks again before and between its kernels.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from sparkdiag.probe.baseline import BaselineStore
from sparkdiag.probe.engine import run_guarded
from sparkdiag.probe.evaluate import evaluate
from sparkdiag.probe.runner import ProbeCycle, classify, run_worker
from sparkdiag.probe.state import CycleRecord, ProbeState
from sparkdiag.telemetry.snapshot import GpuSample, Snapshot

log = logging.getLogger(__name__)


class Launcher(Protocol):
    def __call__(self, gpu: GpuSample, on_start: Callable[[int], None]) -> ProbeCycle: ...


class WorkerLauncher:
    """Runs the real worker on one GPU, chosen by uuid through CUDA_VISIBLE_DEVICES."""

    def __init__(
        self,
        python: Sequence[str],
        timeout: float,
        when: str,
        busy_utilization: float,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.python = tuple(python)
        self.timeout = timeout
        self.args = [
            "--device", "cuda:0",
            "--probe-when", when,
            "--busy-utilization", f"{busy_utilization:g}",
            *extra_args,
        ]  # fmt: skip

    def __call__(self, gpu: GpuSample, on_start: Callable[[int], None]) -> ProbeCycle:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu.identity.uuid)
        return run_worker(self.python, self.args, self.timeout, env=env, on_start=on_start)


class ContainerLauncher:
    """Runs the worker inside a container: its source goes to ``[*command, "-"]`` on standard
    input (``docker run -i --rm --gpus all IMAGE python3``), so the image needs only torch.
    With ``--gpus all`` the container sees every GPU; the worker orders CUDA devices by PCI bus
    id, so ``cuda:N`` there is NVML's GPU N here."""

    def __init__(self, command: Sequence[str], timeout: float, extra_args: Sequence[str] = ()):
        argv = list(command)
        if argv and argv[-1] == "-":
            argv.pop()  # run_worker adds the "-" itself
        if not argv:
            raise ValueError("the container command is empty")
        self.command = tuple(argv)
        self.timeout = timeout
        self.args = ["--probe-when", "always", *extra_args]

    def __call__(self, gpu: GpuSample, on_start: Callable[[int], None]) -> ProbeCycle:
        args = ["--device", f"cuda:{gpu.identity.index}", *self.args]
        return run_guarded(  # a container that outlives a timed-out cycle is killed
            self.command,
            lambda argv: run_worker(argv, args, self.timeout, stdin_script=True, on_start=on_start),
        )


class FixtureLauncher:
    """Replays worker documents recorded on real GPUs (``--probe.fixture``), one per cycle.

    The file is a worker document, or ``{"format": "sparkdiag-probe-fixture/1", "cycles":
    [doc, ...]}`` whose documents are replayed in turn, the last one repeating.
    """

    def __init__(self, path: Path) -> None:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValueError(f"cannot read probe fixture {path}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"probe fixture {path} is not valid JSON: {exc.msg}") from None
        cycles = doc.get("cycles") if isinstance(doc, dict) and "cycles" in doc else [doc]
        if not isinstance(cycles, list) or not all(isinstance(c, dict) for c in cycles):
            raise ValueError(f"probe fixture {path}: 'cycles' must be a list of worker documents")
        if not cycles:
            raise ValueError(f"probe fixture {path}: no cycles")
        self.cycles: list[dict[str, Any]] = cycles
        self.counts: dict[str, int] = {}  # per GPU uuid: each GPU replays the cycles in turn

    def __call__(self, gpu: GpuSample, on_start: Callable[[int], None]) -> ProbeCycle:
        key = gpu.identity.uuid if gpu is not None else ""
        count = self.counts.get(key, 0)
        doc = dict(self.cycles[min(count, len(self.cycles) - 1)])
        self.counts[key] = count + 1
        now = time.time()
        doc["finished_at"] = now
        result, reason = classify(0, doc, b"{}", "")
        return ProbeCycle(result, reason, doc, "", 0, 0.0, None)


class ProbeScheduler:
    def __init__(
        self,
        launcher: Launcher,
        state: ProbeState,
        store: BaselineStore | None,
        context: str,
        latest: Callable[[], Snapshot | None],
        interval: float,
        jitter: float = 0.1,
        when: str = "idle",
        busy_utilization: float = 0.1,
        first_delay: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.launcher = launcher
        self.state = state
        self.store = store
        self.context = context
        self.latest = latest
        self.interval = interval
        self.jitter = jitter
        self.when = when
        self.busy_utilization = busy_utilization
        self.first_delay = min(interval, 30.0) if first_delay is None else first_delay
        self.rng = rng or random.Random()
        self._pids: set[int] = set()
        self._pids_lock = threading.Lock()
        state.set_interval(context, interval)

    def excluded_pids(self) -> frozenset[int]:
        """The probe workers running now: not counted as other compute processes."""
        with self._pids_lock:
            return frozenset(self._pids)

    def busy_reason(self, gpu: GpuSample, snapshot: Snapshot) -> str | None:
        """Why the GPU counts as busy in the latest telemetry, or None when it is idle."""
        others = [p for p in gpu.compute_pids or () if p not in snapshot.excluded_pids]
        if others:
            return f"other compute process(es) on the GPU: pid {', '.join(map(str, others))}"
        util = gpu.utilization_ratio.get("gpu")
        if util is not None and util > self.busy_utilization:
            return f"GPU utilization {util:.0%} above {self.busy_utilization:.0%}"
        return None

    def run_cycle(self) -> list[CycleRecord]:
        snapshot = self.latest()
        if snapshot is None:
            return []
        records = []
        for gpu in snapshot.gpus:
            if not gpu.up:
                continue
            records.append(self._probe(gpu, snapshot))
        return records

    def _probe(self, gpu: GpuSample, snapshot: Snapshot) -> CycleRecord:
        ident = gpu.identity
        base = (str(ident.index), ident.uuid, self.context)
        if self.when == "idle":
            busy = self.busy_reason(gpu, snapshot)
            if busy is not None:
                record = CycleRecord(*base, result="skipped_busy", reason=busy,
                                     finished_at=time.time(), busy_seconds=None)  # fmt: skip
                self.state.record(record)
                log.info("probe GPU %d skipped: %s", ident.index, busy)
                return record

        def started(pid: int) -> None:
            with self._pids_lock:
                self._pids.add(pid)

        try:
            cycle = self.launcher(gpu, started)
        finally:
            with self._pids_lock:
                self._pids.clear()
        record = self._record(cycle, base, ident.name)
        self.state.record(record)
        level = logging.INFO if cycle.result in ("ok", "skipped_busy") else logging.WARNING
        log.log(level, "probe GPU %d: %s%s", ident.index, cycle.result,
                f" ({cycle.reason})" if cycle.reason else "")  # fmt: skip
        return record

    def _record(self, cycle: ProbeCycle, base: tuple[str, str, str], gpu_name: str) -> CycleRecord:
        doc = cycle.document or {}
        figures: tuple[Any, ...] = ()
        if cycle.result in ("ok", "error") and doc:
            try:
                figures = tuple(
                    evaluate(doc, base[1], gpu_name, self.context, self.store, record=True)
                )
            except Exception:  # a baseline-store failure must not lose the measurement
                log.exception("recording probe results failed")
                figures = tuple(evaluate(doc, base[1], gpu_name, self.context, None))
        conditions = doc.get("conditions") or {}
        temps = {
            sensor: float(value)
            for sensor, value in (
                ("gpu", conditions.get("max_gpu_temperature_celsius")),
                ("memory", conditions.get("max_memory_temperature_celsius")),
            )
            if value is not None
        }
        bandwidth = doc.get("bandwidth") or {}
        busy = doc.get("gpu_busy_seconds")
        seen = conditions.get("clock_event_reasons_seen")
        return CycleRecord(
            *base,
            result=cycle.result,
            reason=cycle.reason,
            finished_at=float(doc.get("finished_at") or time.time()),
            busy_seconds=None if busy is None else float(busy),
            figures=figures,
            bandwidth_bytes_per_second=(
                bandwidth.get("bytes_per_second") if bandwidth.get("status") == "ok" else None
            ),
            max_temperature_celsius=temps,
            clock_event_reasons_seen=None if seen is None else int(seen),
            mean_sm_clock_hertz=conditions.get("mean_sm_clock_hertz"),
            mean_power_watts=conditions.get("mean_power_watts"),
            software=dict(doc.get("software") or {}),
        )

    def next_delay(self) -> float:
        return self.interval * (1.0 + self.rng.uniform(0.0, self.jitter))

    def run(self, stop: threading.Event) -> None:
        delay = self.first_delay
        while not stop.wait(delay):
            try:
                self.run_cycle()
            except Exception:
                log.exception("probe cycle failed")
            delay = self.next_delay()
