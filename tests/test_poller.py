"""The poller: numbering, immutable snapshots, PCIe cadence, failures, listeners, run()."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkdiag.snapshot import ExecutionContext, HostSample, PcieLink, Snapshot
from sparkdiag.sources.nvml.fixture import FixtureBackend
from sparkdiag.sources.nvml.gpu import GpuSource
from sparkdiag.telemetry.poller import Poller

NATIVE = ExecutionContext(context="native", runtime="none")
HOST = HostSample(memory_bytes={"total": 1e9, "available": 5e8})
LINK = PcieLink(
    address="0000:01:00.0",
    device_class="network",
    driver="mlx5_core",
    current_speed_tps=32e9,
    max_speed_tps=32e9,
    current_width=4,
    max_width=4,
)


class FakePcie:
    """A read_pcie that counts its calls and can be told to fail."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    def __call__(self) -> tuple[PcieLink, ...]:
        self.calls += 1
        if self.fail:
            raise OSError("sysfs went away")
        return (LINK,)


def _broken_host() -> HostSample:
    raise RuntimeError("psutil exploded")


@pytest.fixture
def make_poller(
    started_source: Callable[[str], GpuSource],
) -> Callable[..., Poller]:
    def make(fixture: str = "h200-idle", **kwargs: object) -> Poller:
        options: dict[str, object] = {
            "read_pcie": FakePcie(),
            "read_host": lambda: HOST,
            "context": NATIVE,
        }
        options.update(kwargs)
        return Poller(started_source(fixture), **options)  # type: ignore[arg-type]

    return make


def test_poll_numbers_increase(make_poller: Callable[..., Poller]) -> None:
    poller = make_poller()
    assert poller.latest is None
    snapshots = [poller.poll_once() for _ in range(3)]
    assert [s.poll for s in snapshots] == [1, 2, 3]
    assert poller.poll_count == 3
    assert poller.latest is snapshots[-1]
    assert len({id(s) for s in snapshots}) == 3


def test_snapshot_contents(make_poller: Callable[..., Poller]) -> None:
    clock_values = iter([1000.0, 1001.0])
    poller = make_poller(clock=lambda: next(clock_values), excluded_pids=lambda: frozenset({7}))
    snap = poller.poll_once()
    assert snap.timestamp == 1000.0
    assert snap.nvml_up is True
    assert snap.driver_version == "580.159.04"
    assert len(snap.gpus) == 1 and snap.gpus[0].temperature_celsius["gpu"] == 36.0
    assert snap.pcie_links == (LINK,)
    assert snap.host is HOST
    assert snap.context is NATIVE
    assert snap.excluded_pids == frozenset({7})
    assert set(snap.collectors) == {"nvml", "pcie", "host"}
    assert all(status.success for status in snap.collectors.values())
    assert all(status.error is None for status in snap.collectors.values())
    assert poller.poll_once().timestamp == 1001.0


def test_old_snapshot_unchanged_by_later_polls(make_poller: Callable[..., Poller]) -> None:
    poller = make_poller("h200-scripted")
    first = poller.poll_once()
    later = [poller.poll_once() for _ in range(7)]  # through the XID at 5 and the set at 6 and 8
    assert later[-1].poll == 8
    assert later[-1].xid.counts == {(0, 79): 1}
    assert later[-1].gpus[0].clock_event_reasons == 32
    # The first snapshot still says what poll 1 saw.
    assert first.poll == 1
    assert first.xid.counts == {}
    assert first.xid.last_timestamp == {}
    assert first.gpus[0].temperature_celsius == {"gpu": 36.0, "memory": 39.0}
    assert first.gpus[0].pcie_width == {"current": 16.0, "max": 16.0}
    assert first.gpus[0].clock_event_reasons == 1
    # The snapshot at poll 5 keeps its own count even after later XIDs would be added.
    assert later[3].poll == 5
    assert later[3].xid.counts == {(0, 79): 1}
    assert later[2].xid.counts == {}


