"""``sparkdiag record-fixture``: record every NVML answer the GPU source uses, errors included."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkdiag import __version__
from sparkdiag.sources.nvml.api import NvmlBackend, NvmlCallError, answer_key
from sparkdiag.sources.nvml.fixture import FORMAT
from sparkdiag.sources.nvml.queries import DELTA_QUERIES, QUERIES

# Between priming the delta queries (GPM, the sample buffers) and recording their answers.
PRIME_SECONDS = 0.5


def record(
    backend: NvmlBackend,
    description: str = "",
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Ask every catalogue query of every device once (every argument it declares); return the
    fixture document.

    A delta query (declared ``delta``: GPM, driver samples, per-process utilization) answers
    for the time since its previous call, and GPM answers NOT_READY at its first: each is asked
    once on every device first, and recorded from its second call ``PRIME_SECONDS`` later.
    """
    backend.init()
    try:
        count = backend.device_count()
        for index in range(count):
            for query in sorted(DELTA_QUERIES):
                with contextlib.suppress(NvmlCallError):
                    backend.query(index, query, None)
        if count:
            sleep(PRIME_SECONDS)
        devices = []
        for index in range(count):
            answers: dict[str, Any] = {}
            for declared in QUERIES:
                for arg in declared.arguments():
                    key = answer_key(declared.name, arg)
                    try:
                        answers[key] = backend.query(index, declared.name, arg)
                    except NvmlCallError as exc:
                        answers[key] = {"error": exc.name}
            devices.append({"answers": answers})
        return {
            "format": FORMAT,
            "description": description,
            "recorded": {
                "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "by": f"sparkdiag {__version__} record-fixture",
                "machine": platform.machine(),
                "kernel": platform.release(),
            },
            "driver_version": backend.driver_version(),
            "host": {"memory_total": backend.host_memory_total()},
            "devices": devices,
        }
    finally:
        backend.shutdown()


def write_atomic(path: Path, doc: dict[str, Any]) -> None:
    """Write JSON to ``path`` through a temporary file and a rename: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, sort_keys=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
