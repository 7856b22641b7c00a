#!/usr/bin/env bash
# On the lent GPU machine: scripts/device/watch_jobs.py (synthetic jobs alone and under
# sparkdiag watch) with the wheels under .whl/ installed first, as the other device scripts do
# (bcrypt for the CLI's import; matplotlib and its dependencies for the timeline PNGs, which
# are otherwise rendered later from the recordings). Results and log.txt under $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OUT
exec > >(tee -a "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,power.draw --format=csv,noheader
python3 -c 'import torch, pynvml; print("torch", torch.__version__, "nvidia-ml-py", pynvml.__version__ if hasattr(pynvml, "__version__") else "?")'
python3 -c 'import matplotlib' 2>/dev/null && echo "matplotlib: timeline PNGs written" \
  || echo "matplotlib missing: render the PNGs from the recordings (sparkdiag watch --replay R --plot P)"
python3 scripts/device/watch_jobs.py --out "$OUT" "$@"
echo "rc=$?"