def test_snapshot_cannot_be_mutated(make_poller: Callable[..., Poller]) -> None:
    snap = make_poller().poll_once()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.poll = 99  # type: ignore[misc]
    with pytest.raises(TypeError):
        snap.collectors["nvml"] = snap.collectors["host"]  # type: ignore[index]
    with pytest.raises(TypeError):
        snap.xid.counts[(0, 1)] = 1  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.gpus[0].up = False  # type: ignore[misc]


def test_xid_counted_with_timestamp(make_poller: Callable[..., Poller]) -> None:
    poller = make_poller("h200-scripted")
    start = time.time()
    for _ in range(6):
        snap = poller.poll_once()
    end = time.time()
    assert snap.xid.counts == {(0, 79): 1}
    assert set(snap.xid.last_timestamp) == {0}
    assert start <= snap.xid.last_timestamp[0] <= end


def test_lost_gpu_keeps_polling(make_poller: Callable[..., Poller]) -> None:
    poller = make_poller("h200-scripted")
    for _ in range(12):
        snap = poller.poll_once()
    assert snap.poll == 12
    assert snap.gpus[0].up is False
    assert snap.collectors["nvml"].success is True
    assert snap.nvml_up is True


def test_pcie_read_once_per_interval(make_poller: Callable[..., Poller]) -> None:
    pcie = FakePcie()
    poller = make_poller(read_pcie=pcie, pcie_interval=3600)
    snapshots = [poller.poll_once() for _ in range(5)]
    assert pcie.calls == 1
    assert all(s.pcie_links == (LINK,) for s in snapshots)
    assert all(s.collectors["pcie"].success for s in snapshots)


def test_pcie_read_every_poll_with_zero_interval(make_poller: Callable[..., Poller]) -> None:
    pcie = FakePcie()
    poller = make_poller(read_pcie=pcie, pcie_interval=0)
    for _ in range(4):
        poller.poll_once()
    assert pcie.calls == 4


def test_failing_pcie_read(make_poller: Callable[..., Poller]) -> None:
    poller = make_poller(read_pcie=FakePcie(fail=True))
    snap = poller.poll_once()
    pcie = snap.collectors["pcie"]
    assert pcie.success is False
    assert pcie.error is not None and "sysfs went away" in pcie.error
    assert snap.collectors["nvml"].success is True
    assert snap.collectors["host"].success is True
    assert snap.pcie_links == ()
    assert snap.gpus[0].up is True
    assert snap.poll == 1


def test_failing_host_read(make_poller: Callable[..., Poller]) -> None:
    poller = make_poller(read_host=_broken_host)
    snap = poller.poll_once()
    host = snap.collectors["host"]
    assert host.success is False
    assert host.error is not None and "psutil exploded" in host.error
    assert snap.host is None
    assert snap.collectors["nvml"].success is True
    assert snap.collectors["pcie"].success is True
    assert snap.gpus[0].temperature_celsius["gpu"] == 36.0
    assert poller.poll_once().poll == 2


def test_without_pcie_or_host_readers(make_poller: Callable[..., Poller]) -> None:
    snap = make_poller(read_pcie=None, read_host=None, context=None).poll_once()
    assert set(snap.collectors) == {"nvml"}
    assert snap.pcie_links == ()
    assert snap.host is None
    assert snap.context is None


def test_no_nvml_status(nvml_fixture: Callable[[str], Path]) -> None:
    source = GpuSource(FixtureBackend(nvml_fixture("no-nvml")))
    assert source.start() is False
    snap = Poller(source, read_pcie=FakePcie(), read_host=lambda: HOST, context=NATIVE).poll_once()
    assert snap.nvml_up is False
    assert snap.gpus == ()
    nvml = snap.collectors["nvml"]
    assert nvml.success is False
    assert nvml.error is not None and "LIBRARY_NOT_FOUND" in nvml.error
    assert snap.collectors["pcie"].success is True


class _ExplodingBackend(FixtureBackend):
    def advance(self) -> None:
        raise RuntimeError("backend bug")


