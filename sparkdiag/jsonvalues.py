"""Values read from JSON that is not trusted (the worker's document, the soak state file): each
function returns the value as the type it names, or None (an empty mapping for :func:`as_map`)
when it is not one. ``true`` is no number here, and NaN or an infinity is no float.

Standard library only, so that any reader can use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past a float's range (10**400 in a tool's JSON)
        return None
    return number if math.isfinite(number) else None


def as_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
