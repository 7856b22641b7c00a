#!/usr/bin/env bash
# On the lent H200, one call for what the 2026-12-04 session could not run (it had no device
# time): at most 9 minutes in all, each step bounded by its own script, one failing does not
# stop the others, and everything ends in ONE archive, $OUT/next.tgz (the device tool brings
# back only a few files), with the steps' tables printed last.
#
#   bash scripts/device/next_session.sh          # carry: .whl/ and .carry/ (fio)
#
# 1. issue 28, out of sample: watch_stacks.sh rerun with cotenant (the co-tenant's share, 13
#    points over the truth on 2026-12-03), compile-recompile (the torn-stack rule, made on that
#    run's recording) and resnet-loader (the DataLoader workers' lines, never run on a GPU);
#    at most 170 s.
# 2. issue 35: idle_cost.sh, the idle daemon beside nvitop-exporter with the scan in a child,
#    the children's CPU counted and the `stack` floor; about 4 minutes.
# 3. issue 30: storage2_h200.sh, GPUDirect Storage through kvikio with rapids-logger installed,
#    and a second huge-page round against fio; at most 45 s.
#
# A dry run without a GPU: DRY=1 OUT=/tmp/out bash scripts/device/next_session.sh (each step's
# own dry mode; resnet-loader needs timm, so without it that job is skipped).
cd "$(dirname "$0")/../.." || exit 2
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export OUT
log=/tmp/next-log.txt; rm -f "$log"
{
  echo "== next_session.sh at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
  if [ "${DRY:-0}" = 1 ]; then
    DRY=1 timeout 200 bash scripts/device/watch_stacks.sh rerun \
      --jobs compile-recompile,launch-bound; echo "watch rc=$?"
    IDLE_COST_DRY=1 timeout 120 bash scripts/device/idle_cost.sh; echo "idle rc=$?"
    timeout 60 bash scripts/device/storage2_h200.sh --dry; echo "storage rc=$?"
  else
    timeout 180 bash scripts/device/watch_stacks.sh rerun \
      --jobs cotenant,compile-recompile,resnet-loader; echo "watch rc=$?"
    timeout 270 bash scripts/device/idle_cost.sh; echo "idle rc=$?"
    timeout 50 bash scripts/device/storage2_h200.sh; echo "storage rc=$?"
  fi
  echo "== done after ${SECONDS} s"
} > "$log" 2>&1
# one archive of everything the steps wrote, then only it and the log are left to bring back
cp "$log" "$OUT/next-log.txt"
tar czf /tmp/next.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/next.tgz "$OUT/next.tgz"
cp "$log" "$OUT/next-log.txt"
tail -60 "$log"
