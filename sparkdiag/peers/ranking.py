"""The arithmetic of a peer comparison, and its thresholds, in one place.

Thresholds are Azure's published practice for GPU fleets (ai-infrastructure-on-azure,
outlier_detection.md and sku_baselines.md, cited in docs/peers.md): a GEMM figure 3.5 % below the
expected one warns, 7 % below asks for the GPU to be replaced; a robust z-score below -3 drains;
for small fleets the median and the median absolute deviation (MAD) replace the mean and the
standard deviation. ``SparkdiagGpuSlowerThanPeers`` (prometheus/sparkdiag-rules.yml) uses the
same 7 % and a group of at least 4 GPUs, and its recording rules the MAD scale and floor of the
robust score and the decode shapes below; the rules cannot import this module, so
tests/test_peers_rules.py reads both and holds them equal.

Only compute-bound kernels are compared: the compute cube and the LLM shape (the worker's kinds
``compute`` and ``llm``), never the decode shape (M <= 32), which measures memory latency and
moves with contention far more than a GEMM does (CONTEXT.md: 1.24x under a competing process).
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Iterable, Mapping
from typing import Literal, TypeVar

K = TypeVar("K", bound=Hashable)

WARN_BELOW = 0.965  # 3.5 % below the peers' median: warn
FAIL_BELOW = 0.93  # 7 % below: fail in one node; SparkdiagGpuSlowerThanPeers across the fleet
MIN_FLEET_GROUP = 4  # a fleet group needs this many GPUs before one is called an outlier
MAD_SCALE = 1.4826  # MAD times this estimates the standard deviation of normal data
# A MAD floor, relative to the median: eight GPUs replaying one document (or a very even fleet)
# have a MAD of 0, and any difference would score as infinitely far. 0.5 % is a quarter of the
# 2 % run-to-run spread measured on the lent H200 (CONTEXT.md, 10 idle cycles).
MAD_FLOOR = 0.005

COMPUTE_KINDS = ("compute", "llm")  # compute-bound kernels; decode (M <= 32) is left out
# The decode shapes as the rules match them: M of 1 to 32 in the shape label MxNxK.
DECODE_SHAPE_RE = "([1-9]|[12][0-9]|3[0-2])x[0-9]+x[0-9]+"

Verdict = Literal["pass", "warn", "fail"]


def median(values: Iterable[float]) -> float:
    """The median; ValueError when there is no value."""
    items = list(values)
    if not items:
        raise ValueError("median of no values")
    return float(statistics.median(items))


def verdict(ratio: float) -> Verdict:
    """fail at 7 % or more below the peers, warn at 3.5 % or more, else pass."""
    if ratio <= FAIL_BELOW:
        return "fail"
    if ratio <= WARN_BELOW:
        return "warn"
    return "pass"


def ratio_to_rest(values: Mapping[K, float]) -> dict[K, float]:
    """Each member over the median of the *other* members (the node comparison: the slowest
    against the median of the rest). Empty with fewer than two members."""
    if len(values) < 2:
        return {}
    out: dict[K, float] = {}
    for key, value in values.items():
        rest = median(v for k, v in values.items() if k != key)
        if rest > 0:
            out[key] = value / rest
    return out


def slowest(ratios: Mapping[K, float]) -> tuple[K, float] | None:
    """The member with the lowest ratio (ties: the first in key order), or None."""
    if not ratios:
        return None
    key = min(sorted(ratios, key=repr), key=lambda k: ratios[k])
    return key, ratios[key]
