"""sparkdiag GEMM and memory-bandwidth probe worker.

This file is deliberately self-contained: at module level it imports only the
standard library; torch is imported inside functions and pynvml is optional.
It never imports the sparkdiag package, so it can be run as a file or fed to
any Python interpreter that has torch on standard input::

    python3 worker.py --device cuda:0
    python3 - --device cuda:0 < worker.py          # e.g. inside a container

It prints exactly one JSON document (schema ``sparkdiag-probe/2``) on
standard output; everything else (torch warnings, diagnostics) goes to
standard error. The exit status is 0 whenever the document was printed, even
when kernels were unsupported or failed their correctness check; it is
non-zero only when the worker itself broke (it still tries to print a
document with status "error" and the traceback as the reason).

The method follows mamf-finder: normal random inputs (never zeros), warm-up
iterations, CUDA events around every iteration, input buffers rotated beyond
the L2 cache for memory-bound (decode) shapes, and a correctness spot check of
every kernel against a float64 reference so a broken kernel can never look
fast.

Suites (``--suite``; SUITES holds each one's defaults, explicit arguments win)
-------------------------------------------------------------------------------
- ``default``: the periodic probe. Every dtype at the compute-bound cube (bf16
  also with beta=1), the LLM shape 4096x11008x4096 and a decode shape (M=1),
  one batch per kernel in dtype order, then the device copy; 150 ms spin-up,
  2 s of GPU time; skips a GPU another process computes on.
- ``hot``: the short probe for a hot or busy GPU. Decode and LLM shapes of
  int4, bf16, fp16, fp8 and nvfp4 (unsupported ones say why), about 100 ms of
  GPU time, no spin-up, measured even when the GPU is busy. The decode
  kernels are set up and warmed up together, then timed in interleaved rounds
  (rotated order), so int4 against bf16/fp16 (``ratios``, from the median
  iterations) is one comparison under the same conditions: contention leaves
  a decode kernel's median iteration alone, the heat that collapses 4-bit
  GEMMs slows int4's.
- ``check``: what ``sparkdiag check`` judges: bf16, fp16 and int4 at every
  shape, the decode kernels interleaved as in ``hot``, 1 s of GPU time.

Host-device copies (``transfers``; on in the default and check suites,
``--no-transfers`` to leave out): pinned and pageable host memory, 200 copies
of 64 KiB and 2 of 256 MiB, host to device and back, each kind's data checked
once; ``delivered`` in bytes/s over the total time of the copy loop, launch
cost included, as an application sees it. They run first, so their GPU time
is paid before the kernels share the rest of the budget. On a discrete GPU
they measure the PCIe link (Gen5 x16: 64 GB/s per direction in theory); on
GB10 small pageable copies were reported ~50x slower than pinned. With
``--device cpu`` they are reported unsupported.

Soak (``--soak-seconds S``, ``--window-seconds W``): sustained bf16 matmuls on
the compute cube for S seconds, and a measurement window of the hot suite's
kernels before the load (cold) and every W seconds during it (set up once,
same iteration counts in every window). Each window prints one progress line
``{"soak_window": {...}}`` with the elapsed seconds, every kernel's result,
the int4 ratios and the NVML conditions of the measurement and of the load
period before it; the document's ``soak`` section holds all windows and why
the soak stopped: ``completed``, ``threshold`` (a margin below the GPU's
slowdown threshold or the memory's maximum temperature, read from NVML),
``hw_thermal_slowdown`` (reason 0x40), ``hw_slowdown`` (0x8),
``interrupted`` (SIGINT or SIGTERM) or ``error``. On every way out the GPU
is synchronized and every buffer freed before the document is printed.

Every result has the same keys whatever the suite; ``gpu_busy_seconds`` is
the GPU time of the copies, the spin-up, warm-ups and timed batches, gaps
included (not the setup, the one untimed call each kernel's correctness check
makes, nor the sleep that holds the stream while a batch is enqueued).

Delivered and peak
------------------
Each kernel is timed in one batch of back-to-back iterations. Two figures come
from it (TFLOPS, TOPS for int8 and int4: DtypeSpec.unit; bytes/s for the device copy):

- ``delivered``: the work of all iterations over the batch's total elapsed
  time, from one CUDA event before the first iteration to one after the last,
  gaps included. It is what a user of a shared or time-sliced GPU gets, and
  what efficiency, baselines and alerts use. On an H200 beside a process
  running a bf16 8192^3 loop it fell to 0.40-0.51 of idle, where the median
  of short kernels did not move at all (they run whole inside their time
  slices). A batch must itself outlast a time slice: batches of 8 ms and
  less read 0.98-1.00 of idle there, so on a GPU every batch lasts at least
  ``--min-batch-ms`` (30) whatever its share of the budget.
- ``peak``: the work of one iteration over the median iteration time,
  comparable with mamf-finder.

So that the batch measures the GPU and not Python, the stream is first held
by a sleep kernel long enough for the CPU to enqueue the whole batch
(LaunchModel, ``--launch-us``, ``--max-prequeue-ms``); ``queued_ahead`` in a
result says whether it was. That is not enough for decode kernels of 20-30 us,
which Python launches barely faster than the GPU runs them (fp8 and int4
decode lost 13-25 % of an idle H200 to launch gaps in 30 ms batches): on a
GPU each decode batch is captured as a CUDA graph (an eighth of it, replayed
until the batch lasts the floor) and timed between two events (``--graphs``,
``timing: graph`` in the result); its median and peak come from a short
event-timed batch run beside it, whose per-iteration events make the peak of
a decode kernel read low (idle on the H200, delivered 1.01-1.14x peak). On
CPU both figures come from perf_counter, and the total encloses every
iteration.

Spread of a total-time figure on a power-capped GPU
---------------------------------------------------
The total is a mean over the batch: unlike the median it counts every slow
iteration, so its cycle-to-cycle spread depends on what the batch spans.

1. Long enough in time, not in count. Under a bf16 or fp8 8192^3 load an
   H200 runs into its power cap (sw_power_cap) and the controller moves the
   SM clock over tens of milliseconds; a batch that spans several of its
   swings averages over the same mixture every cycle. The budget is shared
   by weight (``--kind-weights``, default compute 4, llm 1.5, decode 0.5,
   bandwidth 1) so compute-bound kernels get the longest batches;
   ``--budget-fraction`` is the part of ``--budget-seconds`` planned for.
2. Short kernels need many iterations: a decode batch of 300 iterations of
   30 us lasts 9 ms, and one hiccup of a few hundred microseconds moves it by
   several percent. ``--min-batch-ms`` (30) and ``--max-iters`` (4000) let a
   decode batch run 1000-1400 iterations.
3. The state a batch starts in. An idle GPU ramps its clocks up during the
   first kernels (``--spinup-ms`` of untimed matmuls first, not in the hot
   suite); and a compute kernel that follows low-power decode kernels first
   runs at boost until the controller clamps again (fp8 and tf32 8192^3 read
   10-12 % above their medians in some idle cycles). The warm-up floor per
   kind (``--warmup-ms``) lets a kernel run into the regime it is timed in; a
   longer compute warm-up trades timed iterations for a steadier start.
4. Gaps that are not the GPU's: the prequeue hold keeps the CPU's launch
   overhead out, and Python's garbage collector is paused while a batch is
   enqueued. The stream's queue is finite (about a thousand commands; every
   iteration takes three), so the CPU is often still enqueuing when the GPU
   starts: ``queued_ahead`` then reads false, which costs nothing as long as
   each kernel outlasts its launch (on the H200, 22-36 us decode kernels
   lost the same 4 % to gaps in batches of 1000 and of 4000 iterations);
   ``gaps_ms`` says what the GPU waited.
5. Order: ``--order kind`` runs every compute shape first, then the LLM and
   the decode shapes. On the H200 it lowered the compute CVs (fp8 8192^3
   4.2 % to 2.5 %) but raised the LLM ones and made decode unstable with the
   median; it is a switch to try again with the total-time figure.

What no knob removes: cycles minutes apart start from different temperatures,
and a cold GPU boosts longer. All of the above are arguments so that they can
be tuned on the device without editing this file.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import platform
import re
import signal
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

SCHEMA = "sparkdiag-probe/2"
LLM_SHAPE = (4096, 11008, 4096)
SMALL_COMPUTE = (256, 256, 256)
SMALL_LLM = (256, 688, 256)
DECODE_NK = 8192
SMALL_DECODE_NK = 256

INT4_GROUP = 128
ASSUMED_L2_BYTES = 60 * 1024 * 1024  # H200; used where torch does not say
MAX_ROTATION_BYTES = 2 * 1024**3
REF_ROWS = 64
MIN_ITERS = 5
MAX_ITERS = 4000
# Shortest batch on a GPU (per round): a batch shorter than a time slice can run whole inside
# one and never see another process's work. On the H200 beside a bf16 8192^3 loop, batches of
# 0.1-8 ms read 0.98-1.00 of idle and batches of 9 ms and longer 0.44-0.51 (2026-12-01).
MIN_BATCH_MS = 30.0
# Decode kernels on a GPU (--graphs): delivered from one CUDA graph replay of the batch, peak from
# an event-timed batch of at most this many iterations (three commands each: within the queue).
PEAK_BATCH_ITERS = 128
# A decode batch with a floor is captured as this fraction of its iterations and replayed until
# it lasts the floor times the margin (see time_graph).
GRAPH_CHUNKS = 8
GRAPH_FLOOR_MARGIN = 1.1
PROGRESS_PREFIX = "sparkdiag-progress "
MAX_WARMUP_ITERS = 500
# Share of the time budget per kernel kind (see Budget).
# Share of the time budget per kernel kind and for the device copy (see Budget, --kind-weights).
KIND_WEIGHTS = {"compute": 4.0, "llm": 1.5, "decode": 0.5, "bandwidth": 1.0}
# Warm-up floor per kind in GPU milliseconds (see --warmup-ms).
WARMUP_MS = {"compute": 25.0, "llm": 25.0, "decode": 25.0, "bandwidth": 0.0}
BUDGET_PLANNING_FRACTION = 0.80  # plan for 80 % of the budget, keep headroom
LAUNCH_US = 60.0  # CPU time to enqueue one iteration assumed before it is measured
MAX_PREQUEUE_MS = 100.0  # longest the GPU is held while a batch is enqueued
LEAD_FLOOR_MS = 0.2
LAUNCH_PROBE_ITERS = 16  # iterations over which the CPU's enqueue time is measured
TRANSFER_SMALL_BYTES = 64 * 1024  # many small host-device copies
TRANSFER_LARGE_BYTES = 256 * 1024**2  # a few large ones
SMALL_TRANSFER_LARGE_BYTES = 16 * 1024**2  # the large copies with --small
TRANSFER_SMALL_COPIES = 200
TRANSFER_LARGE_COPIES = 2
SOAK_WINDOW_SECONDS = 5.0
SOAK_MARGIN_CELSIUS = 5.0  # a soak stops this far below a thermal limit
SOAK_CHUNK_MS = 100.0  # load between two checks of the stop conditions
FALLBACK_GPU_LIMIT_CELSIUS = 85.0  # when NVML gives no slowdown threshold
# HW_SLOWDOWN, HW_THERMAL_SLOWDOWN and NVML_FI_DEV_MEMORY_TEMP repeat sources/' NVML numbers
# (this script is self-contained): tests/test_nvml_queries.py holds them equal.
HW_SLOWDOWN = 0x8  # clock event reasons (nvmlClocksEventReason*)
HW_THERMAL_SLOWDOWN = 0x40
SLEEP_CLOCK_HZ = 3.2e9  # above any GPU's SM clock: a prequeue sleep is never too short
NVML_SAMPLE_PERIOD = 0.05
NVML_FI_DEV_MEMORY_TEMP = 82
UNSUPPORTED_PATTERNS = (
    "not supported",
    "not_supported",
    "not implemented",
    "notimplemented",
    "could not run",
    "only supported",
    "is not available",
    "no kernel image",
    "unsupported",
)


class UsageError(Exception):
    """Bad command-line arguments."""


class TorchUnavailable(Exception):
    """torch cannot be imported by this interpreter."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