def test_unexpected_nvml_exception_is_contained(nvml_fixture: Callable[[str], Path]) -> None:
    source = GpuSource(_ExplodingBackend(nvml_fixture("h200-idle")))
    assert source.start()
    poller = Poller(source, read_pcie=FakePcie(), read_host=lambda: HOST, context=NATIVE)
    snap = poller.poll_once()
    nvml = snap.collectors["nvml"]
    assert nvml.success is False
    assert nvml.error == "RuntimeError('backend bug')"
    assert snap.gpus == ()
    assert snap.collectors["pcie"].success is True
    assert snap.collectors["host"].success is True


def test_listeners_get_the_snapshot(make_poller: Callable[..., Poller]) -> None:
    poller = make_poller()
    seen: list[Snapshot] = []
    poller.add_listener(seen.append)
    first = poller.poll_once()
    second = poller.poll_once()
    assert seen == [first, second]
    assert seen[0] is first and seen[1] is second


def test_failing_listener_does_not_stop_polling(make_poller: Callable[..., Poller]) -> None:
    poller = make_poller()
    seen: list[int] = []

    def broken(snapshot: Snapshot) -> None:
        raise ValueError("listener bug")

    poller.add_listener(broken)
    poller.add_listener(lambda s: seen.append(s.poll))
    for _ in range(3):
        snap = poller.poll_once()
    assert seen == [1, 2, 3]
    assert poller.latest is snap
    assert snap.poll == 3


def test_run_stops_promptly(make_poller: Callable[..., Poller]) -> None:
    poller = make_poller(interval=0.01)
    stop = threading.Event()
    polls: list[int] = []

    def after_poll(snapshot: Snapshot) -> None:
        polls.append(snapshot.poll)
        if snapshot.poll == 3:
            stop.set()

    poller.add_listener(after_poll)
    thread = threading.Thread(target=poller.run, args=(stop,), daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(timeout=1.0)
    assert not thread.is_alive()
    assert time.monotonic() - started < 1.0
    assert polls == [1, 2, 3]
    assert poller.poll_count == 3


def test_run_wakes_from_a_long_interval(make_poller: Callable[..., Poller]) -> None:
    poller = make_poller(interval=60.0)
    stop = threading.Event()
    first_poll = threading.Event()
    poller.add_listener(lambda s: first_poll.set())
    thread = threading.Thread(target=poller.run, args=(stop,), daemon=True)
    thread.start()
    assert first_poll.wait(1.0)
    stop.set()
    thread.join(timeout=1.0)
    assert not thread.is_alive()
    assert poller.poll_count == 1


def test_run_with_stop_already_set_never_polls(make_poller: Callable[..., Poller]) -> None:
    poller = make_poller(interval=0.01)
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    poller.run(stop, initial_delay=30.0)
    assert time.monotonic() - started < 1.0
    assert poller.poll_count == 0
    assert poller.latest is None


def test_next_poll_keeps_to_the_grid_and_skips_ticks_after_an_overrun(
    make_poller: Callable[..., Poller],
) -> None:
    poller = make_poller(interval=1.0)
    assert poller.next_poll(100.0, 100.2) == 101.0
    assert poller.next_poll(100.0, 103.5) == 104.0  # overran: no burst of missed polls


def test_polls_nobody_will_scrape_are_spaced_out(make_poller: Callable[..., Poller]) -> None:
    window = [(math.inf, -math.inf)]  # nobody expected
    poller = make_poller(interval=1.0, idle_interval=5.0, pace=lambda step: window[0])
    assert poller.next_poll(100.0, 100.1) == 105.0
    window[0] = (102.5, 130.0)  # a scrape expected from 102.5 on: every tick from there
    assert poller.next_poll(100.0, 100.1) == 103.0
    assert poller.next_poll(103.0, 103.1) == 104.0
    window[0] = (-math.inf, math.inf)  # irregular scrapes: every tick
    assert poller.next_poll(100.0, 100.1) == 101.0
    window[0] = (90.0, 95.0)  # the scraper is gone
    assert poller.next_poll(100.0, 100.1) == 105.0
    poller.idle_interval = 4.5  # not a multiple: the last tick before it
    window[0] = (math.inf, -math.inf)
    assert poller.next_poll(100.0, 100.1) == 104.0
    poller.idle_interval = 0.5  # at or below the interval: no pacing
    assert poller.next_poll(100.0, 100.1) == 101.0
