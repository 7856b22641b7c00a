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
    http_get,
    machine_args,
    normalise,
    promtool,
    running_daemon,
)

GOLDEN = ROOT / "tests" / "golden"
SOAK = ROOT / "tests" / "fixtures" / "soak"


def on(nvml: str, sysfs: str, rootfs: str) -> list[str]:
    """The flags that put the daemon on a recorded machine: its NVML fixture, sysfs and root."""
    return ["--nvml-fixture", str(NVML / f"{nvml}.json"), *machine_args(sysfs, rootfs)]


STATE_DIR = "<the scenario's state directory>"  # replaced by it in a scenario's arguments
PROBE_ONCE = ["--probe.fixture", str(PROBE / "h200-default.json"), "--probe.first-delay", "0"]
SCENARIOS = {
    # name: serve arguments
    # The H200 with one probe cycle replayed from the worker document recorded on it.
    "h200-idle": [*on("h200-idle", "h200-vm", "lent-vm"), *PROBE_ONCE],
    "gb10-spark": [*on("gb10-idle", "dgx-spark", "dgx-spark"), "--no-probe.enabled"],
    # A GB10 whose page cache holds 62 of 121.7 GiB, vLLM's engine holding the GPU, and torch-,
    # vLLM- (vllm#50925, #40923), flash-attn- and cuBLAS-like libraries installed
    # (tests/fixtures/rootfs/README.txt).
    "gb10-vllm": [*on("gb10-idle", "dgx-spark", "dgx-spark-vllm"), "--no-probe.enabled"],
    "h200-x8-docker": [*on("h200-x8", "h200-vm", "docker"), "--no-probe.enabled"],
    # Two H200s over NVLink (derived fixture) with per-process metrics read from a fake /proc.
    "h200-x2-nvlink": [
        *on("h200-x2-nvlink", "h200-vm", "gpu-host"),
        "--process-metrics",
        "--no-probe.enabled",
    ],
    "no-gpu": on("no-nvml", "dgx-spark", "native"),
    # Every metric the daemon exports from NVML and sysfs, with every option that adds series:
    # the complete fixture (every query answered), dcgm-exporter's names, per-process series, a
    # probe cycle on each GPU (and so their peer ratios) and the soak state of a recorded soak.
    # tests/test_metrics_doc.py holds this scrape to everything the exporter declares.
    "h200-x2-complete": [
        *on("h200-x2-complete", "h200-vm", "gpu-host"),
        "--process-metrics",
        "--compat.dcgm",
        *PROBE_ONCE,
        "--probe.when=always",  # its GPUs run compute processes: probe them all the same
    ],
    # A datacenter U.2 NVMe drive (sysfs tree and its public smartctl JSON) and a storage probe's
    # state file recorded on the development VM (tests/fixtures/state/storage-vda).
    "nvme-drives": [
        *on("no-nvml", "nvme-u2", "native"),
        "--nvme.fixture",
        str(ROOT / "tests" / "fixtures" / "nvme" / "datacenter-u2"),
    ],
    # A client M.2 drive read through nvme-cli (tests/fixtures/nvme/README.md: nvme-cli#556's
    # log in nvme-cli's JSON keys), whose log carries the thermal management counters that
    # smartctl leaves out while they are 0; read as the systemd unit reads it, from the file
    # the root timer's `sparkdiag nvme-log` leaves (--nvme.log-dir), with its age.
    "nvme-client": [
        *on("no-nvml", "nvme-client-m2", "native"),
        "--nvme.log-dir",
        STATE_DIR,
    ],
}
# Files put in a scenario's state directory before the daemon starts.
STATE_FILES = {
    "h200-x2-complete": {"soak.json": SOAK / "h200-soak-state.json"},
    "nvme-drives": {
        "storage.json": ROOT / "tests" / "fixtures" / "state" / "storage-vda" / "storage.json"
    },
    "nvme-client": {
        "nvme0.nvme-cli.json": ROOT
        / "tests"
        / "fixtures"
        / "nvme"
        / "nvme-cli"
        / "nvme0.nvme-cli.json"
    },
}
# Probe cycles a scenario waits for (one per GPU) before it is scraped.
PROBED_GPUS = {"h200-idle": 1, "h200-x2-complete": 2}
PROBE_DONE = b"\nsparkdiag_probe_last_success_timestamp_seconds{"
# dcgm-exporter's Hostname label is $NODE_NAME where it is set: one name for every machine.
NODE_NAME = "golden-node"


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def scrape(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, str]:
    state = tmp_path_factory.mktemp("state")
    for name, source in STATE_FILES.get(request.param, {}).items():
        shutil.copyfile(source, state / name)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NODE_NAME", NODE_NAME)
        args = [str(state) if arg == STATE_DIR else arg for arg in SCENARIOS[request.param]]
        with running_daemon([*args, "--state-dir", str(state)]) as base:
            deadline = time.monotonic() + 30
            # wait until the CUDA library scan (its own thread) and, in a scenario with a probe,
            # each GPU's first cycle are in
            while True:
                status, content_type, body = http_get(base + "/metrics")
                scanned = b"sparkdiag_cuda_library_scan_timestamp_seconds" in body
                if scanned and body.count(PROBE_DONE) >= PROBED_GPUS.get(request.param, 0):
                    break
                assert time.monotonic() < deadline, "the library scan or probe cycles never came"
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
    # dcgm-exporter's own names (DCGM_FI_DEV_PCIE_REPLAY_COUNTER) and camelCase labels
    # (modelName, UUID, Hostname) are kept exactly, so that its dashboards work: promtool's lint
    # of those is expected; any other problem fails
    output = (result.stdout + result.stderr).splitlines()
    problems = [line for line in output if line.strip() and not line.startswith("DCGM_FI_")]
    assert not problems and result.returncode in (0, 3), result.stdout + result.stderr


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
