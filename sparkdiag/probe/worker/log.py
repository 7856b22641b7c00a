"""What the worker writes on standard error: log lines, and progress lines that sparkdiag reads
(``PROGRESS_PREFIX`` and one JSON object: probe/document.py parses them)."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from sparkdiag.probe.worker.contract import PROGRESS_PREFIX


def log(message: str) -> None:
    print(f"sparkdiag-probe: {message}", file=sys.stderr, flush=True)


def progress(item: dict[str, Any]) -> None:
    """One progress line on stderr: PROGRESS_PREFIX and a JSON object."""
    line = json.dumps(jsonable(item), allow_nan=False)
    print(PROGRESS_PREFIX + line, file=sys.stderr, flush=True)


def jsonable(value: Any) -> Any:
    """``value`` with every non-finite float as None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
