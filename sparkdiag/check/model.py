"""What a check sees (:class:`CheckContext`) and what it says (:class:`CheckResult`).

A check is a small function ``(CheckContext) -> list[CheckResult]``: one result, or one per GPU
where the condition is per GPU. It reads only the context, never the hardware, so every outcome
can be driven from fixtures. The context is gathered once per run (:mod:`sparkdiag.check.gather`).
The host readings it carries (:class:`KernelLog`, :class:`TorchInfo`) are the sources' own
dataclasses (:mod:`sparkdiag.sources.host.kernel_log`, :mod:`sparkdiag.sources.software.packages`),
re-exported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sparkdiag.baseline.evaluate import GemmFigure
from sparkdiag.baseline.keeper import StoreReport
from sparkdiag.config import DEFAULTS
from sparkdiag.errors import Exit
from sparkdiag.link.model import LinkReport
from sparkdiag.link.readings import FabricReadings
from sparkdiag.probe.document import WorkerDocument
from sparkdiag.probe.runner import ProbeCycle
from sparkdiag.snapshot import GpuSample, Snapshot
from sparkdiag.soak.state import StateReport as SoakStateReport
from sparkdiag.sources.host.kernel_log import KernelLog as KernelLog
from sparkdiag.sources.host.procfs import DeviceHolder
from sparkdiag.sources.software.cuda_libraries import LibraryScan
from sparkdiag.sources.software.packages import TorchInfo as TorchInfo
from sparkdiag.storage.evaluate import StorageReport
from sparkdiag.telemetry.busy import Busy, busy, other_pids

Status = Literal["pass", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = ("pass", "warn", "fail", "skip")
# Rank for "worst": skip never makes a run worse than pass.
_RANK = {"skip": 0, "pass": 1, "warn": 2, "fail": 3}
# The exit status of a run, from its status (sparkdiag.errors.Exit: a failed check is FAILED). A
# run that judged nothing (every check skipped, or no GPU checked: run_status) is "look at it":
# a machine without a GPU used to end "fit to benchmark" with exit 0 and "status": "pass".
EXIT_CODES = {"pass": Exit.OK, "skip": Exit.ATTENTION, "warn": Exit.ATTENTION, "fail": Exit.FAILED}


@dataclass(frozen=True)
class CheckResult:
    """One verdict.

    name: the check's name (``memory-temperature``)
    status: pass, warn, fail or skip
    finding: one line with the measured value ("memory 91 °C ≥ 85 °C")
    action: what to do about it; empty when there is nothing to do
    gpu: NVML index of the GPU it is about, as text; None for machine-wide checks
    data: the measured values, machine-readable (for --json)
    """

    name: str
    status: Status
    finding: str
    action: str = ""
    gpu: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "gpu": self.gpu,
            "finding": self.finding,
            "action": self.action,
            "data": dict(self.data),
        }


def worst(statuses: list[Status] | tuple[Status, ...]) -> Status:
    """The worst status: fail > warn > pass; ``skip`` only when every status is skip (or none)."""
    if not statuses:
        return "skip"
    return max(statuses, key=lambda s: _RANK[s])


def exit_code(statuses: list[Status] | tuple[Status, ...]) -> int:
    """0 when everything passed (some may be skipped), 1 for a warning or when every check was
    skipped, 3 for a failure."""
    return int(EXIT_CODES[worst(statuses)])


def gpu_unchecked(results: Sequence[CheckResult]) -> bool:
    """No GPU was checked: the ``gpus`` row is there and skipped (no NVML, or none listed)."""
    gpus = [r for r in results if r.name == "gpus"]
    return bool(gpus) and all(r.status == "skip" for r in gpus)


def run_status(results: Sequence[CheckResult]) -> Status:
    """The status of a whole run: the worst of its results, except that a run with no GPU
    checked is ``skip`` (nothing judged) where the host rows alone would say ``pass``."""
    status = worst([r.status for r in results])
    return "skip" if status == "pass" and gpu_unchecked(results) else status


def run_exit_code(results: Sequence[CheckResult]) -> int:
    """The exit status of a run (:data:`EXIT_CODES` of :func:`run_status`)."""
    return int(EXIT_CODES[run_status(results)])


@dataclass(frozen=True)
class GpuProbe:
    """The short probe on one GPU, or why it did not run.

    cycle: the worker's cycle (real or replayed); None when the worker was not started
    skipped: why the worker was not started (``--quick``, GPU busy, no torch ...)
    figures: each kernel compared with its stored baseline and built-in reference
    load: this GPU as polled while the probe ran (for "under load" conditions)
    baseline_note: why no baseline could be looked up (store unavailable); None otherwise
    """

    gpu: GpuSample
    cycle: ProbeCycle | None = None
    skipped: str | None = None
    figures: tuple[GemmFigure, ...] = ()
    load: tuple[GpuSample, ...] = ()
    baseline_note: str | None = None

    @property
    def document(self) -> WorkerDocument | None:
        return None if self.cycle is None else self.cycle.document


@dataclass(frozen=True)
class StorageProbe:
    """``check --storage DIR``: the probe's report, or why there is none (``refused``: nothing
    was written, the directory would be hurt or cannot be measured)."""

    report: StorageReport | None
    error: str | None = None
    refused: bool = False


@dataclass(frozen=True)
class CheckContext:
    """Everything the checks read, gathered once.

    snapshot: one poll of NVML, the host PCIe links, the execution context and host memory
    quick: ``--quick``: nothing that loads the GPU ran
    expect_gpus: the GPU count the user expects (``--expect-gpus``), None when not given
    probes: the probe per GPU index; empty when no probe ran at all (see ``probe_skipped``)
    probe_skipped: why no probe ran on any GPU (``--quick``, no torch ...); None when it ran
    torch: the torch the worker would import
    governors: cpu name -> cpufreq governor; None when sysfs has no cpufreq (reason in
        ``governor_note``)
    kernel_log: the kernel log for XID events
    baseline_store: what was found of the baseline store (None: not looked at)
    soak: what was found of the latest soak per GPU (None: not looked at)
    process_names: pid -> command name, for the pids NVML reports
    own_pids: pids that are sparkdiag's own (never "another process on the GPU")
    fabric: the ConnectX-7 functions, NCCL settings and libraries, CMA (None: not read)
    peer_link: the short link test against ``--peer``; peer_error: why it could not be done
    stall_samples: the busy GPUs' samples over a few seconds (``check/stall_checks.py``)
    nvml_lost: why NVML stopped answering after the first poll (a later poll hung past
        ``--nvml-timeout``); None when it answered throughout
    service_state: the systemd service's state directory where it is there and is not the one
        read (``statedir.service_state``); None otherwise
    nvme_logs: the root timer's SMART log directory where it is there and none was given
        (``nvme_tools.timer_logs``); None otherwise
    libraries: the libraries with GPU code in the probe worker's Python (None: not read, why in
        ``libraries_note``)
    device_holders: processes with an NVIDIA device file open (read on unified memory only)
    storage: the storage probe of ``--storage DIR`` (``check/storage_checks.py``)
    """

    snapshot: Snapshot
    quick: bool = False
    expect_gpus: int | None = None
    probes: Mapping[int, GpuProbe] = field(default_factory=dict)
    probe_skipped: str | None = None
    torch: TorchInfo | None = None
    governors: Mapping[str, str] | None = None
    governor_note: str = ""
    kernel_log: KernelLog | None = None
    baseline_store: StoreReport | None = None
    soak: SoakStateReport | None = None
    process_names: Mapping[int, str] = field(default_factory=dict)
    own_pids: frozenset[int] = frozenset()
    busy_utilization: float = DEFAULTS["probe_busy_utilization"]
    fabric: FabricReadings | None = None
    peer_link: LinkReport | None = None
    peer_error: str | None = None
    # GPU index -> samples taken over a few seconds of the GPUs busy at the first poll (stall)
    stall_samples: Mapping[int, tuple[GpuSample, ...]] = field(default_factory=dict)
    nvml_lost: str | None = None
    service_state: Path | None = None
    nvme_logs: Path | None = None
    libraries: LibraryScan | None = None
    libraries_note: str = ""
    device_holders: tuple[DeviceHolder, ...] | None = None
    # check --storage DIR: the storage probe of that directory; None when not asked for
    storage: StorageProbe | None = None

    def gpus_up(self) -> tuple[GpuSample, ...]:
        return tuple(g for g in self.snapshot.gpus if g.up)

    def other_pids(self, gpu: GpuSample) -> list[int]:
        """Compute processes on ``gpu`` that are not sparkdiag's own; [] when unknown."""
        return list(other_pids(gpu, self.own_pids | self.snapshot.excluded_pids))

    def busy(self, gpu: GpuSample) -> Busy | None:
        """Why ``gpu`` counts as busy (the daemon's rule), or None when it is idle."""
        return busy(gpu, self.own_pids | self.snapshot.excluded_pids, self.busy_utilization)

    def describe_pid(self, pid: int) -> str:
        name = self.process_names.get(pid)
        return f"pid {pid} ({name})" if name else f"pid {pid}"


