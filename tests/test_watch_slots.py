"""The stack sampler's slots as the report tells them: a process on the GPU that found every
slot taken was said to have no Python stacks, and the report still said so after a slot freed
up and it was recorded. py-spy is faked (a recorder that records its process until it ends or
is stopped, one stretch each) on a scripted /proc (a process runs while its folder is there)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from sparkdiag.sources.host import pyspy
from sparkdiag.watch import stack_sampler

MAX = stack_sampler.MAX_PROCESSES


class _Clock:
    """The sampler's clock, moved by hand: one tick is one second."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Job:
    """A scripted /proc and a fake py-spy: :meth:`tick` is one of ``Sampler.tick``'s calls of
    the stack sampler, ``said`` every line it returned, as ``sparkdiag watch`` gathers them."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = tmp_path / "rootfs"
        (self.root / "proc").mkdir(parents=True)
        self.clock = _Clock()
        self.start = self.clock()  # the recording's time 0
        self.said: list[str] = []
        self.unreadable: set[int] = set()  # py-spy cannot read these
        job = self

        class Recorder:
            def __init__(self, binary: Path, pid: int, *args: Any) -> None:
                self.pid, self.stopped = pid, False
                self.origin, self.since, self.stopped_at = job.clock(), None, None

            def start(self) -> None:
                pass

            def running(self) -> bool:
                return not self.stopped and (job.root / "proc" / str(self.pid)).is_dir()

            def stop(self) -> None:
                self.stopped = True

            def collect(self) -> list[pyspy.Segment]:
                if self.pid in job.unreadable:
                    raise pyspy.StackError("Permission denied (os error 13)")
                frames = (pyspy.Frame("<module>", f"/job/{self.pid}.py", 1),)
                return [pyspy.Segment(self.origin, job.clock(), self.pid, self.pid, "MainThread",
                                      frames)]  # fmt: skip

        monkeypatch.setattr(pyspy, "Recorder", Recorder)
        self.sampler = stack_sampler.StackSampler(tmp_path / "py-spy", self.root, clock=self.clock)

    def run(self, name: str, *pids: int, started: int = 1000) -> None:
        """Processes ``pids`` named ``name``, started at ``started`` clock ticks after boot
        (their /proc/PID/stat's field 22: what tells a process from a later one of its pid)."""
        for pid in pids:
            (self.root / "proc" / str(pid)).mkdir()
            (self.root / "proc" / str(pid) / "comm").write_text(name + "\n")
            rest = " ".join(["0"] * 18 + [str(started)] + ["0"] * 30)
            (self.root / "proc" / str(pid) / "stat").write_text(f"{pid} ({name}) S {rest}\n")

    def end(self, *pids: int) -> None:
        for pid in pids:
            shutil.rmtree(self.root / "proc" / str(pid))

    def tick(self, gpu: set[int]) -> None:
        self.clock.now += 1.0
        tree = sorted(int(p.name) for p in (self.root / "proc").iterdir())
        chosen = stack_sampler.targets(self.root, tree, gpu, limit=None)
        self.said += self.sampler.update(chosen, gpu)

    def report(self) -> list[str]:
        """The lines ``sparkdiag watch`` puts in the report's ``skipped`` (commands/watch.py)."""
        return self.sampler.settled([*self.said, *self.sampler.finish()], self.start)

    def recorded(self) -> set[int]:
        return {s.pid for s in self.sampler.segments}


NO_SLOT = (
    "no Python stacks of pid{s} {which}, on the GPU: watch records at most 8 processes at a "
    "time, and the job's other processes on the GPU held them (until one ends); its lost time "
    "is judged from the counters and the others' stacks"
)


def _late(pid: int, seconds: str) -> str:
    return (
        f"Python stacks of pid {pid} (python3), on the GPU, only from {seconds} s on: until "
        "then the job's other processes on the GPU held watch's 8 slots; its lost time before "
        "is judged from the counters and the others' stacks"
    )


def test_a_process_on_the_gpu_that_gets_a_slot_later_is_not_said_unsampled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nine ranks on the GPU: the ninth finds every slot taken and is said at once; rank 0
    ends, and at 3 s the ninth takes its slot and is recorded from then on. The report said
    "no Python stacks of pid 48" to the end; now it says from when it has them."""
    job = _Job(tmp_path, monkeypatch)
    ranks = list(range(40, 49))
    job.run("python3", *ranks)
    job.tick(set(ranks))
    assert job.said == [NO_SLOT.format(s="", which="48 (python3)")]  # said while true
    assert 48 not in job.sampler.targets
    job.tick(set(ranks))
    job.end(40)
    job.tick(set(ranks[1:]))  # rank 0's slot is taken (its recorder read later)
    assert 48 in job.sampler.targets
    job.tick(set(ranks[1:]))
    report = job.report()
    assert 48 in job.recorded()
    assert report == [_late(48, "3.0")]


def test_the_note_keeps_only_the_processes_that_never_had_a_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten ranks on the GPU, two said in one line; one slot frees up: the line names the one
    left out to the end, and the other is said to have stacks from then on."""
    job = _Job(tmp_path, monkeypatch)
    ranks = list(range(40, 50))
    job.run("python3", *ranks)
    job.tick(set(ranks))
    assert job.said == [NO_SLOT.format(s="s", which="48 (python3), 49 (python3)")]
    job.end(41)
    job.tick(set(ranks) - {41})  # 48 takes rank 41's slot; 49 is not said again
    job.tick(set(ranks) - {41})
    assert len(job.said) == 1
    report = job.report()
    assert report == [NO_SLOT.format(s="", which="49 (python3)"), _late(48, "2.0")]
    assert 48 in job.recorded() and 49 not in job.recorded()


def test_a_process_that_never_gets_a_slot_is_said_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _Job(tmp_path, monkeypatch)
    ranks = list(range(40, 49))
    job.run("python3", *ranks)
    for _ in range(3):
        job.tick(set(ranks))
    assert job.report() == [NO_SLOT.format(s="", which="48 (python3)")]
    assert job.said == job.report()  # said once, and still true at the end


def test_a_process_that_got_a_slot_but_gave_no_stacks_is_said_once_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ninth rank has a slot from 2 s on, but py-spy cannot read it: the report says why
    it has no stacks, neither that no slot was left nor that it has stacks from then on."""
    job = _Job(tmp_path, monkeypatch)
    ranks = list(range(40, 49))
    job.run("python3", *ranks)
    job.unreadable.add(48)
    job.tick(set(ranks))
    job.end(40)
    job.tick(set(ranks[1:]))
    assert 48 in job.sampler.targets
    job.tick(set(ranks[1:]))
    assert job.report() == [
        "no Python stacks of pid 48 (python3): Permission denied (os error 13); its lost time "
        "is judged from the counters alone"
    ]


def test_other_lines_pass_through_in_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _Job(tmp_path, monkeypatch)
    assert job.sampler.settled(["a", "b"], job.start) == ["a", "b"]


def test_a_process_with_a_slot_later_and_nothing_recorded_stays_in_the_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ninth rank gets a slot once rank 0 ends, but py-spy gives nothing for it and says no
    error (an empty trace; the process ended as its recorder began): it has no stacks in the
    report, and the note keeps saying so (a review found it said nowhere)."""
    job = _Job(tmp_path, monkeypatch)
    recorder = pyspy.Recorder

    class Empty(recorder):  # type: ignore[misc,valid-type]
        def collect(self) -> list[pyspy.Segment]:
            return [] if self.pid == 48 else list(super().collect())

    monkeypatch.setattr(pyspy, "Recorder", Empty)
    ranks = list(range(40, 49))
    job.run("python3", *ranks)
    job.tick(set(ranks))
    job.end(40)
    job.tick(set(ranks[1:]))
    assert 48 in job.sampler.targets
    job.end(48)
    job.tick(set(ranks[1:-1]))
    job.tick(set(ranks[1:-1]))
    assert job.report() == [NO_SLOT.format(s="", which="48 (python3)")]
    assert 48 not in job.recorded()


def test_a_later_process_given_the_same_pid_is_not_taken_for_the_one_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ninth rank is said without a slot and ends unrecorded; a new process is given its
    pid and a slot, and is recorded: the report keeps the note of the first (its start time
    differs), and says no "stacks from" of a process it never recorded."""
    job = _Job(tmp_path, monkeypatch)
    ranks = list(range(40, 49))
    job.run("python3", *ranks)
    job.tick(set(ranks))
    job.end(48)
    job.tick(set(ranks[:-1]))
    job.end(40)
    job.run("other", 48, started=5000)
    job.tick(set(ranks[1:]))
    job.tick(set(ranks[1:]))
    assert job.report() == [NO_SLOT.format(s="", which="48 (python3)")]
    assert 48 in job.recorded()  # the later process: recorded, and not said
