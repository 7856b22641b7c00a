"""The GPU side of a watch tick on scripted NVML fixtures: the other processes on the job's GPU
(with their per-process utilization and who they are), the job's own share, and PCIe traffic
from NVML's byte counters as a rate per tick, falling back to the 20 ms window."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from sparkdiag.sources.backends import make_backend
from sparkdiag.sources.gpu import GpuSource
from sparkdiag.sources.procfs import ProcessIdentities
from sparkdiag.watch.model import OtherProcess
from sparkdiag.watch.sampler import GpuSampler
from tests.support import NVML

JOB = 547  # the recorded job's pid in h200-load.json


def fixture(tmp_path: Path, other: int, script: list[dict[str, Any]] | None = None) -> Path:
    shutil.copy(NVML / "h200-load.json", tmp_path)
    util = {"memory": 20.0, "encoder": 0.0, "decoder": 0.0}
    doc = {
        "format": "sparkdiag-nvml-fixture/1",
        "description": "the H200 load recording with a second compute process beside the job",
        "base": "h200-load.json",
        "devices": [{
            "from": 0,
            "set": {
                "compute_processes": [{"pid": JOB, "used_memory": 7_600_000_000},
                                      {"pid": other, "used_memory": 12_000_000_000}],
                "process_utilization": [{"pid": JOB, "sm": 46.0, **util},
                                        {"pid": other, "sm": 53.0, **util}],
            },
            "why": {"compute_processes": "a co-tenant, made up",
                    "process_utilization": "time-sliced about evenly, made up"},
        }],
        "script": script or [],
    }  # fmt: skip
    path = tmp_path / "cotenant.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def sampler(path: Path, now: list[float]) -> GpuSampler:
    source = GpuSource(make_backend(path), slow_seconds=2.0)
    assert source.start()
    return GpuSampler(source, describe=ProcessIdentities(Path("/")), clock=lambda: now[0])


def test_another_process_on_the_job_s_gpu_is_named_with_its_share(tmp_path: Path) -> None:
    other = os.getpid()  # a real process, so that /proc names it
    now = [0.0]
    gpu = sampler(fixture(tmp_path, other), now)
    (tick,) = gpu.sample(0.0, {JOB})
    assert tick.job_on_gpu and tick.job_sm == 0.46
    assert tick.others == (OtherProcess(other, 0.53, 12e9),)
    who = gpu.tenants[other]
    assert who.user == "root" and who.name  # ps -o comm=,user=
    # the same GPU where NVML lists none of the job's processes: nobody is called a co-tenant
    (alone,) = sampler(fixture(tmp_path, other), now).sample(0.0, {999_999})
    assert not alone.job_on_gpu and alone.others == () and alone.job_sm is None


def test_pcie_traffic_from_the_byte_counters_is_a_rate_per_tick(tmp_path: Path) -> None:
    counters = {"pcie_bytes/0": [0, 10_000_000_000], "pcie_bytes/1": [0, 20_000_000_000]}
    ramp = {"poll": [1, 11], "gpu": 0, "ramp": counters}
    now = [0.0]
    gpu = sampler(fixture(tmp_path, os.getpid(), [ramp]), now)
    rates = []
    for _ in range(4):
        now[0] += 1.0
        (tick,) = gpu.sample(0.0, {JOB})
        rates.append((tick.pcie_tx, tick.pcie_rx))
    # the first tick has no counter before it: the 20 ms window (KiB/s, recorded) instead
    assert rates[0] == (7273 * 1024.0, 15947 * 1024.0)
    assert rates[1:] == [(1e9, 2e9)] * 3  # device to host, host to device: bytes per second


def test_without_byte_counters_the_window_is_read(tmp_path: Path) -> None:
    now = [0.0]
    gpu = sampler(fixture(tmp_path, os.getpid()), now)
    for _ in range(3):
        now[0] += 1.0
        (tick,) = gpu.sample(0.0, {JOB})
        assert (tick.pcie_tx, tick.pcie_rx) == (7273 * 1024.0, 15947 * 1024.0)
