#!/usr/bin/env python3
"""The loads of scripts/device/multi_gpu.py: a torch.distributed all-reduce job and a co-tenant.

    multi_gpu_job.py launch --ranks N --events DIR [--backend nccl|gloo] [--plan ...]
    multi_gpu_job.py cotenant --device cuda:1 --until EPOCH [--start-at EPOCH]

``launch`` starts one process per GPU (rank r on cuda:r, ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that
torch's index is NVML's) and waits for them; ``sparkdiag watch --pid`` of the launcher follows
them all. After the process group is up, rank 0 fixes a schedule every rank shares (absolute
times, written to ``DIR/events-rank0.jsonl``), and every rank runs its phases:

    lead       nothing (the driver starts its daemon and reads the counters before traffic)
    traffic    all-reduce of a large tensor, back to back (NVLink traffic)
    straggler  steps of bf16 matmuls then an all-reduce of the "gradients"; the driver puts a
               co-tenant on the straggler rank's GPU for this phase
    hang       the same steps; after ``hang_lead`` seconds the stop rank leaves: it stops calling
               the collective (``leave_the_collective``: it sleeps, alive, until killed) and the
               other ranks wait in their next all-reduce for good

Every loop ends when all ranks agree (a one-element MIN all-reduce each step), so no rank calls a
collective that the others have left, except the one that is meant to hang. With NCCL the job
sets ``TORCH_NCCL_BLOCKING_WAIT=1``: a rank's host then waits inside ``all_reduce`` (as a job that
reads its loss right after the collective does), where py-spy sees it. Per-step figures (compute
time by CUDA events, time in the collective, bytes all-reduced) go to ``events-rank{r}.jsonl``.

The machine's rules: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 in every process (a rank refuses to start without them); nothing here
asks for multicast memory.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
PHASES = ("lead", "traffic", "straggler", "hang_lead")
DEFAULT_PLAN = "lead=15,traffic=15,straggler=30,hang_lead=5"
# Sizes (elements of float32 for the traffic tensor, bf16 for the rest): a 256 MiB all-reduce is
# bandwidth-bound on NVLink; a matmul of 8192^3 takes ~1.6 ms on an H200 (760 TFLOPS cold).
REAL_SIZES = {"traffic": 64 << 20, "grad": 32 << 20, "matmul": 8192, "matmuls": 24}
DRY_SIZES = {"traffic": 1 << 18, "grad": 1 << 16, "matmul": 192, "matmuls": 6}


def parse_plan(text: str) -> dict[str, float]:
    plan = dict(item.split("=", 1) for item in DEFAULT_PLAN.split(","))
    for item in filter(None, text.split(",")):
        name, _, seconds = item.partition("=")
        if name not in PHASES:
            raise SystemExit(f"unknown phase {name!r} (phases: {', '.join(PHASES)})")
        plan[name] = seconds
    return {name: float(plan[name]) for name in PHASES}


def require_no_multicast(environ: dict[str, str] | os._Environ[str]) -> None:
    wrong = {k: environ.get(k) for k, v in NO_MULTICAST.items() if environ.get(k) != v}
    if wrong:
        raise SystemExit(f"refusing to start: the machine's rules need {NO_MULTICAST}, got {wrong}")


class Events:
    """One JSON line per event, flushed at once (the driver reads them while the job runs)."""

    def __init__(self, path: Path, rank: int) -> None:
        self.fh = path.open("a", encoding="utf-8")
        self.rank = rank

    def __call__(self, event: str, **fields: Any) -> None:
        line = {"t": time.time(), "rank": self.rank, "pid": os.getpid(), "event": event, **fields}
        self.fh.write(json.dumps(line) + "\n")
        self.fh.flush()


# -- one rank ---------------------------------------------------------------------------------


def run_rank(opts: argparse.Namespace) -> int:
    require_no_multicast(os.environ)
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    events = Events(Path(opts.events) / f"events-rank{rank}.jsonl", rank)
    gpu = opts.backend == "nccl"
    device = torch.device(f"cuda:{rank}") if gpu else torch.device("cpu")
    sizes = REAL_SIZES if gpu else DRY_SIZES
    if gpu:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    from datetime import timedelta

    kwargs: dict[str, Any] = {"timeout": timedelta(seconds=opts.timeout)}
    if gpu:
        kwargs["device_id"] = device  # NCCL communicators made now, before the schedule
    dist.init_process_group(opts.backend, rank=rank, world_size=world, **kwargs)
    uuid = str(torch.cuda.get_device_properties(device).uuid) if gpu else ""
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if gpu else ""
    events("up", device=str(device), uuid=uuid, torch=torch.__version__, nccl=nccl)

    def all_reduce(t: Any, op: Any = None) -> None:
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM)

    warm = torch.ones(1024, device=device)
    all_reduce(warm)
    begin = torch.tensor([time.time()], dtype=torch.float64, device=device)
    all_reduce(begin, dist.ReduceOp.MAX)  # every rank up: the latest clock starts the schedule
    plan = parse_plan(opts.plan)
    at: dict[str, float] = {}
    t = float(begin.item())
    for name in PHASES:
        at[name] = t
        t += plan[name]
    at["leave"] = t
    if rank == 0:
        events(
            "schedule",
            world=world,
            backend=opts.backend,
            at=at,
            plan=plan,
            stop_rank=opts.stop_rank,
            straggler_rank=opts.straggler_rank,
        )

    flag = torch.ones(1, device=device)

    def everyone_before(end: float) -> bool:
        flag.fill_(1.0 if time.time() < end else 0.0)
        all_reduce(flag, dist.ReduceOp.MIN)
        return bool(flag.item() > 0)

    sleep_until(at["traffic"])
    big = torch.ones(sizes["traffic"], device=device)
    ops, began = 0, time.time()
    while everyone_before(at["straggler"]):
        all_reduce(big)
        ops += 1
    events(
        "traffic", ops=ops, bytes_each=big.numel() * big.element_size(), seconds=time.time() - began
    )
    del big

    n = sizes["matmul"]
    dtype = torch.bfloat16 if gpu else torch.float32
    x = torch.randn(n, n, device=device, dtype=dtype)
    w = torch.randn(n, n, device=device, dtype=dtype) / n**0.5
    grad = torch.zeros(sizes["grad"], device=device, dtype=dtype)
    # dry (CPU): no co-tenant can slow one rank's CPU alone, so the straggler does more work
    matmuls = sizes["matmuls"] * (opts.dry_slow if not gpu and rank == opts.straggler_rank else 1)

    def step() -> tuple[float, float]:
        """One training-like step: compute, then the collective; (compute ms, collective ms)."""
        start = time.perf_counter()
        if gpu:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        y = x
        for _ in range(matmuls):
            y = torch.tanh(y @ w)
        grad[: min(grad.numel(), y.numel())] += y.flatten()[: grad.numel()]
        if gpu:
            e1.record()
        queued = time.perf_counter()
        all_reduce(grad)
        waited = time.perf_counter()
        if gpu:
            e1.synchronize()  # done already: the all-reduce waited on it
        compute = e0.elapsed_time(e1) if gpu else (queued - start) * 1e3
        return compute, (waited - queued) * 1e3

    for phase, end in (("straggler", at["hang_lead"]), ("hang_lead", at["leave"])):
        computes, waits = [], []
        while everyone_before(end):
            c, wt = step()
            computes.append(c)
            waits.append(wt)
        events(
            phase,
            steps=len(computes),
            compute_ms=median(computes),
            wait_ms=median(waits),
            bytes_each=grad.numel() * grad.element_size(),
        )

    if rank == opts.stop_rank:
        events("left", note="stops calling the collective; sleeps until killed")
        leave_the_collective()
    events("hang", note="calls the all-reduce the stop rank never joins")
    steps = 0
    while True:  # blocks in the first all_reduce: the stop rank never comes
        step()
        steps += 1
        events("step after leave", steps=steps)  # not expected: a collective went through


def leave_the_collective() -> None:
    """The stop rank's whole remaining life: alive, never calling the collective again."""
    while True:
        time.sleep(1.0)


