#!/usr/bin/env bash
# On the lent GPU machine, 2026-12-01 (third session). Parts (first argument, default all):
#   overhead  where watch's overhead on a launch-bound job comes from (watch_overhead.py)
#   worker    the probe worker's gpu-marked tests (CUDA-graph decode timing, hot suite, soak,
#             busy skips)
#   jobs      the five synthetic jobs alone and watched, in alternating pairs (watch_jobs.py)
#   truth     probe_truth.py contention and hot parts (graph-timed decode, median int4 ratios)
#   check     three probes learning baselines, a probe table and `sparkdiag check`, idle
# Everything is written under /tmp/res and packed into $OUT/results.tgz (the device tool
# brings back 8 files at most); the log is $OUT/log.txt.
. "$(dirname "$0")/setup.sh"
exec > >(tee -a "$OUT/log.txt") 2>&1
RES=/tmp/res; mkdir -p "$RES"
trap 'tar czf "$OUT/results.tgz" -C "$RES" .' EXIT
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,power.draw --format=csv,noheader
lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|Model name"
python3 -c 'import torch; print("torch", torch.__version__)'
want() { [[ ",${PARTS}," == *",$1,"* || "$PARTS" == all ]]; }
PARTS=${1:-all}
if want overhead; then
  echo "== watch overhead ablation (launch job)"
  timeout 330 python3 scripts/device/watch_overhead.py --seconds 8 --out "$RES/overhead"
  echo "rc=$?"
fi
if want worker; then
  echo "== probe worker gpu tests"
  timeout 200 python3 -m pytest -m gpu tests/test_probe_worker.py -q -s -p no:cacheprovider \
    > "$RES/worker-gpu-tests.txt" 2>&1
  echo "rc=$?"; grep -E "passed|failed|Error|^E " "$RES/worker-gpu-tests.txt" | tail -20
fi
if want jobs; then
  echo "== watch jobs: healthy, starved, checkpoint, fp32 (2 pairs of 10 s)"
  timeout 300 python3 scripts/device/watch_jobs.py --jobs healthy,starved,checkpoint,fp32 \
    --seconds 10 --pairs 2 --out "$RES/jobs"
  echo "rc=$?"
  echo "== watch jobs: launch (8 pairs of 6 s)"
  timeout 240 python3 scripts/device/watch_jobs.py --jobs launch --seconds 6 --pairs 8 \
    --out "$RES/launch"
  echo "rc=$?"
fi
if want truth; then
  echo "== probe truth: contention and hot (graph-timed decode, median ratios)"
  timeout 330 python3 scripts/device/probe_truth.py --parts contention,hot --heat-seconds 30 \
    --repeats 2 --part-seconds 160 --out "$RES/truth" 2>&1 | tail -60
  echo "rc=$?"
fi
if want check; then
  echo "== sparkdiag probe (3 cycles, learning baselines), then check, on the idle GPU"
  STATE=/tmp/sd-state; rm -rf $STATE
  for i in 1 2 3; do
    timeout 60 python3 -m sparkdiag probe --state-dir $STATE --json > "$RES/probe-$i.json"
    echo "probe $i rc=$?"
  done
  timeout 60 python3 -m sparkdiag probe --state-dir $STATE --no-record > "$RES/probe-table.txt" 2>&1
  { time timeout 120 python3 -m sparkdiag check --state-dir $STATE; echo "rc=$?"; } \
    > "$RES/check-idle.txt" 2>&1
  cat "$RES/probe-table.txt" "$RES/check-idle.txt"
fi
