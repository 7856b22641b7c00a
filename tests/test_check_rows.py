"""Rows of ``sparkdiag check`` whose words were wrong (found in a review): an XID that failed
until reboot after the reset it asked for, two rows with opposite advice for a GPU off the bus,
a CUDA bound read as torch's version, and XID advice that sent check's reader to check.

The fixtures ``tests/fixtures/rootfs/xid-reset*`` and ``xid-reinit`` are kernel logs of the
H200 of ``h200-idle.json`` (PCI 0000:00:06): its boot (the nvidia driver probing the GPU and
loading), an XID 48, then

* ``xid-reset``: the driver unloaded and loaded again (as 'rmmod nvidia ...; modprobe nvidia'
  writes it);
* ``xid-reset-recurred``: the same, then another XID 48 (the driver logs the GPU's UUID before
  the first XID of each life of its GPU object);
* ``xid-reinit``: the GPU initialised again (its UUID logged anew), then an XID 13.

Their lines are as the driver and the kernel write them (the patterns and where they come from:
:mod:`sparkdiag.sources.nvml.xid`); timestamps, sequence numbers, pids and the build string are
made up.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from sparkdiag.check.health_checks import check_xid
from sparkdiag.check.model import CheckResult, KernelLog, TorchInfo
from sparkdiag.sources.host.kernel_log import read_kernel_log
from sparkdiag.sources.nvml.xid import describe
from tests.support import ROOT, sparkdiag_cmd
from tests.support.check import CHECK, NVML, ROOTFS, context, nvml_fixture, only, poll

CATALOG_79 = "power the machine off and on (a reset or reboot is not enough)"


def xid_row(root: str) -> CheckResult:
    log = read_kernel_log(ROOTFS / root)
    return only(check_xid(context(poll(NVML / "h200-idle.json"), kernel_log=log)))


# -- 1. an XID logged before the GPU was set up again ----------------------------------------


def test_an_xid_before_the_driver_loaded_again_warns_as_before_the_last_reset() -> None:
    """kmsg held an XID 48, then the GPU was set up again: check failed with 'reset the GPU'
    until a reboot."""
    r = xid_row("xid-reset")
    assert r.status == "warn", r
    assert r.finding == (
        "XID 48 ×1 (0000:00:06, GPU 0): double-bit ECC error [critical], logged before the last "
        "reset of GPU 0 (since boot); the last reset of GPU 0: the NVIDIA driver was loaded again"
    )
    assert r.action.startswith(
        "XID 48 came before the last reset of GPU 0: nothing to do unless it comes back; then: "
        "reset the GPU (sudo nvidia-smi -r -i 0)"
    )
    assert r.data["events"] == [
        {
            "pci": "0000:00:06",
            "xid": 48,
            "count": 1,
            "severity": "critical",
            "action": "workflow_xid_48",
            "before_reset": True,
        }
    ]


def test_an_xid_after_the_last_reset_keeps_its_status() -> None:
    r = xid_row("xid-reset-recurred")
    assert r.status == "fail"
    assert r.finding.startswith(
        "XID 48 ×1 (0000:00:06, GPU 0): double-bit ECC error [critical]; XID 48 ×1 (0000:00:06, "
        "GPU 0): double-bit ECC error [critical], logged before the last reset of GPU 0"
    )
    assert r.action.startswith("XID 48: reset the GPU (sudo nvidia-smi -r -i 0)")
    assert sorted(e["before_reset"] for e in r.data["events"]) == [False, True]


def test_of_one_status_what_still_stands_is_said_first() -> None:
    """An XID 13 after the GPU was initialised again, an XID 48 before: both warn; the action
    is the XID 13's (restart the application), not the reset the XID 48 no longer needs."""
    r = xid_row("xid-reinit")
    assert r.status == "warn"
    assert r.finding.startswith("XID 13 ×1 (0000:00:06, GPU 0): graphics engine exception")
    assert "XID 48 ×1 (0000:00:06, GPU 0): double-bit ECC error [critical], logged before" in (
        r.finding
    )
    assert r.finding.endswith(
        "the last reset of GPU 0: the driver initialised it again (its UUID logged anew)"
    )
    assert r.action.startswith("XID 13: restart the application that hit it")


@pytest.mark.parametrize(
    "reset",
    [
        # the review's line: no driver writes it, and 'nvidia-smi -r' writes nothing (at the
        # driver's default level), so nothing says the GPU was reset: as before
        "6,1002,9000000,-;NVRM: GPU at PCI:0000:00:06: GPU-979ad365-0b73-a0ac-74a2-3520b773d460 "
        "reset",
        "6,1002,9000000,-;NVRM: Trigger FLR!",
    ],
)
def test_without_a_line_that_says_the_gpu_was_set_up_again_the_xid_fails_as_before(
    tmp_path: Path, reset: str
) -> None:
    kmsg = tmp_path / "dev" / "kmsg"
    kmsg.parent.mkdir()
    kmsg.write_text(
        "4,1001,5000000,-;NVRM: Xid (PCI:0000:00:06): 48, pid=1234, name=python, DBE (double "
        f"bit error) ECC error\n{reset}\n"
    )
    r = only(
        check_xid(context(poll(NVML / "h200-idle.json"), kernel_log=read_kernel_log(tmp_path)))
    )
    assert r.status == "fail"
    assert (
        r.finding == "XID 48 ×1 (0000:00:06, GPU 0): double-bit ECC error [critical] (since boot)"
    )
    assert r.action.endswith(
        "; nvidia-smi -r leaves no line in the kernel log: after one, this row fails until the "
        "driver is loaded again (or the machine rebooted)"
    )


