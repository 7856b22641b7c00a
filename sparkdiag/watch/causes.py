"""The causes ``sparkdiag watch`` can find: their names, titles, what a share of each means,
the fixed advice for each, and :class:`Cause`, one finding with its evidence.

The rules that find them are in :mod:`.diagnose`; the evidence and the advice that depends on
it in :mod:`.evidence`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

TITLES = {
    "co-tenant": "another process on the GPU",
    "input-starved": "input-starved",
    "data-prep-in-loop": "data prep in the loop",
    "host-sync": "host sync",
    "pageable-copies": "copies to the GPU",
    "recompiling": "recompiling",
    "logging": "logging in the loop",
    "optimizer-step": "optimizer step",
    "collective-wait": "waiting in a collective",
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
    "co-tenant": (
        "run on a GPU nobody else uses (nvidia-smi shows who is on each; CUDA_VISIBLE_DEVICES "
        "picks one), or ask the other process's owner to move",
        "isolate jobs that must share a GPU: MIG partitions (A100, H100, H200), or the "
        "EXCLUSIVE_PROCESS compute mode (nvidia-smi -c EXCLUSIVE_PROCESS) so a second process "
        "cannot start there; in Kubernetes, time-slicing shares the GPU between pods: request "
        "a whole GPU or a MIG instance",
    ),
    "data-prep-in-loop": (
        "prepare batches in DataLoader worker processes: a Dataset whose __getitem__ does this "
        "work, DataLoader(num_workers=4 or more, persistent_workers=True, pin_memory=True)",
        "do the work once instead of every step: tokenize or decode the dataset ahead of "
        "training (datasets.map with batched=True, saved to disk), or cache it",
        "use the batched, compiled path of the library (a fast tokenizer's batch encoding, "
        "torchvision.transforms.v2 on GPU tensors) rather than a Python loop per sample",
    ),
    "host-sync": (
        "keep the metric on the GPU: compute it with torch on the device tensors "
        "((logits.argmax(-1) == labels).float().mean()) and read back one number, not the "
        "tensor; torchmetrics accumulates on the GPU",
        "sync less often: accumulate on the GPU and call .item()/.cpu() every 50-100 steps, "
        "not every step",
        "where the values must come to the host, copy them into a pinned buffer with "
        "non_blocking=True and read them a step later, so the copy overlaps the next step",
    ),
    "pageable-copies": (
        "copy from pinned memory without waiting: DataLoader(pin_memory=True) (or "
        "tensor.pin_memory() once, for a buffer reused every step) and "
        ".to(device, non_blocking=True), so the copy overlaps the step",
        "copy less: keep data that fits on the GPU, send uint8 images and convert on the GPU, "
        "prefetch the next batch on a side stream",
    ),
    "recompiling": (
        "see why it recompiles: TORCH_LOGS=recompiles prints each guard that failed",
        "make the changing dimensions dynamic (torch.compile(dynamic=True), or "
        "torch._dynamo.mark_dynamic(x, dim)), or pad inputs to a few fixed sizes (buckets) "
        "so the shapes stop changing",
    ),
    "logging": (
        "log every N steps rather than every step, and keep what is logged on the GPU until "
        "then (each logged tensor is a host sync)",
        "hand logging to a background thread or an asynchronous logger",
    ),
    "optimizer-step": (
        "use the fused or foreach optimizer (torch.optim.AdamW(..., fused=True)) so the step "
        "is a few large kernels, not several per parameter",
        "if the optimizer state lives on the CPU (offload), keep it on the GPU when it fits",
    ),
    "collective-wait": (
        "find the rank the others wait for: py-spy dump --pid PID on every rank, "
        "NCCL_DEBUG=INFO; balance the work (or the data) between ranks",
        "overlap communication with computation (DDP buckets, FSDP prefetch) and check the "
        "path between ranks with sparkdiag check",
    ),
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
class Site:
    """A line of the job's code that took lost time (from its stacks): where, its text, the
    library frame it was in (``via``, "" where its own line decided) and its share of the
    window."""

    function: str
    file: str
    line: int
    text: str
    share: float
    via: str = ""


@dataclass(frozen=True)
class TopStack:
    """A whole stack that took lost time: its frames ("function (file:line)", outermost
    first) and its share of the window."""

    share: float
    frames: tuple[str, ...]


@dataclass(frozen=True)
class Tenant:
    """Another process on the job's GPU: who it is, the share of the GPU its kernels took while
    the job ran (NVML's per-process samples; None without them), the memory it held at most,
    the share of the window the job lost to it."""

    pid: int
    name: str
    user: str
    container_id: str
    pod_uid: str
    gpu_share: float | None
    memory_bytes: float | None
    lost: float


@dataclass(frozen=True)
class Cause:
    """One finding. ``share``: for the lost-time causes the time the GPU would otherwise have
    worked over the active window (0..1); for ``few-sms`` and ``low-tensor-activity`` what
    :data:`MEANING` says. ``lost`` tells the two apart. ``sites`` and ``stacks``: the lines and
    stacks of the job that took the time, where the job's stacks were sampled; ``tenants``:
    the other processes of a co-tenant cause."""

    name: str  # a key of TITLES
    share: float
    evidence: tuple[str, ...]
    actions: tuple[str, ...]
    lost: bool = True
    sites: tuple[Site, ...] = ()
    stacks: tuple[TopStack, ...] = ()
    tenants: tuple[Tenant, ...] = ()


RANKS_TIME = "of the ranks' time"  # a collective's wait seen without a GPU (ranks.py)


def meaning(name: str, lost: bool = True) -> str:
    """What a share of this cause is a share of, for a report (a collective's wait found
    without a GPU: of the ranks' time)."""
    if name == "collective-wait" and not lost:
        return RANKS_TIME
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


def amount(n: float) -> str:
    """Bytes in :func:`rate`'s units, without the time: ``1.2 GB``."""
    return rate(n).removesuffix("/s")
