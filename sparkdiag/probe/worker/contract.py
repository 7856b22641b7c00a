"""The worker's contract: what both sides of the probe agree on, in one stdlib-only module.

sparkdiag (the daemon and the commands, which never import torch) and the worker (which runs in
a fresh interpreter and imports torch inside its functions) both import this module:

- ``SCHEMA`` of the one JSON document the worker prints, and ``PROGRESS_PREFIX`` of its
  progress lines on stderr (``probe/document.py`` parses both);
- ``DTYPES``, what is static about each dtype: its error bound, decode M candidates, compute
  cube, unit (TFLOPS or TOPS: every renderer and docs/metrics.md read it here); the code that
  runs it (gate and prepare) is in ``dtypes.py``;
- ``SUITES``, what each suite probes and its defaults;
- ``FLAGS``, the command line declared once: :func:`parse_args` builds the worker's options from
  it, ``WorkerRequest.argv`` (probe/request.py) writes them (a field per flag, named
  ``Flag.field``) and ``flags.worker_options`` (sparkdiag/flags.py) makes the click flags of
  those a command exposes;
- the defaults sparkdiag shares with the worker (``BUSY_UTILIZATION``: probe.busy-utilization;
  a test holds them equal).

Importing it imports the standard library only (tests/test_probe_worker_script.py holds it).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NoReturn

DESCRIPTION = "sparkdiag GEMM and memory-bandwidth probe worker."

SCHEMA = "sparkdiag-probe/2"
PROGRESS_PREFIX = "sparkdiag-progress "

MIN_ITERS = 5
MAX_ITERS = 4000
# Shortest batch on a GPU (per round): a batch shorter than a time slice can run whole inside
# one and never see another process's work. On the H200 beside a bf16 8192^3 loop, batches of
# 0.1-8 ms read 0.98-1.00 of idle and batches of 9 ms and longer 0.44-0.51 (2026-12-01).
MIN_BATCH_MS = 30.0
# Decode kernels on a GPU (--graphs): delivered from one CUDA graph replay of the batch, peak from
# an event-timed batch of at most this many iterations (three commands each: within the queue).
PEAK_BATCH_ITERS = 128
# Share of the time budget per kernel kind and for the device copy (see Budget, --kind-weights).
KIND_WEIGHTS = {"compute": 4.0, "llm": 1.5, "decode": 0.5, "bandwidth": 1.0}
# Warm-up floor per kind in GPU milliseconds (see --warmup-ms).
WARMUP_MS = {"compute": 25.0, "llm": 25.0, "decode": 25.0, "bandwidth": 0.0}
BUDGET_PLANNING_FRACTION = 0.80  # plan for 80 % of the budget, keep headroom
LAUNCH_US = 60.0  # CPU time to enqueue one iteration assumed before it is measured
MAX_PREQUEUE_MS = 100.0  # longest the GPU is held while a batch is enqueued
TRANSFER_SMALL_BYTES = 64 * 1024  # many small host-device copies
TRANSFER_LARGE_BYTES = 256 * 1024**2  # a few large ones
TRANSFER_SMALL_COPIES = 200
TRANSFER_LARGE_COPIES = 2
SOAK_WINDOW_SECONDS = 5.0
SOAK_MARGIN_CELSIUS = 5.0  # a soak stops this far below a thermal limit
SOAK_CHUNK_MS = 100.0  # load between two checks of the stop conditions
BUSY_UTILIZATION = 0.10  # sparkdiag's probe.busy-utilization default (a test holds them equal)
STORAGE_BLOCK = 1 << 20  # the storage probe's block and threads (storage/measure.py's defaults)
STORAGE_THREADS = 8
STORAGE_SECONDS = 6.0  # the storage mode's reads, shared by its stages

# --------------------------------------------------------------------------
# arguments


class UsageError(Exception):
    """Bad command-line arguments."""


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
    if items and not dtypes:  # --dtype ",,," or "": naming none is not naming all
        raise UsageError(f"no dtype named (known: {', '.join(ALL_DTYPES)}, or all)")
    return dtypes


MAX_DIM = 1 << 20  # a GEMM side: 1,048,576 (mamf-finder sweeps to 20,480)
MAX_ELEMENTS = 1 << 35  # A, B and C together: 64 GiB in bf16, half an H200 or a GB10


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = text.lower().replace(" ", "").split("x")
    digits = len(parts) == 3 and all(p.isascii() and p.isdigit() and len(p) <= 9 for p in parts)
    if not digits or not all(int(p) > 0 for p in parts):  # ² is a digit to isdigit, not int
        raise UsageError(f"bad shape {text!r}: expected MxNxK with positive integers")
    m, n, k = (int(p) for p in parts)
    if max(m, n, k) > MAX_DIM:
        raise UsageError(f"bad shape {text!r}: a side is at most {MAX_DIM}")
    if m * k + k * n + m * n > MAX_ELEMENTS:
        raise UsageError(
            f"shape {text!r} is too large: its matrices hold more than {MAX_ELEMENTS} elements"
        )
    return m, n, k


def shape_label(m: int, n: int, k: int) -> str:
    return f"{m}x{n}x{k}"


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
# the dtype table (what is static about each dtype; the code that runs it: dtypes.py)


INT4_GROUP = 128  # int4's quantisation group: a scale and a zero point per 128 weights of K


def _same_edge(edge: int) -> int:
    return edge


def _int4_edge(edge: int) -> int:
    # weight-only int4 runs ~25x slower than bf16 at large M on Hopper: a smaller cube
    return max(1024, edge // 2)


@dataclass(frozen=True)
class DtypeSpec:
    """What sparkdiag and the worker know about one dtype without torch.

    Adding a dtype is one entry here and one in ``dtypes.DTYPE_KERNELS`` (its gate and prepare
    functions); a test holds the two tables to the same dtypes in the same order.

    error_bound: bound on the largest per-row relative error ||out_i - ref_i|| / ||ref_i||
        against a float64 reference computed from the same (quantised) inputs
    decode_m: candidate M for the decode shape, smallest first: the first one the kernel
        accepts is used (torch._int_mm on CUDA rejects M <= 16, for instance)
    compute_edge: the compute-bound cube's edge for this dtype, given the device's edge
    beta_variant: also probe the compute shape with beta=1 (C = A B + C)
    matmul_precision: torch float32 matmul precision the kernel runs under, if any
    rejection_is_unsupported: a young API, whose rejected calls count as unsupported
    k_multiple: K must be a multiple of this (int4: its quantisation group); a shape whose K is
        not cannot run: the worker reports it unsupported (:func:`shape_problem`) and a
        command refuses it before the worker runs where the dtype was named
    n_multiple: the same for N
    unit: what its throughput is counted in, 2*M*N*K operations a second either way: TFLOPS,
        or TOPS for the integer dtypes (int8's integer multiply; int4 is weight-only, its
        multiply runs in bf16 after dequantisation, and is still counted as an integer dtype,
        as the public metric contract says). Every renderer and docs/metrics.md read it here.
    """

    error_bound: float
    decode_m: tuple[int, ...]
    compute_edge: Callable[[int], int] = _same_edge
    beta_variant: bool = False
    matmul_precision: str | None = None
    rejection_is_unsupported: bool = False
    unit: str = "TFLOPS"
    k_multiple: int = 1
    n_multiple: int = 1


DTYPES: dict[str, DtypeSpec] = {
    "bf16": DtypeSpec(2e-2, (1,), beta_variant=True),
    "fp16": DtypeSpec(2e-2, (1,)),
    # at its decode M of 1 cuBLAS runs an FP32 GEMV, not a TF32 tensor-core kernel (the H200's
    # profiler, docs/device/2026-12-05/verify/): memory-bound, as every decode row
    "tf32": DtypeSpec(5e-3, (1,), matmul_precision="high"),
    # torch's CUDA checks (aten/native/cuda/Blas.cpp): _scaled_mm wants both dimensions of its
    # second matrix divisible by 16, _int_mm K and N multiples of 8 (and M > 16: decode_m, and
    # classify_exception's patterns for a shape given whole). A --shape that broke them failed
    # the cycle as an error, where it is a kernel this shape cannot run (found in a review)
    "fp8": DtypeSpec(5e-2, (1, 16, 32), k_multiple=16, n_multiple=16),
    "int8": DtypeSpec(0.0, (1, 16, 32), unit="TOPS", k_multiple=8, n_multiple=8),  # exact sums
    "int4": DtypeSpec(2e-2, (1,), compute_edge=_int4_edge, unit="TOPS", k_multiple=INT4_GROUP),
    "nvfp4": DtypeSpec(2.5e-1, (1, 16, 32, 128), rejection_is_unsupported=True),
}
ALL_DTYPES = tuple(DTYPES)


def shape_problem(dtype: str, n: int, k: int) -> str | None:
    """Why ``dtype`` cannot run a shape of this N and K (``int4 needs K divisible by 128 (its
    group size), not 64``), or None. The one statement of a dtype's shape limits, read by the
    worker (such a kernel is unsupported, not an error) and by the commands (a usage error
    before the worker runs, for a dtype the user named)."""
    spec = DTYPES.get(dtype)
    if spec is not None and k % spec.k_multiple:
        what = " (its group size)" if dtype == "int4" else ""
        return f"{dtype} needs K divisible by {spec.k_multiple}{what}, not {k}"
    if spec is not None and n % spec.n_multiple:
        return f"{dtype} needs N divisible by {spec.n_multiple}, not {n}"
    return None


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
    # sparkdiag check: the periodic probe narrowed to the dtypes it judges (bf16 and fp16 for
    # throughput, int4 for the 4-bit ratio, fp8 and nvfp4 for dtype-order: without them that
    # row could only skip, "no pair of dtypes to compare", on every GPU), the decode kernels
    # interleaved for the int4 ratio, half the time per kernel, no bandwidth
    "check": replace(
        _DEFAULT_SUITE,
        dtypes=("bf16", "fp16", "fp8", "nvfp4", "int4"),
        together=("decode",),
        rounds=3,
        budget_seconds=1.5,  # 1.0 for bf16, fp16 and int4: fp8 and nvfp4 add their share
        bandwidth=False,
    ),
}

# --------------------------------------------------------------------------
# the command line, declared once: parse_args builds its options from FLAGS, sparkdiag's
# WorkerRequest.argv (probe/request.py) writes them (a field per flag, named Flag.field), and
# flags.worker_options (sparkdiag/flags.py) makes the click flags of those a command exposes.


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
    # no cli_default: each command states its own (found in a review: probe's "each GPU in
    # turn, or cuda:0" was shown by bench, compare and soak, which choose otherwise)
    Flag("--device", "text", "cuda:N or cpu.", default_help="default: cuda if available"),
    Flag("--suite", "choice", "default: every dtype at the compute, LLM and decode shapes, "
         "device copy and host-device copies (the periodic probe); hot: decode and LLM shapes "
         "of int4, bf16, fp16, fp8, nvfp4 within ~100 ms, no spin-up, even on a busy GPU; "
         "check: bf16, fp16, fp8, nvfp4 and int4 for sparkdiag check.",
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
    Flag("--storage-read", "text", "Storage mode instead of a cycle: read this file (opened "
         "with O_DIRECT, never written) into pinned host memory, on into GPU memory, and by "
         "GPUDirect Storage where kvikio is installed (the path into the GPU of 'sparkdiag "
         "storage --gpu').", metavar="FILE"),
    Flag("--storage-size", "int", "Bytes of --storage-read to read.",
         default_help="default: the whole file", minimum=1),
    Flag("--storage-block", "int", "Bytes per read of --storage-read (a multiple of 4096).",
         default=STORAGE_BLOCK, default_help=f"default {STORAGE_BLOCK}", minimum=4096),
    Flag("--storage-threads", "int", "Threads reading --storage-read, each its own share.",
         default=STORAGE_THREADS, default_help=f"default {STORAGE_THREADS}", minimum=1),
    Flag("--storage-seconds", "float", "Seconds the storage mode's reads may take, shared by "
         "its stages (pinned, gpu, gds).", default=STORAGE_SECONDS,
         default_help=f"default {STORAGE_SECONDS:g}", minimum=0, above=True),
    Flag("--storage-gds", "toggle", "In the storage mode, also read by GPUDirect Storage "
         "(kvikio).", default=True, default_help="default on"),
    Flag("--seed", "int", "Seed of the random inputs.", default=1234,
         default_help="default 1234"),
    Flag("--cpu-threads", "int", "Torch threads with --device cpu.", default=1,
         default_help="default 1: CPU runs are tests and smoke runs, and one thread keeps them "
         "quick and steady on a shared machine"),
    Flag("--progress", "switch", f"After each kernel, print '{PROGRESS_PREFIX}<json>' on "
         "stderr."),
)  # fmt: skip
FLAGS_BY_NAME = {flag.name: flag for flag in FLAGS}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The worker's arguments (declared once, in FLAGS); those left out take the defaults of the
    ``--suite`` (SUITES)."""
    p = _Parser(prog="sparkdiag-probe-worker", description=DESCRIPTION)
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
    if args.storage_read is not None and args.soak_seconds is not None:
        raise UsageError("give --storage-read or --soak-seconds, not both")
    if args.storage_block % 4096:
        raise UsageError("--storage-block must be a multiple of 4096 (O_DIRECT)")
    args.kind_weights = parse_kind_values(args.kind_weights, KIND_WEIGHTS, "--kind-weights")
    args.warmup_ms = parse_kind_values(args.warmup_ms, dict(suite.warmup_ms), "--warmup-ms")
    return args
