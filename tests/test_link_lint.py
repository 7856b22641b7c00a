"""The ConnectX-7 / NCCL lint on the fixture trees of a DGX Spark: tests/fixtures/sysfs/dgx-spark
(one QSFP cable in port 1, both its PCIe halves up, MTU 1500 everywhere, as a stock Spark) and
tests/fixtures/rootfs/dgx-spark-nccl (/etc/nccl.conf naming one HCA, CmaTotal 0 kB with
CmaFree 940604 kB, pip's and the system's NCCL 2.28.9); their READMEs cite the public sources.
Each rule is also shown passing on a tree with that one thing fixed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkdiag.check.model import CheckContext
from sparkdiag.check.network_checks import check_cx7_config
from sparkdiag.link.lint import lint, parse_nccl_list
from sparkdiag.link.readings import FabricReadings, read_fabric
from sparkdiag.sources.host.netif import read_connectx7
from sparkdiag.sources.software.nccl import find_libraries, parse_conf, read_nccl_settings
from tests.support import ROOTFS, SYSFS, fixture_snapshot, invoke_cli, machine_args
from tests.support.check import copy_tree

SPARK = SYSFS / "dgx-spark"
NCCL_ROOT = ROOTFS / "dgx-spark-nccl"
SITE = NCCL_ROOT / "usr/local/lib/python3.12/dist-packages"
PORT1 = ("0000:01:00.1", "0002:01:00.1")


def _readings(
    sysfs: Path = SPARK, rootfs: Path = NCCL_ROOT, environ: dict[str, str] | None = None
) -> FabricReadings:
    return read_fabric(sysfs, rootfs, environ or {"HOME": "/root"})


def _codes(readings: FabricReadings) -> list[str]:
    return [f.code for f in lint(readings)]


def _copy(tmp_path: Path, source: Path, name: str) -> Path:
    return copy_tree(source, tmp_path / name)


def _set_mtu(sysfs: Path, mtu: int) -> None:
    for name in ("enp1s0f1np1", "enP2p1s0f1np1"):
        (sysfs / "class" / "net" / name / "mtu").resolve().write_text(f"{mtu}\n")


def test_the_spark_fixture_reads_as_four_functions_one_port_cabled() -> None:
    functions = read_connectx7(SPARK)
    assert [f.address for f in functions] == [
        "0000:01:00.0",
        "0000:01:00.1",
        "0002:01:00.0",
        "0002:01:00.1",
    ]
    up = {f.address: (f.interfaces[0].name, f.rdma, f.rdma_active) for f in functions}
    assert up["0000:01:00.1"] == ("enp1s0f1np1", ("rocep1s0f1",), True)
    assert up["0002:01:00.1"] == ("enP2p1s0f1np1", ("roceP2p1s0f1",), True)
    assert up["0000:01:00.0"][2] is False
    cabled = functions[1].interfaces[0]
    assert (cabled.mtu, cabled.speed_mbps, cabled.carrier, cabled.pci_address) == (
        1500,
        200000,
        True,
        "0000:01:00.1",
    )
    down = functions[0].interfaces[0]
    assert (down.speed_mbps, down.carrier, down.up) == (None, False, False)  # -1 is left out
    assert functions[1].link is not None and functions[1].link.current_width == 4


def test_every_rule_of_the_brief_fires_on_the_misconfigured_spark() -> None:
    findings = {f.code: f for f in lint(_readings())}
    assert list(findings) == ["mtu", "hca-one-half", "cma-kho", "nccl-two"]
    mtu = findings["mtu"]
    assert "enp1s0f1np1 (0000:01:00.1) MTU 1500" in mtu.finding
    assert "enP2p1s0f1np1 (0002:01:00.1) MTU 1500" in mtu.finding
    assert "sudo ip link set dev enp1s0f1np1 mtu 9000" in mtu.fix
    assert "23.74 GB/s" in mtu.figure and "#102/#103" in mtu.figure
    half = findings["hca-one-half"]
    assert half.finding == (
        "NCCL_IB_HCA=rocep1s0f1 in /etc/nccl.conf selects rocep1s0f1 but not roceP2p1s0f1, "
        "the other PCIe x4 half of the same cabled port"
    )
    assert half.fix.startswith("set NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1 in /etc/nccl.conf")
    assert "98 Gb/s with one HCA and 161 Gb/s with both" in half.figure
    cma = findings["cma-kho"]
    assert "CmaTotal 0 kB but CmaFree 940604 kB" in cma.finding
    assert "kho=off" in cma.fix and "#259" in cma.figure
    two = findings["nccl-two"]
    assert "pip nvidia-nccl-cu13 2.28.9 at /usr/local/lib/python3.12/dist-packages" in two.finding
    assert "system 2.28.9 at /usr/lib/aarch64-linux-gnu/libnccl.so.2" in two.finding
    assert "ln -s /usr/lib/aarch64-linux-gnu/libnccl.so.2" in two.fix
    assert "vllm-project/vllm#41725" in two.figure


def test_fixed_one_by_one_each_finding_goes(tmp_path: Path) -> None:
    sysfs = _copy(tmp_path, SPARK, "sysfs")
    rootfs = _copy(tmp_path, NCCL_ROOT, "rootfs")
    _set_mtu(sysfs, 9000)
    assert "mtu" not in _codes(_readings(sysfs, rootfs))
    (rootfs / "etc/nccl.conf").write_text("NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1\n")
    assert "hca-one-half" not in _codes(_readings(sysfs, rootfs))
    (rootfs / "proc/cmdline").write_text("BOOT_IMAGE=/boot/vmlinuz ro kho=off\n")
    assert "cma-kho" not in _codes(_readings(sysfs, rootfs))
    (rootfs / "usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2").unlink()
    assert _codes(_readings(sysfs, rootfs)) == []


def test_the_environment_wins_over_etc_nccl_conf() -> None:
    env = {"HOME": "/root", "NCCL_IB_HCA": "=rocep1s0f1,roceP2p1s0f1"}
    readings = _readings(environ=env)
    setting = readings.nccl.effective["NCCL_IB_HCA"]
    assert (setting.origin, setting.shadowed) == ("environment", ("/etc/nccl.conf",))
    assert "hca-one-half" not in _codes(readings)


@pytest.mark.parametrize(
    ("value", "code", "words"),
    [
        ("mlx5_0", "hca-absent", "names mlx5_0, which is not an RDMA device here"),
        ("rocep1s0f1,mlx5_3", "hca-absent", "names mlx5_3"),
        ("=rocep1s0f0", "hca-down", "selects only RDMA ports that are not ACTIVE: rocep1s0f0"),
        ("^rocep1s0f1", "hca-one-half", "selects roceP2p1s0f1 but not rocep1s0f1"),
    ],
)
def test_hca_lists_as_nccl_reads_them(value: str, code: str, words: str) -> None:
    findings = lint(_readings(environ={"HOME": "/root", "NCCL_IB_HCA": value}))
    found = [f for f in findings if f.code == code]
    assert found and words in found[0].finding, [f.finding for f in findings]


def test_no_hca_list_with_both_halves_up(tmp_path: Path) -> None:
    rootfs = _copy(tmp_path, NCCL_ROOT, "rootfs")
    (rootfs / "etc/nccl.conf").unlink()
    (finding,) = [f for f in lint(_readings(rootfs=rootfs)) if f.code.startswith("hca")]
    assert finding.code == "hca-unset"
    assert "export NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in finding.fix


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("eth9", "ifname-absent"),
        ("=enp1s0f0np0", "ifname-down"),
        ("enp1s0f1", None),
        ("^lo,docker", None),
    ],
)
def test_socket_interface_lists(value: str, code: str | None) -> None:
    findings = lint(_readings(environ={"HOME": "/root", "NCCL_SOCKET_IFNAME": value}))
    assert [f.code for f in findings if f.code.startswith("ifname")] == ([code] if code else [])


def test_nccl_list_syntax() -> None:
    listed = parse_nccl_list("^=mlx5_0:1,mlx5_1")
    assert (listed.exclude, listed.exact) == (True, True)
    assert listed.entries == (("mlx5_0", 1), ("mlx5_1", None))
    assert not listed.selects("mlx5_0", 1) and listed.selects("mlx5_0", 2)
    assert listed.selects("mlx5_10") and not listed.selects("mlx5_1")
    prefix = parse_nccl_list("mlx5")
    assert prefix.selects("mlx5_7") and not prefix.selects("rocep1s0f1")


def test_conf_files_are_read_as_nccl_reads_them(tmp_path: Path) -> None:
    values, ignored = parse_conf(
        "# comment\nNCCL_IB_HCA = mlx5_0\nNCCL_SOCKET_IFNAME==eth0\nNCCL_SOCKET_IFNAME=eth1\n"
    )
    assert values == {"NCCL_SOCKET_IFNAME": "=eth0"}  # the first line wins (setenv, no overwrite)
    assert ignored == ("NCCL_IB_HCA",)
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/nccl.conf").write_text("NCCL_IB_HCA = mlx5_0\n")
    (root / "home/u").mkdir(parents=True)
    (root / "home/u/.nccl.conf").write_text("NCCL_SOCKET_IFNAME=eth1\n")
    settings = read_nccl_settings(root, {}, home="/home/u")
    assert settings.effective["NCCL_SOCKET_IFNAME"].origin == "/home/u/.nccl.conf"
    conf = read_nccl_settings(root, {"NCCL_CONF_FILE": "/etc/nccl.conf"}).files
    assert [c.path for c in conf] == ["/etc/nccl.conf"]  # read once, though named twice
    readings = read_fabric(SPARK, root, {"HOME": "/home/u"}, site_dirs=[])
    (key,) = [f for f in lint(readings) if f.code == "nccl-conf-key"]
    assert "variable named 'NCCL_IB_HCA '" in key.finding


def test_libraries_resolve_links_and_are_listed_once(tmp_path: Path) -> None:
    libs = find_libraries(NCCL_ROOT, [SITE, SITE])  # the same site twice: listed once
    assert [(lib.origin, lib.version, lib.package) for lib in libs] == [
        ("pip", "2.28.9", "nvidia-nccl-cu13"),
        ("system", "2.28.9", None),
    ]
    assert libs[1].real == "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"
    root = _copy(tmp_path, NCCL_ROOT, "rootfs")
    (root / "etc/ld.so.conf.d").mkdir()
    (root / "etc/ld.so.conf.d/nccl.conf").write_text("/opt/nccl/lib\n")
    (root / "opt/nccl/lib").mkdir(parents=True)
    (root / "opt/nccl/lib/libnccl.so.2.27.3").write_text("x")
    found = find_libraries(root, [])
    assert [(lib.path, lib.version) for lib in found] == [
        ("/opt/nccl/lib/libnccl.so.2.27.3", "2.27.3"),
        ("/usr/lib/aarch64-linux-gnu/libnccl.so.2", "2.28.9"),
    ]


def test_cma_without_the_kho_sign_is_quiet(tmp_path: Path) -> None:
    rootfs = _copy(tmp_path, NCCL_ROOT, "rootfs")
    meminfo = rootfs / "proc/meminfo"
    meminfo.write_text(meminfo.read_text().replace("CmaFree:          940604 kB", "CmaFree: 0 kB"))
    readings = _readings(rootfs=rootfs)
    assert (readings.cma_total_bytes, readings.cma_free_bytes) == (0.0, 0.0)
    assert "cma-kho" not in _codes(readings)


def test_check_row_on_the_spark_and_elsewhere(tmp_path: Path) -> None:
    snapshot = fixture_snapshot("h200-idle", tmp_path)
    rows = check_cx7_config(CheckContext(snapshot, fabric=_readings()))
    assert [r.status for r in rows] == ["warn"] * 4
    assert rows[1].data["code"] == "hca-one-half" and "why: " in rows[1].action
    none = check_cx7_config(CheckContext(snapshot, fabric=_readings(SYSFS / "h200-vm")))
    assert [(r.status, r.finding) for r in none] == [
        ("skip", "no ConnectX-7 (PCI 15b3:1021) on this machine")
    ]
    sysfs = _copy(tmp_path, SPARK, "sysfs")
    _set_mtu(sysfs, 9000)
    env = {"HOME": "/root", "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1"}
    clean = read_fabric(sysfs, ROOTFS / "dgx-spark", env, site_dirs=[])
    (row,) = check_cx7_config(CheckContext(snapshot, fabric=clean))
    assert (row.status, row.finding) == (
        "pass",
        "4 ConnectX-7 functions, 2 with a carrier (MTU 9000); NCCL settings and 0 NCCL "
        "library(ies) consistent",
    )


def test_link_lint_command() -> None:
    args = ("--path.sysfs", str(SPARK), "--path.rootfs", str(NCCL_ROOT))
    text = invoke_cli("link", "lint", *args)
    assert text.returncode == 1, text.stderr
    assert "ConnectX-7 0000:01:00.1: enp1s0f1np1 (up, MTU 1500); rocep1s0f1" in text.stdout
    assert "NCCL_IB_HCA=rocep1s0f1 (/etc/nccl.conf)" in text.stdout
    assert "hca-one-half: " in text.stdout and "  why: " in text.stdout
    doc = json.loads(invoke_cli("link", "lint", "--json", *args).stdout)
    assert [f["code"] for f in doc["findings"]] == ["mtu", "hca-one-half", "cma-kho", "nccl-two"]
    assert doc["readings"]["cma_total_bytes"] == 0.0
    clean = invoke_cli("link", "lint", *machine_args("h200-vm"))
    assert clean.returncode == 0, clean.stdout
    assert "no ConnectX-7 (PCI 15b3:1021) on this machine" in clean.stdout
    assert clean.stdout.rstrip().endswith("no findings")
    missing = invoke_cli("link", "lint", "--path.sysfs", "/nonexistent")
    assert missing.returncode == 2 and "--path.sysfs" in missing.stderr
    assert "Traceback" not in missing.stderr
