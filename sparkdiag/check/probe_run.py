"""The short probe of ``sparkdiag check``: the real worker (or a replayed document) on every GPU.

Every eligible GPU is probed at the same time, each worker pinned to its GPU by uuid through
``CUDA_VISIBLE_DEVICES``, so an 8-GPU node takes as long as one GPU. While the workers run, the
check keeps polling NVML: those samples are the "under load" readings (PCIe link speed, SM clock)
that an idle GPU cannot give. Results are compared with the stored baseline (read only: the check
never teaches a baseline) and the built-in reference.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from sparkdiag.baseline.evaluate import GemmFigure, evaluate
from sparkdiag.baseline.model import BaselineStoreError
from sparkdiag.baseline.store import BaselineStore, open_store
from sparkdiag.check.model import GpuProbe
from sparkdiag.config import DEFAULTS
from sparkdiag.probe.launchers import Launcher, WorkerLauncher
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.probe.runner import ProbeCycle
from sparkdiag.snapshot import GpuSample, Snapshot
from sparkdiag.sources.nvml.driver import NvmlHung

log = logging.getLogger(__name__)

# The worker's check suite: bf16 and fp16 for throughput, fp8 and nvfp4 (where the GPU has it)
# for dtype-order, int4 for the 4-bit comparison at the decode shape (timed in interleaved
# rounds with them), every shape, the host-device copies.
CHECK_REQUEST = WorkerRequest(suite="check", probe_when="idle")
LOAD_POLL_SECONDS = 0.5


def worker_launcher(
    timeout: float,
    busy_utilization: float = DEFAULTS["probe_busy_utilization"],
    device: str | None = None,
    small: bool = False,
    python: Sequence[str] = (sys.executable,),
) -> WorkerLauncher:
    """The real worker with the check's short suite (``device`` default: the GPU's cuda:0)."""
    request = replace(CHECK_REQUEST, busy_utilization=busy_utilization, device=device, small=small)
    return WorkerLauncher(python, timeout, request)


def read_store(state_dir: Path | None) -> tuple[BaselineStore | None, str | None]:
    """The baseline store if one exists; (None, why) otherwise. Never creates one."""
    try:
        return open_store(state_dir, create=False), None
    except (BaselineStoreError, OSError) as exc:
        return None, str(exc)


def run_probes(
    gpus: Sequence[GpuSample],
    launcher: Launcher,
    poll: Callable[[], Snapshot] | None,
    store: BaselineStore | None,
    context: str,
    baseline_note: str | None = None,
    serial: bool = False,
) -> dict[int, GpuProbe]:
    """Probe ``gpus`` at once; poll NVML meanwhile; evaluate each document (record=False).

    ``serial`` runs the launcher calls one after the other (for launchers that are not
    thread-safe, such as the fixture replay); polling still happens while they run.
    """
    cycles: dict[int, ProbeCycle] = {}
    errors: dict[int, str] = {}
    lock = threading.Lock()

    def probe(gpu: GpuSample) -> None:
        try:
            if serial:
                with lock:
                    cycle = launcher(gpu, lambda _pid: None)
            else:
                cycle = launcher(gpu, lambda _pid: None)
            cycles[gpu.identity.index] = cycle
        except Exception as exc:  # a launcher bug must not take the whole check down
            log.exception("probe of GPU %d failed", gpu.identity.index)
            errors[gpu.identity.index] = f"{type(exc).__name__}: {exc}"

    threads = [
        threading.Thread(target=probe, args=(gpu,), name=f"probe-{gpu.identity.index}", daemon=True)
        for gpu in gpus
    ]
    for thread in threads:
        thread.start()
    load: dict[int, list[GpuSample]] = {gpu.identity.index: [] for gpu in gpus}
    while True:
        if poll is not None:
            try:
                snap = poll()
            except NvmlHung as hung:  # the probe's own deadline still ends it
                log.warning("NVML during the probe: %s; not polled again", hung)
                poll = None
            except Exception:
                log.exception("polling NVML during the probe failed")
                poll = None
            else:
                for sample in snap.gpus:
                    if sample.identity.index in load and sample.up:
                        load[sample.identity.index].append(sample)
        alive = [t for t in threads if t.is_alive()]
        if not alive:
            break
        alive[0].join(LOAD_POLL_SECONDS)

    probes: dict[int, GpuProbe] = {}
    for gpu in gpus:
        index = gpu.identity.index
        samples = tuple(load[index])
        cycle = cycles.get(index)
        if cycle is None:
            why = errors.get(index, "the probe did not run")
            failed = ProbeCycle("error", why, None, "", None, 0.0, None)
            probes[index] = GpuProbe(gpu, cycle=failed, load=samples)
            continue
        figures: tuple[GemmFigure, ...] = ()
        note = baseline_note
        if cycle.document and cycle.result in ("ok", "error"):
            try:
                figures = tuple(
                    evaluate(
                        cycle.document,
                        gpu.identity.uuid,
                        gpu.identity.name,
                        context,
                        store,
                        record=False,
                    )
                )
            except (BaselineStoreError, ValueError) as exc:
                note = f"baselines unavailable: {exc}"
                figures = tuple(
                    evaluate(cycle.document, gpu.identity.uuid, gpu.identity.name, context, None)
                )
        probes[index] = GpuProbe(
            gpu, cycle=cycle, figures=figures, load=samples, baseline_note=note
        )
    return probes
