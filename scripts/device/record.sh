#!/usr/bin/env bash
# Run on the lent GPU machine (device tool): record NVML fixtures idle and under load, compare
# sparkdiag with nvidia-smi (the gpu-marked test), and collect the evidence that the context and
# sysfs fixtures are modelled on. Everything lands under $OUT.
. "$(dirname "$0")/setup.sh"
log="$OUT/log.txt"
exec > >(tee -a "$log") 2>&1

echo "== versions"
nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv
python3 -c 'import pynvml, torch; print("nvidia-ml-py", getattr(pynvml, "__version__", "?"), "torch", torch.__version__, torch.version.cuda)'
nvidia-smi -q > "$OUT/nvidia-smi-q.txt"

echo "== record idle"
python3 -m sparkdiag record-fixture "$OUT/h200-idle.json" \
  --description "NVIDIA H200 on the lent machine, idle (no compute process)"
python3 -m sparkdiag dump > "$OUT/dump-idle.txt"

echo "== nvidia-smi agreement (idle and under a bf16 matmul load)"
SPARKDIAG_COMPARE_OUT="$OUT/compare.md" python3 -m pytest -m gpu tests/gpu -q -s -p no:cacheprovider 2>&1 | tail -40

echo "== record under load"
load 45; pid=$!
sleep 20
python3 -m sparkdiag record-fixture "$OUT/h200-load.json" \
  --description "NVIDIA H200 on the lent machine after 20 s of continuous bf16 8192^3 matmuls"
nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_event_reasons.active,temperature.gpu,temperature.memory --format=csv
kill $pid; wait $pid 2>/dev/null

echo "== context and sysfs evidence" 
{
  for f in /.dockerenv /run/.containerenv /run/systemd/container /run/host/container-manager; do
    [ -e "$f" ] && echo "exists: $f ($(head -c 200 "$f" | tr -d '\0'))" || echo "absent: $f"
  done
  echo "-- /proc/1/comm: $(cat /proc/1/comm)"
  echo "-- /proc/1/cgroup"; cat /proc/1/cgroup
  echo "-- /proc/self/cgroup"; cat /proc/self/cgroup
  echo "-- mountinfo (root and overlay lines)"; grep -E ' / | overlay ' /proc/self/mountinfo | head
  echo "-- container env of pid 1"; tr '\0' '\n' < /proc/1/environ | grep -iE '^container=' || echo none
  echo "-- KUBERNETES_SERVICE_HOST=${KUBERNETES_SERVICE_HOST:-unset}"
  echo "-- sysfs PCI links"
  for d in /sys/bus/pci/devices/*; do
    printf '%s class=%s driver=%s cur=%s/%s max=%s/%s\n' "$(basename "$d")" "$(cat "$d/class")" \
      "$(basename "$(readlink "$d/driver" 2>/dev/null)" 2>/dev/null)" \
      "$(cat "$d/current_link_speed" 2>/dev/null)" "$(cat "$d/current_link_width" 2>/dev/null)" \
      "$(cat "$d/max_link_speed" 2>/dev/null)" "$(cat "$d/max_link_width" 2>/dev/null)"
  done
  echo "-- sparkdiag context and pcie as parsed"
  python3 -c 'from sparkdiag.sources.host.context import detect_context; print(detect_context())'
  python3 -c 'from pathlib import Path; from sparkdiag.sources.host.sysfs import PcieSource; [print(l) for l in PcieSource(Path("/sys")).read()]'
} > "$OUT/evidence.txt" 2>&1
echo "done"
