"""The dry run of scripts/device/multi_gpu.py: NVML fixtures and probe documents that stand for
what the GPUs would answer, so that every step's plumbing runs on a machine without a GPU.

- the probe of every GPU replays the H200 document (tests/fixtures/probe/h200-default.json),
  each GPU's copy naming its uuid; the handicapped GPU's figures at ``SLOW`` of it (beside a
  bf16 matmul loop the H200 delivered 0.40-0.71 of idle: docs/device, 2026-12-01);
- the GPU with the co-tenant answers NVML as h200-load's GPU did, the stand-in's pid its
  compute process (check then finds it busy, as it would the real one);
- during the job, the ranks' GPUs get 18 NVLinks whose data counters climb through the traffic
  phase (``nvidia-smi`` is rendered from the same answers), and from the stop rank's leaving on,
  the waiting ranks' GPUs answer as h200-stalled (the spinning kernel recorded on the H200).

Every answer changed says so in its ``why``. None of this is evidence about a GPU: it checks
the script, not sparkdiag.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

from multi_gpu_read import render_nvlink_throughput

from sparkdiag.sources.nvml.api import NvmlCallError
from sparkdiag.sources.nvml.fixture import FORMAT, FixtureBackend, load_fixture

ROOT = Path(__file__).resolve().parents[2]
NVML = ROOT / "tests" / "fixtures" / "nvml"
PROBE = ROOT / "tests" / "fixtures" / "probe" / "h200-default.json"
SLOW = 0.5
LINKS = 18
KEYS_BUSY = (
    "utilization",
    "gpm",
    "power_mw",
    "pstate",
    "clock/0",
    "clock/1",
    "clock_event_reasons",
    "utilization_samples",
)
KEYS_STALLED = (*KEYS_BUSY, "compute_processes", "process_utilization")
WHY = "dry run of scripts/device/multi_gpu.py"


def gpus(fixture: Path) -> list[dict[str, Any]]:
    """The fixture's GPUs: index, uuid, bus id, name."""
    doc = load_fixture(fixture)
    return [
        {
            "index": i,
            "uuid": d["answers"].get("uuid"),
            "pci_bus_id": d["answers"].get("pci_bus_id"),
            "name": d["answers"].get("name"),
        }
        for i, d in enumerate(doc["devices"])
    ]


def _device(name: str) -> dict[str, Any]:
    answers: dict[str, Any] = load_fixture(NVML / f"{name}.json")["devices"][0]["answers"]
    return answers


def probe_fixture(dest: Path, uuids: list[str], slow: int | None) -> Path:
    """One probe cycle per GPU (its uuid), GPU ``slow`` at ``SLOW`` of the others."""
    doc = json.loads(PROBE.read_text(encoding="utf-8"))
    cycles = []
    for index, uuid in enumerate(uuids):
        factor = SLOW if index == slow else 1.0 + 0.004 * ((index % 3) - 1)
        cycle = copy.deepcopy(doc)
        cycle["software"]["gpu_uuid"] = uuid
        for r in cycle["results"]:
            if r["status"] == "ok":
                for key in ("delivered", "peak"):
                    if r.get(key) is not None:
                        r[key] *= factor
                for key in ("median_ms", "min_ms", "total_ms"):
                    if r.get(key) is not None:
                        r[key] /= factor
        cycles.append(cycle)
    dest.write_text(json.dumps({"format": "sparkdiag-probe-fixture/1", "cycles": cycles}))
    return dest


def busy_fixture(dest: Path, base: Path, gpu: int, pid: int) -> Path:
    """``base`` with GPU ``gpu`` running the co-tenant ``pid`` (h200-load's answers)."""
    load = _device("h200-load")
    count = len(load_fixture(base)["devices"])
    devices: list[dict[str, Any]] = [{"from": i} for i in range(count)]
    busy = {k: load[k] for k in KEYS_BUSY if k in load}
    busy["compute_processes"] = [{"pid": pid, "used_memory": 1050673152}]
    busy["process_utilization"] = [
        {"pid": pid, "sm": 99.0, "memory": 24.0, "encoder": 0.0, "decoder": 0.0}
    ]
    devices[gpu] = {
        "from": gpu,
        "set": busy,
        "why": {k: f"{WHY}: the co-tenant (pid {pid}), as h200-load" for k in busy},
    }
    return _write(dest, base, f"{WHY}: GPU {gpu} runs a co-tenant", devices)


