#!/usr/bin/env bash
# On the lent GPU machine: sparkdiag check idle and under load (timed), compare native against
# native and against a handicapped side, 20 consecutive probes (spread), the telemetry soak
# without the probe, and the per-query NVML cost. Results under $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1
sd() { python3 -m sparkdiag "$@"; }
STATE=/tmp/sd-state; rm -rf $STATE; PY=$(command -v python3); TIMEFORMAT="wall %R s"

echo "== learn baselines (5 probes) so that check has one to compare with"
for i in 1 2 3 4 5; do sd probe --state-dir $STATE --json > /dev/null; echo "probe $i rc=$?"; done

echo "== sparkdiag check, idle"
{ time python3 -m sparkdiag check --state-dir $STATE; echo "rc=$?"; } > "$OUT/check-idle.txt" 2>&1
{ time python3 -m sparkdiag check --quick --state-dir $STATE; echo "rc=$?"; } 2>&1 | tail -4 | tee -a "$OUT/check-idle.txt"
cat "$OUT/check-idle.txt"

echo "== sparkdiag check, while a second process loads the GPU"
python3 tests/probe_helpers/gpu_load.py 90 > /tmp/load.out 2>&1 &
load=$!
for _ in $(seq 1 100); do grep -q ready /tmp/load.out 2>/dev/null && break; sleep 0.2; done
sleep 3
{ time python3 -m sparkdiag check --state-dir $STATE; echo "rc=$?"; } > "$OUT/check-load.txt" 2>&1
kill $load; wait $load 2>/dev/null
cat "$OUT/check-load.txt"

echo "== compare: native against native (a cleared environment reading the worker on stdin)"
sd compare --rounds 3 --dtype bf16,fp8,int4 --probe-when always -- \
  env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root "$PY" - > "$OUT/compare-native.txt" 2>&1
echo "rc=$?" >> "$OUT/compare-native.txt"; cat "$OUT/compare-native.txt"

echo "== compare: native against a handicapped side (1 CPU thread + a GPU load beside it)"
sd compare --rounds 3 --dtype bf16,fp8,int4 --probe-when always -- \
  scripts/device/handicapped_python.sh "$PY" - > "$OUT/compare-handicap.txt" 2>&1
echo "rc=$?" >> "$OUT/compare-handicap.txt"; cat "$OUT/compare-handicap.txt"

echo "== 20 consecutive probes on the idle GPU (with the spin-up)"
for i in $(seq 1 20); do sd probe --json --no-record > "/tmp/probe-$i.json"; done
python3 - <<'PY' > "$OUT/spread2.txt"
import json, statistics
runs = [json.load(open(f"/tmp/probe-{i}.json")) for i in range(1, 21)]
keys, busy = {}, []
for doc in runs:
    g = doc["gpus"][0]
    busy.append(g["worker"]["gpu_busy_seconds"])
    for f in g["figures"]:
        if f["tflops"] is not None:
            keys.setdefault((f["dtype"], f["shape"], f["beta"]), []).append(f["tflops"])
print(f"{'dtype':6} {'shape':18} beta {'median':>9} {'min':>9} {'max':>9} {'cv %':>6} n")
for (d, s, b), v in sorted(keys.items()):
    cv = 100 * statistics.pstdev(v) / statistics.mean(v)
    print(f"{d:6} {s:18} {b:4} {statistics.median(v):9.1f} {min(v):9.1f} {max(v):9.1f} {cv:6.2f} {len(v)}")
print(f"GPU-busy seconds per cycle: median {statistics.median(busy):.2f}, max {max(busy):.2f}")
PY
cat "$OUT/spread2.txt"

echo "== telemetry soak without the probe, and scrape latency on the real GPU"
python3 benchmarks/scrape_latency.py --real --scrapes 300 --soak 60 \
  --soak-arg=--no-probe.enabled --json "$OUT/bench2.json"

echo "== NVML cost per query"
python3 benchmarks/nvml_query_cost.py > "$OUT/query-cost.txt" 2>&1; tail -8 "$OUT/query-cost.txt"
echo done
