#!/usr/bin/env bash
# On the lent GPU machine: `sparkdiag soak` for 5 minutes (every GPU the machine has, at once),
# then what the daemon exports of it and what `sparkdiag check` says. Under $OUT:
#   soak.json (the record: every window), soak.csv (a row per window and kernel),
#   soak-time.png and soak-temperature.png (soak-gpuN-*.png with several GPUs),
#   verdict.txt (the text verdict), soak-state.json (the state file), soak-metrics.prom
#   (sparkdiag_soak_* as served; none for a --device cpu test soak), nvidia-smi.txt (before and after: the GPU left idle), log.txt.
# Arguments go to sparkdiag soak after the defaults, so they win: --duration 600, --gpu 0;
# the tests run it with --device cpu --small --duration 2 --window 0.5.
cd "$(dirname "$0")/../.." || exit 2
. scripts/device/setup.sh
exec > >(tee -a "$OUT/log.txt") 2>&1
STATE=/tmp/sd-soak-state; rm -rf "$STATE"
smi() {
  command -v nvidia-smi >/dev/null || { echo "(no nvidia-smi)"; return; }
  nvidia-smi --query-gpu=index,name,temperature.gpu,temperature.memory,power.draw,clocks.sm,clocks.mem,utilization.gpu \
    --format=csv
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
}
{ echo "== before"; smi; } | tee "$OUT/nvidia-smi.txt"
PLOT=(--plot "$OUT/soak")
python3 -c 'import matplotlib' 2>/dev/null || { PLOT=(); echo "matplotlib missing: no PNGs"; }

echo "== sparkdiag soak"
python3 -m sparkdiag soak --duration 300 --json "$OUT/soak.json" --csv "$OUT/soak.csv" \
  "${PLOT[@]}" --state-dir "$STATE" "$@" | tee "$OUT/verdict.txt"
rc=${PIPESTATUS[0]}
echo "soak rc=$rc (0 every kernel held, or a CPU soak ran; 1 a kernel fell, or a GPU was not soaked; 3 a worker failed; 130 interrupted)"
{ echo "== after"; smi; } | tee -a "$OUT/nvidia-smi.txt"
cp "$STATE/soak.json" "$OUT/soak-state.json" 2>/dev/null || echo "no state file written"

echo "== what the daemon exports of it"
PORT=10977
python3 -m sparkdiag serve --listen "127.0.0.1:$PORT" --no-probe.enabled --state-dir "$STATE" \
  --log-level warning &
SERVE=$!
python3 - "$PORT" <<'PY' | tee "$OUT/soak-metrics.prom"
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/metrics"
for _ in range(100):
    try:
        body = urllib.request.urlopen(url, timeout=2).read().decode()
        break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit("the daemon did not answer")
print("".join(line + "\n" for line in body.splitlines() if line.startswith("sparkdiag_soak")), end="")
PY
kill "$SERVE"; wait "$SERVE" 2>/dev/null

echo "== sparkdiag check --quick (its soak rows)"
python3 -m sparkdiag check --quick --state-dir "$STATE" | grep -A1 -E '^[A-Z]+ +soak '
exit "$rc"
