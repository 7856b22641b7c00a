"""NVML that goes away under the running daemon: a driver unloaded or crashed (DRIVER_NOT_LOADED),
upgraded under the process (LIB_RM_VERSION_MISMATCH) or NVML shut down under it (UNINITIALIZED).

The source is down as a whole (``sparkdiag_nvml_up`` 0, no GPU series: one page, SparkdiagNvmlDown,
not one per GPU), says so once, starts NVML again at a bounded rate and resumes when it answers.
The alert side is in ``prometheus/tests/gpu.yml`` (series shaped like this scrape)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparkdiag.exporter.registry import build_registry, render
from sparkdiag.snapshot import Snapshot
from sparkdiag.sources.host.sysfs import PcieSource
from sparkdiag.sources.nvml.api import DRIVER_GONE_CODES, ERROR_CODES, NvmlCallError
from sparkdiag.sources.nvml.fixture import FixtureBackend
from sparkdiag.sources.nvml.gpu import RETRY_SECONDS, DeviceLost, GpuSource
from sparkdiag.telemetry.poller import Poller
from tests.support import SYSFS, http_get, machine_args, running_daemon

H200_UUID = "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"
SOURCE_LOG = "sparkdiag.sources.nvml.gpu"
POLL_SECONDS = 5.0  # the fake clock's step between polls


class CallCounting(FixtureBackend):
    """A fixture backend that counts every call the GPU source makes, by method."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def init(self) -> None:
        self._count("init")
        super().init()

    def shutdown(self) -> None:
        self._count("shutdown")
        super().shutdown()

    def driver_version(self) -> str:
        self._count("driver_version")
        return super().driver_version()

    def device_count(self) -> int:
        self._count("device_count")
        return super().device_count()

    def query(self, index: int, query: str, arg: int | None = None) -> Any:
        self._count("query")
        return super().query(index, query, arg)


class Polled:
    """A poller over one fixture with a fake monotonic clock for the source, POLL_SECONDS a
    poll; with ``sysfs``, the host PCIe links and the GPUs on the bus of that tree too."""

    def __init__(self, path: Path, sysfs: Path | None = None) -> None:
        self.now = 1000.0
        self.backend = CallCounting(path)
        self.source = GpuSource(self.backend, clock=lambda: self.now)
        assert self.source.start()
        pcie = None if sysfs is None else PcieSource(sysfs)
        self.poller = Poller(
            self.source,
            read_pcie=None if pcie is None else pcie.read,
            read_host=None,
            context=None,
            pcie_interval=0.0,
            read_gpu_functions=None if pcie is None else pcie.gpu_functions,
        )

    def poll(self, count: int = 1) -> Snapshot:
        for _ in range(count):
            snapshot = self.poller.poll_once()
            self.now += POLL_SECONDS
        return snapshot

    def scrape(self) -> str:
        snapshot = self.poller.latest
        return render(build_registry(lambda: snapshot)).decode()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == SOURCE_LOG and r.levelno >= 30]


def _infos(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == SOURCE_LOG and r.levelno == 20]


