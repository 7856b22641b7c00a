"""Stand-in for one side of ``sparkdiag compare``: canned worker documents and broken containers.

Run as ``python fake_side.py MODE [key=value ...] [whatever the runner appends]``. The runner
appends the worker's path (native side) or ``-`` (container side, worker source on standard
input) and the worker's flags; everything that is not ``key=value`` is ignored. Keys:

- ``stdin=1``: read standard input and fail (exit 9) unless it holds the worker's source;
- ``record=FILE``: append this process's argv (JSON, one line) to FILE;
- ``tflops=X``: the bf16 figure of the canned documents (default 700);
- ``torch=V``: the torch version of the canned documents;
- ``pidfile=FILE``: (hang) write this PID and its child's PID there.

Modes: gpu (a GPU document), cpu (a CPU document), nogpu (the worker ran on the CPU although
native has a GPU), nogpu-unsupported (cuda:0 not available to torch), banner (an NGC-like banner
on stdout before a GPU document), garbage, hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from sparkdiag.probe.worker.contract import SCHEMA

BANNER = """
=============
== PyTorch ==
=============

NVIDIA Release 25.09 (build 123456789)
PyTorch Version 2.9.0a0+50eac81

Container image Copyright (c) 2025, NVIDIA CORPORATION & AFFILIATES. All rights reserved.

NOTE: The SHMEM allocation limit is set to the default of 64MB.  This may be
   insufficient for PyTorch.  NVIDIA recommends the use of the following flags:
   docker run --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 ...
"""


def software(device: str, torch: str, cuda: str | None, gpu: bool) -> dict[str, object]:
    return {
        "torch": torch,
        "cuda": cuda,
        "cublas": "13.1.0" if gpu else None,
        "driver": "580.159" if gpu else None,
        "python": "3.12.3",
        "gpu_name": "NVIDIA H200" if gpu else None,
        "compute_capability": "9.0" if gpu else None,
        "gpu_uuid": "GPU-8d3c1a6e-0000-4000-8000-000000000001" if gpu else None,
        "device": device,
    }


def result(
    dtype: str, shape: str, kind: str, tflops: float | None, beta: int = 0
) -> dict[str, object]:
    ok = tflops is not None
    return {
        "dtype": dtype,
        "shape": shape,
        "kind": kind,
        "beta": beta,
        "status": "ok" if ok else "unsupported",
        "reason": None if ok else f"{dtype} needs compute capability 10.0+ (Blackwell)",
        "delivered": tflops,
        "peak": None if tflops is None else tflops * 1.02,
    }


def document(mode: str, opts: dict[str, str]) -> dict[str, object]:
    tflops = float(opts.get("tflops", "700"))
    gpu = mode in ("gpu", "banner")
    device = "cuda:0" if gpu else "cpu"
    torch = opts.get("torch", "2.11.0+cu130")
    doc: dict[str, object] = {
        "schema": SCHEMA,
        "status": "ok",
        "reason": None,
        "software": software(device, torch, "13.0" if mode != "cpu" else None, gpu),
        "results": [
            result("bf16", "8192x8192x8192", "compute", tflops),
            result("bf16", "1x8192x8192", "decode", tflops / 100),
            result("nvfp4", "8192x8192x8192", "compute", None),
        ],
        "bandwidth": {"status": "ok", "reason": None, "delivered": 4.0e12, "peak": 4.1e12},
        "conditions": {
            "max_gpu_temperature_celsius": 55.0 if gpu else None,
            "mean_sm_clock_hertz": 1.98e9 if gpu else None,
            "clock_event_reasons_seen": 0x4 if gpu else None,
        },
        "started_at": time.time(),
        "finished_at": time.time(),
    }
    if opts.get("results") == "none":  # measured no kernel, only the copy bandwidth
        doc["results"] = []
    if "kernel_error" in opts:  # the compute cube crashed (the worker's status for it: error)
        first = doc["results"][0]
        assert isinstance(first, dict)
        first.update(status="error", reason=opts["kernel_error"], delivered=None, peak=None)
    results = doc["results"]
    assert isinstance(results, list)
    decode = results[1] if len(results) > 1 else {}
    if "decode" in opts:  # the decode shape's figure alone
        decode.update(delivered=float(opts["decode"]), peak=float(opts["decode"]))
    if "timing" in opts:  # how the worker timed the decode shape: graph or events
        decode["timing"] = opts["timing"]
    if "gpu_uuid" in opts:  # another GPU than the other side's
        sw = doc["software"]
        assert isinstance(sw, dict)
        sw.update(gpu_uuid=opts["gpu_uuid"], gpu_name=opts.get("gpu_name", sw.get("gpu_name")))
    if mode == "nogpu-unsupported":
        doc.update(
            status="unsupported",
            reason="cuda:0 is not available to torch 2.9.0 (CUDA build: 13.0, devices: 0)",
            results=[],
            bandwidth=None,
        )
        doc["software"] = software("cuda:0", torch, "13.0", False)
    return doc


def main() -> int:
    mode = sys.argv[1]
    opts = dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a and not a.startswith("-"))
    if "record" in opts:
        with open(opts["record"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps(sys.argv) + "\n")
        with open(opts["record"], encoding="utf-8") as fh:
            started = sum(1 for _ in fh)
        if started >= int(opts.get("hang_from", "0") or 0) > 0:  # this and later starts hang
            mode = "sleep"
    if mode == "sleep":
        while True:
            time.sleep(1)
    if opts.get("stdin") == "1":
        source = sys.stdin.read()
        if SCHEMA not in source or "def main(" not in source:
            print("fake_side: the worker's source did not arrive on stdin", file=sys.stderr)
            return 9
    if mode == "garbage":
        sys.stdout.write("<html><body>502 Bad Gateway</body></html>\n")
        return 0
    if mode == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
        with open(opts["pidfile"], "w", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()} {child.pid}\n")
        while True:
            time.sleep(1)
    if mode == "banner":
        sys.stdout.write(BANNER)
        sys.stdout.flush()
    print("fake_side: some diagnostics on stderr", file=sys.stderr)
    sys.stdout.write(json.dumps(document(mode, opts)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
