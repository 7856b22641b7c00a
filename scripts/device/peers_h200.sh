#!/usr/bin/env bash
# On the lent H200 (issue 22): a GPU judged against its peers.
#
#   1. the node comparison of `sparkdiag check` on fixtures of eight H200s (the recorded H200
#      document replayed per GPU): GPU 5 at 0.9 of the others (peers fails naming GPU 5, exit 3),
#      GPU 2 at 0.95 (warns), all eight within ±2 % (passes);
#   2. `sparkdiag check` on the real GPU: one GPU, so peers skips ("no peer"), and
#      baseline-learning reads the store the check found;
#   3. the real daemon on the real GPU (probe every 20 s), scraped every 2 s by a Prometheus of
#      its own (its $PROMETHEUS, default `prometheus`, on a free port, with the shipped rules),
#      then `sparkdiag fleet` against that Prometheus, text and --json: one GPU, so its group is
#      too small to judge and there is no outlier (exit 0).
#
# Runs on its own or after scripts/device/prom_session.py in the same call: it starts and stops
# its own daemon and Prometheus on free ports, never touches another's, and waits (up to 60 s)
# for another process to leave the GPU before its daemon probes. Everything it writes goes into
# ONE archive, $OUT/peers-h200.tar.gz (peers-h200/: log.txt and one file per step).
#
# A dry run without a GPU (on fixtures; step 2 skipped):
#   PEERS_DAEMON_ARGS="--nvml-fixture tests/fixtures/nvml/h200-idle.json \
#     --probe.fixture tests/fixtures/probe/h200-default.json" PEERS_SKIP_REAL_CHECK=1 \
#     OUT=/tmp/out scripts/device/peers_h200.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/peers-h200.XXXXXX); DIR=$WORK/peers-h200; mkdir -p "$DIR"
PIDS=()
finish() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  tar -czf "$OUT/peers-h200.tar.gz" -C "$WORK" peers-h200 && echo "wrote $OUT/peers-h200.tar.gz"
}
trap finish EXIT
exec > >(tee -a "$DIR/log.txt") 2>&1
sd() { "$PY" -m sparkdiag "$@"; }
rows() {  # rows FILE PREFIX NAME...: the named rows of a check --json report, one line each
  "$PY" - "$@" <<'PY'
import json, sys
path, prefix, names = sys.argv[1], sys.argv[2], sys.argv[3:]
for c in json.load(open(path))["checks"]:
    if c["name"] in names:
        print(f"  {prefix} {c['name']} {c['status']} gpu={c['gpu']}: {c['finding']}")
PY
}
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
started=$(date +%s)
echo "== peers_h200.sh at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv 2>&1 | head -9

echo "== 1. check's node comparison on fixtures of eight H200s"
# per-GPU probe fixtures: the recorded H200 document, each GPU's copy naming its uuid, every
# figure times the GPU's factor (tests/support/e2e.py's probe_document does the same)
"$PY" - "$DIR" <<'PY'
import copy, json, sys
from pathlib import Path
out = Path(sys.argv[1])
doc = json.loads(Path("tests/fixtures/probe/h200-default.json").read_text())
uuids = [d["set"]["uuid"] for d in json.loads(Path("tests/fixtures/nvml/h200-x8.json").read_text())["devices"]]
def fixture(name, factors):
    cycles = []
    for uuid, factor in zip(uuids, factors):
        cycle = copy.deepcopy(doc)
        cycle["software"]["gpu_uuid"] = uuid
        for r in cycle["results"]:
            if r["status"] == "ok":
                r["delivered"] *= factor; r["peak"] *= factor
                r["median_ms"] /= factor; r["min_ms"] /= factor
        cycles.append(cycle)
    (out / f"probe-{name}.json").write_text(json.dumps({"format": "sparkdiag-probe-fixture/1", "cycles": cycles}))
fixture("slow5", [1.0, 1.004, 0.998, 1.002, 0.996, 0.9, 1.001, 0.999])
fixture("warn2", [1.0, 1.0, 0.95, 1.0, 1.0, 1.0, 1.0, 1.0])
fixture("noise", [1.02, 0.98, 1.01, 0.99, 1.0, 0.985, 1.015, 1.0])
PY
for case in slow5 warn2 noise; do
  sd check --json --nvml-fixture tests/fixtures/nvml/h200-x8.json --probe.fixture "$DIR/probe-$case.json" \
    --path.sysfs tests/fixtures/sysfs/h200-vm --path.rootfs tests/fixtures/rootfs/native \
    --state-dir "$WORK/state-$case" > "$DIR/check-x8-$case.json"
  rc=$?
  rows "$DIR/check-x8-$case.json" "$case rc=$rc:" peers
