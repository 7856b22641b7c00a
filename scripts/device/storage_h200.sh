#!/usr/bin/env bash
# On the lent GPU machine: the storage probe on its local disk, fio beside it with the same
# flags, and what sparkdiag reads of its drives. About 70 s (at most 90): the probe at its
# defaults (1 GiB, at most 20 s), three paired rounds of probe and fio (1 GiB, 8 threads, 3 s
# reads: about 10 s each), dump and check --quick (a few seconds). Everything under
# $OUT/storage/:
#   probe.json, probe.txt    sparkdiag storage DIR (--json, then the text of the same run's JSON)
#   fio.json, fio.txt        benchmarks/storage_fio.py: each round's probe and fio figures
#   target.txt               findmnt, lsblk, the drive's PCIe link (what the probe resolved)
#   nvme.prom                sparkdiag_nvme_* and sparkdiag_storage_* as `dump` and serve see them
#   check.json               check --quick --storage DIR: the nvme-* and storage-speed rows
#   errors.txt               a line per step that failed (one failure does not stop the rest)
# Options: --fio PATH (fio carried as an extracted .deb, e.g. .debs/fio/usr/bin/fio; default:
# fio on PATH, else the comparison is skipped), --bin DIR (prepended to PATH: smartctl or nvme
# carried the same way), --dir DIR (default /tmp/sparkdiag-storage on the root disk), --dry
# (small sizes, for the test of this script on a machine without a GPU).
cd "$(dirname "$0")/../.." || exit 2
. scripts/device/setup.sh
FIO=$(command -v fio || true); DIR=/tmp/sparkdiag-storage; DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --fio) FIO=$2; shift 2 ;;
    --bin) export PATH="$2:$PATH"; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --dry) DRY=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
S="$OUT/storage"; mkdir -p "$S" "$DIR"; : > "$S/errors.txt"
STATE=$(mktemp -d /tmp/sd-storage-state.XXXX)
exec > >(tee -a "$S/log.txt") 2>&1
if [ "$DRY" = 1 ]; then
  SIZE=(--storage.size 32M --storage.duration 3); ROUNDS=(--rounds 2 --size 64M --threads 2 --seconds 1)
else
  SIZE=(); ROUNDS=(--rounds 3 --size 1G --threads 8 --seconds 3)
fi
step() { echo "== $1"; shift; "$@" || echo "$* failed (rc $?)" | tee -a "$S/errors.txt"; }

step "where $DIR lives" bash -c "{ findmnt -T '$DIR'; lsblk -s -o NAME,TYPE,SIZE,MODEL \$(findmnt -n -o SOURCE -T '$DIR'); \
  for c in /sys/class/nvme/nvme*; do [ -e \"\$c\" ] && echo \"\$c \$(cat \$c/model) \$(cat \$c/device/current_link_speed) x\$(cat \$c/device/current_link_width)\"; done; \
  command -v smartctl nvme fio; } > '$S/target.txt' 2>&1; cat '$S/target.txt'"

step "sparkdiag storage $DIR (defaults: 1 GiB, at most 20 s)" bash -c \
  "python3 -m sparkdiag storage '$DIR' --json --state-dir '$STATE' ${SIZE[*]} > '$S/probe.json'; rc=\$?; [ \$rc -le 1 ]"
step "its text" python3 - "$S/probe.json" "$S/probe.txt" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
lines = [f"{doc['directory']} on {doc['device']} ({doc['kind']}, {doc['fstype']}): {doc['verdict']}"]
for f in doc["figures"]:
    ceiling = f["ceiling_bytes_per_second"]
    link = f", {f['bytes_per_second'] / ceiling:.0%} of the link {ceiling / 1e9:.2f} GB/s" if ceiling else ""
    lines.append(f"  {f['direction']:5} {f['bytes_per_second'] / 1e9:7.3f} GB/s{link}")
rnd = doc["random_read"] or {}
if rnd:
    lines.append(f"  4 KiB random read p50 {rnd['p50_seconds'] * 1e6:.0f} us, p99 {rnd['p99_seconds'] * 1e6:.0f} us")
lines.append(f"  cost: {doc['bytes_written'] / 2**30:.2f} GiB written in {doc['seconds']:.1f} s")
for d in doc["drive_temperatures"]:
    lines.append(f"  {d['controller']} {d['before_celsius']} -> {d['after_celsius']} C during the probe")
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY

if [ -n "$FIO" ] && [ -x "$FIO" ]; then
  step "probe against fio, paired rounds" bash -c \
    "python3 benchmarks/storage_fio.py '$DIR' --fio '$FIO' ${ROUNDS[*]} --json '$S/fio.json' | tee '$S/fio.txt'; [ \${PIPESTATUS[0]} -eq 0 ]"
else
  echo "no fio (give --fio PATH): comparison skipped" | tee -a "$S/errors.txt"
fi

step "NVMe and storage series (dump, serve)" bash -c "{ python3 -m sparkdiag dump | grep -E '^sparkdiag_(nvme|collector_success)'; \
  python3 - '$STATE' <<'PY'
import sys
from pathlib import Path
from sparkdiag.exporter.registry import render
from prometheus_client import CollectorRegistry
from sparkdiag.exporter.storage import storage_collector
registry = CollectorRegistry(auto_describe=False)
registry.register(storage_collector(Path(sys.argv[1])))
print(render(registry).decode(), end='')
PY
} > '$S/nvme.prom'; grep -c . '$S/nvme.prom'"

step "check --quick --storage $DIR" bash -c \
  "python3 -m sparkdiag check --quick --json --storage '$DIR' --state-dir '$STATE' ${SIZE[*]} > '$S/check.json'; \
   python3 -c \"import json; [print(r['status'], r['name'], r['finding']) for r in json.load(open('$S/check.json'))['checks'] if r['name'].startswith(('nvme', 'storage'))]\""

rm -rf "$STATE"; rmdir "$DIR" 2>/dev/null
echo "== summary"
cat "$S/probe.txt" 2>/dev/null
grep median "$S/fio.txt" 2>/dev/null
echo "errors: $(grep -c . "$S/errors.txt")"
