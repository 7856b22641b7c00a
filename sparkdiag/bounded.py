"""Work that may never return, waited for at most a deadline: :func:`call_within`.

Some calls take no timeout and cannot be cancelled: an NVML call held in a hung driver (ctypes
keeps its thread in the library, where Ctrl-C does not reach Python), ``getaddrinfo`` asking a
resolver that does not answer. Such work runs in a daemon thread of its own and the caller waits
for it at most a deadline; past it the thread is left running (:class:`Overran` carries it) and
what it returns later, if ever, can be handed to a ``late`` callback. The standard library only.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# The longest the waiting thread waits at once: a signal that another thread received is handled
# (by Python, in the main thread) when the wait ends
WAIT_SLICE = 0.1


class Overran(TimeoutError):
    """The work named ``name`` did not return within ``seconds``; it goes on in ``thread``."""

    def __init__(self, name: str, seconds: float, thread: threading.Thread) -> None:
        super().__init__(f"{name} did not return within {seconds:g} s")
        self.name = name
        self.seconds = seconds
        self.thread = thread


def call_within(
    seconds: float,
    name: str,
    work: Callable[[], T],
    late: Callable[[T], None] | None = None,
) -> T:
    """``work()`` in a daemon thread named ``name``, waited for at most ``seconds``: what it
    returns, or what it raises. Past the deadline, :class:`Overran`; the thread is left to
    return by itself, if ever. What it returns after that goes to ``late``, in its thread (to
    release what it made); an answer in time, or one that came just as the time ran out, is
    returned instead, never both; so is an error raised in time, even where the thread had
    not quite ended at the deadline. The wait is in short slices (:data:`WAIT_SLICE`), so that
    Ctrl-C and SIGTERM interrupt it (the main thread's handler raises where it waits) even when
    the working thread received the signal; what the work returns after an interrupted wait
    goes to ``late`` too. A deadline that is not a finite number is a ValueError."""
    if not math.isfinite(seconds):
        raise ValueError(f"a deadline of {seconds!r} s: give a finite number of seconds")
    answer: list[T] = []
    failed: list[BaseException] = []
    lock = threading.Lock()
    gave_up = False

    def run() -> None:
        try:
            value = work()
        except BaseException as exc:  # passed to the waiting thread, which raises it
            with lock:
                failed.append(exc)
            return
        with lock:
            answer.append(value)
            abandoned = gave_up
        if abandoned and late is not None:
            late(value)

    def give_up() -> bool:
        """True where the work has not ended; from then on a late answer goes to ``late``."""
        nonlocal gave_up
        with lock:
            if not answer and not failed:  # else it ended just now: taken below
                gave_up = True
        return gave_up

    thread = threading.Thread(target=run, name=name, daemon=True)
    deadline = time.monotonic() + seconds
    thread.start()
    try:
        while thread.is_alive():
            left = deadline - time.monotonic()
            if left <= 0 and give_up():
                raise Overran(name, seconds, thread)
            thread.join(min(max(left, 0.0), WAIT_SLICE))
    except BaseException:  # also Ctrl-C or SIGTERM in the wait: a later answer is let go of
        give_up()  # (again, for an Overran: it changes nothing then)
        raise
    if failed:
        raise failed[0]
    return answer[0]
