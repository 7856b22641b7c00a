#!/usr/bin/env python3
"""Ground truth for the probe worker's figures, measured on the lent GPU in one run.

Runs ``sparkdiag/probe/worker`` from this repository as a subprocess (no sparkdiag install
needed; torch, and nvidia-ml-py for temperatures, in the Python that runs this script):

- idle: consecutive default-suite cycles on the idle GPU (default 20): per dtype and shape the
  coefficient of variation of ``delivered`` and ``peak``, and the GPU-busy time per cycle;
- contention: the default suite with ``--probe-when always`` idle and beside a competing
  process (a second Python running a bf16 8192^3 matmul loop on the same GPU, started and
  stopped here): delivered and peak, busy over idle, for every dtype and shape, the device
  copy and the host-device copies;
- hot: the hot suite's int4/bf16 and int4/fp16 decode ratios idle, beside the competing
  process, right after ``--heat-seconds`` (60) of that load (the load is stopped only when the
  worker starts its first kernel, so the GPU is as hot as it gets), and through a worker soak
  of the same length (windows measured inside the load, no gap at all).

Usage (on the device; $OUT is the folder that comes back)::

    python3 scripts/device/probe_truth.py                       # all parts
    python3 scripts/device/probe_truth.py --parts idle --cycles 20 --part-seconds 400
    python3 scripts/device/probe_truth.py --parts contention,hot --heat-seconds 60

Writes ``$OUT/probe_truth.json`` (rewritten after every measurement, so a part cut short by
its time limit or an error still leaves what it measured) and ``$OUT/probe_truth.txt`` (the
tables, also printed). Each part runs in its own try/except; its error is recorded and the
next part runs. ``--device cpu --small`` runs every part on CPU (for the tests).

``--load SECONDS`` is the competing process itself (used by this script).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "sparkdiag" / "probe" / "worker"  # the package runs as one script
PARTS = ("idle", "contention", "hot")
ALIASES = {"a": "idle", "b": "contention", "c": "hot"}
WORKER_TIMEOUT = 180.0  # one worker run, at most
LOAD_READY_TIMEOUT = 120.0
SETTLE_SECONDS = 2.0  # after the load is ready, before measuring beside it
FIRST_KERNEL = re.compile(r"^sparkdiag-probe: \w+ (compute|llm|decode) ")  # the worker's log


# ---------------------------------------------------------------------------- arguments


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS), help="idle,contention,hot (or a,b,c)")
    p.add_argument("--cycles", type=int, default=20, help="idle default-suite cycles")
    p.add_argument("--repeats", type=int, default=3, help="hot-suite runs per condition")
    p.add_argument(
        "--contention-rounds",
        type=int,
        default=1,
        help="idle/busy pairs of the contention part (medians over them)",
    )
    p.add_argument("--heat-seconds", type=float, default=60.0)
    p.add_argument("--part-seconds", type=float, default=420.0, help="time limit per part")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--small", action="store_true", help="tiny shapes (CPU tests)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the worker")
    p.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        help="extra worker argument, repeatable (e.g. --worker-arg=--kind-weights=compute=6)",
    )
    p.add_argument("--load-edge", type=int, default=None, help="competing matmul edge")
    p.add_argument("--out", default=None, help="output folder (default $OUT, else /tmp/out)")
    p.add_argument("--load", type=float, default=None, metavar="SECONDS", help=argparse.SUPPRESS)
    args = p.parse_args(list(argv))
    parts = []
    for name in args.parts.split(","):
        name = ALIASES.get(name.strip(), name.strip())
        if name not in PARTS:
            p.error(f"unknown part {name!r} (known: {', '.join(PARTS)})")
        parts.append(name)
    args.parts = parts
    if args.load_edge is None:
        args.load_edge = 256 if args.small or args.device == "cpu" else 8192
    return args


# ---------------------------------------------------------------------------- the load


def run_load(seconds: float, device: str, edge: int) -> int:
    """The competing process: bf16 matmuls on ``device`` until killed or ``seconds`` pass."""
    import torch

    if device == "cpu":
        torch.set_num_threads(1)
    a = torch.randn(edge, edge, device=device, dtype=torch.bfloat16)
    b = torch.randn(edge, edge, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(a)
    torch.mm(a, b, out=out)
    if device != "cpu":
        torch.cuda.synchronize()
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            torch.mm(a, b, out=out)
        if device != "cpu":
            torch.cuda.synchronize()
    return 0


class Lines:
    """Lines from a pipe's file descriptor, each awaited with a timeout (no hidden buffer)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.seen: list[str] = []

    def next(self, timeout: float) -> str | None:
        """The next line; "" at end of file; None when ``timeout`` seconds pass first."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                rest, self.buffer = self.buffer, b""
                line = rest.decode("utf-8", "replace")
                self.seen.append(line)
                return line
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\n", 1)
        line = raw.decode("utf-8", "replace") + "\n"
        self.seen.append(line)
        return line


class Load:
    """A competing process started with this script's --load mode; stop() always reaps it."""

    def __init__(self, ctx: Context, seconds: float) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--load", f"{seconds:g}"]
        cmd += ["--device", ctx.args.device, "--load-edge", str(ctx.args.load_edge)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, start_new_session=True)
        ctx.record.setdefault("load_pids", []).append(self.proc.pid)
        assert self.proc.stdout is not None
        line = Lines(self.proc.stdout.fileno()).next(LOAD_READY_TIMEOUT)
        if (line or "").strip() != "ready":
            self.stop()
            raise RuntimeError(f"the competing process did not start (said {line!r})")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# ---------------------------------------------------------------------------- the worker


