"""Before a baseline is learned: a run that would teach it is held against the published
reference and, where the daemon has peers, against them.

A baseline is the median of a GPU's first healthy runs, then frozen. A GPU that is slow on the
day sparkdiag starts would freeze a slow baseline and never alert. So, while a baseline is still
being learned, each healthy run of a compute-bound kernel is vetted:

* **reference floor** (always, as before 2026-12): below half of a published *measured* MAMF
  figure, the run never counts. A datasheet peak is no floor (the H200's int8 delivers 47 % of
  it when healthy).
* **peers** (where the daemon has other GPUs of the same model, context and software with a
  healthy figure for the same kernel): at least 7 % below their median (``FAIL_BELOW``, the fleet
  alert's threshold), *and* below 0.85 of a measured MAMF figure where one exists for the
  kernel, the run is held. A healthy H200 delivers 0.86-0.96 of its 794.5 TFLOPS bf16 MAMF
  (725-760 cold, 683 after 40 s at the power cap: CONTEXT.md); one 10 % slower than its peers
  delivers about 0.82. Peers that are all as slow do not hold anything (the reference floor
  still does): this catches one GPU, not a fleet.

A held run is stored as not healthy, with the verdict in its conditions (``held``), so it never
goes into the baseline; the daemon logs the hold, exports ``sparkdiag_gemm_baseline_held`` and
``sparkdiag check`` reports it (``baseline-learning``). Once the GPU is fixed its runs count again
and the baseline is learned from them; a GPU meant to be slower gets its baseline with
``sparkdiag baseline pin``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sparkdiag.baseline.reference import Reference
from sparkdiag.peers.ranking import COMPUTE_KINDS, FAIL_BELOW, median

# Below this fraction of a published measured MAMF a compute-bound run never counts as healthy,
# so a GPU stuck in a slow state from the start cannot teach itself a low baseline.
MIN_REFERENCE_FRACTION = 0.5
# With peers: held when at least 7 % below them and below this fraction of a measured MAMF.
PEER_REFERENCE_FRACTION = 0.85
PEER_RATIO = FAIL_BELOW

# (dtype, shape, beta) -> the peers' healthy delivered figures for that kernel
PeerValues = Mapping[tuple[str, str, int], Sequence[float]]


@dataclass(frozen=True)
class Held:
    """Why a run was kept out of the baseline it would have taught.

    against: ``reference`` (below half of a measured MAMF), ``peers`` (7 % below the peers, no
        measured reference for the kernel) or ``peers_and_reference`` (both)
    delivered: the run's throughput; peer_median and peers: the peers' median and how many
    reference: the MAMF figure and the run's fraction of it, where one applies
    """

    against: str
    delivered: float
    peer_median: float | None = None
    peers: int = 0
    reference: float | None = None

    @property
    def peer_ratio(self) -> float | None:
        return None if not self.peer_median else self.delivered / self.peer_median

    @property
    def reference_fraction(self) -> float | None:
        return None if not self.reference else self.delivered / self.reference

    def describe(self) -> str:
        """``7.9 % below the median of 7 peers (725) and 0.82 of the published MAMF 794.5``."""
        parts = []
        if self.peer_ratio is not None and self.peer_median is not None:
            parts.append(
                f"{1 - self.peer_ratio:.1%} below the median of {self.peers} peer(s) "
                f"({self.peer_median:.4g})"
            )
        if self.reference_fraction is not None and self.reference is not None:
            parts.append(f"{self.reference_fraction:.2f} of the published MAMF {self.reference:g}")
        return " and ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """Every field by name, as :meth:`from_dict` reads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> Held | None:
        """The verdict kept in a run's conditions, or None when it is not one."""
        if not isinstance(raw, Mapping) or not isinstance(raw.get("against"), str):
            return None
        try:
            delivered = float(raw["delivered"])
            peer_median = None if raw.get("peer_median") is None else float(raw["peer_median"])
            reference = None if raw.get("reference") is None else float(raw["reference"])
            peers = int(raw.get("peers") or 0)
        except (KeyError, TypeError, ValueError):
            return None
        return cls(str(raw["against"]), delivered, peer_median, peers, reference)


def mamf_floor(kind: str, beta: int, reference: Reference | None) -> float | None:
    """The measured MAMF figure that applies to this kernel (the compute cube, beta=0), if any."""
    if reference is None or reference.kind != "mamf" or kind != "compute" or beta != 0:
        return None
    return reference.tflops


def below_reference(
    delivered: float, kind: str, beta: int, reference: Reference | None
) -> Held | None:
    """The reference floor: below half of a measured MAMF figure."""
    mamf = mamf_floor(kind, beta, reference)
    if mamf is not None and delivered < MIN_REFERENCE_FRACTION * mamf:
        return Held("reference", delivered, reference=mamf)
    return None


def below_peers(
    delivered: float, kind: str, beta: int, reference: Reference | None, peers: Sequence[float]
) -> Held | None:
    """At least 7 % below the peers' median, and below 0.85 of a measured MAMF where one applies."""
    values = [v for v in peers if v > 0]
    if kind not in COMPUTE_KINDS or not values:
        return None
    middle = median(values)
    if delivered > PEER_RATIO * middle:
        return None
    mamf = mamf_floor(kind, beta, reference)
    if mamf is None:
        return Held("peers", delivered, middle, len(values))
    if delivered < PEER_REFERENCE_FRACTION * mamf:
        return Held("peers_and_reference", delivered, middle, len(values), mamf)
    return None