done

if [ -z "${PEERS_SKIP_REAL_CHECK:-}" ]; then
  echo "== 2. sparkdiag check on the real GPU (one GPU: no peer in the node)"
  t0=$(date +%s.%N)
  sd check --json --state-dir "$WORK/state-real" > "$DIR/check-real.json"; rc=$?
  echo "  rc=$rc in $("$PY" -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.1f}')" "$t0") s"
  rows "$DIR/check-real.json" "" peers baseline-learning probe
fi

echo "== 3. the real daemon, a Prometheus of its own, and sparkdiag fleet"
PROM=${PROMETHEUS:-prometheus}
if ! command -v "$PROM" >/dev/null 2>&1; then
  echo "  no Prometheus binary ($PROM): step 3 skipped"; exit 0
fi
"$PROM" --version 2>&1 | head -1
for _ in $(seq 1 60); do  # another session's load (a stall test) must leave the GPU first
  busy=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | wc -l)
  [ "${busy:-0}" -eq 0 ] && break; echo "  GPU busy ($busy process(es)): waiting"; sleep 1
done
DPORT=$(free_port); PPORT=$(free_port)
# shellcheck disable=SC2086  # PEERS_DAEMON_ARGS is a list of flags
sd serve --listen "127.0.0.1:$DPORT" --state-dir "$WORK/state-daemon" --probe.interval 20 \
  --probe.first-delay 0 ${PEERS_DAEMON_ARGS:-} > "$DIR/daemon.log" 2>&1 &
PIDS+=($!)
cat > "$WORK/prometheus.yml" <<EOF
global: {scrape_interval: 2s, evaluation_interval: 2s}
rule_files: [$PWD/prometheus/sparkdiag-rules.yml]
scrape_configs:
  - job_name: sparkdiag
    static_configs: [{targets: ["127.0.0.1:$DPORT"], labels: {instance: lent-h200}}]
EOF
"$PROM" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PPORT" --log.level=warn > "$DIR/prometheus.log" 2>&1 &
PIDS+=($!)
URL=http://127.0.0.1:$PPORT
q() {  # an instant query's JSON answer (no curl on the device image)
  "$PY" -c 'import sys, urllib.parse, urllib.request as u
try: print(u.urlopen(sys.argv[1] + "/api/v1/query?" + urllib.parse.urlencode({"query": sys.argv[2]}), timeout=10).read().decode())
except OSError as e: print(f"query failed: {e}")' "$URL" "$1"
}
ok=""
for i in $(seq 1 120); do  # the first probe: torch import, CUDA context, ~2 s of GPU time
  if q 'sparkdiag:gemm_tflops:peer_group_gpus' | grep -q '"value"'; then ok=yes; break; fi
  sleep 1
done
echo "  peer series after ${i} s: ${ok:-none}"
q 'sparkdiag_probe_software_info' > "$DIR/software-info.json"; cat "$DIR/software-info.json"; echo
q 'sparkdiag:gemm_tflops:peer_group_gpus' > "$DIR/peer-group-gpus.json"
q 'sparkdiag:gemm_tflops:peer_ratio' > "$DIR/peer-ratio.json"
"$PY" -c 'import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=10).read().decode())' \
  "http://127.0.0.1:$DPORT/metrics" > "$DIR/metrics.txt"
grep -E '^sparkdiag_(probe_software_info|gemm_node_peer_ratio|gemm_baseline_held)' "$DIR/metrics.txt" | head -5
sd fleet --prometheus "$URL"; echo "fleet rc=$?"
sd fleet --prometheus "$URL" --json > "$DIR/fleet.json"; echo "fleet --json rc=$?"
"$PY" - "$DIR/fleet.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("  outliers:", d["outliers"], "statuses:", sorted({g["status"] for g in d["gpus"]}),
      "groups:", [(g["model"], g["gpus"], g["judged"]) for g in d["groups"]])
PY
q 'ALERTS{alertname="SparkdiagGpuSlowerThanPeers"}' > "$DIR/alerts.json"; echo "  alerts: $(cat "$DIR/alerts.json")"
echo "== done in $(( $(date +%s) - started )) s"
