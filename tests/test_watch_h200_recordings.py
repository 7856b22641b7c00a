"""The watch diagnosis on the recordings of real jobs on the lent H200 (2026-12-01,
scripts/device/watch_jobs.py, docs/device/2026-12-01/part-c): each synthetic job must get the
cause it was built with, as the device run reported or, for the checkpoint job, as the
diagnosis now reads it (the device run called its serialisation a CPU-bound launcher)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkdiag.watch.diagnose import diagnose
from sparkdiag.watch.model import load

RECORDINGS = Path(__file__).parents[1] / "docs" / "device" / "2026-12-01" / "part-c"
EXPECTED = {
    "healthy": ("healthy", set()),
    "starved": ("input-starved", {"input-starved"}),
    "checkpoint": ("checkpoint-stalls", {"checkpoint-stalls"}),
    "launch": ("cpu-bound-launcher", {"cpu-bound-launcher"}),
    "fp32": ("low-tensor-activity", {"low-tensor-activity"}),
}


@pytest.mark.parametrize("job", sorted(EXPECTED))
def test_h200_job_recordings(job: str) -> None:
    verdict, causes = EXPECTED[job]
    d = diagnose(load(RECORDINGS / f"{job}.recording.json"))
    assert d.verdict == verdict, [(c.name, round(c.share, 3)) for c in d.causes]
    assert {c.name for c in d.causes} == causes
    assert d.gpus == (0,)


def test_h200_checkpoint_share_covers_the_serialisation() -> None:
    """Alone the checkpoint job ran 292 matmuls/s against the healthy job's 600: it lost about
    half its time; the stop before each write counts, so the share is well above the 15 % the
    write bursts and fsync alone gave."""
    d = diagnose(load(RECORDINGS / "checkpoint.recording.json"))
    assert 0.3 <= d.causes[0].share <= 0.6
