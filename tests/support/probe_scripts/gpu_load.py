"""Keep a GPU busy with bf16 matrix products: ``python gpu_load.py SECONDS [--on-go]``.

Prints "ready" once its CUDA context exists and the first product ran, so a
test can start the probe knowing this process already shows in NVML. With
--on-go it first imports torch, prints "imported" and waits for a line on
stdin before it touches the GPU, so a test can start the load within a
fraction of a second at the moment it chooses.
"""

from __future__ import annotations

import sys
import time

import torch


def main() -> int:
    seconds = float(sys.argv[1])
    device = "cuda:0"
    if "--on-go" in sys.argv[2:]:
        print("imported", flush=True)
        sys.stdin.readline()
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    (a @ b).sum().item()
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
