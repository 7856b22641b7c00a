"""A driver that hangs does not hang ``sparkdiag check``: NVML's start and first poll are waited
for at most ``--nvml-timeout`` seconds, the ``nvml`` row then fails, the host rows still come,
the report is printed and check exits 3; Ctrl-C and SIGTERM end the wait (130). Before, an
``nvmlInit`` that never returned (a stub libnvidia-ml) held check for ever, deaf to Ctrl-C and
SIGTERM (found in a review: 615 s until SIGKILL, nothing printed).

The hung driver is a ``pynvml.nvmlInit`` (or a poll) that waits in C for ever, as a stuck
driver holds its caller: no Python runs in that thread, so no signal handler either.
The command's own tests run in a child process: check ends it without waiting for the stuck
thread."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkdiag.check import gather as gather_module
from sparkdiag.check.catalog import run_checks
from sparkdiag.check.model import CheckContext, KernelLog
from sparkdiag.sources.nvml import driver
from sparkdiag.sources.nvml.driver import NvmlHung, given_up, hung_reason, within
from sparkdiag.sources.nvml.fixture import FixtureBackend
from sparkdiag.telemetry.build import WHAT_FIRST_POLL, WHAT_LATER_POLL, first_poll
from tests.support import ROOT
from tests.support.check import (
    GOOD_TORCH,
    NVML,
    ROOTFS,
    SYSFS,
    empty_sysfs,
    never_launch,
    settings,
)

# Replaces what hangs with a wait in C that no signal ends (sigwait for a signal never sent,
# which glibc resumes after a handler ran, as the review's stub libnvidia-ml sleeps in a loop),
# then runs ``sparkdiag check ARGS``; "nvmlInit" hangs NVML's start, "read" the first poll (on
# an NVML fixture, whose start answers; a poll starts with the backend's advance), "later"
# every poll after the first. It says "waiting" on stderr once the hang is reached.
_HUNG = """
import signal, sys