def sleep_until(when: float) -> None:
    while (left := when - time.time()) > 0:
        time.sleep(min(left, 0.5))


def median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# -- the launcher -----------------------------------------------------------------------------


def launch(opts: argparse.Namespace) -> int:
    require_no_multicast(os.environ)
    Path(opts.events).mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        **NO_MULTICAST,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(opts.port),
        "WORLD_SIZE": str(opts.ranks),
        "PYTHONUNBUFFERED": "1",
    }
    if opts.backend == "nccl":
        # the host waits inside all_reduce; NCCL says at start what it took from the environment
        # (NVLS off) and how many channels it built (the SMs a waiting kernel keeps busy)
        env |= {
            "TORCH_NCCL_BLOCKING_WAIT": "1",
            "NCCL_DEBUG": "INFO",
            "NCCL_DEBUG_SUBSYS": "INIT,ENV",
        }
    passed = [
        "--backend",
        opts.backend,
        "--events",
        opts.events,
        "--plan",
        opts.plan,
        "--stop-rank",
        str(opts.stop_rank),
        "--straggler-rank",
        str(opts.straggler_rank),
        "--dry-slow",
        str(opts.dry_slow),
        "--timeout",
        str(opts.timeout),
    ]
    procs = []
    for rank in range(opts.ranks):
        log = (Path(opts.events) / f"rank{rank}.log").open("w")
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "rank", *passed],
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )

    def stop(signum: int, _frame: object) -> None:
        for proc in procs:
            proc.send_signal(signum)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    codes = [proc.wait() for proc in procs]
    return max(codes, key=abs)


