"""One probe cycle of one GPU judged against its baselines: slower than them by more than the
probe's own noise, as fast as them, or not judged (no baseline to compare with).

The noise band. Delivered throughput of the same kernel on the same idle GPU moves from one
cycle to the next: on the lent H200, 10 idle cycles varied by at most 2.0 % (coefficient of
variation of delivered, every dtype and shape; CONTEXT.md, 2026-12-01), 20 consecutive cycles by
at most 2.5 % (docs/probe.md), and a short probe (8192³ bf16, 10 timed iterations) repeated 40
times by 3.5 %, its slowest run 4.7 % below their median (654 against 686 TFLOPS). A figure is
*slower* when it delivers less than ``1 - NOISE_BAND`` = 0.90 of its baseline: three times the
largest coefficient of variation measured (3 x 3.5 % = 10.5 %, rounded to 10 %), twice the
slowest idle repeat, and far above what sharing the GPU costs (beside another process every
dtype and shape read 0.40-0.71 of idle, 0.45-0.51 beside a ViT training job). ``check``'s probe
row fails below 0.85 of the baseline, and ``SparkdiagGemmDegraded`` fires below it for 15 m;
between 0.85 and 0.90 ``probe`` already says "look at it".

Every figure with a baseline is judged, each on its own (a regression of one kernel, an int4
path or a decode shape, is a regression): the cycle is slower when one of them is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sparkdiag.baseline.evaluate import GemmFigure

NOISE_BAND = 0.10  # see the module's docstring: 3 x the 3.5 % CV of a short probe
SLOWER_BELOW = 1.0 - NOISE_BAND

Status = Literal["slower", "as fast", "not judged"]


@dataclass(frozen=True)
class CycleVerdict:
    """status: slower (a figure below SLOWER_BELOW of its baseline), as fast, or not judged
    judged: the figures that had a baseline to compare with
    slower: those below SLOWER_BELOW of it, the slowest first
    lowest: the figure furthest below its baseline (None when none was judged)
    why_not: why nothing was judged (None when something was)
    """

    status: Status
    judged: tuple[GemmFigure, ...]
    slower: tuple[GemmFigure, ...]
    lowest: GemmFigure | None
    why_not: str | None = None


def judge(figures: list[GemmFigure], no_baseline: str) -> CycleVerdict:
    """The verdict of one cycle's figures; ``no_baseline`` says why none has a baseline (a CPU
    run keeps none, a GPU learns one from its first runs)."""
    judged = tuple(f for f in figures if f.efficiency is not None)
    if not judged:
        return CycleVerdict("not judged", (), (), None, no_baseline)
    ranked = sorted(judged, key=lambda f: f.efficiency or 0.0)
    slower = tuple(f for f in ranked if (f.efficiency or 0.0) < SLOWER_BELOW)
    return CycleVerdict("slower" if slower else "as fast", judged, slower, ranked[0])
