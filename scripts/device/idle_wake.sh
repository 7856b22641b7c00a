#!/usr/bin/env bash
# On the lent H200 (2026-12-04, fifth session): the idle daemon's CPU and RSS over 60 s after
# the main thread's 1 s wake (7ffd32c), the daemon alone (no peer beside it: not
# benchmarks/idle_cost.py's same-window comparison). serve --no-probe.enabled, 1 s poll, real
# GPU; the window opens 25 s after start (the CUDA library scan is over by then: 3.3-4.0 s on
# this machine), and CPU is read from /proc/PID/stat (utime + stime, the waited-for children's
# too). Prints one line; about 90 s.
. "$(dirname "$0")/setup.sh"
python3 -m sparkdiag serve --no-probe.enabled --listen 127.0.0.1:19120 --state-dir /tmp/sd-wake \
  > /tmp/wake.log 2>&1 &
pid=$!
sleep 25
python3 - "$pid" <<'PY'
import os, sys, time
pid = int(sys.argv[1]); tick = os.sysconf("SC_CLK_TCK")
def cpu():
    f = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return sum(int(x) for x in f[11:15]) / tick  # utime stime cutime cstime
def rss():
    return next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")) / 1024
c0, t0 = cpu(), time.monotonic()
time.sleep(60)
c1, t1 = cpu(), time.monotonic()
print(f"idle daemon alone: {100 * (c1 - c0) / (t1 - t0):.3f} % of a core over {t1 - t0:.0f} s, RSS {rss():.1f} MiB")
PY
kill -TERM $pid; wait $pid; echo "exit $?"
tail -3 /tmp/wake.log