# -- the co-tenant ----------------------------------------------------------------------------


def cotenant(opts: argparse.Namespace) -> int:
    """bf16 matmuls back to back on one GPU from ``start_at`` to ``until`` (on the CPU in a dry
    run: small float32 matmuls at a low duty cycle, a stand-in with a pid)."""
    require_no_multicast(os.environ)
    import torch

    gpu = opts.device.startswith("cuda")
    n = 8192 if gpu else 128
    if not gpu:
        torch.set_num_threads(1)
    a = torch.randn(n, n, device=opts.device, dtype=torch.bfloat16 if gpu else torch.float32)
    print(json.dumps({"pid": os.getpid(), "device": opts.device, "ready": time.time()}), flush=True)
    sleep_until(opts.start_at)
    iterations, began = 0, time.time()
    while time.time() < opts.until:
        for _ in range(20):
            a = torch.tanh(a @ a)
        if gpu:
            torch.cuda.synchronize()
        else:
            time.sleep(0.05)
        iterations += 20
    took = max(time.time() - began, 1e-9)
    tflops = 2 * n**3 * iterations / took / 1e12
    print(json.dumps({"iterations": iterations, "seconds": took, "tflops": tflops}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("launch", "rank"):
        p = sub.add_parser(name)
        p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
        p.add_argument("--events", required=True, help="directory for events and logs")
        p.add_argument("--plan", default="", help=f"phase seconds (default {DEFAULT_PLAN})")
        p.add_argument("--stop-rank", type=int, default=-1)
        p.add_argument("--straggler-rank", type=int, default=-1)
        p.add_argument("--dry-slow", type=int, default=3, help="gloo: the straggler's extra work")
        p.add_argument("--timeout", type=float, default=900.0, help="process group timeout, s")
        if name == "launch":
            p.add_argument("--ranks", type=int, required=True)
            p.add_argument("--port", type=int, default=29511)
    p = sub.add_parser("cotenant")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--start-at", type=float, default=0.0)
    p.add_argument("--until", type=float, required=True)
    opts = parser.parse_args(argv)
    if opts.what == "launch":
        return launch(opts)
    if opts.what == "rank":
        return run_rank(opts)
    return cotenant(opts)


if __name__ == "__main__":
    sys.exit(main())
