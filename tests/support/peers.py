"""The fleet rules' robust score in Python (``sparkdiag:gemm_tflops:peer_score``,
prometheus/sparkdiag-rules.yml), to hold its arithmetic to what promtool computes: sparkdiag
itself ranks with the ratios of :mod:`sparkdiag.peers.ranking` and reads the score from
Prometheus."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

from sparkdiag.peers.ranking import MAD_FLOOR, MAD_SCALE, median

K = TypeVar("K", bound=Hashable)


def mad(values: Iterable[float]) -> float:
    """Median absolute deviation from the median."""
    items = list(values)
    middle = median(items)
    return median(abs(v - middle) for v in items)


def robust_scores(values: Mapping[K, float]) -> dict[K, float]:
    """Each member's robust z-score: (value - median) / (1.4826 * MAD), the MAD floored at
    0.5 % of the median. Negative is slower than the group."""
    if not values:
        return {}
    middle = median(values.values())
    spread = max(mad(values.values()), MAD_FLOOR * middle)
    if spread <= 0:
        return {}
    return {k: (v - middle) / (MAD_SCALE * spread) for k, v in values.items()}