# --------------------------------------------------------------------------
# arguments


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The worker's arguments (declared once, in FLAGS); those left out take the defaults of the
    ``--suite`` (SUITES)."""
    p = _Parser(prog="sparkdiag-probe-worker", description=__doc__.splitlines()[0])
    for flag in FLAGS:
        p.add_argument(flag.name, **flag.argparse())
    args = p.parse_args(list(argv))
    if args.suite is None:
        args.suite = "default" if args.soak_seconds is None else "hot"
    if args.soak_seconds is not None and args.spinup_ms is None:
        # every later window is judged against the cold one: measure it at working clocks
        args.spinup_ms = SUITES["default"].spinup_ms
    suite = SUITES[args.suite]
    args.dtype = parse_dtypes(args.dtype or [",".join(suite.dtypes)])
    args.shape = [parse_shape(s) for s in args.shape or []]
    for name in (
        "warmup",
        "spinup_ms",
        "min_iters",
        "min_batch_ms",
        "rounds",
        "probe_when",
        "budget_seconds",
        "bandwidth",
        "transfers",
    ):
        if getattr(args, name) is None:
            setattr(args, name, getattr(suite, name))
    for flag in FLAGS:  # each flag's minimum, from the table
        flag.check(getattr(args, flag.dest))
    if not 0.0 <= args.busy_utilization <= 1.0:
        raise UsageError("--busy-utilization must be within 0..1")
    if not 0.0 < args.budget_fraction <= 1.0:
        raise UsageError("--budget-fraction must be within (0, 1]")
    if not math.isfinite(args.min_batch_ms):
        raise UsageError("--min-batch-ms must be finite")
    if args.max_iters < args.min_iters:
        raise UsageError("--max-iters must be >= --min-iters")
    args.kind_weights = parse_kind_values(args.kind_weights, KIND_WEIGHTS, "--kind-weights")
    args.warmup_ms = parse_kind_values(args.warmup_ms, dict(suite.warmup_ms), "--warmup-ms")
    return args


def parse_dtypes(items: Sequence[str]) -> list[str]:
    """``["bf16,fp8", "int4"]`` -> ``["bf16", "fp8", "int4"]``, in order, once each; ``all`` is
    every dtype. UsageError names an unknown one."""
    dtypes: list[str] = []
    for item in items:
        for name in item.split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name == "all":
                dtypes.extend(d for d in ALL_DTYPES if d not in dtypes)
            elif name in ALL_DTYPES:
                if name not in dtypes:
                    dtypes.append(name)
            else:
                raise UsageError(f"unknown dtype {name!r} (known: {', '.join(ALL_DTYPES)})")
    return dtypes


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = text.lower().replace(" ", "").split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"bad shape {text!r}: expected MxNxK with positive integers")
    return int(parts[0]), int(parts[1]), int(parts[2])


def shape_label(m: int, n: int, k: int) -> str:
    return f"{m}x{n}x{k}"


# --------------------------------------------------------------------------
# small pure helpers (unit-tested directly)


def torch_version_tuple(version: str) -> tuple[int, int]:
    """'2.11.0+cu130' -> (2, 11)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def classify_exception(exc: BaseException) -> tuple[str, str]:
    """Map an exception from a kernel to ("unsupported"|"error", one-line reason)."""
    text = f"{type(exc).__name__}: {exc}"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if len(first) > 300:
        first = first[:297] + "..."
    lowered = text.lower()
    if isinstance(exc, NotImplementedError) or any(p in lowered for p in UNSUPPORTED_PATTERNS):
        return "unsupported", first
    return "error", first


def classify_kernel_exception(dtype: str, exc: BaseException) -> tuple[str, str]:
    """Like classify_exception, but a dtype whose API is young counts a rejection as unsupported.

    The nvfp4 call cannot be exercised without a Blackwell GPU, and torch has
    changed what it accepts (scale layouts, _scaled_mm_v2); a rejected call
    there is reported as unsupported with its message. A CUDA fault, or a
    wrong result (checked separately), stays an error.
    """
    status, reason = classify_exception(exc)
    spec = DTYPES.get(dtype)
    if (
        spec is not None
        and spec.rejection_is_unsupported
        and status == "error"
        and "cuda error" not in reason.lower()
    ):
        return "unsupported", f"{dtype} call rejected: {reason}"
    return status, reason


def within_bound(error: float | None, bound: float) -> bool:
    """True when the error is a finite number no larger than the bound (NaN fails)."""
    return error is not None and math.isfinite(error) and error <= bound


def max_row_relative_error(torch: Any, out: Any, ref: Any) -> float:
    """Largest per-row ||out_i - ref_i|| / ||ref_i|| in float64; inf when non-finite."""
    out = out.to(torch.float64)
    ref = ref.to(torch.float64)
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    if not bool(torch.isfinite(out).all()):
        return math.inf
    diff = torch.linalg.vector_norm(out - ref, dim=-1)
    scale = torch.linalg.vector_norm(ref, dim=-1).clamp_min(1e-30)
    value = float((diff / scale).max())
    return value if math.isfinite(value) else math.inf


def choose_iters(
    fixed: int | None,
    warm_ms: Sequence[float],
    share_seconds: float,
    spent_seconds: float,
    min_iters: int = MIN_ITERS,
    max_iters: int = MAX_ITERS,
    min_batch_ms: float = 0.0,
    rounds: int = 1,
) -> int:
    """Timed iterations for one kernel: what fits in its share of the budget, and at least
    enough for each of ``rounds`` batches to last ``min_batch_ms`` (both within the bounds)."""
    if fixed is not None:
        return fixed
    tail = list(warm_ms[1:]) or list(warm_ms)
    if not tail:
        return min_iters
    per_iter = statistics.median(tail) / 1e3
    if per_iter <= 0:
        return max_iters
    n = int((share_seconds - spent_seconds) / per_iter)
    if min_batch_ms > 0:
        n = max(n, max(1, rounds) * math.ceil(min_batch_ms / 1e3 / per_iter))
    return max(min_iters, min(max_iters, n))


def min_batch_ms(args: argparse.Namespace, info: DeviceInfo) -> float:
    """The batch floor in effect: ``--min-batch-ms`` on a GPU, none on CPU (no time slices)."""
    return float(args.min_batch_ms) if info.is_cuda else 0.0


def compute_cube(capability: tuple[int, int], sm_count: int) -> int:
    """Edge of the compute-bound cube so one bf16 iteration takes >= ~1 ms."""
    if capability >= (8, 0) and sm_count >= 100:  # A100, H100, H200, B200
        return 8192
    if capability >= (8, 0) or sm_count >= 40:  # GB10 (48 SMs), consumer parts
        return 4096
    return 2048


