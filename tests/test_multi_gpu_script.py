"""scripts/device/multi_gpu.sh (issue 33, for a multi-GPU H200 machine) as far as a machine
without a GPU takes it: its readers (nvidia-smi's NVLink counters, the daemon's scrape, the PCI
functions as a fake sysfs tree), the dry run's fixtures (they replay the job's phases at the
right polls), and (slow: a real Prometheus, CPU torch ranks over gloo) the whole dry run on the
8-GPU fixture and the peers step on the two-GPU one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sparkdiag.sources.host.sysfs import PcieSource
from sparkdiag.sources.nvml.fixture import FixtureBackend
from sparkdiag.sources.nvml.gpu import GpuSource
from sparkdiag.telemetry.stall import stall_signature
from tests.support import NVML, ROOT

sys.path.insert(0, str(ROOT / "scripts" / "device"))
import multi_gpu_dry as dry
import multi_gpu_job as job
import multi_gpu_read as rd

X8 = NVML / "h200-x8.json"

SMI = """GPU 0: NVIDIA H200 (UUID: GPU-aaaa)
\t Link 0: Data Tx: 1000 KiB
\t Link 0: Data Rx: 2000 KiB
\t Link 1: Data Tx: 10 KiB
\t Link 1: Data Rx: 20 KiB
GPU 1: NVIDIA H200 (UUID: GPU-bbbb)
\t Link 0: Data Tx: N/A
\t Link 0: Data Rx: N/A
"""


def test_nvidia_smi_counters_are_summed_per_gpu_in_bytes() -> None:
    assert rd.parse_nvlink_throughput(SMI) == {
        "0": {"tx": 1010 * 1024, "rx": 2020 * 1024, "links": 2}
    }
    rendered = rd.render_nvlink_throughput({3: {0: (5, 6), 17: (7, 8)}})
    assert rd.parse_nvlink_throughput(rendered) == {
        "3": {"tx": 12 * 1024, "rx": 14 * 1024, "links": 2}
    }


def _scrape(tx: float, rx: float, gpus: int = 2) -> str:
    lines = ["# TYPE sparkdiag_gpu_nvlink_data_bytes_total counter"]
    for gpu in range(gpus):
        for link in range(2):
            for direction, value in (("tx", tx), ("rx", rx)):
                lines.append(
                    f'sparkdiag_gpu_nvlink_data_bytes_total{{gpu="{gpu}",uuid="u{gpu}",'
                    f'link="{link}",direction="{direction}"}} {value * (gpu + 1)}'
                )
    return "\n".join(lines) + "\n"


def test_the_daemon_is_held_to_nvidia_smi_within_one_percent() -> None:
    before = rd.nvlink_from_metrics(_scrape(100.0, 100.0))
    after = rd.nvlink_from_metrics(_scrape(100.0 + 5e9, 100.0))
    assert before["1"]["links"] == 2 and after["1"]["tx"] == 2 * 2 * (100.0 + 5e9)
    smi_b = {"0": {"tx": 200.0, "rx": 200.0}, "1": {"tx": 400.0, "rx": 400.0}}
    smi_a = {
        "0": {"tx": 200.0 + 2 * 5e9 * 1.005, "rx": 200.0},
        "1": {"tx": 400.0 + 4e10, "rx": 400.0},
    }
    rows = {
        (r["gpu"], r["direction"]): r for r in rd.compare_nvlink(smi_b, smi_a, before, after, 1e10)
    }
    assert rows[("0", "tx")]["agree"]  # 0.5 % apart
    assert rows[("0", "tx")]["over_expected"] == pytest.approx(1.005)
    assert not rows[("1", "tx")]["agree"]  # nvidia-smi counted twice what the daemon did
    assert rows[("0", "rx")]["agree"] and rows[("0", "rx")]["daemon_bytes"] == 0  # nothing moved


def test_a_family_that_leaves_a_gpu_out_is_named() -> None:
    text = (
        'sparkdiag_gpu_up{gpu="0",uuid="a"} 1\nsparkdiag_gpu_up{gpu="1",uuid="b"} 1\n'
        'sparkdiag_gpu_power_watts{gpu="0",uuid="a"} 80\n'
        'sparkdiag_gpu_process_memory_bytes{gpu="1",uuid="b",pid="7"} 5\n'
        "sparkdiag_nvml_up 1\n"
    )
    found = rd.series_per_gpu(text)
    assert found["gpus"] == ["0", "1"]
    assert found["missing"] == {"sparkdiag_gpu_power_watts": ["1"]}  # per-process: not judged
    assert found["series"] == {"0": 2, "1": 2}


def test_watch_names_a_rank_only_in_what_it_concludes() -> None:
    ranks = {0: {"pid": 4100}, 1: {"pid": 4101}, 2: {"pid": 4102}}
    said = {
        "headline": "waiting in a collective (80 % of the time lost)",
        "causes": [{"name": "collective-wait", "share": 0.8,
                    "evidence": ["ranks 0 and 1 wait in all_reduce for pid 4102"]}],
        "gpus": [{"index": 0, "pids": [4100, 4101]}],
    }  # fmt: skip
    got = rd.watch_summary(said, ranks, 2)
    assert got["names_rank_pid"] and got["names_collective"]
    assert got["ranks_named_by_pid"] == [2]
    assert not rd.watch_summary(said, ranks, 0)["names_rank_pid"]  # 4100 only in "gpus"


def test_check_rows_that_miss_a_gpu_are_named() -> None:
    doc = {
        "exit_code": 3,
        "checks": [
            {"name": "idle", "status": "pass", "gpu": 0, "finding": ""},
            {"name": "idle", "status": "fail", "gpu": 1, "finding": "pid 9"},
            {"name": "probe", "status": "pass", "gpu": 0, "finding": ""},
            {"name": "nvml", "status": "pass", "gpu": None, "finding": ""},
        ],
    }
    got = rd.check_per_gpu(doc, 2)
    assert got["not_on_every_gpu"] == {"probe": ["1"]}
    assert got["statuses"] == {"pass": 3, "fail": 1} and got["exit_code"] == 3


def test_the_pci_capture_is_a_tree_sparkdiag_reads_as_the_original(tmp_path: Path) -> None:
    original = ROOT / "tests" / "fixtures" / "sysfs" / "h200-x8"
    rows = rd.capture_pci(original, tmp_path)
    assert len(rows) == 9 and sum(r["driver"] == "nvidia" for r in rows) == 8
    copy, source = PcieSource(tmp_path), PcieSource(original)
    assert copy.read() == source.read()
    assert copy.gpu_functions() == source.gpu_functions() and len(copy.gpu_functions()) == 8
    table = rd.pci_table(rows).splitlines()
    assert table[0].startswith("address\tvendor") and len(table) == 10


def _gpus(path: Path, polls: int) -> list[Any]:
    source = GpuSource(FixtureBackend(path))
    assert source.start()
    for _ in range(polls):
        source.backend.advance()
    return list(source.read())


def test_the_job_fixture_replays_traffic_then_the_stall_then_idle(tmp_path: Path) -> None:
    start = 1000.0  # the daemon's start; a poll a second from there
    at = {"lead": 1001.0, "traffic": 1005.0, "straggler": 1010.0, "hang_lead": 1015.0,
          "leave": 1017.0}  # fmt: skip
    path = dry.job_fixture(tmp_path / "job.json", X8, {"at": at}, start, 3, 2, killed=1030.0)
    before = dry.nvidia_smi_nvlink(path, 3)
    after = dry.nvidia_smi_nvlink(path, 25)
    b, a = rd.parse_nvlink_throughput(before), rd.parse_nvlink_throughput(after)
    assert set(a) == {str(i) for i in range(8)} and a["0"]["links"] == 18
    assert a["0"]["tx"] > b["0"]["tx"] and a["2"]["tx"] > a["1"]["tx"] > a["0"]["tx"]
    assert a["5"]["tx"] == b["5"]["tx"]  # not a rank
    hung = [stall_signature(g) is not None for g in _gpus(path, 20)]
    assert hung == [True, True, False, False, False, False, False, False]  # rank 2 left
    assert not any(stall_signature(g) for g in _gpus(path, 33))  # killed: idle again
    assert not any(stall_signature(g) for g in _gpus(path, 10))  # traffic: not a stall


def test_the_dry_co_tenant_and_probes_stand_for_one_slow_gpu(tmp_path: Path) -> None:
    gpus = dry.gpus(X8)
    path = dry.busy_fixture(tmp_path / "busy.json", X8, 1, 4242)
    samples = _gpus(path, 1)
    assert [s.compute_pids for s in samples][:3] == [(), (4242,), ()]
    doc = json.loads(
        dry.probe_fixture(tmp_path / "p.json", [g["uuid"] for g in gpus], 1).read_text()
    )
    bf16 = [
        next(r["delivered"] for r in c["results"] if r["dtype"] == "bf16") for c in doc["cycles"]
    ]
    assert bf16[1] == pytest.approx(dry.SLOW * bf16[0] / 0.996)
    ranks = dry.ranks_fixture(tmp_path / "r.json", X8, {0: 10, 1: 11, 2: 12}, [0, 1], [2])
    hung = [stall_signature(g) is not None for g in _gpus(ranks, 1)]
    assert hung[:3] == [True, True, False]


def test_every_process_of_the_job_needs_multicast_off() -> None:
    with pytest.raises(SystemExit, match="NCCL_NVLS_ENABLE"):
        job.require_no_multicast({"NCCL_NVLS_ENABLE": "1"})
    job.require_no_multicast(dict(job.NO_MULTICAST))
    assert job.parse_plan("traffic=3")["traffic"] == 3.0
    with pytest.raises(SystemExit, match="unknown phase"):
        job.parse_plan("nap=3")


def _summary(archive: Path) -> tuple[set[str], dict[str, Any]]:
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        summary = json.load(tar.extractfile("multigpu/summary.json"))  # type: ignore[arg-type]
    return names, summary


def _rows(summary: dict[str, Any]) -> dict[str, Any]:
    return {row["what"]: row for row in summary["rows"]}


needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="needs the prometheus binary"
)


@needs_prometheus
@pytest.mark.prometheus
def test_the_dry_run_on_eight_gpus(tmp_path: Path) -> None:
    """The whole script (multi_gpu.sh --dry): ~100 s, three CPU ranks over gloo."""
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON=sys.executable)
    done = subprocess.run(
        ["bash", "scripts/device/multi_gpu.sh", "--dry", "--budget", "300",
         "--plan", "lead=14,traffic=6,straggler=14,hang_lead=3", "--hang", "28",
         "--watch", "10", "--stalled-for", "10s"],
        capture_output=True, text=True, timeout=420, cwd=ROOT, env=env,
    )  # fmt: skip
    assert "multi_gpu (dry): 8 x NVIDIA H200" in done.stdout, done.stdout + done.stderr
    names, summary = _summary(tmp_path / "out" / "multigpu.tgz")
    for name in ("summary.txt", "fixtures/h200-x8-idle.json", "fixtures/h200-x8-allreduce.json",
                 "pci.tsv", "check-idle.json", "check-cotenant.json", "metrics-peers.prom",
                 "rules-shortened.yml", "job/events-rank0.jsonl", "watch-hang.json",
                 "watch-straggler.json", "nvlink-before.prom", "nvlink-after.nvidia-smi.txt",
                 "check-hang.json", "timeline-job.jsonl"):  # fmt: skip
        assert f"multigpu/{name}" in names, name
    assert not any("/data/" in n for n in names)  # no Prometheus TSDB in the archive
    rows = _rows(summary)
    expected = [
        "check idle: peers row",
        "check beside the co-tenant: idle row of GPU 1",
        "serve: series per GPU",
        "serve: node peer ratio (median of kernels), GPU 1 handicapped",
        "SparkdiagGpuSlowerThanPeers (for: 10s)",
        "SparkdiagGpuStalled (for: 10s) after rank 2 left",
        "SparkdiagGpuStalled in the straggler phase",
        "check --quick during the hang: stall rows",
        "sparkdiag_gpu_nvlink_data_bytes_total against nvidia-smi nvlink -gt d",
        "job: ranks up, rank r on NVML's GPU r",
        "straggler phase (co-tenant on GPU 1)",
        "rank 2 left the collective",
    ]
    assert {w: rows[w]["ok"] for w in expected} == dict.fromkeys(expected, True), summary["rows"]
    # watch's verdicts are recorded whatever they are (naming ranks is watch's work, not this)
    assert {"watch (hang): names the rank that left, rank 2", "watch (straggler): names the "
            "straggler, rank 1"} <= set(rows)  # fmt: skip
    assert summary["watch_hang"]["stack_sampler"]  # py-spy read the ranks
    assert summary["stalled"]["first_firing_after_leave_s"].keys() == {"0", "1"}


@needs_prometheus
@pytest.mark.prometheus
def test_two_gpus_are_below_the_alerts_group_of_four(tmp_path: Path) -> None:
    """The peers step on two H200s (~35 s): SlowerThanPeers stays silent (it judges groups of
    4), the daemon's node ratio names the handicapped GPU, check's peers row has no one left to
    compare beside the co-tenant."""
    two = tmp_path / "h200-x2-idle.json"  # the first two GPUs of the 8-GPU fixture, idle
    two.write_text(json.dumps({"format": "sparkdiag-nvml-fixture/1", "base": str(X8),
                               "devices": [{"from": 0}, {"from": 1}]}))  # fmt: skip
    done = subprocess.run(
        [sys.executable, "scripts/device/multi_gpu.py", "--dry", "--steps", "peers",
         "--fixture", str(two), "--budget", "200",
         "--out", str(tmp_path / "out"), "--work", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    _, summary = _summary(tmp_path / "out" / "multigpu.tgz")
    rows = _rows(summary)
    assert rows["SparkdiagGpuSlowerThanPeers (for: 10s)"]["ok"] is True
    assert "under its group of 4" in rows["SparkdiagGpuSlowerThanPeers (for: 10s)"]["seen"]
    assert rows["serve: node peer ratio (median of kernels), GPU 1 handicapped"]["ok"] is True
    assert "one GPU probed" in rows["check beside the co-tenant: peers row"]["seen"]
