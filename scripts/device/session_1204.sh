#!/usr/bin/env bash
# On the lent H200, the second call of 2026-12-04's last session, after next_session.sh's
# results: at most 8 minutes, each step bounded by its own timeout, one failing does not stop
# the others, everything in ONE archive, $OUT/s1204.tgz, the steps' tables printed last.
#
#   bash scripts/device/session_1204.sh          # carry: .whl/ and .carry/ (fio)
#
# 1. issue 30: storage2_h200.sh again, GPUDirect Storage through kvikio 26.10 now that the
#    worker imports kvikio.defaults and kvikio.cufile_driver itself (the first call's GDS stage
#    failed: "module 'kvikio' has no attribute 'defaults'"); at most 50 s.
# 2. issue 28: the cost of sampling stacks on the launch-bound job, which two runs a way could
#    not tell from noise on 2026-12-03 (alone 91 216 and 107 637 kernels a second): 8 repeats
#    of alone / counters / stacks, 5 s each, every run pinned to one core (taskset -c 3), with
#    each repeat's paired cost beside the pooled one; at most 330 s.
# 3. issue 28: one more fresh pair of the co-tenant job (its share was 62 % against a truth of
#    54 % in the first call); at most 90 s.
#
# A dry run without a GPU: DRY=1 OUT=/tmp/out bash scripts/device/session_1204.sh
cd "$(dirname "$0")/../.." || exit 2
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export OUT
log=/tmp/s1204-log.txt; rm -f "$log"
{
  echo "== session_1204.sh at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
  if [ "${DRY:-0}" = 1 ]; then
    timeout 60 bash scripts/device/storage2_h200.sh --dry; echo "storage rc=$?"
    DRY=1 timeout 120 bash scripts/device/watch_stacks.sh cost --jobs launch --seconds 1 \
      --repeats 2 --pin 0 --budget 100 --device cpu --scale tiny \
      --nvml-fixture tests/fixtures/nvml/watch-starved.json; echo "cost rc=$?"
  else
    timeout 50 bash scripts/device/storage2_h200.sh; echo "storage rc=$?"
    timeout 340 bash scripts/device/watch_stacks.sh cost --jobs launch --seconds 5 \
      --repeats 8 --pin 3 --budget 330; echo "cost rc=$?"
    timeout 90 bash scripts/device/watch_stacks.sh rerun --jobs cotenant; echo "watch rc=$?"
  fi
  echo "== done after ${SECONDS} s"
} > "$log" 2>&1
cp "$log" "$OUT/s1204-log.txt"
tar czf /tmp/s1204.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/s1204.tgz "$OUT/s1204.tgz"
cp "$log" "$OUT/s1204-log.txt"
tail -40 "$log"
