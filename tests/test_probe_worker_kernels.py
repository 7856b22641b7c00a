"""The worker's kernels and plan rooms: a kernel's life (checked, warmed up, timed; graph replays
for decode on a GPU), groups timed in rotated rounds, the suite's shapes, the int4 ratios."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest

from sparkdiag.probe.worker import contract, dtypes, kernels, nvml, output, plan, timing
from tests.support import skip_unless_installed
from tests.support.worker import cpu_info, simulated_gpu

skip_unless_installed("torch")


@pytest.mark.parametrize("corruption", ["scale", "nan"])
def test_a_broken_kernel_is_an_error_not_fast(
    monkeypatch: pytest.MonkeyPatch, corruption: str, torch: Any
) -> None:
    real_prepare = dtypes.prepare

    def broken_prepare(info: Any, spec: Any, m: int) -> Any:
        p = real_prepare(info, spec, m)
        inner = p.fn

        def fn(*args: Any) -> Any:
            out = inner(*args)
            if corruption == "scale":
                return out * 1.5
            return out.masked_fill(torch.ones_like(out, dtype=torch.bool), math.nan)

        p.fn = fn
        return p

    monkeypatch.setattr(kernels, "prepare", broken_prepare)  # where KernelRun.setup finds it
    args = contract.parse_args(["--device", "cpu", "--warmup", "2", "--iters", "3"])
    spec = dtypes.KernelSpec("bf16", "compute", (64,), 64, 128)
    budget = plan.Budget(1.0, 1)
    result = kernels.run_kernel(cpu_info(), spec, args, budget, nvml.BusyState(None, set(), 0.1))
    assert result["status"] == "error"
    assert result["reason"].startswith("wrong result")
    assert result["delivered"] is None and result["peak"] is None and result["median_ms"] is None
    assert budget.busy == 0.0  # never timed


def _decode_run(info: Any, fn: Any, graphs: bool = True, min_batch_ms: float = 0.0) -> Any:
    args = argparse.Namespace(
        launch_us=60.0, max_prequeue_ms=100.0, graphs=graphs, min_batch_ms=min_batch_ms
    )
    spec = dtypes.KernelSpec("bf16", "decode", (1,), 64, 128)
    run = kernels.KernelRun(info, spec, args, plan.Budget(1.0, 1))
    run.prepared = dtypes.Prepared(make_set=lambda: (0.02,), fn=fn, reference=lambda s, r: None)
    run.sets = [(0.02,)]
    return run


def test_decode_kernels_on_a_gpu_are_graph_replays() -> None:
    """delivered over the replays (every iteration), peak from a short event-timed batch."""
    info, stream, cuda = simulated_gpu()
    run = _decode_run(info, stream.run)
    stream.slices = {1: 10.0}  # the GPU is away 10 ms inside the first replay
    run.measure(1000)
    stream.slices = {}
    run.measure(1000)
    result = run.summary()
    assert len(cuda.graphs) == 2 and [len(g.kernels) for g in cuda.graphs] == [1000, 1000]
    assert result["timing"] == "graph" and result["iters"] == 2000 and result["batches"] == 2
    assert result["total_ms"] == pytest.approx(40.0 + 10.0)
    assert result["delivered"] == pytest.approx(2000 * run.work / 50e-3 / 1e12)
    assert result["peak"] == pytest.approx(run.work / 0.02e-3 / 1e12)  # the events' median
    assert result["median_ms"] == pytest.approx(0.02)
    assert result["gaps_ms"] is None and result["queued_ahead"] is None
    assert run.budget.busy == pytest.approx(
        (50.0 + 2 * contract.PEAK_BATCH_ITERS * 0.02) / 1e3, rel=0.05
    )
    # with the floor (30 ms) a 1000-iteration batch of 20 us kernels (20 ms) replays 1/8 of
    # itself until 33 ms: 14 replays of 125 after one untimed and one that timed it
    floored = _decode_run(info, stream.run, min_batch_ms=30.0)
    floored.measure(1000)
    result = floored.summary()
    assert result["iters"] == 1750 and result["total_ms"] == pytest.approx(35.0)
    assert result["total_ms"] >= 30.0
    assert floored.budget.busy == pytest.approx(
        (35.0 + 2 * 2.5 + contract.PEAK_BATCH_ITERS * 0.02) / 1e3, rel=0.05
    )


def test_a_kernel_that_cannot_be_captured_is_timed_with_events() -> None:
    info, stream, _ = simulated_gpu()

    def fn(ms: float) -> None:
        if stream.captured is not None:
            raise RuntimeError("operation not permitted when stream is capturing")
        stream.run(ms)

    run = _decode_run(info, fn)
    run.measure(300)
    run.measure(300)
    result = run.summary()
    assert result["timing"] == "events" and result["iters"] == 600 and not run.graph
    assert result["gaps_ms"] == pytest.approx(0.0, abs=1e-9)
    assert result["delivered"] == pytest.approx(result["peak"])
    # --no-graphs, and every kind but decode, never capture
    assert not _decode_run(info, stream.run, graphs=False).graph
    compute = kernels.KernelRun(
        info,
        dtypes.KernelSpec("bf16", "compute", (64,), 64, 64),
        argparse.Namespace(launch_us=60.0, max_prequeue_ms=100.0, graphs=True),
        plan.Budget(1.0, 1),
    )
    assert not compute.graph


def test_grouping_helpers() -> None:
    spec = dtypes.KernelSpec
    specs = [
        spec("bf16", "compute", (64,), 64, 64),
        spec("bf16", "llm", (64,), 64, 64),
        spec("bf16", "decode", (1,), 64, 64),
        spec("int4", "llm", (64,), 64, 128),
        spec("int4", "decode", (1,), 64, 128),
    ]
    alone = plan.plan_groups(specs, ())
    assert alone == [[s] for s in specs]
    groups = plan.plan_groups(specs, ("decode",))
    assert [[(s.dtype, s.kind) for s in g] for g in groups] == [
        [("bf16", "compute")],
        [("bf16", "llm")],
        [("int4", "llm")],
        [("bf16", "decode"), ("int4", "decode")],
    ]
    by_kind = plan.order_by_kind(specs)
    assert [(s.dtype, s.kind) for s in by_kind] == [
        ("bf16", "compute"),
        ("bf16", "llm"),
        ("int4", "llm"),
        ("bf16", "decode"),
        ("int4", "decode"),
    ]
    assert contract.parse_args(["--order", "kind"]).order == "kind"
    hot = plan.plan_groups(specs, ("decode", "llm"))
    assert [[s.kind for s in g] for g in hot] == [["compute"], ["decode"] * 2, ["llm"] * 2]
    assert timing.rotated([0, 1, 2], 0) == [0, 1, 2]
    assert timing.rotated([0, 1, 2], 4) == [1, 2, 0]
    assert timing.rotated([], 3) == []
    assert timing.split_rounds(10, 3) == [4, 3, 3]
    assert timing.split_rounds(2, 3) == [1, 1]
    assert timing.split_rounds(5, 1) == [5]


def test_group_warms_all_then_times_in_rotated_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    real_warm, real_measure = kernels.KernelRun.warm_up, kernels.KernelRun.measure

    def warm_up(self: Any, count: int, floor_ms: float) -> None:
        calls.append(("warm", self.spec.dtype))
        real_warm(self, count, floor_ms)

    def measure(self: Any, count: int) -> Any:
        calls.append(("time", self.spec.dtype))
        return real_measure(self, count)

    monkeypatch.setattr(kernels.KernelRun, "warm_up", warm_up)
    monkeypatch.setattr(kernels.KernelRun, "measure", measure)
    args = contract.parse_args(["--device", "cpu", "--suite", "hot", "--iters", "6"])
    specs = [dtypes.KernelSpec(d, "decode", (1,), 64, 128) for d in ("int4", "bf16", "fp8", "fp16")]
    budget = plan.Budget(0.1, len(specs))
    results = kernels.run_group(
        cpu_info(), specs, args, budget, nvml.BusyState(None, set(), 0.1), 3
    )
    assert [r["status"] for r in results] == ["ok", "ok", "unsupported", "ok"]
    assert [r["iters"] for r in results] == [6, 6, 0, 6]
    assert [r["batches"] for r in results] == [3, 3, 0, 3]
    assert calls[:3] == [("warm", "int4"), ("warm", "bf16"), ("warm", "fp16")]
    rounds = [d for what, d in calls[3:]]
    assert rounds == ["int4", "bf16", "fp16", "bf16", "fp16", "int4", "fp16", "int4", "bf16"]
    assert budget.kernels_left == 0 and budget.busy > 0


def test_shape_planning(torch: Any) -> None:
    assert plan.compute_cube((9, 0), 132) == 8192  # H100/H200
    assert plan.compute_cube((12, 1), 48) == 4096  # GB10
    assert plan.compute_cube((7, 5), 40) == 4096
    assert plan.compute_cube((6, 1), 20) == 2048
    assert kernels.rotation_sets(128 * 1024**2, 60 * 1024**2) == 2
    assert kernels.rotation_sets(32 * 1024**2, 60 * 1024**2) == 4
    assert kernels.rotation_sets(1024, 60 * 1024**2) == 64
    assert kernels.rotation_sets(1536 * 1024**2, 60 * 1024**2) == 1  # memory cap

    h200 = dtypes.DeviceInfo(torch, "cuda:0", True, (9, 0), 132, 60 * 1024**2, (2, 11))
    specs = plan.plan_suite(h200, list(contract.ALL_DTYPES), False, [])
    by = {(s.dtype, s.kind, s.beta): s for s in specs}
    assert (by["bf16", "compute", 0].m_candidates, by["bf16", "compute", 0].n) == ((8192,), 8192)
    assert ("bf16", "compute", 1) in by
    assert (by["fp16", "llm", 0].m_candidates[0], by["fp16", "llm", 0].n) == (4096, 11008)
    assert by["int4", "decode", 0].m_candidates == (1,)
    assert by["int8", "decode", 0].m_candidates[0] == 1  # smallest accepted M is probed
    assert by["int4", "compute", 0].k == 4096
    assert len(specs) == 7 * 3 + 1
    hot = plan.plan_suite(h200, ["int4", "bf16"], False, [], ("decode", "llm"))
    assert [(s.dtype, s.kind) for s in hot] == [
        ("int4", "llm"),
        ("int4", "decode"),
        ("bf16", "llm"),
        ("bf16", "decode"),
    ]


def test_decode_ratios() -> None:
    def r(dtype: str, peak: float | None, shape: str = "1x8192x8192") -> dict[str, Any]:
        status = "ok" if peak else "unsupported"
        return {
            "dtype": dtype,
            "kind": "decode",
            "shape": shape,
            "status": status,
            "peak": peak,
            "delivered": peak,
        }

    got = output.decode_ratios([r("int4", 6.0), r("bf16", 3.75), r("fp16", 3.0)])
    assert got == {"int4/bf16": pytest.approx(1.6), "int4/fp16": pytest.approx(2.0)}
    assert output.decode_ratios([r("int4", 6.0), r("fp16", None)]) == {
        "int4/bf16": None,
        "int4/fp16": None,
    }
    # different decode M (nvfp4-like) or other kinds never pair
    other = output.decode_ratios([r("int4", 6.0, "16x8192x8192"), r("bf16", 3.0)])
    assert other["int4/bf16"] is None
    llm = {"dtype": "bf16", "kind": "llm", "shape": "1x8192x8192", "status": "ok", "peak": 1}
    assert output.decode_ratios([r("int4", 6.0), llm])["int4/bf16"] is None


def test_decode_ratios_read_the_median_iteration_which_contention_leaves() -> None:
    # The first busy hot probe on the H200 (docs/device/2026-12-01/part-b/probe_truth.json,
    # beside a bf16 matmul loop): delivered int4/bf16 1.05 against 1.60 idle, while the median
    # iterations kept int4/bf16 at 1.57.
    def r(dtype: str, delivered: float, peak: float) -> dict[str, Any]:
        return {
            "dtype": dtype,
            "kind": "decode",
            "shape": "1x8192x8192",
            "status": "ok",
            "delivered": delivered,
            "peak": peak,
        }

    busy = [r("int4", 2.2725, 5.7693), r("bf16", 2.1631, 3.6760), r("fp16", 3.1131, 3.2411)]
    got = output.decode_ratios(busy)
    assert got["int4/bf16"] == pytest.approx(1.57, abs=0.005)
    assert got["int4/bf16"] != pytest.approx(2.2725 / 2.1631, abs=0.1)  # not the delivered 1.05
    # heat that slows every int4 iteration to half lowers the ratio by half
    hot = [r("int4", 2.2725, 5.7693 / 2), r("bf16", 2.1631, 3.6760), r("fp16", 3.1131, 3.2411)]
    assert output.decode_ratios(hot)["int4/bf16"] == pytest.approx(1.57 / 2, abs=0.005)
