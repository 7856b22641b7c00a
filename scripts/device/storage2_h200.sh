#!/usr/bin/env bash
# On the lent H200, the final call: the storage probe's path into the GPU and fio beside the probe
# after the fix, within a HARD budget of 45 s for the whole script (every step runs under
# `timeout` with what is left of it, 3 s kept for the archive and the table). Typically ~30 s:
#   1. kvikio from the carried wheels (.whl/kvikio_cu13-*.whl, .whl/libkvikio_cu13-*.whl and
#      .whl/rapids_logger-*.whl, which libkvikio needs: without it the 2026-12-03 call's worker
#      could not load libkvikio.so, while the exploratory call, which installed every wheel,
#      read through CuFile), pip install --no-index --no-deps --target /tmp/site (cupy, numpy
#      and nvidia-cufile are on the machine); at most 8 s;
#   2. sparkdiag storage on a 1 GiB file on the root disk with --storage.gpu 0: write and read
#      (host), then the worker reads the same file into pinned host memory, on into GPU memory,
#      and by cuFile (gds, with its mode: GPUDirect or a compatibility mode); at most 22 s;
#   3. one paired round of the probe and fio (.carry/bin/fio, psync) with both tools' buffers in
#      huge pages (vm.nr_hugepages raised by 18 for fio's --mem=mmaphuge, put back after), then
#      fio's read with 4 KiB-page buffers against huge-page ones: the cause of the 1.18/1.28
#      disagreement of call b, measured here; at most 14 s.
# Everything goes into ONE archive, $OUT/storage2.tgz (storage2/: env.txt, storage.json,
# storage.err, fio.json, fio.txt, log.txt, errors.txt, table.txt); the short table is printed
# last. Needs carried: .carry/bin/fio (fio 3.42) and the kvikio-cu13 26.10 wheels in .whl/.
#   --dry   on a machine without a GPU (tests/test_storage_device_script.py): 64 MiB, fio from
#           PATH unless --fio, the same steps (the GPU path then says why it was skipped).
#   --fio PATH, --dir DIR (default /tmp/sparkdiag-storage2, on the root disk).
cd "$(dirname "$0")/../.." || exit 2
set -u
START=$SECONDS; BUDGET=45; KEEP=3
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
FIO=.carry/bin/fio; DIR=/tmp/sparkdiag-storage2; DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dry) DRY=1; shift ;;
    --fio) FIO=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$FIO" ] || FIO=$(command -v fio || echo "")
S=$(mktemp -d /tmp/storage2-out.XXXX)/storage2; mkdir -p "$S" "$DIR"; : > "$S/errors.txt"
STATE=$(mktemp -d /tmp/storage2-state.XXXX)
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1
exec > >(tee -a "$S/log.txt") 2>&1
if [ "$DRY" = 1 ]; then SIZE=64M; DURATION=3; else SIZE=1G; DURATION=6; fi
THREADS=8; HUGE_OLD=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo "")

left() { echo $((BUDGET - KEEP - (SECONDS - START))); }
step() {  # step NAME MAX CMD...: at most MAX s, and never past the budget
  local name=$1 max=$2 t rc; shift 2; t=$(left); [ "$t" -gt "$max" ] && t=$max
  if [ "$t" -lt 2 ]; then echo "$name: skipped, out of time" | tee -a "$S/errors.txt"; return 1; fi
  echo "== $name (at most $t s, $((SECONDS - START)) s gone)"
  timeout -s INT -k 2 "$t" "$@"; rc=$?
  [ $rc -ne 0 ] && echo "$name: exit status $rc" | tee -a "$S/errors.txt"
  return $rc
}
restore() { [ -n "$HUGE_OLD" ] && echo "$HUGE_OLD" > /proc/sys/vm/nr_hugepages 2>/dev/null; }
trap restore EXIT

{ echo "kernel $(uname -r)"; echo "thp $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
  dev=$(basename "$(findmnt -n -o SOURCE -T "$DIR")")
  for f in max_segments max_sectors_kb; do echo "$dev $f $(cat /sys/class/block/$dev/queue/$f 2>/dev/null)"; done
  echo "fio $FIO $($FIO --version 2>/dev/null)"; ls /proc/driver/nvidia-fs 2>/dev/null && echo "nvidia-fs loaded"
} > "$S/env.txt" 2>&1

if ls .whl/kvikio*.whl >/dev/null 2>&1 && ! python3 -c "import kvikio" 2>/dev/null; then
  step "kvikio from the carried wheels" 8 python3 -m pip install -q --no-index --no-deps \
    --no-compile --no-cache-dir --target /tmp/site .whl/kvikio*.whl .whl/libkvikio*.whl \
    .whl/rapids_logger*.whl
