"""The host readers behind ``sparkdiag check``: cpufreq governors, process names, the installed
torch (read without importing it) and the kernel log, each under its configurable root."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkdiag.check.gather import Sources, gather
from sparkdiag.config import Settings
from sparkdiag.probe.runner import ProbeCycle
from sparkdiag.snapshot import GpuSample
from sparkdiag.sources.host import cpufreq, kernel_log, procfs
from sparkdiag.sources.software import packages
from tests.support.check import GOOD_TORCH, empty_sysfs, nvml_fixture

XID_79 = (
    "NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)

# -- cpufreq -------------------------------------------------------------------------------------


def _cpus(root: Path, governors: dict[str, str]) -> Path:
    for cpu, governor in governors.items():
        d = root / "devices" / "system" / "cpu" / cpu / "cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text(governor + "\n")
    (root / "devices" / "system" / "cpu" / "cpufreq").mkdir(parents=True, exist_ok=True)
    return root


def test_governors_in_cpu_order(tmp_path: Path) -> None:
    root = _cpus(tmp_path, {"cpu10": "powersave", "cpu2": "performance", "cpu0": "schedutil"})
    governors, note = cpufreq.read_governors(root)
    assert governors == {"cpu0": "schedutil", "cpu2": "performance", "cpu10": "powersave"}
    assert governors is not None and list(governors) == ["cpu0", "cpu2", "cpu10"]
    assert note == ""


def test_governors_leave_out_cpus_without_a_governor(tmp_path: Path) -> None:
    root = _cpus(tmp_path, {"cpu0": "performance", "cpu1": ""})
    (root / "devices" / "system" / "cpu" / "cpu2").mkdir()  # offline, or no cpufreq
    governors, note = cpufreq.read_governors(root)
    assert governors == {"cpu0": "performance"} and note == ""


def test_governors_without_cpufreq_or_cpu_list_say_why(tmp_path: Path) -> None:
    governors, note = cpufreq.read_governors(empty_sysfs(tmp_path))
    assert governors is None and "no CPU list under" in note and "devices/system/cpu" in note
    (tmp_path / "vm" / "devices" / "system" / "cpu" / "cpu0").mkdir(parents=True)
    governors, note = cpufreq.read_governors(tmp_path / "vm")
    assert governors is None and note.startswith("no cpufreq governor under")


# -- procfs --------------------------------------------------------------------------------------


def test_process_names(tmp_path: Path) -> None:
    assert procfs.process_names(Path("/"), [os.getpid()])[os.getpid()]
    assert procfs.process_names(tmp_path, [4242]) == {}


def test_process_names_under_a_fake_root(tmp_path: Path) -> None:
    for pid, comm in ((4242, "python\n"), (4243, "\n")):
        (tmp_path / "proc" / str(pid)).mkdir(parents=True)
        (tmp_path / "proc" / str(pid) / "comm").write_text(comm)
    assert procfs.process_names(tmp_path, [4242, 4243, 4244]) == {4242: "python"}


# -- installed packages, read without importing them ---------------------------------------------


def _fake_torch(tmp_path: Path, cuda_line: str) -> type:
    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (package / "version.py").write_text(f"__version__ = '2.11.0+cu130'\n{cuda_line}\n")

    class Spec:
        def __init__(self) -> None:
            self.submodule_search_locations = [str(package)]

    return Spec


@pytest.mark.parametrize(
    ("version", "cuda_line", "cuda"),
    [
        ("2.11.0+cu130", "cuda: Optional[str] = '13.0'", "13.0"),
        ("2.11.0+cpu", "cuda: Optional[str] = None", None),  # a CPU build has no CUDA
    ],
    ids=["cuda", "cpu"],
)
def test_torch_info_reads_version_and_cuda_without_importing(
    tmp_path: Path, version: str, cuda_line: str, cuda: str | None
) -> None:
    spec = _fake_torch(tmp_path, cuda_line)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(importlib.metadata, "version", lambda name: version)
        mp.setattr(importlib.util, "find_spec", lambda name: spec())
        info = packages.read_torch("py")
    assert (info.version, info.cuda) == (version, cuda)
    assert info.python == "py"


def test_torch_not_installed_looks_no_further() -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    def no_lookup(name: str) -> None:
        raise AssertionError("find_spec must not be called when torch is not installed")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(importlib.metadata, "version", missing)
        mp.setattr(importlib.util, "find_spec", no_lookup)
        info = packages.read_torch("/usr/bin/python3")
    assert info == packages.TorchInfo(None, None, "/usr/bin/python3")


def test_torch_info_of_this_environment() -> None:
    info = packages.read_torch()
    try:
        expected = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        expected = None
    assert info.version == expected


def test_installed_version() -> None:
    assert packages.installed_version("pytest") == importlib.metadata.version("pytest")
    assert packages.installed_version("sparkdiag-no-such-distribution") is None


# -- kernel log ----------------------------------------------------------------------------------


def test_kernel_log_read_under_a_fake_root(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text(f"6,1,100,-;boot\n4,2,200,-;{XID_79}\n")
    log = kernel_log.read_kernel_log(tmp_path)
    assert log.lines == ("boot", XID_79)
    missing = kernel_log.read_kernel_log(tmp_path / "nothing")
    assert missing.lines is None and missing.unreadable is not None


def test_kernel_log_of_dmesg_lines_under_a_fake_root(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text(f"[   12.500000] {XID_79}\nplain; text\n")
    log = kernel_log.read_kernel_log(tmp_path)
    assert log.lines == (f"[   12.500000] {XID_79}", "plain; text")
    assert log.source == str(tmp_path / "dev" / "kmsg") and log.unreadable is None


def test_kernel_log_of_this_machine_reads_or_says_why() -> None:
    log = kernel_log.read_kernel_log(Path("/"))
    assert (log.lines is None) == (log.unreadable is not None)


# -- gather reads every host source under the configured roots -----------------------------------


def _never(gpu: GpuSample, on_start: Callable[[int], None]) -> ProbeCycle:
    raise AssertionError(f"the worker must not run (GPU {gpu.identity.index})")


def test_gather_reads_the_host_under_the_configured_roots(tmp_path: Path) -> None:
    sysfs = _cpus(empty_sysfs(tmp_path), {"cpu0": "performance", "cpu1": "powersave"})
    rootfs = tmp_path / "rootfs"
    (rootfs / "proc" / "4242").mkdir(parents=True)
    (rootfs / "proc" / "4242" / "comm").write_text("python\n")
    (rootfs / "dev").mkdir()
    (rootfs / "dev" / "kmsg").write_text(f"4,2,200,-;{XID_79}\n")
    fixture = nvml_fixture(tmp_path, set={"compute_processes": [{"pid": 4242, "used_memory": 1}]})
    settings = Settings(
        nvml_fixture=fixture, sysfs=sysfs, rootfs=rootfs, state_dir=tmp_path / "state"
    )
    ctx = gather(settings, quick=True, sources=Sources(launcher=_never, torch=GOOD_TORCH))
    assert ctx.governors == {"cpu0": "performance", "cpu1": "powersave"}
    assert ctx.process_names == {4242: "python"}
    assert ctx.kernel_log == kernel_log.KernelLog((XID_79,), str(rootfs / "dev" / "kmsg"))
