#!/bin/bash
# Exploratory facts for the 2026-12-03 session (issues 28, 30, 31, 35). Everything under $OUT/explore.
set -u
O=$OUT/explore; mkdir -p $O
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
E=scripts/device/explore
{ date; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,pstate,temperature.gpu,power.draw --format=csv; uname -a; nproc; free -g; df -hT / /tmp; lsblk -o NAME,TYPE,SIZE,ROTA,MODEL,TRAN,MOUNTPOINT; ls -la /sys/block/; for b in /sys/block/*; do echo $b $(cat $b/queue/rotational 2>/dev/null) $(readlink -f $b/device); done; ls /sys/class/nvme 2>&1; ls /sys/class/hwmon; cat /proc/sys/kernel/yama/ptrace_scope 2>&1; capsh --print 2>&1 | head -3; mount | head -30; cat /proc/meminfo | head -25; } > $O/system.txt 2>&1
timeout 100 python3 $E/nvml_probe.py > $O/nvml_probe.txt 2>&1; echo "nvml_probe rc $?" >> $O/nvml_probe.txt
timeout 60 python3 $E/pyspy_probe.py > $O/pyspy_probe.txt 2>&1; echo "pyspy rc $?" >> $O/pyspy_probe.txt
{ L=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))'); ls -la $L | head -40; for f in $L/libtorch_cuda.so $L/../../nvidia/cublas/lib/libcublasLt.so.13 ; do echo "== $f"; ls -la $f; /usr/bin/time -v cuobjdump --list-elf --list-ptx $f 2>&1 | awk 'NR<=25 || /Elapsed|Maximum resident/'; done; which cuobjdump; cuobjdump --version; python3 -c 'import torch;print(torch.__version__, torch.version.cuda, torch.cuda.get_arch_list())'; pip list 2>/dev/null | grep -i -E "flash|bitsand|vllm|triton|cupy|jax|nvidia"; find / -xdev -name "*.so*" -size +20M 2>/dev/null | grep -v -E "^/proc" | head -60; } > $O/native.txt 2>&1
{ timeout 60 python3 $E/kvikio_probe.py; echo "kvikio rc $?"; } > $O/kvikio.txt 2>&1
{ F=.carry/bin/fio; $F --version; mkdir -p /tmp/fiot; for rw in write read; do timeout 40 $F --name=seq --filename=/tmp/fiot/f --size=2G --bs=1M --direct=1 --ioengine=psync --rw=$rw --numjobs=4 --offset_increment=512M --size=512M --group_reporting --runtime=8 --time_based=0 --output-format=json | python3 -c 'import json,sys; d=json.load(sys.stdin); j=d["jobs"][0]; print(d["global options"] if "global options" in d else "", "read_bw_MBps", j["read"]["bw_bytes"]/1e6, "write_bw_MBps", j["write"]["bw_bytes"]/1e6)'; done; timeout 30 $F --name=rr --filename=/tmp/fiot/f --size=2G --bs=4k --direct=1 --ioengine=psync --rw=randread --runtime=5 --time_based --output-format=json | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["read"]; print("randread iops", j["iops"], "clat p50/p99 us", j["clat_ns"]["percentile"]["50.000000"]/1e3, j["clat_ns"]["percentile"]["99.000000"]/1e3)'; rm -rf /tmp/fiot; } > $O/fio.txt 2>&1
cd $OUT && tar czf explore.tgz explore && ls -la $OUT
cat $O/nvml_probe.txt | tail -40; tail -15 $O/pyspy_probe.txt; tail -8 $O/kvikio.txt; cat $O/fio.txt
