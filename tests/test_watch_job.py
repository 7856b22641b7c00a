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
from click.testing import CliRunner

from sparkdiag.cli import main
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


# ---- what a command that cannot start is told --------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current folder, holding notes.txt (not executable), run.sh (executable) and a
    folder; PATH a folder holding tool.txt (not executable)."""
    (tmp_path / "notes.txt").write_text("not a program\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "run.sh").chmod(0o755)
    (tmp_path / "sub").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tool.txt").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(bin_dir))
    return tmp_path


@pytest.mark.parametrize("ptracer", [False, True])
@pytest.mark.parametrize(
    ("program", "error", "message"),
    [
        ("notes.txt", PermissionError,
         "not found on PATH, and ./notes.txt in this folder is not executable (permission denied)"),
        ("./notes.txt", PermissionError, "Permission denied (not executable)"),
        ("./sub", PermissionError, "Permission denied (it is a folder)"),
        ("tool.txt", PermissionError, "Permission denied ({bin}/tool.txt is not executable)"),
        ("run.sh", FileNotFoundError,
         "not found on PATH (to run ./run.sh in this folder, give ./run.sh)"),
        ("./missing", FileNotFoundError, "No such file or directory"),
        ("missing", FileNotFoundError, "No such file or directory"),
    ],
)  # fmt: skip
def test_a_command_that_cannot_start_says_why_with_or_without_the_shim(
    folder: Path, program: str, error: type[OSError], message: str, ptracer: bool
) -> None:
    """The errors exec gives, and what PATH lookup leaves unsaid: a file of that name in the
    current folder is not run. Through the ptracer shim (Yama ptrace_scope 1) as without it:
    shutil.which answered None for a file that is not executable, which read "No such file or
    directory"."""
    with pytest.raises(error) as caught:
        SpawnedJob([program], ptracer=ptracer)
    assert caught.value.strerror == message.replace("{bin}", str(folder / "bin"))
    assert caught.value.filename == program
    assert SpawnedJob(["./run.sh"], ptracer=ptracer).wait() == 0


def test_watch_names_a_file_that_is_not_executable(folder: Path) -> None:
    """``sparkdiag watch -- notes.txt`` from the folder that holds it said "No such file or
    directory"."""
    result = CliRunner().invoke(main, ["watch", "--stacks", "off", "--", "notes.txt"])
    assert result.exit_code == 2, result.output
    assert result.output.endswith(
        "cannot start notes.txt: not found on PATH, and ./notes.txt in this folder is not "
        "executable (permission denied)\n"
    )
    result = CliRunner().invoke(main, ["watch", "--stacks", "off", "--", "./notes.txt"])
    assert result.output.endswith("cannot start ./notes.txt: Permission denied (not executable)\n")
