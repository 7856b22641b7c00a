"""The real NVML backend: the only module that imports ``pynvml`` (the nvidia-ml-py package).

It answers the query catalogue (:data:`sparkdiag.sources.nvml.queries.CATALOGUE`, where each
query declares its pynvml call) with plain values, translating ``pynvml.NVMLError`` into
:class:`NvmlCallError`. Versioned functions are looked up once, at :meth:`PynvmlBackend.init`,
and the answer is cached (:class:`sparkdiag.sources.nvml.calls.NvmlCalls`).

An NVML call can hang (a driver stuck in the kernel: ``nvmlInit`` that never returns), and one
that does cannot be cancelled, nor interrupted: ctypes holds the calling thread in the library,
where Ctrl-C does not reach Python. :func:`within` waits for such work at most a deadline
(``check``'s start and first poll, through :func:`sparkdiag.bounded.call_within`); past it the
call is listed in :func:`given_up` and :class:`NvmlHung` says so. The daemon bounds none
of its NVML calls: systemd does (READY=1 after the first poll, WATCHDOG=1 from each poll; a hung
one misses them, and the unit is restarted), and /healthz ages the polls.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sparkdiag.bounded import Overran, call_within
from sparkdiag.sources.host.meminfo import memory_total
from sparkdiag.sources.nvml.api import (
    ERROR_CODES,
    EVENT_XID_CRITICAL,
    NvmlCallError,
    NvmlEvent,
    NvmlUnavailable,
)
from sparkdiag.sources.nvml.calls import NvmlCalls
from sparkdiag.sources.nvml.queries import CATALOGUE

log = logging.getLogger(__name__)

_MAX_EVENTS_PER_POLL = 1024

T = TypeVar("T")

# How long a command waits for NVML to start and answer (check's --nvml-timeout): nvmlInit takes
# well under a second with persistence mode on, a few seconds per GPU without it
ANSWER_SECONDS = 30.0


def hung_reason(seconds: float) -> str:
    """What a command says of NVML that did not answer within ``seconds``."""
    return f"NVML did not answer in {seconds:g} s: the driver may be hung"


class NvmlHung(NvmlUnavailable):
    """NVML did not answer within a deadline (:func:`within`); the call goes on in its thread."""

    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(hung_reason(seconds))
        self.what = what
        self.seconds = seconds


@dataclass(frozen=True)
class GivenUp:
    """Work on NVML that :func:`within` stopped waiting for: what, after how long, its thread."""

    what: str
    seconds: float
    thread: threading.Thread

    @property
    def running(self) -> bool:
        """The call has not returned yet: the process cannot wait for its thread to end."""
        return self.thread.is_alive()


_GIVEN_UP: list[GivenUp] = []


def given_up() -> tuple[GivenUp, ...]:
    """Every call :func:`within` stopped waiting for in this process, oldest first."""
    return tuple(_GIVEN_UP)


def within(
    seconds: float,
    what: str,
    work: Callable[[], T],
    late: Callable[[T], None] | None = None,
) -> T:
    """``work()`` in a daemon thread (:func:`sparkdiag.bounded.call_within`), waited for at most
    ``seconds``: what it returns, or what it raises. Past the deadline, :class:`NvmlHung`
    (``what``: the work, for :func:`given_up`); the thread is left to return by itself, if
    ever: a call stuck in the driver cannot be stopped. What it returns after that goes to
    ``late``, in its thread (to release it: a poller built after the deadline was dropped with
    NVML initialised, found in a review). Ctrl-C and SIGTERM interrupt the wait (the main
    thread's handler raises where it waits) even when the stuck thread received the signal."""
    try:
        return call_within(seconds, f"nvml: {what}", work, late)
    except Overran as overran:
        _GIVEN_UP.append(GivenUp(what, seconds, overran.thread))
        log.debug("NVML: %s did not return within %g s", what, seconds)
        raise NvmlHung(what, seconds) from None


class Unanswered:
    """The backend of NVML given up on (:class:`NvmlHung`): it does not start, and says why. A
    command that still wants the host's readings builds its poller on it, since the real
    backend's thread may never return."""

    def __init__(self, why: NvmlHung) -> None:
        self.why = why

    def init(self) -> None:
        raise NvmlUnavailable(str(self.why))

    def shutdown(self) -> None:
        return None

    def driver_version(self) -> str:
        raise NvmlCallError(ERROR_CODES["UNINITIALIZED"])

    def device_count(self) -> int:
        raise NvmlCallError(ERROR_CODES["UNINITIALIZED"])

    def query(self, index: int, query: str, arg: int | None = None) -> Any:
        raise NvmlCallError(ERROR_CODES["UNINITIALIZED"])

    def poll_events(self) -> list[NvmlEvent]:
        return []

    def advance(self) -> None:
        return None

    def host_memory_total(self) -> int | None:
        return memory_total()


def _handle_key(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class PynvmlBackend:
    """NVML through nvidia-ml-py. Construct cheaply; :meth:`init` does the work."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._index_by_handle: dict[int, int] = {}
        self._event_set: Any = None
        self._calls: NvmlCalls | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            raise NvmlUnavailable(f"the pynvml module is not installed ({exc})") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {exc}", int(exc.value)) from exc
        except OSError as exc:  # pragma: no cover - ctypes load failure
            raise NvmlUnavailable(f"libnvidia-ml could not be loaded: {exc}") from exc
        self._nvml = pynvml
        self._calls = NvmlCalls(pynvml)
        self._open_event_set()

    def shutdown(self) -> None:
        """Free what this session holds and shut NVML down, each step whatever the one before
        answered: after the driver went away (the GPU source shuts down before it starts NVML
        again) freeing the event set fails, and a session left open would keep the next
        nvmlInit from starting a new one."""
        if self._nvml is None:
            return
        nv = self._nvml
        if self._calls is not None:
            self._calls.close()
            self._calls = None
        if self._event_set is not None:
            try:
                nv.nvmlEventSetFree(self._event_set)
            except nv.NVMLError as exc:
                log.debug("nvmlEventSetFree: %s", exc)
            self._event_set = None
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)
        self._nvml = None
        self._handles.clear()
        self._index_by_handle.clear()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise NvmlCallError(int(exc.value), str(exc)) from None

    # -- the catalogue -----------------------------------------------------------------------
    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._call(self._nvml.nvmlDeviceGetHandleByIndex, index)
            self._handles[index] = handle
            self._index_by_handle[_handle_key(handle)] = index
        return handle

    def driver_version(self) -> str:
        return str(self._call(self._nvml.nvmlSystemGetDriverVersion))

    def device_count(self) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetCount))

    def query(self, index: int, query: str, arg: int | None = None) -> Any:
        declared = CATALOGUE.get(query)
        if declared is None:
            raise KeyError(f"unknown NVML query {query!r}")
        assert self._calls is not None, "query before init"
        handle = self._handle(index)
        try:
            return declared.call(self._calls, handle, 0 if arg is None else arg)
        except self._nvml.NVMLError as exc:
            raise NvmlCallError(int(exc.value), str(exc)) from None

    # -- events ------------------------------------------------------------------------------
    def _open_event_set(self) -> None:
        """Register XID-critical events on every device that supports them.

        Reading them later (:meth:`poll_events`) uses ``nvmlEventSetWait(set, 0)``: it returns at
        once, so the poller never blocks on it.
        """
        nv = self._nvml
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.info("NVML events unavailable (%s): XID errors will not be counted", exc)
            return
        try:
            count = self.device_count()
        except NvmlCallError:
            return
        for index in range(count):
            try:
                handle = self._handle(index)
                supported = int(nv.nvmlDeviceGetSupportedEventTypes(handle))
                if supported & EVENT_XID_CRITICAL:
                    nv.nvmlDeviceRegisterEvents(handle, EVENT_XID_CRITICAL, self._event_set)
            except (nv.NVMLError, NvmlCallError) as exc:
                log.info("GPU %d: XID events not registered (%s)", index, exc)

    def poll_events(self) -> list[NvmlEvent]:
        if self._event_set is None or self._nvml is None:
            return []
        nv = self._nvml
        events: list[NvmlEvent] = []
        for _ in range(_MAX_EVENTS_PER_POLL):
            try:
                data = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError as exc:
                if int(exc.value) != ERROR_CODES["TIMEOUT"]:
                    log.debug("nvmlEventSetWait: %s", exc)
                break
            index = self._index_by_handle.get(_handle_key(data.device), -1)
            events.append(
                NvmlEvent(
                    gpu=index,
                    event_type=int(data.eventType),
                    data=int(data.eventData),
                    timestamp=time.time(),
                )
            )
        return events

    def advance(self) -> None:
        return None

    def host_memory_total(self) -> int | None:
        return memory_total()
