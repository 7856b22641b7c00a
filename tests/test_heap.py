"""sparkdiag.heap: memory freed below the heap's top goes back to the kernel when trimmed
(what NVML's initialisation leaves in the daemon: sparkdiag/heap.py)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from tests.support import ROOT

# 80 MB in 4 KB blocks (malloc's heap, not mmap), one more block above them, then the 80 MB
# freed: glibc keeps them resident, below the block still in use, until trimmed
_CODE = """
import json
from sparkdiag import heap
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
blocks = [bytearray(4000) for _ in range(20000)]
above = [bytearray(4000) for _ in range(10)]
del blocks
freed = rss()
released = heap.trim()
print(json.dumps({"freed": freed, "trimmed": rss(), "released": released}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_memory_below_the_top_leaves_when_trimmed() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CODE], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    assert figures["released"] is True
    assert figures["freed"] - figures["trimmed"] > 50, figures  # of the 80 MB freed
