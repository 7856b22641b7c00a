"""Golden end-to-end test: run the daemon on fixtures, scrape /metrics, diff against a committed
expected output, and lint it with ``promtool check metrics``.

Rewrite the golden files after an intended change with::

    SPARKDIAG_UPDATE_GOLDEN=1 python -m pytest tests/test_e2e_golden.py

and review the diff before committing it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import (
    NVML,
    PROBE,
    ROOT,
    ROOTFS,
    SYSFS,
    http_get,
    normalise,
    promtool,
    running_daemon,
)

GOLDEN = ROOT / "tests" / "golden"

SCENARIOS = {
    # name: serve arguments
    # The H200 with one probe cycle replayed from the worker document recorded on it.
    "h200-idle": [
        "--nvml-fixture", str(NVML / "h200-idle.json"),
        "--path.sysfs", str(SYSFS / "h200-vm"),
        "--path.rootfs", str(ROOTFS / "lent-vm"),
        "--probe.fixture", str(PROBE / "h200-default.json"),
        "--probe.first-delay", "0",
    ],
    "gb10-spark": [
        "--nvml-fixture", str(NVML / "gb10-idle.json"),
        "--path.sysfs", str(SYSFS / "dgx-spark"),
        "--path.rootfs", str(ROOTFS / "dgx-spark"),
        "--no-probe.enabled",
    ],
    "h200-x8-docker": [
        "--nvml-fixture", str(NVML / "h200-x8.json"),
        "--path.sysfs", str(SYSFS / "h200-vm"),
        "--path.rootfs", str(ROOTFS / "docker"),
        "--no-probe.enabled",
    ],
    # Two H200s over NVLink (derived fixture) with per-process metrics read from a fake /proc.
    "h200-x2-nvlink": [
        "--nvml-fixture", str(NVML / "h200-x2-nvlink.json"),
        "--path.sysfs", str(SYSFS / "h200-vm"),
        "--path.rootfs", str(ROOTFS / "gpu-host"),
        "--process-metrics",
        "--no-probe.enabled",
    ],
    "no-gpu": [
        "--nvml-fixture", str(NVML / "no-nvml.json"),
        "--path.sysfs", str(SYSFS / "dgx-spark"),
        "--path.rootfs", str(ROOTFS / "native"),
    ],
    # A datacenter U.2 NVMe drive (sysfs tree and its public smartctl JSON) and a storage probe's
    # state file recorded on the development VM (tests/fixtures/state/storage-vda).
    "nvme-drives": [
        "--nvml-fixture", str(NVML / "no-nvml.json"),
        "--path.sysfs", str(SYSFS / "nvme-u2"),
        "--path.rootfs", str(ROOTFS / "native"),
        "--nvme.fixture", str(ROOT / "tests" / "fixtures" / "nvme" / "datacenter-u2"),
    ],
}  # fmt: skip
# Files copied into a scenario's state directory before the daemon starts.
STATE = {"nvme-drives": ROOT / "tests" / "fixtures" / "state" / "storage-vda" / "storage.json"}


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def scrape(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, str]:
    state = tmp_path_factory.mktemp("state")
    if request.param in STATE:
        shutil.copy(STATE[request.param], state)
    with running_daemon([*SCENARIOS[request.param], "--state-dir", str(state)]) as base:
        deadline = time.monotonic() + 20
        while True:  # a scenario with a probe: wait until its first cycle is in
            status, content_type, body = http_get(base + "/metrics")
            probing = "--probe.fixture" in SCENARIOS[request.param]
            if not probing or b"sparkdiag_probe_last_success_timestamp_seconds" in body:
                break
            assert time.monotonic() < deadline, "the replayed probe cycle never arrived"
            time.sleep(0.1)
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    return request.param, body.decode()


def test_scrape_matches_golden(scrape: tuple[str, str]) -> None:
    name, body = scrape
    path = GOLDEN / f"{name}.prom"
    actual = normalise(body)
    if os.environ.get("SPARKDIAG_UPDATE_GOLDEN") == "1":
        path.write_text(actual, encoding="utf-8")
    expected = path.read_text(encoding="utf-8")
    assert actual == expected, (
        f"/metrics differs from {path.relative_to(ROOT)}; if the change is intended, "
        "rerun with SPARKDIAG_UPDATE_GOLDEN=1 and review the diff"
    )


def test_promtool_check_metrics(scrape: tuple[str, str], tmp_path: Path) -> None:
    _, body = scrape
    result = subprocess.run(
        [promtool(), "check", "metrics"], input=body, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_http_endpoints() -> None:
    with running_daemon(SCENARIOS["gb10-spark"]) as base:
        status, ctype, body = http_get(base + "/healthz")
        assert (status, ctype) == (200, "text/plain; charset=utf-8")
        assert body.startswith(b"ok: poll ")
        status, ctype, body = http_get(base + "/")
        assert status == 200 and ctype.startswith("text/html")
        assert b'href="metrics"' in body
        status, _, body = http_get(base + "/nope")
        assert status == 404
        status, _, body = http_get(base + "/metrics?x=1")
        assert status == 200 and b"sparkdiag_gpu_up" in body


def test_no_gpu_says_what_it_skipped() -> None:
    """Without NVML the daemon still serves host metrics and says once what it skipped."""
    with running_daemon(SCENARIOS["no-gpu"]) as base:
        _, _, body = http_get(base + "/metrics")
    text = body.decode()
    assert "sparkdiag_nvml_up 0.0" in text
    # no NVML reading; only the count of GPUs on the PCI bus, read from sysfs (a GB10 there),
    # which is what makes SparkdiagGpuMissing fire without NVML
    gpu_lines = [line for line in text.splitlines() if "sparkdiag_gpu_" in line]
    assert {line.split()[0] if line[0] != "#" else line.split()[2] for line in gpu_lines} == {
        "sparkdiag_gpu_pci_devices"
    }
    assert "sparkdiag_gpu_pci_devices 1.0" in text
    assert "sparkdiag_pcie_link_width{" in text
