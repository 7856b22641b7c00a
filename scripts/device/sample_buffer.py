#!/usr/bin/env python3
"""On the lent H200: how far back the driver's GPU utilization samples reach
(nvmlDeviceGetSamples with no last-seen timestamp returns its whole buffer), so as to know
from what tick length a long `watch` (whose ticks double at each halving) reads only the last
part of each tick's samples. Prints the count, the spacing and the span; reads nothing else.

    python3 scripts/device/sample_buffer.py
"""

from __future__ import annotations

import itertools
import statistics
import time

import pynvml as nv

nv.nvmlInit()
try:
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    time.sleep(30.0)  # let the buffer fill past any span it can hold
    _, samples = nv.nvmlDeviceGetSamples(handle, nv.NVML_GPU_UTILIZATION_SAMPLES, 0)
    stamps = sorted(s.timeStamp for s in samples)
    gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(stamps)]
    print(
        f"samples {len(stamps)}, spacing median {statistics.median(gaps):.3f} s, "
        f"span {(stamps[-1] - stamps[0]) / 1e6:.1f} s"
    )
finally:
    nv.nvmlShutdown()
