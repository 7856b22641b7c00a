"""Where the idle daemon's resident memory goes, import by import, on top of the NVML floor
(issue 35): one process per row, each NVML initialised with one query (the floor of
``benchmarks/idle_cost.py``), then the imports named, RSS read from /proc after a second.

    python3 scripts/device/rss_parts.py            # on the lent H200
    python3 scripts/device/rss_parts.py --fixture  # here: the fixture backend instead of NVML

Rows "alone" add one import to the floor; rows "in order" add the daemon's imports one after
the other as far as that row (asyncio without ssl as ``sparkdiag.web`` imports it, h11, click,
pyudev with one enumeration, then every module ``serve`` loads), and the last row adds ``ssl``,
what a TLS web config brings.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "nvml" / "h200-idle.json"

_NVML = (
    "import pynvml\npynvml.nvmlInit()\nh = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
    "pynvml.nvmlDeviceGetTemperature(h, 0)\n"
)
_FIXTURE = (
    "from pathlib import Path\nfrom sparkdiag.sources.nvml.fixture import FixtureBackend\n"
    f"b = FixtureBackend(Path({str(FIXTURE)!r}))\nb.init()\nb.query(0, 'temperature', 0)\n"
)
_READ = (
    "import time\ntime.sleep(1)\n"
    "for line in open('/proc/self/status'):\n"
    "    if line.startswith('VmRSS:'):\n"
    "        print(int(line.split()[1]) / 1024)\n"
)
PARTS = [
    ("asyncio without ssl", "import sparkdiag.web\n"),
    ("h11", "import h11\n"),
    ("click", "import click\n"),
    (
        "pyudev, one enumeration",
        "import pyudev\nlist(pyudev.Context().list_devices(subsystem='pci'))\n",
    ),
    (
        "every module serve loads",
        "import sparkdiag.cli, sparkdiag.daemon, sparkdiag.commands.serve\n",
    ),
    ("ssl (a TLS web config)", "import ssl\n"),
]


def rss(code: str) -> float | None:
    out = subprocess.run(
        [sys.executable, "-c", code + _READ], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        print(out.stderr.strip().splitlines()[-1:], file=sys.stderr)
        return None
    return float(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixture", action="store_true", help="the fixture backend, not NVML")
    opts = parser.parse_args()
    floor_code = _FIXTURE if opts.fixture else _NVML
    rows: dict[str, dict[str, float | None]] = {}
    floor = rss(floor_code)
    bare = rss("")
    print(f"python {sys.version.split()[0]}: bare {bare} MiB, the floor {floor} MiB")
    so_far = floor_code
    for name, code in PARTS:
        so_far += code
        alone, ordered = rss(floor_code + code), rss(so_far)
        rows[name] = {"alone": alone, "in_order": ordered}
        shown = [f"{v:6.1f}" if v is not None else "     -" for v in (alone, ordered)]
        over = f"{ordered / floor:5.2f}x" if ordered and floor else ""
        print(f"{name:<28} alone {shown[0]} MiB  in order {shown[1]} MiB {over}")
    json.dump({"bare": bare, "floor": floor, "rows": rows}, sys.stderr)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
