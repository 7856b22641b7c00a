"""Wiring: sources, the poller, the HTTP server and signals."""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable

from sparkdiag.config import Settings, parse_listen
from sparkdiag.errors import Exit, SparkdiagError
from sparkdiag.exporter.base import SnapshotCollector
from sparkdiag.exporter.native import NativeCollector
from sparkdiag.exporter.registry import build_registry, render
from sparkdiag.exporter.soak import soak_collector
from sparkdiag.exporter.storage import storage_collector
from sparkdiag.lifecycle import LIFECYCLE, Lifecycle
from sparkdiag.native.watch import LibraryWatch, environment
from sparkdiag.scheduling.probe_state import ProbeState
from sparkdiag.scheduling.wiring import Probes, build_schedulers, stop_workers
from sparkdiag.sdnotify import Notifier
from sparkdiag.snapshot import Snapshot
from sparkdiag.sources.nvml.driver import ANSWER_SECONDS
from sparkdiag.telemetry.build import build_poller, first_poll
from sparkdiag.telemetry.poller import Poller
from sparkdiag.telemetry.stall import StallLog
from sparkdiag.web.http import ExporterServer, health_check
from sparkdiag.web.webconfig import LiveWebConfig, load_web_config

log = logging.getLogger("sparkdiag")

# How often the main thread wakes to run the Python handler of a signal that another thread
# received: the longest a stop waits for it (see _serve).
SIGNAL_CHECK_SECONDS = 1.0


class StartupError(SparkdiagError):
    """The daemon cannot start (port in use, ...); the message says why.

    Exit status 1, not 3: ``serve`` has documented 1 for "cannot start" from the first release
    (README, ``serve --help``), and the unit restarts on it as on 3 (only 2 is final).
    """

    exit_code = Exit.ATTENTION


