"""A newcomer's walk on a machine without a GPU, in tmux at a given width: every step's screen,
exit status and widest line (issue 32).

    python3 scripts/newcomer_walk.py --repo /work/main --python /work/main/.venv/bin/python \
        --width 80 --out /tmp/walk-before-80.json

Each step runs in a fresh tmux session of ``--width`` columns and 50 rows (``tmux new-session -d
-x W -y 50``), typed with ``send-keys`` from ``--repo`` as a user would type it (no PYTHONPATH),
and its screen is read with ``capture-pane -J`` (wrapped lines joined, so a line wider than the
terminal shows as one long line). Steps that run until stopped get Ctrl-C after a delay. The
missing-torch steps run a virtual environment that holds every package of ``--python``'s but
torch (made under /tmp by this script: symlinks, nothing downloaded).

Writes a JSON list of {step, command, exit, widest, screen}; ``--markdown`` turns two walks
(before and after) of two widths into the table of docs/walks/.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H200 = "tests/fixtures/nvml/h200-idle.json"
PROBE = "tests/fixtures/probe/h200-default.json"
NO_TORCH_ENV = Path("/tmp/sparkdiag-walk-notorch")
MARK = "[walk exit "

# A recorded H200 cycle (tests/fixtures/probe/h200-default.json) with every figure at 0.48 of
# what it delivered and pid 4242 seen on the GPU: what CONTEXT.md reports beside a ViT job
# (0.45-0.51 of baseline), made here because no full document of that run was kept.
BESIDE_JOB = (
    "import json,sys; d=json.load(open(sys.argv[1])); "
    "[r.update(delivered=r['delivered']*0.48) for r in d['results'] if r.get('delivered')]; "
    "d['busy']['other_pids']=[4242]; json.dump(d, open(sys.argv[2], 'w'))"
)


def steps(py: str, notorch: str, tmp: str) -> list[tuple[str, str, float | None]]:
    """(name, command, seconds before Ctrl-C or None)."""
    sd = f"{py} -m sparkdiag"
    nt = f"{notorch} -m sparkdiag"
    state = f"{tmp}/state"
    busy = f"{tmp}/beside-job.json"
    fixture_probe = f"--nvml-fixture {H200} --state-dir {state}"
    return [
        ("bench, no flags, no GPU (Ctrl-C after 25 s)", f"{sd} bench", 25.0),
        ("bench --device cpu --small", f"{sd} bench --device cpu --small --m 128,256", None),
        ("probe without torch", f"{nt} probe --device cpu --small", None),
        ("bench without torch", f"{nt} bench --device cpu --small", None),
        ("soak without torch", f"{nt} soak --device cpu --small --duration 10 --no-record", None),
        (
            "soak on the CPU (progress line)",
            f"{sd} soak --device cpu --small --duration 10 --window 1 --no-record",
            None,
        ),
        ("check, no GPU", f"{sd} check --quick", None),
        (
            "check --json, no GPU",
            f"({sd} check --quick --json | {py} -c 'import json,sys; d=json.load(sys.stdin); "
            'print(d["status"], d["exit_code"])\'; exit ${PIPESTATUS[0]})',
            None,
        ),
        ("probe on the CPU", f"{sd} probe --device cpu --small", None),
        (
            "probe beside another process (learn, then 0.48 of it)",
            f"for i in 1 2 3; do {sd} probe {fixture_probe} --probe.fixture {PROBE} --json "
            f">/dev/null; done; {sd} probe {fixture_probe} --probe.fixture {busy} --no-record",
            None,
        ),
        ("dump --path.sysfs /nonexistent", f"{sd} dump --path.sysfs /nonexistent", None),
        (
            "check --path.rootfs /nonexistent",
            f"{sd} check --quick --path.rootfs /nonexistent",
            None,
        ),
        (
            "probe --path.rootfs /nonexistent",
            f"{sd} probe --device cpu --small --path.rootfs /nonexistent",
            None,
        ),
        ("link lint --path.sysfs /nonexistent", f"{sd} link lint --path.sysfs /nonexistent", None),
        ("watch --help | grep -A2 -- --plot", f"{sd} watch --help | grep -A2 -- '--plot'", None),
        ("serve, Ctrl-C after 8 s", f"{sd} serve --listen 127.0.0.1:19942", 8.0),
        ("compare --help", f"{sd} compare --help", None),
        ("link --help", f"{sd} link --help", None),
        ("fleet --help", f"{sd} fleet --help", None),
        ("check --help", f"{sd} check --help", None),
        ("config default", f"{sd} config default", None),
        ("chek (a typo)", f"{sd} chek", None),
        (
            "probe --help | grep -A4 -- --probe.timeout",
            f"{sd} probe --help | grep -A4 -- '--probe.timeout'",
            None,
        ),
    ]


def no_torch_env(python: str) -> str:
    """A venv whose site-packages are the links of ``python``'s, torch's left out."""
    bin_py = NO_TORCH_ENV / "bin" / "python"
    if not bin_py.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(NO_TORCH_ENV)],
                       check=True)  # fmt: skip
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    mine = subprocess.run(
        [str(bin_py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    for entry in Path(site).iterdir():
        name = entry.name.lower()
        if name.startswith(("torch", "functorch", "_distutils_hack")) or name.endswith(".pth"):
            continue
        link = Path(mine) / entry.name
        if not link.exists():
            link.symlink_to(entry)
    return str(bin_py)


def tmux(*args: str) -> str:
    done = subprocess.run(["tmux", "-L", "sparkdiag-walk", *args], capture_output=True,
                          text=True, check=False)  # fmt: skip
    return done.stdout


def run_step(command: str, width: int, repo: str, interrupt: float | None) -> dict[str, object]:
    name = f"walk{time.monotonic_ns()}"
    conf = Path(tempfile.gettempdir()) / "sparkdiag-walk.tmux.conf"
    conf.write_text("set -g history-limit 20000\nset -g status off\n")
    tmux("-f", str(conf), "new-session", "-d", "-s", name, "-x", str(width), "-y", "50",
         "-c", repo, "env -u PYTHONPATH -u COLUMNS NO_COLOR=1 bash --norc --noprofile")  # fmt: skip
    typed = f"clear; {command}; echo '{MARK}'$?']'"
    tmux("send-keys", "-t", name, typed, "Enter")
    started = time.monotonic()
    sent = False
    screen = ""
    while time.monotonic() - started < 300:
        time.sleep(0.5)
        if interrupt is not None and not sent and time.monotonic() - started >= interrupt:
            tmux("send-keys", "-t", name, "C-c")
            sent = True
        screen = tmux("capture-pane", "-p", "-J", "-S", "-", "-t", name)
        ended = subprocess.run(["tmux", "-L", "sparkdiag-walk", "has-session", "-t", name],
                               capture_output=True, check=False).returncode  # fmt: skip
        if ended:  # the session ended (a step that exits the shell)
            break
        if re.search(re.escape(MARK) + r"\d+\]", screen.split(typed[-20:], 1)[-1]):
            break
    tmux("kill-session", "-t", name)
    lines = screen.rstrip("\n").splitlines()
    # the typed command line (and its wrap) is the first screen line(s): leave it out
    start = next((i for i, line in enumerate(lines) if MARK in line and "$?" in line), -1) + 1
    body = lines[start:]
    code = None
    for i, line in enumerate(body):
        found = re.search(re.escape(MARK) + r"(\d+)\]", line)
        if found:
            code = int(found.group(1))
            body = body[:i]
            break
    while body and not body[-1].strip():
        body.pop()
    return {
        "exit": code,
        "widest": max((len(line.rstrip()) for line in body), default=0),
        "screen": "\n".join(line.rstrip() for line in body),
    }


def walk(repo: str, python: str, width: int) -> list[dict[str, object]]:
    notorch = no_torch_env(python)
    out = []
    # one idle session keeps the tmux server up between steps: a step's session started while
    # the server of the one before was exiting got no screen (seen: 2 of 46 steps, exit None)
    tmux("new-session", "-d", "-s", "keeper", "-x", "40", "-y", "5")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([python, "-c", BESIDE_JOB, str(ROOT / PROBE), f"{tmp}/beside-job.json"],
                       check=True)  # fmt: skip
        for step, command, interrupt in steps(python, notorch, tmp):
            shown = command.replace(python, "python").replace(notorch, "python-without-torch")
            shown = shown.replace(tmp, "$TMP")
            result = run_step(command, width, repo, interrupt)
            if result["exit"] is None:  # no screen came back: once more
                result = run_step(command, width, repo, interrupt)
            result["screen"] = str(result["screen"]).replace(tmp, "$TMP")
            out.append({"step": step, "command": shown, **result})
            print(f"{width:4} {step[:60]:60} exit {result['exit']} widest {result['widest']}",
                  flush=True)  # fmt: skip
    tmux("kill-server")
    return out


Walk = dict[int, list[dict[str, object]]]
SHOWN = 45  # screen lines shown per step in the page (the JSON beside it keeps every line)


def _cell(step: dict[str, object], width: int) -> str:
    widest = int(str(step["widest"]))
    over = " **wider**" if widest > width else ""
    return f"exit {step['exit']}, {widest}{over}"


def _screen(step: dict[str, object]) -> str:
    lines = str(step["screen"]).splitlines()
    cut = lines[:SHOWN]
    if len(lines) > SHOWN:
        cut.append(f"… ({len(lines) - SHOWN} more lines in the JSON)")
    return "\n".join("    " + line if line else "" for line in cut) or "    (nothing)"


def markdown(before: Walk, after: Walk) -> str:
    """The table of every step (exit status and widest line, before and after, at each width),
    then each step's screen at the narrowest width, before and after."""
    widths = sorted(before)
    head = "| step | " + " | ".join(f"before {w} | after {w}" for w in widths) + " |"
    lines = [head, "|---" * (1 + 2 * len(widths)) + "|"]
    for i, step in enumerate(before[widths[0]]):
        cells = [_cell(walked[w][i], w) for w in widths for walked in (before, after)]
        name = str(step["step"]).replace("|", "\\|")  # a pipe in a step's name, not a cell
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    narrow = widths[0]
    for i, step in enumerate(before[narrow]):
        lines += ["", f"### {step['step']}", "", f"`{step['command']}`", ""]
        for label, walked in (("before", before), ("after", after)):
            shown = walked[narrow][i]
            lines += [f"{label}, {narrow} columns: {_cell(shown, narrow)}", "", _screen(shown), ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo")
    parser.add_argument("--python")
    parser.add_argument("--width", type=int, action="append")
    parser.add_argument("--out")
    parser.add_argument("--markdown", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.markdown:
        before, after = (json.loads(Path(p).read_text()) for p in args.markdown)
        print(
            markdown({int(k): v for k, v in before.items()}, {int(k): v for k, v in after.items()}),
            end="",
        )
        return
    result = {w: walk(args.repo, args.python, w) for w in args.width}
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
