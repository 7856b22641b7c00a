#!/usr/bin/env bash
# On the lent H200, one call for what the 2026-12-05 (third) session fixed without a GPU: at most
# 9 minutes, each step bounded, one failing does not stop the others, everything in ONE archive,
# $OUT/verify.tgz, with the log printed last.
#
#   bash scripts/device/verify_1205.sh    (carry .whl and .carry/testwhl: bcrypt, pyudev)
#   DRY=1 OUT=/tmp/out bash scripts/device/verify_1205.sh   # without a GPU: what runs on a CPU
#
# 1. pytest -m gpu: the GPU tests, after the day's changes to the runner (bounded wait after
#    SIGKILL), the scheduler (fresh busy checks, stop) and the worker's shape rules.
# 2. /proc/devices: the names of the NVIDIA majors, which the systemd unit's DeviceAllow lines
#    (char-nvidia-frontend, char-nvidia, char-nvidia-uvm) must match; read, never changed.
# 3. torch's shape checks on CUDA: int8 at M 8 (_int_mm wants M > 16) must read unsupported, not
#    fail the cycle; fp8 with N 4104 is refused before the worker (N divisible by 16).
# 4. beta=1 out of place against in place: torch.addmm(c, a, b) copies C each iteration (a
#    review's estimate: about 4 % of the bf16 8192 cube); c.addmm_(a, b) does not. The figures
#    decide whether the worker's beta=1 kernel changes (it was left as it is without a GPU).
cd "$(dirname "$0")/../.." || exit 2
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
work=$(mktemp -d); log="$work/verify-log.txt"
py=${PYTHON:-python3}
{
  echo "== verify_1205.sh at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
  if [ "${DRY:-0}" = 1 ]; then
    echo "-- dry: no GPU steps; the CPU's view of step 3"
    timeout 120 "$py" -m sparkdiag probe --device cpu --shape 8x64x64 --dtype int8 --json \
      --no-record > "$work/int8-m8.json"; echo "int8 m8 rc=$?"
  else
    # the tests import bcrypt and pyudev, which the device lacks: carry .whl and .carry/testwhl
    "$py" -m pip install -q --no-index --find-links .whl --find-links .carry/testwhl bcrypt \
      pyudev > /dev/null 2>&1 || echo "bcrypt and pyudev not installed (carry .whl, .carry/testwhl)"
    timeout 200 "$py" -m pytest -m gpu tests -q -p no:cacheprovider > "$work/pytest-gpu.txt" 2>&1
    echo "pytest -m gpu rc=$?"; tail -3 "$work/pytest-gpu.txt"
    grep -i nvidia /proc/devices > "$work/proc-devices.txt"; echo "proc/devices:"
    cat "$work/proc-devices.txt"
    timeout 120 "$py" -m sparkdiag probe --shape 8x4096x4096 --dtype int8 --json --no-record \
      > "$work/int8-m8.json" 2> "$work/int8-m8.err"; echo "int8 m8 rc=$? (expect 1: unsupported)"
    timeout 60 "$py" -m sparkdiag probe --shape 64x4104x8192 --dtype fp8 --no-record \
      > "$work/fp8-n4104.txt" 2>&1; echo "fp8 n4104 rc=$? (expect 2: refused)"
    timeout 120 "$py" - > "$work/addmm.txt" 2>&1 <<'PY'
import torch
n, iters = 8192, 50
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
def timed(fn):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (start.elapsed_time(end) / 1e3) / 1e12
out_of_place = timed(lambda: torch.addmm(c, a, b))
in_place = timed(lambda: c.addmm_(a, b))
plain = timed(lambda: a @ b)
print(f"bf16 {n} beta=0 {plain:.1f} TFLOPS, beta=1 addmm {out_of_place:.1f}, addmm_ {in_place:.1f}")
PY
    echo "addmm rc=$?"; cat "$work/addmm.txt"
    # 5. which CUDA kernels the decode rows run (M 1, N = K = 8192): a review said tf32's decode
    #    row runs an FP32 GEMV, not a TF32 tensor-core kernel; the profiler's kernel names say
    timeout 120 "$py" - > "$work/decode-kernels.txt" 2>&1 <<'PY'
import torch
from torch.profiler import ProfilerActivity, profile
torch.set_float32_matmul_precision("high")
for name, dt in (("tf32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
    a = torch.randn(1, 8192, device="cuda", dtype=dt)
    w = torch.randn(8192, 8192, device="cuda", dtype=dt)
    for _ in range(3):
        torch.mm(a, w.t())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            torch.mm(a, w.t())
        torch.cuda.synchronize()
    kernels = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
    print(f"{name} decode M=1 8192x8192: {kernels}")
PY
    echo "decode kernels rc=$?"; cat "$work/decode-kernels.txt"
    # 6. the periodic probe's default suite once, whole, after the day's changes to the worker
    #    (QUICK=1 leaves it out: pytest -m gpu runs the worker on the GPU too)
    [ "${QUICK:-0}" = 1 ] || timeout 150 "$py" -m sparkdiag probe --json --no-record > "$work/probe-default.json" \
      2> "$work/probe-default.err"; echo "probe default rc=$?"
    [ "${QUICK:-0}" = 1 ] || "$py" - "$work/probe-default.json" <<'PY' || true
import json, sys
doc = json.load(open(sys.argv[1]))
for gpu in doc["gpus"]:
    print(gpu["name"], gpu["result"], gpu["reason"])
    for r in gpu["figures"]:
        print(f'  {r["dtype"]:6} {r["kind"]:8} {r["shape"]:16} beta={r["beta"]} {r["status"]:11} '
              f'{r["delivered_tflops"]} peak {r["peak_tflops"]} {r["reason"] or ""}')
PY
  fi
  echo "== done after ${SECONDS} s"
} > "$log" 2>&1
tar -C "$work" -czf "$OUT/verify.tgz" . && rm -rf "$work"
tar -xOzf "$OUT/verify.tgz" ./verify-log.txt
