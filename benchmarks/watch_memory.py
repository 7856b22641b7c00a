#!/usr/bin/env python3
"""Benchmark: what a long ``sparkdiag watch`` holds in memory, per tick and per stack change.

Prints figures; asserts nothing (the bounds are held by tests/test_watch_compact.py and
tests/test_watch_pyspy.py):

    python benchmarks/watch_memory.py [--seconds 1800]

1. **Ticks**: every recording of a real job in docs/device/ loaded, and the memory its ticks
   hold (tracemalloc), per tick; with watch's bound (``compact.MAX_TICKS``) that gives the most
   a watch of any length holds.
2. **Python stacks**: a simulated py-spy chrome trace of ``--seconds`` (one thread, 75 frames
   deep, 10 stack changes a second among 500 distinct innermost stacks: the rates and depths
   of the recordings of real jobs, 4-33 changes a second, 17-125 frames), parsed in 30 s
   chunks as watch reads them, the stretches held as parsed and as the stack sampler keeps
   them (one tuple of frames a process's distinct stack); per stretch and per hour, and the most
   held between two cuts into the ticks (``job.FOLD_TICKS``).
"""

from __future__ import annotations

import argparse
import gc
import random
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

from sparkdiag.sources.host.pyspy import Segment, parse_chrometrace
from sparkdiag.watch import compact, stack_sampler
from sparkdiag.watch.job import FOLD_TICKS
from sparkdiag.watch.model import load

ROOT = Path(__file__).resolve().parents[1]
DEPTH, CHANGING, RATE, DISTINCT, CHUNK = 75, 5, 10, 500, 30


def ticks() -> None:
    per_tick = []
    for path in sorted((ROOT / "docs" / "device").rglob("*.recording.json")):
        gc.collect()
        tracemalloc.start()
        rec = load(path)
        held = rec.ticks
        del rec
        gc.collect()
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        per_tick.append(size / len(held))
        del held
    per_tick.sort()
    median = per_tick[len(per_tick) // 2]
    print(
        f"ticks: {len(per_tick)} recordings, {median / 1024:.2f} KiB a tick held (median; "
        f"{per_tick[0] / 1024:.2f}-{per_tick[-1] / 1024:.2f}); at most {compact.MAX_TICKS} ticks: "
        f"{compact.MAX_TICKS * median / 2**20:.0f} MiB whatever the watch's length"
    )


def _pool(rng: random.Random) -> list[list[tuple[str, str, int]]]:
    return [
        [
            (
                f"torch.op_{rng.randint(0, 400)}",
                f"/site-packages/torch/f{j}.py",
                rng.randint(1, 900),
            )
            for j in range(CHANGING)
        ]
        for _ in range(DISTINCT)
    ]


def _chunk(rng: random.Random, pool: list[list[tuple[str, str, int]]]) -> list[dict[str, Any]]:
    """One chunk's chrome trace: the thread's outer frames open, then RATE changes a second."""
    base = [(f"module_{i}.run_{i}", f"/site-packages/pkg/mod_{i}.py", 100 + i) for i in range(70)]
    events: list[dict[str, Any]] = [
        {"ph": "B", "tid": 1, "ts": 0, "name": "thread (0x1): MainThread", "args": {}}
    ]
    for name, file, line in base:
        events.append(
            {"ph": "B", "tid": 1, "ts": 0, "name": name, "args": {"filename": file, "line": line}}
        )
    top: list[tuple[str, str, int]] = []
    for k in range(CHUNK * RATE):
        ts = k * 1e6 / RATE
        events.extend({"ph": "E", "tid": 1, "ts": ts, "name": "", "args": {}} for _ in top)
        top = pool[rng.randrange(len(pool))]
        for name, file, line in top:
            events.append(
                {
                    "ph": "B",
                    "tid": 1,
                    "ts": ts,
                    "name": name,
                    "args": {"filename": file, "line": line},
                }
            )
    return events


class _Chunk:
    def __init__(self, got: list[Segment]) -> None:
        self.got = got

    def collect(self) -> list[Segment]:
        return self.got


def stacks(seconds: int) -> None:
    chunks = max(1, seconds // CHUNK)
    rng = random.Random(1)
    pool = _pool(rng)
    gc.collect()
    tracemalloc.start()
    parsed: list[Segment] = []
    for c in range(chunks):
        parsed.extend(parse_chrometrace(_chunk(rng, pool), c * float(CHUNK), 1234))
    gc.collect()
    raw = tracemalloc.get_traced_memory()[0]
    count = len(parsed)
    del parsed
    gc.collect()
    tracemalloc.stop()

    rng = random.Random(1)
    pool = _pool(rng)
    with tempfile.TemporaryDirectory() as tmp:
        sampler = stack_sampler.StackSampler(Path(tmp) / "no-py-spy", Path("/"))
        sampler.lines = lambda pid, file, line: ""  # type: ignore[method-assign]
        target = stack_sampler._Target(1234)
        gc.collect()
        tracemalloc.start()
        for c in range(chunks):
            got = parse_chrometrace(_chunk(rng, pool), c * float(CHUNK), 1234)
            sampler._collect(target, _Chunk(got))  # type: ignore[arg-type]
            del got
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        sampler.finish()
    hours = chunks * CHUNK / 3600
    between = FOLD_TICKS * 0.5 / 3600  # hours of stretches held at most, at the default 0.5 s
    print(
        f"stacks: {count} stretches in {chunks * CHUNK} s; as parsed {raw / count:.0f} B a "
        f"stretch, {raw / hours / 2**20:.1f} MiB an hour; as watch keeps them {kept / count:.0f} B "
        f"a stretch, {kept / hours / 2**20:.1f} MiB an hour ({raw / kept:.1f}x less); cut into "
        f"the ticks every {FOLD_TICKS} ticks, at most {kept / hours * between / 2**20:.1f} MiB "
        "of them held at 0.5 s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=1800, help="simulated stack seconds")
    args = parser.parse_args()
    ticks()
    stacks(args.seconds)


if __name__ == "__main__":
    main()
