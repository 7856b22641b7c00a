#!/usr/bin/env bash
# The lent H200 runs of 2026-12-01 (fourth session), one call per group of parts:
#   bash scripts/device/session4.sh stall dcgm        # issue 20 (stall with a real Prometheus), 24
#   bash scripts/device/session4.sh scrape peers      # issue 23 (scrape vs nvitop-exporter), 22
#   bash scripts/device/session4.sh watch             # issue 19 (the watch jobs)
# Carried: .carry/prometheus.xz (Debian's prometheus 2.42 binary, xz) and .whl/ (nvitop and
# nvitop-exporter 1.7.2 wheels, bcrypt 5.0.0). Each part writes its own archive under $OUT; this script adds
# env.txt (the machine, driver, torch) and the log of every part.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
LOG=$OUT/session4.log
exec > >(tee -a "$LOG") 2>&1
{
  date -u; nproc; nvidia-smi --query-gpu=name,driver_version,pci.bus_id,power.limit --format=csv
  python3 -c 'import torch, pynvml; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} > "$OUT/env.txt" 2>&1
if [ -f .carry/prometheus.xz ] && [ ! -x /tmp/prometheus ]; then
  xz -dc .carry/prometheus.xz > /tmp/prometheus && chmod +x /tmp/prometheus
fi
export PROMETHEUS=/tmp/prometheus
# bcrypt (sparkdiag's dependency) and nvitop-exporter are not on the image: carried as wheels
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
for part in "$@"; do
  echo "=== $part $(date -u +%T)"
  start=$(date +%s)
  case $part in
    stall) python3 scripts/device/stall.py ;;
    dcgm) python3 scripts/device/dcgm_agreement.py --rounds 3 ;;
    scrape) python3 scripts/device/scrape_peers.py --out "$OUT" ;;
    peers) bash scripts/device/peers_h200.sh ;;
    watch) bash scripts/device/watch_jobs.sh --seconds 15 --budget 470 --startup-timeout 45 ;;
    *) echo "unknown part $part" ;;
  esac
  echo "=== $part rc=$? in $(( $(date +%s) - start )) s"
done
