"""The soak (``--soak-seconds``): sustained bf16 matmuls, a measurement window of the suite's
kernels before the load and every ``--window-seconds`` during it, and the stops (a thermal
margin, a hardware slowdown, SIGINT or SIGTERM, an error) that always leave the GPU idle."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from sparkdiag.probe.worker.contract import SUITES, shape_label
from sparkdiag.probe.worker.dtypes import DeviceInfo, classify_exception
from sparkdiag.probe.worker.kernels import KernelRun, time_runs
from sparkdiag.probe.worker.log import log, progress
from sparkdiag.probe.worker.nvml import (
    HW_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    ConditionSampler,
    Nvml,
    summarize_conditions,
)
from sparkdiag.probe.worker.output import decode_ratios
from sparkdiag.probe.worker.plan import SMALL_COMPUTE, Budget, compute_cube, plan_groups, plan_suite
from sparkdiag.probe.worker.timing import spin_up

FALLBACK_GPU_LIMIT_CELSIUS = 85.0  # when NVML gives no slowdown threshold


class StopRequest:
    """Set by SIGINT, SIGTERM or SIGHUP during a soak; the loop stops cleanly at its next check."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        try:
            self.signal_name = signal.Signals(signum).name
        except ValueError:
            self.signal_name = f"signal {signum}"

    @property
    def requested(self) -> bool:
        return self.signal_name is not None


