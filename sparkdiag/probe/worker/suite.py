"""The periodic probe's cycle (``--suite``): the host-device copies, the spin-up, every kernel
group of the suite, then the device copy; the conditions, ratios and overall status around them."""

from __future__ import annotations

import argparse
from typing import Any

from sparkdiag.probe.worker.contract import SUITES
from sparkdiag.probe.worker.copies import run_bandwidth, run_transfers
from sparkdiag.probe.worker.dtypes import DeviceInfo
from sparkdiag.probe.worker.kernels import BusyDuringRun, run_group
from sparkdiag.probe.worker.log import progress
from sparkdiag.probe.worker.nvml import BusyState, ConditionSampler, Nvml
from sparkdiag.probe.worker.output import decode_ratios, overall_status, software_identity
from sparkdiag.probe.worker.plan import Budget, order_by_kind, plan_groups, plan_suite
from sparkdiag.probe.worker.timing import spin_up


def run_suite(
    info: DeviceInfo,
    args: argparse.Namespace,
    nvml: Nvml | None,
    busy: BusyState,
    doc: dict[str, Any],
    small: bool,
) -> None:
    """One cycle of ``args.suite`` on the opened device; fills ``doc`` (results, bandwidth,
    transfers, conditions, ratios, status)."""
    suite = SUITES[args.suite]
    specs = plan_suite(info, args.dtype, small, args.shape, suite.kinds)
    if args.order == "kind":
        specs = order_by_kind(specs)
    groups = plan_groups(specs, suite.together)
    weights = args.kind_weights
    budget = Budget(
        args.budget_seconds,
        len(specs) + (1 if args.bandwidth else 0),
        fraction=args.budget_fraction,
    )
    budget.weight_left = sum(weights.get(s.kind, 1.0) for s in specs) + (
        weights.get("bandwidth", 1.0) if args.bandwidth else 0.0
    )
    sampler = ConditionSampler(nvml)
    sampler.start()
    try:
        if args.transfers:  # first: their GPU time is paid before the kernels share the rest
            doc["transfers"] = run_transfers(info, args, budget, small)
        if info.is_cuda and args.spinup_ms > 0:
            budget.busy += spin_up(info, args.spinup_ms)
        for group in groups:
            together = len(group) > 1 or group[0].kind in suite.together
            rounds = args.rounds if together else 1
            for result in run_group(info, group, args, budget, busy, rounds):
                doc["results"].append(result)
                if args.progress:
                    progress({"done": len(doc["results"]), "total": len(specs), **result})
        if args.bandwidth:
            doc["bandwidth"] = run_bandwidth(info, args, budget, small)
    except BusyDuringRun as exc:
        doc["status"], doc["reason"] = "skipped_busy", str(exc)
    finally:
        doc["conditions"] = sampler.stop()
        doc["ratios"] = decode_ratios(doc["results"])
        doc["gpu_busy_seconds"] = budget.busy
        doc["busy"]["other_pids"] = busy.other_pids
        doc["software"] = software_identity(info.torch, info, info.device, nvml)
    if doc["status"] != "skipped_busy":
        doc["status"], doc["reason"] = overall_status(doc)
