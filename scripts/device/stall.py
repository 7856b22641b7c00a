#!/usr/bin/env python3
"""On the lent H200: does SparkdiagGpuStalled fire on a spinning kernel, resolve after it, and
stay silent on an idle GPU and on a real training job? And what does ``sparkdiag check`` say?

It starts ``sparkdiag serve`` on the real GPU (poll every 1 s, probe off) and a real Prometheus
(``$PROMETHEUS``, default ``prometheus``; started by scripts/device/prom_session.py) scraping
it every 1 s with the shipped rules, in which only SparkdiagGpuStalled's ``for:`` is shortened
(``--stalled-for``, default 30s, from 10m: prom_session.shorten_for rewrites that one line and
the copy is saved as rules-shortened.yml; every expression and every other duration is as
shipped). Then four phases:

    idle   (40 s)  nothing on the GPU
    spin   (90 s)  a spinning kernel: torch.cuda._sleep in a loop (on the H200 on 2026-12-01
                   it held NVML utilization at 100 % with GPM SM activity 0.0076 at 123 W)
    idle2  (40 s)  nothing again
    train  (60 s)  a small real training job: torchvision ResNet-18, random data on the GPU

Every 2 s it records the pending and firing alerts (Prometheus' /api/v1/alerts) and the
readings the rule joins; in the middle of each phase it runs ``sparkdiag check --quick --json``
and keeps its stall row. Before the phases it records an NVML fixture of the idle GPU
(``sparkdiag record-fixture``: the new recovery-action and fabric queries included) and one
``sparkdiag dump``. Everything goes into ONE archive, ``$OUT/stall.tar.gz``:

    summary.json / summary.txt   per phase: alerts seen firing, the stall alert's firing and
                                 resolving times, the check row's verdict; the daemon's stall
                                 log lines
    timeline.jsonl               every 2 s: phase, alerts, utilization, GPM, power
    check-<phase>.json           the check documents
    rules-shortened.yml, serve.log, prometheus.log, load-<phase>.log, dump.prom,
    h200-recorded.json           the NVML recording

On the H200 (about 4.5 minutes of GPU time, 5 with the starts):

    OUT=/tmp/out PROMETHEUS=/path/to/prometheus python3 scripts/device/stall.py

Here, on CPU, with NVML fixtures in place of the GPU (the daemon replays a fixture scripted to
the same phases from tests/fixtures/nvml/h200-{idle,stalled,load}.json; the check of a phase
reads that phase's fixture; no torch load runs), shortened:

    OUT=/tmp/out python3 scripts/device/stall.py --fixture \\
        --phases idle=10,spin=45,idle2=10,train=20 --stalled-for 20s
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from prom_session import PromSession, free_port, shorten_for  # noqa: E402

NVML = ROOT / "tests" / "fixtures" / "nvml"
PHASES = {"idle": 40.0, "spin": 90.0, "idle2": 40.0, "train": 60.0}
PHASE_FIXTURE = {"idle": "h200-idle", "spin": "h200-stalled", "idle2": "h200-idle",
                 "train": "h200-load"}  # fmt: skip
LEAD_SECONDS = 8.0  # from the daemon's start to the first phase (fixture mode aligns on it)
READINGS = {
    "utilization": 'sparkdiag_gpu_utilization_ratio{engine="gpu"}',
    "sm": 'sparkdiag_gpu_activity_ratio{engine="sm"}',
    "dram": 'sparkdiag_gpu_activity_ratio{engine="dram"}',
    "tensor": 'sparkdiag_gpu_activity_ratio{engine="tensor"}',
    "power_watts": "sparkdiag_gpu_power_watts",
}


# -- the loads (run as subprocesses of this script: --load spin|train SECONDS) -----------------


def spin(until: float) -> None:
    import torch

    torch.empty(1, device="cuda")
    while time.time() < until:  # the phase's end, whatever torch's import took
        torch.cuda._sleep(500_000_000)  # ~0.25 s of spinning at ~2 GHz, nothing computed
        torch.cuda.synchronize()


def train(until: float) -> None:
    import torch
    import torchvision

    model = torchvision.models.resnet18(num_classes=1000).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(128, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (128,), device="cuda")
    began, steps = time.time(), 0
    while time.time() < until:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        if steps % 20 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    print(f"trained {steps} steps of ResNet-18, batch 128, in {time.time() - began:.0f} s")


# -- fixture mode: the phases scripted into one NVML fixture ------------------------------------


PHASE_KEYS = ("utilization", "gpm", "power_mw", "pstate", "clock/0", "clock/1",
              "clock_event_reasons", "compute_processes")  # fmt: skip


def _answers(name: str) -> dict[str, Any]:
    """GPU 0's answers of a fixture, its base and derived devices resolved."""
    sys.path.insert(0, str(ROOT))
    from sparkdiag.sources.nvml.fixture import load_fixture

    doc = load_fixture(NVML / f"{name}.json")
    answers: dict[str, Any] = doc["devices"][0]["answers"]
    return answers