def job_fixture(
    dest: Path,
    base: Path,
    schedule: dict[str, Any],
    daemon_start: float,
    ranks: int,
    stop_rank: int,
    killed: float,
    poll_seconds: float = 1.0,
) -> Path:
    """``base`` through the job: NVLink on every GPU, data counters climbing on the ranks' GPUs
    from the traffic phase to the leaving (a poll is ``poll_seconds`` after the daemon's start),
    the waiting ranks' GPUs stalled from the poll after the leaving until ``killed``."""
    base_devices = load_fixture(base)["devices"]
    count = len(base_devices)
    at = schedule["at"]

    def poll(when: float) -> int:
        return max(1, 1 + math.ceil((when - daemon_start) / poll_seconds))

    links: dict[str, Any] = {}
    for link in range(LINKS):
        links |= {
            f"nvlink_state/{link}": 1,
            f"nvlink_tx_kib/{link}": 1_000_000,
            f"nvlink_rx_kib/{link}": 1_000_000,
        }
        for kind in ("replay", "recovery", "crc_flit", "crc_data"):
            links[f"nvlink_{kind}_errors/{link}"] = 0
    devices = [
        {"from": i, "set": dict(links), "why": {"nvlink_*": f"{WHY}: 18 NVLinks"}}
        for i in range(count)
    ]
    stalled = _device("h200-stalled")
    script: list[dict[str, Any]] = []
    first, last = poll(at["traffic"]), poll(at["leave"])
    for gpu in range(min(ranks, count)):
        ramp = {
            f"nvlink_{d}_kib/{link}": [1_000_000, 1_000_000 + 4_000_000 * (gpu + 1)]
            for link in range(LINKS)
            for d in ("tx", "rx")
        }
        script.append(
            {
                "poll": [first, max(first, last - 1)],
                "gpu": gpu,
                "ramp": ramp,
                "why": f"{WHY}: the all-reduce's NVLink traffic",
            }
        )
        if gpu != stop_rank:
            keys = {k: stalled[k] for k in KEYS_STALLED if k in stalled}
            script.append(
                {
                    "poll": last + 1,
                    "gpu": gpu,
                    "set": keys,
                    "why": f"{WHY}: waits for rank {stop_rank}, as h200-stalled",
                }
            )
            idle = {
                k: base_devices[gpu]["answers"].get(k, {"error": "NOT_SUPPORTED"}) for k in keys
            }
            script.append(
                {
                    "poll": poll(killed),
                    "gpu": gpu,
                    "set": idle,
                    "why": f"{WHY}: the job killed, idle again",
                }
            )
    return _write(dest, base, f"{WHY}: the all-reduce job", devices, script)


def ranks_fixture(
    dest: Path, base: Path, pids: dict[int, int], stalled: list[int], idle: list[int]
) -> Path:
    """``base`` with rank r's pid on GPU r: computing (h200-load's answers), or waiting
    (``stalled``: h200-stalled's), or neither (``idle``: the rank that left keeps its context on
    an idle GPU): what ``watch`` and ``check --quick`` read in a dry run."""
    load, hung = _device("h200-load"), _device("h200-stalled")
    count = len(load_fixture(base)["devices"])
    devices: list[dict[str, Any]] = []
    for i in range(count):
        if i not in pids:
            devices.append({"from": i})
            continue
        model, as_ = (hung, "h200-stalled") if i in stalled else (load, "h200-load")
        keys = {} if i in idle else {k: model[k] for k in KEYS_BUSY if k in model}
        keys["compute_processes"] = [{"pid": pids[i], "used_memory": 2 << 30}]
        keys["process_utilization"] = [
            {
                "pid": pids[i],
                "sm": 0.0 if i in stalled + idle else 99.0,
                "memory": 0.0,
                "encoder": 0.0,
                "decoder": 0.0,
            }
        ]
        why = f"{WHY}: rank {i} (pid {pids[i]}), {'idle' if i in idle else 'as ' + as_}"
        devices.append({"from": i, "set": keys, "why": {k: why for k in keys}})
    return _write(dest, base, f"{WHY}: the ranks on their GPUs, {stalled} waiting", devices)


def nvidia_smi_nvlink(fixture: Path, poll: int) -> str:
    """What ``nvidia-smi nvlink -gt d`` would print at ``poll`` of the fixture."""
    backend = FixtureBackend(fixture)
    backend.init()
    while backend.poll < poll:
        backend.advance()
    per_gpu: dict[int, dict[int, tuple[int, int]]] = {}
    for index in range(backend.device_count()):
        for link in range(LINKS):
            try:
                tx = int(backend.query(index, "nvlink_tx_kib", link))
                rx = int(backend.query(index, "nvlink_rx_kib", link))
            except NvmlCallError:
                continue
            per_gpu.setdefault(index, {})[link] = (tx, rx)
    return render_nvlink_throughput(per_gpu)


def _write(
    dest: Path,
    base: Path,
    description: str,
    devices: list[dict[str, Any]],
    script: list[dict[str, Any]] | None = None,
) -> Path:
    doc: dict[str, Any] = {
        "format": FORMAT,
        "description": description,
        "base": str(base.resolve()),
        "devices": devices,
    }
    if script:
        doc["script"] = script
    dest.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    load_fixture(dest)  # fails here, not in the daemon, when a key is wrong
    return dest
