#!/usr/bin/env bash
# On the lent H200: a watch whose ticks are merged in pairs and whose stacks are cut into them on
# the way (scripts/device/watch_compact.py bounded: at most 32 ticks, a fold every 8) against a
# plain watch of the same job, the synthetic starved and checkpoint jobs of 60 s
# (scripts/device/watch_jobs.py), each run once each way, one after the other. py-spy carried in
# .carry/bin. At most about 6 minutes; one archive, $OUT/compact.tgz, and the table on stdout.
#
#   bash scripts/device/watch_compact.sh          # carry: .carry
cd "$(dirname "$0")/../.." || exit 2
set -u
OUT=${OUT:-/tmp/out}
W=/tmp/compact; mkdir -p "$W" "$OUT"
export PATH="$PWD/.carry/bin:$PATH"
for job in starved checkpoint; do
  for mode in plain bounded; do
    timeout 110 python3 scripts/device/watch_compact.py "$mode" --json --interval 0.5 \
      --record "$W/$job.$mode.recording.json" -- \
      python3 scripts/device/watch_jobs.py job "$job" --seconds 60 --result "$W/$job.$mode.job.json" \
      > "$W/$job.$mode.diagnosis.json" 2> "$W/$job.$mode.log"
    echo "$job $mode rc=$?"
  done
done > "$W/runs.txt" 2>&1
python3 - "$W" > "$W/table.txt" 2>&1 <<'PY'
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
for job in ("starved", "checkpoint"):
    for mode in ("plain", "bounded"):
        try:
            d = json.loads((w / f"{job}.{mode}.diagnosis.json").read_text())
            r = json.loads((w / f"{job}.{mode}.recording.json").read_text())
        except (OSError, ValueError) as exc:
            print(job, mode, "unreadable:", exc)
            continue
        causes = [(c["name"], round(c["share"], 2)) for c in d.get("causes", [])][:3]
        stacked = sum(1 for t in r["ticks"] if t["stacks"])
        merged = [s for s in r.get("skipped", []) if "merged in pairs" in s]
        print(f"{job:10s} {mode:8s} verdict={d['verdict']} causes={causes} "
              f"busy={d.get('gpu_busy')} ticks={len(r['ticks'])} interval={r['interval']} "
              f"ticks_with_stacks={stacked} stacks={len(r['stacks'])} merged_note={bool(merged)}")
PY
cat "$W/runs.txt" "$W/table.txt"
tar czf "$OUT/compact.tgz" -C /tmp compact
