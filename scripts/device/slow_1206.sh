#!/usr/bin/env bash
# On a lent GPU machine (2026-12-06, eighteenth session): the slow tests without the gpu-marked
# ones, 16 workers, each test's outcome as it ends (-v), then the failed ones again, alone, with
# their tracebacks. smoke_1206.sh ran them with -q, and its time ran out before pytest said
# which had failed.
#   bash scripts/device/slow_1206.sh   # carry: .whl/, .carry/testwhl/
# Everything in ONE archive, $OUT/slow.tgz; a summary printed last.
. "$(dirname "$0")/setup.sh"
DIR="$OUT/slow"; mkdir -p "$DIR"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tsite \
  .carry/testwhl/*.whl 2>/dev/null && export PYTHONPATH="$PYTHONPATH:/tmp/tsite"
export PATH="/tmp/site/bin:/tmp/tsite/bin:$PATH"
start=$SECONDS
timeout 300 python3 -m pytest -p no:cacheprovider -p no:benchmark -v -n 16 -m "slow and not gpu" \
  tests > "$DIR/slow.txt" 2>&1
echo "slow tests, not gpu: exit $? in $((SECONDS - start)) s: $(grep -c ' PASSED ' "$DIR/slow.txt") passed, $(grep -c ' FAILED ' "$DIR/slow.txt") failed, $(grep -c ' SKIPPED ' "$DIR/slow.txt") skipped: $(tail -1 "$DIR/slow.txt")" | tee "$DIR/summary.txt"
grep -oE 'FAILED [^ ]+' "$DIR/slow.txt" | sed 's/^FAILED //' | sort -u > "$DIR/failed.txt"
if [ -s "$DIR/failed.txt" ]; then
  start=$SECONDS
  timeout 200 python3 -m pytest -p no:cacheprovider -p no:benchmark -q -n 8 $(cat "$DIR/failed.txt") \
    > "$DIR/again.txt" 2>&1
  echo "the failed ones again: exit $? in $((SECONDS - start)) s: $(tail -1 "$DIR/again.txt")" | tee -a "$DIR/summary.txt"
fi
cat "$DIR/failed.txt"
grep -E '^E  ' "$DIR/again.txt" 2>/dev/null | sort | uniq -c | sort -rn | head -30
tar czf /tmp/slow.tgz -C "$OUT" slow && rm -rf "$DIR" && mv /tmp/slow.tgz "$OUT/slow.tgz"
