"""Recordings of real jobs under ``sparkdiag watch``, replayed: every folder holding a
``watch_expected.json`` (written by scripts/device/watch_jobs.py beside its recordings) under
docs/device/ (the H200 runs, committed as they come back) and tests/fixtures/watch/ (a CPU dry
run with real py-spy stacks and a scripted NVML fixture). Each job's recording must give the
verdict it was built for, name the line of its defect first, name its neighbour where it had
one, give no cause when healthy, and come within the share the file allows of the job's own
throughput truth where the run measured one (or, where a run's share missed it and the file
says why, give that share again).

To add a device run: unpack its archive into docs/device/<date>/<part>/; nothing else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkdiag.watch.diagnose import diagnose
from sparkdiag.watch.model import load
from tests.support import ROOT

FOLDERS = (ROOT / "docs" / "device", ROOT / "tests" / "fixtures" / "watch")


def _cases() -> list[Any]:
    cases = []
    for folder in FOLDERS:
        for expected in sorted(folder.rglob("watch_expected.json")):
            doc = json.loads(expected.read_text(encoding="utf-8"))
            assert doc["schema"] == "sparkdiag-watch-expected/1", expected
            for job in doc["jobs"]:
                name = f"{expected.parent.relative_to(ROOT)}:{job['job']}"
                cases.append(pytest.param(expected.parent, job, id=name))
    return cases


CASES = _cases()


def test_there_is_a_recording_to_replay() -> None:
    assert CASES, "no watch_expected.json under docs/device or tests/fixtures/watch"


@pytest.mark.parametrize(("folder", "job"), CASES)
def test_a_recorded_job_replays_to_what_it_was_built_for(folder: Path, job: dict[str, Any]) -> None:
    d = diagnose(load(folder / job["recording"]))
    found = [(c.name, round(c.share, 3)) for c in d.causes]
    assert d.verdict == job["verdict"], found
    if job["verdict"] == "healthy":
        assert d.causes == ()
        return
    cause = d.causes[0]
    if "line" in job:
        assert cause.sites, f"no line named: {found}"
        site = cause.sites[0]
        assert (Path(site.file).name, site.line) == (job["line"]["file"], job["line"]["line"])
    if job.get("co_tenant"):
        assert cause.tenants and cause.tenants[0].gpu_share is not None
    if "share_as_recorded" in job:
        # a share that missed the truth out of sample (the file's "why" says by how much): the
        # replay must give what the run gave, so a rule change that moves it shows here
        assert job["why"] and abs(cause.share - job["share_as_recorded"]) <= 0.01, cause.share
    elif job.get("truth") is not None and cause.lost:
        assert abs(cause.share - job["truth"]) <= job["share_within"], (cause.share, job["truth"])
