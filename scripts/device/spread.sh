#!/usr/bin/env bash
# On the lent GPU machine: 20 consecutive default-suite probes on the idle GPU (the spread).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
for i in $(seq 1 20); do python3 -m sparkdiag probe --json --no-record > "/tmp/probe-$i.json"; done
cp /tmp/probe-20.json "$OUT/probe-20.json"
python3 scripts/device/spread_table.py /tmp/probe-{1..20}.json | tee "$OUT/spread3.txt"
