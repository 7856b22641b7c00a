#!/usr/bin/env python3
"""On the lent GPU: the architecture lint against the real CUDA libraries there, checked
against cuobjdump, in at most about 60 s.

1. Scans every shared library with GPU code in this interpreter's package directories (torch,
   the nvidia-* wheels: cuBLAS, cuDNN, NCCL ...; triton, cupy, a jax plugin, whatever is
   installed) with sparkdiag's fat binary reader, without a cache (timed: the cold cost).
2. Runs ``cuobjdump --list-elf --list-ptx`` on each (largest last, while the time lasts) and
   compares the targets: the same cubin and PTX targets, counted, with cuobjdump's naming of a
   family cubin (``sm_120f`` listed as ``sm_120``).
3. Judges each library for the GPUs NVML lists (sm_90 on the H200) and for GB10 (12.1), and
   reads torch.cuda.get_arch_list() (in a subprocess) and the CUDA GPUDirect attributes.
4. Keeps header traces (the reads the walk made, no payload) of up to four libraries, each at
   most 512 KiB of JSON: fixtures that replay the walk without the library
   (``sparkdiag.sources.software.fatbin.replay``).

Everything goes under ``$OUT/native/`` (``--out``): scan.json, verdicts.json, cuobjdump.json,
cuobjdump/NAME.txt, traces/NAME.json.gz, gpudirect.json, torch.json, table.txt (also printed).
One failing step does not stop the others. Exit 0 when every library agrees with cuobjdump, 1
when one differs, 2 when it cannot run.

Usage (on the device, from the checkout; needs nothing beyond the machine's python3, torch and
the CUDA toolkit's cuobjdump)::

    PYTHONPATH=$PWD python3 scripts/device/native_lint.py

Tested here (no GPU) with ``--site DIR --cuobjdump PATH --capability 9.0`` on the fixtures.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from sparkdiag.native.lint import Gpu, lint
from sparkdiag.sources.host.gpudirect import cuda_attributes
from sparkdiag.sources.software import fatbin
from sparkdiag.sources.software.cuda_libraries import ScanCache, scan, scan_json
from sparkdiag.sources.software.pyenv import PythonEnvironment, resolve, this_python, torch_build

TRACE_LIMIT = 512 * 1024
TRACES = 4
GB10 = (12, 1)


def _cuobjdump(given: str | None) -> str | None:
    """The cuobjdump named (none where it cannot run: a named one is not replaced by another),
    else the one on PATH or the CUDA toolkit's."""
    candidates = (given,) if given else (shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump")
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _nvml_gpus() -> list[Gpu]:
    try:
        import pynvml

        pynvml.nvmlInit()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            gpus.append(Gpu(str(index), str(uuid), str(name), (int(major), int(minor))))
        return gpus
    except Exception as exc:  # any NVML failure: judge the given capabilities only
        print(f"NVML: {exc}", file=sys.stderr)
        return []


def _write(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str), encoding="utf-8")


def _compare(
    env: PythonEnvironment, result: Any, binary: str | None, out: Path, deadline: float
) -> list[dict[str, Any]]:
    rows = []
    by_size = sorted(result.libraries, key=lambda lib: lib.size_bytes)
    for lib in by_size:
        row: dict[str, Any] = {"library": lib.relative, "size_bytes": lib.size_bytes}
        mine_sass, mine_ptx = fatbin.as_cuobjdump(lib.report)
        row["sparkdiag"] = {"sass": dict(mine_sass), "ptx": dict(mine_ptx)}
        left = deadline - time.monotonic()
        if binary is None or left < 2:
            row["cuobjdump"] = "not run: " + ("no cuobjdump" if binary is None else "out of time")
            rows.append(row)
            continue
        path = (env.root / lib.path.lstrip("/")) if env.root != Path("/") else Path(lib.path)
        started = time.monotonic()
        run = fatbin.run_cuobjdump(binary, path, timeout=min(30.0, left))
        row["cuobjdump_seconds"] = round(time.monotonic() - started, 3)
        text_path = out / "cuobjdump" / (lib.relative.replace("/", "__") + ".txt")
        text_path.parent.mkdir(parents=True, exist_ok=True)
        text_path.write_text(run.text + (f"\n# {run.error}\n" if run.error else ""))
        theirs_sass, theirs_ptx = fatbin.cuobjdump_listing(run.text)
        row["cuobjdump"] = {"sass": dict(theirs_sass), "ptx": dict(theirs_ptx), "error": run.error}
        row["agree"] = (mine_sass, mine_ptx) == (theirs_sass, theirs_ptx)
        rows.append(row)
    return rows


