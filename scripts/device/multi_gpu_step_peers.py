"""Step 2 of scripts/device/multi_gpu.py: every GPU's rows and series, the node comparison on
real probes, and one GPU handicapped by a co-tenant.

check refuses to probe a GPU another process computes on (the worker checks before and during
its kernels, sparkdiag/probe/worker/cli.py), so beside the co-tenant check's ``idle`` row names
that GPU and its pid and ``peers`` compares the others; the daemon probes it anyway with
``--probe.when always``, so its delivered throughput, its node ratio and, in Prometheus,
SparkdiagGpuSlowerThanPeers (groups of 4 GPUs or more) show the handicap.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import multi_gpu_read as rd
from prom_session import PromSession

# the driver's Run (multi_gpu.py), which imports this module: named here, not imported
Run = Any

JOB_ALERT = "SparkdiagGpuSlowerThanPeers"


def peers(run: Run) -> None:
    k, n = run.opts.slow_gpu, run.n
    uuids = [str(g["uuid"]) for g in run.gpus]
    fixture: list[str] = []
    probe_even: list[str] = []
    probe_slow: list[str] = []
    if run.dry:
        import multi_gpu_dry as dry

        fixture = ["--nvml-fixture", str(run.fixture)]
        probe_even = [
            "--probe.fixture",
            str(dry.probe_fixture(run.work / "probe-even.json", uuids, None)),
        ]
        probe_slow = [
            "--probe.fixture",
            str(dry.probe_fixture(run.work / "probe-slow.json", uuids, k)),
        ]

    # a. check on the idle machine: every GPU probed at once, the node comparison
    doc = check(run, "check-idle.json", [*fixture, *probe_even])
    cover = rd.check_per_gpu(doc, n)
    run.summary["check_idle"] = {"coverage": cover, "rows": rd.check_rows(doc, ["peers", "idle"])}
    run.row(
        "peers",
        "check idle: rows per GPU",
        f"exit {cover['exit_code']}, "
        f"{len(cover['per_gpu_rows'])} per-GPU rows, not on every GPU: "
        f"{cover['not_on_every_gpu'] or 'none'}",
        not cover["not_on_every_gpu"],
    )
    (row,) = rd.check_rows(doc, ["peers"]) or [{"status": "absent", "finding": "", "data": None}]
    judged = sorted((row.get("data") or {}).get("gpus", {}))
    run.row(
        "peers",
        "check idle: peers row",
        f"{row['status']}: {row['finding']}"[:160],
        row["status"] in ("pass", "warn") and len(judged) == n,
    )

    # b. the co-tenant on GPU k
    until = time.time() + max(60.0, run.left())
    cotenant = run.cotenant(k, "cotenant-peers.log", until)
    pid = cotenant.pid
    ready = wait_cotenant(run, "cotenant-peers.log", pid, k)
    run.summary["cotenant_peers"] = {"pid": pid, "gpu": k, "seen_by_nvml": ready}
    try:
        busy = fixture
        if run.dry:
            import multi_gpu_dry as dry

            busy = [
                "--nvml-fixture",
                str(dry.busy_fixture(run.work / "busy.json", run.fixture, k, pid)),
            ]
        # c. check beside the co-tenant
        doc = check(run, "check-cotenant.json", [*busy, *probe_even])
        idle = [r for r in rd.check_rows(doc, ["idle"]) if str(r["gpu"]) == str(k)]
        peer_rows = rd.check_rows(doc, ["peers"])
        run.summary["check_cotenant"] = {"idle": idle, "peers": peer_rows}
        named = bool(idle) and idle[0]["status"] == "fail" and str(pid) in idle[0]["finding"]
        run.row(
            "peers",
            f"check beside the co-tenant: idle row of GPU {k}",
            f"{idle[0]['status']}: {idle[0]['finding']}"[:160] if idle else "no row",
            named,
        )
        slowest = [(r.get("data") or {}).get("slowest") for r in peer_rows]
        peer_seen = "; ".join(f"{r['status']}: {r['finding']}" for r in peer_rows)[:160]
        run.row(
            "peers",
            "check beside the co-tenant: peers row",
            peer_seen,
            str(k) not in map(str, slowest) and all(r["status"] != "fail" for r in peer_rows),
        )

        # d. the daemon probing every GPU once (GPU k beside the co-tenant), under Prometheus
        daemon(run, k, [*busy, *probe_slow])
    finally:
        run.stop(cotenant)


def check(run: Run, name: str, extra: list[str]) -> dict[str, Any]:
    rc, out = run.run(
        run.sd(
            "check",
            "--json",
            "--expect-gpus",
            str(run.n),
            "--state-dir",
            str(run.work / "state-check"),
            *run.machine(),
            *extra,
        ),
        name,
        180,
    )
    try:
        doc: dict[str, Any] = json.loads(out)
    except ValueError:
        return {"checks": [], "exit_code": rc}
    return doc


def wait_cotenant(run: Run, log: str, pid: int, gpu: int, seconds: float = 90.0) -> bool:
    """Until the co-tenant has allocated (its first line) and, on GPUs, NVML lists its pid."""
    end = time.monotonic() + min(seconds, run.left())
    path = run.work / log
    while time.monotonic() < end:
        if path.is_file() and '"ready"' in path.read_text(errors="replace"):
            if run.dry:
                return True
            _, out = run.run(
                ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                "compute-apps.txt",
                30,
            )
            uuid = str(run.gpus[gpu]["uuid"])
            if any(line.startswith(f"{pid},") and uuid in line for line in out.splitlines()):
                return True
        time.sleep(0.5)
    return False


def daemon(run: Run, k: int, extra: list[str]) -> None:
    n = run.n
    proc, target = run.serve(
        "peers",
        "--probe.when",
        "always",
        "--probe.first-delay",
        "0",
        "--probe.interval",
        "86400",
        "--no-probe.hot-enabled",
        *extra,
    )
    began = time.monotonic()
    timeline = (run.work / "timeline-peers.jsonl").open("w", encoding="utf-8")
    probed_at: float | None = None
    fired_at: float | None = None
    states: dict[str, str] = {}
    try:
        with PromSession(
            [target], run.rules(), run.work / "prom-peers", binary=run.opts.prometheus
        ) as prom:
            # one probe cycle, one GPU after another (~6-8 s each on the H200: torch's import,
            # the context, ~2 s of GPU), then the shortened for:
            end = time.monotonic() + min(run.left() - 5, 60 + 10 * n)
            while time.monotonic() < end:
                text = run.metrics(target)
                # a GPU is done once its cycle ended, however (a timeout beside the co-tenant
                # must not keep this waiting for a success that will not come)
                probed = {
                    lab["gpu"] for lab, v in rd.value(text, "sparkdiag_probe_runs_total") if v > 0
                }
                if probed_at is None and len(probed) >= n:
                    probed_at = time.monotonic() - began
                states = run.firing(prom, JOB_ALERT)
                if fired_at is None and states.get(str(k)) == "firing":
                    fired_at = time.monotonic() - began
                timeline.write(
                    json.dumps(
                        {
                            "t": round(time.monotonic() - began, 1),
                            "probed": sorted(probed, key=int),
                            "alert": states,
                        }
                    )
                    + "\n"
                )
                timeline.flush()
                # after the last cycle: a scrape, an evaluation, the for:, another evaluation;
                # twice that, and the alert not firing by then is an answer too
                settle = 2 * (seconds(run.opts.slower_for) + 3)
                late = probed_at is not None and time.monotonic() - began > probed_at + settle
                if probed_at is not None and (fired_at is not None or late):
                    time.sleep(3)  # one more evaluation: the other GPUs must stay silent
                    states = run.firing(prom, JOB_ALERT)
                    break
                time.sleep(2)
            text = run.metrics(target)
            (run.work / "metrics-peers.prom").write_text(text, encoding="utf-8")
            group = prom.query("sparkdiag:gemm_tflops:peer_group_gpus")
            ratios = prom.query("sparkdiag:gemm_tflops:peer_ratio")
            (run.work / "prom-peers.json").write_text(
                json.dumps(
                    {"alerts": prom.alerts(), "peer_group_gpus": group, "peer_ratio": ratios},
                    indent=1,
                )
            )
    finally:
        timeline.close()
        run.stop(proc)
    series = rd.series_per_gpu(text)
    run.summary["serve_series"] = series
    per_gpu = series["series"].values()
    run.row(
        "peers",
        "serve: series per GPU",
        f"{series['families']} families with a gpu label, series per GPU "
        f"{min(per_gpu, default=0)}-{max(per_gpu, default=0)}; "
        f"left out somewhere: {sorted(series['missing']) or 'none'}",
        len(series["gpus"]) == n and not series["missing"],
    )
    kernels: dict[str, list[float]] = {}
    for lab, v in rd.value(text, "sparkdiag_gemm_node_peer_ratio"):
        kernels.setdefault(lab["gpu"], []).append(v)
    node = {gpu: statistics.median(vs) for gpu, vs in kernels.items()}  # as check judges
    run.summary["serve_peers"] = {
        "probed_after_s": probed_at,
        "fired_after_s": fired_at,
        "alert_states": states,
        "node_ratio_median": node,
    }
    low = sorted(g for g, v in node.items() if v <= 0.93)
    run.row(
        "peers",
        f"serve: node peer ratio (median of kernels), GPU {k} handicapped",
        f"GPU {k} {node.get(str(k), float('nan')):.2f}; at or below 0.93: {low or 'none'}",
        low == [str(k)],
    )
    others = sorted(g for g, s in states.items() if g != str(k))
    if n >= 4:
        after = ""
        if fired_at is not None and probed_at is not None:
            after = f" {fired_at - probed_at:.0f} s after the last probe"
        seen = f"GPU {k} {states.get(str(k), 'silent')}{after}; others: {others or 'silent'}"
        run.row(
            "peers",
            f"{JOB_ALERT} (for: {run.opts.slower_for})",
            seen,
            states.get(str(k)) == "firing" and not others,
        )
    else:
        run.row(
            "peers",
            f"{JOB_ALERT} (for: {run.opts.slower_for})",
            f"{n} GPUs: under its group of 4, silent as it must be: {states or 'silent'}",
            not states,
        )


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit) and duration[: -len(unit)].replace(".", "", 1).isdigit():
            return float(duration[: -len(unit)]) * units[unit]
    raise ValueError(f"not a duration: {duration!r}")
