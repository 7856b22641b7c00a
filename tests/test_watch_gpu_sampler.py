"""The GPU side of a watch tick on scripted NVML fixtures: the other processes on the job's GPU
(with their per-process utilization and who they are), the job's own share, and PCIe traffic
from GPM's rates per tick, falling back to the 20 ms window."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from sparkdiag.sources.host.procfs import ProcessIdentities
from sparkdiag.sources.nvml.backends import make_backend
from sparkdiag.sources.nvml.gpu import GpuSource
from sparkdiag.watch.model import OtherProcess
from sparkdiag.watch.sampler import GpuSampler
from tests.support import NVML

JOB = 547  # the recorded job's pid in h200-load.json
NOWHERE = 4_194_304  # above Linux's PID_MAX_LIMIT: a pid no process here has (another namespace)


def fixture(
    tmp_path: Path, other: int, script: list[dict[str, Any]] | None = None, job: int = JOB
) -> Path:
    shutil.copy(NVML / "h200-load.json", tmp_path)
    util = {"memory": 20.0, "encoder": 0.0, "decoder": 0.0}
    doc = {
        "format": "sparkdiag-nvml-fixture/1",
        "description": "the H200 load recording with a second compute process beside the job",
        "base": "h200-load.json",
        "devices": [{
            "from": 0,
            "set": {
                "compute_processes": [{"pid": job, "used_memory": 7_600_000_000},
                                      {"pid": other, "used_memory": 12_000_000_000}],
                "process_utilization": [{"pid": job, "sm": 46.0, **util},
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


def sampler(path: Path, now: list[float], rootfs: Path | None = None) -> GpuSampler:
    source = GpuSource(make_backend(path), slow_seconds=2.0)
    assert source.start()
    return GpuSampler(
        source, describe=ProcessIdentities(Path("/")), clock=lambda: now[0], rootfs=rootfs
    )


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


def test_processes_outside_the_job_are_counted_where_the_job_is_not_on_the_gpu(
    tmp_path: Path,
) -> None:
    """Where NVML lists none of the job's processes the GPU's other processes are still counted:
    those this PID namespace shows (pid kept, named in ``tenants``) apart from those it does
    not (a pid of another namespace: maybe the job's, in a container)."""
    other = os.getpid()
    now = [0.0]
    gpu = sampler(fixture(tmp_path, other, job=NOWHERE), now, rootfs=Path("/"))
    (tick,) = gpu.sample(0.0, {999_999})
    assert not tick.job_on_gpu and tick.others == ()
    assert (tick.others_seen, tick.others_seen_pids, tick.others_unseen) == (1, (other,), 1)
    assert gpu.tenants[other].name  # who it is, for the report
    # a process of another PID namespace than the job's (a container the job started, say) is
    # not counted as shown: /proc/PID/ns/pid differs from the job's
    fake = tmp_path / "root"
    for pid, ns in ((other, "pid:[1]"), (4242, "pid:[2]")):
        (fake / "proc" / str(pid) / "ns").mkdir(parents=True)
        (fake / "proc" / str(pid) / "ns" / "pid").symlink_to(ns)
    apart = sampler(fixture(tmp_path, other, job=NOWHERE), now, rootfs=fake)
    (tick,) = apart.sample(0.0, {4242})
    assert (tick.others_seen, tick.others_seen_pids, tick.others_unseen) == (0, (), 2)
    assert other not in apart.tenants
    # a kernel thread here (kthreadd, pid 2) holds no GPU: NVML's pid is another namespace's
    if Path("/proc/2/comm").is_file() and Path("/proc/2/comm").read_text() != "kthreadd\n":
        return  # a PID namespace of its own, whose pid 2 is no kernel thread
    kthread = sampler(fixture(tmp_path, 2, job=NOWHERE), now, rootfs=Path("/"))
    (tick,) = kthread.sample(0.0, {999_999})
    assert (tick.others_seen, tick.others_unseen) == (0, 2)


def test_pcie_traffic_from_gpm_is_a_rate_per_tick(tmp_path: Path) -> None:
    """GPM's PCIe rates (MiB/s; the H200 read rx 3142 under a pageable copy loop) give each
    tick's traffic, and no 20 ms window is read."""
    rates = {"sm": 0.0, "sm_occupancy": 0.0, "tensor": 0.0, "dram": 0.1, "pcie_tx": 190.5,
             "pcie_rx": 3142.0}  # fmt: skip
    step = {"poll": [1, 11], "gpu": 0, "set": {"gpm": rates}}
    now = [0.0]
    gpu = sampler(fixture(tmp_path, os.getpid(), [step]), now)
    for _ in range(3):
        now[0] += 1.0
        (tick,) = gpu.sample(0.0, {JOB})
        assert (tick.pcie_tx, tick.pcie_rx) == (190.5 * 1024 * 1024, 3142.0 * 1024 * 1024)


def test_without_gpm_rates_the_window_is_read(tmp_path: Path) -> None:
    now = [0.0]
    gpu = sampler(fixture(tmp_path, os.getpid()), now)
    for _ in range(3):
        now[0] += 1.0
        (tick,) = gpu.sample(0.0, {JOB})
        assert (tick.pcie_tx, tick.pcie_rx) == (7273 * 1024.0, 15947 * 1024.0)
