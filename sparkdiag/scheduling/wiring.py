"""The daemon's probes, built from the settings: the periodic probe, its hot probe and the
container probe, sharing one baseline store and one lock per GPU.

What they need (the launchers, the worker's request and document, the baseline store and
SQLite, the container runner) is imported here when a probe is built, not when the daemon
starts: ``serve --no-probe.enabled`` never loads it (docs/daemon-cost.md).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkdiag.config import ConfigError, Settings
from sparkdiag.scheduling.probe_state import ProbeState
from sparkdiag.telemetry.poller import Poller

if TYPE_CHECKING:
    from sparkdiag.baseline.keeper import StoreKeeper
    from sparkdiag.probe.launchers import Launcher
    from sparkdiag.scheduling.hot_probe import HotProbeScheduler
    from sparkdiag.scheduling.scheduler import GpuLocks, ProbeScheduler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Probes:
    """The probe schedulers the daemon runs: ``periodic`` (native, then container) and ``hot``."""

    periodic: tuple[ProbeScheduler, ...] = ()
    hot: tuple[HotProbeScheduler, ...] = ()

    @property
    def all(self) -> list[ProbeScheduler | HotProbeScheduler]:
        return [*self.periodic, *self.hot]

    @property
    def store(self) -> StoreKeeper | None:
        """The baseline store the schedulers share, if one was opened."""
        return next((s.store for s in self.all if s.store is not None), None)


# The daemon's child processes, by the module that starts them and its function that kills the
# running ones: the probe workers, and the storage probes (off by default).
_RUNNERS = (
    ("sparkdiag.probe.runner", "kill_running_workers"),
    ("sparkdiag.storage.run", "kill_running"),
    ("sparkdiag.sources.software.pyenv", "kill_running"),  # the library scan's sys.path question
)


def stop_workers() -> int:
    """Kill the probe workers and storage probes running now (their process groups) and return
    how many; a kind whose module was never imported counts 0, since none can have started."""
    stopped = 0
    for module, kill in _RUNNERS:
        runner = sys.modules.get(module)
        if runner is not None:
            stopped += int(getattr(runner, kill)())
    return stopped


def build_schedulers(settings: Settings, poller: Poller, state: ProbeState) -> Probes:
    """The daemon's probe schedulers (the periodic probe, its hot probe, and the container
    probe when configured), each with one log line saying why it does not run. They share one
    baseline store and one lock per GPU. A bad probe setting raises ConfigError (an unusable
    probe fixture ProbeFixtureError)."""
    if not settings.probe_enabled:
        return Probes()
    from sparkdiag.scheduling.scheduler import GpuLocks

    locks = GpuLocks()
    native = _native(settings, poller, state, locks)
    store = native.store if native else None
    hot = _hot(settings, poller, state, store, locks) if native else None
    container = _container(settings, poller, state, store, locks)
    periodic = tuple(s for s in (native, container) if s is not None)
    return Probes(periodic, () if hot is None else (hot,))


def _native(
    settings: Settings, poller: Poller, state: ProbeState, locks: GpuLocks
) -> ProbeScheduler | None:
    """The probe scheduler, or None (with one log line saying why) when probing cannot run."""
    from sparkdiag.probe.launchers import FixtureLauncher, WorkerLauncher
    from sparkdiag.probe.request import WorkerRequest
    from sparkdiag.probe.runner import torch_install_hint
    from sparkdiag.scheduling.scheduler import ProbeScheduler

    if not poller.gpu.identities and not poller.gpu.waiting:  # waiting: the GPUs come later
        log.warning("no GPU: GEMM probes skipped")
        return None
    launcher: Launcher
    if settings.probe_fixture is not None:
        launcher = FixtureLauncher(settings.probe_fixture)  # ProbeFixtureError: exit 2
    else:
        python = settings.probe_python or (sys.executable,)
        if settings.probe_python is None and importlib.util.find_spec("torch") is None:
            log.warning("torch is not installed: GEMM probes skipped (%s)", torch_install_hint())
            return None
        request = WorkerRequest(
            probe_when=settings.probe_when, busy_utilization=settings.probe_busy_utilization
        )
        launcher = WorkerLauncher(python, settings.probe_timeout, request)
    store = _store(settings)
    context = poller.context.context if poller.context else "native"
    return ProbeScheduler(
        launcher,
        state,
        store,
        context,
        lambda: poller.latest,
        settings.probe_interval,
        when=settings.probe_when,
        busy_utilization=settings.probe_busy_utilization,
        first_delay=settings.probe_first_delay,
        cool_below=settings.probe_hot_memory_celsius,
        locks=locks,
    )


def _hot(
    settings: Settings,
    poller: Poller,
    state: ProbeState,
    store: StoreKeeper | None,
    locks: GpuLocks,
) -> HotProbeScheduler | None:
    """The hot probe beside the periodic one (off with ``--no-probe.hot-enabled``)."""
    from sparkdiag.probe.launchers import FixtureLauncher, ProbeFixtureError, WorkerLauncher
    from sparkdiag.probe.request import WorkerRequest
    from sparkdiag.scheduling.hot_probe import HotLimits, HotProbeScheduler

    if not settings.probe_hot_enabled:
        return None
    launcher: Launcher
    if settings.probe_fixture is not None:
        try:
            launcher = FixtureLauncher(settings.probe_fixture, suite="hot")
        except ProbeFixtureError:
            log.info("the probe fixture holds no hot-suite cycle: hot probes skipped")
            return None
    else:
        python = settings.probe_python or (sys.executable,)
        launcher = WorkerLauncher(python, settings.probe_timeout, WorkerRequest(suite="hot"))
    limits = HotLimits(
        memory_celsius=settings.probe_hot_memory_celsius,
        gpu_celsius=settings.probe_hot_gpu_celsius,
        interval=settings.probe_hot_interval,
        min_interval=settings.probe_hot_min_interval,
        busy_utilization=settings.probe_busy_utilization,
    )
    context = poller.context.context if poller.context else "native"
    return HotProbeScheduler(launcher, state, store, context, lambda: poller.latest, limits, locks)


def _container(
    settings: Settings,
    poller: Poller,
    state: ProbeState,
    store: StoreKeeper | None,
    locks: GpuLocks,
) -> ProbeScheduler | None:
    """The container probe (``probe.container-command``), labelled context="container";
    it shares the native probe's baseline store, or opens one when that probe does not run."""
    if not settings.probe_container_command:
        return None
    from sparkdiag.probe.launchers import ContainerLauncher
    from sparkdiag.probe.request import WorkerRequest
    from sparkdiag.scheduling.scheduler import ProbeScheduler

    if not poller.gpu.identities and not poller.gpu.waiting:
        return None
    if store is None:
        store = _store(settings)
    try:
        launcher = ContainerLauncher(
            settings.probe_container_command, settings.probe_timeout, WorkerRequest()
        )
    except ValueError as exc:
        raise ConfigError(f"probe.container-command: {exc}") from None
    return ProbeScheduler(
        launcher,
        state,
        store,
        "container",
        lambda: poller.latest,
        settings.probe_container_interval,
        when=settings.probe_when,
        busy_utilization=settings.probe_busy_utilization,
        first_delay=settings.probe_first_delay + 60.0,  # after the native cycle, not beside it
        cool_below=settings.probe_hot_memory_celsius,
        locks=locks,
    )


def _store(settings: Settings) -> StoreKeeper:
    """The baseline database in the state directory, kept with its health and its retention
    (baseline/keeper.py)."""
    from sparkdiag.baseline.keeper import Retention, StoreKeeper
    from sparkdiag.baseline.store import open_store

    retention = Retention(settings.baseline_history_runs, settings.baseline_history_days)
    # the keeper runs the fuller integrity_check at each open: no quick_check before it
    return StoreKeeper(lambda: open_store(settings.state_dir, create=True, verify=False), retention)
