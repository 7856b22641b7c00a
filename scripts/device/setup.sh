# Sourced by every script in scripts/device/ on the lent GPU machine: $OUT, the carried wheels
# (.whl/, see the device tool's README), this checkout on PYTHONPATH, unbuffered Python, and
# load: a competing process on the GPU.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

load() {  # a competing process: bf16 8192^3 matmuls for $1 seconds, in the background ($!)
  python3 - "$1" <<'PY' &
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
PY
}
