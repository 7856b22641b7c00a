#!/usr/bin/env bash
# Issue 33 on a machine of 2, 4 or 8 H200s (nvidia-h200-x2/-x4/-x8), one call of at most 10
# minutes: scripts/device/multi_gpu.py's four steps (record-fixture, check and serve with a
# handicapped GPU, an NCCL all-reduce with a straggler and a rank that leaves, NVLink against
# nvidia-smi), bounded by --budget (default 520 s). Everything lands in ONE archive,
# $OUT/multigpu.tgz; the table is printed last. docs/multi-gpu.md says what each step expects.
#
#   bash scripts/device/multi_gpu.sh [--budget 520] [multi_gpu.py's arguments]
#
# Carried (the device machine has no network): .carry/prometheus.xz (Debian's prometheus 2.42
# binary, xz -c /usr/bin/prometheus: ~10 MB, links only glibc >= 2.34), or --prometheus PATH;
# .whl/ with py-spy (watch's stacks), bcrypt and pyudev (sparkdiag's own dependencies), installed
# with pip --target /tmp/site. --promtool PATH is optional (checks the shortened rules copy).
# On a machine without a GPU: bash scripts/device/multi_gpu.sh --dry (CPU torch, gloo, fixtures).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
budget=520
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [ "${args[$i]}" = "--budget" ] && budget=${args[$((i + 1))]:-520}
done
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
[ -x /tmp/site/bin/py-spy ] && export SPARKDIAG_PYSPY=/tmp/site/bin/py-spy
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
prom=()
if [[ " $* " != *" --prometheus "* ]]; then
  if [ -f .carry/prometheus.xz ]; then
    [ -x /tmp/prometheus ] || { xz -dc .carry/prometheus.xz > /tmp/prometheus && chmod +x /tmp/prometheus; }
    prom=(--prometheus /tmp/prometheus)
  elif [ -x .carry/prometheus ]; then
    prom=(--prometheus "$PWD/.carry/prometheus")
  fi
fi
WORK=$(mktemp -d /tmp/multigpu.XXXXXX)
echo "== multi_gpu.sh at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ), budget ${budget} s"
"${SPARKDIAG_PYSPY:-py-spy}" --version 2>&1 | head -1
# the driver wraps up by itself within its budget; this is the backstop
timeout --signal=TERM --kill-after=20 "$(( ${budget%.*} + 40 ))" \
  "$PY" scripts/device/multi_gpu.py --work "$WORK" --out "$OUT" "${prom[@]}" "$@"
rc=$?
if [ ! -s "$OUT/multigpu.tgz" ]; then  # the driver was killed before its archive
  tar -czf "$OUT/multigpu.tgz" -C "$WORK" --exclude=data multigpu && echo "packed $WORK by hand"
fi
echo "== multi_gpu.sh rc=$rc; $OUT/multigpu.tgz $(du -h "$OUT/multigpu.tgz" | cut -f1)"
exit $rc