def phase_fixture(path: Path, phases: dict[str, float]) -> None:
    """h200-idle with the phases' answers set at the poll each phase starts (poll n is about n
    seconds after the daemon's start: one poll a second)."""
    script, at = [], 1 + LEAD_SECONDS
    for phase, seconds in phases.items():
        answers = _answers(PHASE_FIXTURE[phase])
        keys = {k: answers[k] for k in PHASE_KEYS if k in answers}
        why = {k: f"phase {phase}: {PHASE_FIXTURE[phase]}.json" for k in keys}
        script.append({"poll": int(at), "gpu": 0, "set": keys, "why": why})
        at += seconds
    doc = {
        "format": "sparkdiag-nvml-fixture/1",
        "description": "scripts/device/stall.py --fixture: the H200 through the phases "
        + ", ".join(f"{p} {s:.0f} s" for p, s in phases.items()),
        "base": str(NVML / "h200-idle.json"),
        "script": script,
    }
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")


# -- the run ----------------------------------------------------------------------------------


def sparkdiag(*args: str) -> list[str]:
    return [sys.executable, "-m", "sparkdiag", *args]


def wait_http(url: str, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer in {seconds:.0f} s")


def readings(prom: PromSession) -> dict[str, float | None]:
    """The readings the rule joins, of the GPU (the lent machine has one: max over GPUs)."""
    out: dict[str, float | None] = {}
    for key, expr in READINGS.items():
        found = prom.query(f"max({expr})")
        out[key] = float(found[0]["value"][1]) if found else None
    return out


def check_row(
    work: Path, phase: str, fixture_args: list[str], env: dict[str, str]
) -> dict[str, Any]:
    done = subprocess.run(
        sparkdiag("check", "--quick", "--json", *fixture_args),
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )  # fmt: skip
    (work / f"check-{phase}.json").write_text(done.stdout + done.stderr[-4000:], encoding="utf-8")
    try:
        rows = json.loads(done.stdout)["checks"]
    except (ValueError, KeyError):
        return {"status": "error", "finding": done.stderr[-300:]}
    stall = [r for r in rows if r["name"] == "stall"]
    return {"rows": stall, "status": [r["status"] for r in stall]}


def run(opts: argparse.Namespace) -> int:
    out = Path(os.environ.get("OUT", "/tmp/out"))
    work = out / "stall"
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}",
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    phases = dict(PHASES)
    for item in filter(None, opts.phases.split(",")):
        name, _, seconds = item.partition("=")
        phases[name] = float(seconds)
    common = ["--path.rootfs", str(ROOT / "tests/fixtures/rootfs/native")] if opts.fixture else []
    if opts.fixture:
        common += ["--path.sysfs", str(ROOT / "tests/fixtures/sysfs/h200-vm")]
    summary: dict[str, Any] = {"mode": "fixture" if opts.fixture else "gpu", "phases": phases,
                               "stalled_for": opts.stalled_for}  # fmt: skip

    if not opts.fixture:  # the real GPU, idle: record it, and dump once
        what = "lent H200, idle (scripts/device/stall.py)"
        command = sparkdiag(
            "record-fixture", str(work / "h200-recorded.json"), "--description", what
        )
        rec = subprocess.run(
            command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
        )
        summary["record_fixture"] = (rec.stdout + rec.stderr).strip()[-500:]
    idle = ["--nvml-fixture", str(NVML / "h200-idle.json")] if opts.fixture else []
    dump = subprocess.run(
        sparkdiag("dump", *common, *idle), capture_output=True, text=True, cwd=ROOT, env=env,
        timeout=120,
    )  # fmt: skip
    (work / "dump.prom").write_text(dump.stdout + dump.stderr[-2000:], encoding="utf-8")

    serve_args = ["--listen", f"127.0.0.1:{free_port()}", "--poll-interval", "1",
                  "--no-probe.enabled", "--state-dir", str(work / "state"), *common]  # fmt: skip
    if opts.fixture:
        phase_fixture(work / "phases.json", phases)
        serve_args += ["--nvml-fixture", str(work / "phases.json")]
    target = serve_args[1]
    rules = shorten_for((ROOT / "prometheus/sparkdiag-rules.yml").read_text(encoding="utf-8"),
                        {"SparkdiagGpuStalled": opts.stalled_for})  # fmt: skip
    (work / "rules-shortened.yml").write_text(rules, encoding="utf-8")

    serve_log = (work / "serve.log").open("w")
    t0 = time.monotonic()
    serve = subprocess.Popen(sparkdiag("serve", *serve_args), stdout=serve_log,
                             stderr=subprocess.STDOUT, cwd=ROOT, env=env)  # fmt: skip
    timeline = (work / "timeline.jsonl").open("w")
    per_phase: dict[str, Any] = {}
    try:
        wait_http(f"http://{target}/metrics")
        with PromSession([target], rules, work / "prom", binary=opts.prometheus) as prom:
            time.sleep(max(0.0, t0 + LEAD_SECONDS - time.monotonic()))
            start = time.monotonic()
            for phase, seconds in phases.items():
                began = time.monotonic()
                load = None
                if not opts.fixture and phase in ("spin", "train"):
                    log = (work / f"load-{phase}.log").open("w")
                    until = str(time.time() + seconds)
                    load = subprocess.Popen(
                        [sys.executable, __file__, "--load", phase, "--until", until],
                        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                    )  # fmt: skip
                firing: set[str] = set()
                stalled_at: float | None = None
                checked = False
                while time.monotonic() - began < seconds:
                    now = time.monotonic()
                    alerts = prom.alerts()
                    names = {a["labels"]["alertname"]: a["state"] for a in alerts}
                    firing |= {n for n, s in names.items() if s == "firing"}
                    if names.get("SparkdiagGpuStalled") == "firing" and stalled_at is None:
                        stalled_at = now - began
                    row = {"t": round(now - start, 1), "phase": phase, "alerts": names}
                    timeline.write(json.dumps({**row, **readings(prom)}) + "\n")
                    timeline.flush()
                    if not checked and now - began >= seconds / 2:
                        checked = True
                        args = [*common]
                        if opts.fixture:
                            args += ["--nvml-fixture", str(NVML / f"{PHASE_FIXTURE[phase]}.json")]
                        per_phase.setdefault(phase, {})["check"] = check_row(work, phase, args, env)
                    time.sleep(max(0.0, 2.0 - (time.monotonic() - now)))
                if load is not None:
                    load.wait(60)
                at_end = {a["labels"]["alertname"] for a in prom.alerts() if a["state"] == "firing"}
                per_phase.setdefault(phase, {}).update(
                    firing_during=sorted(firing), firing_at_end=sorted(at_end),
                    stalled_fired_after_s=None if stalled_at is None else round(stalled_at, 1),
                )  # fmt: skip
            # how long the stall alert took to resolve after the spin ended
            summary["stall_resolved_after_spin_s"] = _resolved_after(
                work / "timeline.jsonl", phases
            )
    finally:
        serve.terminate()
        serve.wait(20)
        serve_log.close()
        timeline.close()
    summary["per_phase"] = per_phase
    log_lines = (work / "serve.log").read_text(encoding="utf-8", errors="replace").splitlines()
    summary["daemon_stall_log"] = [line for line in log_lines if "stalled" in line]
    summary["verdict"] = _verdict(per_phase)
    (work / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    (work / "summary.txt").write_text(_text(summary), encoding="utf-8")
    print(_text(summary))
    with tarfile.open(out / "stall.tar.gz", "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            if path.is_file() and "data" not in path.relative_to(work).parts:
                tar.add(path, arcname=str(path.relative_to(work)))
    return 0 if summary["verdict"]["ok"] else 1


def _resolved_after(timeline: Path, phases: dict[str, float]) -> float | None:
    rows = [json.loads(line) for line in timeline.read_text(encoding="utf-8").splitlines()]
    spin_end = phases["idle"] + phases["spin"]
    after = [r for r in rows if r["t"] >= spin_end]
    for r in after:
        if "SparkdiagGpuStalled" not in r["alerts"]:
            return round(r["t"] - spin_end, 1)
    return None


def _verdict(per_phase: dict[str, Any]) -> dict[str, Any]:
    def fired(phase: str) -> bool:
        return "SparkdiagGpuStalled" in per_phase.get(phase, {}).get("firing_during", [])

    def check(phase: str) -> list[str]:
        return list(per_phase.get(phase, {}).get("check", {}).get("status", []))

    def firing_at_end(phase: str) -> bool:
        return "SparkdiagGpuStalled" in per_phase.get(phase, {}).get("firing_at_end", [])

    verdict = {
        "spin_fires": fired("spin"),
        # after the spin the alert takes a scrape and an evaluation to resolve: idle2 is judged
        # at its end (stall_resolved_after_spin_s says how long it took)
        "idle_silent": not fired("idle") and not firing_at_end("idle2"),
        "train_silent": not fired("train"),
        "check_spin_fails": check("spin") == ["fail"],
        "check_idle_and_train_pass": all(check(p) == ["pass"] for p in ("idle", "idle2", "train")),
    }
    return {**verdict, "ok": all(verdict.values())}


def _text(summary: dict[str, Any]) -> str:
    lines = [f"mode {summary['mode']}, SparkdiagGpuStalled for: {summary['stalled_for']}"]
    for phase, info in summary["per_phase"].items():
        rows = info.get("check", {}).get("rows", [])
        finding = rows[0]["finding"] if rows else info.get("check", {}).get("finding", "")
        lines.append(
            f"{phase:6} {summary['phases'][phase]:4.0f} s  "
            f"firing: {', '.join(info['firing_during']) or '-'}"
            f"  (stall fired after {info['stalled_fired_after_s']} s)  check: "
            f"{'/'.join(info.get('check', {}).get('status', ['-']))} {finding}"
        )
    lines.append(
        f"stall alert resolved {summary.get('stall_resolved_after_spin_s')} s after the spin"
    )
    lines += [f"log: {line}" for line in summary["daemon_stall_log"]]
    lines.append("verdict: " + json.dumps(summary["verdict"]))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixture", action="store_true", help="NVML fixtures, no GPU, no loads")
    parser.add_argument("--phases", default="", help="durations, e.g. idle=10,spin=45")
    parser.add_argument("--stalled-for", default="30s", help="SparkdiagGpuStalled's for:")
    parser.add_argument("--prometheus", default=None, help="binary (default $PROMETHEUS)")
    parser.add_argument("--load", choices=("spin", "train"), help=argparse.SUPPRESS)
    parser.add_argument("--until", type=float, default=0.0, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.load == "spin":
        spin(opts.until)
        return 0
    if opts.load == "train":
        train(opts.until)
        return 0
    return run(opts)


if __name__ == "__main__":
    sys.exit(main())
