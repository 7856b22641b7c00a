"""The GPU source: turns NVML answers (from any backend) into :class:`GpuSample` snapshots.

Rules it applies, so that every consumer sees the same thing:

* a value NVML does not support (NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND ...) is ``None``
  or absent from its mapping, and the query is not asked again for that device;
* a device that answers GPU_IS_LOST (or RESET_REQUIRED, GPU_NOT_FOUND, UNKNOWN) is reported with
  ``up=False`` and its identity kept, so ``sparkdiag_gpu_up`` drops to 0 instead of vanishing;
* NVML that answers a driver-wide error (``DRIVER_GONE_CODES``: UNINITIALIZED,
  DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH) while it runs is down as a whole: ``nvml_up``
  False with ``unavailable_reason`` saying what NVML answered and what to do, one warning, and
  no GPU sample (``sparkdiag_nvml_up`` 0: one page, SparkdiagNvmlDown, not one per GPU). It is
  started again at most every ``retry_seconds``; when it answers, the GPUs are read again;
* unified memory (GB10): memory info NOT_SUPPORTED, or a total equal to host MemTotal, gives
  ``memory_model="unified"`` and no framebuffer memory; the integrated GPU's NVML PCIe link (a
  meaningless Gen1 x1) is left out too, the host links come from sysfs;
* a memory temperature of 0 °C is "not supported" (DCGM reads 0 on GB10's LPDDR5X).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkdiag.snapshot import GpuIdentity, GpuProcess, GpuSample, NvlinkSample
from sparkdiag.sources.nvml.activity import (
    ProcessOptions,
    read_gpm,
    read_nvlinks,
    read_processes,
)
from sparkdiag.sources.nvml.api import (
    DRIVER_GONE_CODES,
    DRIVER_NOT_LOADED,
    LIB_RM_VERSION_MISMATCH,
    LOST_CODES,
    NOT_SUPPORTED,
    UNAVAILABLE_CODES,
    UNINITIALIZED,
    NvmlBackend,
    NvmlCallError,
    NvmlEvent,
    NvmlUnavailable,
    error_text,
)
from sparkdiag.sources.nvml.queries import CATALOGUE, sample_fields

log = logging.getLogger(__name__)

# Decoded clock event (throttle) reasons, nvml.h nvmlClocksEventReason*.
CLOCK_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
# Named sets of those reasons, so that every consumer means the same thing:
# - unhealthy: heat, a hardware slowdown or the power brake hold the GPU down. A probe that saw
#   one is not a healthy run (it never teaches a baseline), and check fails on it.
UNHEALTHY_REASONS = frozenset(
    {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)
# - thermal: heat alone (the thermal-int4 alert and the soak's stop rule look at these).
THERMAL_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
# - throttling: what lowers clocks under load, the power cap included (normal at the limit, but a
#   side of a comparison that saw it while the other did not ran slower for it).
THROTTLE_REASONS = UNHEALTHY_REASONS | {"sw_power_cap"}
# Host MemTotal and NVML's total are taken as the same memory when within this fraction.
UNIFIED_TOLERANCE = 0.02


def decode_reasons(mask: int) -> list[str]:
    """Names of the reasons set in an NVML clock event reasons bitmask."""
    return [name for name, bit in CLOCK_EVENT_REASONS.items() if mask & bit]


def reasons_mask(names: frozenset[str] | set[str]) -> int:
    """The NVML bitmask of named reasons (the inverse of :func:`decode_reasons`)."""
    return sum(CLOCK_EVENT_REASONS[name] for name in names)


class DeviceLost(Exception):
    def __init__(self, error: NvmlCallError) -> None:
        super().__init__(str(error))
        self.error = error


class _NvmlGone(Exception):
    """NVML answered a driver-wide error (``DRIVER_GONE_CODES``): nothing answers any more."""

    def __init__(self, error: NvmlCallError) -> None:
        super().__init__(str(error))
        self.error = error


# How old a cached answer of each tier may be, in seconds, whatever the poll interval.
STATIC_SECONDS = 60.0
SLOW_SECONDS = 10.0
# How often NVML is started again while the driver is gone (a failing nvmlInit per attempt).
RETRY_SECONDS = 30.0


def not_started_reason(code: int, detail: str, retry_seconds: float | None) -> str:
    """nvmlInit's driver-wide answer (``DRIVER_GONE_CODES``) to a process it never answered (one
    started before the kernel module was loaded, as at boot), and what to do; with
    ``retry_seconds`` (a read started it again) that sparkdiag keeps trying."""
    answer = error_text(code)
    again = ""
    if retry_seconds is not None:
        again = f"; sparkdiag starts NVML again every {retry_seconds:g} s"
    if code == DRIVER_NOT_LOADED:
        return (
            f"nvmlInit answers {answer}: the NVIDIA kernel module is not loaded (yet: at boot "
            "nvidia-persistenced or the first nvidia-smi loads it); load it (nvidia-smi, "
            f"modprobe nvidia){again}"
        )
    if code == LIB_RM_VERSION_MISMATCH:
        return (
            f"nvmlInit answers {answer}: the NVML library does not match the loaded kernel "
            f"module (a driver upgraded without a reboot); reboot the node{again}"
        )
    return f"nvmlInit answers {answer} ({detail}){again}"


def gone_reason(code: int | None, detail: str, retry_seconds: float) -> str:
    """What NVML answered when it went away under the running daemon (``code``, or where it
    gave none ``detail``), and what to do: the ``unavailable_reason`` (the nvml collector's
    error, check's nvml row, the log)."""
    again = f"sparkdiag starts NVML again every {retry_seconds:g} s"
    if code is None:
        return f"NVML does not start again ({detail}); {again}"
    answer = error_text(code)
    if code == LIB_RM_VERSION_MISMATCH:
        return (
            f"NVML answers {answer}: the NVIDIA driver was changed (upgraded) under this running "
            "sparkdiag, whose loaded NVML library no longer matches the kernel module; restart "
            "sparkdiag (a running process cannot load the new library), and reboot the node if "
            "nvidia-smi fails too"
        )
    if code == DRIVER_NOT_LOADED:
        return (
            f"NVML answers {answer}: the NVIDIA kernel module is gone (unloaded, or crashed: "
            "look for NVRM lines in dmesg); load the driver again (nvidia-smi, modprobe nvidia) "
            f"or reboot the node; {again}"
        )
    if code == UNINITIALIZED:
        return (
            f"NVML answers {answer}: NVML was shut down under this sparkdiag; {again}, and "
            "restart sparkdiag if this lasts"
        )
    return f"NVML does not start again: it answers {answer} ({detail}); {again}"


@dataclass(eq=False)
class GpuSource:
    """Reads every GPU through an :class:`NvmlBackend`. Not thread-safe: one poller owns it.

    Each query's tier is in its declaration (``sources/nvml/queries.py``): static ones
    (thresholds, maximum clocks, supported reasons, PCIe maxima, modes) are asked again once their
    last answer is ``static_seconds`` old, slow ones (ECC, row remapping, replay and violation
    counters, energy, PCIe throughput, per-process utilization, NVLink) once it is
    ``slow_seconds`` old, the rest on every read; in between the last answer is reused. Ages are
    measured at the start of each read with ``clock`` (monotonic seconds), so the tiers follow
    time, not the number of polls.

    ``processes``: per-process metrics (opt-in); None leaves them out.

    ``retry_seconds``: while NVML is gone (a driver-wide error while it ran), how often a read
    starts it again. While NVML answers, a read makes no call beyond its queries.
    """

    backend: NvmlBackend
    static_seconds: float = STATIC_SECONDS
    slow_seconds: float = SLOW_SECONDS
    clock: Callable[[], float] = time.monotonic
    processes: ProcessOptions | None = None
    retry_seconds: float = RETRY_SECONDS
    # what start() and the reads learn and keep
    nvml_up: bool = field(init=False, default=False)
    unavailable_reason: str | None = field(init=False, default=None)
    driver_version: str = field(init=False, default="")
    identities: list[GpuIdentity] = field(init=False, default_factory=list)
    # while NVML is gone under the running daemon: the code it last answered (None: not gone),
    # and when it is started again
    _gone: int | None = field(init=False, default=None)
    _retry_at: float = field(init=False, default=0.0)
    _said_unseen: bool = field(init=False, default=False)
    _was_up: bool = field(init=False, default=False)  # NVML has answered this process once
    _max_age: dict[str, float] = field(init=False, default_factory=dict)
    _read_at: float = field(init=False, default=0.0)
    _cache: dict[tuple[int, str, int | None], tuple[float, Any]] = field(
        init=False, default_factory=dict
    )
    _unsupported: set[tuple[int, str, int | None]] = field(init=False, default_factory=set)
    # NVLinks per device, rebuilt when the slow tier is due (126 queries per GPU)
    _nvlinks: dict[int, tuple[float, tuple[NvlinkSample, ...]]] = field(
        init=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        # Queries whose answers change rarely or never are asked less often than every poll, to
        # keep the daemon's cost down (each NVML call is 5-100 µs; a poll of one H200 asks ~45
        # of them); each query's tier is in its declaration (sources/nvml/queries.py).
        self._max_age = {"poll": 0.0, "slow": self.slow_seconds, "static": self.static_seconds}

    def start(self) -> bool:
        """Initialise NVML and read each GPU's identity; False (with a reason) without NVML.
        When nvmlInit answers a driver-wide error (``DRIVER_GONE_CODES``: the kernel module
        not loaded yet, as when the daemon starts first at boot) :attr:`waiting` is True and
        :meth:`read` starts NVML again every ``retry_seconds``, as after NVML went away."""
        self._read_at = self.clock()
        try:
            self._open()
        except (NvmlUnavailable, NvmlCallError) as exc:
            self.nvml_up = False
            self.unavailable_reason = str(exc)
            if exc.code in DRIVER_GONE_CODES:
                self._gone = exc.code
                self._retry_at = self._read_at + self.retry_seconds
                self.unavailable_reason = not_started_reason(exc.code, str(exc), None)
            return False
        except _NvmlGone as gone:  # nvmlInit answered, the devices no longer do
            self._went_away(gone.error)
            return False
        return True

    def _open(self) -> None:
        """nvmlInit, the driver version and each GPU's identity (nvml_up once they are in);
        raises what NVML answered instead."""
        self.backend.init()
        self.driver_version = self.backend.driver_version()
        count = self.backend.device_count()
        self.identities = [self._identity(index) for index in range(count)]
        self.nvml_up = True
        self._was_up = True

    def give_up(self, why: str) -> None:
        """Start NVML no more while it waits after a failed start: there is nothing for it to
        find (``why``: no NVIDIA GPU on the PCI bus, where the driver's packages are installed
        without a GPU); the reason says so instead of advising to load the module."""
        if self._gone is None:
            return
        self.unavailable_reason = f"nvmlInit answers {error_text(self._gone)} and {why}"
        self._gone = None

    @property
    def waiting(self) -> bool:
        """NVML is down with a driver-wide error and is started again every ``retry_seconds``."""
        return self._gone is not None

    def stop(self) -> None:
        if self.nvml_up or self._gone is not None:
            self.backend.shutdown()
            self.nvml_up = False
            self._gone = None

    def _forget(self) -> None:
        """Drop every answer kept from an NVML session that ended."""
        self._cache.clear()
        self._unsupported.clear()
        self._nvlinks.clear()

    def _went_away(self, error: NvmlCallError) -> None:
        """NVML answered a driver-wide error while it ran: down as a whole, said once."""
        self.nvml_up = False
        self._gone = error.code
        self._retry_at = self.clock() + self.retry_seconds
        self._forget()
        self.unavailable_reason = gone_reason(error.code, str(error), self.retry_seconds)
        log.warning("NVML stopped answering, GPU telemetry stopped: %s", self.unavailable_reason)

    def _start_again(self) -> bool:
        """While NVML is gone, start it again when ``retry_seconds`` have passed since the last
        attempt; True once it answers (the GPUs read again)."""
        now = self.clock()
        if now < self._retry_at:
            return False
        self._retry_at = now + self.retry_seconds
        self.backend.shutdown()  # what is left of the old session: handles, the event set
        self._read_at = now
        was_up = self._was_up
        try:
            self._open()
        except (NvmlUnavailable, NvmlCallError, _NvmlGone) as exc:
            self.nvml_up = False
            error = exc.error if isinstance(exc, _NvmlGone) else exc
            if was_up or error.code is None:
                reason = gone_reason(error.code, str(error), self.retry_seconds)
            else:
                reason = not_started_reason(error.code, str(error), self.retry_seconds)
            if error.code != self._gone:  # what NVML answers changed (a new module loaded ...)
                log.warning("NVML still does not answer: %s", reason)
            else:
                log.debug("NVML still does not answer: %s", reason)
            self._gone = self._gone if error.code is None else error.code
            self.unavailable_reason = reason
            self._forget()
            return False
        self._gone = None
        self.unavailable_reason = None
        log.info(
            "NVML answers %s(driver %s, %d GPU(s)): GPU telemetry %s",
            "again " if was_up else "",
            self.driver_version,
            len(self.identities),
            "resumed" if was_up else "started",
        )
        return True

    # -- reading -----------------------------------------------------------------------------
    def ask(self, index: int, query: str, arg: int | None = None) -> Any:
        """One catalogue query of one device, through the tiers and the unsupported memory:
        None when unsupported; raises :class:`DeviceLost` when the GPU is gone. For readers
        that need less than a full :meth:`read` (``sparkdiag watch``); call :meth:`begin`
        first at each sampling instant, so that the tiers age. NVML gone as a whole
        (``DRIVER_GONE_CODES``) is :class:`DeviceLost` here too."""
        try:
            return self._ask(index, query, arg)
        except _NvmlGone as gone:
            raise DeviceLost(gone.error) from None

    def begin(self) -> None:
        """Start a sampling instant: the tiers measure ages from now."""
        self._read_at = self.clock()

    def _ask(self, index: int, query: str, arg: int | None = None) -> Any:
        """One query: None when unsupported (remembered); DeviceLost when the GPU is gone."""
        key = (index, query, arg)
        if key in self._unsupported:
            return None
        max_age = self._max_age[CATALOGUE[query].tier]
        cached = self._cache.get(key)
        if cached is not None and self._read_at - cached[0] < max_age:
            return cached[1]
        value = self._ask_now(index, query, arg)
        if max_age > 0:
            self._cache[key] = (self._read_at, value)
        return value

    def _ask_now(self, index: int, query: str, arg: int | None) -> Any:
        key = (index, query, arg)
        try:
            return self.backend.query(index, query, arg)
        except NvmlCallError as exc:
            if exc.code in LOST_CODES:
                raise DeviceLost(exc) from None
            if exc.code in DRIVER_GONE_CODES:
                raise _NvmlGone(exc) from None
            if exc.code in UNAVAILABLE_CODES:
                self._unsupported.add(key)
            else:
                log.debug("GPU %d %s(%s): %s", index, query, arg, exc)
            return None

    def _identity(self, index: int) -> GpuIdentity:
        def text(query: str) -> str:
            try:
                value = self._ask(index, query)
            except DeviceLost:
                return ""
            return "" if value is None else str(value)

        capability = ""
        try:
            cap = self._ask(index, "cuda_capability")
            if cap is not None:
                capability = f"{int(cap[0])}.{int(cap[1])}"
        except DeviceLost:
            pass
        return GpuIdentity(
            index=index,
            uuid=text("uuid"),
            name=text("name"),
            pci_bus_id=text("pci_bus_id"),
            driver_version=self.driver_version,
            cuda_capability=capability,
            memory_model=self._memory_model(index),
        )

    def _memory_model(self, index: int) -> str:
        try:
            info = self.backend.query(index, "memory_info")
        except NvmlCallError as exc:
            if exc.code in DRIVER_GONE_CODES:
                raise _NvmlGone(exc) from None
            return "unified" if exc.code == NOT_SUPPORTED else "dedicated"
        host_total = self.backend.host_memory_total()
        total = float(info.get("total", 0))
        if host_total and abs(total - host_total) <= UNIFIED_TOLERANCE * host_total:
            return "unified"
        return "dedicated"

    def read(self) -> tuple[GpuSample, ...]:
        """One poll of every GPU. Never raises for a device error: a lost device is ``up=False``.
        NVML gone as a whole gives no sample and ``nvml_up`` False (started again at most every
        ``retry_seconds``, then read at once)."""
        if not self.nvml_up and (self._gone is None or not self._start_again()):
            return ()
        self._read_at = self.clock()
        try:
            if not self.identities:  # no query to fail: ask NVML something, so that it is seen go
                self._alive()
            return tuple(self._read_device(identity) for identity in self.identities)
        except _NvmlGone as gone:
            self._went_away(gone.error)
            return ()

    def _alive(self) -> None:
        """One call (the device count) that raises ``_NvmlGone`` where NVML answers a
        driver-wide error: a source with no GPU made no call, and never saw the driver go."""
        try:
            self.backend.device_count()
        except NvmlCallError as exc:
            if exc.code in DRIVER_GONE_CODES:
                raise _NvmlGone(exc) from None

    def events(self) -> list[NvmlEvent]:
        if not self.nvml_up:
            return []
        try:
            return self.backend.poll_events()
        except NvmlCallError as exc:
            log.debug("NVML events: %s", exc)
            return []

    def _links(self, index: int, ask: Callable[..., Any]) -> tuple[NvlinkSample, ...]:
        """The device's NVLinks, read again only when the slow tier is due: their 126 queries
        are all slow ones, so in between the last answers would be assembled again for
        nothing."""
        cached = self._nvlinks.get(index)
        if cached is not None and self._read_at - cached[0] < self.slow_seconds:
            return cached[1]
        links = read_nvlinks(ask)
        self._nvlinks[index] = (self._read_at, links)
        return links

    def _read_device(self, identity: GpuIdentity) -> GpuSample:
        try:
            return self._sample(identity)
        except DeviceLost as lost:
            return GpuSample(identity=identity, up=False, error=str(lost.error))

    def _sample(self, identity: GpuIdentity) -> GpuSample:
        i = identity.index
        ask: Callable[..., Any] = lambda query, arg=None: self._ask(i, query, arg)  # noqa: E731

        # A lost GPU fails at its first query (DeviceLost) and costs that one call per poll; its
        # uuid, read at start, is not asked again (an answer no collector would read).
        dedicated = identity.memory_model == "dedicated"
        gpm = read_gpm(ask)
        # PCIe traffic from GPM where it has it (Hopper and later): the whole interval's average
        # instead of one 20 ms window every 10 s, and no poll held 20 ms a direction by NVML's
        # own query (on the H200: 0.9 ms of CPU a call, 53 of py-spy's 152 samples of the idle
        # daemon's working threads in 120 s)
        pcie = gpm.pcie if dedicated else {}
        declared = sample_fields(
            ask, dedicated=dedicated, skip=frozenset({"pcie_throughput"}) if pcie else frozenset()
        )
        if pcie:
            declared["pcie_throughput_bytes_per_second"] = pcie
        procs = ask("compute_processes")
        processes: tuple[GpuProcess, ...] | None = None
        unseen: int | None = None
        if self.processes is not None and procs is not None:
            processes, unseen = read_processes(ask, procs, self.processes)
            if unseen and not self._said_unseen:
                self._said_unseen = True
                log.warning(
                    "GPU %d: NVML lists %d compute process(es) that /proc here does not show: "
                    "this sparkdiag runs in another PID namespace, so they are exported without "
                    "name, user or container (run its container with the host's PID namespace, "
                    "e.g. docker run --pid=host); see sparkdiag_gpu_compute_processes_unseen",
                    i,
                    unseen,
                )
        return GpuSample(
            identity=identity,
            up=True,
            compute_pids=None if procs is None else tuple(int(p["pid"]) for p in procs),
            activity_ratio=gpm.activity,
            sm_occupancy_ratio=gpm.occupancy,
            nvlinks=self._links(i, ask),
            processes=processes,
            processes_unseen=unseen,
            **declared,
        )
