"""Steps 3 and 4 of scripts/device/multi_gpu.py: the all-reduce job (multi_gpu_job.py) with a
straggler and a rank that leaves, watched by a fresh daemon under Prometheus, by ``sparkdiag
watch`` and ``check --quick``; and the NVLink payload the daemon exported against nvidia-smi's.

Times come from the job: after its process group is up, rank 0 writes the schedule (absolute
times of each phase); everything here is placed on it:

    before traffic       nvidia-smi nvlink -gt d and a scrape of the daemon (counters at rest)
    traffic + 5 s        record-fixture under the all-reduce
    straggler + 2 s      watch --json for --watch seconds (a co-tenant slows the straggler)
    leave + 1 s          watch --json for --watch seconds (the stop rank has left)
    leave + 12 s         nvidia-smi and a scrape again: nothing moves once every rank waits, and
                         the daemon reads NVLink counters every 10 s
    leave + 15 s         check --quick --json (its stall rows)
    leave + --hang s     the job is killed; then how long SparkdiagGpuStalled takes to resolve
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import multi_gpu_read as rd
from multi_gpu_job import SCRIPT
from prom_session import PromSession, free_port

# the driver's Run (multi_gpu.py), which imports this module: named here, not imported
Run = Any

STALLED = "SparkdiagGpuStalled"
READINGS = {
    "util": 'sparkdiag_gpu_utilization_ratio{engine="gpu"}',
    "sm": 'sparkdiag_gpu_activity_ratio{engine="sm"}',
    "dram": 'sparkdiag_gpu_activity_ratio{engine="dram"}',
    "tensor": 'sparkdiag_gpu_activity_ratio{engine="tensor"}',
    "watts": "sparkdiag_gpu_power_watts",
}


def events(folder: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(folder.glob("events-rank*.jsonl")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return sorted(found, key=lambda e: e["t"])


class Job:
    """The launcher and what its ranks wrote."""

    def __init__(self, run: Run) -> None:
        self.run = run
        n = run.n
        self.ranks = run.opts.ranks or (min(n, 3) if run.dry else n)
        self.stop_rank = run.opts.stop_rank if run.opts.stop_rank >= 0 else self.ranks - 1
        self.straggler = run.opts.straggler_rank
        self.waiting = [r for r in range(self.ranks) if r != self.stop_rank]
        self.folder = run.work / "job"
        self.folder.mkdir(exist_ok=True)
        self.proc = run.start(
            [
                sys.executable,
                str(SCRIPT),
                "launch",
                "--ranks",
                str(self.ranks),
                "--backend",
                "gloo" if run.dry else "nccl",
                "--events",
                str(self.folder),
                "--plan",
                run.opts.plan,
                "--stop-rank",
                str(self.stop_rank),
                "--straggler-rank",
                str(self.straggler),
                "--port",
                str(free_port()),
            ],
            "job/launcher.log",
        )

    def schedule(self, seconds: float) -> dict[str, Any]:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            found = [e for e in events(self.folder) if e["event"] == "schedule"]
            if found:
                return found[0]
            if self.proc.poll() is not None:
                raise RuntimeError(f"the job exited {self.proc.returncode} before its schedule")
            time.sleep(0.5)
        raise TimeoutError(f"no schedule from the job in {seconds:.0f} s (job/rank*.log)")

    def by_rank(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for e in events(self.folder):
            me = out.setdefault(int(e["rank"]), {})
            me.setdefault("pid", e["pid"])
            me[e["event"]] = {k: v for k, v in e.items() if k not in ("rank", "pid", "event")}
        return out


def collective(run: Run) -> None:
    job = Job(run)
    try:
        schedule = job.schedule(min(240.0, run.left()))
        run.summary["job_schedule"] = schedule
        observe(run, job, schedule)
    finally:
        run.stop(job.proc)
        ranks = job.by_rank()
        run.summary["job_ranks"] = ranks
        judge_job(run, job, ranks)


def observe(run: Run, job: Job, schedule: dict[str, Any]) -> None:
    at = schedule["at"]
    leave = at["leave"]
    fixture: list[str] = []  # the daemon's NVML (dry: the job scripted over the fixture)
    # watch's and check's NVML in a dry run (the ranks on their GPUs)
    seen: dict[str, list[str]] = {"straggler": [], "hang": []}
    daemon_start = time.time()
    if run.dry:
        import multi_gpu_dry as dry

        path = dry.job_fixture(
            run.work / "job-fixture.json",
            run.fixture,
            schedule,
            daemon_start,
            job.ranks,
            job.stop_rank,
            leave + run.opts.hang,
        )
        fixture = ["--nvml-fixture", str(path)]
        pids = {r: int(me["pid"]) for r, me in job.by_rank().items()}
        for name, stalled, idle in (("straggler", [], []), ("hang", job.waiting, [job.stop_rank])):
            ranks = dry.ranks_fixture(
                run.work / f"ranks-{name}.json", run.fixture, pids, stalled, idle
            )
            seen[name] = ["--nvml-fixture", str(ranks)]
    cotenant = run.cotenant(
        job.straggler, "cotenant-straggler.log", at["hang_lead"], at["straggler"]
    )
    proc, target = run.serve("job", "--no-probe.enabled", "--process-metrics", *fixture)
    watches: dict[str, Any] = {}
    reads: dict[str, Any] = {}
    first_fired: dict[str, float] = {}
    straggler_fired: set[str] = set()
    timeline = (run.work / "timeline-job.jsonl").open("w", encoding="utf-8")

    def smi(poll_time: float) -> str:
        if run.dry:
            import multi_gpu_dry as dry

            return dry.nvidia_smi_nvlink(Path(fixture[1]), 1 + int(poll_time - daemon_start))
        return run.run(["nvidia-smi", "nvlink", "-gt", "d"], "nvidia-smi-nvlink-now.txt", 60)[1]

    def read(name: str) -> None:
        now = time.time()
        text = smi(now)
        metrics = run.metrics(target)
        (run.work / f"nvlink-{name}.nvidia-smi.txt").write_text(text, encoding="utf-8")
        (run.work / f"nvlink-{name}.prom").write_text(metrics, encoding="utf-8")
        reads[name] = {
            "at": now,
            "smi": rd.parse_nvlink_throughput(text),
            "daemon": rd.nvlink_from_metrics(metrics),
        }

    def watch(name: str, seconds: float) -> None:
        cmd = run.sd(
            "watch",
            "--pid",
            str(job.proc.pid),
            "--duration",
            f"{seconds:.0f}",
            "--json",
            "--interval",
            "0.5",
            "--record",
            str(run.work / f"watch-{name}.recording.json"),
            *seen[name],
        )
        watches[name] = run.start(cmd, f"watch-{name}.json", err=f"watch-{name}.stderr.txt")

    def check_hang() -> None:
        run.run(
            run.sd("check", "--quick", "--json", *run.machine(), *seen["hang"]),
            "check-hang.json",
            60,
        )

    plan = [
        (
            at["traffic"] + min(5.0, (at["straggler"] - at["traffic"]) / 3),
            "record",
            lambda: run.record(
                f"h200-x{run.n}-allreduce.json",
                f"{run.n} GPUs, {job.ranks} ranks in "
                "an NCCL all-reduce (scripts/device/multi_gpu.py step 3)",
                Path(fixture[1]) if fixture else None,
            ),
        ),
        (
            at["straggler"] + 2,
            "watch-straggler",
            lambda: watch("straggler", min(run.opts.watch, at["hang_lead"] - at["straggler"] - 4)),
        ),
        (leave + 1, "watch-hang", lambda: watch("hang", run.opts.watch)),
        (leave + 12, "after", lambda: read("after")),
        (leave + 15, "check-hang", check_hang),
    ]
    try:
        with PromSession(
            [target], run.rules(), run.work / "prom-job", binary=run.opts.prometheus
        ) as prom:
            time.sleep(3)  # the daemon's first NVLink read (its slow tier) is in
            read("before")
            reads["before"]["before_traffic"] = reads["before"]["at"] < at["traffic"]
            run.say(
                f"collective: counters read {at['traffic'] - reads['before']['at']:.1f} s "
                "before the traffic"
            )
            end = min(leave + run.opts.hang, time.time() + run.left() - 25)
            while time.time() < end:
                now = time.time()
                while plan and plan[0][0] <= now:
                    _, name, action = plan.pop(0)
                    run.say(f"collective: {name}")
                    action()
                states = run.firing(prom, STALLED)
                for gpu, state in states.items():
                    if state == "firing":
                        first_fired.setdefault(gpu, round(time.time() - leave, 1))
                        if time.time() < at["hang_lead"]:
                            straggler_fired.add(gpu)
                timeline.write(
                    json.dumps({"t": round(now - leave, 1), "stalled": states, **readings(prom)})
                    + "\n"
                )
                timeline.flush()
                done = not plan and all(p.poll() is not None for p in watches.values())
                # a dry run's fixture ends the stall at the planned end: no early end there
                stalled_all = all(first_fired.get(str(g)) is not None for g in job.waiting)
                if done and stalled_all and not run.dry:
                    break
                time.sleep(max(0.0, 2.0 - (time.time() - now)))
            run.stop(job.proc)
            run.stop(cotenant)
            killed = time.time()
            resolved = None
            while time.time() - killed < min(25.0, max(0.0, run.left())):
                if not [s for s in run.firing(prom, STALLED).values() if s == "firing"]:
                    resolved = round(time.time() - killed, 1)
                    break
                time.sleep(1)
            (run.work / "prom-job.json").write_text(json.dumps({"alerts": prom.alerts()}, indent=1))
    finally:
        timeline.close()
        for p in watches.values():
            if p.poll() is None:
                try:
                    p.wait(max(1.0, min(30.0, run.left())))
                except Exception:
                    run.stop(p)
        run.stop(proc)
        run.stop(cotenant)
    run.summary["stalled"] = {
        "first_firing_after_leave_s": first_fired,
        "firing_in_straggler_phase": sorted(straggler_fired),
        "resolved_after_kill_s": resolved,
        "not_run": [n for _, n, _ in plan],
    }
    run.summary["nvlink_reads"] = {k: {kk: vv for kk, vv in v.items()} for k, v in reads.items()}
    judge_observed(run, job, first_fired, straggler_fired, resolved, reads)


def readings(prom: PromSession) -> dict[str, dict[str, float]]:
    out = {}
    for key, expr in READINGS.items():
        out[key] = {
            r["metric"].get("gpu", "?"): round(float(r["value"][1]), 4)
            for r in prom.query(f"max by (gpu) ({expr})")
        }
    return out


def judge_observed(
    run: Run,
    job: Job,
    first_fired: dict[str, float],
    straggler_fired: set[str],
    resolved: float | None,
    reads: dict[str, Any],
) -> None:
    waiting = {str(g) for g in job.waiting}
    fired = set(first_fired)
    times = [first_fired[g] for g in sorted(waiting & fired, key=int)]
    run.row(
        "collective",
        f"{STALLED} (for: {run.opts.stalled_for}) after rank {job.stop_rank} left",
        f"firing on {sorted(fired, key=int) or 'none'} (waiting: {sorted(waiting, key=int)})"
        f"{f', {min(times):.0f}-{max(times):.0f} s after' if times else ''}; silent elsewhere: "
        f"{not (fired - waiting)}",
        fired == waiting,
    )
    run.row(
        "collective",
        f"{STALLED} in the straggler phase",
        f"firing on {sorted(straggler_fired) or 'none'}",
        not straggler_fired,
    )
    run.row(
        "collective",
        f"{STALLED} resolved after the job was killed",
        f"{resolved} s" if resolved is not None else "not within 25 s",
        resolved is not None,
    )
    doc = load(run.work / "check-hang.json")
    stall = rd.check_rows(doc, ["stall"])
    failing = {str(r["gpu"]) for r in stall if r["status"] == "fail"}
    run.summary["check_hang"] = stall
    run.row(
        "collective",
        "check --quick during the hang: stall rows",
        f"fail on {sorted(failing, key=int) or 'none'}",
        failing == waiting,
    )
    ranks = job.by_rank()
    for name, rank, what in (
        ("straggler", job.straggler, "the straggler"),
        ("hang", job.stop_rank, "the rank that left"),
    ):
        doc = load(run.work / f"watch-{name}.json")
        if not doc:
            run.row("collective", f"watch ({name})", "no JSON (watch-*.stderr.txt)", False)
            continue
        got = rd.watch_summary(doc, ranks, rank)
        run.summary[f"watch_{name}"] = got
        names = got["names_rank_pid"] or got["names_rank_word"]
        run.row(
            "collective",
            f"watch ({name}): names {what}, rank {rank}",
            f"{got['headline']}"[:120] + f"; rank named: {names}; collective named: "
            f"{got['names_collective']}",
            names and got["names_collective"],
        )
    nvlink(run, job, ranks, reads)


def nvlink(run: Run, job: Job, ranks: dict[int, dict[str, Any]], reads: dict[str, Any]) -> None:
    if "before" not in reads or "after" not in reads:
        run.row("nvlink", "daemon against nvidia-smi", f"reads taken: {sorted(reads)}", False)
        return
    payload = 0.0
    for me in ranks.values():
        t = me.get("traffic", {})
        payload = max(
            payload,
            t.get("ops", 0) * t.get("bytes_each", 0)
            + sum(
                me.get(p, {}).get("steps", 0) * me.get(p, {}).get("bytes_each", 0)
                for p in ("straggler", "hang_lead")
            ),
        )
    expected = payload * 2 * (job.ranks - 1) / job.ranks if payload else None
    b, a = reads["before"], reads["after"]
    rows = rd.compare_nvlink(b["smi"], a["smi"], b["daemon"], a["daemon"], expected)
    run.summary["nvlink"] = {
        "rows": rows,
        "payload_per_rank": payload,
        "expected_tx": expected,
        "before_was_before_traffic": b.get("before_traffic"),
    }
    in_job = [r for r in rows if int(r["gpu"]) < job.ranks]
    agree = sum(1 for r in rows if r["agree"])
    tx = [
        r["nvidia_smi_bytes"] / 1e9
        for r in in_job
        if r["direction"] == "tx" and r["nvidia_smi_bytes"]
    ]
    over = [r["over_expected"] for r in in_job if r["direction"] == "tx" and r["over_expected"]]
    run.row(
        "nvlink",
        "sparkdiag_gpu_nvlink_data_bytes_total against nvidia-smi nvlink -gt d",
        f"{agree} of {len(rows)} GPU-directions within 1 %; ranks' tx "
        f"{min(tx, default=0):.1f}-{max(tx, default=0):.1f} GB; "
        f"{min(over, default=0):.2f}-{max(over, default=0):.2f} of a ring's 2(N-1)/N payload",
        bool(rows) and agree == len(rows) and bool(b.get("before_traffic")),
    )


def judge_job(run: Run, job: Job, ranks: dict[int, dict[str, Any]]) -> None:
    up = [r for r in range(job.ranks) if "up" in ranks.get(r, {})]
    nccl = {ranks[r]["up"].get("nccl") for r in up}
    mismatch = []
    if not run.dry:
        for r in up:
            want = re.sub("^GPU-", "", str(run.gpus[r]["uuid"]))
            if want not in str(ranks[r]["up"].get("uuid")):
                mismatch.append(r)
    run.row(
        "collective",
        "job: ranks up, rank r on NVML's GPU r",
        f"{len(up)} of {job.ranks} up ({'gloo' if run.dry else f'NCCL {sorted(nccl)}'}); "
        f"uuid mismatch: {mismatch or 'none'}",
        len(up) == job.ranks and not mismatch,
    )
    phase = {r: ranks.get(r, {}).get("straggler", {}) for r in range(job.ranks)}
    s = phase.get(job.straggler, {})
    others = [p for r, p in phase.items() if r != job.straggler and p.get("compute_ms")]
    if s.get("compute_ms") and others:
        rest = sorted(p["compute_ms"] for p in others)[len(others) // 2]
        wait = sorted(p["wait_ms"] for p in others)[len(others) // 2]
        run.row(
            "collective",
            f"straggler phase (co-tenant on GPU {job.straggler})",
            f"rank {job.straggler} computes {s['compute_ms']:.0f} ms a step against "
            f"{rest:.0f}; the others wait {wait:.0f} ms in all_reduce, it {s['wait_ms']:.0f}",
            s["compute_ms"] > 1.3 * rest and wait > s["wait_ms"],
        )
    else:
        run.row("collective", "straggler phase", "no step figures from the ranks", False)
    left = ranks.get(job.stop_rank, {}).get("left")
    after = [r for r, me in ranks.items() if "step after leave" in me]
    run.row(
        "collective",
        f"rank {job.stop_rank} left the collective",
        f"{'yes' if left else 'no'}; ranks that got through a step after it: {after or 'none'}",
        bool(left) and not after,
    )


def load(path: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        return doc
    except (OSError, ValueError):
        return {}
