"""The widest line each command prints, live output included, in a terminal of N columns and
piped; fails (exit 1) on a line wider than its terminal.

    PYTHONPATH=$PWD .venv/bin/python scripts/term_widths.py 80 120 [--save DIR]

Runs every command for real on the fixtures of tests/ (the NVML and probe fixtures, a stand-in
side for ``compare``, a stand-in Prometheus for ``fleet``, a soak state that fell for ``check``'s
soak row), once with standard output and error on a pseudo-terminal of each width and once
piped, and prints the widest line of each (both streams; a line rewritten in place with a
carriage return counts as one line each time, so every progress and status line is measured).
The live lines come from real runs where the machine can spare them (``probe --device cpu``,
``bench --device cpu``, ``watch`` of a job), and from synthetic windows fed through ``soak``'s
own progress line where a real soak would be a CPU load this machine cannot spare. A line wider
than its terminal fails the run unless it is one word (a path or a URL, kept whole on purpose);
piped output has no terminal and is reported only. tests/test_terminal.py runs it at 80 and 120.
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


def lines(text: str) -> list[str]:
    """Every line shown, colour codes left out; a carriage return starts a line again (a
    progress or status line rewritten in place)."""
    plain = re.sub(r"\x1b\[\??[0-9;]*[A-Za-z]", "", text.replace("\r\n", "\n").replace("\r", "\n"))
    return plain.splitlines()


def widest(text: str) -> int:
    """The widest line's columns, colour codes left out."""
    return max((len(line.rstrip()) for line in lines(text)), default=0)


def overflowing(text: str, columns: int) -> list[str]:
    """The lines wider than ``columns`` that hold more than one word (one word longer than a
    line, a path or a URL, stays whole on purpose: sparkdiag/terminal.py)."""
    return [line for line in lines(text) if len(line.rstrip()) > columns and len(line.split()) > 1]


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


# The progress line of a soak, fed synthetic windows (GPU temperatures and two ratios, longer than
# a CPU soak's line) through soak's own _Progress on standard error, then its report.
SOAK_LIVE = (
    "import sys; from tests.support.soak import gpu_soak, heating, report; "
    "from sparkdiag.soak.render import text; "
    "from sparkdiag.commands.soak import _Progress; from sparkdiag.soak.run import Job; "
    "from sparkdiag.soak.model import Target; from sparkdiag.probe.request import WorkerRequest; "
    "ws = heating([6.4, 6.3, 6.2, 6.0, 4.0], [4.0, 4.0, 4.0, 4.0, 3.9], "
    "[55.0, 63.0, 71.0, 80.0, 91.0], [50.0, 58.0, 66.0, 75.0, 86.0]); "
    "job = Job(Target('GPU 0', 0, 'GPU-0', 'NVIDIA H200'), WorkerRequest(soak_seconds=600)); "
    "p = _Progress([job], 600.0); "
    "[p.window(0, w) for w in ws]; p.__exit__(None, None, None); "
    "g = gpu_soak(ws, stopped='threshold', "
    "reason='memory at 91 °C, within 4 °C of its slowdown threshold'); "
    "print(text(report(g)), end='')"
)


