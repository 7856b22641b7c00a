"""Stand-in for the probe worker's soak, driven by the soak runner tests.

Run as ``python fake_soak_worker.py MODE WORKER_PATH [ARGS...]`` (the runner appends the real
worker's path and the request's arguments, which this script ignores):

- ``polite``: prints a cold window, then a load window every 0.1 s; SIGINT or SIGTERM makes it
  print its document with ``stopped: interrupted``, as the real worker does;
- ``stubborn``: prints a cold window and ignores SIGINT and SIGTERM (a worker stuck in a kernel);
- ``busy``: prints a document saying the GPU is busy, without a soak;
- ``dies``: prints 60 windows (some 20 KiB of progress lines) and kills itself (SIGKILL), as a
  worker killed mid-soak.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from sparkdiag.probe.worker.contract import PROGRESS_PREFIX, SCHEMA

STOP: list[str] = []


def window(index: int) -> dict[str, object]:
    return {
        "index": index,
        "phase": "cold" if index == 0 else "load",
        "elapsed_seconds": index * 0.1,
        "results": [
            {
                "dtype": "int4",
                "shape": "1x64x64",
                "kind": "decode",
                "beta": 0,
                "status": "ok",
                "reason": None,
                "delivered": 1.0 - index * 0.01,
            }
        ],
        "ratios": {},
        "conditions": {"max_memory_temperature_celsius": 40.0 + index, "samples": 2},
        "load_conditions": None,
        "load_delivered": None,
    }


def document(status: str, soak: dict[str, object] | None, reason: str | None = None) -> str:
    return json.dumps(
        {
            "schema": SCHEMA,
            "status": status,
            "reason": reason,
            "suite": "soak",
            "software": {"torch": "fake", "device": "cpu"},
            "results": [],
            "soak": soak,
            "started_at": time.time(),
            "finished_at": time.time(),
        }
    )


def progress(item: dict[str, object]) -> None:
    sys.stderr.write(PROGRESS_PREFIX + json.dumps({"soak_window": item}) + "\n")
    sys.stderr.flush()


def main() -> None:
    mode = sys.argv[1]
    if mode == "busy":
        print(document("skipped_busy", None, "other compute processes on the GPU: pids [7]"))
        return
    if mode == "dies":
        for index in range(60):
            progress(window(index))
        os.kill(os.getpid(), signal.SIGKILL)
    handler = (
        (lambda s, f: STOP.append(signal.Signals(s).name)) if mode == "polite" else (signal.SIG_IGN)
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    windows = [window(0)]
    progress(windows[0])
    while not STOP:
        time.sleep(0.1)
        if mode == "polite":
            windows.append(window(len(windows)))
            progress(windows[-1])
    soak = {
        "windows": windows,
        "stopped": "interrupted",
        "reason": f"{STOP[0]} received",
        "elapsed_seconds": windows[-1]["elapsed_seconds"],
        "thresholds": {},
    }
    print(document("ok", soak))


if __name__ == "__main__":
    main()
