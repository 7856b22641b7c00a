#!/usr/bin/env bash
# On the lent H200 (issue 35): what the daemon costs sitting idle, against nvitop-exporter and the
# floors measured in the same run, then the scrape figures against nvitop-exporter again (to
# show none got worse). About 3.5 minutes (at most 5: each step has a timeout); one GPU, a 1 s
# poll for every process.
#
#   bash scripts/device/idle_cost.sh
#
# 1. benchmarks/idle_cost.py --real --seconds 120 (about 150 s): at the same time, sparkdiag
#    serve without its probe (as nvitop-exporter has none), the same with --compat.dcgm
#    --process-metrics, the default configuration (probe scheduler and store, first cycle after
#    the window), nvitop-exporter --interval 1, and the floors: a bare python, python with
#    pynvml initialised and one query a second, that with psutil, prometheus-client, click,
#    PyYAML, h11 and bcrypt imported, that with sparkdiag.cli. Each exporter is scraped three
#    times (1.1 s apart, Prometheus' headers), then nobody scrapes for 120 s. Beside them, not
#    measured: one more sparkdiag under py-spy (where its time goes) and a process timing each
#    NVML query at the daemon's cadence (where the NVML time goes).
# 2. scripts/device/scrape_peers.py --scrapes 300 --cold 20 --idle 5 (about 60 s): scrape
#    latency of sparkdiag, nvitop-exporter and nvidia-smi, as in the fourth session.
#
# With .carry/base-src.tar (`git archive REV sparkdiag`), the variants of that code run beside
# in the same window (rows base:NAME): before and after a change under the same load.
#
# Carried: .whl/ with the nvitop and nvitop-exporter wheels (1.7.2 as before), bcrypt and py-spy
# (py-spy is optional: without it the profile is left out). Everything goes to
# $OUT/idle_cost/: log.txt, idle.txt and idle.json (step 1), run/ (every process's log,
# py-spy.txt), scrape_peers.tar.gz (step 2); the tables are printed at the end. One step failing
# does not stop the other.
#
# A dry run without a GPU (fixtures, no nvitop-exporter, a 20 s window):
#   IDLE_COST_DRY=1 OUT=/tmp/out bash scripts/device/idle_cost.sh
set -u
OUT=${OUT:-/tmp/out}
DIR=$OUT/idle_cost
mkdir -p "$DIR"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec > >(tee -a "$DIR/log.txt") 2>&1
started=$(date +%s)
# SPARKDIAG_REV: the commit the copy was made from (the device's copy may hold an older .git)
echo "== idle_cost.sh at ${SPARKDIAG_REV:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}, $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader 2>&1 | head -2
"$PY" -c 'import sys, sqlite3; print("python", sys.version.split()[0], "sqlite", sqlite3.sqlite_version)'

# nvitop-exporter, bcrypt and py-spy are not on the image: carried as wheels
if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1; then
  if [ ! -d /tmp/site/nvitop_exporter ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
      || echo "wheels: install failed"
  fi
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
SPY=$(command -v py-spy || true)
[ -z "$SPY" ] && [ -x /tmp/site/bin/py-spy ] && SPY=/tmp/site/bin/py-spy

args=(--out "$DIR/run" --json "$DIR/idle.json" --nvml-profile)
# the code before a change, run beside it in the same window (base:NAME rows): a tar of
# `git archive REV sparkdiag`, carried as .carry/base-src.tar (its REV in .carry/base-src.rev)
if [ -f .carry/base-src.tar ]; then
  rm -rf /tmp/base-src && mkdir -p /tmp/base-src
  if tar -xf .carry/base-src.tar -C /tmp/base-src; then
    args+=(--base-src /tmp/base-src) && echo "base: $(cat .carry/base-src.rev 2>/dev/null)"
  else
    echo "base: .carry/base-src.tar did not unpack: run without the base"
  fi
fi
[ -n "$SPY" ] && args+=(--py-spy "$SPY") || echo "py-spy: not found, no profile"
if [ "${IDLE_COST_DRY:-}" = 1 ]; then
  args+=(--seconds "${IDLE_SECONDS:-20}" --variant 1gpu --variant 1gpu+probe)
  scrape=(--nvml-fixture tests/fixtures/nvml/h200-idle.json --scrapes 40 --cold 3 --idle 3)
else
  args+=(--real --seconds 120)
  scrape=(--scrapes 300 --cold 20 --idle 5)
  if "$PY" -c 'import nvitop_exporter' 2> /dev/null; then
    args+=(--peer-cmd "$PY -m nvitop_exporter --bind-address 127.0.0.1 --port {port} --interval 1")
  else
    echo "nvitop-exporter: not importable, measured without the peer"
  fi
fi

echo "== 1. idle cost ($(date -u +%T))"
timeout 230 "$PY" benchmarks/idle_cost.py "${args[@]}" > "$DIR/idle.txt" 2>&1
echo "idle_cost.py rc=$?"

echo "== 2. scrape latency against nvitop-exporter ($(date -u +%T))"
timeout 70 "$PY" scripts/device/scrape_peers.py --out "$DIR" "${scrape[@]}" > "$DIR/scrape.txt" 2>&1
echo "scrape_peers.py rc=$?"

echo "== results ($(( $(date +%s) - started )) s)"
cat "$DIR/idle.txt"
grep -v "^wrote" "$DIR/scrape.txt"
