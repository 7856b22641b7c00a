"""Stopping a job watch started, after watch itself was interrupted: at once where the signal
could not have reached the job (watch signalled alone, no terminal), after a grace where a
terminal's Ctrl-C went to both."""

from __future__ import annotations

import itertools
import os
import pty
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner

from sparkdiag.cli import main
from sparkdiag.sources.host.procfs import process_tree
from sparkdiag.watch import job as job_module
from sparkdiag.watch.job import (
    AttachedJob,
    SpawnedJob,
    follow,
    interrupt_reached_job,
    unwatchable,
)
from sparkdiag.watch.model import Tick
from tests.support import alive, wait_dead


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


def _trapping_job(tmp_path: Path, seconds: float = 0.5) -> SpawnedJob:
    """A job that exits 9 on SIGINT, else 7 after ``seconds``; returned once its trap is set.
    Its sleep runs in the background, where a non-interactive shell's child ignores SIGINT:
    stop signals the job's children before the job, and a sleep in the foreground that died of
    the signal let the shell go on to ``exit 7`` before its own SIGINT came (4 workers on 2
    cores)."""
    ready = tmp_path / f"ready-{time.monotonic_ns()}"
    body = f"trap 'kill $!; exit 9' INT; touch {ready}; sleep {seconds} & wait $!; exit 7"
    job = SpawnedJob(["sh", "-c", body])
    deadline = time.monotonic() + 10
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return job


def test_where_the_terminal_s_ctrl_c_reached_the_job_it_waits_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A job that ends on its own within the grace gets no signal from watch; without the
    terminal's Ctrl-C it gets one at once."""
    monkeypatch.setattr(job_module, "interrupt_reached_job", lambda pid=None: True)
    assert _trapping_job(tmp_path).stop(grace=5.0) == 7
    monkeypatch.setattr(job_module, "interrupt_reached_job", lambda pid=None: False)
    # a job that would run on for a minute: with four pytest workers on 2 cores, one of 0.5 s
    # once ended by itself (7) between its trap and watch's signal
    assert _trapping_job(tmp_path, seconds=60).stop(grace=5.0) == 9


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


# ---- stopping the whole job: every process under it, at once on a further signal -------------


def _descendants(job: SpawnedJob, count: int, timeout: float = 30) -> list[int]:
    """The processes under ``job`` once there are ``count`` of them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        below = process_tree(Path("/"), job.pid)[1:]
        if len(below) >= count:
            return below
        time.sleep(0.02)
    raise AssertionError(f"the job {job.argv} started fewer than {count} processes")


def test_stop_ends_every_process_under_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sh -c 'sleep 60; true'`` (make, a launcher, any shell that does not exec): SIGINT and
    SIGTERM went to the shell alone, which ended, and its sleep ran on, orphaned, after watch
    exited (found by a review: ``kill -TERM`` to watch left ``sleep 61`` under PID 1)."""
    monkeypatch.setattr(job_module, "interrupt_reached_job", lambda pid=None: False)
    job = SpawnedJob(["sh", "-c", "sleep 60; true"])
    (sleeper,) = _descendants(job, 1)
    try:
        job.stop(grace=5.0)
        assert wait_dead([sleeper], 0) == [], "the job's child was left running"
    finally:
        if alive(sleeper):
            os.kill(sleeper, signal.SIGKILL)


def test_stop_reaches_a_child_in_a_session_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child that left the job's process group (setsid: a terminal's Ctrl-C does not reach
    it) is still the job's, and stopped with it."""
    monkeypatch.setattr(job_module, "interrupt_reached_job", lambda pid=None: False)
    job = SpawnedJob(["sh", "-c", "setsid sleep 60 & wait"])
    (sleeper,) = _descendants(job, 1)
    try:
        job.stop(grace=5.0)
        assert wait_dead([sleeper], 0) == []
    finally:
        if alive(sleeper):
            os.kill(sleeper, signal.SIGKILL)


def test_a_further_stop_signal_moves_on_to_the_next_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A job that ignores SIGINT and SIGTERM took 10 s of grace to be killed whatever the user
    did; each further Ctrl-C or SIGTERM to watch (``hurry`` goes up) now sends the next
    signal at once: here every look sees one more, so SIGKILL comes well within one grace."""
    monkeypatch.setattr(job_module, "interrupt_reached_job", lambda pid=None: False)
    ready = tmp_path / "ready"
    job = SpawnedJob(["sh", "-c", f"trap '' INT TERM; touch {ready}; while :; do sleep 1; done"])
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    signals = itertools.count()
    began = time.monotonic()
    assert job.stop(grace=60.0, hurry=lambda: next(signals)) == 128 + signal.SIGKILL
    assert time.monotonic() - began < 30


def test_waiting_after_the_duration_stops_the_job_on_a_signal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After --duration, watch waits for its job; Ctrl-C and SIGTERM were not looked at, so
    watch waited as long as the job ran. They now stop it, as while it was watched."""
    monkeypatch.setattr(job_module, "interrupt_reached_job", lambda pid=None: False)
    stop = threading.Event()
    done = SpawnedJob(["sh", "-c", "exit 4"])
    assert done.wait_unless(stop) == 4
    job = SpawnedJob(["sleep", "60"])
    threading.Timer(0.2, stop.set).start()
    assert job.wait_unless(stop) == 128 + signal.SIGINT