@contextlib.contextmanager
def stop_on_signals(stop: StopRequest) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP set ``stop`` instead of ending the process (main thread
    only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # soak passes SIGHUP on as such
    before = {sig: signal.signal(sig, stop) for sig in stops}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def soak_thresholds(nvml: Nvml | None) -> dict[str, float | None]:
    """The limits the soak stays a margin below: NVML's, else a fixed GPU limit."""
    found = nvml.thresholds() if nvml is not None else {}
    gpu = found.get("gpu_slowdown_celsius")
    return {
        "gpu_slowdown_celsius": gpu if gpu else (FALLBACK_GPU_LIMIT_CELSIUS if nvml else None),
        "memory_max_celsius": found.get("memory_max_celsius"),
    }


def soak_stop_reason(
    sample: dict[str, float | int | None], limits: dict[str, float | None], margin: float
) -> tuple[str, str] | None:
    """Why a soak must stop at this NVML sample, or None: (stopped, one-line reason)."""
    reasons = sample.get("reasons")
    if reasons is not None:
        if int(reasons) & HW_THERMAL_SLOWDOWN:
            return (
                "hw_thermal_slowdown",
                f"hardware thermal slowdown (clock event reasons {int(reasons):#x})",
            )
        if int(reasons) & HW_SLOWDOWN:
            return "hw_slowdown", f"hardware slowdown (clock event reasons {int(reasons):#x})"
    for key, limit_key, what, limit_name in (
        ("gpu_temperature", "gpu_slowdown_celsius", "GPU", "slowdown threshold"),
        ("memory_temperature", "memory_max_celsius", "memory", "maximum operating temperature"),
    ):
        value, limit = sample.get(key), limits.get(limit_key)
        if value is not None and limit is not None and float(value) >= limit - margin:
            return "threshold", (
                f"{what} {float(value):.0f} °C within {margin:g} °C of its {limit_name} "
                f"{limit:.0f} °C"
            )
    return None


class SoakLoad:
    """Sustained bf16 matmuls on one cube, in chunks that end with a synchronize."""

    def __init__(self, info: DeviceInfo, edge: int) -> None:
        torch = info.torch
        self.info = info
        self.edge = edge
        self.a = torch.randn(edge, edge, device=info.device, dtype=torch.bfloat16)
        self.b = torch.randn(edge, edge, device=info.device, dtype=torch.bfloat16)
        self.out = torch.empty(edge, edge, device=info.device, dtype=torch.bfloat16)
        self.per_iteration = 0.0  # seconds, measured
        self.iterations = 0
        self.seconds = 0.0

    def chunk(self, seconds: float) -> float:
        """About ``seconds`` of matmuls (at least one); returns the seconds they took."""
        torch = self.info.torch
        count = 1 if self.per_iteration <= 0 else max(1, int(seconds / self.per_iteration))
        t0 = time.perf_counter()
        for _ in range(count):
            torch.mm(self.a, self.b, out=self.out)
        if self.info.is_cuda:
            torch.cuda.synchronize()
        spent = time.perf_counter() - t0
        self.per_iteration = spent / count
        self.iterations += count
        self.seconds += spent
        return spent

    @property
    def work(self) -> float:
        return 2.0 * self.edge**3

    def summary(self) -> dict[str, Any]:
        rate = self.work * self.iterations / self.seconds / 1e12 if self.seconds > 0 else None
        return {
            "dtype": "bf16",
            "shape": shape_label(self.edge, self.edge, self.edge),
            "iterations": self.iterations,
            "seconds": self.seconds,
            "delivered": rate,
        }

    def release(self) -> None:
        self.a = self.b = self.out = None


class Soak:
    """Sustained load with a measurement window every ``window_seconds`` (see run_soak)."""

    def __init__(
        self,
        info: DeviceInfo,
        args: argparse.Namespace,
        nvml: Nvml | None,
        small: bool,
        stop: StopRequest,
    ) -> None:
        self.info = info
        self.args = args
        self.stop = stop
        self.sampler = ConditionSampler(nvml)
        self.limits = soak_thresholds(nvml)
        self.busy = 0.0
        self.groups: list[list[KernelRun]] = []
        self.plans: list[dict[int, list[int]] | None] = []
        self.load: SoakLoad | None = None
        self.checked = 0  # samples already checked for a reason to stop
        self.window_start = 0  # first sample of the running window's load period
        self.load_before = (0, 0.0)  # load iterations and seconds before this period
        if args.soak_load_edge:
            self.edge = args.soak_load_edge
        elif small or not info.is_cuda:
            self.edge = SMALL_COMPUTE[0]
        else:
            self.edge = compute_cube(info.capability or (0, 0), info.sm_count)
        self.section: dict[str, Any] = {
            "seconds": args.soak_seconds,
            "window_seconds": args.window_seconds,
            "margin_celsius": args.soak_margin_celsius,
            "thresholds": self.limits,
            "load": None,
            "windows": [],
            "stopped": None,
            "reason": None,
            "elapsed_seconds": 0.0,
        }

    def setup(self, small: bool) -> None:
        suite = SUITES[self.args.suite]
        specs = plan_suite(self.info, self.args.dtype, small, self.args.shape, suite.kinds)
        budget = Budget(self.args.budget_seconds, len(specs))
        for group in plan_groups(specs, suite.together):
            runs = [KernelRun(self.info, spec, self.args, budget) for spec in group]
            for run in runs:
                spec = run.spec
                log(f"soak: {spec.dtype} {spec.kind} {spec.m_candidates[0]}x{spec.n}x{spec.k}")
                run.setup()
            self.groups.append(runs)
            self.plans.append(None)
        self.load = SoakLoad(self.info, self.edge)

    def check(self) -> tuple[str, str | None] | None:
        """A reason to stop: a signal, or a sample taken since the last check."""
        if self.stop.requested:
            return "interrupted", f"{self.stop.signal_name} received"
        samples = self.sampler.samples
        end = len(samples)
        for sample in samples[self.checked : end]:
            why = soak_stop_reason(sample, self.limits, self.args.soak_margin_celsius)
            if why is not None:
                self.checked = end
                return why
        self.checked = end
        return None

    def window(self, index: int, phase: str, elapsed: float) -> dict[str, Any]:
        """Measure every kernel that set up, in the groups and rounds of the suite."""
        load_samples = self.sampler.samples[self.window_start :]
        self.sampler.take()
        first = len(self.sampler.samples)
        budget = Budget(self.args.budget_seconds, 0)
        budget.weight_left = sum(
            self.args.kind_weights.get(run.spec.kind, 1.0)
            for runs in self.groups
            for run in runs
            if run.ready
        )
        results: list[dict[str, Any]] = []
        for g, runs in enumerate(self.groups):
            live = [i for i, run in enumerate(runs) if run.ready]
            for run in runs:
                run.budget = budget
                run.reset_timing()
            rounds = self.args.rounds if len(runs) > 1 else 1
            self.plans[g] = time_runs(runs, live, self.args, budget, rounds, self.plans[g])
            for run in runs:
                if run.ready:
                    budget.done(self.args.kind_weights.get(run.spec.kind, 1.0))
                results.append(run.summary())
        self.busy += budget.busy
        self.sampler.take()
        load = self.load
        done_iters, done_seconds = self.load_before
        load_rate = None
        if load is not None and load.seconds > done_seconds:
            load_rate = (
                load.work * (load.iterations - done_iters) / (load.seconds - done_seconds) / 1e12
            )
            self.load_before = (load.iterations, load.seconds)
        window = {
            "index": index,
            "phase": phase,
            "elapsed_seconds": elapsed,
            "results": results,
            "ratios": decode_ratios(results),
            "conditions": summarize_conditions(self.sampler.samples[first - 1 :]),
            "load_conditions": summarize_conditions(load_samples) if phase == "load" else None,
            "load_delivered": load_rate,
        }
        self.window_start = len(self.sampler.samples)
        self.section["windows"].append(window)
        progress({"soak_window": window})
        return window

    def loop(self) -> None:
        args = self.args
        section = self.section
        why: tuple[str, str | None] | None = self.check()
        if why is None:
            if self.info.is_cuda and args.spinup_ms > 0:
                self.busy += spin_up(self.info, args.spinup_ms)
            self.window(0, "cold", 0.0)
        started = time.monotonic()
        deadline = started + args.soak_seconds
        next_window = started + args.window_seconds
        index = 1
        while why is None:
            why = self.check()
            if why is not None:
                break
            now = time.monotonic()
            if now >= next_window or now >= deadline:
                self.window(index, "load", now - started)
                index += 1
                next_window = max(next_window + args.window_seconds, time.monotonic())
                if now >= deadline:
                    why = ("completed", None)
                continue
            assert self.load is not None
            chunk = min(args.soak_chunk_ms / 1e3, min(next_window, deadline) - now)
            self.busy += self.load.chunk(max(chunk, 0.0))
            section["elapsed_seconds"] = time.monotonic() - started
        section["stopped"], section["reason"] = why
        section["elapsed_seconds"] = time.monotonic() - started

    def close(self) -> None:
        """Leave the GPU idle: nothing queued, every buffer freed."""
        torch = self.info.torch
        if self.info.is_cuda:
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
        if self.load is not None:
            self.section["load"] = self.load.summary()
            self.load.release()
            self.load = None
        for runs in self.groups:
            for run in runs:
                run.release()
        self.groups.clear()
        if self.info.is_cuda:
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
                torch.cuda.empty_cache()


def run_soak(
    info: DeviceInfo,
    args: argparse.Namespace,
    nvml: Nvml | None,
    doc: dict[str, Any],
    small: bool,
    stop: StopRequest,
) -> None:
    """Sustained bf16 load for ``--soak-seconds``, measuring the suite's kernels (hot by
    default) in a window before the load and every ``--window-seconds`` during it.

    Each window prints one progress line (``{"soak_window": {...}}``): elapsed seconds, every
    kernel's result (delivered), the int4 ratios, and the NVML conditions of the measurement
    and of the load period before it. The soak stops a margin below the GPU's slowdown and the
    memory's maximum temperature, on a hardware (thermal) slowdown, on SIGINT or SIGTERM, and
    on an error; whatever the way out, the GPU is left idle and the document says why it
    stopped (``soak.stopped``: completed, threshold, hw_thermal_slowdown, hw_slowdown,
    interrupted, error).
    """
    soak = Soak(info, args, nvml, small, stop)
    doc["soak"] = soak.section
    if info.is_cuda and nvml is None:
        soak.section["stopped"] = "error"
        soak.section["reason"] = (
            "a soak needs NVML to watch the temperatures (install nvidia-ml-py in this Python)"
        )
        doc["status"], doc["reason"] = "error", soak.section["reason"]
        return
    soak.sampler.start()
    try:
        soak.setup(small)
        soak.loop()
    except Exception as exc:
        soak.section["stopped"] = "error"
        soak.section["reason"] = classify_exception(exc)[1]
    finally:
        soak.close()
        doc["conditions"] = soak.sampler.stop()
        doc["gpu_busy_seconds"] = soak.busy
    if soak.section["stopped"] == "error":
        doc["status"], doc["reason"] = "error", f"soak failed: {soak.section['reason']}"
    else:
        doc["status"], doc["reason"] = "ok", None
