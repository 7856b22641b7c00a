#!/usr/bin/env bash
# On the lent GPU machine: 20 consecutive default-suite probes on the idle GPU (the spread).
. "$(dirname "$0")/setup.sh"
for i in $(seq 1 20); do python3 -m sparkdiag probe --json --no-record > "/tmp/probe-$i.json"; done
cp /tmp/probe-20.json "$OUT/probe-20.json"
python3 scripts/device/spread_table.py /tmp/probe-{1..20}.json | tee "$OUT/spread3.txt"
