"""The storage probe's path into the GPU, sparkdiag's side: the measuring program hands its
nameless test file to the worker by descriptor (a stand-in worker here, run for real), the file
is gone however the two end (the worker killed with the probe), and the GPU figures are judged,
kept, exported, written and shown, a GPUDirect read in a compatibility mode labelled so and never
exported as ``path="gds"``. The real worker's side is tests/test_probe_worker_storage.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sparkdiag.baseline.store import open_store
from sparkdiag.config import build_settings
from sparkdiag.exporter.registry import render as render_metrics
from sparkdiag.exporter.storage import StorageCollector
from sparkdiag.probe.worker.contract import parse_args
from sparkdiag.storage import measure
from sparkdiag.storage.evaluate import evaluate, keys
from sparkdiag.storage.model import parse_document
from sparkdiag.storage.render import text
from sparkdiag.storage.run import GpuRequest, ProbeRequest, StorageProbeError, run_probe
from sparkdiag.storage.session import request_for
from sparkdiag.storage.state import read_state, record_report
from sparkdiag.storage.target import locate
from tests.support import run_cli, wait_dead, without_gpu

MIB = 1 << 20
SMALL = {"size": 16 * MIB, "seconds": 2.0, "threads": 2, "random_ops": 100}

# A stand-in for the worker's storage mode: what it was handed, and a document like the
# worker's (pinned and gpu measured, gds in cuFile's compatibility mode).
STAND_IN = """
import json, os, sys, time
argv = sys.argv[1:]
path = argv[argv.index("--storage-read") + 1]
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
size = os.fstat(fd).st_size
out = os.environ["STAND_IN_OUT"]
with open(out, "w") as fh:
    json.dump({"pid": os.getpid(), "path": path, "size": size, "argv": argv}, fh)
if os.environ.get("STAND_IN_SLEEP"):
    time.sleep(600)
stage = lambda p, **kw: {"path": p, "status": "ok", "reason": None, "bytes": size,
                         "seconds": 0.5, "mode": None, "mode_reason": None, "checked": True,
                         "kvikio": None, **kw}
print(json.dumps({"schema": "sparkdiag-probe/2", "status": "ok", "reason": None,
                  "software": {"device": "cuda:0", "gpu_name": "Stand-in", "torch": "2.11"},
                  "storage": {"file": path, "size": size, "pages": "huge", "stages": [
                      stage("pinned"), stage("gpu"),
                      stage("gds", mode="compat", mode_reason="cuFile without nvidia-fs",
                            kvikio="26.10.0")]}}))