def hang(*args, **kwargs):
    print("waiting", file=sys.stderr, flush=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    while True:
        signal.sigwait({signal.SIGUSR2})

if sys.argv[1] == "nvmlInit":
    import pynvml
    pynvml.nvmlInit = hang
elif sys.argv[1] == "later":
    from sparkdiag.sources.nvml.fixture import FixtureBackend
    first = FixtureBackend.advance
    polls = []

    def advance(self, *args, **kwargs):
        polls.append(1)
        if len(polls) > 1:
            hang()
        return first(self, *args, **kwargs)

    FixtureBackend.advance = advance
else:
    from sparkdiag.sources.nvml.fixture import FixtureBackend
    FixtureBackend.advance = hang
from sparkdiag.cli import main
main(["check", *sys.argv[2:]])
"""


def _check(where: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _HUNG, where, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _args(tmp_path: Path, sysfs: Path, *more: str) -> list[str]:
    return [
        "--quick",
        "--json",
        "--path.sysfs",
        str(sysfs),
        "--path.rootfs",
        str(ROOTFS / "native"),
        "--state-dir",
        str(tmp_path / "state"),
        "--no-nvme.smart",
        *more,
    ]


def _ended(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("where", ["nvmlInit", "read"])
def test_a_hung_driver_gives_a_failed_nvml_row_and_the_report(tmp_path: Path, where: str) -> None:
    """nvmlInit, or the first poll after it, does not return: after --nvml-timeout the nvml
    row fails saying so, the host rows are there, and check exits 3 (a failure) at once,
    without waiting for the stuck thread. On a machine whose GPU sysfs does not show (here an
    empty sysfs) the nvml row would have skipped as "no NVIDIA driver here"."""
    args = _args(tmp_path, empty_sysfs(tmp_path), "--nvml-timeout", "1")
    if where == "read":
        args += ["--nvml-fixture", str(NVML / "h200-idle.json")]
    started = time.monotonic()
    proc = _check(where, *args)
    out, err = _ended(proc)
    assert "waiting" in err  # the hang was reached
    assert proc.returncode == 3, err
    assert time.monotonic() - started < 30
    doc = json.loads(out)
    assert doc["schema"] == "sparkdiag-check/1" and doc["status"] == "fail"
    assert doc["exit_code"] == 3
    rows = {r["name"]: r for r in doc["checks"]}
    nvml = rows["nvml"]
    assert nvml["status"] == "fail"
    assert nvml["finding"].startswith("NVML did not answer in 1 s: the driver may be hung")
    assert "dmesg" in nvml["action"] and "nvidia-smi" in nvml["action"]
    assert nvml["data"] == {"timeout_seconds": 1.0, "waited_for": WHAT_FIRST_POLL}
    assert rows["gpus"]["data"].get("see") == "nvml"  # the GPU rows refer to it
    assert rows["context"]["status"] == "pass"  # the host rows still run


def test_a_driver_that_hangs_after_the_first_poll_does_not_hold_check(tmp_path: Path) -> None:
    """The first poll answers and the next does not: a busy GPU (h200-stalled.json, 100 %
    utilization) is sampled for the stall row, and that poll hung check for ever. Now it is
    waited for --nvml-timeout: the nvml row fails naming the later poll, the stall row skips
    as not sampled (it does not pass a GPU it could not read), the host rows come, exit 3."""
    args = _args(tmp_path, SYSFS / "h200-vm", "--nvml-timeout", "1")
    args += ["--nvml-fixture", str(NVML / "h200-stalled.json")]
    started = time.monotonic()
    proc = _check("later", *args)
    out, err = _ended(proc)
    assert "waiting" in err  # the second poll was reached and hung
    assert proc.returncode == 3, err
    assert time.monotonic() - started < 30
    rows = {r["name"]: r for r in json.loads(out)["checks"]}
    nvml = rows["nvml"]
    assert nvml["status"] == "fail"
    assert nvml["finding"].startswith("NVML did not answer in 1 s: the driver may be hung")
    assert nvml["data"] == {"timeout_seconds": 1.0, "waited_for": WHAT_LATER_POLL}
    stall = rows["stall"]
    assert stall["status"] == "skip" and stall["finding"] == (
        "busy, not sampled: NVML did not answer in 1 s: the driver may be hung"
    )
    assert rows["context"]["status"] == "pass"  # the host rows still run


def _gather_hanging_from(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, release: threading.Event, poll: int
) -> tuple[CheckContext, list[int]]:
    """check's gather in this process on h200-stalled.json (a busy GPU, sampled for the stall
    row), NVML hanging from poll number ``poll`` on (1: the first); and the poller's stops."""
    polls: list[int] = []
    first = FixtureBackend.advance

    def advance(self: FixtureBackend) -> None:
        polls.append(1)
        if len(polls) >= poll:
            release.wait()
        first(self)

    stopped: list[int] = []
    monkeypatch.setattr(FixtureBackend, "advance", advance)
    monkeypatch.setattr(FixtureBackend, "shutdown", lambda self: stopped.append(1))
    return _gather_stalled(tmp_path), stopped


def _gather_stalled(tmp_path: Path, quick: bool = False) -> CheckContext:
    """check's gather on h200-stalled.json with a 0.5 s --nvml-timeout, nothing probed."""
    return gather_module.gather(
        settings(NVML / "h200-stalled.json", state_dir=tmp_path / "state"),
        sources=gather_module.Sources(
            launcher=never_launch,
            torch=GOOD_TORCH,
            kernel_log=KernelLog((), "test"),
            sleep=lambda _s: None,
        ),
        nvml_timeout=0.5,
        quick=quick,
    )


def test_a_probe_is_not_started_once_nvml_stopped_answering(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, release: threading.Event
) -> None:
    """In this process: the stall sampling's first poll hangs; the probe is then not launched
    (the launcher would fail the test), it says why, the stall row skips as not sampled, and
    the poller is not stopped (its stop would wait on the stuck call)."""
    ctx, stopped = _gather_hanging_from(monkeypatch, tmp_path, release, poll=2)
    assert ctx.nvml_lost == hung_reason(0.5)
    assert ctx.probe_skipped == "not probed: " + hung_reason(0.5)
    assert ctx.probes == {} and ctx.stall_samples == {0: ()}
    assert stopped == []
    (stall,) = [r for r in run_checks(ctx) if r.name == "stall"]
    assert (stall.status, stall.finding) == ("skip", "busy, not sampled: " + hung_reason(0.5))


