#!/usr/bin/env python3
"""Control for benchmarks/http_burst.py's fresh rounds: is a slow first scrape after a pause the
render, or the pause? Prints figures; asserts nothing.

    python benchmarks/http_pause.py [--src CHECKOUT] [--rounds 40]

Runs ``sparkdiag serve`` on the 8-GPU fixture polling every 3 s, and scrapes in rounds 1-2 s
apart: each round's first scrape is classed by whether its snapshot is new since the last
round (rendered ahead, or at that scrape before the render ahead) or the same (made long
before, served from the cache), then one back-to-back scrape; plain and as Prometheus asks.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import http_burst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=http_burst.ROOT)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    print(f"sparkdiag from {args.src}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    rng = random.Random(5)
    with http_burst.daemon(args.src, args.python, ["--poll-interval", "3"]) as (port, _pid):
        for name, headers in http_burst.VARIANTS.items():
            new: list[float] = []
            same: list[float] = []
            again: list[float] = []
            last = http_burst.poll_time(http_burst.fetch(port, headers)[1])
            for _ in range(args.rounds):
                time.sleep(1.0 + rng.random())
                took, body = http_burst.fetch(port, headers)
                seen = http_burst.poll_time(body)
                (new if seen > last else same).append(took)
                last = seen
                again.append(http_burst.fetch(port, headers)[0])

            def med(times: list[float]) -> str:
                if not times:
                    return "none"
                return f"p50 {statistics.median(times) * 1e3:.2f} ms (n={len(times)})"

            print(f"{name}: first after a pause, new snapshot {med(new)}; same snapshot "
                  f"{med(same)}; back-to-back {med(again)}")  # fmt: skip
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
