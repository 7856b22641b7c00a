#!/usr/bin/env bash
# The H200 measurements of 2026-12-01, in parts that each fit one device call (10 minutes):
#
#   a  NVML fixtures recorded idle and under load, the gpu-marked NVML tests (nvidia-smi
#      agreement, activity queries), 20 idle default-suite cycles (probe_truth.py idle),
#      mamf-finder at 8192^3 for bf16 and fp8 right after them, sparkdiag probe and check idle
#   b  the contention table and the hot-suite int4 ratios idle, busy and hot
#      (probe_truth.py contention,hot), the worker's gpu-marked tests, check under load
#   c  decode batches beside a competing process, for several batch settings (decode_slices.py);
#      the default suite's bf16 and fp8 kernels measured every 10 s through 60 s of sustained
#      load (the worker's soak mode: mamf-finder's condition, which warms the GPU for 30 s
#      before it measures), then synthetic jobs alone and under sparkdiag watch (watch_jobs.py)
#   d  the contention table again after the batch floor (--min-batch-ms), a 5-minute
#      sparkdiag soak with its plots (soak.sh), the worker's gpu-marked tests
#
# Usage on the device: bash scripts/device/session.sh a   (carry .whl, and .mamf for part a:
# mamf-finder.py from stas00/ml-engineering, compute/accelerator/benchmarks, not committed here).
# The device tool returns at most 8 files: everything a part writes goes into one archive,
# $OUT/part-X.tgz, beside $OUT/part-X.log.
. "$(dirname "$0")/setup.sh"
part=${1:?usage: session.sh a|b|c|d}
RES=/tmp/res-$part
rm -rf "$RES"; mkdir -p "$RES"
exec > >(tee -a "$OUT/part-$part.log") 2>&1
finish() { tar czf "$OUT/part-$part.tgz" -C "$RES" . && ls -la "$RES"; }
trap finish EXIT
sd() { python3 -m sparkdiag "$@"; }
STATE=/tmp/sd-state
TIMEFORMAT="wall %R s"

echo "== $(date -u +%FT%TZ) part $part"
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,temperature.memory,power.draw,clocks.sm --format=csv
python3 -c 'import torch, pynvml; print("torch", torch.__version__, "cuda", torch.version.cuda)'

case "$part" in
a)
  nvidia-smi -q > "$RES/nvidia-smi-q.txt"
  echo "== record idle"
  sd record-fixture "$RES/h200-idle.json" --description "NVIDIA H200 on the lent machine, idle (no compute process)"
  sd dump > "$RES/dump-idle.txt" 2>&1
  echo "== gpu-marked NVML tests (nvidia-smi agreement idle and under load, activity queries)"
  SPARKDIAG_COMPARE_OUT="$RES/nvidia-smi-agreement.md" timeout 240 python3 -m pytest -m gpu tests/gpu -q -s -p no:cacheprovider 2>&1 | tail -40
  echo "== record under load"
  load 40; pid=$!; sleep 20
  sd record-fixture "$RES/h200-load.json" --description "NVIDIA H200 on the lent machine after 20 s of continuous bf16 8192^3 matmuls"
  kill $pid; wait $pid 2>/dev/null
  echo "== 20 idle default-suite cycles"
  time timeout 330 python3 scripts/device/probe_truth.py --parts idle --cycles 20 --part-seconds 300 --out "$RES"
  echo "== mamf-finder beside them"
  for dt in bfloat16 float8_e4m3fn; do
    time timeout 90 python3 .mamf/mamf-finder.py --m 8192 --n 8192 --k 8192 --dtype $dt \
      --num_iterations 200 --num_warmup_iterations 50 --output_file "$RES/mamf-$dt.txt" 2>&1 | tail -6
  done
  echo "== sparkdiag probe (default suite) and check, idle"
  rm -rf $STATE
  time sd probe --state-dir $STATE --json > "$RES/probe-default.json"; echo "probe rc=$?"
  sd probe --state-dir $STATE --no-record | tee "$RES/probe-table.txt"
  time sd check --state-dir $STATE | tee "$RES/check-idle.txt"; echo "check rc=${PIPESTATUS[0]}"
  ;;
b)
  echo "== contention table and hot-suite ratios"
  time timeout 420 python3 scripts/device/probe_truth.py --parts contention,hot --heat-seconds 60 --part-seconds 240 --out "$RES"
  echo "== check under load"
  load 30; pid=$!; sleep 8
  time sd check | tee "$RES/check-load.txt"; echo "check rc=${PIPESTATUS[0]}"
  kill $pid; wait $pid 2>/dev/null
  echo "== the worker's gpu-marked tests"
  timeout 150 python3 -m pytest -m gpu tests/test_probe_worker.py -q -s -p no:cacheprovider 2>&1 | tail -30
  ;;
c)
  echo "== decode batches and time slices (decode_slices.py)"
  time timeout 200 python3 scripts/device/decode_slices.py --out "$RES"
  echo "== default suite bf16 and fp8 through 60 s of sustained load"
  time timeout 120 python3 sparkdiag/probe/worker --suite default --dtype bf16,fp8 \
    --no-bandwidth --no-transfers --soak-seconds 60 --window-seconds 10 > "$RES/sustained-default.json"
  echo "worker rc=$?"
  OUT="$RES" bash scripts/device/watch_jobs.sh
  ;;
d)
  echo "== the contention table again, batches of at least 30 ms (--min-batch-ms)"
  time timeout 150 python3 scripts/device/probe_truth.py --parts contention --contention-rounds 2 \
    --part-seconds 140 --out "$RES"
  echo "== 5-minute soak"
  mkdir -p "$RES/soak"
  OUT="$RES/soak" bash scripts/device/soak.sh
  echo "== the worker's gpu-marked tests"
  timeout 100 python3 -m pytest -m gpu tests/test_probe_worker.py -q -p no:cacheprovider 2>&1 | tail -30
  ;;
esac
echo "== $(date -u +%FT%TZ) end of part $part"
