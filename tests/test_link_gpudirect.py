"""The two-machine lint's GPUDirect RDMA and interface rules (link/gpudirect.py,
link/interfaces.py) on the GB10 fixtures (sysfs/dgx-spark-lan, rootfs/dgx-spark-gdr) and on
readings built for an H200, and their rows in check's cx7-config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from sparkdiag.check.network_checks import check_cx7_config
from sparkdiag.link.gpudirect import forces, impossible, state
from sparkdiag.link.lint import lint
from sparkdiag.link.readings import FabricReadings, read_fabric
from sparkdiag.sources.host import gpudirect as sources
from sparkdiag.sources.host.gpudirect import GpuDirect
from sparkdiag.sources.software.nccl import NcclSetting
from tests.support import ROOT, ROOTFS, SYSFS
from tests.support.check import NVML, context, poll

LAN = SYSFS / "dgx-spark-lan"
GDR = ROOTFS / "dgx-spark-gdr"
H200 = GpuDirect(0, "NVIDIA H200", True, True, True, "9.0")
GB10 = GpuDirect(0, "NVIDIA GB10", False, False, True, "12.1")


def _spark(environ: dict[str, str] | None = None, rootfs: Path = GDR) -> FabricReadings:
    return read_fabric(LAN, rootfs, environ or {}, site_dirs=[])


def codes(readings: FabricReadings) -> list[str]:
    return [f.code for f in lint(readings)]


def test_a_gb10_forced_into_gpudirect_rdma() -> None:
    readings = _spark({"NCCL_NET_GDR_LEVEL": "SYS", "HOME": "/root"})
    assert readings.gpu_models == ("NVIDIA GB10",)
    assert readings.peermem_loaded is False
    assert readings.peermem_boot == ("/etc/modules-load.d/nvidia-peermem.conf",)
    assert readings.gpudirect == () and "not asked" in readings.gpudirect_note
    found = {f.code: f for f in lint(readings)}
    forced = found["gdr-forced"]
    assert forced.finding.startswith(
        "NCCL_NET_GDR_LEVEL=SYS, NCCL_NET_GDR_READ=1 makes NCCL try GPUDirect RDMA"
    )
    assert "GB10" in forced.finding and "thread 348787" in forced.figure
    assert forced.fix.startswith(
        "unset NCCL_NET_GDR_LEVEL; remove the NCCL_NET_GDR_READ line from /etc/nccl.conf"
    )
    boot = found["peermem-boot"]
    assert "expected, not a fault to repair" in boot.finding
    assert boot.fix == "remove nvidia-peermem from /etc/modules-load.d/nvidia-peermem.conf"
    assert "gdr-unused" not in found  # no repair suggested for peermem on a GB10
    assert state(readings).startswith("GPUDirect RDMA: not possible here")


def test_the_cuda_attribute_decides_before_the_model() -> None:
    readings = replace(_spark({"NCCL_NET_GDR_LEVEL": "PHB"}), gpudirect=(GB10,), gpu_models=())
    assert impossible(readings) == (
        "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED is 0 on GPU 0 (NVIDIA GB10)"
    )
    assert "gdr-forced" in codes(readings)
    quiet = replace(_spark({}, ROOTFS / "dgx-spark"), gpudirect=(GB10,))
    assert "gdr-forced" not in codes(quiet) and "peermem-boot" not in codes(quiet)


def test_settings_that_force_it() -> None:
    def setting(name: str, value: str) -> NcclSetting:
        return NcclSetting(name, value, "environment")

    assert forces(setting("NCCL_NET_GDR_LEVEL", "SYS")) and forces(
        setting("NCCL_NET_GDR_LEVEL", "5")
    )
    assert not forces(setting("NCCL_NET_GDR_LEVEL", "LOC"))
    assert not forces(setting("NCCL_NET_GDR_LEVEL", "0"))
    assert forces(setting("NCCL_NET_GDR_READ", "1")) and not forces(
        setting("NCCL_NET_GDR_READ", "0")
    )
    assert forces(setting("NCCL_GDRCOPY_ENABLE", "1"))
    assert forces(setting("NCCL_DMABUF_ENABLE", "1"))
    assert not forces(setting("NCCL_IB_HCA", "1"))


def test_an_h200_with_gpudirect_supported_but_unused() -> None:
    readings = replace(_spark({}), gpudirect=(replace(H200, dmabuf=False),), gpu_models=())
    found = {f.code: f for f in lint(readings)}
    assert found["gdr-unused"].fix.startswith("sudo modprobe nvidia-peermem")
    assert "gdr-forced" not in found and "peermem-boot" not in found
    with_dmabuf = replace(readings, gpudirect=(H200,))
    assert "gdr-unused" not in codes(with_dmabuf)  # NCCL registers through dma-buf
    loaded = replace(readings, peermem_loaded=True)
    assert "gdr-unused" not in codes(loaded)
    assert state(with_dmabuf) == "GPUDirect RDMA: supported; nvidia_peermem not loaded; dma-buf yes"


def test_nccl_bound_to_the_wrong_interface() -> None:
    wifi = _spark({"NCCL_SOCKET_IFNAME": "wlP9s9"}, ROOTFS / "dgx-spark")
    (finding,) = [f for f in lint(wifi) if f.code == "ifname-not-cx7"]
    assert finding.finding == (
        "NCCL_SOCKET_IFNAME=wlP9s9 (in the environment) selects wlP9s9 (Wi-Fi, mt7925e), not a "
        "ConnectX-7 interface (up: enP2p1s0f1np1, enp1s0f1np1)"
    )
    assert finding.fix == "export NCCL_SOCKET_IFNAME=enP2p1s0f1np1,enp1s0f1np1 on both machines"
    realtek = _spark({"NCCL_SOCKET_IFNAME": "enP7"}, ROOTFS / "dgx-spark")
    (finding,) = [f for f in lint(realtek) if f.code == "ifname-not-cx7"]
    assert "enP7s7 (Realtek 10GbE, r8127, 10 Gb/s)" in finding.finding
    right = _spark({"NCCL_SOCKET_IFNAME": "enp1s0f1np1,enP2p1s0f1np1"}, ROOTFS / "dgx-spark")
    assert not {"ifname-not-cx7", "ifname-unset"} & set(codes(right))
    unset = _spark({}, ROOTFS / "dgx-spark")
    assert "ifname-unset" in codes(unset)
    # the plain Spark tree has only its ConnectX-7 interfaces: nothing else NCCL could take
    alone = read_fabric(SYSFS / "dgx-spark", ROOTFS / "dgx-spark", {}, site_dirs=[])
    assert "ifname-unset" not in codes(alone)


def test_the_route_to_the_peer() -> None:
    readings = replace(_spark({}, ROOTFS / "dgx-spark"), peer_route=("192.168.1.20", "enP7s7"))
    (finding,) = [f for f in lint(readings) if f.code == "route-not-cx7"]
    assert finding.finding == (
        "traffic to 192.168.1.20 leaves through enP7s7 (Realtek 10GbE, r8127, 10 Gb/s), not a "
        "ConnectX-7 interface"
    )
    good = replace(readings, peer_route=("10.0.0.2", "enp1s0f1np1"))
    assert "route-not-cx7" not in codes(good)


def test_cx7_config_rows_carry_the_new_findings() -> None:
    snap = poll(NVML / "gb10-idle.json", sysfs=LAN, rootfs=GDR)
    rows = check_cx7_config(context(snap, fabric=_spark({"NCCL_NET_GDR_LEVEL": "SYS"})))
    found = {r.data["code"]: r for r in rows}
    assert {"gdr-forced", "peermem-boot", "ifname-unset"} <= set(found)
    assert found["gdr-forced"].status == "warn"
    assert "unset NCCL_NET_GDR_LEVEL" in found["gdr-forced"].action


def test_sources_read_modules_and_models(tmp_path: Path) -> None:
    assert sources.module_loaded(LAN, "nvidia") is True
    assert sources.module_loaded(LAN, "nvidia_peermem") is False
    assert sources.module_loaded(SYSFS / "dgx-spark", "nvidia") is None  # no module/ at all
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "modules").write_text("# at boot\nnvidia_peermem  # for NCCL\n")
    assert sources.modules_configured(tmp_path, "nvidia-peermem") == ("/etc/modules",)
    assert sources.gpu_models(tmp_path) == ()


def test_cuda_attributes_without_a_driver_say_why() -> None:
    answer = sources.cuda_attributes()
    if isinstance(answer, str):  # this machine has no CUDA driver
        assert answer.startswith("the CUDA driver")
    else:
        assert all(g.capability for g in answer)


def test_link_lint_json_has_the_gpudirect_readings() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NCCL_NET_GDR_LEVEL": "SYS"}
    done = subprocess.run(
        [sys.executable, "-m", "sparkdiag", "link", "lint", "--json",
         "--path.sysfs", str(LAN), "--path.rootfs", str(GDR)],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["readings"]["gpu_models"] == ["NVIDIA GB10"]
    assert doc["readings"]["nvidia_peermem_loaded"] is False
    assert {"gdr-forced", "peermem-boot"} <= {f["code"] for f in doc["findings"]}
