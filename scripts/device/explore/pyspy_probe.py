"""py-spy against a running torch job on the H200: dump --json, record raw chunks, cost (issue 28)."""
import subprocess, sys, time, json, shutil
JOB = "import torch,time\na=torch.randn(512,512,device='cuda')\nn=0;t=time.time()\ndef step(a):\n  return a@a\nwhile time.time()-t<40:\n  b=step(a); n+=1\n  if n%%1000==0: print(n/(time.time()-t), flush=True)\n"
exe = shutil.which("py-spy"); print("py-spy", exe)
p = subprocess.Popen([sys.executable, "-c", JOB], stdout=subprocess.PIPE, text=True)
time.sleep(6)
for args in (["dump", "--pid", str(p.pid), "--json"], ["dump", "--pid", str(p.pid), "--json", "--nonblocking"], ["dump", "--pid", str(p.pid), "--native"]):
    t = time.perf_counter(); r = subprocess.run([exe] + args, capture_output=True, text=True, timeout=20); e = time.perf_counter() - t
    print("==", args[3:], "rc", r.returncode, "%.3f s" % e); print(r.stdout[:1500]); print(r.stderr[:500])
for rate in (20, 100):
    t = time.perf_counter()
    r = subprocess.run([exe, "record", "--pid", str(p.pid), "--format", "raw", "--rate", str(rate), "--duration", "2", "--idle", "--threads", "--nonblocking", "-o", "/tmp/raw.txt"], capture_output=True, text=True, timeout=20)
    print("== record rate", rate, "rc", r.returncode, "%.2f s" % (time.perf_counter() - t), r.stderr[-300:])
    print(open("/tmp/raw.txt").read()[:1200])
p.kill(); p.wait()
