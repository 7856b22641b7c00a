"""A stand-in for ``nvidia-smi --query-gpu=F1,F2 --format=csv,noheader,nounits``: prints, for
each GPU in $FAKE_NVIDIA_SMI (a JSON list of {field: text}), the fields asked for, in order;
a field the GPU entry lacks prints as ``[N/A]``, as nvidia-smi prints an unsupported one."""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    (query,) = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--query-gpu=")]
    assert "--format=csv,noheader,nounits" in sys.argv[1:], sys.argv
    for gpu in json.loads(os.environ["FAKE_NVIDIA_SMI"]):
        print(", ".join(str(gpu.get(field, "[N/A]")) for field in query.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
