#!/usr/bin/env bash
# On the lent H200 (2026-12-04, fifth session): sparkdiag's own tests on a machine with a GPU.
# CI runs them where there is none; a developer with a DGX Spark or an H200 runs them beside the
# GPU, where NVML answers, torch sees CUDA and pyudev reads a real /sys. Steps, each bounded:
#   1. the gpu-marked tests (README: `pytest -m gpu tests`);
#   2. the fast subset (`-m "not slow"`) on 16 workers: does any test assume there is no GPU?
#   3. `watch --json` on a real bf16 job again, after f76fee7 (the job's output went into the
#      document on the first call of this session).
#   bash scripts/device/tests_h200.sh   # carry: .whl/ (pyudev, bcrypt, py-spy) and .carry/testwhl/
#                                       # (pytest, pytest-xdist, hypothesis, kubernetes-validate
#                                       # and their dependencies, for CPython 3.12)
# Everything in ONE archive, $OUT/tests.tgz; a summary printed last.
#   bash scripts/device/tests_h200.sh again   # the second call: what the interpreter loads at its
#     start (and the .pth files that load it), the fast subset without the gpu-marked tests (run
#     alone, they do not share the GPU with the other tests' loads), and the gpu-marked tests
#     alone, after the fixes of the first call's failures
. "$(dirname "$0")/setup.sh"
DIR="$OUT/tests"; mkdir -p "$DIR"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tsite \
  .carry/testwhl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/tsite"
export PATH="/tmp/site/bin:/tmp/tsite/bin:$PATH"
summary=()
{
  echo "== tests_h200.sh at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
  nvidia-smi -L; python3 -c 'import sys, torch, pytest; print(sys.version.split()[0], torch.__version__, pytest.__version__)'
} > "$DIR/env.txt" 2>&1
cat "$DIR/env.txt"

if [ "${1:-}" = again ]; then
  python3 -c 'import sys; print(" ".join(sorted(sys.modules)))' > "$DIR/startup-modules.txt"
  for site in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))'); do
    for pth in "$site"/*.pth; do [ -f "$pth" ] && { echo "== $pth"; head -c 400 "$pth"; echo; }; done
  done > "$DIR/pth.txt" 2>&1
  summary+=("at start: $(tr ' ' '\n' < "$DIR/startup-modules.txt" | grep -cE '^(tempfile|shutil|random|bz2|lzma)$') of tempfile, shutil, random, bz2, lzma loaded; $(grep -c '^==' "$DIR/pth.txt") .pth files")
  start=$SECONDS
  timeout 300 python3 -m pytest -p no:cacheprovider -q -n 16 -m "not slow and not gpu" tests > "$DIR/fast.txt" 2>&1
  summary+=("fast subset, not gpu: exit $? in $((SECONDS - start)) s: $(tail -1 "$DIR/fast.txt")")
  start=$SECONDS
  timeout 240 python3 -m pytest -p no:cacheprovider -q -m gpu tests > "$DIR/gpu.txt" 2>&1
  summary+=("gpu-marked: exit $? in $((SECONDS - start)) s: $(tail -1 "$DIR/gpu.txt")")
  echo "== summary"
  printf '%s\n' "${summary[@]}" | tee "$DIR/summary.txt"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$DIR/gpu.txt" "$DIR/fast.txt" | head -40
  tar czf /tmp/tests.tgz -C "$OUT" tests && rm -rf "$DIR" && mv /tmp/tests.tgz "$OUT/tests.tgz"
  exit 0
fi

start=$SECONDS
timeout 300 python3 -m pytest -p no:cacheprovider -q -m gpu tests > "$DIR/gpu.txt" 2>&1
summary+=("gpu-marked: exit $? in $((SECONDS - start)) s: $(tail -1 "$DIR/gpu.txt")")

start=$SECONDS
timeout 330 python3 -m pytest -p no:cacheprovider -q -n 16 -m "not slow" tests > "$DIR/fast.txt" 2>&1
summary+=("fast subset: exit $? in $((SECONDS - start)) s: $(tail -1 "$DIR/fast.txt")")

timeout 90 python3 -m sparkdiag watch --json --duration 25 -- \
  python3 tests/support/probe_scripts/gpu_load.py 15 > "$DIR/watch.json" 2> "$DIR/watch.err"
rc=$?
parsed=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("parses; verdict", d["verdict"])' "$DIR/watch.json" 2>&1 | tail -1)
summary+=("watch --json: exit $rc, $parsed; the job's 'ready' on stderr: $(grep -c '^ready' "$DIR/watch.err")")

echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$DIR/summary.txt"
grep -E "^(FAILED|ERROR)" "$DIR/gpu.txt" "$DIR/fast.txt" | head -40
echo "== done after ${SECONDS} s"
tar czf /tmp/tests.tgz -C "$OUT" tests && rm -rf "$DIR" && mv /tmp/tests.tgz "$OUT/tests.tgz"