def test_the_stall_samples_taken_before_a_hang_are_judged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, release: threading.Event
) -> None:
    """Three samples of the stalled GPU, then NVML hangs: the three are kept and judged (the
    stall row fails on them), where the first version threw them away and said "not
    sampled" (found in a review)."""
    ctx, _stopped = _gather_hanging_from(monkeypatch, tmp_path, release, poll=5)
    assert ctx.nvml_lost == hung_reason(0.5) and len(ctx.stall_samples[0]) == 3
    (stall,) = [r for r in run_checks(ctx) if r.name == "stall"]
    assert stall.status == "fail" and stall.data is not None and stall.data["samples"] == 3


def test_a_slow_host_reading_is_not_taken_for_a_hung_driver(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A later poll's host readings (an NVMe tool, sysfs) are not under --nvml-timeout: a host
    read of 1 s after the first poll, with a 0.5 s deadline, read as "NVML did not answer" and
    skipped the probe (found in a review). Only the NVML part of a poll is timed."""
    from sparkdiag.telemetry.poller import Poller

    reads: list[int] = []
    real = Poller.poll_once

    def slow_host(self: Poller, bound: object = None) -> object:
        if self.read_host is not None and not getattr(self, "_slowed", False):
            inner = self.read_host

            def read_host() -> object:
                reads.append(1)
                if len(reads) == 2:  # the first poll after the first
                    time.sleep(1.0)
                return inner()

            self.read_host = read_host  # type: ignore[assignment]
            self._slowed = True  # type: ignore[attr-defined]
        return real(self, bound)  # type: ignore[arg-type]

    monkeypatch.setattr(Poller, "poll_once", slow_host)
    ctx = _gather_stalled(tmp_path, quick=True)
    assert len(reads) > 1  # the later polls read the host, slowly
    assert ctx.nvml_lost is None and len(ctx.stall_samples[0]) == 5


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_the_wait_for_a_hung_driver(tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C (or SIGTERM) while check waits for a hung nvmlInit: 130 at once, with the
    interrupted document (--json) and one line on stderr, not a wait for the deadline."""
    args = _args(tmp_path, SYSFS / "h200-vm", "--nvml-timeout", "300")
    proc = _check("nvmlInit", *args)
    assert proc.stderr is not None and proc.stderr.readline() == "waiting\n"
    time.sleep(0.3)  # well into the wait
    sent = time.monotonic()
    proc.send_signal(sig)
    out, err = _ended(proc)
    assert time.monotonic() - sent < 20
    assert (proc.returncode, err) == (130, "Error: interrupted\n")
    doc = json.loads(out)
    assert doc["interrupted"] is True and doc["signal"] == sig.name
    assert doc["exit_code"] == 130 and doc["checks"] == []


def test_help_says_the_deadline() -> None:
    from click.testing import CliRunner

    from sparkdiag.cli import main

    out = " ".join(CliRunner().invoke(main, ["check", "--help"]).output.split())
    assert "--nvml-timeout SECONDS" in out and "[default: 30.0; x>0]" in out
    assert "the nvml row fails (NVML did not answer in SECONDS s)" in out
    assert "3 at least one check failed (NVML that did not answer within --nvml-timeout" in out


# -- the mechanism, in this process ---------------------------------------------------------------


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """An event that what hangs in a test waits on: set at the end, so no thread outlives it."""
    event = threading.Event()
    yield event
    event.set()


def test_within_answers_raises_or_gives_up(release: threading.Event) -> None:
    assert within(5, "answer", lambda: 42) == 42

    def fails() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        within(5, "fails", fails)
    earlier = len(given_up())
    started = time.monotonic()
    with pytest.raises(NvmlHung) as hung:
        within(0.3, "stuck", release.wait)
    assert 0.3 <= time.monotonic() - started < 5
    assert str(hung.value) == hung_reason(0.3)
    assert hung_reason(0.3) == "NVML did not answer in 0.3 s: the driver may be hung"
    (gave_up,) = given_up()[earlier:]
    assert (gave_up.what, gave_up.seconds, gave_up.running) == ("stuck", 0.3, True)
    release.set()
    gave_up.thread.join(5)
    assert not gave_up.running


def test_first_poll_of_a_hung_start_is_nvml_down_with_the_host_read(
    monkeypatch: pytest.MonkeyPatch, release: threading.Event
) -> None:
    """nvmlInit does not return: the poller returned is one whose NVML is down, saying why,
    with the host's readings (PCIe links) taken; nothing is asked of the hung backend again."""
    entered = threading.Event()

    def init(self: FixtureBackend) -> None:
        entered.set()
        release.wait()

    monkeypatch.setattr(FixtureBackend, "init", init)
    started = time.monotonic()
    poller, snapshot = first_poll(settings(NVML / "h200-idle.json"), 0.5)
    assert entered.is_set() and time.monotonic() - started < 10
    assert not snapshot.nvml_up and snapshot.gpus == ()
    assert snapshot.collectors["nvml"].error == hung_reason(0.5)
    assert snapshot.pcie_links  # the host is still read
    assert isinstance(poller.gpu.backend, driver.Unanswered)
    poller.gpu.stop()


def test_first_poll_answered_in_time_is_the_poll() -> None:
    poller, snapshot = first_poll(settings(NVML / "h200-idle.json"), 30)
    try:
        assert snapshot.nvml_up and len(snapshot.gpus) == 1
        assert isinstance(poller.gpu.backend, FixtureBackend)
    finally:
        poller.gpu.stop()


def test_gather_waits_for_nvml_no_longer_than_told(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """gather's nvml_timeout reaches the first poll."""
    seen: list[float] = []
    real = gather_module.first_poll

    def spy(settings_: object, seconds: float) -> object:
        seen.append(seconds)
        return real(settings_, seconds)  # type: ignore[arg-type]

    monkeypatch.setattr(gather_module, "first_poll", spy)
    sources = gather_module.Sources(
        launcher=never_launch, torch=GOOD_TORCH, kernel_log=KernelLog((), "test")
    )
    gather_module.gather(
        settings(NVML / "h200-idle.json", state_dir=tmp_path / "state"),
        quick=True,
        sources=sources,
        nvml_timeout=7.0,
    )
    assert seen == [7.0]


def test_a_hung_driver_does_not_hang_dump(tmp_path: Path) -> None:
    """dump's one poll: NVML that does not start in time is down (sparkdiag_nvml_up 0, the host
    metrics still printed) and dump exits 0 at once; it hung for ever, deaf to Ctrl-C (the
    review's stub libnvidia-ml)."""
    script = _HUNG.replace('main(["check", *sys.argv[2:]])', (
        "import sparkdiag.daemon\n"
        "sparkdiag.daemon.ANSWER_SECONDS = 1.0\n"
        'main(["dump", *sys.argv[2:]])'
    ))  # fmt: skip
    args = ["--path.sysfs", str(empty_sysfs(tmp_path)), "--path.rootfs", str(ROOTFS / "native"),
            "--no-nvme.smart"]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", script, "nvmlInit", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = _ended(proc)
    assert "waiting" in err and proc.returncode == 0, err
    assert time.monotonic() - started < 30
    assert "sparkdiag_nvml_up 0" in out
    assert "did not answer in 1 s" in err


def test_an_answer_after_the_deadline_goes_to_late(release: threading.Event) -> None:
    """What the work returns after within gave up is handed to ``late``, in the work's thread:
    first_poll stops the poller NVML built late (it was dropped with NVML initialised, found
    in a review); an answer in time is not."""
    late: list[str] = []

    def slow() -> str:
        release.wait(10)
        return "poller"

    with pytest.raises(NvmlHung):
        within(0.2, "late", slow, late.append)
    (gave_up,) = [g for g in given_up() if g.what == "late"]
    release.set()
    gave_up.thread.join(5)
    assert late == ["poller"]
    assert within(5, "in time", lambda: "poller", late.append) == "poller"
    assert late == ["poller"]
