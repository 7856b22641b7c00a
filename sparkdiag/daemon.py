"""Wiring: sources, the poller, the HTTP server and signals."""

from __future__ import annotations

import errno
import importlib.util
import logging
import signal
import sys
import threading
from types import FrameType

from sparkdiag.config import ConfigError, Settings, parse_listen
from sparkdiag.exporter.http import ExporterServer, health_check
from sparkdiag.exporter.probe import ProbeCollector
from sparkdiag.exporter.registry import build_registry, render
from sparkdiag.exporter.webconfig import load_web_config
from sparkdiag.probe.baseline import BaselineStore, BaselineStoreError
from sparkdiag.probe.scheduler import (
    ContainerLauncher,
    FixtureLauncher,
    Launcher,
    ProbeScheduler,
    WorkerLauncher,
)
from sparkdiag.probe.state import ProbeState
from sparkdiag.sdnotify import Notifier
from sparkdiag.sources.context import detect_context
from sparkdiag.sources.dmi import read_platform
from sparkdiag.sources.fixture import FixtureBackend
from sparkdiag.sources.gpu import GpuSource
from sparkdiag.sources.meminfo import read_host_memory
from sparkdiag.sources.nvml import PynvmlBackend
from sparkdiag.sources.nvml_api import NvmlBackend
from sparkdiag.sources.sysfs import PcieSource
from sparkdiag.statedir import StateDirError, ensure_state_directory, state_directory
from sparkdiag.telemetry.poller import Poller

log = logging.getLogger("sparkdiag")


class StartupError(Exception):
    """The daemon cannot start (port in use, ...); the message says why."""


def make_backend(settings: Settings) -> NvmlBackend:
    """The fixture backend when a fixture is given (raises FixtureError), else real NVML."""
    if settings.nvml_fixture is not None:
        return FixtureBackend(settings.nvml_fixture)
    return PynvmlBackend()


def make_poller(settings: Settings, backend: NvmlBackend | None = None) -> Poller:
    """Start the sources and say once, on stderr, what will be skipped on this machine."""
    # Static fields about every 60 s, slow counters about every 10 s, whatever the poll interval.
    gpu = GpuSource(
        backend or make_backend(settings),
        static_every=max(1, round(60 / settings.poll_interval)),
        slow_every=max(1, round(10 / settings.poll_interval)),
    )
    if not gpu.start():
        log.warning(
            "NVML unavailable (%s): GPU telemetry skipped; exporting host PCIe links, execution "
            "context and host memory, with sparkdiag_nvml_up 0",
            gpu.unavailable_reason,
        )
    elif not gpu.identities:
        log.warning("NVML answers but reports no GPU: GPU telemetry skipped")
    pcie = PcieSource(settings.sysfs)
    context = detect_context(settings.rootfs)
    rootfs = settings.rootfs
    poller = Poller(
        gpu=gpu,
        read_pcie=pcie.read,
        read_host=lambda: read_host_memory(rootfs),
        context=context,
        interval=settings.poll_interval,
        pcie_interval=settings.pcie_interval,
        platform=read_platform(settings.sysfs),
    )
    return poller


def make_scheduler(settings: Settings, poller: Poller, state: ProbeState) -> ProbeScheduler | None:
    """The probe scheduler, or None (with one log line saying why) when probing cannot run."""
    if not settings.probe_enabled:
        return None
    if not poller.gpu.identities:
        log.warning("no GPU: GEMM probes skipped")
        return None
    launcher: Launcher
    if settings.probe_fixture is not None:
        try:
            launcher = FixtureLauncher(settings.probe_fixture)
        except ValueError as exc:
            raise ConfigError(f"probe.fixture: {exc}") from None
    else:
        python = settings.probe_python or (sys.executable,)
        if settings.probe_python is None and importlib.util.find_spec("torch") is None:
            log.warning(
                "torch is not installed for %s: GEMM probes skipped "
                "(install them with: pip install 'sparkdiag[probe]')",
                sys.executable,
            )
            return None
        launcher = WorkerLauncher(
            python, settings.probe_timeout, settings.probe_when, settings.probe_busy_utilization
        )
    store = open_store(settings)
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
    )


