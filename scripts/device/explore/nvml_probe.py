"""What NVML on the lent H200 answers for dense PCIe traffic and per-process utilization (issue 28)."""
import os, subprocess, sys, time, json
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
print("driver", n.nvmlSystemGetDriverVersion(), "nvml py", getattr(n, "__version__", "?"))
M = {k: getattr(n, k) for k in ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", "NVML_GPM_METRIC_PCIE_RX_PER_SEC", "NVML_GPM_METRIC_SM_UTIL", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", "NVML_GPM_METRIC_DRAM_BW_UTIL")}
FI = {k: getattr(n, k) for k in ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES")}
def gpm_pair():
    s = n.nvmlGpmSampleAlloc(); n.nvmlGpmSampleGet(h, s); return s
def gpm(a, b):
    req = n.c_nvmlGpmMetricsGet_t(); req.version = n.NVML_GPM_METRICS_GET_VERSION; req.numMetrics = len(M)
    req.sample1 = a; req.sample2 = b
    for i, v in enumerate(M.values()): req.metrics[i].metricId = v
    n.nvmlGpmMetricsGet(req)
    return {k: (round(req.metrics[i].value, 4), req.metrics[i].nvmlReturn) for i, k in enumerate(M)}
def fields():
    try:
        vals = n.nvmlDeviceGetFieldValues(h, list(FI.values()))
        out = {}
        for k, v in zip(FI, vals):
            out[k] = (v.nvmlReturn, v.value.ullVal, v.timestamp)
        return out
    except Exception as e:
        return repr(e)
JOB = {
 "h2d_pageable": "import torch,time\nx=torch.empty(256*2**20,dtype=torch.uint8)\nx.fill_(1)\nt=time.time()\nwhile time.time()-t<%f:\n  y=x.cuda(); torch.cuda.synchronize()\n",
 "d2h": "import torch,time\nx=torch.ones(256*2**20,dtype=torch.uint8,device='cuda')\nt=time.time()\nwhile time.time()-t<%f:\n  y=x.cpu()\n",
 "mm": "import torch,time\na=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16)\nt=time.time()\nwhile time.time()-t<%f:\n  b=a@a; torch.cuda.synchronize()\n",
 "mm_small": "import torch,time\na=torch.randn(2048,2048,device='cuda',dtype=torch.bfloat16)\nt=time.time()\nwhile time.time()-t<%f:\n  b=a@a; torch.cuda.synchronize()\n",
}
def start(kind, secs):
    return subprocess.Popen([sys.executable, "-c", JOB[kind] % secs])
def observe(label, secs=6):
    print("==", label)
    f0 = fields(); a = gpm_pair(); t0 = time.time(); since = int(time.time() * 1e6)
    time.sleep(secs)
    f1 = fields(); b = gpm_pair(); dt = time.time() - t0
    try: print(" gpm", gpm(a, b))
    except Exception as e: print(" gpm error", repr(e))
    print(" fields before", f0); print(" fields after", f1)
    if isinstance(f0, dict) and isinstance(f1, dict):
        for k in FI:
            if f0[k][0] == 0 and f1[k][0] == 0:
                print("  %s rate %.3f GB/s" % (k, (f1[k][1] - f0[k][1]) / dt / 1e9))
    for c in (n.NVML_PCIE_UTIL_TX_BYTES, n.NVML_PCIE_UTIL_RX_BYTES):
        t = time.perf_counter(); v = n.nvmlDeviceGetPcieThroughput(h, c); print("  pcie throughput", c, v, "KB/s", "%.1f ms" % ((time.perf_counter() - t) * 1e3))
    try:
        t = time.perf_counter(); s = n.nvmlDeviceGetProcessUtilization(h, since); e = (time.perf_counter() - t) * 1e3
        agg = {}
        for x in s:
            agg.setdefault(x.pid, []).append((x.smUtil, x.memUtil, x.timeStamp))
        print("  procutil %.1f ms" % e, {p: (len(v), sum(a for a, _, _ in v) / len(v)) for p, v in agg.items()})
    except Exception as ex:
        print("  procutil error", repr(ex))
    try:
        print("  compute procs", [(p.pid, p.usedGpuMemory) for p in n.nvmlDeviceGetComputeRunningProcesses(h)])
    except Exception as ex: print("  procs err", ex)
    try:
        u = n.nvmlDeviceGetUtilizationRates(h); print("  util", u.gpu, u.memory)
    except Exception as ex: print(ex)
observe("idle", 3)
for kinds in (["h2d_pageable"], ["d2h"], ["mm"], ["mm", "mm_small"]):
    ps = [start(k, 12) for k in kinds]
    time.sleep(5)
    print("pids", [(k, p.pid) for k, p in zip(kinds, ps)])
    observe("+".join(kinds), 5)
    for p in ps: p.wait()