def commands(tmp: Path) -> dict[str, list[str]]:
    from sparkdiag.soak.state import write_state
    from tests.support import scaled_cycle
    from tests.support.soak import fell, gpu_state, held
    from tests.test_compare import FAKE_SIDE

    state = tmp / "state"
    state.mkdir()
    uuid = "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"
    write_state(state / "soak.json", [gpu_state("0", uuid, kernels=[held(), fell()])])
    idle = str(FIX / "nvml" / "h200-idle.json")
    no_nvml = str(FIX / "nvml" / "no-nvml.json")
    recorded = str(FIX / "probe" / "h200-default.json")
    learned = tmp / "learned"
    # the recorded cycle at 0.48 with pid 4242 on the GPU: the probe beside another job
    beside = scaled_cycle(tmp / "beside-job.json", 0.48, [4242])
    for _ in range(3):  # three healthy runs teach the baselines the probe beside a job is held to
        subprocess.run(
            sparkdiag("probe", "--nvml-fixture", idle, "--probe.fixture", recorded, "--json",
                      "--state-dir", str(learned)),
            check=True, capture_output=True, cwd=ROOT,
        )  # fmt: skip
    side = str(FAKE_SIDE)
    recording = ROOT / "docs" / "device" / "2026-12-01" / "part-c" / "starved.recording.json"
    job = [PY, "-c", "import time; time.sleep(0.5)"]
    empty_sysfs = tmp / "sysfs-empty"
    (empty_sysfs / "bus" / "pci" / "devices").mkdir(parents=True)
    return {
        "check": sparkdiag(
            *("check", "--nvml-fixture", idle, "--state-dir", str(state)),
            *("--probe.fixture", str(FIX / "check" / "h200-probe.json")),
            *("--path.sysfs", str(FIX / "sysfs" / "h200-vm")),
        ),
        "check (no GPU)": sparkdiag(
            *("check", "--quick", "--nvml-fixture", no_nvml, "--path.sysfs", str(empty_sysfs)),
            *("--state-dir", str(tmp / "no-gpu-state")),
        ),
        "probe": sparkdiag(
            *("probe", "--nvml-fixture", idle, "--no-record"),
            *("--probe.fixture", recorded, "--state-dir", str(tmp / "probe-state")),
        ),
        "probe (beside a job)": sparkdiag(
            *("probe", "--nvml-fixture", idle, "--no-record", "--probe.fixture", str(beside)),
            *("--state-dir", str(learned)),
        ),
        "probe (CPU, live)": sparkdiag("probe", "--device", "cpu", "--small", "--dtype", "bf16"),
        "soak (live)": [PY, "-c", SOAK_LIVE],
        "soak (no GPU)": sparkdiag("soak", "--nvml-fixture", no_nvml),
        "compare": sparkdiag(
            *("compare", "--rounds", "1", "--native-python", f"{PY} {side} gpu"),
            *("--container", PY, side, "banner", "tflops=560", "torch=2.9.0a0+50eac81"),
        ),
        "bench (CPU, live)": sparkdiag(
            *("bench", "--device", "cpu", "--small", "--m", "32,64", "--iters", "2"),
            *("--warmup", "1"),
        ),
        "bench (no GPU)": sparkdiag("bench", "--nvml-fixture", no_nvml),
        "dump (bad sysfs)": sparkdiag("dump", "--path.sysfs", str(tmp / "no-such-dir")),
        "link lint": sparkdiag("link", "lint", "--path.sysfs", str(FIX / "sysfs" / "dgx-spark")),
        "watch (replay)": sparkdiag("watch", "--replay", str(recording)),
        "watch (no GPU)": sparkdiag(
            *("watch", "--nvml-fixture", no_nvml),
            *("--interval", "0.1", "--", *job),
        ),
        "chek (a typo)": sparkdiag("chek"),
    }


def main() -> int:
    args = sys.argv[1:]
    save = Path(args.pop(args.index("--save") + 1)) if "--save" in args else None
    if save is not None:
        args.remove("--save")
        save.mkdir(parents=True, exist_ok=True)
    widths = [int(a) for a in args] or [80, 120]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        env["XDG_STATE_HOME"] = str(Path(tmp) / "xdg-state")  # never the user's baselines
        table = commands(Path(tmp))
        fleet = fleet_command()
        table["fleet"] = fleet[0]
        print(f"{'command':22} " + " ".join(f"{w:>5}" for w in widths) + "  piped")
        results = {}
        for name, argv in table.items():
            outputs = [on_pty(argv, w, env) for w in widths] + [piped(argv, env)]
            row = [widest(out) for out in outputs]
            if save is not None:
                slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
                for w, out in zip([*widths, "piped"], outputs, strict=True):
                    (save / f"{slug}.{w}.txt").write_text(out.replace("\r", ""))
            for w, out in zip(widths, outputs, strict=False):
                failures += [f"{name} at {w}: {line!r}" for line in overflowing(out, w)]
            results[name] = row
            print(f"{name:22} " + " ".join(f"{n:>5}" for n in row), flush=True)
        fleet[1]()
    print(json.dumps(results))
    for failure in failures:
        print(f"wider than the terminal: {failure}", file=sys.stderr)
    return 1 if failures else 0


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
    sys.exit(main())
