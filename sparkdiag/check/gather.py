"""Gather a :class:`CheckContext`: one poll, the probe (unless ``--quick``), the host readings.

Every reading of the machine comes from :mod:`sparkdiag.sources` (the poller's sources, plus
:mod:`~sparkdiag.sources.host.cpufreq`, :mod:`~sparkdiag.sources.host.procfs`,
:mod:`~sparkdiag.sources.software.packages` and :mod:`~sparkdiag.sources.host.kernel_log`), each
under the configured ``--path.sysfs`` / ``--path.rootfs``; this module only puts them together.

NVML's start and the first poll are waited for at most ``nvml_timeout`` seconds
(:func:`sparkdiag.telemetry.build.first_poll`): a driver that hangs there gives an ``nvml`` row
that says so, not a check that never ends. So is each poll after it (the stall sampling, the
polls beside the probe: :class:`sparkdiag.telemetry.build.BoundedPoll`): a driver that answers
the first and hangs later is asked nothing more (``CheckContext.nvml_lost``), the probe does
not run, and the host's readings still come.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from sparkdiag import terminal
from sparkdiag.baseline.keeper import inspect_store
from sparkdiag.check.model import (
    CheckContext,
    GpuProbe,
    KernelLog,
    StorageProbe,
    TorchInfo,
    no_gpu_reason,
)
from sparkdiag.check.probe_run import read_store, run_probes, worker_launcher
from sparkdiag.check.stall_checks import sample_busy_gpus
from sparkdiag.config import Settings
from sparkdiag.errors import Exit, SparkdiagError, UsageError
from sparkdiag.link import auth
from sparkdiag.link.client import Options, measure_link
from sparkdiag.link.readings import read_fabric
from sparkdiag.link.session import resolve, split_peer
from sparkdiag.native.watch import cache_path, environment
from sparkdiag.probe.launchers import Launcher, WorkerLauncher
from sparkdiag.probe.runner import torch_install_hint
from sparkdiag.snapshot import GpuSample, Snapshot
from sparkdiag.soak.state import inspect_state
from sparkdiag.sources.host.cpufreq import read_governors
from sparkdiag.sources.host.kernel_log import read_kernel_log
from sparkdiag.sources.host.nvme_tools import timer_logs
from sparkdiag.sources.host.procfs import device_holders, process_names
from sparkdiag.sources.nvml.driver import ANSWER_SECONDS
from sparkdiag.sources.software.cuda_libraries import ScanCache, scan
from sparkdiag.sources.software.packages import read_torch
from sparkdiag.sources.software.pyenv import NotAnEnvironment
from sparkdiag.statedir import service_state
from sparkdiag.storage.run import ProbeRequest
from sparkdiag.storage.session import Where, probe_directory
from sparkdiag.telemetry.build import BoundedPoll, first_poll

QUICK_SKIP = "--quick: nothing that loads the GPU runs (run without --quick to probe)"


@dataclass(frozen=True)
class Sources:
    """What :func:`gather` would otherwise read from the machine; tests replace parts of it.

    launcher: runs the probe on one GPU (default: the real worker)
    torch: the installed torch (default: :func:`sparkdiag.sources.software.packages.read_torch`)
    kernel_log: the kernel log (default: :func:`sparkdiag.sources.host.kernel_log.read_kernel_log`,
        ``/dev/kmsg`` or ``dmesg`` under ``--path.rootfs``)
    sleep: waits between the stall check's samples (default: :func:`time.sleep`)
    """

    launcher: Launcher | None = None
    torch: TorchInfo | None = None
    kernel_log: KernelLog | None = None
    sleep: Callable[[float], None] = time.sleep  # between the stall check's samples


def busy_reason(ctx: CheckContext, gpu: GpuSample) -> str | None:
    """Why ``gpu`` counts as busy (so it is not probed), or None when idle."""
    evidence = ctx.busy(gpu)
    return None if evidence is None else "GPU busy: " + evidence.describe(ctx.describe_pid)


def gather(
    settings: Settings,
    quick: bool = False,
    expect_gpus: int | None = None,
    sources: Sources = Sources(),
    on_probe: Callable[[Sequence[GpuSample]], None] | None = None,
    on_peer: Callable[[str], None] | None = None,
    storage: Path | None = None,
    nvml_timeout: float = ANSWER_SECONDS,
) -> CheckContext:
    """Poll once, probe every idle GPU (unless ``quick``), read the host, and with ``storage`` a
    directory's read and write speed (it writes; never recorded); FixtureError passes up. NVML
    that does not start and answer the first poll within ``nvml_timeout`` seconds is down
    (:func:`sparkdiag.telemetry.build.first_poll`)."""
    peer = _peer(settings, quick)  # a bad --peer is said at once, not after the probe
    poller, snapshot = first_poll(settings, nvml_timeout)
    poll = BoundedPoll(poller, nvml_timeout)
    try:
        pids = sorted({p for g in snapshot.gpus for p in g.compute_pids or ()})
        governors, governor_note = read_governors(settings.sysfs)
        ctx = CheckContext(
            snapshot=snapshot,
            quick=quick,
            expect_gpus=expect_gpus,
            torch=sources.torch or read_torch(),
            governors=governors,
            governor_note=governor_note,
            process_names=process_names(settings.rootfs, pids),
            own_pids=frozenset({os.getpid()}),
            busy_utilization=settings.probe_busy_utilization,
        )
        # Before the probe: a GPU busy enough to be stalled is sampled for a few seconds.
        stalls = sample_busy_gpus(snapshot, poll, sources.sleep)
        ctx = replace(ctx, stall_samples=stalls, nvml_lost=poll.lost)
        ctx = _with_probes(ctx, settings, sources, poll, on_probe)
        # Read after the probe, so that an XID the load provoked is seen too.
        ctx = replace(
            ctx,
            kernel_log=sources.kernel_log or read_kernel_log(settings.rootfs),
            baseline_store=inspect_store(settings.state_dir),
            soak=inspect_state(settings.state_dir),
            service_state=service_state(settings.rootfs, settings.state_dir),
            nvme_logs=timer_logs(settings.rootfs, settings.nvme_fixture or settings.nvme_log_dir),
        )
        ctx = _with_software(ctx, settings)
        if storage is not None:
            ctx = replace(ctx, storage=storage_probe(storage, settings))
        return _with_link(ctx, settings, on_peer, peer)
    finally:
        if poll.lost is None:  # after a hang the stuck call holds NVML: not stopped
            poller.gpu.stop()


def _with_software(ctx: CheckContext, settings: Settings) -> CheckContext:
    """The libraries with GPU code (native-code) and, on unified memory, the processes holding
    the GPU (gpu-memory). The library scan reads headers only and keeps a cache in the state
    directory, so a second check reads only what changed."""
    unified = any(g.identity.memory_model == "unified" for g in ctx.gpus_up())
    holders = tuple(device_holders(settings.rootfs)) if unified else None
    ctx = replace(ctx, device_holders=holders)
    try:
        found = scan(environment(settings.rootfs, None), ScanCache(cache_path(settings.state_dir)))
    except (NotAnEnvironment, OSError) as exc:
        return replace(ctx, libraries_note=f"the libraries could not be read: {exc}")
    return replace(ctx, libraries=found)


def storage_probe(directory: Path, settings: Settings) -> StorageProbe:
    """``check --storage DIR``: the storage probe, bounded by ``--storage.size`` and
    ``--storage.duration`` (check's defaults: 256 MiB, 8 s); never recorded."""
    request = ProbeRequest(directory, settings.storage_size, settings.storage_duration)
    where = Where(settings.sysfs, settings.rootfs, settings.state_dir)
    try:
        return StorageProbe(probe_directory(request, where, record=False))
    except SparkdiagError as exc:
        return StorageProbe(None, exc.message, refused=exc.exit_code == Exit.USAGE)


# check --peer: a short link test, bounded (2 s per method, direction and path; 30 s in all).
PEER_OPTIONS = Options(seconds=2.0, use_tools=False, budget=30.0)


def _warn(line: str) -> None:
    """A warning line on standard error, its bytes escaped (a path is the user's)."""
    print(terminal.safe(line), file=sys.stderr)


class _Peer(NamedTuple):
    """``--peer``, read once: its host and port, and why its name cannot be resolved now (no
    DNS server answers; not "no such name"), which the link row says instead of a test."""

    host: str
    port: int
    unresolved: str | None = None


def _peer(settings: Settings, quick: bool) -> _Peer | None:
    """``--peer``, with its usage errors before anything is measured: a malformed one, and
    (unless ``quick``, which runs no link test) a name that does not resolve. They came after
    the probe and the host's readings, seconds later (15 s on a lent H100). A name that cannot
    be resolved now is no usage error, and is not looked up again for the row (each lookup may
    wait for the resolver's timeout)."""
    if settings.peer is None:
        return None
    host, port = split_peer(settings.peer)
    if quick:
        return _Peer(host, port)
    try:
        resolve(host, port)
    except UsageError as exc:
        raise UsageError(exc.message, flag="--peer") from None
    except SparkdiagError as exc:
        return _Peer(host, port, exc.line())
    return _Peer(host, port)


def _with_link(
    ctx: CheckContext,
    settings: Settings,
    on_peer: Callable[[str], None] | None,
    peer: _Peer | None,
) -> CheckContext:
    """The ConnectX-7 readings (with the route to ``peer``), and the link test against it
    (not with --quick)."""
    with contextlib.suppress(FileNotFoundError):  # a missing sysfs root: the PCIe rows say so
        fabric = read_fabric(
            settings.sysfs, settings.rootfs, os.environ, peer=peer.host if peer else None
        )
        ctx = replace(ctx, fabric=fabric)
    if peer is None or ctx.quick:
        return ctx
    if peer.unresolved is not None:  # before the secret's errors, as a name that does not resolve
        return replace(ctx, peer_error=peer.unresolved)
    secret_file = settings.link_secret_file or auth.default_path()
    try:
        # a directory others may write is warned about on stderr, as link test does (found in
        # a review; check logs only errors by default, so not through the log)
        secret = auth.read_secret(secret_file, say=_warn)
        report = measure_link(
            peer.host,
            replace(PEER_OPTIONS, port=peer.port, secret=secret),
            settings.sysfs,
            settings.rootfs,
            os.environ,
            progress=on_peer or (lambda line: None),
        )
    except UsageError as exc:  # a name that stopped resolving: --peer's, not link test's PEER
        if exc.flag != "PEER":  # the link secret's file: a row, as every other link failure
            return replace(ctx, peer_error=exc.line())
        raise UsageError(exc.message, flag="--peer") from None
    except SparkdiagError as exc:
        return replace(ctx, peer_error=exc.line())
    except FileNotFoundError as exc:
        return replace(ctx, peer_error=str(exc))
    return replace(ctx, peer_link=report)


def _with_probes(
    ctx: CheckContext,
    settings: Settings,
    sources: Sources,
    poll: Callable[[], Snapshot],
    on_probe: Callable[[Sequence[GpuSample]], None] | None,
) -> CheckContext:
    up = ctx.gpus_up()
    if ctx.quick:
        return replace(ctx, probe_skipped=QUICK_SKIP)
    if not up:
        return replace(ctx, probe_skipped=no_gpu_reason(ctx.snapshot))
    if ctx.nvml_lost is not None:
        return replace(ctx, probe_skipped=f"not probed: {ctx.nvml_lost}")
    torch = ctx.torch
    if sources.launcher is None and (torch is None or torch.version is None):
        python = torch.python if torch is not None else "this Python"
        return replace(
            ctx,
            probe_skipped=f"torch is not installed for {python} "
            f"({torch_install_hint(torch.python) if torch is not None else torch_install_hint()})",
        )
    probes: dict[int, GpuProbe] = {}
    eligible = []
    for gpu in up:
        why = busy_reason(ctx, gpu)
        if why is None:
            eligible.append(gpu)
        else:
            probes[gpu.identity.index] = GpuProbe(gpu, skipped=f"not probed: {why}")
    if eligible:
        launcher = sources.launcher or worker_launcher(
            settings.probe_timeout, settings.probe_busy_utilization
        )
        store, note = read_store(settings.state_dir)
        context = ctx.snapshot.context.context if ctx.snapshot.context else "native"
        if on_probe is not None:
            on_probe(eligible)
        try:
            probes.update(
                run_probes(
                    eligible,
                    launcher,
                    poll,
                    store,
                    context,
                    note,
                    serial=not isinstance(launcher, WorkerLauncher),
                )
            )
        finally:
            if store is not None:
                store.close()
    return replace(ctx, probes=probes)
