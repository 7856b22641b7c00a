#!/usr/bin/env bash
# On a lent GPU machine (2026-12-06, eighteenth session): the commands a user runs, each once on
# the real GPU, and the slow tests beside it (CI runs them where there is no GPU: does one assume
# there is none?). Each command's exit status, whether its JSON parses, and its first lines:
#   probe --json; soak --duration 30s --json; storage $HOME --json (256 MiB); dump (one scrape's
#   text, counted); native --json; serve on a free port, scraped twice, stopped by SIGTERM;
#   then the slow tests without the gpu-marked ones, 16 workers.
#   bash scripts/device/smoke_1206.sh   # carry: .whl/, .carry/testwhl/
# Everything in ONE archive, $OUT/smoke.tgz; a summary printed last.
. "$(dirname "$0")/setup.sh"
DIR="$OUT/smoke"; mkdir -p "$DIR"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tsite \
  .carry/testwhl/*.whl 2>/dev/null && export PYTHONPATH="$PYTHONPATH:/tmp/tsite"
export PATH="/tmp/site/bin:/tmp/tsite/bin:$PATH"
export STATE_DIRECTORY="$DIR/state"; mkdir -p "$STATE_DIRECTORY"
summary=()
{ echo "== smoke_1206.sh, $(date -u +%FT%TZ)"; nvidia-smi -L; } > "$DIR/env.txt" 2>&1
cat "$DIR/env.txt"
parses() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("parses:", ", ".join(sorted(d)[:8]))' "$1" 2>&1 | tail -1; }
run() {  # NAME SECONDS ARGS...: sparkdiag ARGS > NAME.out, 2> NAME.err
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" python3 -m sparkdiag "$@" > "$DIR/$name.out" 2> "$DIR/$name.err"
  local rc=$?
  summary+=("$name: exit $rc in $((SECONDS - start)) s; $( [ "${JSON:-1}" = 1 ] && parses "$DIR/$name.out" || echo "$(wc -l < "$DIR/$name.out") lines")")
}
run probe 120 probe --json
run soak 90 soak --duration 30s --json
run storage 120 storage "$HOME" --json --storage.size 268435456
JSON=0 run dump 60 dump
run native 120 native --json

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m sparkdiag serve --listen "127.0.0.1:$port" > "$DIR/serve.out" 2> "$DIR/serve.err" &
serve=$!
for i in $(seq 1 60); do curl -sf "http://127.0.0.1:$port/metrics" > "$DIR/scrape1.txt" && break; sleep 0.5; done
sleep 3; curl -sf "http://127.0.0.1:$port/metrics" > "$DIR/scrape2.txt"
kill -TERM $serve; wait $serve; rc=$?
summary+=("serve: scrapes of $(grep -vc '^#' "$DIR/scrape1.txt") and $(grep -vc '^#' "$DIR/scrape2.txt") samples; exit $rc after SIGTERM")

start=$SECONDS
timeout 330 python3 -m pytest -p no:cacheprovider -q -n 16 -m "slow and not gpu" tests \
  > "$DIR/slow.txt" 2>&1
summary+=("slow tests, not gpu: exit $? in $((SECONDS - start)) s: $(tail -1 "$DIR/slow.txt")")

echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$DIR/summary.txt"
grep -h -E "^(FAILED|ERROR)" "$DIR/slow.txt" | head -20
for f in "$DIR"/*.err; do [ -s "$f" ] && { echo "== $(basename "$f")"; tail -3 "$f"; }; done
echo "== done after ${SECONDS} s"
tar czf /tmp/smoke.tgz -C "$OUT" smoke && rm -rf "$DIR" && mv /tmp/smoke.tgz "$OUT/smoke.tgz"
