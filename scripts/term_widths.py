"""The widest line each text command prints, in a terminal of N columns and piped.

    PYTHONPATH=$PWD .venv/bin/python scripts/term_widths.py 100 120 [--save DIR]

Runs every command for real on the fixtures of tests/ (the NVML and probe fixtures, a stand-in
side for ``compare``, a stand-in Prometheus for ``fleet``, a soak state that fell for ``check``'s
soak row), once with standard output and error on a pseudo-terminal of each width and once
piped, and prints the widest line of each (both streams; a line rewritten in place with a
carriage return counts as one line each time). ``soak``'s text is rendered from a synthetic
report: a real soak is a CPU load this machine cannot spare.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import tempfile
import termios
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIX = ROOT / "tests" / "fixtures"
PY = sys.executable


def widest(text: str) -> int:
    """The widest line's columns, colour codes left out."""
    # a carriage return starts the line again (a progress or status line rewritten in place)
    plain = re.sub(r"\x1b\[\??[0-9;]*[A-Za-z]", "", text.replace("\r\n", "\n").replace("\r", "\n"))
    return max((len(line) for line in plain.splitlines()), default=0)


def on_pty(argv: list[str], columns: int, env: dict[str, str]) -> str:
    """What a terminal ``columns`` wide shows: stdout and stderr both on it."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        argv, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, cwd=ROOT, env=env
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait()
    os.close(master)
    return b"".join(chunks).decode(errors="replace")


def piped(argv: list[str], env: dict[str, str]) -> str:
    """Standard output and standard error, each to a pipe, one after the other."""
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    return done.stdout + done.stderr


def sparkdiag(*args: str) -> list[str]:
    return [PY, "-m", "sparkdiag", *args]


def commands(tmp: Path) -> dict[str, list[str]]:
    from sparkdiag.soak.state import write_state
    from tests.support.soak import fell, gpu_state, held
    from tests.test_compare import FAKE_SIDE

    state = tmp / "state"
    state.mkdir()
    uuid = "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"
    write_state(state / "soak.json", [gpu_state("0", uuid, kernels=[held(), fell()])])
    idle = str(FIX / "nvml" / "h200-idle.json")
    soak_code = (
        "from tests.support.soak import gpu_soak, heating, report; "
        "from sparkdiag.soak.render import text; "
        "g = gpu_soak(heating([6.4, 6.0, 4.0], [4.0, 4.0, 3.9], [55.0, 80.0, 91.0]), "
        "stopped='threshold', reason='memory at 91 °C, within 4 °C of its slowdown threshold'); "
        "print(text(report(g)), end='')"
    )
    side = str(FAKE_SIDE)
    recording = ROOT / "docs" / "device" / "2026-12-01" / "part-c" / "starved.recording.json"
    job = [PY, "-c", "import time; time.sleep(0.5)"]
    return {
        "check": sparkdiag(
            *("check", "--nvml-fixture", idle, "--state-dir", str(state)),
            *("--probe.fixture", str(FIX / "check" / "h200-probe.json")),
            *("--path.sysfs", str(FIX / "sysfs" / "h200-vm")),
        ),
        "probe": sparkdiag(
            *("probe", "--nvml-fixture", idle, "--no-record"),
            *("--probe.fixture", str(FIX / "probe" / "h200-default.json")),
            *("--state-dir", str(tmp / "probe-state")),
        ),
        "soak (text)": [PY, "-c", soak_code],
        "compare": sparkdiag(
            *("compare", "--rounds", "1", "--native-python", f"{PY} {side} gpu"),
            *("--container", PY, side, "banner", "tflops=560", "torch=2.9.0a0+50eac81"),
        ),
        "bench": sparkdiag(
            *("bench", "--device", "cpu", "--small", "--m", "32,64", "--iters", "2"),
            *("--warmup", "1"),
        ),
        "link lint": sparkdiag("link", "lint", "--path.sysfs", str(FIX / "sysfs" / "dgx-spark")),
        "watch (replay)": sparkdiag("watch", "--replay", str(recording)),
        "watch (no GPU)": sparkdiag(
            *("watch", "--nvml-fixture", str(FIX / "nvml" / "no-nvml.json")),
            *("--interval", "0.1", "--", *job),
        ),
    }


def main() -> None:
    args = sys.argv[1:]
    save = Path(args.pop(args.index("--save") + 1)) if "--save" in args else None
    if save is not None:
        args.remove("--save")
        save.mkdir(parents=True, exist_ok=True)
    widths = [int(a) for a in args] or [100, 120]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        table = commands(Path(tmp))
        fleet = fleet_command()
        table["fleet"] = fleet[0]
        print(f"{'command':16} " + " ".join(f"{w:>5}" for w in widths) + "  piped")
        results = {}
        for name, argv in table.items():
            outputs = [on_pty(argv, w, env) for w in widths] + [piped(argv, env)]
            row = [widest(out) for out in outputs]
            if save is not None:
                slug = name.replace(" ", "-").replace("(", "").replace(")", "")
                for w, out in zip([*widths, "piped"], outputs, strict=True):
                    (save / f"{slug}.{w}.txt").write_text(out.replace("\r", ""))
            results[name] = row
            print(f"{name:16} " + " ".join(f"{n:>5}" for n in row), flush=True)
        fleet[1]()
    print(json.dumps(results))


def fleet_command() -> tuple[list[str], Callable[[], None]]:
    """``fleet`` against the stand-in Prometheus of tests/support/fleet.py: five H200s with real
    uuids, one an outlier, one a warning."""
    from tests.support.fleet import GPU, H200, KERNEL, peer_answers, stand_in, vector

    uuids = [f"GPU-979ad365-0b73-a0ac-74a2-3520b773d46{i}" for i in range(5)]
    ratios = [1.01, 0.99, 1.0, 0.95, 0.9]
    rows = [
        ({**GPU, "instance": f"node-{i}.cluster.example:10942", "uuid": u, **KERNEL, **H200}, r)
        for i, (u, r) in enumerate(zip(uuids, ratios, strict=True))
    ]
    answers = peer_answers(rows)
    server = stand_in(lambda q: (200, answers.get(q, vector())))
    url = server.__enter__()
    return sparkdiag("fleet", "--prometheus", url), lambda: server.__exit__(None, None, None)


if __name__ == "__main__":
    main()
