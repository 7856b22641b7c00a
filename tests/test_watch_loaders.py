"""A real DataLoader's worker processes under watch, on this machine's CPU: py-spy records them
after the job's own process, the recording names them ``pt_data_worker``, their stacks hold the
dataset's line that takes their time, and they are neither the training thread nor ranks (the
job runs under torchrun, so each worker inherits ``RANK``). Whether a GPU waited for them is the
diagnosis' business (tests/test_watch_stack_rules.py: the loader lines in an input-starved
cause); here the recording and its reading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkdiag.watch.loaders import loader_lines
from sparkdiag.watch.model import load
from sparkdiag.watch.threads import read_recording
from tests.support import skip_unless_installed, sparkdiag_cmd

skip_unless_installed("torch")
pyspy = pytest.importorskip("sparkdiag.sources.host.pyspy")
if pyspy.find() is None:
    pytest.skip("py-spy is not installed here", allow_module_level=True)

JOB = """
import time
import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        end = time.perf_counter() + 0.02
        while time.perf_counter() < end:   # the workers' work
            pass
        return torch.zeros(8)


if __name__ == "__main__":
    loader = DataLoader(Slow(), batch_size=4, num_workers=2)
    end = time.monotonic() + 6
    for batch in loader:   # the training loop waits here
        (batch @ torch.ones(8, 8)).sum()
        if time.monotonic() > end:
            break
"""


@pytest.mark.slow
def test_dataloader_workers_are_recorded_and_their_line_named(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    line = next(i for i, text in enumerate(JOB.splitlines(), 1) if "the workers' work" in text)
    port = str(29300 + os.getpid() % 300)
    result = subprocess.run(
        sparkdiag_cmd("watch", "--json", "--interval", "0.25", "--record",
                      str(tmp_path / "run.json"), "--", sys.executable, "-m",
                      "torch.distributed.run", "--nproc-per-node", "1", "--master-port", port,
                      "job.py"),
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    json.loads(result.stdout)
    rec = load(tmp_path / "run.json")
    workers = {t.pid for t in rec.threads if t.loader}
    assert len(workers) == 2, rec.threads
    assert not workers & {r.pid for r in rec.ranks}  # they inherit RANK, and are no rank
    assert [r.rank for r in rec.ranks if r.rank is not None] == [0]
    readings = read_recording(rec)
    assert not {rec.threads[t].pid for t in readings.training} & workers
    found = loader_lines(rec, readings, range(len(rec.ticks)))
    # py-spy reads the loop's test or its body
    assert found and found[0].file == "job.py" and found[0].line in (line, line + 1), found
    assert found[0].function == "Slow.__getitem__"
    assert found[0].share > 0.5
