"""Stand-in for the probe worker, driven by the runner tests.

Run as ``python fake_worker.py MODE [MODE ARGS...] WORKER_PATH [ARGS...]``: the
runner appends the real worker's path (or ``-``) and the request's arguments,
which this script ignores; the test puts the mode's own arguments before them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from sparkdiag.probe.worker.contract import SCHEMA

SLEEPER = "import time\nwhile True: time.sleep(1)\n"


def document(status: str, results: list[dict[str, object]], reason: str | None = None) -> str:
    return json.dumps(
        {
            "schema": SCHEMA,
            "status": status,
            "reason": reason,
            "software": {"torch": "fake", "device": "cpu"},
            "results": results,
            "bandwidth": None,
            "conditions": None,
            "busy": {"other_pids": [], "utilization": None, "nvml": False},
            "gpu_busy_seconds": 0.0,
            "started_at": time.time(),
            "finished_at": time.time(),
        }
    )


def result(dtype: str, status: str, reason: str | None = None) -> dict[str, object]:
    return {
        "dtype": dtype,
        "shape": "256x256x256",
        "kind": "compute",
        "beta": 0,
        "status": status,
        "reason": reason,
        "delivered": 1.0 if status == "ok" else None,
        "peak": 1.1 if status == "ok" else None,
    }


CANNED = {
    "ok": lambda: document("ok", [result("bf16", "ok"), result("fp8", "unsupported", "cpu")]),
    "busy": lambda: document("skipped_busy", [], "other compute processes on the GPU: pids [4242]"),
    "unsupported": lambda: document("unsupported", [], "cuda:0 is not available"),
    "all_unsupported": lambda: document(
        "ok", [result("fp8", "unsupported", "no fp8"), result("nvfp4", "unsupported", "no")]
    ),
    "result_error": lambda: document(
        "ok", [result("bf16", "ok"), result("int8", "error", "wrong result")]
    ),
}


def spawn_sleeper() -> int:
    child = subprocess.Popen([sys.executable, "-c", SLEEPER])
    return child.pid


def main() -> int:
    mode = sys.argv[1]
    rest = sys.argv[2:]
    worker = (i for i, a in enumerate(rest) if a == "-" or os.path.basename(a) == "worker")
    end = next(worker, len(rest))
    args = rest[:end]
    if mode == "sleep":  # args: PIDFILE [--ignore-term]
        if "--ignore-term" in args:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        grandchild = spawn_sleeper()
        with open(args[0] + ".tmp", "w") as fh:
            fh.write(f"{os.getpid()} {grandchild}\n")
        os.replace(args[0] + ".tmp", args[0])
        while True:
            time.sleep(1)
    if mode == "crash":
        print("sparkdiag-probe: bf16 compute 8192x8192x8192", file=sys.stderr)
        print("Traceback (most recent call last):", file=sys.stderr)
        print('  File "worker.py", line 1, in <module>', file=sys.stderr)
        print("RuntimeError: CUDA error: an illegal memory access was encountered", file=sys.stderr)
        return 3
    if mode == "garbage":
        print("hello, this is not JSON {")
        return 0
    if mode == "silent":
        print("nothing on stdout", file=sys.stderr)
        return 0
    if mode == "noisy":  # much stderr, then a good document
        for i in range(5000):
            print(f"noise line {i:05d} " + "x" * 60, file=sys.stderr)
        print("last stderr line", file=sys.stderr)
        print(CANNED["ok"]())
        return 0
    if mode == "linger":  # args: PIDFILE; leaves a child holding stdout open
        grandchild = spawn_sleeper()
        with open(args[0], "w") as fh:
            fh.write(f"{os.getpid()} {grandchild}\n")
        print(CANNED["ok"](), flush=True)
        return 0
    if mode == "echo_stdin":  # the script arrives on stdin: report its size
        data = sys.stdin.buffer.read()
        print(document("ok", [result("bf16", "ok", reason=f"stdin {len(data)} bytes")]))
        return 0
    if mode in CANNED:
        print(CANNED[mode]())
        return 0
    print(f"unknown mode {mode}", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main())
