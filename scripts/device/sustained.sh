#!/usr/bin/env bash
# On the lent GPU machine: the probe's compute-bound bf16 and fp8 figures beside a long
# sustained run of the same shapes in the same run (probe, sustained, probe), and the
# telemetry soak without the probe. Results under $OUT.
set -u
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1
for i in 1 2 3; do python3 -m sparkdiag probe --json --no-record > "/tmp/probe-$i.json"; done
python3 -m sparkdiag bench --dtype bf16 --dtype fp8 --m 8192 --iters 10000 \
  --json "$OUT/sustained.json" 2>/dev/null
for i in 4 5 6; do python3 -m sparkdiag probe --json --no-record > "/tmp/probe-$i.json"; done
python3 scripts/device/spread_table.py /tmp/probe-{1..6}.json > "$OUT/probe-6.txt"
python3 - <<'PY' | tee "$OUT/ratio.txt"
import json, statistics
import os
with open(os.environ.get("OUT", "/tmp/out") + "/sustained.json") as fh:
    sustained = {r["dtype"]: r["tflops"] for r in json.load(fh)["results"] if r["beta"] == 0}
probes = {}
for i in range(1, 7):
    for f in json.load(open(f"/tmp/probe-{i}.json"))["gpus"][0]["figures"]:
        if f["kind"] == "compute" and f["beta"] == 0 and f["dtype"] in sustained and f["tflops"]:
            probes.setdefault(f["dtype"], []).append(f["tflops"])
for dtype, values in sorted(probes.items()):
    med = statistics.median(values)
    print(f"{dtype} 8192^3: probe median {med:.1f} TFLOPS over {len(values)} cycles "
          f"(min {min(values):.1f}, max {max(values):.1f}); sustained 10000 iterations "
          f"{sustained[dtype]:.1f}; probe / sustained = {med / sustained[dtype]:.3f}")
PY
python3 benchmarks/scrape_latency.py --real --scrapes 300 --soak 60 \
  --soak-arg=--no-probe.enabled --json "$OUT/bench3.json"