def test_the_driver_gone_codes_are_the_driver_wide_ones() -> None:
    names = {name for name, code in ERROR_CODES.items() if code in DRIVER_GONE_CODES}
    assert names == {"UNINITIALIZED", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH"}


# ---- a driver upgraded under the daemon: LIB_RM_VERSION_MISMATCH, for good -------------------


def test_version_mismatch_takes_nvml_down_with_one_warning(
    nvml_fixture: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=SOURCE_LOG)
    polled = Polled(nvml_fixture("h200-driver-upgraded"))
    before = polled.poll(2)
    assert before.nvml_up is True and [g.up for g in before.gpus] == [True]
    assert _warnings(caplog) == []

    down = polled.poll()  # poll 3: every call answers 18
    assert down.nvml_up is False
    assert down.gpus == ()
    status = down.collectors["nvml"]
    assert status.success is False and status.error is not None
    assert "NVML_ERROR_LIB_RM_VERSION_MISMATCH (18)" in status.error
    assert "restart sparkdiag" in status.error
    assert polled.source.unavailable_reason == status.error

    for _ in range(60):  # five minutes of polls, ten attempts to start NVML again
        later = polled.poll()
        assert later.nvml_up is False and later.gpus == ()
        # a process cannot load the new library: the advice stays the same
        assert later.collectors["nvml"].error == status.error
    (warning,) = _warnings(caplog)
    assert "LIB_RM_VERSION_MISMATCH" in warning and "restart sparkdiag" in warning
    assert _infos(caplog) == []


def test_nvml_is_started_again_at_a_bounded_rate(nvml_fixture: Callable[[str], Path]) -> None:
    polled = Polled(nvml_fixture("h200-driver-upgraded"))
    polled.poll(3)
    polled.backend.calls.clear()
    polls = 120  # ten minutes at 5 s
    polled.poll(polls)
    attempts = polled.backend.calls.get("init", 0)
    assert attempts == pytest.approx(polls * POLL_SECONDS / RETRY_SECONDS, abs=1)
    # each attempt is one shutdown of what is left and one nvmlInit, nothing else
    assert polled.backend.calls == {"init": attempts, "shutdown": attempts}


def test_no_extra_call_while_nvml_answers(nvml_fixture: Callable[[str], Path]) -> None:
    """The idle daemon's cost is unchanged: a poll asks its queries, nothing about NVML."""
    polled = Polled(nvml_fixture("h200-driver-gone"))
    polled.poll()
    polled.backend.calls.clear()
    polled.poll()  # poll 2, NVML up
    assert set(polled.backend.calls) == {"query"}


def test_the_scrape_while_nvml_is_gone(nvml_fixture: Callable[[str], Path]) -> None:
    """sparkdiag_nvml_up 0, no series of any GPU (no gpu_up 1 with its values gone, no gpu_up
    0 either: SparkdiagGpuLost is one GPU's page), the GPUs on the bus still counted."""
    polled = Polled(nvml_fixture("h200-driver-upgraded"), SYSFS / "h200-vm")
    polled.poll(2)
    up = polled.scrape()
    assert "sparkdiag_nvml_up 1.0" in up
    assert f'sparkdiag_gpu_up{{gpu="0",uuid="{H200_UUID}"}} 1.0' in up
    polled.poll(5)
    text = polled.scrape()
    assert "sparkdiag_nvml_up 0.0" in text
    assert 'sparkdiag_collector_success{collector="nvml"} 0.0' in text
    assert "sparkdiag_gpu_pci_devices 1.0" in text
    assert H200_UUID not in text  # gpu_up, info, values, XID counters and incidents alike
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert not [line for line in samples if line.startswith("sparkdiag_gpu_up")]


# ---- a driver unloaded, then loaded again: DRIVER_NOT_LOADED, then answers --------------------


def test_driver_not_loaded_then_loaded_again(
    nvml_fixture: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=SOURCE_LOG)
    polled = Polled(nvml_fixture("h200-driver-gone"), SYSFS / "h200-vm")
    polled.poll(2)
    down = polled.poll()  # poll 3: the module is gone
    assert down.nvml_up is False and down.gpus == ()
    reason = down.collectors["nvml"].error
    assert reason is not None and "NVML_ERROR_DRIVER_NOT_LOADED (9)" in reason
    assert f"again every {RETRY_SECONDS:g} s" in reason
    assert "restart sparkdiag" not in reason
    assert "sparkdiag_nvml_up 0.0" in polled.scrape()

    # the module is back from poll 8; the source finds out at its next attempt, 30 s after the
    # last, not at once
    states = [polled.poll().nvml_up for _ in range(10)]  # polls 4..13
    first_up = states.index(True) + 4
    assert 8 <= first_up <= 8 + RETRY_SECONDS / POLL_SECONDS
    assert all(states[first_up - 4 :])
    back = polled.poller.latest
    assert back is not None and back.nvml_up is True
    (gpu,) = back.gpus
    assert gpu.up is True and gpu.identity.uuid == H200_UUID
    assert gpu.temperature_celsius == {"gpu": 36.0, "memory": 39.0}
    assert back.collectors["nvml"].success is True and back.collectors["nvml"].error is None
    assert polled.source.unavailable_reason is None
    text = polled.scrape()
    assert "sparkdiag_nvml_up 1.0" in text
    assert f'sparkdiag_gpu_up{{gpu="0",uuid="{H200_UUID}"}} 1.0' in text

    (warning,) = _warnings(caplog)
    assert "DRIVER_NOT_LOADED" in warning
    (info,) = _infos(caplog)
    assert "NVML answers again" in info and "1 GPU(s)" in info


def test_uninitialized_is_nvml_gone_too(derive_fixture: Callable[..., Path]) -> None:
    path = derive_fixture(
        "h200-idle",
        script=[{"poll": 2, "nvml": {"error": "UNINITIALIZED"}}, {"poll": 4, "nvml": "up"}],
    )
    polled = Polled(path)
    polled.poll()
    down = polled.poll()
    assert down.nvml_up is False and down.gpus == ()
    assert "NVML_ERROR_UNINITIALIZED (1)" in (down.collectors["nvml"].error or "")
    polled.poll(int(RETRY_SECONDS / POLL_SECONDS) + 2)
    assert polled.poll().nvml_up is True


def test_a_changed_answer_is_said_again(
    derive_fixture: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    """The module unloaded for an upgrade, then the new one loaded: the reason turns from
    'load the driver' into 'restart sparkdiag', and that is said (once more)."""
    caplog.set_level(logging.DEBUG, logger=SOURCE_LOG)
    path = derive_fixture(
        "h200-idle",
        script=[
            {"poll": 2, "nvml": {"error": "DRIVER_NOT_LOADED"}},
            {"poll": 3, "nvml": {"error": "LIB_RM_VERSION_MISMATCH"}},
        ],
    )
    polled = Polled(path)
    polled.poll(30)
    latest = polled.poller.latest
    assert latest is not None and "restart sparkdiag" in (latest.collectors["nvml"].error or "")
    first, second = _warnings(caplog)
    assert "DRIVER_NOT_LOADED" in first and "LIB_RM_VERSION_MISMATCH" in second


def test_a_lost_gpu_is_still_one_gpu(nvml_fixture: Callable[[str], Path]) -> None:
    """GPU_IS_LOST stays one device's: that GPU at up=False, NVML up."""
    polled = Polled(nvml_fixture("h200-scripted"))
    lost = polled.poll(12)
    assert lost.nvml_up is True and [g.up for g in lost.gpus] == [False]


def test_watch_sees_device_lost(nvml_fixture: Callable[[str], Path]) -> None:
    """GpuSource.ask (sparkdiag watch) raises the DeviceLost it already handles."""
    backend = FixtureBackend(nvml_fixture("h200-driver-upgraded"))
    source = GpuSource(backend)
    assert source.start()
    while backend.poll < 3:
        backend.advance()
    source.begin()
    with pytest.raises(DeviceLost) as info:
        source.ask(0, "utilization")
    assert isinstance(info.value.error, NvmlCallError) and info.value.error.code == 18


def test_stop_after_nvml_went_away_shuts_the_session_down(
    nvml_fixture: Callable[[str], Path],
) -> None:
    polled = Polled(nvml_fixture("h200-driver-upgraded"))
    polled.poll(3)
    polled.backend.calls.clear()
    polled.source.stop()
    assert polled.backend.calls == {"shutdown": 1}
    assert polled.source.read() == ()  # stopped: no attempt to start it again
    assert "init" not in polled.backend.calls


# ---- the daemon ------------------------------------------------------------------------------


def test_daemon_scrape_after_a_driver_upgrade(nvml_fixture: Callable[[str], Path]) -> None:
    """The running daemon on the fixture: from its third poll /metrics says NVML is down and
    shows no GPU up."""
    args = [
        "--nvml-fixture",
        str(nvml_fixture("h200-driver-upgraded")),
        *machine_args("h200-vm", "lent-vm"),
        "--no-probe.enabled",
        "--poll-interval",
        "0.05",
        "--idle-poll-interval",
        "0.05",
    ]
    with running_daemon(args) as base:
        for _ in range(200):
            _, _, body = http_get(base + "/metrics")
            if b"sparkdiag_nvml_up 0.0" in body:
                break
            time.sleep(0.05)
        text = body.decode()
    assert "sparkdiag_nvml_up 0.0" in text
    assert not [line for line in text.splitlines() if line.startswith("sparkdiag_gpu_up")]
    assert H200_UUID not in text


# ---- the driver not loaded yet when sparkdiag starts (as at boot) ------------------------------


def _started_before_the_driver(derive_fixture: Callable[..., Path], up_at: int = 4) -> Path:
    """h200-idle whose nvmlInit answers DRIVER_NOT_LOADED at start (poll 0), up from ``up_at``."""
    return derive_fixture(
        "h200-idle",
        script=[
            {"poll": 0, "nvml": {"error": "DRIVER_NOT_LOADED"}},
            {"poll": up_at, "nvml": "up"},
        ],
    )


def _polled_from_start(path: Path, polls: int) -> tuple[GpuSource, CallCounting, list[Snapshot]]:
    """A source that may fail to start, polled ``polls`` times on the fake clock."""
    now = [1000.0]
    backend = CallCounting(path)
    source = GpuSource(backend, clock=lambda: now[0])
    source.start()
    poller = Poller(source, read_pcie=None, read_host=None, context=None, pcie_interval=0.0)
    snapshots = []
    for _ in range(polls):
        snapshots.append(poller.poll_once())
        now[0] += POLL_SECONDS
    return source, backend, snapshots


def test_a_driver_loaded_after_start_is_found(
    derive_fixture: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon started before the kernel module (boot without nvidia-persistenced first):
    nvmlInit's DRIVER_NOT_LOADED was final, sparkdiag_nvml_up 0 until a restart. Now it is
    started again every RETRY_SECONDS, as after NVML went away, and the GPUs come in."""
    caplog.set_level(logging.DEBUG, logger=SOURCE_LOG)
    path = _started_before_the_driver(derive_fixture)
    backend = CallCounting(path)
    source = GpuSource(backend, clock=lambda: 1000.0)
    assert source.start() is False
    assert source.waiting and not source.nvml_up and source.identities == []
    reason = source.unavailable_reason or ""
    assert "NVML_ERROR_DRIVER_NOT_LOADED (9)" in reason and "not loaded (yet" in reason
    assert "again" not in reason and "gone" not in reason  # check's nvml row: it is not retried

    source, backend, snaps = _polled_from_start(path, 12)
    first_up = next(n for n, snap in enumerate(snaps, 1) if snap.nvml_up)
    # the module is loaded from poll 4; the source finds out at its first attempt, RETRY_SECONDS
    # after the one at start (poll 1 at the same instant)
    assert first_up == 1 + RETRY_SECONDS / POLL_SECONDS
    assert all(not snap.nvml_up and snap.gpus == () for snap in snaps[: first_up - 1])
    down = snaps[0].collectors["nvml"]
    assert down.success is False and "not loaded (yet" in (down.error or "")
    assert snaps[0].collectors["nvml"].error == reason  # until the first attempt again
    for snap in snaps[first_up - 1 :]:
        assert snap.nvml_up and [g.identity.uuid for g in snap.gpus] == [H200_UUID]
    assert source.unavailable_reason is None and not source.waiting
    assert backend.calls["init"] == 2  # at start, and the attempt that found it; none since
    (started,) = [m for m in _infos(caplog) if "NVML answers" in m]
    assert "GPU telemetry started" in started and "again" not in started


def test_a_driver_still_not_loaded_says_it_is_tried_again(
    derive_fixture: Callable[..., Path],
) -> None:
    source, backend, snaps = _polled_from_start(_started_before_the_driver(derive_fixture, 50), 20)
    assert all(not snap.nvml_up for snap in snaps)
    reason = snaps[-1].collectors["nvml"].error or ""
    assert "not loaded (yet" in reason and f"again every {RETRY_SECONDS:g} s" in reason
    assert backend.calls["init"] == 1 + 19 * POLL_SECONDS // RETRY_SECONDS  # t=0, 30, 60, 90
    assert source.waiting


def test_no_nvml_library_is_not_started_again(nvml_fixture: Callable[[str], Path]) -> None:
    """LIBRARY_NOT_FOUND (no driver installed) is not a driver-wide answer that a module load
    changes: no nvmlInit per poll, as before."""
    source, backend, snaps = _polled_from_start(nvml_fixture("no-nvml"), 40)
    assert not source.waiting
    assert backend.calls.get("init") == 1
    assert all(not snap.nvml_up for snap in snaps)


def test_the_daemon_builds_its_probes_while_it_waits_for_the_driver(
    derive_fixture: Callable[..., Path], tmp_path: Path
) -> None:
    """The probe scheduler reads each cycle's GPUs from the snapshot: built while NVML is
    waited for, it probes the GPUs once they come; without a GPU and not waiting, it is not."""
    from sparkdiag.config import Settings
    from sparkdiag.scheduling.probe_state import ProbeState
    from sparkdiag.scheduling.wiring import build_schedulers

    path = _started_before_the_driver(derive_fixture)
    source = GpuSource(FixtureBackend(path))
    source.start()
    poller = Poller(source, read_pcie=None, read_host=None, context=None, pcie_interval=0.0)
    settings = Settings(
        probe_fixture=Path("tests/fixtures/probe/h200-default.json"), state_dir=tmp_path
    )
    probes = build_schedulers(settings, poller, ProbeState())
    assert len(probes.periodic) == 1

    none = GpuSource(FixtureBackend(Path("tests/fixtures/nvml/no-nvml.json")))
    none.start()
    idle = Poller(none, read_pcie=None, read_host=None, context=None, pcie_interval=0.0)
    assert build_schedulers(settings, idle, ProbeState()).periodic == ()


def test_a_source_with_no_gpu_sees_the_driver_go(write_fixture: Callable[..., Path]) -> None:
    """NVML up with no GPU made no call a poll, so a driver unloaded under it was never seen
    (nvml_up stayed 1); now one device count a poll sees it."""
    path = write_fixture(
        {
            "format": "sparkdiag-nvml-fixture/1",
            "driver_version": "580.159.04",
            "devices": [],
            "script": [{"poll": 3, "nvml": {"error": "DRIVER_NOT_LOADED"}}],
        }
    )
    source, backend, snaps = _polled_from_start(path, 4)
    assert [snap.nvml_up for snap in snaps] == [True, True, False, False]
    assert backend.calls["device_count"] == 1 + 3  # at start, then one a poll while it answers
    assert "NVML_ERROR_DRIVER_NOT_LOADED (9)" in (snaps[2].collectors["nvml"].error or "")
    assert source.waiting


@pytest.mark.parametrize(("bus", "waits"), [("h200-vm", True), (None, False)])
def test_nvml_waits_for_its_module_only_where_a_gpu_is_on_the_bus(
    bus: str | None, waits: bool, derive_fixture: Callable[..., Path], tmp_path: Path
) -> None:
    """DRIVER_NOT_LOADED at start on a machine whose PCI bus shows an NVIDIA GPU (the module
    not loaded yet): NVML waits and is started again. On a machine with none (the driver's
    packages installed without a GPU) it waited for ever: nvmlInit every 30 s, a log saying
    telemetry waits, a probe scheduler and a baseline store for no GPU. Now it gives up at
    start and says there is no GPU on the bus."""
    from sparkdiag.config import Settings
    from sparkdiag.scheduling.probe_state import ProbeState
    from sparkdiag.scheduling.wiring import build_schedulers
    from sparkdiag.telemetry.build import build_poller
    from tests.support import ROOTFS

    sysfs = SYSFS / bus if bus else tmp_path / "no-bus"
    sysfs.mkdir(exist_ok=True)
    settings = Settings(
        nvml_fixture=_started_before_the_driver(derive_fixture),
        sysfs=sysfs,
        rootfs=ROOTFS / "native",
        probe_fixture=Path("tests/fixtures/probe/h200-default.json"),
        state_dir=tmp_path / "state",
    )
    poller = build_poller(settings, say_unavailable=False)
    try:
        assert poller.gpu.waiting is waits
        reason = poller.gpu.unavailable_reason or ""
        assert ("no NVIDIA GPU is on the PCI bus" in reason) is not waits
        assert "NVML_ERROR_DRIVER_NOT_LOADED (9)" in reason
        assert len(build_schedulers(settings, poller, ProbeState()).periodic) == int(waits)
    finally:
        poller.gpu.stop()


def test_dump_does_not_promise_to_start_nvml_again(
    derive_fixture: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    """dump is one poll: it says telemetry is skipped, not that NVML is started again."""
    from sparkdiag.config import Settings
    from sparkdiag.daemon import dump
    from tests.support import ROOTFS

    caplog.set_level(logging.WARNING)
    settings = Settings(
        nvml_fixture=_started_before_the_driver(derive_fixture),
        sysfs=SYSFS / "h200-vm",
        rootfs=ROOTFS / "native",
    )
    assert b"sparkdiag_nvml_up 0" in dump(settings)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "GPU telemetry skipped" in said and "again" not in said