def make_container_scheduler(
    settings: Settings, poller: Poller, state: ProbeState, store: BaselineStore | None
) -> ProbeScheduler | None:
    """The container probe (``probe.container-command``), labelled context="container";
    it shares the native probe's baseline store, or opens one when that probe does not run."""
    if not settings.probe_enabled or not settings.probe_container_command:
        return None
    if not poller.gpu.identities:
        return None
    if store is None:
        store = open_store(settings)
    try:
        launcher = ContainerLauncher(settings.probe_container_command, settings.probe_timeout)
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
    )


def open_store(settings: Settings) -> BaselineStore | None:
    """The baseline database in the state directory; None (and a warning) when unusable."""
    try:
        directory = ensure_state_directory(settings.state_dir or state_directory())
        return BaselineStore(directory / "baselines.sqlite")
    except (StateDirError, BaselineStoreError) as exc:
        log.warning("baselines unavailable (%s): probes run without a baseline", exc)
        return None


def dump(settings: Settings) -> bytes:
    """One poll rendered in the Prometheus text format."""
    poller = make_poller(settings)
    try:
        snap = poller.poll_once()
        if not snap.pcie_links:
            log.warning("no PCI link found under %s: host PCIe links skipped", settings.sysfs)
        return render(build_registry(lambda: poller.latest))
    finally:
        poller.gpu.stop()


def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT."""
    address = parse_listen(settings.listen)
    web = None
    if settings.web_config_file is not None:
        web = load_web_config(settings.web_config_file)  # WebConfigError: a configuration error
    poller = make_poller(settings)
    probe_state = ProbeState()
    scheduler = make_scheduler(settings, poller, probe_state)
    container = make_container_scheduler(
        settings, poller, probe_state, scheduler.store if scheduler else None
    )
    schedulers = [s for s in (scheduler, container) if s is not None]
    poller.excluded_pids = lambda: frozenset().union(*(s.excluded_pids() for s in schedulers))
    registry = build_registry(
        lambda: poller.latest, extra=[ProbeCollector(probe_state.view)] if schedulers else []
    )
    try:
        healthy = health_check(lambda: poller.latest, settings.poll_interval)
        server = ExporterServer(address, registry, healthy, web, settings.web_max_requests)
    except OSError as exc:
        poller.gpu.stop()
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(
                f"cannot listen on {settings.listen}: the address is already in use "
                "(another sparkdiag? choose another with --listen)"
            ) from None
        raise StartupError(f"cannot listen on {settings.listen}: {exc.strerror or exc}") from None

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    notifier = Notifier()
    first = poller.poll_once()
    if not first.pcie_links:
        log.warning("no PCI link found under %s: host PCIe links skipped", settings.sysfs)
    server.serve_in_thread()
    poller.add_listener(lambda _snap: notifier.watchdog())
    gpus = sum(1 for g in first.gpus if g.up)
    notifier.ready(
        f"serving {settings.listen}; NVML {'up' if first.nvml_up else 'down'}, {gpus} GPU(s)"
    )
    host_text, port = server.server_address[:2]
    log.info(
        "serving %s://%s:%s/metrics (poll every %.3g s)",
        "https" if web is not None and web.ssl_context is not None else "http",
        host_text,
        port,
        settings.poll_interval,
    )
    poll_thread = threading.Thread(
        target=poller.run, args=(stop, settings.poll_interval), name="poller", daemon=True
    )
    poll_thread.start()
    for sched in schedulers:
        name = f"probe-{sched.context}"
        threading.Thread(target=sched.run, args=(stop,), name=name, daemon=True).start()
    try:
        stop.wait()
    finally:
        notifier.stopping()
        server.shutdown()
        server.server_close()
        poll_thread.join(timeout=5)
        poller.gpu.stop()
        notifier.close()
