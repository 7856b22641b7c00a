"""Copies: the device-to-device copy (``bandwidth``) and the host-device copies
(``transfers``: pinned and pageable host memory, small and large, both directions), each kind's
data checked once before it is timed."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from sparkdiag.probe.worker.contract import TRANSFER_LARGE_BYTES, TRANSFER_SMALL_BYTES
from sparkdiag.probe.worker.dtypes import DeviceInfo, classify_exception
from sparkdiag.probe.worker.plan import Budget
from sparkdiag.probe.worker.timing import (
    LaunchModel,
    choose_iters,
    figures,
    min_batch_ms,
    time_batch,
)

SMALL_TRANSFER_LARGE_BYTES = 16 * 1024**2  # the large copies with --small


def run_bandwidth(
    info: DeviceInfo, args: argparse.Namespace, budget: Budget, small: bool
) -> dict[str, Any]:
    """Device-to-device copy: delivered and peak in bytes/s (bytes read plus bytes written)."""
    torch = info.torch
    weight = args.kind_weights.get("bandwidth", 1.0)
    result: dict[str, Any] = {
        "status": "ok",
        "reason": None,
        "delivered": None,
        "peak": None,
        "bytes": None,
        "median_ms": None,
        "total_ms": None,
        "iters": 0,
    }
    try:
        if small:
            size = 16 * 1024**2
        elif info.is_cuda:
            free, _total = torch.cuda.mem_get_info()
            size = min(1024**3, max(64 * 1024**2, int(free) // 8))
        else:
            size = 256 * 1024**2
        n = size // 4
        src = torch.randn(n, device=info.device, dtype=torch.float32)
        dst = torch.empty_like(src)

        def copy(s: Any, d: Any) -> Any:
            return d.copy_(s)

        sets = [(src, dst)]
        copy(src, dst)
        if not bool(torch.equal(dst[:65536], src[:65536])) or not bool(
            torch.equal(dst[-65536:], src[-65536:])
        ):
            result.update(status="error", reason="device copy produced wrong data")
            return result
        launch = LaunchModel(args.launch_us, args.max_prequeue_ms)
        warm = time_batch(info, copy, sets, max(1, args.warmup), 0, launch)
        budget.busy += warm.total_ms / 1e3
        share = budget.share(weight)
        iters = choose_iters(
            args.iters,
            warm.iter_ms,
            share,
            0.0,
            args.min_iters,
            args.max_iters,
            min_batch_ms(args, info),
        )
        timed = time_batch(info, copy, sets, iters, 0, launch)
        budget.busy += timed.total_ms / 1e3
        moved = 2 * n * 4  # bytes read plus bytes written
        delivered, peak = figures(moved, timed.iter_ms, timed.total_ms)
        result.update(
            bytes=moved,
            delivered=delivered,
            peak=peak,
            median_ms=statistics.median(timed.iter_ms),
            total_ms=timed.total_ms,
            iters=iters,
        )
        return result
    except Exception as exc:
        status, why = classify_exception(exc)
        result.update(status=status, reason=why)
        return result
    finally:
        budget.done(weight)
        if info.is_cuda:
            torch.cuda.empty_cache()


def _transfer_entry(
    direction: str, memory: str, size: int, copies: int, status: str, reason: str | None
) -> dict[str, Any]:
    """A host-device copy's entry: delivered in bytes/s over total_ms (all copies, gaps in)."""
    return {
        "direction": direction,
        "memory": memory,
        "size_bytes": size,
        "copies": copies,
        "status": status,
        "reason": reason,
        "delivered": None,
        "total_ms": None,
    }


def transfer_plan(args: argparse.Namespace, small: bool) -> list[tuple[str, int, int, str]]:
    """(memory, size, copies, direction) in the order they run: pinned first, then pageable;
    many small copies, then a few large ones; host to device, then device to host."""
    large = SMALL_TRANSFER_LARGE_BYTES if small else TRANSFER_LARGE_BYTES
    plan = []
    for memory in ("pinned", "pageable"):
        for size, copies in (
            (TRANSFER_SMALL_BYTES, args.transfer_small_copies),
            (large, args.transfer_large_copies),
        ):
            for direction in ("h2d", "d2h"):
                plan.append((memory, size, copies, direction))
    return plan


