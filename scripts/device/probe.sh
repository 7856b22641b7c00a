#!/usr/bin/env bash
# On the lent GPU machine: the telemetry benchmark, the probe's default suite, 20 consecutive
# probes (spread), probe against a long sustained sweep, and the probe with a second process
# loading the GPU. Results under $OUT.
. "$(dirname "$0")/setup.sh"
exec > >(tee -a "$OUT/log.txt") 2>&1
sd() { python3 -m sparkdiag "$@"; }
STATE=/tmp/sd-state; rm -rf $STATE

echo "== GPU-marked tests"
python3 -m pytest -m gpu tests -q -p no:cacheprovider 2>&1 | tail -5

echo "== scrape benchmark (8-GPU fixture and the real H200 against nvidia-smi; 60 s soak)"
python3 benchmarks/scrape_latency.py --fixture tests/fixtures/nvml/h200-x8.json --real \
  --scrapes 500 --soak 60 --json "$OUT/bench.json"

echo "== default suite, 20 consecutive probes on the idle GPU"
for i in $(seq 1 20); do
  sd probe --json --state-dir $STATE > "/tmp/probe-$i.json"; echo "probe $i rc=$?"
done
cp /tmp/probe-1.json "$OUT/probe-1.json"; cp /tmp/probe-20.json "$OUT/probe-20.json"
python3 scripts/device/spread_table.py /tmp/probe-{1..20}.json > "$OUT/spread.txt"
cat "$OUT/spread.txt"
sd probe --state-dir $STATE --no-record | tee "$OUT/probe-table.txt"
sd baseline show --state-dir $STATE | head -40

echo "== long sustained sweep of the compute shapes (bf16, fp8 8192^3)"
sd bench --dtype bf16 --dtype fp8 --m 8192 --iters 10000 --json "$OUT/sustained.json" 2>/dev/null

echo "== probe while a second process runs matmuls"
python3 tests/support/probe_scripts/gpu_load.py 60 > /tmp/load.out 2>&1 &
load=$!
for _ in $(seq 1 100); do grep -q ready /tmp/load.out 2>/dev/null && break; sleep 0.2; done
sleep 3
sd probe --state-dir $STATE --no-record --dtype bf16 --dtype int4; echo "idle-mode rc=$?"
sd probe --state-dir $STATE --no-record --probe-when always --dtype bf16 --dtype fp8 --dtype int4 | tee "$OUT/probe-under-load.txt"; echo "always-mode rc=$?"
kill $load; wait $load 2>/dev/null
echo done
