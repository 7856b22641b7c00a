"""The worker's copies room: the device copy and the host-device copies, their data checked."""

from __future__ import annotations

from typing import Any

import pytest

from sparkdiag.probe.worker import contract, copies, output, plan
from tests.support import skip_unless_installed
from tests.support.worker import cpu_info, simulated_gpu

skip_unless_installed("torch")


def test_measure_copies_checks_the_data_and_charges_the_budget(torch: Any) -> None:
    info = cpu_info()
    src = torch.arange(8192, dtype=torch.int64)
    dst = torch.zeros_like(src)
    budget = plan.Budget(1.0, 1)
    entry = copies._transfer_entry("h2d", "pageable", src.numel() * 8, 50, "ok", None)
    got = copies.measure_copies(
        info, lambda: dst.copy_(src), lambda: bool(torch.equal(dst, src)), entry, budget
    )
    assert got is entry and entry["status"] == "ok"
    assert entry["delivered"] == pytest.approx(65536 * 50 / (entry["total_ms"] / 1e3))
    assert budget.busy >= entry["total_ms"] / 1e3  # the checked copy is charged too
    # a copy that moves the wrong bytes is an error, never a bandwidth
    broken = copies._transfer_entry("d2h", "pinned", 65536, 50, "ok", None)
    copies.measure_copies(
        info,
        lambda: dst.copy_(src.flip(0)),
        lambda: bool(torch.equal(dst, src)),
        broken,
        plan.Budget(1.0, 1),
    )
    assert broken["status"] == "error" and "d2h copy produced wrong data" in broken["reason"]
    assert broken["delivered"] is None
    doc = {"results": [], "bandwidth": None, "transfers": [entry, broken]}
    status, reason = output.overall_status(doc)
    assert status == "error" and "pinned d2h 65536 B copies" in reason


def test_measure_copies_on_a_simulated_gpu() -> None:
    info, stream, _ = simulated_gpu(60 * 1024**2)
    budget = plan.Budget(2.0, 1)
    entry = copies._transfer_entry("h2d", "pinned", 256 * 1024**2, 2, "ok", None)
    copies.measure_copies(info, lambda: stream.run(5.0), lambda: True, entry, budget)
    assert entry["total_ms"] == pytest.approx(10.0)  # two copies, from one event to the other
    assert entry["delivered"] == pytest.approx(2 * 256 * 1024**2 / 10e-3)  # ~53.7 GB/s
    assert budget.busy == pytest.approx(15e-3)  # the checked copy and the two timed ones


def test_transfer_plan() -> None:
    args = contract.parse_args(["--transfer-small-copies", "10", "--transfer-large-copies", "3"])
    assert args.transfers is True
    plan = copies.transfer_plan(args, small=False)
    assert len(plan) == 8
    assert plan[:4] == [
        ("pinned", 64 * 1024, 10, "h2d"),
        ("pinned", 64 * 1024, 10, "d2h"),
        ("pinned", 256 * 1024**2, 3, "h2d"),
        ("pinned", 256 * 1024**2, 3, "d2h"),
    ]
    assert {m for m, *_ in plan[4:]} == {"pageable"}
    assert contract.parse_args(["--no-transfers"]).transfers is False
    assert contract.parse_args(["--suite", "hot"]).transfers is False
    assert contract.parse_args(["--suite", "hot", "--transfers"]).transfers is True
    with pytest.raises(contract.UsageError):
        contract.parse_args(["--transfer-small-copies", "0"])