def measure_copies(
    info: DeviceInfo,
    copy: Callable[[], Any],
    verify: Callable[[], bool],
    entry: dict[str, Any],
    budget: Budget,
) -> dict[str, Any]:
    """One untimed copy whose data ``verify`` checks, then ``entry["copies"]`` timed copies.

    Timed as an application's copy loop sees it: from an event before the first copy to one
    after the last (perf_counter on CPU), the CPU's launch cost included, no prequeue hold.
    Both the checked copy and the timed ones are charged to the budget.
    """
    torch = info.torch
    size, copies = entry["size_bytes"], entry["copies"]

    def timed(count: int) -> float:
        if not info.is_cuda:
            t0 = time.perf_counter()
            for _ in range(count):
                copy()
            return (time.perf_counter() - t0) * 1e3
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(count):
            copy()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end))

    first = timed(1)
    budget.busy += first / 1e3
    if not verify():
        entry.update(status="error", reason=f"{entry['direction']} copy produced wrong data")
        return entry
    total = timed(copies)
    budget.busy += total / 1e3
    entry.update(total_ms=total, delivered=size * copies / (total / 1e3) if total > 0 else None)
    return entry


def _copy_pair(
    torch: Any, direction: str, truth: Any, host_truth: Any, pinned: bool
) -> tuple[Callable[[], Any], Callable[[], bool]]:
    """The copy of one direction and the check of its data.

    ``truth`` is random data on the device and ``host_truth`` the same data in host memory:
    h2d copies host_truth into a device buffer and compares it with truth on the device; d2h
    copies truth into a zeroed host buffer and compares it with host_truth.
    """
    if direction == "h2d":
        dev = torch.empty_like(truth)

        def copy_h2d() -> Any:
            return dev.copy_(host_truth, non_blocking=True)

        def verify_h2d() -> bool:
            return bool(torch.equal(dev, truth))

        return copy_h2d, verify_h2d
    host = torch.zeros(truth.numel(), dtype=truth.dtype, pin_memory=pinned)

    def copy_d2h() -> Any:
        return host.copy_(truth, non_blocking=True)

    def verify_d2h() -> bool:
        torch.cuda.synchronize()
        return bool(torch.equal(host, host_truth))

    return copy_d2h, verify_d2h


def _one_transfer(info: DeviceInfo, entry: dict[str, Any], budget: Budget) -> None:
    """Allocate, fill, check and time one kind of copy; its buffers go when it returns."""
    torch = info.torch
    pinned = entry["memory"] == "pinned"
    words = entry["size_bytes"] // 8
    truth = torch.randint(-(2**62), 2**62, (words,), device=info.device, dtype=torch.int64)
    host_truth = torch.empty(words, dtype=torch.int64, pin_memory=pinned)
    host_truth.copy_(truth)
    copy, verify = _copy_pair(torch, entry["direction"], truth, host_truth, pinned)
    measure_copies(info, copy, verify, entry, budget)


def run_transfers(
    info: DeviceInfo, args: argparse.Namespace, budget: Budget, small: bool
) -> list[dict[str, Any]]:
    """Host-device copies: pinned and pageable host memory, small and large, both directions.

    The data of each kind of copy is checked once against what was sent. On a GPU without
    unified memory this measures the PCIe link in transfer terms (Gen5 x16: 64 GB/s per
    direction in theory); on GB10 small pageable copies were reported ~50x slower than pinned.
    """
    plan = transfer_plan(args, small)
    if not info.is_cuda:
        why = "host-device copies need a CUDA device; --device cpu has none"
        return [_transfer_entry(d, m, s, c, "unsupported", why) for m, s, c, d in plan]
    entries: list[dict[str, Any]] = []
    for memory, size, copies, direction in plan:
        entry = _transfer_entry(direction, memory, size, copies, "ok", None)
        entries.append(entry)
        try:
            _one_transfer(info, entry, budget)
        except Exception as exc:
            status, why = classify_exception(exc)
            entry.update(status=status, reason=why)
        finally:
            info.torch.cuda.synchronize()
            info.torch.cuda.empty_cache()
    return entries