def test_an_xid_79_without_a_reset_fails_as_before_and_asks_for_no_reset() -> None:
    r = xid_row("xid-critical")
    assert r.status == "fail" and CATALOG_79 in r.action
    assert "nvidia-smi -r" not in r.action
    assert not any(e["before_reset"] for e in r.data["events"])


def test_the_check_command_says_it_of_the_fixture() -> None:
    done = subprocess.run(
        sparkdiag_cmd(
            "check", "--quick", "--json", "--nvml-fixture", str(NVML / "h200-idle.json"),
            "--path.rootfs", str(ROOTFS / "xid-reset"),
        ),
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    rows = {row["name"]: row for row in json.loads(done.stdout)["checks"]}
    assert rows["xid"]["status"] == "warn", rows["xid"]
    assert "logged before the last reset of GPU 0" in rows["xid"]["finding"]


# -- 2. a GPU off the bus: one advice ---------------------------------------------------------


def test_a_lost_gpu_gets_the_advice_of_the_xid_row(tmp_path: Path) -> None:
    """Every answer GPU_IS_LOST, kernel log with XID 79: gpus said 'reset it (sudo nvidia-smi
    -r -i 0) or reboot', xid 'power the machine off and on (a reset or reboot is not enough)'."""
    snap = poll(nvml_fixture(tmp_path, script=[{"poll": 1, "gpu": 0, "lost": True}]))
    log = read_kernel_log(ROOTFS / "xid-critical")
    ctx = context(snap, kernel_log=log)
    gpus = only(CHECK["gpus"](ctx))
    xid = only(check_xid(ctx))
    assert (gpus.status, xid.status) == ("fail", "fail")
    assert "GPU_IS_LOST" in gpus.finding
    assert gpus.action == (
        "as for XID 79 (fallen off the bus): the GPU no longer answers over PCIe: power the "
        "machine off and on (a reset or reboot is not enough); reseat the GPU and check its "
        "power cables if it recurs"
    )
    assert CATALOG_79 in xid.action
    for action in (gpus.action, xid.action):
        assert "nvidia-smi -r" not in action and "or reboot;" not in action


@pytest.mark.parametrize(
    ("error", "said"),
    [
        ("NVML_ERROR_GPU_NOT_FOUND (28)", CATALOG_79),
        ("NVML_ERROR_RESET_REQUIRED (16)", "the driver asks for a reset: stop the GPU's processes"),
        ("NVML_ERROR_UNKNOWN (999)", "the xid row names what the kernel logged"),
    ],
)
def test_the_advice_for_a_lost_gpu_follows_what_nvml_said(error: str, said: str) -> None:
    snap = poll(NVML / "h200-idle.json")
    gpu = replace(snap.gpus[0], up=False, error=error)
    r = only(CHECK["gpus"](context(replace(snap, gpus=(gpu,)))))
    assert r.status == "fail" and said in r.action, r.action


# -- 3. the CUDA bound is CUDA's ---------------------------------------------------------------


def test_a_cpu_only_torch_is_told_the_cuda_version_not_a_torch_version() -> None:
    torch = TorchInfo("2.13.0+cpu", None, "python3")
    r = only(CHECK["versions"](context(poll(NVML / "h200-idle.json"), torch=torch)))
    assert r.status == "fail"
    assert r.action.startswith("install a CUDA build of torch for CUDA 13.0 or older (the selector")
    assert "torch ≤" not in r.action and "≤" not in r.action


@pytest.mark.parametrize(
    ("torch", "said"),
    [
        (TorchInfo("2.11.0+cu130", "13.0", "python3"), "or install a CUDA build of torch for "),
        (TorchInfo("2.8.0+cu129", "12.9", "python3"), "or install a CUDA build of torch for "),
    ],
)
def test_every_torch_advice_says_the_bound_as_a_cuda_version(
    tmp_path: Path, torch: TorchInfo, said: str
) -> None:
    snap = poll(nvml_fixture(tmp_path, driver_version="570.124.06"))
    r = only(CHECK["versions"](context(snap, torch=torch)))
    assert r.status in ("fail", "warn")
    assert f"{said}CUDA 12.8 or older" in r.action and "≤ 12.8" not in r.action, r.action


# -- 4. no XID advice sends check's reader to check ----------------------------------------------


@pytest.mark.parametrize("code", [13, 31, 94, 154])
def test_xid_advice_in_check_does_not_say_run_sparkdiag_check(code: int) -> None:
    line = f"NVRM: Xid (PCI:0000:00:06): {code}, pid=4242, name=python3, test"
    r = only(check_xid(context(poll(NVML / "h200-idle.json"), kernel_log=KernelLog((line,), "t"))))
    assert r.status == "warn" and r.action.startswith(f"XID {code}: ")
    assert "sparkdiag check" not in r.action, r.action
    assert "sparkdiag check" in describe(code).action()  # the daemon's log may say it


def test_the_restart_app_advice_of_check_names_the_rows_to_read() -> None:
    r = xid_row("xid-warning")
    assert r.action.startswith(
        "XID 31: restart the application that hit it; the GPU itself needs nothing (if it "
        "recurs without an application fault, this run's ecc, row-remap and recovery-action "
        "rows say whether the GPU is at fault)"
    )