def _traces(env: PythonEnvironment, result: Any, out: Path, deadline: float) -> list[str]:
    kept: list[str] = []
    wanted = ("libtorch_cuda", "libcublasLt", "libcudnn", "cupy", "libnccl", "triton", "jax")
    ordered = sorted(
        result.libraries,
        key=lambda lib: next((i for i, w in enumerate(wanted) if w in lib.relative), 99),
    )
    for lib in ordered:
        if len(kept) >= TRACES or time.monotonic() > deadline:
            break
        path = (env.root / lib.path.lstrip("/")) if env.root != Path("/") else Path(lib.path)
        try:
            doc = fatbin.trace_document(path, lib.relative)
        except (OSError, ValueError) as exc:
            print(f"trace of {lib.relative}: {exc}", file=sys.stderr)
            continue
        data = json.dumps(doc).encode()
        if len(data) > TRACE_LIMIT:
            continue
        target = out / "traces" / (lib.relative.replace("/", "__") + ".json.gz")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gzip.compress(data, mtime=0))
        kept.append(lib.relative)
    return kept


def _table(rows: list[dict[str, Any]], verdicts: list[Any], gpus: list[Gpu]) -> str:
    lines = [f"{'library':<46} {'agree':<5} " + " ".join(f"{g.sm:<16}" for g in gpus)]
    by_lib: dict[str, list[Any]] = {}
    for v in verdicts:
        by_lib.setdefault(v.library.relative, []).append(v)
    for row in rows:
        name = row["library"]
        agree = {True: "yes", False: "NO"}.get(row.get("agree"), "-")
        cells = [
            f"{v.verdict.mode} {v.verdict.target}"[:16].ljust(16) for v in by_lib.get(name, [])
        ]
        lines.append(f"{name[-46:]:<46} {agree:<5} " + " ".join(cells))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--site", type=Path, help="scan this environment instead of this Python")
    parser.add_argument(
        "--cuobjdump",
        help="the cuobjdump to compare with (only that one; default: PATH's, the toolkit's)",
    )
    parser.add_argument("--capability", action="append", default=[], help="X.Y, without NVML")
    parser.add_argument(
        "--seconds",
        type=float,
        default=50.0,
        help="time budget of the whole run (default 50): cuobjdump gets what the scan, torch's "
        "import (at most 20 s) and the CUDA attributes (10 s) leave",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    deadline = started + args.seconds
    out = args.out / "native"
    out.mkdir(parents=True, exist_ok=True)
    try:
        env = resolve(args.site) if args.site else this_python()
    except ValueError as exc:
        print(f"native_lint: {exc}", file=sys.stderr)
        return 2
    result = scan(env, ScanCache(None))
    _write(out / "scan.json", scan_json(result))
    gpus = [
        Gpu("", "", f"capability {c}", (int(c.split(".")[0]), int(c.split(".")[1])))
        for c in args.capability
    ] or _nvml_gpus()
    if GB10 not in {g.capability for g in gpus}:
        gpus.append(Gpu("", "", "GB10 (what if)", GB10))
    verdicts = lint(result, gpus)
    _write(out / "verdicts.json", [v.as_json() | {"sm": v.gpu.sm} for v in verdicts])
    # the bounded subprocesses first (torch's import takes seconds), cuobjdump in what is left
    direct = cuda_attributes(timeout=10.0) if not args.site else "not asked (--site)"
    _write(out / "gpudirect.json", direct if isinstance(direct, str) else [vars(d) for d in direct])
    build = torch_build(env.python, timeout=20.0) if env.python else None
    _write(out / "torch.json", build if isinstance(build, str) or build is None else vars(build))
    rows = _compare(env, result, _cuobjdump(args.cuobjdump), out, deadline - 6)
    _write(out / "cuobjdump.json", rows)
    kept = _traces(env, result, out, deadline - 1)
    table = _table(rows, verdicts, gpus)
    summary = (
        f"{len(result.libraries)} libraries with GPU code of {result.files} shared libraries, "
        f"scanned cold in {result.seconds:.2f} s; cuobjdump agrees on "
        f"{sum(1 for r in rows if r.get('agree'))} of {sum(1 for r in rows if 'agree' in r)} "
        f"compared; traces kept: {', '.join(kept) or 'none'}; "
        f"{time.monotonic() - started:.1f} s in all\n"
    )
    (out / "table.txt").write_text(table + summary, encoding="utf-8")
    print(table + summary, end="")
    return 1 if any(r.get("agree") is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
