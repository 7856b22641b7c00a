#!/usr/bin/env bash
# On the lent H200, after the 2026-12-05 sessions: what they changed and no GPU here could run.
# At most about 6 minutes (3 as a rule); each step bounded, one failing does not stop the
# others; everything in ONE archive, $OUT/after.tgz, with the log printed last. Then, in the
# same call, the watch loop jobs with the time left:
#
#   s=$SECONDS; bash scripts/device/after_1205.sh
#   bash scripts/device/watch_jobs.sh --seconds 12 --budget $((560 - SECONDS + s)) --jobs ...
#
#   bash scripts/device/after_1205.sh       (carry .whl and .carry/testwhl: bcrypt, pyudev, py-spy)
#
# 1. pytest -m gpu: the GPU tests at this tree.
# 2. the periodic probe's default suite once, whole (`probe --json --no-record`): every figure's
#    status, delivered and peak, after the day's changes to the worker (left out of verify_1205.sh's
#    QUICK run).
# 3. `check --json` on the H200, idle: every row's status, and how long it took.
# 4. (added after the first run) cuobjdump's listing of tests/fixtures/fatbin/cufftw-like.so,
#    for the fixture's recorded listing, and the symbols of the wheel's libcufftw.so.12 cubin
#    (no kernel in it: the stub rule's new reading); `native --json`: what is judged.
cd "$(dirname "$0")/../.." || exit 2
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
work=$(mktemp -d); log="$work/after-log.txt"
py=${PYTHON:-python3}
{
  echo "== after_1205.sh, $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,temperature.gpu,power.draw --format=csv,noheader
  "$py" -m pip install -q --no-index --find-links .whl --find-links .carry/testwhl bcrypt \
    pyudev py-spy > /dev/null 2>&1 || echo "wheels not installed (carry .whl, .carry/testwhl)"
  timeout 150 "$py" -m pytest -m gpu tests -q -p no:cacheprovider > "$work/pytest-gpu.txt" 2>&1
  echo "pytest -m gpu rc=$?"; tail -3 "$work/pytest-gpu.txt"
  start=$SECONDS
  timeout 120 "$py" -m sparkdiag probe --json --no-record > "$work/probe-default.json" \
    2> "$work/probe-default.err"; echo "probe default rc=$? in $((SECONDS - start)) s"
  "$py" - "$work/probe-default.json" <<'PY' || true
import json, sys
doc = json.load(open(sys.argv[1]))
for gpu in doc["gpus"]:
    print(gpu.get("name"), gpu.get("result"), gpu.get("reason"))
    for r in gpu.get("figures", []):
        print(f'  {r.get("dtype", "?"):6} {r.get("kind", "?"):8} {r.get("shape", "?"):16} '
              f'beta={r.get("beta")} {r.get("status", "?"):11} {r.get("delivered_tflops")} '
              f'peak {r.get("peak_tflops")} {r.get("reason") or ""}')
PY
  start=$SECONDS
  timeout 60 "$py" -m sparkdiag check --json > "$work/check.json" 2> "$work/check.err"
  echo "check rc=$? in $((SECONDS - start)) s"
  "$py" - "$work/check.json" <<'PY' || true
import json, sys
doc = json.load(open(sys.argv[1]))
for row in doc.get("checks", []):
    print(f'  {row.get("status", "?"):5} {row.get("name", "?"):28} {(row.get("finding") or "")[:90]}')
PY
  cuobjdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  (cd tests/fixtures/fatbin && "$cuobjdump" --list-elf --list-ptx cufftw-like.so) \
    > "$work/cufftw-like.cuobjdump.txt" 2> "$work/cufftw-like.cuobjdump.err"
  echo "cuobjdump cufftw-like.so rc=$?: $(cat "$work/cufftw-like.cuobjdump.txt")"
  "$cuobjdump" --version | tail -1
  lib=$("$py" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13/lib"))' 2>/dev/null)
  for name in libcufftw.so.12 libcufft.so.12; do
    [ -f "$lib/$name" ] || continue
    timeout 60 "$cuobjdump" --dump-elf-symbols "$lib/$name" > "$work/$name.symbols.txt" 2>&1
    echo "$name symbols rc=$?: $(grep -c FUNC "$work/$name.symbols.txt") FUNC lines"
  done
  start=$SECONDS
  timeout 120 "$py" -m sparkdiag native --json > "$work/native.json" 2> "$work/native.err"
  echo "native rc=$? in $((SECONDS - start)) s"
  "$py" - "$work/native.json" <<'PY' || true
import json, sys
doc = json.load(open(sys.argv[1]))
for key, rows in doc.items():
    if isinstance(rows, list):
        print(f"  {key}: {len(rows)}", [r.get("library", r) if isinstance(r, dict) else r for r in rows][:4])
PY
  echo "== done after ${SECONDS} s"
} > "$log" 2>&1
tar -C "$work" -czf "$OUT/after.tgz" . && rm -rf "$work"
tar -xOzf "$OUT/after.tgz" ./after-log.txt
