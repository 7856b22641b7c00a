#!/usr/bin/env python3
"""Benchmark: what the activity and per-process reads add to one poll of 8 GPUs, on fixtures.

Prints figures; asserts nothing (the goal, at most 1 ms added per poll of 8 GPUs, is checked by
reading the output, not by a timed test).

    python benchmarks/poll_cost.py [--polls 3000] [--json out.json]

Eight copies of the derived two-H200 NVLink fixture (GPM, video engines, PCIe throughput,
18 NVLinks, three or two compute processes per GPU whose /proc entries are in
tests/fixtures/rootfs/gpu-host) are polled by ``GpuSource.read()`` as the daemon does, once a
simulated second (so the 10 s and 60 s tiers come at their real rate), in three setups:

* ``base``: the activity queries answer NOT_SUPPORTED (as on a GPU without them; they are then
  never asked again), per-process metrics off: the poll as it was before issue 14;
* ``activity``: GPM, video engines every poll; PCIe throughput and NVLink every 10 s;
* ``activity+processes``: the same with ``--process-metrics`` (top 10, identities from /proc).

On fixtures the NVML calls cost nothing, so this measures sparkdiag's own Python work: the
costs NVML adds on hardware (PCIe throughput blocks ~20 ms per call, process utilization
1.6 ms on the H200) come on top and are listed in docs/metrics.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sparkdiag.sources.host.procfs import ProcessIdentities  # noqa: E402
from sparkdiag.sources.nvml.activity import ProcessOptions  # noqa: E402
from sparkdiag.sources.nvml.api import NOT_SUPPORTED, NvmlCallError  # noqa: E402
from sparkdiag.sources.nvml.fixture import FixtureBackend  # noqa: E402
from sparkdiag.sources.nvml.gpu import GpuSource  # noqa: E402
from sparkdiag.sources.nvml.queries import QUERIES  # noqa: E402

NVML = ROOT / "tests" / "fixtures" / "nvml"
# The activity block issue 14 added: the catalogue from GPM on.
_NAMES = [q.name for q in QUERIES]
ACTIVITY_QUERIES = frozenset(_NAMES[_NAMES.index("gpm") :])
ROOTFS = ROOT / "tests" / "fixtures" / "rootfs" / "gpu-host"


def eight_gpus(directory: Path) -> Path:
    """A fixture of eight GPUs derived from the two of h200-x2-nvlink.json."""
    devices = [
        {
            "from": n % 2,
            "set": {
                "uuid": f"GPU-979ad365-0b73-a0ac-74a2-3520b773d5{n:02d}",
                "pci_bus_id": f"00000000:{0x18 + 0x10 * n:02x}:00.0",
            },
        }
        for n in range(8)
    ]
    doc = {
        "format": "sparkdiag-nvml-fixture/1",
        "description": "benchmark: eight GPUs from h200-x2-nvlink.json",
        "base": str(NVML / "h200-x2-nvlink.json"),
        "devices": devices,
    }
    path = directory / "x8.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


class WithoutActivity(FixtureBackend):
    """The fixture with every activity query unsupported: the poll before issue 14."""

    def query(self, index: int, query: str, arg: int | None = None) -> Any:
        if query in ACTIVITY_QUERIES:
            raise NvmlCallError(NOT_SUPPORTED)
        return super().query(index, query, arg)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def measure(sources: dict[str, tuple[GpuSource, Clock]], polls: int) -> dict[str, list[float]]:
    """CPU seconds of this thread per ``read()``, one simulated second apart, the setups
    interleaved poll by poll (so that other load on the machine hits them alike), after a
    warm-up of 20 polls. CPU time, not wall time: a shared machine deschedules the benchmark."""
    times: dict[str, list[float]] = {name: [] for name in sources}
    for source, _ in sources.values():
        assert source.start()
    for n in range(polls + 20):
        for name, (source, clock) in sources.items():
            clock.now += 1.0
            start = time.thread_time()
            source.read()
            if n >= 20:
                times[name].append(time.thread_time() - start)
    return times


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "mean_ms": statistics.fmean(times) * 1e3,
        "p50_ms": ordered[len(ordered) // 2] * 1e3,
        "p99_ms": ordered[int(len(ordered) * 0.99)] * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--polls", type=int, default=3000)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the unseen-process warning is not the point here
    with tempfile.TemporaryDirectory() as tmp:
        fixture = eight_gpus(Path(tmp))
        setups = {
            "base": lambda c: GpuSource(WithoutActivity(fixture), clock=c),
            "activity": lambda c: GpuSource(FixtureBackend(fixture), clock=c),
            "activity+processes": lambda c: GpuSource(
                FixtureBackend(fixture),
                clock=c,
                processes=ProcessOptions(10, ProcessIdentities(ROOTFS)),
            ),
        }
        sources = {}
        for name, make in setups.items():
            clock = Clock()
            sources[name] = (make(clock), clock)
        results = {name: summary(t) for name, t in measure(sources, args.polls).items()}
    base = results["base"]["mean_ms"]
    print(
        f"one poll of 8 GPUs on fixtures: CPU time of {args.polls} polls, one simulated second "
        "apart (PCIe throughput and NVLink state and data every 10 s, NVLink errors every 60 s)"
    )
    print(f"{'setup':<22}{'mean ms':>9}{'p50 ms':>9}{'p99 ms':>9}{'added (mean)':>15}")
    for name, r in results.items():
        added = r["mean_ms"] - base
        print(
            f"{name:<22}{r['mean_ms']:>9.3f}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}"
            f"{added:>+12.3f} ms"
        )
    print("target: at most +1 ms for activity+processes")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