def url_host(host: str) -> str:
    """A host as a URL writes it: an IPv6 address in brackets (``[::1]``), others as they are."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def dump(settings: Settings) -> bytes:
    """One poll rendered in the Prometheus text format. NVML that does not start and answer
    within ``ANSWER_SECONDS`` is down (sparkdiag_nvml_up 0, the reason logged): a hung driver
    hung dump for ever, deaf to Ctrl-C (found in a review)."""
    poller, snap = first_poll(settings, ANSWER_SECONDS, say_unavailable=False)
    try:
        say_skipped(settings, poller, snap, serving=False)
        return render(build_registry(lambda: poller.latest, compat_dcgm=settings.compat_dcgm))
    finally:
        poller.gpu.stop()


def say_skipped(
    settings: Settings, poller: Poller, first: Snapshot, *, serving: bool = True
) -> None:
    """Once, after the first poll, so as to name only what it found: without NVML, what is
    exported instead (host PCIe links only when there are some), and where ``serving`` and
    NVML waits for its driver, that it is started again; with NVML and no PCI link under
    --path.sysfs, that host PCIe links are skipped."""
    why = poller.gpu.unavailable_reason
    if why is not None:
        if first.pcie_links:
            instead = "exporting host PCIe links, the execution context and host memory"
        else:  # one line for both, promising no PCIe link
            instead = (
                f"no PCI link found under {settings.sysfs} either: exporting the execution "
                "context and host memory"
            )
        if serving and poller.gpu.waiting:  # a driver-wide answer: started again every 30 s
            again = f"NVML is started again every {poller.gpu.retry_seconds:g} s"
            log.warning(
                "NVML unavailable (%s): GPU telemetry waits; %s; meanwhile %s, with "
                "sparkdiag_nvml_up 0",
                why,
                again,
                instead,
            )
            return
        log.warning(
            "NVML unavailable (%s): GPU telemetry skipped; %s, with sparkdiag_nvml_up 0",
            why,
            instead,
        )
    elif not first.pcie_links:
        log.warning("no PCI link found under %s: host PCIe links skipped", settings.sysfs)


def serve(settings: Settings, life: Lifecycle | None = None) -> None:
    """Run until SIGTERM, SIGINT or SIGQUIT (see :mod:`sparkdiag.lifecycle`).

    A stop asked for while it starts is honoured as soon as the step in progress returns. On
    every way out the running probe workers' process groups are killed, so no worker outlives
    the daemon (a worker also exits by itself once its parent is gone: see worker.py).
    """
    life = life or LIFECYCLE.install(daemon=True)
    address = parse_listen(settings.listen)
    web = None
    if settings.web_config_file is not None:
        path = settings.web_config_file  # WebConfigError below: a configuration error, exit 2
        web = LiveWebConfig(path, load_web_config(path))
    poller = build_poller(settings, say_unavailable=False)
    try:
        _serve(settings, life, poller, address, web)
    finally:
        stopped = stop_workers()
        if stopped:
            log.info("stopped %d running probe worker(s)", stopped)
        poller.gpu.stop()
    if life.stopped_by:
        log.info("stopped (%s)", life.stopped_by)


def _serve(
    settings: Settings,
    life: Lifecycle,
    poller: Poller,
    address: tuple[str, int],
    web: LiveWebConfig | None,
) -> None:
    stop = life.stop
    if stop.is_set():
        return
    probe_state = ProbeState()
    probes = build_schedulers(settings, poller, probe_state)
    schedulers = probes.all
    poller.excluded_pids = lambda: frozenset().union(*(s.excluded_pids() for s in schedulers))
    collectors = [*_probe_collectors(probes, probe_state), soak_collector(settings.state_dir)]
    libraries = LibraryWatch(
        lambda: environment(settings.rootfs, settings.probe_python), settings.state_dir
    )
    collectors.append(NativeCollector(lambda: poller.latest, libraries))
    collectors.append(storage_collector(settings.state_dir))
    registry = build_registry(
        lambda: poller.latest, extra=collectors, compat_dcgm=settings.compat_dcgm
    )
    try:
        # polls nobody reads come every idle-poll-interval: /healthz allows for that
        slowest = max(settings.poll_interval, settings.idle_poll_interval)
        healthy = health_check(lambda: poller.latest, slowest, lambda: poller.published_at)
        server = ExporterServer(
            address,
            registry,
            healthy,
            web,
            settings.web_max_requests,
            max_connections=settings.web_max_connections,
            timeout=settings.web_read_timeout,
            generation=lambda: poller.latest,
        )
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(
                f"cannot listen on {settings.listen}: the address is already in use "
                "(another sparkdiag? choose another with --listen)"
            ) from None
        raise StartupError(f"cannot listen on {settings.listen}: {exc.strerror or exc}") from None
    notifier = Notifier()
    if notifier.watchdog_interval is not None:  # a ping comes with a poll: often enough for it
        poller.idle_interval = min(poller.idle_interval, notifier.watchdog_interval / 2)
        if poller.interval > notifier.watchdog_interval / 2:
            # a --poll-interval of WatchdogSec or more had systemd kill the service at every
            # gap between pings, a restart loop (found in a review)
            log.warning(
                "--poll-interval %g s is longer than a quarter of the service's watchdog "
                "(WatchdogSec %g s): polling every %g s instead, so that the watchdog is fed",
                poller.interval,
                notifier.watchdog_interval * 2,
                notifier.watchdog_interval / 2,
            )
            poller.interval = notifier.watchdog_interval / 2
    threads: list[threading.Thread] = []
    try:
        first = poller.poll_once()
        if stop.is_set():
            return
        say_skipped(settings, poller, first)
        server.serve_in_thread()
        server.prerenderer.poll_interval = settings.poll_interval
        poller.add_listener(server.published)  # /metrics rendered ahead when a scrape is due
        poller.pace = server.cache.window  # polls nobody will scrape are spaced out
        poller.add_listener(lambda _snap: notifier.watchdog())
        poller.add_listener(StallLog())  # one log line per stalled-GPU episode
        for hot in probes.hot:
            poller.add_listener(hot.published)  # judged once per snapshot
        gpus = sum(1 for g in first.gpus if g.up)
        notifier.ready(
            f"serving {settings.listen}; NVML {'up' if first.nvml_up else 'down'}, {gpus} GPU(s)"
        )
        host_text, port = server.server_address[:2]
        if not address[0]:
            log.info(
                "--listen %s binds every interface (%s): other machines can scrape it; "
                "--listen 127.0.0.1:%s serves this machine only",
                settings.listen,
                host_text,
                port,
            )
        log.info(
            "serving %s://%s:%s/metrics (poll every %.3g s)",
            "https" if server.web.tls is not None else "http",
            url_host(str(host_text)),
            port,
            settings.poll_interval,
        )
        life.status = lambda: _status(poller, probe_state)
        threads.append(
            threading.Thread(
                target=poller.run,
                args=(stop,),
                kwargs={"initial_delay": poller.interval},
                name="poller",
                daemon=True,
            )
        )
        loops: list[tuple[str, Callable[[threading.Event], None]]] = [
            (sched.name, sched.run) for sched in schedulers
        ]
        if settings.storage_enabled:  # off by default: it writes (config/table.py)
            from sparkdiag.storage.periodic import StoragePeriodic  # only when it runs

            storage = StoragePeriodic(settings, lambda: poller.latest)
            loops.append((storage.name, storage.run))
        # the CUDA library scan: once now, then every few hours, never in a scrape
        loops.append(("libraries", libraries.run))
        for name, loop in loops:
            threads.append(threading.Thread(target=loop, args=(stop,), name=name, daemon=True))
        for thread in threads:
            thread.start()
        # Not stop.wait() alone: a signal the kernel hands to another thread (it may, under
        # load) runs its Python handler only once the main thread runs again, and a main
        # thread asleep in an untimed wait ignored SIGTERM until SIGKILL (tests/test_lifecycle).
        while not stop.wait(SIGNAL_CHECK_SECONDS):
            pass
    finally:
        notifier.stopping()
        server.shutdown()
        server.server_close()
        stop_workers()  # a probe thread blocked on its worker returns at once
        for hot in probes.hot:
            hot.interrupt()
        for thread in threads:
            thread.join(timeout=5)
        notifier.close()


def _probe_collectors(probes: Probes, state: ProbeState) -> list[SnapshotCollector]:
    """The probe's collectors, when a probe runs (imported only then, with what they need)."""
    if not probes.all:
        return []
    from sparkdiag.exporter.hot import HotProbeCollector
    from sparkdiag.exporter.peers import PeerCollector
    from sparkdiag.exporter.probe import ProbeCollector

    keeper = probes.store
    return [
        ProbeCollector(state.view, keeper.health if keeper else None),
        HotProbeCollector(state.view),
        PeerCollector(state.view),
    ]


def _status(poller: Poller, state: ProbeState) -> str:
    snap = poller.latest
    gpus = "no poll yet" if snap is None else f"{sum(1 for g in snap.gpus if g.up)} GPU(s) up"
    view = state.view()
    cycles = sum(view.runs.values())
    ok = sum(n for (_g, _u, _c, result), n in view.runs.items() if result == "ok")
    return f"poll {poller.poll_count}, {gpus}, {cycles} probe cycle(s) ({ok} ok)"
