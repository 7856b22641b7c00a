"""The causes ``sparkdiag watch`` can find: their names, titles, what a share of each means,
the fixed advice for each, and :class:`Cause`, one finding with its evidence.

The rules that find them are in :mod:`.diagnose`; the evidence and the advice that depends on
it in :mod:`.evidence`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

TITLES = {
    "input-starved": "input-starved",
    "stalled-kernel": "stalled kernel",
    "cpu-bound-launcher": "CPU-bound launcher",
    "checkpoint-stalls": "checkpoint stalls",
    "few-sms": "kernels keep few SMs busy",
    "throttled": "throttled",
    "memory-pressure": "memory pressure",
    "low-tensor-activity": "low tensor activity",
}
# What a cause's share is a share of. Lost-time causes: the time the GPU would otherwise have
# worked, over the active window; the two findings about how the GPU works: see their rules.
MEANING = {
    "few-sms": "of the time SMs sat idle while kernels ran",
    "low-tensor-activity": "of the time computing with tensor pipes idle",
}
LOST = "of the time lost"

ACTIONS: dict[str, tuple[str, ...]] = {
    "stalled-kernel": (
        "a collective waiting for a peer (NCCL): run every rank with NCCL_DEBUG=INFO "
        "(NCCL_DEBUG_SUBSYS=INIT,COLL) and compare each rank's last collective; py-spy dump "
        "--pid PID on each rank shows the one that is elsewhere (the peer the others wait for)",
        "make a hang fail instead of spinning: init_process_group(timeout=timedelta(minutes=5)) "
        "with TORCH_NCCL_ASYNC_ERROR_HANDLING=1, and TORCH_NCCL_TRACE_BUFFER_SIZE=2000 so the "
        "watchdog dumps what each rank was doing when it timed out",
        "check the path to the peer: sparkdiag check on both nodes (links, NIC), the NCCL "
        "library the job loads (a pip-installed NCCL against the system's one has hung on DGX "
        "Spark), NCCL_IB_HCA and the MTU",
        "not distributed: a kernel that spins on a flag nobody sets (a custom kernel, a "
        "device-side wait): find it with nsys profile or compute-sanitizer",
    ),
    "cpu-bound-launcher": (
        "launch fewer, larger kernels: a larger batch, torch.compile to fuse small operations",
        "capture the step in a CUDA graph (torch.compile(mode='reduce-overhead') or "
        "torch.cuda.graphs) so the CPU no longer launches each kernel",
        "remove host syncs from the loop (.item(), .cpu(), printing tensors every step)",
    ),
    "checkpoint-stalls": (
        "checkpoint asynchronously (torch.distributed.checkpoint.async_save, or copy the state "
        "to pinned CPU memory and write it from a background thread)",
        "checkpoint less often, and to fast local storage (NVMe) rather than a network share",
    ),
    "few-sms": (
        "give each kernel more work: a larger batch (or more sequences at once), so that every "
        "SM has blocks to run",
        "fuse chains of small operations (torch.compile) and look in a profile (torch.profiler, "
        "nsys) for a serial kernel: one block doing a reduction or scan over a long dimension",
    ),
    "throttled": (
        "check cooling and airflow (fans, intakes, inlet temperature) and the power supply; "
        "run sparkdiag check and nvidia-smi -q -d PERFORMANCE,TEMPERATURE",
        "compare the temperatures with the slowdown threshold; on a DGX Spark give it free "
        "space around it",
    ),
    "memory-pressure": (
        "use less host memory (smaller batches or prefetch queues, fewer loader workers) and "
        "keep swap out of the training path",
        "on unified memory (DGX Spark) the page cache competes with CUDA: drop caches before "
        "the run (sync; echo 3 | sudo tee /proc/sys/vm/drop_caches)",
    ),
    "low-tensor-activity": (
        "put the math on tensor cores: torch.set_float32_matmul_precision('high') (TF32) or "
        "train in bf16 with torch.autocast",
        "keep matrix dimensions multiples of 8 (16 for fp8) so the fast kernels apply",
    ),
}


@dataclass(frozen=True)
class Cause:
    """One finding. ``share``: for the lost-time causes the time the GPU would otherwise have
    worked over the active window (0..1); for ``few-sms`` and ``low-tensor-activity`` what
    :data:`MEANING` says. ``lost`` tells the two apart."""

    name: str  # a key of TITLES
    share: float
    evidence: tuple[str, ...]
    actions: tuple[str, ...]
    lost: bool = True


def meaning(name: str) -> str:
    """What a share of this cause is a share of, for a report."""
    return MEANING.get(name, LOST)


def mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def pct(x: float) -> str:
    return f"{x * 100:.0f} %"


def fine_pct(x: float) -> str:
    """A small ratio readably: 0.76 %, 0.0004 %, 0 %."""
    if x == 0:
        return "0 %"
    if x >= 0.1:
        return pct(x)
    return f"{x * 100:.2g} %"


def rate(bps: float) -> str:
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} B/s"
