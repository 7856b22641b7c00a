"""Build the poller from the settings: the one place that wires the sources together.

``serve``, ``dump``, ``check`` (and ``watch``) all poll through a poller built here, so that
``--nvml-fixture``, ``--path.sysfs`` and ``--path.rootfs`` mean the same thing in every command.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from sparkdiag.config import Settings
from sparkdiag.snapshot import GpuSample, Snapshot
from sparkdiag.sources.host.context import detect_context
from sparkdiag.sources.host.dmi import read_platform
from sparkdiag.sources.host.meminfo import read_host_memory
from sparkdiag.sources.host.nvme import NvmeSource
from sparkdiag.sources.host.nvme_tools import (
    HealthReader,
    files_then_tools,
    fixture_reader,
    log_dir_reader,
    tool_reader,
)
from sparkdiag.sources.host.procfs import ProcessIdentities, driver_gpus
from sparkdiag.sources.host.sysfs import PcieSource
from sparkdiag.sources.nvml.activity import ProcessOptions
from sparkdiag.sources.nvml.api import NvmlBackend
from sparkdiag.sources.nvml.backends import make_backend
from sparkdiag.sources.nvml.driver import NvmlHung, Unanswered, within
from sparkdiag.sources.nvml.gpu import GpuSource
from sparkdiag.telemetry.poller import Poller

log = logging.getLogger("sparkdiag")


def build_poller(
    settings: Settings, backend: NvmlBackend | None = None, *, say_unavailable: bool = True
) -> Poller:
    """Start the sources and say once, on stderr, what will be skipped on this machine.

    Without NVML it says only that (``NVML unavailable (why)``): what a command does without
    it is the command's to say. ``say_unavailable=False`` leaves even that to the caller: the
    exporter (``serve``, ``dump``) says it after its first poll, with what it exports instead,
    which depends on what that poll found (``gpu.unavailable_reason`` holds why).

    Raises FixtureError for an unusable ``--nvml-fixture``, NvmeFixtureError for a
    ``--nvme.fixture`` that is not a directory. The caller stops the GPU source
    (``poller.gpu.stop()``) when done.
    """
    # every fixture refused before anything is said: NvmeFixtureError here, FixtureError below
    nvme_reader, nvme_skipped = _nvme_reader(settings)
    processes = None
    if settings.process_metrics:
        processes = ProcessOptions(settings.process_metrics_top, ProcessIdentities(settings.rootfs))
    gpu = GpuSource(backend or make_backend(settings.nvml_fixture), processes=processes)
    if not gpu.start():
        if say_unavailable:
            log.warning("NVML unavailable (%s)", gpu.unavailable_reason)
    elif not gpu.identities:
        log.warning("NVML answers but reports no GPU: GPU telemetry skipped")
    read_nvme = _nvme_source(settings, nvme_reader, nvme_skipped).read
    rootfs = settings.rootfs
    pcie = PcieSource(settings.sysfs)
    context = detect_context(rootfs)
    read_gpu_functions = _gpu_functions(pcie, rootfs, context.context == "container")
    if gpu.waiting and _none_on_bus(read_gpu_functions):
        gpu.give_up("no NVIDIA GPU is on the PCI bus")
    return Poller(
        gpu=gpu,
        read_pcie=pcie.read,
        read_gpu_functions=read_gpu_functions,
        read_host=lambda: read_host_memory(rootfs),
        context=context,
        interval=settings.poll_interval,
        pcie_interval=settings.pcie_interval,
        idle_interval=settings.idle_poll_interval,
        platform=read_platform(settings.sysfs),
        read_nvme=read_nvme,
    )


WHAT_FIRST_POLL = "nvmlInit and the first poll"


def first_poll(
    settings: Settings, seconds: float, *, say_unavailable: bool = True
) -> tuple[Poller, Snapshot]:
    """The poller and its first snapshot, NVML's start (nvmlInit, each GPU's identity) and first
    poll waited for at most ``seconds`` (:func:`~sparkdiag.sources.nvml.driver.within`). Past
    them the driver is taken as hung: that work is left to its thread, and the poller returned
    is one whose NVML is down with :func:`~sparkdiag.sources.nvml.driver.hung_reason` as its
    reason (the host's readings still taken), which check's ``nvml`` row and dump's
    sparkdiag_nvml_up report."""

    def start() -> tuple[Poller, Snapshot]:
        poller = build_poller(settings, say_unavailable=say_unavailable)
        try:
            return poller, poller.poll_once()
        except BaseException:
            poller.gpu.stop()
            raise

    def release(late: tuple[Poller, Snapshot]) -> None:  # NVML answered after the deadline
        late[0].gpu.stop()

    try:
        return within(seconds, WHAT_FIRST_POLL, start, release)
    except NvmlHung as hung:
        poller = build_poller(settings, Unanswered(hung), say_unavailable=say_unavailable)
        return poller, poller.poll_once()


WHAT_LATER_POLL = "a poll after the first"


class BoundedPoll:
    """``poller.poll_once`` as a call whose NVML part is waited for at most ``seconds``
    (:func:`~sparkdiag.sources.nvml.driver.within`): past them, :class:`NvmlHung`, and
    :attr:`lost` says why from then on. A driver that answers the first poll and hangs in a
    later one (the stall sampling, the polls beside the probe) held check for ever before. The
    host's readings are not timed: a slow NVMe tool read as a hung driver (found in a review).
    After a hang the poller must not be used again: its NVML is held by the stuck call, and
    even its stop may wait for it."""

    def __init__(self, poller: Poller, seconds: float) -> None:
        self.poller = poller
        self.seconds = seconds
        self.lost: str | None = None  # why NVML stopped answering; None while it answers

    def _bound(self, read: Callable[[], tuple[GpuSample, ...]]) -> tuple[GpuSample, ...]:
        try:
            return within(self.seconds, WHAT_LATER_POLL, read)
        except NvmlHung as hung:
            self.lost = str(hung)
            raise

    def __call__(self) -> Snapshot:
        return self.poller.poll_once(self._bound)


def _none_on_bus(read: Callable[[], tuple[str, ...] | None]) -> bool:
    """sysfs lists no NVIDIA GPU function: NVML, waiting for its kernel module, has nothing to
    wait for (the driver's packages on a machine without a GPU). False where it cannot tell (a
    container without /proc/driver/nvidia/gpus, an unreadable sysfs): a GPU may be there."""
    try:
        return read() == ()
    except OSError:
        return False


def _nvme_reader(settings: Settings) -> tuple[HealthReader | None, str]:
    """The health-log reader and why there is none; NvmeFixtureError for a bad fixture."""
    if settings.nvme_fixture is not None:
        return fixture_reader(settings.nvme_fixture), ""
    if not settings.nvme_smart:
        return None, "--no-nvme.smart"
    if settings.nvme_log_dir is not None:
        files = log_dir_reader(settings.nvme_log_dir, settings.nvme_log_max_age)
        tools = tool_reader(settings.rootfs, settings.sysfs)[0] if os.geteuid() == 0 else None
        return (files if tools is None else files_then_tools(files, tools)), ""
    return tool_reader(settings.rootfs, settings.sysfs)


def _nvme_source(settings: Settings, reader: HealthReader | None, skipped: str) -> NvmeSource:
    """NVMe drives under ``--path.sysfs``; their health logs from ``--nvme.fixture``, else (with
    ``--nvme.smart`` on) from ``--nvme.log-dir``'s files or smartctl or nvme-cli where installed
    (said once when skipped)."""
    if reader is None and settings.nvme_smart:
        log.info("NVMe SMART health skipped: %s (temperatures still read from sysfs)", skipped)
    return NvmeSource(settings.sysfs, reader, skipped)


def _gpu_functions(
    pcie: PcieSource, rootfs: Path, container: bool
) -> Callable[[], tuple[str, ...] | None]:
    """The NVIDIA GPU functions to compare with NVML's count: every one sysfs lists on the host;
    in a container only those the container is given (sysfs there shows the host's bus, the
    NVIDIA toolkit mounts the given GPUs in /proc/driver/nvidia/gpus), and none (not exported)
    where the container shows no such list."""
    if not container:
        return pcie.gpu_functions

    def given() -> tuple[str, ...] | None:
        visible = driver_gpus(rootfs)
        if visible is None:
            return None
        return tuple(a for a in pcie.gpu_functions() if a.lower() in visible)

    return given