STATE_DIRECTORY = "state directory "  # how statedir's errors begin


def elsewhere_action(ctx: CheckContext, what: str) -> str:
    """What to do where the systemd service keeps ``what`` in a state directory this run did
    not read; "" where there is none."""
    if ctx.service_state is None:
        return ""
    return (
        f"the sparkdiag service keeps {what} in {ctx.service_state} (systemd's StateDirectory), "
        f"not in the directory read here: run this as root with --state-dir {ctx.service_state} "
        "to read the service's"
    )


def state_action(detail: str, otherwise: str) -> str:
    """The action of a row about a file in the state directory: ``otherwise``, unless the
    directory itself is what is wrong (not a directory, a link to nothing), which its finding
    says with what to do; the baselines, soak and storage rows then all say the same."""
    if detail.startswith(STATE_DIRECTORY):
        return "fix the state directory as the finding says: sparkdiag keeps all its state there"
    return otherwise


SEE = "see"  # a result's data key naming the row that says why it was skipped


def no_gpu_skip(name: str, snapshot: Snapshot, **data: Any) -> CheckResult:
    """The skip of a GPU check on a machine with no GPU to check. The ``nvml`` row (NVML is
    down) or the ``gpus`` row (NVML lists none) says why, once; this row refers to it by name
    (``data["see"]``), and the table shows every row that refers to the same one as one row
    (``check/report.py``). Where GPUs are listed but every one is lost, the reason is its own."""
    if not snapshot.nvml_up:
        return CheckResult(
            name, "skip", "not run without a GPU (see nvml)", data={**data, SEE: "nvml"}
        )
    if not snapshot.gpus and name != "gpus":
        return CheckResult(
            name, "skip", "not run without a GPU (see gpus)", data={**data, SEE: "gpus"}
        )
    return CheckResult(name, "skip", no_gpu_reason(snapshot), data=data)


def no_gpu_reason(snapshot: Snapshot) -> str:
    """Why there is no GPU to check, in one line."""
    if not snapshot.nvml_up:
        status = snapshot.collectors.get("nvml")
        why = status.error if status is not None and status.error else "unknown reason"
        return f"no GPU: NVML unavailable ({why})"
    if not snapshot.gpus:
        return "no GPU: NVML reports none"
    return "no GPU up: every GPU is lost"


def gpu_index(gpu: GpuSample) -> str:
    """The GPU column of a result: the NVML index as text."""
    return str(gpu.identity.index)
