#!/usr/bin/env bash
# On the lent H200, the first call of 2026-12-04's fifth session: the commands a user runs, on
# the real GPU, after the last two sessions changed the web layer (asyncio without ssl, TLS in
# web/tls.py, the listen host as bytes), the worker's parent watch (it polls its stdout too) and
# the relay. Each step is bounded by its own timeout; one failing does not stop the others; a
# table of steps, exit statuses and what each showed is printed last. Everything goes into ONE
# archive, $OUT/regress.tgz.
#
#   bash scripts/device/regress_1204.sh        # carry: .whl/ (pyudev, bcrypt, py-spy wheels)
#
# Steps: check (full, text (piped: 100 columns), then --json); probe --json; the worker when its
# parent is SIGKILLed mid-cycle (no worker may be left 10 s later); serve plain with
# --compat.dcgm --process-metrics (scrape, /healthz, SIGTERM -> exit 0); serve with a TLS and
# basic-auth web config (https with and without the password, plain http refused); watch on a
# real bf16 job (--json, and the text); storage with --storage.gpu 0; native
# --json; soak 20 s; a soak whose reader goes away (| head -1).
# A dry run without a GPU: DRY=1 OUT=/tmp/out bash scripts/device/regress_1204.sh
. "$(dirname "$0")/setup.sh"
DIR="$OUT/regress"; mkdir -p "$DIR"
STATE=/tmp/sd-regress-state; rm -rf "$STATE"; mkdir -p "$STATE"
NVML=(); PROBE=(); JOB=(python3 tests/support/probe_scripts/gpu_load.py 15); GPUDEV=(); SMALL=()
if [ "${DRY:-0}" = 1 ]; then
  NVML=(--nvml-fixture tests/fixtures/nvml/h200-idle.json)
  PROBE=(--device cpu --small); JOB=(python3 -c 'import time; time.sleep(6)'); SMALL=(--device cpu --small)
else
  GPUDEV=(--storage.gpu 0)
fi
rows=()
row() { rows+=("$(printf '%-24s exit %-4s %s' "$1" "$2" "$3")"); }
wide() {  # characters, not bytes (°C, →); piped text is laid out in 100 columns (docs/usage.md)
  python3 -c 'import sys; n = sum(len(l.rstrip("\n")) > 100 for l in open(sys.argv[1], encoding="utf-8", errors="replace")); print(n, "lines over 100 columns")' "$1"
}
jsonok() { python3 -c 'import json,sys; json.load(open(sys.argv[1])); print("json ok")' "$1" 2>&1 | tail -1; }
sd() { local t=$1; shift; timeout "$t" python3 -m sparkdiag "$@"; }

{
  echo "== regress_1204.sh at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
  nvidia-smi -L 2>&1 | head -8; python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)'
} > "$DIR/env.txt" 2>&1
cat "$DIR/env.txt"

# 1. check, text then JSON
start=$SECONDS
sd 240 check "${NVML[@]}" --state-dir "$STATE" > "$DIR/check.txt" 2>&1; rc=$?
row check $rc "$((SECONDS - start)) s, $(wide "$DIR/check.txt"), $(grep -cE '^(PASS|WARN|FAIL|SKIP) ' "$DIR/check.txt") rows"
sd 240 check "${NVML[@]}" --state-dir "$STATE" --json > "$DIR/check.json" 2> "$DIR/check-json.err"; rc=$?
row "check --json" $rc "$(jsonok "$DIR/check.json")"

# 2. probe
sd 180 probe "${NVML[@]}" "${PROBE[@]}" --state-dir "$STATE" --json > "$DIR/probe.json" 2> "$DIR/probe.err"; rc=$?
row "probe --json" $rc "$(jsonok "$DIR/probe.json")"

# 3. the worker outlives no parent: SIGKILL the probe command mid-cycle
python3 -m sparkdiag probe "${NVML[@]}" "${PROBE[@]}" --state-dir "$STATE" --no-record \
  > "$DIR/killed-probe.txt" 2>&1 &
parent=$!
for _ in $(seq 1 100); do pgrep -f 'probe/worker' > /dev/null && break; sleep 0.1; done
sleep 2
before=$(pgrep -fc 'probe/worker'); kill -KILL "$parent"; wait "$parent" 2>/dev/null
sleep 10
left=$(pgrep -fa 'probe/worker' | grep -v pgrep); pkill -KILL -f 'probe/worker'
row "worker, parent killed" "-" "workers before the kill: $before; 10 s after: ${left:-none}"

# 4. serve, plain
port=19111
python3 -m sparkdiag serve "${NVML[@]}" --listen 127.0.0.1:$port --state-dir "$STATE" --no-probe.enabled \
  --compat.dcgm --process-metrics > "$DIR/serve.log" 2>&1 &
