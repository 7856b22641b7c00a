"""The worker's timing room: batches, graph replays, the prequeue hold and the figures, on the
CPU and on a simulated GPU (tests/support/worker.py)."""

from __future__ import annotations

import math

import pytest

from sparkdiag.probe.worker import timing
from tests.support.worker import cpu_info, simulated_gpu


def test_choose_iters() -> None:
    assert timing.choose_iters(7, [1.0] * 10, 0.0, 0.0) == 7
    assert timing.choose_iters(None, [9.0] + [2.0] * 9, 0.1, 0.0) == 50  # capped at MAX_ITERS
    assert timing.choose_iters(None, [9.0] + [2.0] * 9, 0.04, 0.0) == 20
    assert timing.choose_iters(None, [9.0] + [20.0] * 9, 0.04, 0.0) == 5  # floor MIN_ITERS
    assert timing.choose_iters(None, [], 1.0, 0.0) == 5
    # a batch shorter than a time slice is floored at min_batch_ms per round, within max_iters
    assert timing.choose_iters(None, [1.0] + [0.02] * 9, 0.004, 0.0, min_batch_ms=30.0) == 1500
    assert (
        timing.choose_iters(None, [1.0] + [0.02] * 9, 0.004, 0.0, min_batch_ms=30.0, rounds=3)
        == 4000
    )
    assert (
        timing.choose_iters(None, [1.0] + [0.02] * 9, 0.004, 0.0, min_batch_ms=10.0, rounds=2)
        == 1000
    )
    assert timing.choose_iters(None, [1.0] + [0.02] * 9, 0.004, 0.0) == 200
    # the floor at the fastest warm-up iteration: the clocks still rise in the warm-up
    warm = [1.0] + [0.03] * 5 + [0.02] * 4  # median 0.03 ms, fastest 0.02 ms
    assert timing.choose_iters(None, warm, 0.004, 0.0, min_batch_ms=30.0) == 1500  # not 1000
    assert timing.choose_iters(None, warm, 0.004, 0.0) == 133  # the share: at the median
    # a warm-up iteration read as 0 ms (a clock too coarse) is no reading: the next fastest
    assert timing.choose_iters(None, [*warm, 0.0], 0.004, 0.0, min_batch_ms=30.0) == 1500
    # a share longer than the floor keeps the share
    assert timing.choose_iters(None, [9.0] + [2.0] * 9, 0.1, 0.0, min_batch_ms=30.0) == 50
    assert timing.choose_iters(7, [1.0] * 10, 0.0, 0.0, min_batch_ms=1e6) == 7


def test_figures() -> None:
    # 4 iterations of 2 GFLOP, 1 ms each, 2 ms of gaps: delivered over 6 ms, peak over 1 ms
    delivered, peak = timing.figures(2e9, [1.0, 1.0, 1.0, 1.0], 6.0)
    assert delivered == pytest.approx(4 * 2e9 / 6e-3)
    assert peak == pytest.approx(2e12)
    # one slow iteration moves delivered, not peak
    delivered, peak = timing.figures(2e9, [1.0, 1.0, 1.0, 5.0], 8.0)
    assert peak == pytest.approx(2e12) and delivered == pytest.approx(1e12)
    assert all(math.isnan(x) for x in timing.figures(2e9, [], 1.0))
    assert all(math.isnan(x) for x in timing.figures(2e9, [1.0], 0.0))


def test_batch_gaps() -> None:
    assert timing.Batch([1.0, 2.0], 3.5).gaps_ms == pytest.approx(0.5)
    assert timing.Batch([], 0.0).gaps_ms == 0.0


def test_time_batch_on_cpu_encloses_every_iteration() -> None:
    calls: list[int] = []

    def fn(x: int) -> None:
        calls.append(x)
        sum(range(2000))

    batch = timing.time_batch(cpu_info(), fn, [(0,), (1,), (2,)], 7, start=2)
    assert calls == [2, 0, 1, 2, 0, 1, 2]  # rotates through the sets from start
    assert len(batch.iter_ms) == 7 and all(t > 0 for t in batch.iter_ms)
    assert batch.total_ms >= math.fsum(batch.iter_ms)
    assert batch.queued_ahead is None
    assert timing.time_batch(cpu_info(), fn, [(0,)], 0).iter_ms == []


