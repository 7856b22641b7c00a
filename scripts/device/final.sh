#!/usr/bin/env bash
# On the lent GPU machine: sparkdiag check idle and under load (timed), compare native against
# native and against a handicapped side, 20 consecutive probes (spread), the telemetry soak
# without the probe, and the per-query NVML cost. Results under $OUT.
. "$(dirname "$0")/setup.sh"
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
python3 tests/support/probe_scripts/gpu_load.py 90 > /tmp/load.out 2>&1 &
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
python3 scripts/device/spread_table.py /tmp/probe-{1..20}.json > "$OUT/spread2.txt"
cat "$OUT/spread2.txt"

echo "== telemetry soak without the probe, and scrape latency on the real GPU"
python3 benchmarks/scrape_latency.py --real --scrapes 300 --soak 60 \
  --soak-arg=--no-probe.enabled --json "$OUT/bench2.json"

echo "== NVML cost per query"
python3 benchmarks/nvml_query_cost.py > "$OUT/query-cost.txt" 2>&1; tail -8 "$OUT/query-cost.txt"
echo done
