"""What NVML's initialisation leaves resident, and what malloc_trim(0) gives back (issue 35):
one process: bare, nvmlInit and one query, malloc_trim(0), five more queries; a second process
without the trim, ten seconds of a query a second. RSS from /proc/self/status.

    python3 scripts/device/nvml_trim.py     # on the lent H200
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import time


def rss() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main() -> None:
    import pynvml

    if sys.argv[1:] == ["--no-trim"]:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for _ in range(11):
            pynvml.nvmlDeviceGetTemperature(handle, 0)
            time.sleep(1)
        print(f"without a trim, after 10 s of a query a second: {rss():.1f} MiB")
        return
    print(f"bare: {rss():.1f} MiB")
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceGetTemperature(handle, 0)
    time.sleep(1)
    print(f"nvmlInit and one query, a second later: {rss():.1f} MiB")
    print(f"malloc_trim(0) returned {ctypes.CDLL(None).malloc_trim(0)}: {rss():.1f} MiB")
    for _ in range(5):
        pynvml.nvmlDeviceGetTemperature(handle, 0)
        pynvml.nvmlDeviceGetPowerUsage(handle)
    print(f"five more queries: {rss():.1f} MiB")
    subprocess.run([sys.executable, __file__, "--no-trim"], check=False)


if __name__ == "__main__":
    main()
