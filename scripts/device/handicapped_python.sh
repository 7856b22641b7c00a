#!/usr/bin/env bash
# A deliberately handicapped stand-in "container" for sparkdiag compare on the lent GPU machine
# (which has no container runtime): the worker runs pinned to one CPU with one thread, while a
# second process runs bf16 matmuls on the same GPU for as long as the worker lives.
# Usage: sparkdiag compare --probe-when always -- scripts/device/handicapped_python.sh python3 -
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
python3 "$here/tests/support/probe_scripts/gpu_load.py" 120 > /tmp/handicap-load.out 2>&1 &
load=$!
for _ in $(seq 1 100); do grep -q ready /tmp/handicap-load.out 2>/dev/null && break; sleep 0.1; done
OMP_NUM_THREADS=1 taskset -c 0 "$@"
rc=$?
kill "$load" 2>/dev/null; wait "$load" 2>/dev/null
exit $rc
