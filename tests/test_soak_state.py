"""The latest soak per GPU in the state directory: written atomically and merged by GPU, exported
by the daemon's collector (sparkdiag_soak_*), and reported by ``sparkdiag check``."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sparkdiag.check.model import CheckResult
from sparkdiag.check.soak_checks import age, check_soak
from sparkdiag.exporter.registry import render
from sparkdiag.exporter.soak import SoakCollector, soak_collector
from sparkdiag.snapshot import Snapshot
from sparkdiag.soak.state import (
    FILENAME,
    GpuState,
    SoakState,
    SoakStateError,
    StateReport,
    inspect_state,
    read_state,
    state_path,
    write_state,
)
from sparkdiag.statedir import LOCK_NAME
from tests.support import NVML, ROOTFS, SYSFS, http_get, promtool, running_daemon, sparkdiag_cmd
from tests.support.check import context, poll
from tests.support.soak import DECODE, failed, fell, gpu_state, held

H200_UUID = "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"  # tests/fixtures/nvml/h200-idle.json


# -- the file -------------------------------------------------------------------------------------


def test_write_merges_by_gpu_and_reads_back(tmp_path: Path) -> None:
    path = state_path(tmp_path / "state")
    assert path.name == FILENAME and read_state(path) is None
    write_state(path, [gpu_state("0", "GPU-a", kernels=[held()]), gpu_state("1", "GPU-b")])
    # a later soak of GPU 1 only replaces GPU 1's entry; GPU 0's stays
    write_state(path, [gpu_state("1", "GPU-b", finished_at=1.8e9, kernels=[fell()])])
    state = read_state(path)
    assert state is not None
    assert [(g.gpu, g.finished_at) for g in state.gpus] == [("0", 1.7e9), ("1", 1.8e9)]
    assert state.gpus[0].kernels == (held(),)
    assert state.gpus[1].degraded == (fell(),)
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    # no temporary file left; the directory's lock file stays (statedir.updating)
    assert sorted(p.name for p in path.parent.iterdir()) == [LOCK_NAME, FILENAME]


def test_a_damaged_file_is_an_error_naming_it_and_is_replaced_by_the_next_soak(
    tmp_path: Path,
) -> None:
    path = tmp_path / FILENAME
    path.write_text("{not json")
    with pytest.raises(SoakStateError, match=re.escape(str(path))):
        read_state(path)
    report = inspect_state(tmp_path)
    assert report.state == "unusable" and "damaged" in report.detail
    path.write_text(json.dumps({"schema": "something-else"}))
    assert "not a soak state file" in inspect_state(tmp_path).detail
    write_state(path, [gpu_state()])
    assert inspect_state(tmp_path).state == "ok"


def test_wrong_typed_entries_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    write_state(path, [gpu_state(kernels=[held()])])
    good = json.loads(path.read_text())
    good["gpus"].append({"gpu": 3, "finished_at": "yesterday"})
    good["gpus"][0]["kernels"].append({"dtype": None})
    good["gpus"][0]["max_celsius"] = "hot"
    path.write_text(json.dumps(good))
    state = read_state(path)
    assert state is not None and len(state.gpus) == 1
    assert state.gpus[0].kernels == (held(),) and state.gpus[0].max_celsius is None


def test_write_fails_with_one_line_when_the_directory_cannot_be_made(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SoakStateError, match="file"):
        write_state(blocker / FILENAME, [gpu_state()])


# -- the collector --------------------------------------------------------------------------------


def registry_for(collector: SoakCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    return registry


def test_collector_exports_the_latest_verdicts(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    collector = SoakCollector(path)
    registry = registry_for(collector)
    assert (
        registry.get_sample_value(
            "sparkdiag_soak_last_timestamp_seconds", {"gpu": "0", "uuid": "GPU-a"}
        )
        is None
    )
    write_state(path, [gpu_state("0", "GPU-a", kernels=[held(), fell()], max_celsius=91.0)])
    gpu = {"gpu": "0", "uuid": "GPU-a"}
    bf16 = {**gpu, "dtype": "bf16", "shape": DECODE}
    int4 = {**gpu, "dtype": "int4", "shape": DECODE}
    value = registry.get_sample_value
    assert value("sparkdiag_soak_last_timestamp_seconds", gpu) == 1.7e9
    assert value("sparkdiag_soak_duration_seconds", gpu) == 300.0
    assert value("sparkdiag_soak_info", {**gpu, "stopped": "completed", "sensor": "memory"}) == 1
    assert value("sparkdiag_soak_max_celsius", {**gpu, "sensor": "memory"}) == 91.0
    assert value("sparkdiag_soak_cold_tflops", bf16) == 4.0
    assert value("sparkdiag_soak_hottest_tflops", bf16) == 3.9
    assert value("sparkdiag_soak_hottest_ratio", bf16) == pytest.approx(3.9 / 4.0)
    assert value("sparkdiag_soak_lowest_ratio", bf16) == 0.97
    assert value("sparkdiag_soak_degraded", bf16) == 0.0
    assert value("sparkdiag_soak_fell_celsius", {**bf16, "sensor": "memory"}) is None
    assert value("sparkdiag_soak_degraded", int4) == 1.0
    assert value("sparkdiag_soak_fell_celsius", {**int4, "sensor": "memory"}) == 87.0
    assert value("sparkdiag_soak_failed", bf16) == 0.0 and value("sparkdiag_soak_failed", int4) == 0
    # a kernel found wrong under load: failed, and none of the throughput series
    write_state(path, [gpu_state("0", "GPU-a", kernels=[held(), failed()])])
    fp8 = {**gpu, "dtype": "fp8", "shape": DECODE}
    assert value("sparkdiag_soak_failed", fp8) == 1.0
    assert value("sparkdiag_soak_failed", bf16) == 0.0
    assert value("sparkdiag_soak_degraded", fp8) is None
    assert value("sparkdiag_soak_cold_tflops", fp8) is None
    # a new soak is picked up at the next scrape; a removed file exports nothing
    write_state(path, [gpu_state("0", "GPU-a", finished_at=1.9e9, kernels=[held("int4")])])
    assert value("sparkdiag_soak_last_timestamp_seconds", gpu) == 1.9e9
    assert value("sparkdiag_soak_degraded", int4) == 0.0
    path.unlink()
    assert value("sparkdiag_soak_last_timestamp_seconds", gpu) is None


def test_collector_skips_a_damaged_file_and_a_missing_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / FILENAME
    path.write_text("[]")
    assert list(registry_for(SoakCollector(path)).collect()) == []
    for name in ("STATE_DIRECTORY", "XDG_STATE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("sparkdiag.statedir.pwd.getpwuid", _no_password_entry)
    assert soak_collector(None).path is None


def _no_password_entry(uid: int) -> None:
    raise KeyError(uid)


def test_the_daemon_serves_the_soak_verdicts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    write_state(state / FILENAME, [gpu_state("0", H200_UUID, kernels=[held(), fell()])])
    args = ["--nvml-fixture", str(NVML / "h200-idle.json"), "--path.sysfs", str(SYSFS / "h200-vm"),
            "--path.rootfs", str(ROOTFS / "native"), "--no-probe.enabled",
            "--state-dir", str(state)]  # fmt: skip
    with running_daemon(args) as base:
        status, _, body = http_get(base + "/metrics")
    assert status == 200
    text = body.decode()
    labels = f'dtype="int4",gpu="0",shape="{DECODE}",uuid="{H200_UUID}"'
    assert f"sparkdiag_soak_degraded{{{labels}}} 1.0" in text
    assert 'sparkdiag_soak_info{gpu="0",sensor="memory",stopped="completed"' in text
    lint = subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert "sparkdiag_soak" not in lint.stdout + lint.stderr, lint.stdout + lint.stderr


def test_a_cpu_test_soak_is_not_exported_as_a_gpu(tmp_path: Path) -> None:
    """A --device cpu soak measured a CPU's noise: the daemon serves no gpu="cpu" series (as
    dump, which reads no soak), even from an old record whose CPU kernels "fell"."""
    path = tmp_path / FILENAME
    cpu = gpu_state("cpu", "", kernels=[held(), fell()], sensor=None, max_celsius=None)
    write_state(path, [cpu, gpu_state("0", H200_UUID, kernels=[held()])])
    text = render(registry_for(SoakCollector(path))).decode()
    assert 'gpu="cpu"' not in text
    assert (
        f'sparkdiag_soak_info{{gpu="0",sensor="memory",stopped="completed",uuid="{H200_UUID}"}}'
        in (text)
    )
    path.unlink()
    write_state(path, [cpu])  # a machine without a GPU: no soak sample at all
    samples = [
        line
        for line in render(registry_for(SoakCollector(path))).decode().splitlines()
        if line.startswith("sparkdiag_soak_")
    ]
    assert samples == []


# -- the check ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h200() -> Snapshot:
    return poll(NVML / "h200-idle.json")


def soak_check(snapshot: Snapshot, report: StateReport) -> list[CheckResult]:
    snap = replace(snapshot, timestamp=1.7e9 + 3 * 3600)
    return check_soak(context(snap, soak=report))


def ok(*gpus: GpuState) -> StateReport:
    return StateReport("ok", Path("/state/soak.json"), "", SoakState(gpus))


def test_check_passes_when_every_kernel_held(h200: Snapshot) -> None:
    uuid = h200.gpus[0].identity.uuid
    (result,) = soak_check(
        h200, ok(gpu_state("0", uuid, kernels=[held("bf16"), held("int4", 0.95)]))
    )
    assert result.status == "pass" and result.gpu == "0"
    assert result.finding == (
        "soak 3 h ago (completed after 300 s, memory up to 61 °C): 2 kernels held 0.9 of cold "
        f"(lowest 0.95, int4 {DECODE})"
    )
    assert result.data["age_seconds"] == 3 * 3600


def test_check_warns_when_a_kernel_fell(h200: Snapshot) -> None:
    uuid = h200.gpus[0].identity.uuid
    (result,) = soak_check(h200, ok(gpu_state("0", uuid, kernels=[held(), fell()])))
    assert result.status == "warn"
    assert f"int4 {DECODE} fell to 0.84 of cold at 87 °C memory" in result.finding
    assert result.finding.startswith("soak 3 h ago") and "cooling" in result.action
    assert result.data["degraded"] == [f"int4 {DECODE}"]


def test_check_fails_when_a_kernel_gave_a_wrong_result(h200: Snapshot) -> None:
    """A soak whose window found a wrong result: it read "unsupported" and passed (found in a
    review); it fails before a fall warns."""
    uuid = h200.gpus[0].identity.uuid
    wrong = replace(held("bf16"), status="error")
    (result,) = soak_check(h200, ok(gpu_state("0", uuid, kernels=[fell(), wrong])))
    assert result.status == "fail"
    assert result.finding.endswith(f": wrong or failed results: bf16 {DECODE}")
    assert "XID" in result.action and result.data["failed"] == [f"bf16 {DECODE}"]


@pytest.mark.parametrize(
    ("entry", "status", "needle"),
    [
        (
            gpu_state(stopped="error", reason="CUDA out of memory"),
            "warn",
            "soak 3 h ago failed: CUDA out of memory",
        ),
        (
            gpu_state(
                stopped="hw_thermal_slowdown", reason="clock event reasons 0x40", kernels=[held()]
            ),
            "warn",
            "stopped by a hardware slowdown",
        ),
        (
            gpu_state(stopped="interrupted", reason="SIGINT received"),
            "skip",
            "measured nothing to judge (SIGINT received)",
        ),
        (
            # held for the seconds it ran: no pass (it was one, and replaced a fall's record)
            gpu_state(stopped="interrupted", reason="SIGINT received", kernels=[held()]),
            "skip",
            "interrupted before the GPU was hot for long; no kernel fell so far",
        ),
        (
            gpu_state(stopped="interrupted", reason="SIGINT received", kernels=[fell()]),
            "warn",
            "fell to 0.84 of cold",
        ),
        (gpu_state(stopped="threshold", kernels=[held()]), "pass", "(threshold after 300 s"),
        (gpu_state(sensor="gpu", kernels=[held()]), "pass", "GPU up to 61 °C"),
    ],
)
def test_check_other_outcomes(h200: Snapshot, entry: GpuState, status: str, needle: str) -> None:
    (result,) = soak_check(h200, ok(replace(entry, uuid=H200_UUID)))
    assert result.status == status and needle in result.finding, result.finding


def test_check_skips_without_a_soak_and_warns_on_a_damaged_file(
    h200: Snapshot, tmp_path: Path
) -> None:
    (result,) = soak_check(h200, inspect_state(tmp_path))
    assert result.status == "skip" and "no soak has been run yet" in result.finding
    assert "sparkdiag soak" in result.action
    (tmp_path / FILENAME).write_text("garbage")
    (result,) = soak_check(h200, inspect_state(tmp_path))
    assert result.status == "warn" and "damaged" in result.finding


def test_check_names_gpus_without_a_soak_and_cpu_test_runs(h200: Snapshot) -> None:
    """A --device cpu record is a smoke test that ran: a skip row, never a GPU's, and never the
    cooling advice, even from an old record whose CPU kernels "fell"."""
    entry = gpu_state("cpu", "", kernels=[held(), fell()], sensor=None, max_celsius=None)
    cpu, gpu0 = soak_check(h200, ok(entry))
    assert cpu.gpu is None and cpu.status == "skip" and cpu.action == ""
    assert cpu.finding == (
        "CPU test soak 3 h ago (completed after 300 s): 2 kernels ran; a CPU soak (--device cpu) "
        "is a smoke test with no thermal verdict"
    )
    assert "cooling" not in cpu.finding + cpu.action and cpu.data["thermal"] is False
    assert gpu0.gpu == "0" and gpu0.status == "skip" and gpu0.finding == "no soak of this GPU yet"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5, "just now"),
        (-30, "just now"),
        (600, "10 min ago"),
        (5 * 3600, "5 h ago"),
        (3 * 86400, "3 days ago"),
    ],
)
def test_age(seconds: float, text: str) -> None:
    assert age(seconds) == text


def test_check_command_reads_the_state_directory(tmp_path: Path) -> None:
    state = tmp_path / "state"
    write_state(state / FILENAME, [gpu_state("0", H200_UUID, kernels=[fell()])])
    result = subprocess.run(
        sparkdiag_cmd(
            "check",
            "--quick",
            "--json",
            "--nvml-fixture",
            str(NVML / "h200-idle.json"),
            "--state-dir",
            str(state),
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = json.loads(result.stdout)
    (soak,) = [r for r in report["checks"] if r["name"] == "soak"]
    assert soak["status"] == "warn" and "fell to 0.84 of cold" in soak["finding"]


def test_an_interrupted_soak_does_not_replace_one_that_ran_to_its_end(tmp_path: Path) -> None:
    """A Ctrl-C after seconds replaced a GPU's last finished soak, so one that saw a kernel
    fall was forgotten by check and the metrics. It is kept; an interrupted soak that saw a
    fall itself, or one over an interrupted one, is recorded."""
    from sparkdiag.commands.soak import _not_over_a_finished_soak

    path = tmp_path / "soak.json"
    finished = gpu_state("0", H200_UUID, kernels=[held(), fell()])
    write_state(path, [finished])
    stopped = gpu_state("0", H200_UUID, stopped="interrupted", kernels=[held()])
    assert _not_over_a_finished_soak(path, [stopped]) == []
    fallen = gpu_state("0", H200_UUID, stopped="interrupted", kernels=[fell()])
    assert _not_over_a_finished_soak(path, [fallen]) == [fallen]
    write_state(path, [stopped])
    again = replace(stopped, finished_at=1.8e9)
    assert _not_over_a_finished_soak(path, [again]) == [again]
    other = gpu_state("1", "GPU-other", stopped="interrupted", kernels=[held()])
    assert _not_over_a_finished_soak(path, [other]) == [other]
