#!/usr/bin/env bash
# On a lent GPU machine (2026-12-06, eighteenth session): watch and PSI of a shared cgroup.
# regress_1206.sh's fast subset failed one test there: 16 parallel tests beside watch's job in
# the container's cgroup made that cgroup's I/O PSI 26 %, and watch advised a faster store for
# a job (cat on a FIFO) that read nothing. c301b82 calls such a cgroup "shared-cgroup". Here:
#   1. the cgroup and its I/O PSI, idle and under an I/O load (dd with O_DIRECT, in a loop);
#   2. under that load, that test alone, 3 times with the tree before c301b82 (carried as
#      .carry/before/, run from its own folder) and 3 times with this tree, alternated;
#   3. the fast subset without the gpu-marked tests again, 16 workers, with this tree.
#   bash scripts/device/shared_cgroup.sh   # carry: .whl/, .carry/testwhl/, .carry/before/
# Everything in ONE archive, $OUT/shared.tgz; a summary printed last.
. "$(dirname "$0")/setup.sh"
DIR="$OUT/shared"; mkdir -p "$DIR"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tsite \
  .carry/testwhl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/tsite"
BASE=/tmp/site:/tmp/tsite
TEST=tests/test_watch_command.py::test_text_report_names_the_cause_its_evidence_and_what_to_try
cg=$(sed -n 's/^0:://p' /proc/self/cgroup)
psi() { echo "$1: cgroup $cg: $(head -1 "/sys/fs/cgroup${cg%/}/io.pressure" 2>&1) | host: $(head -1 /proc/pressure/io 2>&1)"; }
summary=()
{
  echo "== shared_cgroup.sh, $(date -u +%FT%TZ)"; nvidia-smi -L
  echo "processes in this cgroup: $(wc -l < "/sys/fs/cgroup${cg%/}/cgroup.procs")"
  df -h "$HOME" | tail -1
} > "$DIR/env.txt" 2>&1
psi idle >> "$DIR/env.txt"; cat "$DIR/env.txt"

( while :; do dd if=/dev/zero of="$HOME/ioload" bs=1M count=256 oflag=direct conv=fsync 2>/dev/null; done ) &
loader=$!
sleep 5; psi "under load, 5 s in" | tee -a "$DIR/env.txt"
for round in 1 2 3; do
  for tree in before after; do
    where=$PWD; [ $tree = before ] && where=$PWD/.carry/before
    ( cd "$where" && PYTHONPATH="$where:$BASE" timeout 60 python3 -m pytest -p no:cacheprovider \
        -q "$TEST" ) > "$DIR/$tree-$round.txt" 2>&1
    rc=$?
    summary+=("$tree, round $round: exit $rc: $(tail -1 "$DIR/$tree-$round.txt")")
  done
done
psi "under load, at the end" | tee -a "$DIR/env.txt"
kill $loader; wait $loader 2>/dev/null; rm -f "$HOME/ioload"

start=$SECONDS
timeout 150 python3 -m pytest -p no:cacheprovider -q -n 16 -m "not slow and not gpu" tests \
  > "$DIR/fast.txt" 2>&1
summary+=("fast subset, not gpu, this tree: exit $? in $((SECONDS - start)) s: $(tail -1 "$DIR/fast.txt")")

echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$DIR/summary.txt"
grep -h -E "^(FAILED|ERROR)|stalled on I/O" "$DIR"/*.txt | sort | uniq -c | head -20
echo "== done after ${SECONDS} s"
tar czf /tmp/shared.tgz -C "$OUT" shared && rm -rf "$DIR" && mv /tmp/shared.tgz "$OUT/shared.tgz"
