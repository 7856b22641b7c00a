"""Another process on the job's GPU: who it is and what it took. The processes come from NVML's
compute process list (``nvidia-smi --query-compute-apps``) at the ticks where the job was seen
there too (where NVML cannot name the job's own processes, another PID namespace, nobody is a
co-tenant: the job itself might be the one listed); what each took, from NVML's per-process
utilization samples (``nvidia-smi pmon``). A pure function of the recording."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from sparkdiag.watch.causes import ACTIONS, Cause, Tenant, mean, pct
from sparkdiag.watch.evidence import Context
from sparkdiag.watch.model import ProcessInfo
from sparkdiag.watch.views import ACTIVE_MIN, View

GIB = 2**30
# A window shorter than this reads the share to about 0.1 either way: NVML refreshes its
# per-process samples every few seconds and splits the GPU differently from block to block
# (H200, ResNet-50 beside a matmul loop: 8 s windows 8 and 13 points over and 9 under the
# throughput truth, 30 s ones 9, 5 and 1 under; docs/watch.md).
STEADY_SECONDS = 30.0


@dataclass
class _Seen:
    sm: list[float] = field(default_factory=list)
    memory: list[float] = field(default_factory=list)
    ticks: int = 0


def _running(v: View) -> bool:
    """The job ran kernels of its own in the tick: the ticks in which it could lose the GPU to
    another process (diagnose's co-tenant rule)."""
    return v.on_gpu and v.util >= ACTIVE_MIN


def _seen(ctx: Context) -> tuple[dict[int, _Seen], int]:
    """Per other pid what it took over the window's ticks in which the job ran kernels, and how
    many those were."""
    found: dict[int, _Seen] = {}
    on = 0
    for v in ctx.win:
        if not _running(v):
            continue
        on += 1
        for g in ctx.rec.ticks[v.tick].gpus:
            if g.index not in ctx.gpus:
                continue
            for o in g.others:
                seen = found.setdefault(o.pid, _Seen())
                seen.ticks += 1
                if o.sm is not None:
                    seen.sm.append(o.sm)
                if o.memory_bytes is not None:
                    seen.memory.append(o.memory_bytes)
    return found, on


def _who(pid: int, info: ProcessInfo | None) -> str:
    if info is None or not info.name:
        return f"pid {pid} (not visible from here: another container or PID namespace)"
    parts = [f"user {info.user}"] if info.user else []
    if info.container_id:
        parts.append(f"container {info.container_id[:12]}")
    if info.pod_uid:
        parts.append(f"pod {info.pod_uid}")
    return f"pid {pid} {info.name}" + (f" ({', '.join(parts)})" if parts else "")


def tenants(ctx: Context, share: float) -> tuple[Tenant, ...]:
    """The other processes seen, the busiest first, each with its part of ``share``."""
    found, on = _seen(ctx)
    known = {p.pid: p for p in ctx.rec.tenants}
    took = {pid: (sum(s.sm) / on if on else 0.0) for pid, s in found.items()}
    total = sum(took.values())
    out = []
    for pid in sorted(found, key=lambda p: -took[p]):
        seen, info = found[pid], known.get(pid, ProcessInfo(pid))
        out.append(
            Tenant(
                pid=pid,
                name=info.name,
                user=info.user,
                container_id=info.container_id,
                pod_uid=info.pod_uid,
                gpu_share=took[pid] if seen.sm else None,
                memory_bytes=max(seen.memory) if seen.memory else None,
                lost=share * took[pid] / total if total > 0 else 0.0,
            )
        )
    return tuple(out)


def cotenant_cause(ctx: Context, share: float) -> Cause:
    found = tenants(ctx, share)
    evidence = []
    for t in found:
        info = ProcessInfo(t.pid, t.name, t.user, t.container_id, t.pod_uid)
        held = "" if t.memory_bytes is None else f", holding {t.memory_bytes / GIB:.1f} GiB"
        took = "" if t.gpu_share is None else f" {pct(t.gpu_share)} of the time"
        evidence.append(
            f"{_who(t.pid, info)} ran kernels on the job's GPU{took} while the job ran "
            f"(NVML's per-process samples){held}"
        )
    job = mean([v.util for v in ctx.win if _running(v)])
    busy = mean([v.util + v.others for v in ctx.win if _running(v)])
    if job is not None and busy is not None:
        evidence.append(
            f"the job's own kernels ran {pct(job)} of the time, the GPU was busy {pct(busy)} in "
            "all: the utilization the GPU reports counts the other process's kernels too"
        )
    evidence.append(
        f"{pct(share)} of the time the job would otherwise have worked went to the other "
        "process (an estimate: it assumes the job had work queued meanwhile, as a job bound by "
        "its GPU has; one that waits for its data loses less)"
    )
    seconds = ctx.end - ctx.start
    if seconds < STEADY_SECONDS:
        evidence.append(
            f"over this {int(seconds)} s window the share is good to about 10 points either way "
            "(NVML's per-process samples change every few seconds): a window of "
            f"{STEADY_SECONDS:.0f} s or more (the job's steady part, watched longer) reads closer"
        )
    return Cause("co-tenant", share, tuple(evidence), ACTIONS["co-tenant"], tenants=found)


def unmeasured(ctx: Context) -> list[str]:
    """Notes for the other processes seen on the GPU whose utilization NVML did not give."""
    found, on = _seen(ctx)
    known = {p.pid: p for p in ctx.rec.tenants}
    notes = []
    for pid, seen in sorted(found.items()):
        if seen.sm or not on:
            continue
        held = f", holding {statistics.median(seen.memory) / GIB:.1f} GiB" if seen.memory else ""
        notes.append(
            f"{_who(pid, known.get(pid))} was on the job's GPU {pct(seen.ticks / on)} of the "
            f"time{held}; NVML gave no per-process utilization here, so what it took is not known"
        )
    return notes
