#!/usr/bin/env bash
# On a lent GPU machine (2026-12-06, eighteenth session): the whole tree at this commit beside a
# real GPU, as a regression run after the sessions that split the worker, moved torch out of
# test collection and made `check --peer` fail fast:
#   1. every gpu-marked test (README: `pytest -m gpu tests`), alone on the GPU;
#   2. the fast subset without them (`-m "not slow and not gpu"`, 16 workers): does a test
#      assume there is no GPU?
#   3. `sparkdiag check --json` on the idle GPU: parses, and which rows pass, warn, fail, skip;
#   4. `sparkdiag watch --json` on a real bf16 job (tests/support/probe_scripts/gpu_load.py).
#   bash scripts/device/regress_1206.sh   # carry: .whl/ (pyudev, bcrypt, py-spy) and
#                                         # .carry/testwhl/ (pytest, pytest-xdist, hypothesis,
#                                         # kubernetes-validate and their dependencies, cp312)
# Everything in ONE archive, $OUT/regress.tgz; a summary printed last.
. "$(dirname "$0")/setup.sh"
DIR="$OUT/regress"; mkdir -p "$DIR"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tsite \
  .carry/testwhl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/tsite"
export PATH="/tmp/site/bin:/tmp/tsite/bin:$PATH"
summary=()
{
  echo "== regress_1206.sh, $(date -u +%FT%TZ)"
  nvidia-smi -L
  python3 -c 'import sys, torch, pytest; print(sys.version.split()[0], torch.__version__, pytest.__version__)'
} > "$DIR/env.txt" 2>&1
cat "$DIR/env.txt"

start=$SECONDS
timeout 270 python3 -m pytest -p no:cacheprovider -q -rs -m gpu tests > "$DIR/gpu.txt" 2>&1
summary+=("gpu-marked: exit $? in $((SECONDS - start)) s: $(tail -1 "$DIR/gpu.txt")")

start=$SECONDS
timeout 150 python3 -m pytest -p no:cacheprovider -q -n 16 -m "not slow and not gpu" tests \
  > "$DIR/fast.txt" 2>&1
summary+=("fast subset, not gpu: exit $? in $((SECONDS - start)) s: $(tail -1 "$DIR/fast.txt")")

start=$SECONDS
timeout 90 python3 -m sparkdiag check --json > "$DIR/check.json" 2> "$DIR/check.err"
rc=$?
rows=$(python3 -c '
import collections, json, sys
d = json.load(open(sys.argv[1]))
print("parses;", dict(collections.Counter(r["status"] for r in d["checks"])))
' "$DIR/check.json" 2>&1 | tail -1)
summary+=("check --json: exit $rc in $((SECONDS - start)) s, $rows")

timeout 60 python3 -m sparkdiag watch --json --duration 20 -- \
  python3 tests/support/probe_scripts/gpu_load.py 12 > "$DIR/watch.json" 2> "$DIR/watch.err"
rc=$?
parsed=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("parses; verdict", d["verdict"])' "$DIR/watch.json" 2>&1 | tail -1)
summary+=("watch --json: exit $rc, $parsed")

echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$DIR/summary.txt"
grep -E "^(FAILED|ERROR|SKIPPED)" "$DIR/gpu.txt" "$DIR/fast.txt" | head -40
echo "== done after ${SECONDS} s"
tar czf /tmp/regress.tgz -C "$OUT" regress && rm -rf "$DIR" && mv /tmp/regress.tgz "$OUT/regress.tgz"
