#!/usr/bin/env bash
# On the lent GPU machine (2026-12-06, seventeenth session), two things this session changed:
#   1. check --peer with a malformed peer ('127.0.0.1:'): with check/gather.py as it was before
#      62ab755 (carried as .carry/gather-before-62ab755.py) the usage error came after the probe
#      and the host's readings; at this tree it comes before anything is measured. Exit status
#      and seconds of each, and the first lines each wrote.
#   2. the probe worker's test modules, whose in-process tests now take torch from a session
#      fixture (e3f16e7) and whose gpu-marked tests ask pytest.importorskip for it: run with
#      their gpu-marked tests, on a GPU, where CI never runs them.
#   bash scripts/device/peer_first.sh   # carry: .whl/, .carry/gather-before-62ab755.py
# The "before" tree runs from its own folder: `python -m` puts the working directory first on
# sys.path, so run from this checkout it would import this checkout's sparkdiag (the first call
# did, and both trees answered in 0.4 s).
# Everything in ONE archive, $OUT/peer.tgz; a summary printed last.
. "$(dirname "$0")/setup.sh"
DIR="$OUT/peer"; mkdir -p "$DIR"
summary=()
{
  echo "== peer_first.sh, $(date -u +%FT%TZ)"
  nvidia-smi -L; python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)'
} > "$DIR/env.txt" 2>&1
cat "$DIR/env.txt"

rm -rf /tmp/before && mkdir -p /tmp/before && cp -r sparkdiag /tmp/before/
cp .carry/gather-before-62ab755.py /tmp/before/sparkdiag/check/gather.py
for tree in before now; do
  root=$PWD; [ "$tree" = before ] && root=/tmp/before
  cd "$root"
  export PYTHONPATH="$root:${PYTHONPATH#*:}"
  python3 -c 'import sparkdiag.check.gather as g; print(g.__file__)' > "$DIR/check-$tree.which" 2>&1
  start=$(date +%s.%N)
  timeout 300 python3 -m sparkdiag check --peer '127.0.0.1:' \
    > "$DIR/check-$tree.out" 2> "$DIR/check-$tree.err"
  rc=$?
  seconds=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
  cd - > /dev/null
  summary+=("check --peer 127.0.0.1: ($tree, $(cat "$DIR/check-$tree.which")): exit $rc in $seconds s; stderr: $(head -c 300 "$DIR/check-$tree.err" | tr '\n' ' ')")
done
export PYTHONPATH="$PWD:${PYTHONPATH#*:}"

start=$SECONDS
timeout 420 python3 -m pytest -p no:cacheprovider -q -rs -m "gpu or not slow" \
  tests/test_probe_worker.py tests/test_probe_worker_kernels.py tests/test_probe_worker_dtypes.py \
  tests/test_probe_worker_soak.py tests/test_probe_worker_copies.py > "$DIR/worker-tests.txt" 2>&1
summary+=("worker test modules, gpu-marked included: exit $? in $((SECONDS - start)) s: $(tail -1 "$DIR/worker-tests.txt")")

echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$DIR/summary.txt"
grep -E "^(FAILED|ERROR|SKIPPED)" "$DIR/worker-tests.txt" | head -20
tar czf /tmp/peer.tgz -C "$OUT" peer && rm -rf "$DIR" && mv /tmp/peer.tgz "$OUT/peer.tgz"
