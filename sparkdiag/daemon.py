"""Wiring: sources, the poller, the HTTP server and signals."""

from __future__ import annotations

import errno
import logging
import signal
import threading
from types import FrameType

from sparkdiag.config import Settings, parse_listen
from sparkdiag.exporter.http import ExporterServer, health_check
from sparkdiag.exporter.probe import ProbeCollector
from sparkdiag.exporter.registry import build_registry, render
from sparkdiag.exporter.webconfig import load_web_config
from sparkdiag.probe.scheduler import build_schedulers
from sparkdiag.probe.state import ProbeState
from sparkdiag.sdnotify import Notifier
from sparkdiag.telemetry.build import build_poller

log = logging.getLogger("sparkdiag")


class StartupError(Exception):
    """The daemon cannot start (port in use, ...); the message says why."""


def dump(settings: Settings) -> bytes:
    """One poll rendered in the Prometheus text format."""
    poller = build_poller(settings)
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
    poller = build_poller(settings)
    probe_state = ProbeState()
    schedulers = build_schedulers(settings, poller, probe_state)
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
        target=poller.run,
        args=(stop,),
        kwargs={"initial_delay": poller.interval},
        name="poller",
        daemon=True,
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
