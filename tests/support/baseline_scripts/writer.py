"""One of several concurrent writers to a baseline store (driven by tests/test_baseline.py).

Run as ``python writer.py DB WRITER_ID RUNS``. Opens the store (creating it if
needed, at the same moment as the other writers), prints ``ready``, waits for a
line on standard input, then records RUNS healthy runs for its own key and
RUNS for the key all writers share, alternating, and prints one JSON line
with what it recorded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sparkdiag.baseline.model import BaselineKey
from sparkdiag.baseline.store import BaselineStore


def key(gpu_uuid: str) -> BaselineKey:
    return BaselineKey(gpu_uuid, "bf16", "8192x8192x8192", "native", "580.1", "2.11", "13.0")


def main() -> int:
    db, writer, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    own, shared = key(f"GPU-writer-{writer}"), key("GPU-shared")
    with BaselineStore(db, busy_timeout_s=30.0) as store:
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(count):
            store.record_run(own, 100.0 + i, healthy=True, conditions={"writer": writer, "i": i})
            store.record_run(shared, 500.0 + writer + i / 1000, healthy=True)
    print(json.dumps({"writer": writer, "own": count, "shared": count}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