def test_time_batch_on_a_simulated_gpu() -> None:
    """Per-iteration events for the median, the total from the first start to the last end."""
    info, stream, _ = simulated_gpu(60 * 1024**2)

    def kernel(ms: float) -> None:
        stream.run(ms)

    # records: the hold 0, then start/end 1/2, 3/4, 5/6, 7/8: another process's time slice
    # before the third iteration's start, and one inside the fourth iteration
    stream.slices = {5: 5.0, 8: 3.0}
    launch = timing.LaunchModel(launch_us=60.0, max_lead_ms=100.0)
    batch = timing.time_batch(info, kernel, [(1.0,), (2.0,)], 4, start=1, launch=launch)
    assert batch.iter_ms == [2.0, 1.0, 2.0, 4.0]  # rotating from set 1; the last one sliced
    assert batch.total_ms == pytest.approx(9.0 + 5.0)  # every slice counts in the total
    assert batch.gaps_ms == pytest.approx(5.0)
    stream.slices = {}
    # the hold before the batch: 4 iterations x 1.5 x 60 us + the floor, at 1 GHz
    assert stream.slept_cycles == [int((4 * 90e-3 + timing.LEAD_FLOOR_MS) * 1e-3 * 1e9)]
    assert batch.queued_ahead is True  # enqueueing 4 calls takes far less than 0.56 ms
    assert stream.synchronized == 1
    assert launch.gpu_us == pytest.approx(2000.0)  # the median iteration, for the next hold
    delivered, peak = timing.figures(1e9, batch.iter_ms, batch.total_ms)
    assert delivered == pytest.approx(4e9 / 14e-3) and peak == pytest.approx(1e9 / 2e-3)
    # no hold asked for: nothing slept, queued_ahead unknown
    plain = timing.time_batch(info, kernel, [(1.0,)], 2, launch=None)
    assert plain.queued_ahead is None and len(stream.slept_cycles) == 1
    off = timing.LaunchModel(launch_us=60.0, max_lead_ms=0.0)
    assert timing.time_batch(info, kernel, [(1.0,)], 2, launch=off).queued_ahead is None


def test_time_graph_on_a_simulated_gpu() -> None:
    """One replay of the captured batch between two events; a time slice inside counts."""
    info, stream, cuda = simulated_gpu()
    stream.slices = {1: 7.0}  # another process runs before the replay's end event
    total, iters, spent = timing.time_graph(info, stream.run, [(0.02,), (0.03,)], 5, start=1)
    assert cuda.graphs[0].kernels == [0.03, 0.02, 0.03, 0.02, 0.03]  # captured, not run
    assert cuda.graphs[0].replays == 1 and cuda.graphs[0].was_reset
    assert total == pytest.approx(0.13 + 7.0) and iters == 5 and spent == total


def test_a_slow_first_replay_does_not_plan_a_batch_short_of_the_floor() -> None:
    """The graph's first replay ran slower than the rest (on an H100, tf32 decode: a batch
    planned from it lasted 29.3 ms of a 30 ms floor, 2026-12-05); planned from it, 2 ms slower
    here, the run would be count's 8 replays, 1.6 ms. It is replayed once untimed first."""
    info, stream, _ = simulated_gpu()
    stream.slices = {1: 2.0}  # before the first replay's end event
    total, iters, _ = timing.time_graph(info, stream.run, [(0.02,)], 80, start=0, floor_ms=3.0)
    assert total >= 3.0 and iters == 170, (total, iters)


def test_time_graph_replays_until_the_floor() -> None:
    """With a floor, an eighth of the batch is captured, one replay (after an untimed one)
    times it, and the timed run replays it until 1.1 x the floor: a batch planned from slower
    event-timed iterations still lasts the floor (count alone would give 80 x 0.02 = 1.6 ms of
    a 3 ms floor)."""
    info, stream, cuda = simulated_gpu()
    total, iters, spent = timing.time_graph(info, stream.run, [(0.02,)], 80, start=0, floor_ms=3.0)
    assert len(cuda.graphs[0].kernels) == 10  # 80 / 8
    # the untimed replay, the timing replay, then ceil(1.1 * 3.0 / 0.2)
    assert cuda.graphs[0].replays == 2 + 17
    assert iters == 170 and total == pytest.approx(3.4) and spent == pytest.approx(3.8)
    assert total >= 3.0
    # a count beyond the floor is kept whole: 400 iterations are 8.0 ms, 8 replays of 50
    total, iters, _ = timing.time_graph(info, stream.run, [(0.02,)], 400, start=0, floor_ms=3.0)
    assert iters == 400 and total == pytest.approx(8.0)
    # a chunk never holds fewer iterations than one pass over the input sets
    timing.time_graph(info, stream.run, [(0.02,)] * 30, 80, start=0, floor_ms=2.0)
    assert len(cuda.graphs[-1].kernels) == 30


def test_launch_model() -> None:
    model = timing.LaunchModel(launch_us=60.0, max_lead_ms=100.0)
    # before anything is measured: every iteration's launch, with margin, ahead of the GPU
    assert model.lead_ms(100) == pytest.approx(100 * 90e-3 + timing.LEAD_FLOOR_MS)
    model.observe(20.0, 36.0)  # decode: 20 us to enqueue, 36 us on the GPU
    assert model.lead_ms(1000) == pytest.approx(timing.LEAD_FLOOR_MS)  # GPU is slower: no lead
    model.observe(40.0, 23.0)  # a launch-bound kernel: CPU 40 us, GPU 23 us
    assert model.lead_ms(500) == pytest.approx(500 * (60.0 - 23.0) / 1e3 + timing.LEAD_FLOOR_MS)
    assert model.lead_ms(100000) == 100.0  # capped
    model.observe(None, 0.0)  # nothing measured: unchanged
    assert model.launch_us == 40.0 and model.gpu_us == 23.0
    assert timing.sleep_cycles(10.0, 2e9) == 20_000_000
    assert timing.sleep_cycles(-1.0, 2e9) == 0
