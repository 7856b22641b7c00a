"""call_within: work run in a daemon thread and waited for at most a deadline (the NVML backend's
``within`` and httpget's name resolution both use it)."""

from __future__ import annotations

import queue
import signal
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

from sparkdiag import bounded
from sparkdiag.bounded import WAIT_SLICE, Overran, call_within


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """An event that the stuck work waits on: set at the end, so no thread outlives the test."""
    event = threading.Event()
    yield event
    event.set()


def test_the_value_is_returned_from_a_named_daemon_thread() -> None:
    seen: list[threading.Thread] = []

    def work() -> int:
        seen.append(threading.current_thread())
        return 42

    assert call_within(5, "the answer", work) == 42
    (thread,) = seen
    assert thread is not threading.main_thread()
    assert thread.name == "the answer" and thread.daemon


def test_what_the_work_raises_is_raised() -> None:
    failure = ValueError("no")

    def fails() -> None:
        raise failure

    with pytest.raises(ValueError) as caught:
        call_within(5, "fails", fails)
    assert caught.value is failure


def test_past_the_deadline_overran_while_the_work_goes_on(release: threading.Event) -> None:
    started = time.monotonic()
    with pytest.raises(Overran) as caught:
        call_within(0.3, "stuck", release.wait)
    took = time.monotonic() - started
    assert 0.3 <= took < 0.3 + 1.0, took
    overran = caught.value
    assert isinstance(overran, TimeoutError)
    assert (overran.name, overran.seconds) == ("stuck", 0.3)
    assert str(overran) == "stuck did not return within 0.3 s"
    assert overran.thread.name == "stuck" and overran.thread.daemon
    time.sleep(0.2)
    assert overran.thread.is_alive()  # left running: nothing can stop it
    release.set()
    overran.thread.join(5)
    assert not overran.thread.is_alive()


def test_a_late_answer_goes_to_late_once_and_an_answer_in_time_does_not() -> None:
    go = threading.Event()
    late: list[tuple[str, str]] = []

    def slow() -> str:
        go.wait(10)
        return "made late"

    def keep(value: str) -> None:
        late.append((value, threading.current_thread().name))

    with pytest.raises(Overran) as caught:
        call_within(0.2, "slow", slow, keep)
    assert late == []
    go.set()
    caught.value.thread.join(5)
    assert late == [("made late", "slow")]  # in the work's thread

    assert call_within(5, "quick", lambda: "in time", keep) == "in time"
    assert late == [("made late", "slow")]


def test_a_late_failure_is_dropped() -> None:
    go = threading.Event()
    late: list[object] = []

    def slow() -> str:
        go.wait(10)
        raise ValueError("after the deadline")

    with pytest.raises(Overran) as caught:
        call_within(0.1, "slow failure", slow, late.append)
    go.set()
    caught.value.thread.join(5)
    assert late == []


class _Lingering(threading.Thread):
    """A thread that stays alive for a while after its work answered: the waiting side finds the
    deadline past with the answer already given."""

    def run(self) -> None:
        super().run()
        time.sleep(0.3)


def test_an_answer_given_as_the_time_ran_out_is_returned_not_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = types.SimpleNamespace(Thread=_Lingering, Lock=threading.Lock)
    monkeypatch.setattr(bounded, "threading", fake)
    late: list[str] = []
    started = time.monotonic()
    assert call_within(0.05, "just now", lambda: "answer", late.append) == "answer"
    assert time.monotonic() - started >= 0.3  # it waited past the deadline for the thread
    assert late == []


def test_an_answer_at_the_deadline_is_either_returned_or_late_never_both() -> None:
    """The race the lock decides, run many times: each answer goes to exactly one of the two."""

    def answer() -> int:
        time.sleep(0.002)
        return 7

    returned = given_late = 0
    for _ in range(200):
        late: list[int] = []
        try:
            value = call_within(0.002, "racing", answer, late.append)
        except Overran as overran:
            overran.thread.join(5)
            assert late == [7]
            given_late += 1
        else:
            assert value == 7 and late == []
            returned += 1
    assert returned + given_late == 200


class _Interrupted(Exception):
    pass


def _raise(signum: int, frame: Any) -> None:
    raise _Interrupted(signum)


def test_a_signal_to_the_stuck_thread_interrupts_the_wait(release: threading.Event) -> None:
    """The signal goes to the working thread, not the waiting one: only the short slices of the
    wait let the main thread run its handler before the deadline (30 s here)."""
    idents: queue.Queue[int] = queue.Queue()

    def stuck() -> None:
        idents.put(threading.get_ident())
        release.wait()

    def send() -> None:
        signal.pthread_kill(idents.get(timeout=5), signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, _raise)
    sender = threading.Timer(0.2, send)
    try:
        started = time.monotonic()
        sender.start()
        with pytest.raises(_Interrupted):
            call_within(30, "stuck in C", stuck)
        took = time.monotonic() - started
    finally:
        sender.cancel()
        signal.signal(signal.SIGUSR1, previous)
    assert 0.2 <= took < 0.2 + 10 * WAIT_SLICE, took


def test_an_error_raised_in_time_is_raised_as_itself_not_as_an_overrun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The work failed at once but its thread lingered past the deadline: the error was lost
    and an Overran raised (through driver.within, "NVML hung" for NVML's own error; a
    review)."""
    fake = types.SimpleNamespace(Thread=_Lingering, Lock=threading.Lock)
    monkeypatch.setattr(bounded, "threading", fake)

    def fails() -> str:
        raise LookupError("the work's own error")

    with pytest.raises(LookupError, match="the work's own error"):
        call_within(0.05, "fails at once", fails)


def test_what_the_work_returns_after_an_interrupted_wait_goes_to_late(
    release: threading.Event,
) -> None:
    """Ctrl-C in the wait: the caller is gone, so what the work returns later is handed to
    ``late`` (to release it), as after a deadline; it was dropped with the thread."""
    late: list[str] = []

    def slow() -> str:
        release.wait()
        return "made after the interrupt"

    previous = signal.signal(signal.SIGUSR1, _raise)
    sender = threading.Timer(0.2, signal.pthread_kill, (threading.get_ident(), signal.SIGUSR1))
    try:
        sender.start()
        with pytest.raises(_Interrupted):
            call_within(30, "interrupted", slow, late.append)
    finally:
        sender.cancel()
        signal.signal(signal.SIGUSR1, previous)
    release.set()
    deadline = time.monotonic() + 5
    while not late and time.monotonic() < deadline:
        time.sleep(0.01)
    assert late == ["made after the interrupt"]


@pytest.mark.parametrize("seconds", [float("nan"), float("inf")])
def test_a_deadline_that_is_not_a_finite_number_is_refused(seconds: float) -> None:
    """join(nan) raised from inside the wait, after the thread had started (check
    --nvml-timeout nan was a traceback)."""
    with pytest.raises(ValueError, match="finite number"):
        call_within(seconds, "never started", lambda: "unreached")
