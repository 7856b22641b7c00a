"""Machine-wide checks: execution context, CPU frequency governor, unified-memory headroom and
pressure."""

from __future__ import annotations

from collections import Counter

from sparkdiag.check.model import CheckContext, CheckResult, no_gpu_skip
from sparkdiag.platforms import describe

# Unified memory (GB10): the GPU allocates from host memory.
UNIFIED_FAIL_AVAILABLE = 0.10
UNIFIED_WARN_AVAILABLE = 0.25
UNIFIED_WARN_CACHE = 0.20
# Memory pressure (PSI, share of the last 60 s). "full" means every non-idle task was stalled
# waiting for memory: at 10 % the machine loses a tenth of its time to reclaim and swap, the
# thrashing that precedes the NV_ERR_NO_MEMORY hangs GB10 owners had to power-cycle (the
# SparkdiagUnifiedMemoryPressure alert uses the same figure). "some" means at least one task
# waited: at 10 % reclaim competes with the work being measured, so results are noisy.
PSI_FULL_FAIL = 0.10
PSI_SOME_WARN = 0.10
DROP_CACHES = "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches"
GB = 1e9


def check_context(ctx: CheckContext) -> list[CheckResult]:
    """Native passes; a container warns (a gap of up to 40% has been seen)."""
    context = ctx.snapshot.context
    if context is None:
        return [CheckResult("context", "skip", "execution context not detected")]
    data = {
        "context": context.context,
        "runtime": context.runtime,
        "evidence": list(context.evidence),
    }
    if context.context == "container":
        evidence = "; ".join(context.evidence[:2])
        return [
            CheckResult(
                "context",
                "warn",
                f"inside a container ({context.runtime}"
                + (f": {evidence}" if evidence else "")
                + ")",
                "results can differ from native (gaps up to 40% are reported): measure the gap "
                f"from the host with sparkdiag compare -- {_starter(context.runtime)}",
                data=data,
            )
        ]
    weak = next((e for e in context.evidence if e.startswith(ONE_KIND)), None)
    if weak is not None:
        # a container sign was seen, and the row said "no container detected"
        finding = f"native: one kind of container sign only, not enough ({weak[len(ONE_KIND) :]})"
        return [CheckResult("context", "pass", finding, data=data)]
    return [CheckResult("context", "pass", "native (no container detected)", data=data)]


ONE_KIND = "only one weak signal: "  # sources/host/context.py's native verdict on one kind


def _starter(runtime: str) -> str:
    """The command that starts a Python in a container of this runtime, for ``compare --``."""
    if runtime in ("docker", "podman"):
        return f"{runtime} run -i --rm --gpus all <image> python3 -"
    return "<command that starts python3 - in the container>"


def check_governor(ctx: CheckContext) -> list[CheckResult]:
    """Every CPU on the ``performance`` cpufreq governor."""
    governors = ctx.governors
    if governors is None:
        return [CheckResult("cpu-governor", "skip", ctx.governor_note or "no cpufreq governor")]
    counts = Counter(governors.values())
    data = {"governors": dict(counts), "cpus": len(governors)}
    if set(counts) == {"performance"}:
        return [
            CheckResult(
                "cpu-governor", "pass", f"performance on all {len(governors)} CPUs", data=data
            )
        ]
    shown = ", ".join(f"{name} on {n}" for name, n in counts.most_common())
    return [
        CheckResult(
            "cpu-governor",
            "warn",
            f"{shown} of {len(governors)} CPUs (not performance)",
            "sudo cpupower frequency-set -g performance (until reboot)",
            data=data,
        )
    ]


def check_unified_memory(ctx: CheckContext) -> list[CheckResult]:
    """On a unified-memory GPU (GB10), host memory is GPU memory: available memory, page cache and
    memory pressure (PSI)."""
    name = "unified-memory"
    unified = [g for g in ctx.gpus_up() if g.identity.memory_model == "unified"]
    if not ctx.gpus_up():
        return [no_gpu_skip(name, ctx.snapshot)]
    if not unified:
        why = "GPU has its own memory"
        return [CheckResult(name, "skip", f"not a unified-memory machine ({why})")]
    host = ctx.snapshot.host
    memory = host.memory_bytes if host is not None else {}
    total, available = memory.get("total"), memory.get("available")
    if not total or available is None:
        return [CheckResult(name, "skip", "host memory not readable")]
    free, cached = memory.get("free"), memory.get("cached")
    pressure = host.pressure if host is not None else None
    some = pressure.averages.get("some", {}).get("60s") if pressure is not None else None
    full = pressure.averages.get("full", {}).get("60s") if pressure is not None else None
    data = {
        "total": total,
        "available": available,
        "free": free,
        "cached": cached,
        "psi_some_60s": some,
        "psi_full_60s": full,
        "swap_in_pages": host.swap_in_pages if host is not None else None,
        "platform": describe(ctx.snapshot.platform),
    }
    text = f"available {available / GB:.1f} of {total / GB:.1f} GB ({available / total:.0%})"
    if free is not None:
        text += f", free {free / GB:.1f} GB"
    if cached is not None:
        text += f", page cache {cached / GB:.1f} GB"
    if some is not None and full is not None:
        text += f"; stalled on memory {some:.0%} (some) / {full:.0%} (full) of the last minute"
    stop = "stop what holds the memory (sustained unified-memory pressure has wedged GB10 hosts)"
    if full is not None and full >= PSI_FULL_FAIL:
        return [
            CheckResult(
                name,
                "fail",
                text,
                f"{stop}: every task is waiting for memory; free it before benchmarking (lower "
                f"the framework's GPU memory share or batch size), then {DROP_CACHES}",
                data=data,
            )
        ]
    if available < UNIFIED_FAIL_AVAILABLE * total:
        return [CheckResult(name, "fail", text, f"{stop}, then {DROP_CACHES}", data=data)]
    if available < UNIFIED_WARN_AVAILABLE * total:
        return [CheckResult(name, "warn", text, f"{stop}, then {DROP_CACHES}", data=data)]
    if some is not None and some >= PSI_SOME_WARN:
        return [
            CheckResult(
                name,
                "warn",
                text,
                "the kernel is reclaiming memory while work runs (results will be noisy): "
                f"find what grows (ps -eo rss,comm --sort=-rss | head), then {DROP_CACHES}",
                data=data,
            )
        ]
    # The page cache's own advice (how large a model fits now) is the gpu-memory row's where
    # /proc/meminfo gave what it needs (memory_checks.py); this row keeps it otherwise.
    if (
        cached is not None
        and cached >= UNIFIED_WARN_CACHE * total
        and (host is None or host.obtainable_bytes is None)
    ):
        return [
            CheckResult(
                name,
                "warn",
                text,
                f"{DROP_CACHES} (CUDA on unified memory does not count page cache as free: "
                "large allocations can fail)",
                data=data,
            )
        ]
    return [CheckResult(name, "pass", text, data=data)]
