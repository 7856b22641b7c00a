"""Wiring: sources, the poller, the HTTP server and signals."""

from __future__ import annotations

import errno
import logging
import signal
import threading
from pathlib import Path
from types import FrameType

from sparkdiag.config import Settings, parse_listen
from sparkdiag.exporter.http import ExporterServer, health_check
from sparkdiag.exporter.registry import build_registry, render
from sparkdiag.exporter.webconfig import load_web_config
from sparkdiag.sdnotify import Notifier
from sparkdiag.sources import host
from sparkdiag.sources.context import detect_context
from sparkdiag.sources.fixture import FixtureBackend
from sparkdiag.sources.gpu import GpuSource
from sparkdiag.sources.nvml import PynvmlBackend
from sparkdiag.sources.nvml_api import NvmlBackend
from sparkdiag.sources.sysfs import PcieSource
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
    gpu = GpuSource(backend or make_backend(settings))
    if not gpu.start():
        log.warning(
            "NVML unavailable (%s): GPU telemetry skipped; exporting host PCIe links, execution "
            "context and host memory, with sparkdiag_nvml_up 0",
            gpu.unavailable_reason,
        )
    elif not gpu.identities:
        log.warning("NVML answers but reports no GPU: GPU telemetry skipped")
    pcie = PcieSource(settings.sysfs)
    context = detect_context(settings.rootfs) if settings.rootfs != Path("/") else detect_context()
    poller = Poller(
        gpu=gpu,
        read_pcie=pcie.read,
        read_host=host.read_host,
        context=context,
        interval=settings.poll_interval,
        pcie_interval=settings.pcie_interval,
    )
    return poller


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
    registry = build_registry(lambda: poller.latest)
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
    try:
        stop.wait()
    finally:
        notifier.stopping()
        server.shutdown()
        server.server_close()
        poll_thread.join(timeout=5)
        poller.gpu.stop()
        notifier.close()
