#!/usr/bin/env bash
# On the lent GPU machine (issue 28): sparkdiag watch with the jobs' Python stacks. Two calls,
# each well inside the 10-minute limit; the wheels under .whl/ (py-spy among them: it is what
# reads the stacks) are installed first, as the other device scripts do.
#
#   bash scripts/device/watch_stacks.sh jobs   # ~9 min: watch_jobs.py's default jobs (a job per
#                                              # cause, a co-tenant, three healthy), --budget 540;
#                                              # everything in $OUT/watch/watch_jobs.tgz
#   bash scripts/device/watch_stacks.sh cost   # ~150 s: watch_stack_cost.py, GPU-bound and
#                                              # launch-bound alone / counters / stacks, 3 repeats;
#                                              # $OUT/watch/watch_cost.tgz
#   bash scripts/device/watch_stacks.sh rerun  # at most 170 s in all (wheels included): fresh
#                                              # runs of the jobs the 2026-12-03 recordings were
#                                              # fixed on: vit (healthy, watched only), cotenant,
#                                              # lightning-checkpoint, compile-recompile (each
#                                              # without its defect, then watched with it, in one
#                                              # process: imports paid once), 8 s watched, 5 s
#                                              # alone (steady sooner without a defect); every
#                                              # recording, diagnosis, log and the table in ONE
#                                              # archive, $OUT/watch/rerun.tgz; the table last
#
# Further arguments go to the script. The log is $OUT/watch/log.txt. DRY=1 runs the same on
# this machine's CPU, tiny models and a scripted GPU (tests/fixtures/nvml/watch-starved.json).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/watch"
mode=${1:-jobs}; shift || true
RERUN_SECONDS=170  # the whole call's budget for rerun, this script's own start included
dry=()
if [ "${DRY:-0}" = 1 ]; then
  dry=(--device cpu --scale tiny --nvml-fixture tests/fixtures/nvml/watch-starved.json)
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
[ -x /tmp/site/bin/py-spy ] && export SPARKDIAG_PYSPY=/tmp/site/bin/py-spy
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OUT
exec > >(tee -a "$OUT/watch/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,power.draw --format=csv,noheader \
  || echo "no nvidia-smi"
nproc; free -g | head -2; df -h /tmp | tail -1
"${SPARKDIAG_PYSPY:-py-spy}" --version || echo "py-spy missing: watch will judge from counters alone"
cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo "no Yama"
case "$mode" in
  jobs)
    python3 scripts/device/watch_jobs.py --out /tmp/watch --archive "$OUT/watch/watch_jobs.tgz" \
      --seconds 12 --budget 540 "$@" ;;
  cost)
    python3 scripts/device/watch_stack_cost.py --out /tmp/watch-cost \
      --archive "$OUT/watch/watch_cost.tgz" --seconds 3 --repeats 3 --budget 145 "$@" ;;
  rerun)
    left=$((RERUN_SECONDS - SECONDS - 3))  # bash's SECONDS: this script's time so far
    python3 scripts/device/watch_jobs.py --out /tmp/watch-rerun --archive "$OUT/watch/rerun.tgz" \
      --jobs vit,cotenant,lightning-checkpoint,compile-recompile --seconds 8 --alone-seconds 5 \
      --same-process \
      --no-versions --no-plot --budget $((left - 8)) --deadline "$left" "${dry[@]}" "$@" ;;
  *) echo "usage: watch_stacks.sh jobs|cost|rerun [args]"; exit 2 ;;
esac
echo "rc=$?"