srv=$!
for _ in $(seq 1 100); do curl -s -o /dev/null "127.0.0.1:$port/healthz" && break; sleep 0.1; done
curl -s -w '%{http_code}' -o "$DIR/metrics.txt" "127.0.0.1:$port/metrics" > "$DIR/metrics.code"
health=$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$port/healthz")
kill -TERM $srv; wait $srv; rc=$?
row "serve (plain)" $rc "/metrics $(cat "$DIR/metrics.code"), $(grep -c '^# TYPE' "$DIR/metrics.txt") families, $(grep -c '^DCGM_FI' "$DIR/metrics.txt") DCGM samples, /healthz $health"

# 5. serve with TLS and basic auth (the password is sd-pass)
tls="$DIR/tls"; mkdir -p "$tls"
if openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost \
     -addext subjectAltName=IP:127.0.0.1 -keyout "$tls/tls.key" -out "$tls/tls.crt" 2>/dev/null; then
  cat > "$tls/web.yml" <<'YML'
tls_server_config:
  cert_file: tls.crt
  key_file: tls.key
basic_auth_users:
  prom: $2b$05$qFUhy4q3zCxyA6RNjH2cPegXdvFcvrB9QSnSyvi5BcUf9tIImxtqm
YML
  port=19112
  python3 -m sparkdiag serve "${NVML[@]}" --listen 127.0.0.1:$port --state-dir "$STATE" --no-probe.enabled \
    --web.config.file "$tls/web.yml" > "$DIR/serve-tls.log" 2>&1 &
  srv=$!
  for _ in $(seq 1 100); do curl -sk -o /dev/null "https://127.0.0.1:$port/healthz" && break; sleep 0.1; done
  good=$(curl -s --cacert "$tls/tls.crt" -u prom:sd-pass -o "$DIR/metrics-tls.txt" -w '%{http_code}' "https://127.0.0.1:$port/metrics")
  bad=$(curl -s --cacert "$tls/tls.crt" -u prom:wrong -o /dev/null -w '%{http_code}' "https://127.0.0.1:$port/metrics")
  none=$(curl -s --cacert "$tls/tls.crt" -o /dev/null -w '%{http_code}' "https://127.0.0.1:$port/metrics")
  plain=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/metrics")
  kill -TERM $srv; wait $srv; rc=$?
  row "serve (TLS, auth)" $rc "https+password $good, wrong password $bad, none $none, plain http $plain"
else
  row "serve (TLS, auth)" "-" "skipped: no openssl to make a certificate"
fi

# 6. watch a real job
sd 90 watch "${NVML[@]}" --json --duration 25 -- "${JOB[@]}" > "$DIR/watch.json" 2> "$DIR/watch.err"; rc=$?
row "watch --json" $rc "$(jsonok "$DIR/watch.json"); $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("verdict:", d.get("verdict") or d.get("diagnosis", {}).get("verdict") or list(d)[:6])' "$DIR/watch.json" 2>&1 | tail -1)"
sd 90 watch "${NVML[@]}" --duration 25 -- "${JOB[@]}" > "$DIR/watch.txt" 2>&1; rc=$?
row "watch (text)" $rc "$(wide "$DIR/watch.txt")"

# 7. storage, read into the GPU too
mkdir -p /tmp/sd-regress-storage
sd 120 storage /tmp/sd-regress-storage --state-dir "$STATE" "${GPUDEV[@]}" --storage.size 1GiB \
  --no-record > "$DIR/storage.txt" 2>&1; rc=$?
row storage $rc "$(wide "$DIR/storage.txt"); $(grep -iE 'gpu|pinned' "$DIR/storage.txt" | head -2 | tr -s ' \n' ' ' | cut -c1-90)"

# 8. native
sd 120 native --json > "$DIR/native.json" 2> "$DIR/native.err"; rc=$?
row "native --json" $rc "$(jsonok "$DIR/native.json")"

# 9. soak, and a soak whose reader goes away
sd 120 soak "${NVML[@]}" "${SMALL[@]}" --duration 20 --window 5 --no-record --state-dir "$STATE" \
  > "$DIR/soak.txt" 2>&1; rc=$?
row soak $rc "$(wide "$DIR/soak.txt"), $(grep -ciE 'traceback' "$DIR/soak.txt") tracebacks"
sd 120 soak "${NVML[@]}" "${SMALL[@]}" --duration 10 --window 5 --no-record --state-dir "$STATE" \
  2> "$DIR/soak-head.err" | head -1 > "$DIR/soak-head.txt"
rc=${PIPESTATUS[0]}
row "soak | head -1" $rc "$(grep -c Traceback "$DIR/soak-head.err") tracebacks on stderr"

echo "== steps"
printf '%s\n' "${rows[@]}" | tee "$DIR/table.txt"
echo "== done after ${SECONDS} s"
tar czf /tmp/regress.tgz -C "$OUT" regress && rm -rf "$DIR" && mv /tmp/regress.tgz "$OUT/regress.tgz"