fi

step "sparkdiag storage $DIR --storage.gpu 0 ($SIZE)" 22 bash -c \
  "python3 -m sparkdiag storage '$DIR' --storage.gpu 0 --storage.size $SIZE \
   --storage.duration $DURATION --state-dir '$STATE' --json > '$S/storage.json' 2> '$S/storage.err'; \
   rc=\$?; tail -3 '$S/storage.err'; [ \$rc -le 1 ]"

PAGES=auto
if [ -n "$HUGE_OLD" ] && echo $((HUGE_OLD + 2 * THREADS + 2)) > /proc/sys/vm/nr_hugepages 2>/dev/null; then
  PAGES=huge
fi
if [ -n "$FIO" ]; then
  step "probe and fio, one paired round ($PAGES pages), then fio's contrast" 14 \
    python3 benchmarks/storage_fio.py "$DIR" --fio "$FIO" --rounds 1 --size "$SIZE" \
    --threads $THREADS --seconds 1.5 --pages $PAGES --contrast --json "$S/fio.json" \
    > "$S/fio.txt"; cat "$S/fio.txt"
else
  echo "no fio: the paired round skipped" | tee -a "$S/errors.txt"
fi
restore

python3 - "$S" $((SECONDS - START)) $BUDGET > "$S/table.txt" <<'PY'
import json, sys
from pathlib import Path
S, spent, budget = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
def load(name):
    try:
        return json.loads((S / name).read_text())
    except (OSError, ValueError):
        return None
rows = []
doc = load("storage.json")
if doc:
    label = {"host": "", "gpu": " to GPU", "gds": " by GDS"}
    for f in doc["figures"]:
        mode = f" ({f['mode']})" if f.get("mode") else ""
        rows.append((f"{f['direction']}{label[f['path']]}{mode}", f["bytes_per_second"]))
    gpu = doc.get("gpu") or {}
    for s in gpu.get("stages", []):
        if s["path"] == "pinned":
            rows.append(("read, pinned", s["bytes_per_second"]))
print(f"storage2: {doc['directory'] if doc else '-'}, {doc['size'] >> 20 if doc else '-'} MiB, "
      f"buffers in {doc.get('pages') if doc else '-'} pages")
for name, value in rows:
    print(f"  {name:24} {value / 1e9 if value else 0:7.3f} GB/s")
if doc and doc.get("gpu"):
    gpu = doc["gpu"]
    print(f"  GPU path: {gpu['status']} {(gpu.get('reason') or '')[:50]}".rstrip())
    for s in gpu["stages"]:
        if s["status"] != "ok":
            print(f"    {s['path']}: {s['status']}: {(s['reason'] or '')[:60]}")
        elif s["path"] == "gds":
            print(f"    gds mode {s['mode']} (checked {s['checked']}): {(s['mode_reason'] or '')[:50]}")
fio = load("fio.json")
if fio and fio.get("rounds"):
    r = fio["rounds"][0]
    print(f"  probe/fio write {r['probe_write'] / r['fio_write']:.3f}, read "
          f"{r['probe_read'] / r['fio_read']:.3f} ({r['pages']} pages; read KiB/req "
          f"{r['probe_read_kib_per_request'] or 0:.0f}, {r['fio_read_kib_per_request'] or 0:.0f})")
if fio and fio.get("contrast"):
    c = fio["contrast"]
    print("  cause of call b's 1.18/1.28: buffers in 4 KiB pages (256 segments a block)")
    print(f"  fio read, 4 KiB pages {c['small_read'] / 1e9:.3f} GB/s "
          f"({c['small_kib_per_request'] or 0:.0f} KiB/req), huge pages "
          f"{c['huge_read'] / 1e9:.3f} ({c['huge_kib_per_request'] or 0:.0f}): "
          f"{c['huge_read'] / c['small_read']:.2f}x")
errors = [l for l in (S / "errors.txt").read_text().splitlines() if l.strip()]
print(f"  {spent} s of the {budget} s budget; {len(errors)} error(s)" + (f": {errors[0]}" if errors else ""))
PY
rm -rf "$STATE"; rmdir "$DIR" 2>/dev/null
tar czf "$OUT/storage2.tgz" -C "$(dirname "$S")" storage2
echo "== $OUT/storage2.tgz: $(tar tzf "$OUT/storage2.tgz" | sed 's|storage2/||' | tr '\n' ' ')"
cat "$S/table.txt"
rm -rf "$(dirname "$S")"