def rotation_sets(set_bytes: int, l2_bytes: int) -> int:
    """Buffer sets to rotate so that together they are at least twice the L2."""
    if set_bytes <= 0:
        return 2
    n = max(2, math.ceil(2 * l2_bytes / set_bytes))
    return max(1, min(n, 64, MAX_ROTATION_BYTES // set_bytes))


def _bare_uuid(text: str) -> str:
    text = text.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def _truncate(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


# --------------------------------------------------------------------------
# NVML (optional)


def _import_pynvml() -> Any:
    try:
        import pynvml
    except Exception:  # ImportError, or a broken install
        return None
    return pynvml


class Nvml:
    """The few NVML calls the probe needs; every reading may be None."""

    def __init__(self, mod: Any, handle: Any) -> None:
        self.mod = mod
        self.handle = handle
        self._reasons_fn: Any = getattr(mod, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if self._reasons_fn is None:
            self._reasons_fn = getattr(mod, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

    @classmethod
    def open(cls, cuda_index: int) -> Nvml | None:
        mod = _import_pynvml()
        if mod is None:
            return None
        try:
            mod.nvmlInit()
        except Exception as exc:
            _log(f"NVML unavailable: {exc}")
            return None
        try:
            handle = cls._handle_for_cuda_index(mod, cuda_index)
        except Exception as exc:
            _log(f"NVML has no handle for CUDA device {cuda_index}: {exc}")
            handle = None
        if handle is None:
            _shutdown(mod)
            return None
        return cls(mod, handle)

    @staticmethod
    def _handle_for_cuda_index(mod: Any, cuda_index: int) -> Any:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return mod.nvmlDeviceGetHandleByIndex(cuda_index)
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if cuda_index >= len(entries):
            return None
        entry = entries[cuda_index]
        if entry.isdigit():
            return mod.nvmlDeviceGetHandleByIndex(int(entry))
        if entry.startswith("GPU-"):
            return mod.nvmlDeviceGetHandleByUUID(entry)
        return None  # MIG instances and other forms: no device-level reading

    def rebind(self, uuid: str) -> None:
        self.handle = self.mod.nvmlDeviceGetHandleByUUID(uuid)

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self.mod, name)(*args)
        except Exception:
            return None

    def uuid(self) -> str | None:
        value = self._call("nvmlDeviceGetUUID", self.handle)
        return _text(value)

    def name(self) -> str | None:
        return _text(self._call("nvmlDeviceGetName", self.handle))

    def driver_version(self) -> str | None:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def compute_pids(self) -> set[int] | None:
        """PIDs of compute (and MPS) processes on the device; None when unknown."""
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", self.handle)
        if procs is None:
            return None
        pids = {int(p.pid) for p in procs}
        mps = self._call("nvmlDeviceGetMPSComputeRunningProcesses", self.handle)
        if mps:
            pids.update(int(p.pid) for p in mps)
        return pids

    def utilization(self) -> float | None:
        rates = self._call("nvmlDeviceGetUtilizationRates", self.handle)
        return None if rates is None else float(rates.gpu) / 100.0

    def memory_temperature(self) -> float | None:
        values = self._call("nvmlDeviceGetFieldValues", self.handle, [NVML_FI_DEV_MEMORY_TEMP])
        if not values:
            return None
        v = values[0]
        if int(getattr(v, "nvmlReturn", 1)) != 0:
            return None
        kind = int(v.valueType)
        raw = {
            0: v.value.dVal,
            1: v.value.uiVal,
            2: v.value.ulVal,
            3: v.value.ullVal,
            4: v.value.sllVal,
            5: v.value.siVal,
        }.get(kind)
        if raw is None or raw == 0:  # a constant 0 means "not supported" (GB10)
            return None
        return float(raw)

    def max_sm_clock_mhz(self) -> int | None:
        """Highest SM clock in MHz (nvidia-smi --query-gpu=clocks.max.sm)."""
        value = self._call("nvmlDeviceGetMaxClockInfo", self.handle, 1)  # NVML_CLOCK_SM
        return None if value is None else int(value)

    def sample(self) -> dict[str, float | int | None]:
        temp = self._call("nvmlDeviceGetTemperature", self.handle, 0)  # NVML_TEMPERATURE_GPU
        clock = self._call("nvmlDeviceGetClockInfo", self.handle, 1)  # NVML_CLOCK_SM, MHz
        mem_clock = self._call("nvmlDeviceGetClockInfo", self.handle, 2)  # NVML_CLOCK_MEM, MHz
        power = self._call("nvmlDeviceGetPowerUsage", self.handle)  # mW
        reasons = None if self._reasons_fn is None else _safe(self._reasons_fn, self.handle)
        return {
            "gpu_temperature": None if temp is None else float(temp),
            "memory_temperature": self.memory_temperature(),
            "reasons": None if reasons is None else int(reasons),
            "sm_clock_hz": None if clock is None else float(clock) * 1e6,
            "memory_clock_hz": None if not mem_clock else float(mem_clock) * 1e6,
            "power_w": None if power is None else float(power) / 1000.0,
        }

    def thresholds(self) -> dict[str, float | None]:
        """GPU slowdown and memory maximum temperatures in °C, None where NVML has none
        (nvidia-smi -q -d TEMPERATURE: "GPU Slowdown Temp", "Memory Max Operating Temp")."""
        slowdown = self._call("nvmlDeviceGetTemperatureThreshold", self.handle, 1)
        memory_max = self._call("nvmlDeviceGetTemperatureThreshold", self.handle, 2)
        return {
            "gpu_slowdown_celsius": float(slowdown) if slowdown else None,
            "memory_max_celsius": float(memory_max) if memory_max else None,
        }

    def shutdown(self) -> None:
        _shutdown(self.mod)


def _safe(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def _shutdown(mod: Any) -> None:
    with contextlib.suppress(Exception):
        mod.nvmlShutdown()


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class ConditionSampler:
    """Samples NVML on a background thread while the suite runs."""

    def __init__(self, nvml: Nvml | None, period: float = NVML_SAMPLE_PERIOD) -> None:
        self.nvml = nvml
        self.period = period
        self.samples: list[dict[str, float | int | None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.nvml is None:
            return
        self._take()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()

    def take(self) -> None:
        """One sample now (also between the background thread's)."""
        self._take()

    def _take(self) -> None:
        if self.nvml is not None:
            try:
                self.samples.append(self.nvml.sample())
            except Exception as exc:
                _log(f"NVML sample failed: {exc}")

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self._take()

    def stop(self) -> dict[str, Any]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=2.0)
            self._take()
        return summarize_conditions(self.samples)


def summarize_conditions(samples: Sequence[dict[str, float | int | None]]) -> dict[str, Any]:
    def values(key: str) -> list[float]:
        return [float(v) for s in samples if (v := s.get(key)) is not None]

    gpu_t, mem_t = values("gpu_temperature"), values("memory_temperature")
    clocks, power = values("sm_clock_hz"), values("power_w")
    mem_clocks = values("memory_clock_hz")
    reasons = [int(v) for s in samples if (v := s.get("reasons")) is not None]
    seen = 0
    for r in reasons:
        seen |= r
    return {
        "max_gpu_temperature_celsius": max(gpu_t) if gpu_t else None,
        "max_memory_temperature_celsius": max(mem_t) if mem_t else None,
        "clock_event_reasons_seen": seen if reasons else None,
        "mean_sm_clock_hertz": statistics.fmean(clocks) if clocks else None,
        "min_sm_clock_hertz": min(clocks) if clocks else None,
        "mean_memory_clock_hertz": statistics.fmean(mem_clocks) if mem_clocks else None,
        "mean_power_watts": statistics.fmean(power) if power else None,
        "max_power_watts": max(power) if power else None,
        "samples": len(samples),
    }


# --------------------------------------------------------------------------
# busy detection


@dataclass
class BusyState:
    nvml: Nvml | None
    excluded: set[int]
    threshold: float
    self_pids: set[int] = field(default_factory=set)
    other_pids: list[int] = field(default_factory=list)
    utilization: float | None = None

    def others_now(self) -> list[int]:
        if self.nvml is None:
            return []
        pids = self.nvml.compute_pids() or set()
        return sorted(pids - self.self_pids - self.excluded)

    def check_before_context(self) -> str | None:
        """Before this process has a CUDA context: any compute process, or utilization."""
        if self.nvml is None:
            return None
        self.utilization = self.nvml.utilization()
        self.other_pids = self.others_now()
        reasons = []
        if self.other_pids:
            reasons.append(f"other compute processes on the GPU: pids {self.other_pids}")
        if self.utilization is not None and self.utilization > self.threshold:
            reasons.append(
                f"GPU utilization {self.utilization:.0%} above {self.threshold:.0%} threshold"
            )
        return "; ".join(reasons) or None

    def adopt_own_context(self, before: set[int]) -> None:
        """Count processes that appeared with our context as ours.

        Inside a PID namespace NVML may report this process under a PID that is
        not os.getpid(); whatever appeared between just before and just after
        our context was created is taken to be this worker.
        """
        if self.nvml is None:
            return
        after = self.nvml.compute_pids() or set()
        self.self_pids |= after - before

    def check_during(self) -> str | None:
        others = self.others_now()
        if others:
            self.other_pids = sorted(set(self.other_pids) | set(others))
            return f"other compute processes appeared on the GPU: pids {others}"
        return None


# --------------------------------------------------------------------------
# kernels


@dataclass
class KernelSpec:
    dtype: str
    kind: str  # compute | llm | decode | custom shapes are classified into these
    m_candidates: tuple[int, ...]
    n: int
    k: int
    beta: int = 0


@dataclass
class Prepared:
    """One kernel ready to run: argument sets, the op, and its reference."""

    make_set: Callable[[], tuple[Any, ...]]
    fn: Callable[..., Any]
    reference: Callable[[tuple[Any, ...], Any], Any]  # (set, row index tensor) -> float64 rows
    release: Callable[[], None] = lambda: None  # drop what only the reference needed


@dataclass
class DeviceInfo:
    torch: Any
    device: str
    is_cuda: bool
    capability: tuple[int, int] | None
    sm_count: int
    l2_bytes: int
    torch_version: tuple[int, int]
    max_clock_hz: float = SLEEP_CLOCK_HZ  # the SM clock prequeue sleeps are sized for


def _cc_text(info: DeviceInfo) -> str:
    cc = info.capability
    return f"{cc[0]}.{cc[1]}" if cc else "n/a"


def _cc_below(info: DeviceInfo, need: tuple[int, int], needs: str) -> str | None:
    """``needs`` ("tf32 needs compute capability 8.0+") with what the device has, when its
    compute capability is known and below ``need``; else None."""
    if info.capability is not None and info.capability < need:
        return f"{needs}, device has {_cc_text(info)}"
    return None


def _cuda_gate(info: DeviceInfo, need: tuple[int, int], on_cpu: str, needs: str) -> str | None:
    """The reason a CUDA-only mode cannot run: ``on_cpu`` on a CPU, :func:`_cc_below` on a GPU."""
    return on_cpu if not info.is_cuda else _cc_below(info, need, needs)


def _gate_any(info: DeviceInfo) -> str | None:
    return None


def _gate_tf32(info: DeviceInfo) -> str | None:
    return _cuda_gate(
        info,
        (8, 0),
        "tf32 is a CUDA tensor-core mode; not available on cpu",
        "tf32 needs compute capability 8.0+",
    )


def _gate_fp8(info: DeviceInfo) -> str | None:
    torch = info.torch
    reason = _cuda_gate(
        info,
        (8, 9),
        "fp8 probe runs on CUDA GPUs of compute capability 8.9+ only, not on cpu",
        "fp8 (torch._scaled_mm) needs compute capability 8.9+",
    )
    if reason is None and not (hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")):
        reason = f"torch {torch.__version__} has no float8_e4m3fn/_scaled_mm"
    return reason


def _gate_int8(info: DeviceInfo) -> str | None:
    if not hasattr(info.torch, "_int_mm"):
        return f"torch {info.torch.__version__} has no torch._int_mm"
    return None


def _gate_int4(info: DeviceInfo) -> str | None:
    torch = info.torch
    if info.is_cuda:
        if not hasattr(torch, "_weight_int4pack_mm"):
            return f"torch {torch.__version__} has no torch._weight_int4pack_mm"
        return _cc_below(info, (8, 0), "int4 weight-only GEMM needs compute capability 8.0+")
    if not hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        return f"torch {torch.__version__} has no CPU int4 kernel (_weight_int4pack_mm_for_cpu)"
    return None


def _gate_nvfp4(info: DeviceInfo) -> str | None:
    torch = info.torch
    reason = _cuda_gate(
        info,
        (10, 0),
        "nvfp4 needs a CUDA GPU of compute capability 10.0+, not cpu",
        "nvfp4 needs compute capability 10.0+ (Blackwell)",
    )
    if reason is not None:
        return reason
    if info.torch_version < (2, 8):
        return f"nvfp4 needs torch 2.8+, have {torch.__version__}"
    if not hasattr(torch, "float4_e2m1fn_x2"):
        return f"torch {torch.__version__} has no float4_e2m1fn_x2"
    return None


def gate(info: DeviceInfo, dtype: str) -> str | None:
    """Reason why the dtype cannot run here, or None when it should be tried."""
    return DTYPES[dtype].gate(info)


def prepare(info: DeviceInfo, spec: KernelSpec, m: int) -> Prepared:
    """The kernel of ``spec`` at M=``m``: argument sets, the op and its float64 reference."""
    return DTYPES[spec.dtype].prepare(info, spec, m)


def _rows(torch: Any, m: int, device: str) -> Any:
    count = min(m, REF_ROWS)
    idx = torch.linspace(0, m - 1, count).round().long().unique()
    return idx.to(device)


def _prepare_float(torch_dtype: str) -> Callable[[DeviceInfo, KernelSpec, int], Prepared]:
    """bf16, fp16 and tf32 (float32 under "high" matmul precision): torch.mm / torch.addmm."""

    def prepare_float(info: DeviceInfo, spec: KernelSpec, m: int) -> Prepared:
        torch = info.torch
        dev, n, k = info.device, spec.n, spec.k
        dt = getattr(torch, torch_dtype)
        f64 = torch.float64

        def make() -> tuple[Any, ...]:
            a = torch.randn(m, k, device=dev, dtype=dt)
            w = torch.randn(n, k, device=dev, dtype=dt)  # nn.Linear layout: B = W^T
            if spec.beta:
                return (torch.randn(m, n, device=dev, dtype=dt), a, w)
            return (a, w)

        def mm_beta(c: Any, a: Any, w: Any) -> Any:
            return torch.addmm(c, a, w.t())

        def ref_beta(s: tuple[Any, ...], rows: Any) -> Any:
            c, a, w = s
            return c[rows].to(f64) + a[rows].to(f64) @ w.to(f64).t()

        def mm(a: Any, w: Any) -> Any:
            return torch.mm(a, w.t())

        def ref(s: tuple[Any, ...], rows: Any) -> Any:
            a, w = s
            return a[rows].to(f64) @ w.to(f64).t()

        return Prepared(make, mm_beta, ref_beta) if spec.beta else Prepared(make, mm, ref)

    return prepare_float


def _prepare_fp8(info: DeviceInfo, spec: KernelSpec, m: int) -> Prepared:
    """e4m3 inputs, unit scales, bf16 output: torch._scaled_mm with fast accumulation."""
    torch = info.torch
    dev, n, k = info.device, spec.n, spec.k
    e4m3 = torch.float8_e4m3fn
    one = torch.ones((), device=dev, dtype=torch.float32)

    def make() -> tuple[Any, ...]:
        a = torch.randn(m, k, device=dev).to(e4m3)
        w = torch.randn(n, k, device=dev).to(e4m3)
        return (a, w)

    def fn(a: Any, w: Any) -> Any:
        out = torch._scaled_mm(
            a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True
        )
        return out[0] if isinstance(out, tuple) else out  # torch < 2.5 returned (out, amax)

    def ref(s: tuple[Any, ...], rows: Any) -> Any:
        a, w = s
        return a[rows].to(torch.float64) @ w.to(torch.float64).t()

    return Prepared(make, fn, ref)


def _prepare_int8(info: DeviceInfo, spec: KernelSpec, m: int) -> Prepared:
    """int8 inputs, int32 accumulation: torch._int_mm (A row-major, B column-major)."""
    torch = info.torch
    dev, n, k = info.device, spec.n, spec.k

    def make() -> tuple[Any, ...]:
        a = (torch.randn(m, k, device=dev) * 40).round().clamp(-127, 127).to(torch.int8)
        w = (torch.randn(n, k, device=dev) * 40).round().clamp(-127, 127).to(torch.int8)
        return (a, w)

    def fn(a: Any, w: Any) -> Any:
        return torch._int_mm(a, w.t())

    def ref(s: tuple[Any, ...], rows: Any) -> Any:
        a, w = s
        return a[rows].to(torch.float64) @ w.to(torch.float64).t()

    return Prepared(make, fn, ref)


def _quantize_int4(torch: Any, w: Any, group: int) -> tuple[Any, Any, Any]:
    """Asymmetric per-group 4-bit quantisation of W [N, K] (bf16).

    Returns (q int32 [N, K] in 0..15, scales_and_zeros bf16 [K/group, N, 2],
    dequantised W float64 [N, K]) with w ~= (q - 8) * scale + zero, using the
    bf16-rounded scale and zero the kernel sees.
    """
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    lo = g.amin(dim=-1, keepdim=True)
    hi = g.amax(dim=-1, keepdim=True)
    scale = ((hi - lo) / 15.0).clamp_min(1e-6).to(torch.bfloat16).float()
    zero = (lo + 8.0 * scale).to(torch.bfloat16).float()
    q = ((g - (zero - 8.0 * scale)) / scale).round().clamp(0, 15)
    deq = ((q.double() - 8.0) * scale.double() + zero.double()).reshape(n, k)
    sz = torch.stack([scale.reshape(n, k // group), zero.reshape(n, k // group)], dim=-1)
    sz = sz.transpose(0, 1).contiguous().to(torch.bfloat16)
    return q.reshape(n, k).to(torch.int32), sz, deq


def _prepare_int4(info: DeviceInfo, spec: KernelSpec, m: int) -> Prepared:
    """Weight-only int4 (group 128, bf16 activations): torch._weight_int4pack_mm."""
    torch = info.torch
    dev, n, k = info.device, spec.n, spec.k
    if k % INT4_GROUP:
        raise ValueError(f"int4 needs K divisible by the group size {INT4_GROUP}")
    deq_cache: dict[int, Any] = {}

    if info.is_cuda:
        inner_k_tiles = 8

        def pack(q: Any) -> Any:
            if info.torch_version >= (2, 5):  # uint8 [N, K/2], two nibbles per byte
                q8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
                return torch._convert_weight_to_int4pack(q8, inner_k_tiles)
            return torch._convert_weight_to_int4pack(q, inner_k_tiles)  # int32 [N, K]

        def mm(x: Any, packed: Any, sz: Any) -> Any:
            return torch._weight_int4pack_mm(x, packed, INT4_GROUP, sz)

    else:

        def pack(q: Any) -> Any:
            return torch._convert_weight_to_int4pack_for_cpu(q, 1)

        def mm(x: Any, packed: Any, sz: Any) -> Any:
            return torch._weight_int4pack_mm_for_cpu(x, packed, INT4_GROUP, sz)

    def make() -> tuple[Any, ...]:
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        q, sz, deq = _quantize_int4(torch, w, INT4_GROUP)
        packed = pack(q)
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        if not deq_cache:  # the reference is checked on the first set only
            deq_cache[id(packed)] = deq
        return (x, packed, sz)

    def ref(s: tuple[Any, ...], rows: Any) -> Any:
        x, packed, _ = s
        deq = deq_cache.get(id(packed))
        if deq is None:
            raise RuntimeError("int4 reference is kept for the first buffer set only")
        return x[rows].to(torch.float64) @ deq.t()

    return Prepared(make, mm, ref, deq_cache.clear)


# e2m1 code -> value (sign in bit 3)
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _prepare_nvfp4(info: DeviceInfo, spec: KernelSpec, m: int) -> Prepared:
    """NVFP4: e2m1 values packed two per byte along K, e4m3 scales per 16 elements.

    All block scales are 1.0, so the swizzled ("blocked") scale layout cannot
    change the result, and A and B are packed along K with the same nibble
    order, so the dot products do not depend on it either: the reference only
    needs the decoded e2m1 values.
    """
    torch = info.torch
    dev, n, k = info.device, spec.n, spec.k
    if k % 32:
        raise ValueError("nvfp4 needs K divisible by 32")
    table = torch.tensor(list(_E2M1) + [-v for v in _E2M1], device=dev, dtype=torch.float64)
    magnitudes = torch.tensor(_E2M1, device=dev, dtype=torch.float32)

    def encode(x: Any) -> tuple[Any, Any]:
        """Round normal samples to the nearest e2m1 code; returns (packed uint8, float64)."""
        mag = (x.abs().unsqueeze(-1) - magnitudes).abs().argmin(dim=-1)
        codes = (mag + (x < 0).long() * 8).to(torch.uint8)
        packed = codes[..., ::2] | (codes[..., 1::2] << 4)
        return packed.contiguous(), table[codes.long()]

    def scales(rows: int) -> Any:
        r = (rows + 127) // 128 * 128
        c = (k // 16 + 3) // 4 * 4
        return torch.ones(r * c, device=dev, dtype=torch.float32).to(torch.float8_e4m3fn)

    decoded: dict[int, tuple[Any, Any]] = {}

    def make() -> tuple[Any, ...]:
        a_packed, a_val = encode(torch.randn(m, k, device=dev) * 2)
        w_packed, w_val = encode(torch.randn(n, k, device=dev) * 2)
        a = a_packed.view(torch.float4_e2m1fn_x2)
        w = w_packed.view(torch.float4_e2m1fn_x2)
        if not decoded:
            decoded[id(a)] = (a_val, w_val)
        return (a, w, scales(m), scales(n))

    def fn(a: Any, w: Any, sa: Any, sb: Any) -> Any:
        return torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

    def ref(s: tuple[Any, ...], rows: Any) -> Any:
        vals = decoded.get(id(s[0]))
        if vals is None:
            raise RuntimeError("nvfp4 reference is kept for the first buffer set only")
        a_val, w_val = vals
        return a_val[rows] @ w_val.t()

    return Prepared(make, fn, ref, decoded.clear)


# --------------------------------------------------------------------------
# the dtype table


def _same_edge(edge: int) -> int:
    return edge


def _int4_edge(edge: int) -> int:
    # weight-only int4 runs ~25x slower than bf16 at large M on Hopper: a smaller cube
    return max(1024, edge // 2)


@dataclass(frozen=True)
class DtypeSpec:
    """Everything the worker knows about one dtype.

    Adding a dtype is one entry in DTYPES plus its prepare function (and a gate
    when it does not run everywhere).

    error_bound: bound on the largest per-row relative error ||out_i - ref_i|| / ||ref_i||
        against a float64 reference computed from the same (quantised) inputs
    decode_m: candidate M for the decode shape, smallest first: the first one the kernel
        accepts is used (torch._int_mm on CUDA rejects M <= 16, for instance)
    gate: why the dtype cannot run on this device, or None when it should be tried
    prepare: builds the kernel (argument sets, op, reference) for a spec at a given M
    compute_edge: the compute-bound cube's edge for this dtype, given the device's edge
    beta_variant: also probe the compute shape with beta=1 (C = A B + C)
    matmul_precision: torch float32 matmul precision the kernel runs under, if any
    rejection_is_unsupported: a young API, whose rejected calls count as unsupported
    unit: what its throughput is counted in, 2*M*N*K operations a second either way: TFLOPS,
        or TOPS for the integer dtypes (int8's integer multiply; int4 is weight-only, its
        multiply runs in bf16 after dequantisation, and is still counted as an integer dtype,
        as the public metric contract says). Every renderer and docs/metrics.md read it here.
    """

    error_bound: float
    decode_m: tuple[int, ...]
    gate: Callable[[DeviceInfo], str | None]
    prepare: Callable[[DeviceInfo, KernelSpec, int], Prepared]
    compute_edge: Callable[[int], int] = _same_edge
    beta_variant: bool = False
    matmul_precision: str | None = None
    rejection_is_unsupported: bool = False
    unit: str = "TFLOPS"


DTYPES: dict[str, DtypeSpec] = {
    "bf16": DtypeSpec(2e-2, (1,), _gate_any, _prepare_float("bfloat16"), beta_variant=True),
    "fp16": DtypeSpec(2e-2, (1,), _gate_any, _prepare_float("float16")),
    "tf32": DtypeSpec(5e-3, (1,), _gate_tf32, _prepare_float("float32"), matmul_precision="high"),
    "fp8": DtypeSpec(5e-2, (1, 16, 32), _gate_fp8, _prepare_fp8),
    "int8": DtypeSpec(0.0, (1, 16, 32), _gate_int8, _prepare_int8, unit="TOPS"),  # exact sums
    "int4": DtypeSpec(2e-2, (1,), _gate_int4, _prepare_int4, compute_edge=_int4_edge, unit="TOPS"),
    "nvfp4": DtypeSpec(
        2.5e-1, (1, 16, 32, 128), _gate_nvfp4, _prepare_nvfp4, rejection_is_unsupported=True
    ),
}
ALL_DTYPES = tuple(DTYPES)


def throughput_unit(dtype: str) -> str:
    """``TOPS`` or ``TFLOPS`` for a dtype (DtypeSpec.unit); TFLOPS for one this worker does not
    know (a document of another version)."""
    spec = DTYPES.get(dtype)
    return spec.unit if spec is not None else "TFLOPS"


# --------------------------------------------------------------------------
# suites


@dataclass(frozen=True)
class SuiteSpec:
    """What a suite probes and its defaults; an explicit argument overrides each default.

    dtypes, kinds: what is planned (kinds: compute with its beta variants, llm, decode)
    together: kinds whose kernels are set up together and then timed back to back in
        ``rounds`` interleaved rounds (each round in a rotated order), so that their figures
        and ratios are taken under the same conditions (heat, a competing process)
    """

    dtypes: tuple[str, ...]
    kinds: tuple[str, ...]
    together: tuple[str, ...]
    rounds: int
    budget_seconds: float
    spinup_ms: float
    probe_when: str
    bandwidth: bool
    transfers: bool
    warmup: int
    warmup_ms: tuple[tuple[str, float], ...]
    min_iters: int
    min_batch_ms: float


# the periodic probe: every dtype and shape, one batch per kernel in dtype order
_DEFAULT_SUITE = SuiteSpec(
    dtypes=ALL_DTYPES,
    kinds=("compute", "llm", "decode"),
    together=(),
    rounds=1,
    budget_seconds=2.0,
    spinup_ms=150.0,
    probe_when="idle",
    bandwidth=True,
    transfers=True,
    warmup=10,
    warmup_ms=tuple(WARMUP_MS.items()),
    min_iters=MIN_ITERS,
    min_batch_ms=MIN_BATCH_MS,
)
SUITES: dict[str, SuiteSpec] = {
    "default": _DEFAULT_SUITE,
    # a hot or busy GPU, measured now: no spin-up (it would heat or wait), about 100 ms of
    # GPU time; the decode kernels interleaved so int4 against bf16/fp16 is one comparison
    "hot": SuiteSpec(
        dtypes=("int4", "bf16", "fp16", "fp8", "nvfp4"),
        kinds=("decode", "llm"),
        together=("decode", "llm"),
        rounds=3,
        budget_seconds=0.1,
        spinup_ms=0.0,
        probe_when="always",
        bandwidth=False,
        transfers=False,
        warmup=1,
        warmup_ms=(("compute", 2.0), ("llm", 2.0), ("decode", 1.0), ("bandwidth", 0.0)),
        min_iters=1,
        min_batch_ms=0.0,
    ),
    # sparkdiag check: the periodic probe narrowed to the dtypes it judges, the decode kernels
    # interleaved for the int4 ratio, half the time per kernel, no bandwidth
    "check": replace(
        _DEFAULT_SUITE,
        dtypes=("bf16", "fp16", "int4"),
        together=("decode",),
        rounds=3,
        budget_seconds=1.0,
        bandwidth=False,
    ),
}


# --------------------------------------------------------------------------
# the command line, declared once: parse_args builds its options from FLAGS, sparkdiag's
# WorkerRequest.argv (probe/request.py) writes them (a field per flag, named Flag.field), and
# flags.worker_options (sparkdiag/flags.py) makes the click flags of those a command exposes.

BUSY_UTILIZATION = 0.10  # sparkdiag's probe.busy-utilization default (a test holds them equal)


def _per_suite(name: str) -> str:
    """'per suite: default 10; hot 1; check 10' from SUITES."""

    def text(value: Any) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, tuple):
            return ",".join(f"{k}={v:g}" for k, v in value)
        return f"{value:g}" if isinstance(value, float) else str(value)

    return "per suite: " + "; ".join(
        f"{suite} {text(getattr(spec, name))}" for suite, spec in SUITES.items()
    )


@dataclass(frozen=True)
class Flag:
    """One flag of the worker.

    kind: int, float, text, choice, switch (present or not) or toggle (--x and --no-x)
    help: what it does, one sentence (shown by the worker and by sparkdiag's flags)
    default: the worker's own default (None: the suite's, or "not given")
    default_help: how the worker's --help states that default
    cli_default: how a sparkdiag command that exposes the flag states it, when the command
        sets none of its own
    repeat: given once per value (argparse ``append``); its request field is plural
    minimum, above: the smallest value allowed (``above``: the value must exceed it)
    """

    name: str
    kind: str
    help: str
    default: Any = None
    default_help: str = ""
    cli_default: str = ""
    repeat: bool = False
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    minimum: float | None = None
    above: bool = False

    @property
    def dest(self) -> str:
        """The argparse attribute: ``--exclude-pid`` -> ``exclude_pid``."""
        return self.name[2:].replace("-", "_")

    @property
    def field(self) -> str:
        """The WorkerRequest field and the click parameter: plural for a repeated flag."""
        return self.dest + ("s" if self.repeat else "")

    def argparse(self) -> dict[str, Any]:
        """The keyword arguments of ``ArgumentParser.add_argument`` for this flag."""
        shown = f" ({self.default_help})" if self.default_help else ""
        kwargs: dict[str, Any] = {"help": self.help + shown, "default": self.default}
        if self.kind == "switch":
            kwargs.update(action="store_true", default=bool(self.default))
        elif self.kind == "toggle":
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = {"int": int, "float": float}.get(self.kind, str)
            if self.repeat:
                kwargs["action"] = "append"
        if self.choices:
            kwargs["choices"] = self.choices
        if self.metavar:
            kwargs["metavar"] = self.metavar
        return kwargs

    def argv(self, value: Any) -> list[str]:
        """The arguments that give this flag ``value`` (None, False or () leave it out)."""
        if self.repeat:
            return [part for item in value for part in (self.name, _argument(item))]
        if self.kind == "switch":
            return [self.name] if value else []
        if value is None:
            return []
        if self.kind == "toggle":
            return [self.name if value else "--no-" + self.name[2:]]
        return [self.name, _argument(value)]

    def check(self, value: Any) -> None:
        """UsageError when a given number is below its minimum."""
        if self.minimum is None or value is None:
            return
        for item in value if self.repeat else [value]:
            if not (item > self.minimum if self.above else item >= self.minimum):  # NaN too
                need = "more than" if self.above else "at least"
                raise UsageError(f"{self.name} must be {need} {self.minimum:g}")


def _argument(value: Any) -> str:
    """A number as text that reads back to the same value (``2`` for 2.0, ``0.1``)."""
    if isinstance(value, float):
        text = f"{value:g}"
        return text if float(text) == value else repr(value)
    return str(value)


FLAGS: tuple[Flag, ...] = (
    Flag("--device", "text", "cuda:N or cpu.", default_help="default: cuda if available",
         cli_default="each GPU in turn, or cuda:0"),
    Flag("--suite", "choice", "default: every dtype at the compute, LLM and decode shapes, "
         "device copy and host-device copies (the periodic probe); hot: decode and LLM shapes "
         "of int4, bf16, fp16, fp8, nvfp4 within ~100 ms, no spin-up, even on a busy GPU; "
         "check: bf16, fp16 and int4 for sparkdiag check.",
         default_help="default: default, hot with --soak-seconds",
         choices=("default", "hot", "check")),
    Flag("--dtype", "text", "Dtype(s) to probe, repeatable or comma separated: "
         + ",".join(ALL_DTYPES) + ", or all.", default_help="default: the suite's",
         cli_default="all the GPU supports", repeat=True),
    Flag("--shape", "text", "Only these shapes, repeatable.", metavar="MxNxK",
         default_help="default: the suite's, sized to the GPU",
         cli_default="the suite sized to the GPU", repeat=True),
    Flag("--warmup", "int", "Warm-up iterations per kernel.", default_help=_per_suite("warmup"),
         minimum=0),
    Flag("--warmup-ms", "text", "Also warm up each kernel for at least this much GPU time, for "
         "every kind or per kind (compute, llm, decode, bandwidth).",
         default_help=_per_suite("warmup_ms"), metavar="MS|KIND=MS,..."),
    Flag("--spinup-ms", "float", "GPU time of untimed matmuls before the first kernel, to bring "
         "clocks up from idle, and before a soak's cold window (0 to skip).",
         default_help=f"{_per_suite('spinup_ms')}; a soak {SUITES['default'].spinup_ms:g}",
         minimum=0),
    Flag("--iters", "int", "Timed iterations per kernel.", cli_default="sized to the budget",
         default_help="default: sized to the budget", minimum=1),
    Flag("--min-iters", "int", "Fewest timed iterations of a kernel sized to the budget.",
         default_help=_per_suite("min_iters"), minimum=1),
    Flag("--graphs", "toggle", "On a GPU, time each decode batch as one CUDA graph replay, so "
         "that kernels shorter than their launch run back to back (peak and the median then "
         "come from an event-timed batch of at most "
         f"{PEAK_BATCH_ITERS} iterations beside it).", default=True, default_help="default on"),
    Flag("--min-batch-ms", "float", "On a GPU, time at least this long per kernel and round, so "
         "that a batch spans more than one time slice of a shared GPU; 0 to size by the budget "
         "alone.", default_help=_per_suite("min_batch_ms"), metavar="MS", minimum=0),
    Flag("--max-iters", "int", "Most timed iterations of a kernel sized to the budget.",
         default=MAX_ITERS, default_help=f"default {MAX_ITERS}"),
    Flag("--rounds", "int", "Interleaved rounds in which kernels timed together (the decode "
         "shapes of the hot and check suites) are timed.", default_help=_per_suite("rounds"),
         minimum=1),
    Flag("--order", "choice", "dtype: each dtype's shapes together; kind: every compute shape, "
         "then the LLM shapes, then the decode shapes.", default="dtype",
         default_help="default dtype", choices=("dtype", "kind")),
    Flag("--kind-weights", "text", "Share of the budget per kernel kind.",
         default_help="default " + ",".join(f"{k}={v:g}" for k, v in KIND_WEIGHTS.items()),
         metavar="W|KIND=W,..."),
    Flag("--budget-fraction", "float", "Part of --budget-seconds the iteration counts are "
         "planned for, the rest is headroom for warm-ups and minimum counts.",
         default=BUDGET_PLANNING_FRACTION, default_help=f"default {BUDGET_PLANNING_FRACTION:g}"),
    Flag("--launch-us", "float", "CPU microseconds to enqueue one iteration, assumed until "
         "measured: sizes the sleep that holds the GPU while a batch is enqueued.",
         default=LAUNCH_US, default_help=f"default {LAUNCH_US:g}", minimum=0),
    Flag("--max-prequeue-ms", "float", "Longest the GPU is held while a batch is enqueued; 0 "
         "disables the hold.", default=MAX_PREQUEUE_MS,
         default_help=f"default {MAX_PREQUEUE_MS:g}", minimum=0),
    Flag("--probe-when", "choice", "idle: skip a GPU another process computes on; always: run "
         "anyway.", default_help=_per_suite("probe_when"), choices=("idle", "always")),
    Flag("--busy-utilization", "float", "GPU utilization (0..1) above which the GPU counts as "
         "busy.", default=BUSY_UTILIZATION, default_help=f"default {BUSY_UTILIZATION:g}",
         minimum=0),
    Flag("--exclude-pid", "int", "A process of the caller's (its probe), never counted as "
         "another one on the GPU; repeatable.", default=[], repeat=True),
    Flag("--small", "switch", "Tiny shapes (CPU, CI, smoke tests)."),
    Flag("--budget-seconds", "float", "GPU-busy time budget of the cycle, in seconds.",
         default_help=_per_suite("budget_seconds"), cli_default="2, the worker's",
         minimum=0, above=True),
    Flag("--bandwidth", "toggle", "The device-to-device copy.",
         default_help=_per_suite("bandwidth")),
    Flag("--transfers", "toggle", "Host-device copies: pinned and pageable, small and large, "
         "both directions.", default_help=_per_suite("transfers")),
    Flag("--transfer-small-copies", "int", f"Timed {TRANSFER_SMALL_BYTES // 1024} KiB copies "
         "per direction and memory.", default=TRANSFER_SMALL_COPIES,
         default_help=f"default {TRANSFER_SMALL_COPIES}", minimum=1),
    Flag("--transfer-large-copies", "int", f"Timed {TRANSFER_LARGE_BYTES // 1024**2} MiB copies "
         "per direction and memory.", default=TRANSFER_LARGE_COPIES,
         default_help=f"default {TRANSFER_LARGE_COPIES}", minimum=1),
    Flag("--soak-seconds", "float", "Soak instead of one cycle: sustained bf16 matmuls for this "
         "long, with a measurement window of the hot suite's kernels before and every "
         "--window-seconds.", minimum=0, above=True),
    Flag("--window-seconds", "float", "Seconds between two soak measurement windows.",
         default=SOAK_WINDOW_SECONDS, default_help=f"default {SOAK_WINDOW_SECONDS:g}",
         minimum=0, above=True),
    Flag("--soak-margin-celsius", "float", "Stop the soak this far below the GPU's slowdown "
         "threshold and the memory's maximum temperature.", default=SOAK_MARGIN_CELSIUS,
         default_help=f"default {SOAK_MARGIN_CELSIUS:g}", minimum=0),
    Flag("--soak-chunk-ms", "float", "Load between two checks of the stop conditions.",
         default=SOAK_CHUNK_MS, default_help=f"default {SOAK_CHUNK_MS:g} ms", minimum=0,
         above=True),
    Flag("--soak-load-edge", "int", "Edge of the soak's bf16 load cube.",
         default_help="default: the compute cube, 256 with --small", minimum=1),
    Flag("--seed", "int", "Seed of the random inputs.", default=1234,
         default_help="default 1234"),
    Flag("--cpu-threads", "int", "Torch threads with --device cpu.", default=1,
         default_help="default 1: CPU runs are tests and smoke runs, and one thread keeps them "
         "quick and steady on a shared machine"),
    Flag("--progress", "switch", f"After each kernel, print '{PROGRESS_PREFIX}<json>' on "
         "stderr."),
)  # fmt: skip
FLAGS_BY_NAME = {flag.name: flag for flag in FLAGS}


def order_by_kind(specs: Sequence[KernelSpec]) -> list[KernelSpec]:
    """Every compute kernel first, then the LLM and the decode ones (stable within a kind)."""
    rank = {"compute": 0, "llm": 1, "decode": 2}
    return sorted(specs, key=lambda s: rank.get(s.kind, 3))


def plan_groups(specs: Sequence[KernelSpec], together: Sequence[str]) -> list[list[KernelSpec]]:
    """Kernels in the order they run, as groups timed together.

    Kernels of a kind not in ``together`` run alone, first, in plan order; then one group
    per kind in ``together`` (in that order) holds all kernels of that kind.
    """
    groups: list[list[KernelSpec]] = [[s] for s in specs if s.kind not in together]
    for kind in together:
        group = [s for s in specs if s.kind == kind]
        if group:
            groups.append(group)
    return groups


def rotated(items: Sequence[int], shift: int) -> list[int]:
    """``items`` rotated left by ``shift`` (the order of one interleaved round)."""
    if not items:
        return []
    shift %= len(items)
    return list(items[shift:]) + list(items[:shift])


def split_rounds(count: int, rounds: int) -> list[int]:
    """``count`` iterations over ``rounds`` rounds, as evenly as possible, none empty."""
    rounds = max(1, min(rounds, count))
    base, extra = divmod(count, rounds)
    return [base + (1 if r < extra else 0) for r in range(rounds)]


def decode_ratios(results: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """int4 over bf16 and over fp16 at the same decode shape, from the median iteration (peak);
    None when missing.

    The median, not the delivered figure: a decode kernel runs whole inside another process's
    time slice, so contention removes batches' time between iterations but leaves the median
    iteration alone, while the heat that collapses 4-bit GEMMs slows every int4 iteration. On
    the H200 (docs/device/2026-12-01/part-b) beside a bf16 matmul loop, int4/bf16 from the
    median read 1.54-1.57 (idle 1.59-1.61), from delivered 1.05-2.55.
    """
    decode = {
        r["dtype"]: r
        for r in results
        if r.get("kind") == "decode" and r.get("status") == "ok" and r.get("peak")
    }
    out: dict[str, float | None] = {}
    for other in ("bf16", "fp16"):
        a, b = decode.get("int4"), decode.get(other)
        ok = a is not None and b is not None and a["shape"] == b["shape"]
        out[f"int4/{other}"] = a["peak"] / b["peak"] if ok and a and b else None
    return out


# --------------------------------------------------------------------------
# timing


def spin_up(info: DeviceInfo, milliseconds: float) -> float:
    """Run untimed bf16 matmuls for about ``milliseconds`` of GPU time; return the seconds spent.

    An idle GPU sits at a low clock; the first kernels of a cycle would otherwise be timed while
    it ramps up, which spreads the figures from one cycle to the next.
    """
    torch = info.torch
    a = torch.randn(4096, 4096, device=info.device, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=info.device, dtype=torch.bfloat16)
    spent = 0.0
    batch = 8
    while spent < milliseconds:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            torch.mm(a, b)
        end.record()
        torch.cuda.synchronize()
        spent += float(start.elapsed_time(end))
        batch = min(batch * 2, 256)
    del a, b
    return spent / 1e3


@dataclass
class Batch:
    """One batch of back-to-back iterations of one kernel.

    iter_ms: per-iteration milliseconds (CUDA events around each iteration; perf_counter on CPU)
    total_ms: from just before the first iteration to just after the last, gaps included
    queued_ahead: CUDA only: the CPU had enqueued the whole batch before the GPU reached its
        first iteration, so no gap in it is the CPU's launch overhead; None when unknown
    """

    iter_ms: list[float]
    total_ms: float
    queued_ahead: bool | None = None

    @property
    def gaps_ms(self) -> float:
        return self.total_ms - math.fsum(self.iter_ms)


@dataclass
class LaunchModel:
    """How long the GPU is held before a batch so that the CPU can enqueue all of it first.

    A sleep kernel holds the stream while the CPU enqueues the batch; then the iterations run
    back to back and the total time measures the GPU, not Python's launch overhead. For no
    iteration to wait on the CPU the sleep must last count * (cpu - gpu), cpu being the CPU
    time to enqueue one iteration (two events and the kernel) and gpu the kernel's own time:
    cpu is measured on the first iterations of every batch (``launch_us`` until then), gpu is
    the previous batch's median. ``margin`` covers the CPU's jitter; ``max_lead_ms`` caps the
    sleep (``queued_ahead`` in the result says whether it was enough).
    """

    launch_us: float
    max_lead_ms: float
    gpu_us: float = 0.0
    margin: float = 1.5

    def lead_ms(self, count: int) -> float:
        per_iteration_us = max(0.0, self.launch_us * self.margin - self.gpu_us)
        return min(self.max_lead_ms, count * per_iteration_us / 1e3 + LEAD_FLOOR_MS)

    def observe(self, launch_us: float | None, gpu_us: float | None) -> None:
        if launch_us is not None and launch_us > 0:
            self.launch_us = launch_us
        if gpu_us is not None and gpu_us > 0:
            self.gpu_us = gpu_us


def sleep_cycles(milliseconds: float, clock_hz: float) -> int:
    """Cycles for torch.cuda._sleep to hold the GPU at least ``milliseconds`` at ``clock_hz``.

    The sleep counts SM cycles; at a lower clock than ``clock_hz`` it lasts longer, never
    shorter, so ``clock_hz`` should be the highest clock the GPU may run at.
    """
    return max(0, int(milliseconds * 1e-3 * clock_hz))


def time_batch(
    info: DeviceInfo,
    fn: Callable[..., Any],
    sets: Sequence[tuple[Any, ...]],
    count: int,
    start: int = 0,
    launch: LaunchModel | None = None,
) -> Batch:
    """Run ``count`` iterations back to back, rotating through ``sets`` from ``start``.

    On CPU every iteration is timed with perf_counter and the total encloses them all. On a GPU
    CUDA events are recorded around every iteration; the total runs from the first iteration's
    start event to the last one's end event, so it counts every gap between iterations (time
    slices another process took, for one). With ``launch`` the GPU is first held by a sleep
    kernel while the CPU enqueues the batch (see LaunchModel). The garbage collector is paused
    while the batch is enqueued.
    """
    torch = info.torch
    if count <= 0:
        return Batch([], 0.0, None)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        if not info.is_cuda:
            out = []
            first = time.perf_counter()
            for i in range(count):
                args = sets[(start + i) % len(sets)]
                t0 = time.perf_counter()
                fn(*args)
                out.append((time.perf_counter() - t0) * 1e3)
            total = (time.perf_counter() - first) * 1e3
            return Batch(out, total, None)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        held: Any = None
        if launch is not None and launch.max_lead_ms > 0 and hasattr(torch.cuda, "_sleep"):
            held = torch.cuda.Event(enable_timing=True)
            held.record()
            torch.cuda._sleep(sleep_cycles(launch.lead_ms(count), info.max_clock_hz))
        probe = min(count, LAUNCH_PROBE_ITERS)
        t0 = time.perf_counter()
        t_probe = t0
        for i in range(count):
            args = sets[(start + i) % len(sets)]
            starts[i].record()
            fn(*args)
            ends[i].record()
            if i + 1 == probe:
                t_probe = time.perf_counter()
        enqueued_ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
    finally:
        if gc_was_enabled:
            gc.enable()
    iter_ms = [float(starts[i].elapsed_time(ends[i])) for i in range(count)]
    total = float(starts[0].elapsed_time(ends[-1]))
    ahead: bool | None = None
    if held is not None:
        ahead = enqueued_ms <= float(held.elapsed_time(starts[0]))
    if launch is not None:
        launch.observe((t_probe - t0) * 1e6 / probe, statistics.median(iter_ms) * 1e3)
    return Batch(iter_ms, total, ahead)


def time_graph(
    info: DeviceInfo,
    fn: Callable[..., Any],
    sets: Sequence[tuple[Any, ...]],
    count: int,
    start: int,
    floor_ms: float = 0.0,
) -> tuple[float, int, float]:
    """One continuous run of CUDA graph replays of at least ``count`` iterations (rotating
    through ``sets`` from ``start``), between two events: the batch with no launch gap of the
    CPU's in it. Returns (its milliseconds, its iterations, GPU milliseconds spent in all).

    Without ``floor_ms`` the whole batch is captured and replayed once. With it the graph holds
    an eighth of the batch (at least one pass over ``sets``), one replay times it, and the run
    replays it as often as ``count`` and 1.1 x the floor need: a replay runs faster than the
    event-timed iterations ``count`` was planned from (on the H200, decode batches planned for
    30 ms took 26.4-29.9 ms as a single replay, 2026-12-01).

    Capturing costs CPU time only; the replays run the iterations back to back whatever their
    launch cost, and a time slice another process takes still falls inside the total. Raises
    whatever torch raises when the kernel cannot be captured.
    """
    torch = info.torch
    chunk = count
    if floor_ms > 0:
        chunk = min(count, max(len(sets), math.ceil(count / GRAPH_CHUNKS)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(chunk):
            fn(*sets[(start + i) % len(sets)])
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    def replay(times: int) -> float:
        begin.record()
        for _ in range(times):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return float(begin.elapsed_time(end))

    try:
        reps = math.ceil(count / max(chunk, 1))
        spent = 0.0
        if floor_ms > 0 and chunk > 0:
            once = replay(1)
            spent += once
            reps = max(reps, math.ceil(GRAPH_FLOOR_MARGIN * floor_ms / max(once, 1e-3)))
        total = replay(reps)
        return total, reps * chunk, spent + total
    finally:
        graph.reset()


def figures(
    work: float, iter_ms: Sequence[float], total_ms: float, count: int | None = None
) -> tuple[float, float]:
    """(delivered, peak) in work units per second.

    delivered: the work of all ``count`` iterations (default: those of ``iter_ms``) over their
    total elapsed time, gaps included (what a user of a shared or time-sliced GPU gets); peak:
    the work of one iteration over the median of ``iter_ms`` (comparable with mamf-finder).
    Both nan when there is no timing.
    """
    if not iter_ms or total_ms <= 0:
        return math.nan, math.nan
    median_ms = statistics.median(iter_ms)
    delivered = work * (len(iter_ms) if count is None else count) / (total_ms / 1e3)
    peak = work / (median_ms / 1e3) if median_ms > 0 else math.nan
    return delivered, peak


def parse_kind_values(
    text: str | None, defaults: dict[str, float], what: str, minimum: float = 0.0
) -> dict[str, float]:
    """'4' (every kind) or 'compute=4,decode=0.5' (the rest keep their defaults)."""
    values = dict(defaults)
    if text is None or not text.strip():
        return values
    text = text.strip()
    if "=" not in text:
        value = _kind_number(text, what, minimum)
        return {kind: value for kind in values}
    for item in text.split(","):
        if not item.strip():
            continue
        kind, sep, number = item.partition("=")
        kind = kind.strip().lower()
        if not sep or kind not in values:
            raise UsageError(
                f"bad {what} item {item.strip()!r}: expected KIND=NUMBER with KIND one of "
                + ", ".join(values)
            )
        values[kind] = _kind_number(number, what, minimum)
    return values


def _kind_number(text: str, what: str, minimum: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"bad {what} value {text.strip()!r}: not a number") from None
    if not math.isfinite(value) or value < minimum:
        raise UsageError(f"bad {what} value {text.strip()!r}: must be >= {minimum:g}")
    return value


# --------------------------------------------------------------------------
# suite


def plan_suite(
    info: DeviceInfo,
    dtypes: Sequence[str],
    small: bool,
    shapes: Sequence[Any],
    kinds: Sequence[str] = ("compute", "llm", "decode"),
) -> list[KernelSpec]:
    """The kernels to probe, per dtype: the compute cube (and its beta=1 variant where the
    dtype has one), the LLM shape and the decode shape, those of ``kinds`` only. Custom
    ``shapes`` replace them all, each classified as decode (M <= 32), llm or compute."""
    specs: list[KernelSpec] = []
    if shapes:
        for dtype in dtypes:
            for m, n, k in shapes:
                kind = "decode" if m <= 32 else ("llm" if (m, n, k) == LLM_SHAPE else "compute")
                specs.append(KernelSpec(dtype, kind, (m,), n, k))
        return specs
    if small:
        cube_shape, llm, nk = SMALL_COMPUTE, SMALL_LLM, SMALL_DECODE_NK
    else:
        cube = compute_cube(info.capability or (0, 0), info.sm_count)
        cube_shape, llm, nk = (cube, cube, cube), LLM_SHAPE, DECODE_NK
    for dtype in dtypes:
        table = DTYPES[dtype]
        cm, cn, ck = cube_shape
        if not small:
            cm = cn = ck = table.compute_edge(cm)
        if "compute" in kinds:
            specs.append(KernelSpec(dtype, "compute", (cm,), cn, ck))
            if table.beta_variant:
                specs.append(KernelSpec(dtype, "compute", (cm,), cn, ck, beta=1))
        if "llm" in kinds:
            specs.append(KernelSpec(dtype, "llm", (llm[0],), llm[1], llm[2]))
        if "decode" in kinds:
            specs.append(KernelSpec(dtype, "decode", table.decode_m, nk, nk))
    return specs


def _result(spec: KernelSpec, m: int, status: str, reason: str | None) -> dict[str, Any]:
    """A kernel's entry in the document; the figures stay None unless it was timed.

    delivered: TFLOPS (TOPS for integer dtypes) over the timed batch's total time, gaps included
    peak: TFLOPS (TOPS) from the median iteration time
    total_ms: the timed batches' total elapsed time; gaps_ms: the part of it between iterations
    queued_ahead: every timed batch was enqueued before the GPU began it (CUDA), else None
    batches: how many back-to-back batches the timed iterations ran in (rounds)
    timing: "events" (per-iteration CUDA events; perf_counter on CPU) or "graph" (delivered
        from CUDA graph replays, peak and the median from a short event-timed batch beside
        each; gaps_ms and queued_ahead then None)
    """
    return {
        "dtype": spec.dtype,
        "shape": shape_label(m, spec.n, spec.k),
        "kind": spec.kind,
        "beta": spec.beta,
        "status": status,
        "reason": reason,
        "delivered": None,
        "peak": None,
        "total_ms": None,
        "median_ms": None,
        "min_ms": None,
        "gaps_ms": None,
        "queued_ahead": None,
        "iters": 0,
        "batches": 0,
        "timing": None,
        "warmup": 0,
        "buffer_sets": 0,
        "max_rel_error": None,
        "error_bound": DTYPES[spec.dtype].error_bound,
    }


@dataclass
class Budget:
    """GPU-busy time left for the kernels still to run, shared out by weight: compute-bound
    kernels get more (their batch must span the power-cap controller's swings), memory-bound
    ones less (many short iterations fit in little time). Plans for ``fraction`` of the
    seconds, keeping headroom for warm-ups and minimum iteration counts."""

    seconds: float
    kernels_left: int
    busy: float = 0.0
    weight_left: float = 0.0
    fraction: float = BUDGET_PLANNING_FRACTION

    def share(self, weight: float = 1.0) -> float:
        target = self.seconds * self.fraction
        total = self.weight_left if self.weight_left > 0 else max(1, self.kernels_left)
        return max(0.0, target - self.busy) * weight / total

    def done(self, weight: float = 1.0) -> None:
        self.kernels_left = max(0, self.kernels_left - 1)
        self.weight_left = max(0.0, self.weight_left - weight)


class BusyDuringRun(Exception):
    pass


def _check_busy(busy: BusyState, args: argparse.Namespace) -> None:
    why_busy = busy.check_during()
    if why_busy and args.probe_when == "idle":
        raise BusyDuringRun(why_busy)


class KernelRun:
    """One kernel through its life: set up and checked once, warmed up, timed in batches.

    Every batch's GPU time is charged to ``budget.busy``. ``summary()`` gives the kernel's
    document entry; ``release()`` drops its buffers.
    """

    def __init__(
        self, info: DeviceInfo, spec: KernelSpec, args: argparse.Namespace, budget: Budget
    ) -> None:
        self.info = info
        self.spec = spec
        self.args = args
        self.budget = budget
        self.table = DTYPES[spec.dtype]
        self.m = spec.m_candidates[0]
        self.result = _result(spec, self.m, "ok", None)
        self.prepared: Prepared | None = None
        self.sets: list[tuple[Any, ...]] = []
        self.launch = LaunchModel(args.launch_us, args.max_prequeue_ms)
        self.position = 0
        self.warm_ms: list[float] = []
        self.iter_ms: list[float] = []
        self.total_ms = 0.0
        self.batches = 0
        self.ahead: list[bool] = []
        self.timed = 0  # iterations in total_ms (the graph's, not the peak batch's)
        self.graphed = 0  # timed batches replayed as a CUDA graph
        # decode kernels on a GPU are timed as graph replays until one fails to capture
        self.graph = bool(getattr(args, "graphs", False)) and info.is_cuda and spec.kind == "decode"

    @property
    def ready(self) -> bool:
        return self.prepared is not None and self.result["status"] == "ok"

    @property
    def work(self) -> float:
        """Operations of one iteration: 2 M N K."""
        return 2.0 * self.m * self.spec.n * self.spec.k

    @contextlib.contextmanager
    def _precision(self) -> Iterator[None]:
        torch = self.info.torch
        needed = self.table.matmul_precision
        if needed is None:
            yield
            return
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(needed)
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(before)

    def _fail(self, status: str, reason: str | None) -> bool:
        self.result = _result(self.spec, self.m, status, reason)
        self.release()
        return False

    def setup(self) -> bool:
        """Gate, the first M the kernel accepts, a correctness check, rotation sets.

        Returns True when the kernel is ready to time; otherwise the result says why not.
        """
        info, spec, torch = self.info, self.spec, self.info.torch
        reason = gate(info, spec.dtype)
        if reason is not None:
            return self._fail("unsupported", reason)
        try:
            with self._precision():
                out: Any = None
                last_exc: BaseException | None = None
                for m in spec.m_candidates:
                    self.m = m
                    try:
                        self.prepared = prepare(info, spec, m)
                        self.sets = [self.prepared.make_set()]
                        out = self.prepared.fn(*self.sets[0])
                        if info.is_cuda:
                            torch.cuda.synchronize()
                        last_exc = None
                        break
                    except Exception as exc:
                        last_exc = exc
                        self.prepared, self.sets, out = None, [], None
                if last_exc is not None or self.prepared is None:
                    failure = last_exc or RuntimeError("no candidate M")
                    return self._fail(*classify_kernel_exception(spec.dtype, failure))
                self.result = _result(spec, self.m, "ok", None)
                rows = _rows(torch, self.m, info.device)
                err = max_row_relative_error(
                    torch, out[rows], self.prepared.reference(self.sets[0], rows)
                )
                self.prepared.release()
                del out
                bound = self.table.error_bound
                if not within_bound(err, bound):
                    self._fail(
                        "error",
                        f"wrong result: max row relative error {err:.3g} exceeds bound {bound:.3g}",
                    )
                    self.result["max_rel_error"] = err
                    return False
                self.result["max_rel_error"] = err
                if spec.kind == "decode" and info.is_cuda:
                    set_bytes = sum(t.numel() * t.element_size() for t in self.sets[0])
                    for _ in range(rotation_sets(set_bytes, info.l2_bytes) - 1):
                        self.sets.append(self.prepared.make_set())
                self.result["buffer_sets"] = len(self.sets)
                return True
        except Exception as exc:
            return self._fail(*classify_exception(exc))

    def _batch(self, count: int) -> Batch:
        assert self.prepared is not None
        with self._precision():
            batch = time_batch(
                self.info, self.prepared.fn, self.sets, count, self.position, self.launch
            )
        self.position = (self.position + count) % len(self.sets)
        self.budget.busy += batch.total_ms / 1e3
        return batch

    def warm_up(self, count: int, floor_ms: float) -> None:
        """``count`` iterations, then more until the warm-up lasted ``floor_ms`` (GPU only)."""
        spent = 0.0
        if count > 0:
            batch = self._batch(count)
            self.warm_ms += batch.iter_ms
            spent += batch.total_ms
        while self.info.is_cuda and spent < floor_ms and len(self.warm_ms) < MAX_WARMUP_ITERS:
            per = statistics.median(self.warm_ms) if self.warm_ms else 0.0
            more = 1 if per <= 0 else max(1, int((floor_ms - spent) / max(per, 1e-3)))
            more = min(more, MAX_WARMUP_ITERS - len(self.warm_ms))
            batch = self._batch(more)
            self.warm_ms += batch.iter_ms
            spent += batch.total_ms

    def measure(self, count: int) -> None:
        """One timed batch of ``count`` back-to-back iterations, added to the kernel's figures:
        a CUDA graph replay and a short event-timed batch for the median (decode kernels on a
        GPU), else one event-timed batch."""
        if self.graph and count > 0:
            graphed = self._graph_batch(count)
            if graphed is not None:
                total, iters = graphed
                peak = self._batch(min(count, PEAK_BATCH_ITERS))
                self.iter_ms += peak.iter_ms
                self.total_ms += total
                self.timed += iters
                self.batches += 1
                self.graphed += 1
                return
        batch = self._batch(count)
        self.iter_ms += batch.iter_ms
        self.total_ms += batch.total_ms
        self.timed += len(batch.iter_ms)
        self.batches += 1
        if batch.queued_ahead is not None:
            self.ahead.append(batch.queued_ahead)

    def _graph_batch(self, count: int) -> tuple[float, int] | None:
        """The graph replays' milliseconds and iterations, or None (and events from now on)
        when the kernel cannot be captured."""
        assert self.prepared is not None
        try:
            with self._precision():
                total, iters, spent = time_graph(
                    self.info,
                    self.prepared.fn,
                    self.sets,
                    count,
                    self.position,
                    min_batch_ms(self.args, self.info),
                )
        except Exception as exc:
            self.graph = False
            _log(f"{self.spec.dtype} {self.spec.kind}: no CUDA graph ({exc}); timed with events")
            with contextlib.suppress(Exception):
                self.info.torch.cuda.synchronize()
            return None
        self.position = (self.position + count) % len(self.sets)
        self.budget.busy += spent / 1e3
        return total, iters

    def reset_timing(self) -> None:
        """Forget the warm-up and timed iterations (a soak measures the kernel again)."""
        self.warm_ms, self.iter_ms, self.ahead = [], [], []
        self.total_ms = 0.0
        self.batches = self.timed = self.graphed = 0

    def summary(self) -> dict[str, Any]:
        result = dict(self.result)
        if result["status"] != "ok" or not self.iter_ms:
            return result
        delivered, peak = figures(self.work, self.iter_ms, self.total_ms, self.timed)
        graphed = self.graphed > 0
        result.update(
            delivered=delivered / 1e12,
            peak=peak / 1e12,
            total_ms=self.total_ms,
            median_ms=statistics.median(self.iter_ms),
            min_ms=min(self.iter_ms),
            gaps_ms=None if graphed else self.total_ms - math.fsum(self.iter_ms),
            queued_ahead=all(self.ahead) if self.ahead and not graphed else None,
            iters=self.timed,
            batches=self.batches,
            timing="graph" if graphed else "events",
            warmup=len(self.warm_ms),
        )
        return result

    def release(self) -> None:
        self.sets.clear()
        if self.prepared is not None:
            self.prepared.release()
        self.prepared = None


def time_runs(
    runs: Sequence[KernelRun],
    live: list[int],
    args: argparse.Namespace,
    budget: Budget,
    rounds: int,
    plans: dict[int, list[int]] | None = None,
) -> dict[int, list[int]]:
    """Warm up every live run, then time them all in interleaved rounds.

    Without ``plans`` the iteration counts are shared out of ``budget`` once every warm-up is
    paid, and split into ``rounds`` batches; each round runs the kernels in a rotated order, so
    that no kernel always follows the same one. A run that fails is dropped from ``live``.
    Returns the plans used (per run, the iterations of each round), to repeat them.
    """
    for i in list(live):
        try:
            runs[i].warm_up(args.warmup, args.warmup_ms.get(runs[i].spec.kind, 0.0))
        except Exception as exc:
            runs[i]._fail(*classify_exception(exc))
            live.remove(i)
    if plans is None:
        shares = {i: budget.share(args.kind_weights.get(runs[i].spec.kind, 1.0)) for i in live}
        plans = {
            i: split_rounds(
                choose_iters(
                    args.iters,
                    runs[i].warm_ms,
                    shares[i],
                    0.0,
                    args.min_iters,
                    args.max_iters,
                    min_batch_ms(args, runs[i].info),
                    rounds,
                ),
                rounds,
            )
            for i in live
        }
    todo = {i: plan for i, plan in plans.items() if i in live}
    for r in range(max((len(plan) for plan in todo.values()), default=0)):
        for i in rotated(live, r):
            if i in todo and r < len(todo[i]):
                try:
                    runs[i].measure(todo[i][r])
                except Exception as exc:
                    runs[i]._fail(*classify_exception(exc))
                    live.remove(i)
                    del todo[i]
    return plans


def run_group(
    info: DeviceInfo,
    specs: Sequence[KernelSpec],
    args: argparse.Namespace,
    budget: Budget,
    busy: BusyState,
    rounds: int = 1,
) -> list[dict[str, Any]]:
    """Set up and check every kernel of the group, warm each up, then time them all
    (time_runs); the group's kernels are charged to ``budget`` and settled in it."""
    runs = [KernelRun(info, spec, args, budget) for spec in specs]
    settled: set[int] = set()

    def settle(i: int) -> None:
        if i not in settled:
            settled.add(i)
            budget.done(args.kind_weights.get(runs[i].spec.kind, 1.0))

    try:
        live: list[int] = []
        for i, run in enumerate(runs):
            spec = run.spec
            _log(f"{spec.dtype} {spec.kind} {spec.m_candidates[0]}x{spec.n}x{spec.k}")
            if run.setup():
                live.append(i)
            else:
                settle(i)  # its share goes to the kernels that run
        if live:
            _check_busy(busy, args)
            time_runs(runs, live, args, budget, rounds)
            _check_busy(busy, args)
        return [run.summary() for run in runs]
    finally:
        for i, run in enumerate(runs):
            settle(i)
            run.release()
        if info.is_cuda:
            info.torch.cuda.empty_cache()


def run_kernel(
    info: DeviceInfo, spec: KernelSpec, args: argparse.Namespace, budget: Budget, busy: BusyState
) -> dict[str, Any]:
    """Set up, check, warm up and time one kernel in one back-to-back batch."""
    return run_group(info, [spec], args, budget, busy, rounds=1)[0]


def run_bandwidth(
    info: DeviceInfo, args: argparse.Namespace, budget: Budget, small: bool
) -> dict[str, Any]:
    """Device-to-device copy: delivered and peak in bytes/s (bytes read plus bytes written)."""
    torch = info.torch
    weight = args.kind_weights.get("bandwidth", 1.0)
    result: dict[str, Any] = {
        "status": "ok",
        "reason": None,
        "delivered": None,
        "peak": None,
        "bytes": None,
        "median_ms": None,
        "total_ms": None,
        "iters": 0,
    }
    try:
        if small:
            size = 16 * 1024**2
        elif info.is_cuda:
            free, _total = torch.cuda.mem_get_info()
            size = min(1024**3, max(64 * 1024**2, int(free) // 8))
        else:
            size = 256 * 1024**2
        n = size // 4
        src = torch.randn(n, device=info.device, dtype=torch.float32)
        dst = torch.empty_like(src)

        def copy(s: Any, d: Any) -> Any:
            return d.copy_(s)

        sets = [(src, dst)]
        copy(src, dst)
        if not bool(torch.equal(dst[:65536], src[:65536])) or not bool(
            torch.equal(dst[-65536:], src[-65536:])
        ):
            result.update(status="error", reason="device copy produced wrong data")
            return result
        launch = LaunchModel(args.launch_us, args.max_prequeue_ms)
        warm = time_batch(info, copy, sets, max(1, args.warmup), 0, launch)
        budget.busy += warm.total_ms / 1e3
        share = budget.share(weight)
        iters = choose_iters(
            args.iters,
            warm.iter_ms,
            share,
            0.0,
            args.min_iters,
            args.max_iters,
            min_batch_ms(args, info),
        )
        timed = time_batch(info, copy, sets, iters, 0, launch)
        budget.busy += timed.total_ms / 1e3
        moved = 2 * n * 4  # bytes read plus bytes written
        delivered, peak = figures(moved, timed.iter_ms, timed.total_ms)
        result.update(
            bytes=moved,
            delivered=delivered,
            peak=peak,
            median_ms=statistics.median(timed.iter_ms),
            total_ms=timed.total_ms,
            iters=iters,
        )
        return result
    except Exception as exc:
        status, why = classify_exception(exc)
        result.update(status=status, reason=why)
        return result
    finally:
        budget.done(weight)
        if info.is_cuda:
            torch.cuda.empty_cache()


def _transfer_entry(
    direction: str, memory: str, size: int, copies: int, status: str, reason: str | None
) -> dict[str, Any]:
    """A host-device copy's entry: delivered in bytes/s over total_ms (all copies, gaps in)."""
    return {
        "direction": direction,
        "memory": memory,
        "size_bytes": size,
        "copies": copies,
        "status": status,
        "reason": reason,
        "delivered": None,
        "total_ms": None,
    }


def transfer_plan(args: argparse.Namespace, small: bool) -> list[tuple[str, int, int, str]]:
    """(memory, size, copies, direction) in the order they run: pinned first, then pageable;
    many small copies, then a few large ones; host to device, then device to host."""
    large = SMALL_TRANSFER_LARGE_BYTES if small else TRANSFER_LARGE_BYTES
    plan = []
    for memory in ("pinned", "pageable"):
        for size, copies in (
            (TRANSFER_SMALL_BYTES, args.transfer_small_copies),
            (large, args.transfer_large_copies),
        ):
            for direction in ("h2d", "d2h"):
                plan.append((memory, size, copies, direction))
    return plan


def measure_copies(
    info: DeviceInfo,
    copy: Callable[[], Any],
    verify: Callable[[], bool],
    entry: dict[str, Any],
    budget: Budget,
) -> dict[str, Any]:
    """One untimed copy whose data ``verify`` checks, then ``entry["copies"]`` timed copies.

    Timed as an application's copy loop sees it: from an event before the first copy to one
    after the last (perf_counter on CPU), the CPU's launch cost included, no prequeue hold.
    Both the checked copy and the timed ones are charged to the budget.
    """
    torch = info.torch
    size, copies = entry["size_bytes"], entry["copies"]

    def timed(count: int) -> float:
        if not info.is_cuda:
            t0 = time.perf_counter()
            for _ in range(count):
                copy()
            return (time.perf_counter() - t0) * 1e3
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(count):
            copy()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end))

    first = timed(1)
    budget.busy += first / 1e3
    if not verify():
        entry.update(status="error", reason=f"{entry['direction']} copy produced wrong data")
        return entry
    total = timed(copies)
    budget.busy += total / 1e3
    entry.update(total_ms=total, delivered=size * copies / (total / 1e3) if total > 0 else None)
    return entry


def _copy_pair(
    torch: Any, direction: str, truth: Any, host_truth: Any, pinned: bool
) -> tuple[Callable[[], Any], Callable[[], bool]]:
    """The copy of one direction and the check of its data.

    ``truth`` is random data on the device and ``host_truth`` the same data in host memory:
    h2d copies host_truth into a device buffer and compares it with truth on the device; d2h
    copies truth into a zeroed host buffer and compares it with host_truth.
    """
    if direction == "h2d":
        dev = torch.empty_like(truth)

        def copy_h2d() -> Any:
            return dev.copy_(host_truth, non_blocking=True)

        def verify_h2d() -> bool:
            return bool(torch.equal(dev, truth))

        return copy_h2d, verify_h2d
    host = torch.zeros(truth.numel(), dtype=truth.dtype, pin_memory=pinned)

    def copy_d2h() -> Any:
        return host.copy_(truth, non_blocking=True)

    def verify_d2h() -> bool:
        torch.cuda.synchronize()
        return bool(torch.equal(host, host_truth))

    return copy_d2h, verify_d2h


def _one_transfer(info: DeviceInfo, entry: dict[str, Any], budget: Budget) -> None:
    """Allocate, fill, check and time one kind of copy; its buffers go when it returns."""
    torch = info.torch
    pinned = entry["memory"] == "pinned"
    words = entry["size_bytes"] // 8
    truth = torch.randint(-(2**62), 2**62, (words,), device=info.device, dtype=torch.int64)
    host_truth = torch.empty(words, dtype=torch.int64, pin_memory=pinned)
    host_truth.copy_(truth)
    copy, verify = _copy_pair(torch, entry["direction"], truth, host_truth, pinned)
    measure_copies(info, copy, verify, entry, budget)


def run_transfers(
    info: DeviceInfo, args: argparse.Namespace, budget: Budget, small: bool
) -> list[dict[str, Any]]:
    """Host-device copies: pinned and pageable host memory, small and large, both directions.

    The data of each kind of copy is checked once against what was sent. On a GPU without
    unified memory this measures the PCIe link in transfer terms (Gen5 x16: 64 GB/s per
    direction in theory); on GB10 small pageable copies were reported ~50x slower than pinned.
    """
    plan = transfer_plan(args, small)
    if not info.is_cuda:
        why = "host-device copies need a CUDA device; --device cpu has none"
        return [_transfer_entry(d, m, s, c, "unsupported", why) for m, s, c, d in plan]
    entries: list[dict[str, Any]] = []
    for memory, size, copies, direction in plan:
        entry = _transfer_entry(direction, memory, size, copies, "ok", None)
        entries.append(entry)
        try:
            _one_transfer(info, entry, budget)
        except Exception as exc:
            status, why = classify_exception(exc)
            entry.update(status=status, reason=why)
        finally:
            info.torch.cuda.synchronize()
            info.torch.cuda.empty_cache()
    return entries


# --------------------------------------------------------------------------
# soak


class StopRequest:
    """Set by SIGINT or SIGTERM during a soak; the loop stops cleanly at its next check."""

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
    """SIGINT and SIGTERM set ``stop`` instead of ending the process (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
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
                _log(f"soak: {spec.dtype} {spec.kind} {spec.m_candidates[0]}x{spec.n}x{spec.k}")
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


# --------------------------------------------------------------------------
# identity


def cublas_version() -> str | None:
    """Version of the libcublas this process loaded (Linux), e.g. '13.1.0'."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            paths = {
                line.split()[-1]
                for line in fh
                if "libcublas.so" in line and "libcublasLt" not in line
            }
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
            parts = []
            for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
                value = ctypes.c_int()
                if lib.cublasGetProperty(prop, ctypes.byref(value)) != 0:
                    break
                parts.append(str(value.value))
            if len(parts) == 3:
                return ".".join(parts)
        except (OSError, AttributeError):
            continue
    return None


def driver_version(nvml: Nvml | None) -> str | None:
    if nvml is not None:
        value = nvml.driver_version()
        if value:
            return value
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as fh:
            found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", fh.read())
        return found.group(1) if found else None
    except OSError:
        return None


def software_identity(
    torch: Any, info: DeviceInfo | None, device: str, nvml: Nvml | None
) -> dict[str, Any]:
    ident: dict[str, Any] = {
        "torch": None if torch is None else str(torch.__version__),
        "cuda": None if torch is None else torch.version.cuda,
        "cublas": None,
        "driver": driver_version(nvml),
        "python": platform.python_version(),
        "gpu_name": None,
        "compute_capability": None,
        "gpu_uuid": None,
        "device": device,
    }
    if nvml is not None:
        ident["gpu_name"] = nvml.name()
        ident["gpu_uuid"] = nvml.uuid()
    if info is not None and info.is_cuda:
        idx = torch.device(device).index or 0
        ident["gpu_name"] = torch.cuda.get_device_name(idx)
        if info.capability is not None:
            ident["compute_capability"] = f"{info.capability[0]}.{info.capability[1]}"
        props = torch.cuda.get_device_properties(idx)
        uuid = getattr(props, "uuid", None)
        if uuid is not None:
            text = str(uuid)
            ident["gpu_uuid"] = text if text.startswith("GPU-") else "GPU-" + text
        ident["cublas"] = cublas_version()
    return ident


# --------------------------------------------------------------------------
# main


def _log(message: str) -> None:
    print(f"sparkdiag-probe: {message}", file=sys.stderr, flush=True)


def progress(item: dict[str, Any]) -> None:
    """One progress line on stderr: PROGRESS_PREFIX and a JSON object."""
    line = json.dumps(_jsonable(item), allow_nan=False)
    print(PROGRESS_PREFIX + line, file=sys.stderr, flush=True)


def max_sm_clock_hz(props: Any, nvml: Nvml | None) -> float:
    """The GPU's highest SM clock in Hz (torch's clock_rate, else NVML), else SLEEP_CLOCK_HZ."""
    khz = getattr(props, "clock_rate", None)
    if isinstance(khz, (int, float)) and khz > 0:
        return float(khz) * 1e3
    mhz = nvml.max_sm_clock_mhz() if nvml is not None else None
    return float(mhz) * 1e6 if mhz else SLEEP_CLOCK_HZ


def _now() -> float:
    return time.time()


def _empty_document(started: float) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "status": "error",
        "reason": None,
        "software": {
            "torch": None,
            "cuda": None,
            "cublas": None,
            "driver": None,
            "python": platform.python_version(),
            "gpu_name": None,
            "compute_capability": None,
            "gpu_uuid": None,
            "device": None,
        },
        "suite": None,
        "results": [],
        "ratios": {},
        "bandwidth": None,
        "transfers": [],
        "soak": None,
        "conditions": summarize_conditions([]),
        "busy": {"other_pids": [], "utilization": None, "nvml": False},
        "gpu_busy_seconds": 0.0,
        "config": None,
        "started_at": started,
        "finished_at": None,
    }


def _item_name(item: dict[str, Any]) -> str:
    if "direction" in item:
        return f"{item['memory']} {item['direction']} {item['size_bytes']} B copies"
    return f"{item.get('dtype', 'bandwidth')} {item.get('shape', '')}".strip()


def overall_status(doc: dict[str, Any]) -> tuple[str, str | None]:
    results = doc.get("results") or []
    bandwidth = doc.get("bandwidth")
    transfers = doc.get("transfers") or []
    items = list(results) + ([bandwidth] if bandwidth else []) + list(transfers)
    failed = [r for r in items if r.get("status") == "error"]
    if failed:
        names = [_item_name(r) for r in failed]
        return "error", f"{len(failed)} kernel(s) failed: " + ", ".join(names)
    if items and all(r.get("status") == "unsupported" for r in items):
        return "unsupported", "no requested kernel is supported here"
    if not items:
        return "unsupported", "nothing to probe"
    return "ok", None


def run(args: argparse.Namespace, doc: dict[str, Any]) -> None:
    """One cycle of the suite, or a soak; fills ``doc``."""
    if args.soak_seconds is None:
        _run(args, doc, None)
        return
    stop = StopRequest()
    with stop_on_signals(stop):  # from the start: a Ctrl-C during torch's import counts too
        _run(args, doc, stop)


def _run(args: argparse.Namespace, doc: dict[str, Any], stop: StopRequest | None) -> None:
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA index == NVML index
    try:
        import torch
    except ImportError as exc:
        raise TorchUnavailable(f"cannot import torch: {exc}") from exc

    doc["software"]["torch"] = str(torch.__version__)
    doc["software"]["cuda"] = torch.version.cuda
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        device = "cuda:0"
    doc["software"]["device"] = device
    is_cuda = device.startswith("cuda")
    if not is_cuda and device != "cpu":
        raise UsageError(f"--device must be cuda[:N] or cpu, not {device!r}")
    small = args.small or not is_cuda
    if not is_cuda and args.cpu_threads > 0:
        torch.set_num_threads(args.cpu_threads)
    doc["suite"] = args.suite if stop is None else "soak"
    doc["config"] = {
        "suite": args.suite,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "iters": args.iters,
        "budget_seconds": args.budget_seconds,
        "probe_when": args.probe_when,
        "busy_utilization": args.busy_utilization,
        "small": small,
        "dtypes": args.dtype,
        "warmup_ms": args.warmup_ms,
        "spinup_ms": args.spinup_ms,
        "kind_weights": args.kind_weights,
        "order": args.order,
        "budget_fraction": args.budget_fraction,
        "min_iters": args.min_iters,
        "min_batch_ms": args.min_batch_ms,
        "graphs": args.graphs,
        "max_iters": args.max_iters,
        "launch_us": args.launch_us,
        "max_prequeue_ms": args.max_prequeue_ms,
        "transfers": args.transfers,
        "transfer_small_copies": args.transfer_small_copies,
        "transfer_large_copies": args.transfer_large_copies,
        "soak_seconds": args.soak_seconds,
        "window_seconds": args.window_seconds,
    }
    cuda_index = 0
    if is_cuda:
        try:
            cuda_index = torch.device(device).index or 0
        except Exception as exc:
            raise UsageError(f"bad --device {device!r}: {exc}") from exc
        if not torch.cuda.is_available() or cuda_index >= torch.cuda.device_count():
            doc["status"] = "unsupported"
            doc["reason"] = (
                f"{device} is not available to torch {torch.__version__} "
                f"(CUDA build: {torch.version.cuda}, devices: "
                f"{torch.cuda.device_count() if torch.cuda.is_available() else 0})"
            )
            return

    nvml = Nvml.open(cuda_index) if is_cuda else None
    busy = BusyState(nvml, set(args.exclude_pid) | {os.getpid()}, args.busy_utilization)
    busy.self_pids.add(os.getpid())
    doc["busy"]["nvml"] = nvml is not None
    try:
        why = busy.check_before_context()
        doc["busy"]["other_pids"] = busy.other_pids
        doc["busy"]["utilization"] = busy.utilization
        doc["software"] = software_identity(torch, None, device, nvml)
        if why and args.probe_when == "idle":
            doc["status"], doc["reason"] = "skipped_busy", why
            return

        torch.manual_seed(args.seed)
        capability: tuple[int, int] | None = None
        sm_count, l2, clock_hz = 0, ASSUMED_L2_BYTES, SLEEP_CLOCK_HZ
        if is_cuda:
            before = (nvml.compute_pids() if nvml else None) or set()
            torch.cuda.set_device(cuda_index)
            torch.zeros(1, device=device)  # creates the context
            props = torch.cuda.get_device_properties(cuda_index)
            capability = (int(props.major), int(props.minor))
            sm_count = int(props.multi_processor_count)
            l2 = int(getattr(props, "L2_cache_size", 0) or ASSUMED_L2_BYTES)
            clock_hz = max_sm_clock_hz(props, nvml)
            if nvml is not None:
                uuid = getattr(props, "uuid", None)
                want = None if uuid is None else _bare_uuid(str(uuid))
                have = _bare_uuid(nvml.uuid() or "")
                if want and have and want != have:
                    _log(f"NVML device {have} is not {want}; rebinding by UUID")
                    nvml.rebind("GPU-" + want)
                    before = set()
                busy.adopt_own_context(before)
        info = DeviceInfo(
            torch=torch,
            device=device,
            is_cuda=is_cuda,
            capability=capability,
            sm_count=sm_count,
            l2_bytes=l2,
            torch_version=torch_version_tuple(str(torch.__version__)),
            max_clock_hz=clock_hz,
        )
        if stop is not None:
            run_soak(info, args, nvml, doc, small, stop)
            doc["software"] = software_identity(torch, info, device, nvml)
            return
        suite = SUITES[args.suite]
        specs = plan_suite(info, args.dtype, small, args.shape, suite.kinds)
        if args.order == "kind":
            specs = order_by_kind(specs)
        groups = plan_groups(specs, suite.together)
        weights = args.kind_weights
        budget = Budget(
            args.budget_seconds,
            len(specs) + (1 if args.bandwidth else 0),
            fraction=args.budget_fraction,
        )
        budget.weight_left = sum(weights.get(s.kind, 1.0) for s in specs) + (
            weights.get("bandwidth", 1.0) if args.bandwidth else 0.0
        )
        sampler = ConditionSampler(nvml)
        sampler.start()
        try:
            if args.transfers:  # first: their GPU time is paid before the kernels share the rest
                doc["transfers"] = run_transfers(info, args, budget, small)
            if info.is_cuda and args.spinup_ms > 0:
                budget.busy += spin_up(info, args.spinup_ms)
            for group in groups:
                together = len(group) > 1 or group[0].kind in suite.together
                rounds = args.rounds if together else 1
                for result in run_group(info, group, args, budget, busy, rounds):
                    doc["results"].append(result)
                    if args.progress:
                        progress({"done": len(doc["results"]), "total": len(specs), **result})
            if args.bandwidth:
                doc["bandwidth"] = run_bandwidth(info, args, budget, small)
        except BusyDuringRun as exc:
            doc["status"], doc["reason"] = "skipped_busy", str(exc)
        finally:
            doc["conditions"] = sampler.stop()
            doc["ratios"] = decode_ratios(doc["results"])
            doc["gpu_busy_seconds"] = budget.busy
            doc["busy"]["other_pids"] = busy.other_pids
            doc["software"] = software_identity(torch, info, device, nvml)
        if doc["status"] != "skipped_busy":
            doc["status"], doc["reason"] = overall_status(doc)
    finally:
        if nvml is not None:
            nvml.shutdown()


def watch_parent(period: float = 0.5) -> threading.Thread:
    """End this worker (SIGTERM to itself) once its parent is gone.

    The runner starts a worker in its own session and kills its process group at the timeout;
    should the process that started it die first (sparkdiag killed with SIGKILL), nothing would
    enforce the timeout any more. A soak then stops as on Ctrl-C (the GPU left idle); any
    other run ends at once. Parentless from the start (PID 1's child), nothing is watched.
    """
    parent = os.getppid()

    def loop() -> None:
        while parent > 1:
            time.sleep(period)
            if os.getppid() != parent:
                _log(f"parent {parent} is gone: stopping")
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=loop, name="parent-watch", daemon=True)
    thread.start()
    return thread


def main(argv: Sequence[str] | None = None) -> int:
    started = _now()
    watch_parent()
    # Keep stdout for the one JSON document: anything else that writes to
    # file descriptor 1 (torch, CUDA libraries, print) lands on stderr.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    doc = _empty_document(started)
    code = 0
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        doc["status"] = "ok"
        run(args, doc)
    except UsageError as exc:
        doc["status"], doc["reason"], code = "error", f"usage: {exc}", 2
    except TorchUnavailable as exc:
        doc["status"], doc["reason"], code = "error", str(exc), 1
    except Exception:
        doc["status"] = "error"
        doc["reason"] = "worker crashed: " + _truncate(traceback.format_exc(), 8000)
        code = 1
    doc["finished_at"] = _now()
    text = json.dumps(_jsonable(doc), allow_nan=False, sort_keys=False) + "\n"
    data = text.encode("utf-8")
    while data:
        written = os.write(out_fd, data)
        data = data[written:]
    os.close(out_fd)
    return code


if __name__ == "__main__":
    sys.exit(main())