def run_worker(
    ctx: Context,
    extra: Sequence[str],
    timeout: float,
    on_first_kernel: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One worker run; its document, or a stand-in with status "error" and the reason.

    ``on_first_kernel`` is called once, as soon as the worker logs its first kernel on stderr
    (or when it ends without one).
    """
    cmd = [ctx.args.python, str(WORKER), "--device", ctx.args.device]
    cmd += ["--small"] if ctx.args.small else []
    cmd += [*ctx.args.worker_arg, *extra]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    assert proc.stderr is not None
    lines = Lines(proc.stderr.fileno())
    fired: list[bool] = []

    def fire() -> None:
        if on_first_kernel is not None and not fired:
            fired.append(True)
            on_first_kernel()

    try:
        if on_first_kernel is not None:
            while True:
                line = lines.next(max(0.0, started + timeout - time.monotonic()))
                if line is None:
                    raise subprocess.TimeoutExpired(cmd, timeout)
                if line == "" or FIRST_KERNEL.match(line):
                    break
            fire()
        out, err = proc.communicate(timeout=max(1.0, started + timeout - time.monotonic()))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"status": "error", "reason": f"worker timed out after {timeout:.0f} s"}
    finally:
        fire()  # also when the worker ended or timed out first
    wall = time.monotonic() - started
    text = out.decode("utf-8", "replace").strip()
    try:
        doc: dict[str, Any] = json.loads(text.splitlines()[-1])
    except (ValueError, IndexError):
        tail = "".join(lines.seen) + lines.buffer.decode("utf-8", "replace")
        tail += err.decode("utf-8", "replace")
        return {"status": "error", "reason": f"no worker document (rc {proc.returncode}): "
                + tail[-500:]}  # fmt: skip
    doc["_wall_seconds"] = wall
    return doc


# ---------------------------------------------------------------------------- figures


def figures(doc: dict[str, Any]) -> dict[str, tuple[float | None, float | None]]:
    """(delivered, peak) per row: kernels in TFLOPS, copies in GB/s (peak None for transfers)."""
    rows: dict[str, tuple[float | None, float | None]] = {}
    for r in doc.get("results") or []:
        if r.get("status") == "ok":
            key = f"{r['dtype']} {r['shape']}" + (" beta=1" if r.get("beta") else "")
            rows[key] = (r.get("delivered"), r.get("peak"))
    bw = doc.get("bandwidth")
    if isinstance(bw, dict) and bw.get("status") == "ok":
        rows["device copy GB/s"] = (_giga(bw.get("delivered")), _giga(bw.get("peak")))
    for t in doc.get("transfers") or []:
        if t.get("status") == "ok":
            key = f"{t['memory']} {t['direction']} {_size(t['size_bytes'])} GB/s"
            rows[key] = (_giga(t.get("delivered")), None)
    return rows


def _giga(value: Any) -> float | None:
    return None if value is None else float(value) / 1e9


def _size(n: int) -> str:
    return f"{n // 1024**2} MiB" if n >= 1024**2 else f"{n // 1024} KiB"


def cv_percent(values: Sequence[float]) -> float | None:
    """Coefficient of variation in percent (population standard deviation over the mean)."""
    if len(values) < 2 or statistics.fmean(values) == 0:
        return None
    return 100.0 * statistics.pstdev(values) / statistics.fmean(values)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(known) if known else None


def conditions(doc: dict[str, Any]) -> dict[str, Any]:
    c = doc.get("conditions") or {}
    return {
        "max_gpu_temperature_celsius": c.get("max_gpu_temperature_celsius"),
        "max_memory_temperature_celsius": c.get("max_memory_temperature_celsius"),
        "clock_event_reasons_seen": c.get("clock_event_reasons_seen"),
        "mean_sm_clock_hertz": c.get("mean_sm_clock_hertz"),
    }


# ---------------------------------------------------------------------------- the record


class Context:
    """Arguments, the record of everything measured, and its files (rewritten as it grows)."""

    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args = args
        self.out = out
        self.record: dict[str, Any] = {
            "started_at": time.time(),
            "argv": sys.argv[1:],
            "worker": str(WORKER),
            "parts": {},
        }
        self.deadline = math.inf

    def part(self, name: str) -> dict[str, Any]:
        entry: dict[str, Any] = self.record["parts"].setdefault(name, {})
        return entry

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def timeout(self) -> float:
        left = self.time_left()
        if left < 5:
            raise PartTimeUp()
        return min(WORKER_TIMEOUT, left)

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "probe_truth.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.record, indent=1, default=str, allow_nan=True) + "\n")
        tmp.replace(path)
        (self.out / "probe_truth.txt").write_text(render(self.record))


class PartTimeUp(Exception):
    pass


# ---------------------------------------------------------------------------- parts


def part_idle(ctx: Context) -> None:
    part = ctx.part("idle")
    cycles: list[dict[str, Any]] = part.setdefault("cycles", [])
    for i in range(ctx.args.cycles):
        doc = run_worker(ctx, [], ctx.timeout())
        cycles.append(
            {
                "cycle": i + 1,
                "status": doc.get("status"),
                "reason": doc.get("reason"),
                "gpu_busy_seconds": doc.get("gpu_busy_seconds"),
                "figures": figures(doc),
                "conditions": conditions(doc),
            }
        )
        part["table"] = spread_table(cycles)
        ctx.save()


def spread_table(cycles: Sequence[dict[str, Any]]) -> dict[str, Any]:
    rows: dict[str, dict[str, list[float]]] = {}
    for cycle in cycles:
        for key, (delivered, peak) in cycle["figures"].items():
            row = rows.setdefault(key, {"delivered": [], "peak": []})
            if delivered is not None:
                row["delivered"].append(delivered)
            if peak is not None:
                row["peak"].append(peak)
    busy = [c["gpu_busy_seconds"] for c in cycles if c.get("gpu_busy_seconds") is not None]
    return {
        "rows": {
            key: {
                "n": len(v["delivered"]),
                "delivered_median": median(v["delivered"]),
                "delivered_cv_percent": cv_percent(v["delivered"]),
                "delivered_min": min(v["delivered"], default=None),
                "delivered_max": max(v["delivered"], default=None),
                "peak_median": median(v["peak"]),
                "peak_cv_percent": cv_percent(v["peak"]),
            }
            for key, v in rows.items()
        },
        "gpu_busy_seconds": busy,
        "gpu_busy_median": median(busy),
        "gpu_busy_max": max(busy, default=None),
    }


def part_contention(ctx: Context) -> None:
    part = ctx.part("contention")
    runs: list[dict[str, Any]] = part.setdefault("runs", [])
    always = ["--probe-when", "always"]
    for _ in range(ctx.args.contention_rounds):
        idle = run_worker(ctx, always, ctx.timeout())
        runs.append(_run_entry("idle", idle))
        ctx.save()
        load = Load(ctx, ctx.time_left())
        try:
            time.sleep(SETTLE_SECONDS)
            busy = run_worker(ctx, always, ctx.timeout())
        finally:
            load.stop()
        runs.append(_run_entry("busy", busy))
        part["table"] = contention_table(runs)
        ctx.save()


def _run_entry(condition: str, doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "condition": condition,
        "status": doc.get("status"),
        "reason": doc.get("reason"),
        "other_pids": (doc.get("busy") or {}).get("other_pids"),
        "gpu_busy_seconds": doc.get("gpu_busy_seconds"),
        "figures": figures(doc),
        "conditions": conditions(doc),
    }


def contention_table(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    def collect(condition: str) -> dict[str, tuple[list[float], list[float]]]:
        got: dict[str, tuple[list[float], list[float]]] = {}
        for run in runs:
            if run["condition"] != condition:
                continue
            for key, (delivered, peak) in run["figures"].items():
                d, p = got.setdefault(key, ([], []))
                if delivered is not None:
                    d.append(delivered)
                if peak is not None:
                    p.append(peak)
        return got

    idle, busy = collect("idle"), collect("busy")
    table = {}
    for key in idle:
        i_d, i_p = median(idle[key][0]), median(idle[key][1])
        b_d, b_p = (median(busy[key][0]), median(busy[key][1])) if key in busy else (None, None)
        table[key] = {
            "idle_delivered": i_d,
            "busy_delivered": b_d,
            "delivered_ratio": ratio(b_d, i_d),
            "idle_peak": i_p,
            "busy_peak": b_p,
            "peak_ratio": ratio(b_p, i_p),
        }
    return table


def part_hot(ctx: Context) -> None:
    part = ctx.part("hot")
    hot = ["--suite", "hot"]

    def entry(condition: str, doc: dict[str, Any], **extra: Any) -> dict[str, Any]:
        ratios = doc.get("ratios") or {}
        return {
            "condition": condition,
            "status": doc.get("status"),
            "reason": doc.get("reason"),
            "int4/bf16": ratios.get("int4/bf16"),
            "int4/fp16": ratios.get("int4/fp16"),
            "gpu_busy_seconds": doc.get("gpu_busy_seconds"),
            "conditions": conditions(doc),
            "figures": figures(doc),
            **extra,
        }

    runs: list[dict[str, Any]] = part.setdefault("runs", [])
    for _ in range(ctx.args.repeats):
        runs.append(entry("idle", run_worker(ctx, hot, ctx.timeout())))
        ctx.save()
    load = Load(ctx, ctx.time_left())
    try:
        time.sleep(SETTLE_SECONDS)
        for _ in range(ctx.args.repeats):
            runs.append(entry("busy", run_worker(ctx, hot, ctx.timeout())))
            ctx.save()
    finally:
        load.stop()
    # heat: the load for --heat-seconds, stopped when the worker reaches its first kernel
    if ctx.time_left() < ctx.args.heat_seconds + 30:
        raise PartTimeUp()
    load = Load(ctx, ctx.time_left())
    stopped_at: list[float] = []

    def stop_load() -> None:
        if not stopped_at:
            load.stop()
            stopped_at.append(time.monotonic())

    try:
        time.sleep(ctx.args.heat_seconds)
        started = time.monotonic()
        doc = run_worker(ctx, hot, ctx.timeout(), on_first_kernel=stop_load)
    finally:
        stop_load()
    runs.append(entry("after heat", doc, heat_seconds=ctx.args.heat_seconds,
                      load_stopped_after_worker_start=stopped_at[0] - started))  # fmt: skip
    part["table"] = hot_table(runs)
    ctx.save()
    # the same heat from inside the worker: a soak whose windows are measured in the load
    if ctx.time_left() < ctx.args.heat_seconds + 30:
        raise PartTimeUp()
    window = max(1.0, ctx.args.heat_seconds / 6)
    soak = run_worker(
        ctx,
        ["--soak-seconds", f"{ctx.args.heat_seconds:g}", "--window-seconds", f"{window:g}"],
        ctx.timeout(),
    )
    section = soak.get("soak") or {}
    part["soak"] = {
        "status": soak.get("status"),
        "reason": soak.get("reason"),
        "stopped": section.get("stopped"),
        "stop_reason": section.get("reason"),
        "load": section.get("load"),
        "windows": [
            {
                "index": w["index"],
                "elapsed_seconds": w["elapsed_seconds"],
                "int4/bf16": w["ratios"].get("int4/bf16"),
                "int4/fp16": w["ratios"].get("int4/fp16"),
                "conditions": w["conditions"],
                "load_conditions": w["load_conditions"],
            }
            for w in section.get("windows") or []
        ],
    }
    ctx.save()


def hot_table(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for run in runs:
        row = table.setdefault(
            run["condition"],
            {"int4/bf16": [], "int4/fp16": [], "max_gpu_temperature_celsius": [],
             "max_memory_temperature_celsius": []},
        )  # fmt: skip
        for key in ("int4/bf16", "int4/fp16"):
            row[key].append(run[key])
        for key in ("max_gpu_temperature_celsius", "max_memory_temperature_celsius"):
            row[key].append(run["conditions"].get(key))
    return table


# ---------------------------------------------------------------------------- rendering


def _f(value: Any, digits: int | None = None) -> str:
    """A figure with 4 significant digits, or ``digits`` decimals; "-" when unknown."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.4g}" if digits is None else f"{value:.{digits}f}"


def _table(columns: Sequence[tuple[str, int]], rows: Iterable[Sequence[str]]) -> list[str]:
    """A header line of the column names, then one line a row: each cell padded to its column's
    width, the first left-aligned and the others right-aligned."""

    def line(cells: Sequence[str]) -> str:
        aligned = (
            f"{cell:{'<' if i == 0 else '>'}{width}}"
            for i, (cell, (_, width)) in enumerate(zip(cells, columns, strict=True))
        )
        return " ".join(aligned)

    return [line([name for name, _ in columns]), *(line(row) for row in rows)]


def render(record: dict[str, Any]) -> str:
    lines: list[str] = []
    parts = record.get("parts", {})
    idle = parts.get("idle", {})
    if "table" in idle:
        t = idle["table"]
        lines.append(f"== idle: {len(idle['cycles'])} default-suite cycles (TFLOPS; GB/s)")
        lines += _table(
            [("row", 34), ("n", 3), ("delivered", 10), ("cv %", 6), ("min", 9), ("max", 9),
             ("peak", 10), ("cv %", 6)],
            [
                (key, str(r["n"]), _f(r["delivered_median"]), _f(r["delivered_cv_percent"], 2),
                 _f(r["delivered_min"]), _f(r["delivered_max"]), _f(r["peak_median"]),
                 _f(r["peak_cv_percent"], 2))
                for key, r in sorted(t["rows"].items())
            ],
        )  # fmt: skip
        lines.append(
            f"GPU-busy seconds per cycle: median {_f(t['gpu_busy_median'], 3)}, "
            f"max {_f(t['gpu_busy_max'], 3)}"
        )
    contention = parts.get("contention", {})
    if "table" in contention:
        lines.append("")
        lines.append("== contention: beside a bf16 matmul loop / idle (--probe-when always)")
        lines += _table(
            [("row", 34), ("idle del", 10), ("busy del", 10), ("ratio", 6), ("idle peak", 10),
             ("busy peak", 10), ("ratio", 6)],
            [
                (key, _f(r["idle_delivered"]), _f(r["busy_delivered"]),
                 _f(r["delivered_ratio"], 2), _f(r["idle_peak"]), _f(r["busy_peak"]),
                 _f(r["peak_ratio"], 2))
                for key, r in sorted(contention["table"].items())
            ],
        )  # fmt: skip
    hot = parts.get("hot", {})
    if "table" in hot:
        lines.append("")
        lines.append("== hot suite: int4 over bf16 and fp16 at the decode shape (delivered)")
        for run in hot.get("runs", []):
            if run.get("condition") == "after heat":
                lines.append(
                    f"after {_f(run.get('heat_seconds'), 0)} s of load, stopped "
                    f"{_f(run.get('load_stopped_after_worker_start'), 1)} s after the worker "
                    "started, when it reached its first kernel"
                )
        for condition, r in hot["table"].items():
            lines.append(
                f"{condition:11} int4/bf16 {' '.join(_f(v, 2) for v in r['int4/bf16']):18} "
                f"int4/fp16 {' '.join(_f(v, 2) for v in r['int4/fp16']):18} "
                f"GPU max °C {' '.join(_f(v, 0) for v in r['max_gpu_temperature_celsius'])}  "
                f"memory max °C "
                f"{' '.join(_f(v, 0) for v in r['max_memory_temperature_celsius'])}"
            )
    if hot.get("soak"):
        s = hot["soak"]
        load = s.get("load") or {}
        lines.append(
            f"soak (the worker's own bf16 load, {_f(load.get('delivered'))} TFLOPS): "
            f"stopped {s['stopped']} {s['stop_reason'] or ''}".rstrip()
        )
        for w in s["windows"]:
            c = w["conditions"] or {}
            lines.append(
                f"  window {w['index']:2d} at {_f(w['elapsed_seconds'])} s: "
                f"int4/bf16 {_f(w['int4/bf16'], 2)} int4/fp16 {_f(w['int4/fp16'], 2)} "
                f"GPU {_f(c.get('max_gpu_temperature_celsius'), 0)} °C memory "
                f"{_f(c.get('max_memory_temperature_celsius'), 0)} °C"
            )
    for name, part in parts.items():
        if part.get("error") or part.get("stopped"):
            lines.append(f"{name}: {part.get('stopped') or ''} {part.get('error') or ''}".strip())
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- main

RUNNERS: dict[str, Callable[[Context], None]] = {
    "idle": part_idle,
    "contention": part_contention,
    "hot": part_hot,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.load is not None:
        return run_load(args.load, args.device, args.load_edge)
    out = Path(args.out or os.environ.get("OUT") or "/tmp/out")
    ctx = Context(args, out)
    ctx.save()
    for name in args.parts:
        ctx.deadline = time.monotonic() + args.part_seconds
        started = time.monotonic()
        print(f"== part {name} (at most {args.part_seconds:g} s)", file=sys.stderr, flush=True)
        try:
            RUNNERS[name](ctx)
        except PartTimeUp:
            ctx.part(name)["stopped"] = "time limit"
        except Exception:
            ctx.part(name)["error"] = traceback.format_exc(limit=5)
        ctx.part(name)["seconds"] = time.monotonic() - started
        ctx.save()
    ctx.record["finished_at"] = time.time()
    ctx.save()
    print(render(ctx.record), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
