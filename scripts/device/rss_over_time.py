"""RSS over time of the NVML floor and of the idle daemon, started together (issue 35): the
floor (pynvml initialised, one query a second, as benchmarks/idle_cost.py's ``nvml``) and
``sparkdiag serve --no-probe.enabled``, sampled every 5 s for ``--seconds``: RSS, its anonymous
and file-backed parts (/proc/PID/smaps_rollup).

    python3 scripts/device/rss_over_time.py --seconds 150     # on the lent H200
    python3 scripts/device/rss_over_time.py --fixture --seconds 20

``--holder``: a third process initialises NVML first and holds it (as nvidia-persistenced or
another exporter would), and the two start 3 s after it, on a GPU that is already up.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.common import free_port, stop  # noqa: E402

FLOOR = (
    "import time, pynvml\npynvml.nvmlInit()\nh = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
    "while True:\n    pynvml.nvmlDeviceGetTemperature(h, 0)\n    time.sleep(1)\n"
)
FIXTURE_FLOOR = (
    "import time\nfrom pathlib import Path\n"
    "from sparkdiag.sources.nvml.fixture import FixtureBackend\n"
    "b = FixtureBackend(Path('tests/fixtures/nvml/h200-idle.json'))\nb.init()\n"
    "while True:\n    b.query(0, 'temperature', 0)\n    time.sleep(1)\n"
)


def memory(pid: int) -> tuple[float, float, float]:
    """(RSS, anonymous, file-backed) in MiB."""
    kib = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Rss", "Anonymous") and rest.split():
            kib[name] = int(rest.split()[0])
    return kib["Rss"] / 1024, kib["Anonymous"] / 1024, (kib["Rss"] - kib["Anonymous"]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--fixture", action="store_true")
    parser.add_argument("--holder", action="store_true", help="NVML held by another process first")
    opts = parser.parse_args()
    serve = [sys.executable, "-m", "sparkdiag", "serve", "--no-probe.enabled", "--listen"]
    serve += [f"127.0.0.1:{free_port()}", "--log-level", "warning"]
    if opts.fixture:
        serve += ["--nvml-fixture", "tests/fixtures/nvml/h200-idle.json"]
    holder = None
    if opts.holder:
        code = FIXTURE_FLOOR if opts.fixture else FLOOR
        holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
        time.sleep(3.0)
    procs = {
        "floor": subprocess.Popen(
            [sys.executable, "-c", FIXTURE_FLOOR if opts.fixture else FLOOR], cwd=ROOT
        ),
        "daemon": subprocess.Popen(serve, cwd=ROOT),
    }
    began = time.monotonic()
    print(f"{'s':>5}  {'floor RSS anon file':>22}  {'daemon RSS anon file':>22}  ratio")
    try:
        while (elapsed := time.monotonic() - began) < opts.seconds:
            time.sleep(5.0 - elapsed % 5.0)
            try:
                rows = {name: memory(p.pid) for name, p in procs.items()}
            except (OSError, KeyError):
                continue  # not started yet
            f, d = rows["floor"], rows["daemon"]
            print(
                f"{time.monotonic() - began:5.0f}  {f[0]:6.1f} {f[1]:6.1f} {f[2]:6.1f}   "
                f"{d[0]:6.1f} {d[1]:6.1f} {d[2]:6.1f}   {d[0] / f[0]:5.2f}",
                flush=True,
            )
    finally:
        for proc in [*procs.values(), *([holder] if holder else [])]:
            stop(proc)


if __name__ == "__main__":
    main()