"""


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[GpuRequest, Path]:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    out = tmp_path / "stand_in.json"
    monkeypatch.setenv("STAND_IN_OUT", str(out))
    return GpuRequest(0, seconds=1.0, python=(sys.executable, str(script))), out


def test_the_worker_reads_the_very_file_the_probe_wrote(
    tmp_path: Path, stand_in: tuple[GpuRequest, Path]
) -> None:
    gpu, seen = stand_in
    measured = tmp_path / "measured"
    measured.mkdir()
    doc = run_probe(ProbeRequest(measured, gpu=gpu, **SMALL))  # type: ignore[arg-type]
    handed = json.loads(seen.read_text())
    assert handed["path"].startswith("/proc/self/fd/") and handed["size"] == 16 * MIB
    worker = parse_args(handed["argv"][1:])  # the worker's own parser reads what it was given
    assert worker.device == "cuda:0" and worker.storage_threads == 2
    assert worker.storage_block == 1 << 20 and worker.storage_seconds == 1.0
    assert doc.gpu is not None and doc.gpu.status == "ok" and doc.gpu.gpu_name == "Stand-in"
    assert [s.path for s in doc.gpu.stages] == ["pinned", "gpu", "gds"]
    gpu_read, gds = doc.figure("read", "gpu"), doc.figure("read", "gds")
    assert gpu_read is not None and gpu_read.bytes_per_second == 32 * MIB
    assert gds is not None and gds.mode == "compat"
    assert doc.read_bytes >= 3 * 16 * MIB + 16 * MIB  # the host read and the three stages
    assert list(measured.iterdir()) == []


def holders(folder: Path) -> list[str]:
    """Descriptors of any process on a (deleted) file in ``folder``."""
    found = []
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(folder) + "/"):
            found.append(f"{fd} -> {target}")
    return found


def test_a_killed_probe_takes_the_worker_and_the_file_with_it(
    tmp_path: Path, stand_in: tuple[GpuRequest, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu, seen = stand_in
    monkeypatch.setenv("STAND_IN_SLEEP", "1")
    measured = tmp_path / "measured"
    measured.mkdir()
    # 2 s: the whole probe with a stand-in that answers takes 0.2 s here (the test above), and
    # the stand-in had been handed the file at 0.16 s
    with pytest.raises(StorageProbeError, match="did not finish within 2 s"):
        run_probe(ProbeRequest(measured, gpu=gpu, **SMALL), timeout=2)  # type: ignore[arg-type]
    worker = json.loads(seen.read_text())["pid"]
    # ended, a zombie at most (it holds no file): orphaned, it is init's to reap, which the PID 1
    # of some containers does a second or two later
    assert wait_dead([worker], 5) == [], "the worker outlived the probe"
    assert holders(measured) == [] and list(measured.iterdir()) == []


def test_a_worker_that_hangs_is_killed_by_the_program_at_its_own_timeout(
    tmp_path: Path, stand_in: tuple[GpuRequest, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu, _seen = stand_in
    monkeypatch.setenv("STAND_IN_SLEEP", "1")
    done = subprocess.run(
        [sys.executable, measure.__file__, str(tmp_path), "--size", str(8 * MIB), "--threads",
         "2", "--seconds", "1", "--gpu-worker", json.dumps(gpu.command(1 << 20, 2)),
         "--gpu-timeout", "1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["status"] == "ok" and doc["write"]["bytes"] == 8 * MIB  # the host figures stand
    assert doc["gpu"] == {
        "status": "error",
        "reason": "the GPU path did not finish within 1 s and was killed",
    }
    assert holders(tmp_path) == []


# -- judged, kept, exported, shown ----------------------------------------------------------------


def measured_document(mode: str = "compat", at: float = 1000.0) -> dict[str, Any]:
    size = 1 << 30

    def stage(path: str, gbps: float, **kw: Any) -> dict[str, Any]:
        return {"path": path, "status": "ok", "reason": None, "bytes": 2 * size,
                "seconds": 2 * size / (gbps * 1e9), "mode": None, "mode_reason": None,
                "checked": True, "kvikio": None, **kw}  # fmt: skip

    return {
        "schema": measure.SCHEMA, "status": "ok", "reason": None, "directory": "/data/ckpt",
        "tmpfile": True, "size": size, "block": 1 << 20, "threads": 8, "pages": "huge",
        "write": {"bytes": size, "seconds": size / 2.5e9},
        "read": {"bytes": 4 * size, "seconds": 4 * size / 2.2e9}, "flush_seconds": 0.001,
        "random_read": {"ops": 1000, "seconds": 0.1, "block": 4096, "p50": 4e-5, "p99": 8e-5,
                        "max": 1e-3, "sum": 0.05},
        "bytes_written": size, "started_at": at - 10, "finished_at": at, "notes": [],
        "gpu": {"status": "ok", "reason": None,
                "software": {"device": "cuda:0", "gpu_name": "NVIDIA H200", "torch": "2.11.0"},
                "storage": {"pages": "huge", "stages": [
                    stage("pinned", 2.1), stage("gpu", 2.0),
                    stage("gds", 1.2, mode=mode, mode_reason="cuFile without the nvidia-fs "
                          "kernel driver runs in its own compatibility mode", kvikio="26.10.0"),
                ]}},
    }  # fmt: skip


def test_gpu_figures_are_judged_kept_and_exported_but_a_compat_gds_read_is_not_gds(
    tmp_path: Path,
) -> None:
    doc = parse_document(measured_document("compat"))
    target = locate(tmp_path)
    methods = {k: key.method for k, key in keys(target, doc).items()}
    assert methods == {
        ("read", "host"): "o_direct:1048576x8", ("write", "host"): "o_direct:1048576x8",
        ("read", "gpu"): "pinned:1048576x8", ("read", "gds"): "cufile-compat:1048576x8",
    }  # fmt: skip
    store = open_store(tmp_path, create=True)
    try:
        report = evaluate(target, doc, store, record=True)
    finally:
        store.close()
    assert {(f.throughput.path, f.throughput.mode) for f in report.figures} == {
        ("host", None), ("gpu", None), ("gds", "compat")}  # fmt: skip
    shown = report.as_json()
    assert shown["gpu"]["stages"][2]["mode"] == "compat" and shown["pages"] == "huge"
    assert {f["path"]: f["mode"] for f in shown["figures"]}["gds"] == "compat"
    state = tmp_path / "storage.json"
    record_report(state, report)
    (probe,) = read_state(state) or ()
    assert {(f.direction, f.path) for f in probe.figures} == {
        ("read", "host"), ("write", "host"), ("read", "gpu")}  # fmt: skip
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StorageCollector(state))
    exported = render_metrics(registry).decode()
    assert 'path="gpu"' in exported and 'path="gds"' not in exported
    shown_text = text(report, 80)
    assert "read by GDS (compat)" in shown_text and "read to GPU" in shown_text
    assert "compatibility mode, not GPUDirect Storage" in shown_text
    assert "read, pinned" in shown_text
    assert all(len(line) <= 80 for line in shown_text.splitlines()), shown_text


def test_a_gds_read_by_gpudirect_is_exported_as_gds(tmp_path: Path) -> None:
    doc = parse_document(measured_document("gds"))
    report = evaluate(locate(tmp_path), doc, None, record=False)
    state = tmp_path / "storage.json"
    record_report(state, report)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StorageCollector(state))
    assert 'path="gds"' in render_metrics(registry).decode()
    assert "read by GDS  " in text(report, 80) or "read by GDS " in text(report, 80)
    assert "(compat)" not in text(report, 80)


def test_what_the_gpu_path_skipped_is_said() -> None:
    raw = measured_document()
    raw["gpu"] = {"status": "unsupported", "reason": "cuda:0 is not available to torch 2.11.0+cpu",
                  "software": {"device": "cuda:0"}, "storage": None}  # fmt: skip
    doc = parse_document(raw)
    assert doc.figure("read", "gpu") is None and doc.gpu is not None
    report = evaluate(locate(Path("/")), doc, None, record=False)
    assert "path into the GPU skipped: cuda:0 is not available" in text(report, 80)
    raw["gpu"] = {"status": "error", "reason": "the GPU path did not finish within 67 s and was "
                  "killed"}  # fmt: skip
    report = evaluate(locate(Path("/")), parse_document(raw), None, record=False)
    assert "path into the GPU failed: the GPU path did not finish" in text(report, 80)


def test_the_exit_status_follows_the_gpu_path() -> None:
    """An error is 3, nothing measured 1, data that arrived wrong (its check failed) 3: it
    exited 0 while the text said the data was WRONG (the review of the exit-status change)."""
    from dataclasses import replace

    from sparkdiag.commands.storage import exit_status
    from sparkdiag.storage.model import GpuRun, GpuStage

    report = evaluate(locate(Path("/")), parse_document(measured_document()), None, record=False)
    ok = GpuStage("gpu", "ok", bytes=1 << 20, seconds=0.1, checked=True)
    runs = {
        0: GpuRun("ok", None, stages=(ok,)),
        1: GpuRun("unsupported", "no GPU"),
        3: GpuRun("error", "CUDA error"),
    }
    for status, run in runs.items():
        got = exit_status(replace(report, document=replace(report.document, gpu=run)))
        assert got == status, run
    wrong = GpuRun("ok", None, stages=(replace(ok, checked=False),))
    assert exit_status(replace(report, document=replace(report.document, gpu=wrong))) == 3


def test_the_settings_ask_for_the_gpu_path() -> None:
    given = {"storage_gpu": 1, "storage_duration": 10.0, "probe_python": ("/opt/venv/bin/python",)}
    settings = build_settings(None, given, "storage")
    request = request_for(Path("/data"), settings)
    assert request.gpu == GpuRequest(1, 3.5, True, ("/opt/venv/bin/python",))
    argv = request.argv()
    command = json.loads(argv[argv.index("--gpu-worker") + 1])
    assert command[0] == "/opt/venv/bin/python" and command[1].endswith("probe/worker")
    assert "--storage-read" not in command  # the program adds it with the descriptor
    assert request.timeout == pytest.approx(10 + 15 + 3.5 + 60 + 2)
    assert request_for(Path("/data"), build_settings(None, {}, "storage")).gpu is None


@pytest.mark.worker
@without_gpu
def test_storage_with_a_gpu_on_cpu_torch_measures_the_host_and_says_what_it_skipped(
    tmp_path: Path,
) -> None:
    (tmp_path / "m").mkdir()
    done = run_cli("storage", str(tmp_path / "m"), "--storage.gpu", "0", "--storage.size", "32M",
                   "--storage.duration", "2", "--state-dir", str(tmp_path / "state"), "--json",
                   timeout=120)  # fmt: skip
    doc = json.loads(done.stdout)
    assert {f["path"] for f in doc["figures"]} == {"host"}
    assert doc["gpu"]["status"] in ("unsupported", "error") and doc["gpu"]["reason"]
    # the GPU path measured nothing: 1 (unsupported) or 3 (failed), never 0 (the bad-input
    # review: this test held 0)
    assert done.returncode == (3 if doc["gpu"]["status"] == "error" else 1), done.stderr
    kept = json.loads((tmp_path / "state" / "storage.json").read_text())
    assert {f["path"] for f in kept["mounts"][0]["figures"]} == {"host"}
    assert list((tmp_path / "m").iterdir()) == []


def test_a_gpu_path_whose_worker_cannot_start_fails_the_command(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    done = run_cli("storage", str(tmp_path / "m"), "--storage.gpu", "0", "--storage.size", "32M",
                   "--storage.duration", "2", "--no-record", "--probe.python",
                   str(tmp_path / "no-python"), timeout=120)  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    assert "path into the GPU failed" in " ".join(done.stdout.split())


def test_a_write_that_ran_out_of_time_skips_the_gpu_path_and_exits_by_the_verdict(
    tmp_path: Path, stand_in: tuple[GpuRequest, Path]
) -> None:
    """On a slow drive the write phase ends before the file is whole: the GPU path has nothing
    to read. It was an error ("path into the GPU failed", exit 3) while the verdict said SLOW
    (exit 1); it is skipped, with the reason, and the command exits by the verdict."""
    from dataclasses import replace

    from sparkdiag.commands.storage import exit_status

    gpu, seen = stand_in
    (tmp_path / "m").mkdir()
    done = subprocess.run(
        [sys.executable, measure.__file__, "--size", str(512 * MIB), "--threads", "2",
         "--seconds", "0.02", "--random-ops", "10", "--gpu-worker",
         json.dumps(gpu.command(1 << 20, 2)), "--", str(tmp_path / "m")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    raw = json.loads(done.stdout)
    assert raw["write"]["bytes"] < 512 * MIB, raw["write"]  # the write ran out of time
    why = "the write phase ran out of time before the file was whole: nothing for the GPU path"
    assert raw["gpu"] == {"status": "skipped", "reason": f"{why} to read"}
    assert not seen.exists()  # the worker was not started
    learning = evaluate(locate(tmp_path), parse_document(raw), None, record=False)
    assert learning.verdict == "learning" and exit_status(learning) == 0
    shown = " ".join(text(learning, 80).split())
    assert "path into the GPU skipped: the write phase ran out of time" in shown
    assert "failed" not in shown
    store = open_store(tmp_path / "state", create=True)
    try:
        for at in (1.0, 2.0, 3.0):  # a baseline at the healthy drive's figures
            evaluate(locate(tmp_path), parse_document(measured_document(at=at)), store, True)
        fast = parse_document(measured_document(at=4.0))
        slow_doc = replace(parse_document(raw), throughput=tuple(
            replace(t, seconds=t.seconds * 100) for t in fast.throughput if t.path == "host"
        ), block=fast.block, threads=fast.threads)  # fmt: skip
        slow = evaluate(locate(tmp_path), slow_doc, store, record=False)
    finally:
        store.close()
    assert slow.verdict == "slow" and exit_status(slow) == 1