# ---- --pid that cannot be a job ----------------------------------------------------------------


def test_a_kernel_thread_or_watch_itself_is_refused() -> None:
    """``--pid 2`` (kthreadd) was followed, its tree every kernel thread, and said "healthy"
    from the GPU's readings alone; ``--pid`` of watch sampled its own sampling."""
    kthread = unwatchable(Path("/"), 2, os.getpid())
    if Path("/proc/2/stat").exists() and "kthreadd" in Path("/proc/2/stat").read_text():
        assert kthread.startswith("2 (kthreadd) is a kernel thread, not a job; give the pid")
    assert unwatchable(Path("/"), os.getpid(), os.getpid()).endswith(
        "is this sparkdiag watch itself; give the pid of the job to watch"
    )
    assert unwatchable(Path("/"), os.getppid(), os.getpid()) == ""


def test_a_script_whose_interpreter_is_missing_says_so(tmp_path: Path) -> None:
    """exec's ENOENT said "No such file or directory" of a script that is there."""
    script = tmp_path / "job"
    script.write_text("#!/nonexistent/python3 -u\nprint('hi')\n")
    script.chmod(0o755)
    with pytest.raises(FileNotFoundError) as caught:
        SpawnedJob([str(script)])
    assert caught.value.strerror.startswith("its interpreter /nonexistent/python3 (its #! line)")
    with pytest.raises(FileNotFoundError, match="the command's name is empty"):
        SpawnedJob([""])


# ---- the loop: the job's end and the duration are not held back by a long interval -------------


class _Ticks:
    """A sampler whose ticks are only counted."""

    def __init__(self) -> None:
        self.taken = 0

    def tick(self) -> Tick:
        self.taken += 1
        return Tick(t=float(self.taken), dt=1.0)


def test_a_long_interval_does_not_hold_back_the_end_or_the_duration() -> None:
    """``watch --interval 20 -- true`` took 20 s and reported the job watched for 20 s;
    ``--duration 0.1 --interval 20`` ran 20 s too."""
    sampler = _Ticks()
    began = time.monotonic()
    followed = follow(cast(Any, sampler), lambda: True, 20.0, None, threading.Event())
    assert (followed.ended_by, len(followed.ticks)) == ("exit", 1)
    followed = follow(cast(Any, sampler), lambda: False, 20.0, 0.1, threading.Event())
    assert (followed.ended_by, len(followed.ticks)) == ("duration", 1)
    assert time.monotonic() - began < 15


def test_a_job_that_left_watch_s_process_group_is_not_taken_to_have_had_the_ctrl_c(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With watch in the terminal's foreground, a job in a session of its own (setsid) never
    gets the terminal's Ctrl-C, yet watch waited the whole grace before sending it SIGINT."""
    monkeypatch.setattr(os, "isatty", lambda fd: True)
    monkeypatch.setattr(os, "tcgetpgrp", lambda fd: os.getpgrp())
    with open(os.devnull) as devnull:
        monkeypatch.setattr(sys, "stdin", devnull)
        assert interrupt_reached_job()  # watch's own group holds the terminal
        code = "import os; os.setsid(); os.execvp('sleep', ['sleep', '60'])"
        job = SpawnedJob([sys.executable, "-c", code])
        deadline = time.monotonic() + 30
        while os.getpgid(job.pid) == os.getpgrp() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not interrupt_reached_job(job.pid)
        began = time.monotonic()
        assert job.stop(grace=30.0) == 128 + signal.SIGINT
    assert time.monotonic() - began < 15  # not the 30 s grace first


def test_an_attached_pid_given_to_another_process_ends_the_watch(tmp_path: Path) -> None:
    """``--pid`` that exited and whose pid the kernel gave to a new process: watch followed the
    newcomer as the job. Its start time (/proc/PID/stat field 22) tells them apart."""
    stat = tmp_path / "proc" / "4242" / "stat"
    stat.parent.mkdir(parents=True)

    def started_at(ticks: int) -> None:
        stat.write_text("4242 (train) S 1 " + " ".join(["0"] * 17) + f" {ticks} 0 0\n")

    started_at(1000)
    job = AttachedJob(4242, tmp_path)
    assert not job.ended()
    started_at(2000)  # another process, same pid
    assert job.ended()


def test_a_program_that_cannot_start_is_said_alone(tmp_path: Path) -> None:
    """'watch -- /nonexistent' first said that NVML was unavailable and what would not be
    sampled, then that the program cannot start (found in a review): one line now."""
    missing = str(tmp_path / "nonexistent")
    result = CliRunner().invoke(main, ["watch", "--stacks", "off", "--", missing])
    assert result.exit_code == 2
    assert result.output == f"Error: cannot start {missing}: No such file or directory\n"
