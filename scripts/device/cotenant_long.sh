#!/usr/bin/env bash
# On the lent H200 (issue 28): is the co-tenant's share, which missed the truth by about 0.1
# either way over 8 s windows (docs/watch.md), closer over 30 s? Three fresh pairs of the
# cotenant job (ResNet-50 beside another process's bf16 matmul loop), each its own call of
# `watch_stacks.sh rerun`: 10 s alone without the neighbour, then 30 s watched beside it, in one
# process; no rule changed since the 8 s pairs. At most 330 s; one archive, $OUT/cotenant.tgz.
#
#   bash scripts/device/cotenant_long.sh          # carry: .whl/ (py-spy)
cd "$(dirname "$0")/../.." || exit 2
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export OUT
for n in 1 2 3; do
  timeout 105 bash scripts/device/watch_stacks.sh rerun --jobs cotenant --seconds 30 \
    --alone-seconds 10 --budget 100 --deadline 102 --out "/tmp/cotenant$n" \
    --archive "$OUT/watch/cotenant$n.tgz"
  echo "pair $n rc=$?"
done > /tmp/cotenant-log.txt 2>&1
cp /tmp/cotenant-log.txt "$OUT/cotenant-log.txt"
tar czf /tmp/cotenant.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/cotenant.tgz "$OUT/cotenant.tgz"
cp /tmp/cotenant-log.txt "$OUT/cotenant-log.txt"
grep -E "^cotenant|^right|pair . rc" /tmp/cotenant-log.txt
