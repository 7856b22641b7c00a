"""Spread of figures over several `sparkdiag probe --json` reports: median, min, max, CV %."""

import json
import statistics
import sys

keys: dict[tuple[str, str, int], list[float]] = {}
busy = []
for path in sys.argv[1:]:
    with open(path) as fh:
        gpu = json.load(fh)["gpus"][0]
    busy.append(gpu["worker"]["gpu_busy_seconds"])
    for f in gpu["figures"]:
        if f["tflops"] is not None:
            keys.setdefault((f["dtype"], f["shape"], f["beta"]), []).append(f["tflops"])
print(f"{'dtype':6} {'shape':18} beta {'median':>9} {'min':>9} {'max':>9} {'cv %':>6} n")
for (d, s, b), v in sorted(keys.items()):
    cv = 100 * statistics.pstdev(v) / statistics.mean(v)
    med = statistics.median(v)
    print(f"{d:6} {s:18} {b:4} {med:9.1f} {min(v):9.1f} {max(v):9.1f} {cv:6.2f} {len(v)}")
print(f"GPU-busy seconds per cycle: median {statistics.median(busy):.2f}, max {max(busy):.2f}")
