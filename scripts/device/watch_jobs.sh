#!/usr/bin/env bash
# On the lent GPU machine: scripts/device/watch_jobs.py (training jobs alone and under
# sparkdiag watch) with the wheels under .whl/ installed first, as the other device scripts do
# (bcrypt and the like for the CLI's import). Arguments go to watch_jobs.py; by default the
# framework jobs. The run's files go to /tmp/watch_jobs and are packed into ONE archive,
# $OUT/watch_jobs.tgz (after each job, so a run cut short still brings back what it did); the
# log is $OUT/log.txt.
#
#   bash scripts/device/watch_jobs.sh --seconds 15 --budget 510
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OUT
exec > >(tee -a "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,power.draw --format=csv,noheader
nproc; free -g | head -2; df -h /tmp | tail -1
python3 -c 'import matplotlib' 2>/dev/null && echo "matplotlib: timeline PNGs written" \
  || echo "matplotlib missing: render the PNGs from the recordings (sparkdiag watch --replay R --plot P)"
python3 scripts/device/watch_jobs.py --out /tmp/watch_jobs --archive "$OUT/watch_jobs.tgz" "$@"
echo "rc=$?"
