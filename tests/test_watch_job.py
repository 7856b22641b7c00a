"""Stopping a job watch started, after watch itself was interrupted: at once where the signal
could not have reached the job (watch signalled alone, no terminal), after a grace where a
terminal's Ctrl-C went to both."""

from __future__ import annotations

import os
import pty
import signal
import sys
import time
from pathlib import Path

import pytest

from sparkdiag.watch import job as job_module
from sparkdiag.watch.job import SpawnedJob, interrupt_reached_job


def test_without_a_terminal_the_job_is_sent_sigint_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with open(os.devnull) as devnull:
        monkeypatch.setattr(sys, "stdin", devnull)
        assert not interrupt_reached_job()
        job = SpawnedJob(["sleep", "30"])
        began = time.monotonic()
        status = job.stop(grace=5.0)
    assert status == 128 + signal.SIGINT
    assert time.monotonic() - began < 2.0  # not the 5 s grace first


def test_a_terminal_that_is_not_watch_s_own_is_not_taken_for_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pty that is not the controlling terminal: tcgetpgrp fails, and watch does not wait."""
    leader, follower = pty.openpty()
    try:
        with os.fdopen(os.dup(follower)) as stdin:
            monkeypatch.setattr(sys, "stdin", stdin)
            assert not interrupt_reached_job()
    finally:
        os.close(leader)
        os.close(follower)


def _trapping_job(tmp_path: Path) -> SpawnedJob:
    """A job that exits 9 on SIGINT, else 7 after 0.5 s; returned once its trap is set."""
    ready = tmp_path / f"ready-{time.monotonic_ns()}"
    job = SpawnedJob(["sh", "-c", f"trap 'exit 9' INT; touch {ready}; sleep 0.5; exit 7"])
    deadline = time.monotonic() + 10
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return job


def test_where_the_terminal_s_ctrl_c_reached_the_job_it_waits_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A job that ends on its own within the grace gets no signal from watch; without the
    terminal's Ctrl-C it gets one at once."""
    monkeypatch.setattr(job_module, "interrupt_reached_job", lambda: True)
    assert _trapping_job(tmp_path).stop(grace=5.0) == 7
    monkeypatch.setattr(job_module, "interrupt_reached_job", lambda: False)
    assert _trapping_job(tmp_path).stop(grace=5.0) == 9
