#!/usr/bin/env bash
# On the lent GPU machine (issue 32): does probe's verdict hold on a real GPU? 3 cycles teach the
# baselines, 8 idle cycles are judged against them (none should read "slower": the 10 % noise
# band), 2 cycles beside a bf16 8192^3 matmul loop (--probe.when always) should read "slower ...
# while pid N used the GPU" and exit 1; then check --quick (a GPU was checked: judged, exit 0 or
# 1 by its rows, never "nothing judged") and bench with no --device (sweeps the GPU now, not the
# CPU). About 3 minutes; each command is bounded by timeout, and one failure does not stop the
# rest. Needs nothing carried beyond the repo (torch, nvidia-ml-py, click there already).
# Writes $OUT/newcomer/: every output, and a table on stdout at the end.
# DRY=1 runs it here without a GPU: recorded fixtures for NVML and the probe (the H200 cycle, and
# that cycle at 0.48 with pid 4242 for "beside"), sleep for the load, bench on the CPU.
. "$(dirname "$0")/setup.sh"
DIR="$OUT/newcomer"; mkdir -p "$DIR"
STATE=/tmp/sd-newcomer-state; rm -rf "$STATE"
sd() { timeout 120 python3 -m sparkdiag "$@"; }
NVML=(); IDLE=(); BESIDE=(); BENCH=(--dtype bf16 --m 4096:8192:4096 --iters 10 --warmup 3)
LOAD=(python3 tests/support/probe_scripts/gpu_load.py 90)
if [ "${DRY:-0}" = 1 ]; then
  NVML=(--nvml-fixture tests/fixtures/nvml/h200-idle.json)
  IDLE=("${NVML[@]}" --probe.fixture tests/fixtures/probe/h200-default.json)
  python3 -c 'import sys; from pathlib import Path; from tests.support import scaled_cycle
scaled_cycle(Path(sys.argv[1]), 0.48, [4242])' /tmp/sd-newcomer-beside.json
  BESIDE=("${NVML[@]}" --probe.fixture /tmp/sd-newcomer-beside.json)
  BENCH=(--device cpu --small --m 64,128 --iters 3 --warmup 1)
  LOAD=(sh -c 'echo ready; exec sleep 90')
fi
summary=()
note() { summary+=("$(printf '%-26s exit %-3s %s' "$1" "$2" "$3")"); }

for i in 1 2 3; do
  sd probe "${IDLE[@]}" --state-dir "$STATE" --json > "$DIR/learn-$i.json" 2> "$DIR/learn-$i.err"
  note "learn $i" $? "(teaches the baselines)"
done
for i in $(seq 1 8); do
  sd probe "${IDLE[@]}" --state-dir "$STATE" --no-record > "$DIR/idle-$i.txt" 2>&1
  rc=$?; note "idle $i" $rc "$(grep -h '^verdict:' -A2 "$DIR/idle-$i.txt" | tr -s ' \n' ' ')"
done

"${LOAD[@]}" > /tmp/newcomer-load.out 2>&1 &
loader=$!
for _ in $(seq 1 100); do grep -q ready /tmp/newcomer-load.out 2>/dev/null && break; sleep 0.2; done
sleep 2
for i in 1 2; do
  sd probe "${BESIDE[@]}" --state-dir "$STATE" --no-record --probe.when always \
    > "$DIR/beside-$i.txt" 2>&1
  rc=$?; note "beside pid $loader ($i)" $rc "$(grep -h '^verdict:' -A2 "$DIR/beside-$i.txt" | tr -s ' \n' ' ')"
  sd probe "${BESIDE[@]}" --state-dir "$STATE" --no-record --probe.when always --json \
    > "$DIR/beside-$i.json" 2>/dev/null
done
kill "$loader" 2>/dev/null; wait "$loader" 2>/dev/null

sd check --quick "${NVML[@]+"${NVML[@]}"}" --state-dir "$STATE" > "$DIR/check-quick.txt" 2>&1
note "check --quick" $? "$(tail -1 "$DIR/check-quick.txt" | cut -c1-110)"
sd bench "${BENCH[@]}" > "$DIR/bench.txt" 2>&1
note "bench (no --device)" $? "$(grep -h 'best' "$DIR/bench.txt" | cut -c1-110)"

printf '%s\n' "${summary[@]}" | tee "$DIR/summary.txt"
