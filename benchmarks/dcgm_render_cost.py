#!/usr/bin/env python3
"""Benchmark: what ``--compat.dcgm`` adds to rendering a scrape, measured through the registry.

No HTTP server is involved, so the figure does not depend on how /metrics is served (the
server, gzip or a render cache): for each fixture one snapshot is polled, then the registry
without the compat collector and the one with it are rendered in alternating rounds (each round
renders each ``--per-round`` times), and the medians over the rounds are reported with the
median of the per-round ratios. ``alone`` renders a registry holding only the compat collector.

    python benchmarks/dcgm_render_cost.py --rounds 41 --json out.json

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sparkdiag.exporter.dcgm import DcgmCollector  # noqa: E402
from sparkdiag.exporter.registry import build_registry, render  # noqa: E402
from sparkdiag.snapshot import Snapshot  # noqa: E402
from sparkdiag.sources.host.meminfo import read_host_memory  # noqa: E402
from sparkdiag.sources.nvml.fixture import FixtureBackend  # noqa: E402
from sparkdiag.sources.nvml.gpu import GpuSource  # noqa: E402
from sparkdiag.telemetry.poller import Poller  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
# name: (NVML fixture, fake root for /proc/meminfo)
TARGETS = {
    "h200-load": (FIXTURES / "nvml" / "h200-load.json", FIXTURES / "rootfs" / "lent-vm"),
    "gb10-load": (FIXTURES / "nvml" / "gb10-load.json", FIXTURES / "rootfs" / "dgx-spark"),
    "h200-x8": (FIXTURES / "nvml" / "h200-x8.json", FIXTURES / "rootfs" / "docker"),
}


def snapshot(nvml: Path, rootfs: Path) -> Snapshot:
    source = GpuSource(FixtureBackend(nvml))
    source.start()
    poller = Poller(source, None, lambda: read_host_memory(rootfs), None)
    poller.poll_once()
    return poller.poll_once()  # the second poll: GPM and the scripted load answer from it


def per_render(registry: CollectorRegistry, times: int) -> float:
    start = time.perf_counter()
    for _ in range(times):
        render(registry)
    return (time.perf_counter() - start) / times


def measure(snap: Snapshot, rounds: int, times: int) -> dict[str, Any]:
    registries: dict[str, CollectorRegistry] = {
        "off": build_registry(lambda: snap),
        "on": build_registry(lambda: snap, compat_dcgm=True),
    }
    alone = CollectorRegistry(auto_describe=False)
    alone.register(DcgmCollector(lambda: snap, "node"))
    registries["alone"] = alone
    timed: dict[str, list[float]] = {name: [] for name in registries}
    ratios: list[float] = []
    for name in registries:  # warm
        per_render(registries[name], times)
    for index in range(rounds):
        order = list(registries) if index % 2 == 0 else list(reversed(registries))
        for name in order:
            timed[name].append(per_render(registries[name], times))
        ratios.append(timed["on"][-1] / timed["off"][-1])
    median: Callable[[list[float]], float] = statistics.median
    return {
        **{f"{name}_ms": median(values) * 1e3 for name, values in timed.items()},
        "on_over_off": median(ratios),
        "added_ms": median([on - off for on, off in zip(timed["on"], timed["off"], strict=True)])
        * 1e3,
        **{f"{name}_bytes": len(render(registry)) for name, registry in registries.items()},
        "rounds": rounds,
        "renders_per_round": times,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    results = {}
    print(
        f"{'fixture':<10} {'off ms':>8} {'on ms':>8} {'added ms':>9} {'on/off':>7} "
        f"{'alone ms':>9} {'off B':>7} {'on B':>7}"
    )
    for name, (nvml, rootfs) in TARGETS.items():
        fig = measure(snapshot(nvml, rootfs), opts.rounds, opts.per_round)
        results[name] = fig
        print(
            f"{name:<10} {fig['off_ms']:8.3f} {fig['on_ms']:8.3f} {fig['added_ms']:9.3f} "
            f"{fig['on_over_off']:7.3f} {fig['alone_ms']:9.3f} {fig['off_bytes']:7d} "
            f"{fig['on_bytes']:7d}"
        )
    if opts.json:
        opts.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
