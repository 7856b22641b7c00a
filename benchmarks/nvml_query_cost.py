#!/usr/bin/env python3
"""Benchmark: what one poll of the GPU source costs, query by query, on the real GPU.

Prints the mean microseconds of every catalogue query (each asked --rounds times after one
warm-up), and the wall and CPU time of whole GpuSource.read() polls with the default tiering.
"""

from __future__ import annotations

import argparse
import contextlib
import time

from sparkdiag.sources.nvml.api import NvmlCallError
from sparkdiag.sources.nvml.driver import PynvmlBackend
from sparkdiag.sources.nvml.gpu import GpuSource
from sparkdiag.sources.nvml.queries import QUERIES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--polls", type=int, default=200)
    opts = parser.parse_args()
    backend = PynvmlBackend()
    backend.init()
    rows = []
    for declared in QUERIES:
        query = declared.name
        for arg in declared.arguments():
            try:
                backend.query(0, query, arg)
                ok = "ok"
            except NvmlCallError as exc:
                ok = exc.name
            start = time.perf_counter()
            for _ in range(opts.rounds):
                with contextlib.suppress(NvmlCallError):
                    backend.query(0, query, arg)
            rows.append(((time.perf_counter() - start) / opts.rounds * 1e6, query, arg, ok))
    backend.shutdown()
    for us, query, arg, ok in sorted(rows, reverse=True):
        print(f"{us:9.1f} us  {query}{'' if arg is None else f'/{arg}'}  {ok}")
    print(f"sum of one of each: {sum(r[0] for r in rows) / 1e3:.2f} ms")

    source = GpuSource(PynvmlBackend())
    source.start()
    source.read()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(opts.polls):
        source.read()
    wall = (time.perf_counter() - wall0) / opts.polls * 1e3
    cpu = (time.process_time() - cpu0) / opts.polls * 1e3
    print(f"GpuSource.read(): {wall:.2f} ms wall, {cpu:.2f} ms CPU per poll (tiered queries)")
    source.stop()


if __name__ == "__main__":
    main()
