"""scripts/device/watch_jobs.py (run on the H200 by the lead) on this machine's CPU with tiny
settings: every job runs alone and watched, the table and files are written, and a failing job
is reported without stopping the others. The framework jobs (scripts/device/framework_jobs.py)
need timm, torchvision, transformers and Lightning: where those are missing (CI) their tests
skip."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.support import ROOT, gpu_here

pytestmark = pytest.mark.worker

SCRIPT = ROOT / "scripts" / "device" / "watch_jobs.py"


def test_jobs_alone_and_watched_on_cpu_with_a_failing_job(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--scale", "tiny", "--seconds", "0.5",
         "--interval", "0.1", "--jobs", "broken,launch", "--pairs", "2", "--pin", "0",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr  # one job failed
    summary = json.loads((out / "watch_jobs.json").read_text())
    broken, launch = summary["rows"]
    assert "this job fails on purpose" in broken["error"]
    assert "overheads" not in broken  # stopped after the failing pair
    assert launch["error"] == ""
    assert launch["alone_per_second"] > 0 and launch["watched_per_second"] > 0
    assert launch["unit"] == "kernels" and len(launch["overheads"]) == 2  # --pairs 2
    assert launch["overhead"] == pytest.approx(sum(launch["overheads"]) / 2)  # their median
    assert summary["pin"] == 0 and summary["pairs"] == 2
    # the job runs on the CPU: NVML sees no GPU here, or one the job never touches
    assert launch["diagnosis"] == ("gpu-unused" if gpu_here() else "no-gpu")
    diagnosis = json.loads((out / "launch.diagnosis.json").read_text())
    assert diagnosis["schema"] == "sparkdiag-watch/1" and diagnosis["exit_status"] == 0
    assert (out / "launch.recording.json").is_file()
    assert (out / "launch.png").read_bytes()[:4] == b"\x89PNG"
    text = (out / "watch_jobs.txt").read_text()
    assert text.splitlines()[0].split()[:6] == [
        "job", "truth", "expected", "diagnosis", "share", "overhead"
    ]  # fmt: skip
    assert "launch" in text and "cpu-bound-launcher" in text
    assert text in result.stdout


def test_each_job_runs_alone_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    for name in ("healthy", "starved", "checkpoint", "fp32"):
        path = tmp_path / f"{name}.json"
        subprocess.run(
            [sys.executable, str(SCRIPT), "job", name, "--seconds", "0.3", "--device", "cpu",
             "--scale", "tiny", "--result", str(path)],
            check=True, timeout=120, cwd=ROOT,
        )  # fmt: skip
        doc = json.loads(path.read_text())
        assert doc["job"] == name and doc["steps"] > 0 and doc["per_second"] > 0


NEEDS = {
    "resnet-loader": ("timm", "torchvision"),
    "sleepy-loop": ("timm",),
    "gpt2-checkpoint": ("transformers", "accelerate"),
    "spin": ("timm",),
    "resnet-fp32": ("timm",),
    "resnet": ("timm",),
    "lightning-gpt2": ("lightning", "transformers"),
    "cotenant": ("timm",),
    "gpt2-host-sync": ("transformers",),
    "gpt2-tokenize": ("transformers", "tokenizers"),
    "resnet18-pageable": ("timm",),
    "launch-bound": (),
    "lightning-checkpoint": ("lightning", "transformers"),
    "compile-recompile": (),
    "vit": ("timm",),
}
UNITS = {"launch-bound": "matmuls", "compile-recompile": "tokens", "lightning-checkpoint": "tokens"}


def _need(job: str) -> None:
    pytest.importorskip("torch")
    for module in NEEDS[job]:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{job} needs {module}")


@pytest.mark.parametrize("clean", [False, True])
@pytest.mark.parametrize("job", sorted(NEEDS))
def test_each_framework_job_runs_with_and_without_its_defect(
    job: str, clean: bool, tmp_path: Path
) -> None:
    _need(job)
    path = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "job", job, "--seconds", "0.3", "--device", "cpu",
         "--scale", "tiny", "--result", str(path), *(["--clean"] if clean else [])],
        check=True, timeout=240, cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.stdout == ""  # under watch, stdout is watch's JSON: the frameworks print elsewhere
    doc = json.loads(path.read_text())
    assert doc["job"] == job and doc["clean"] is clean
    assert doc["steps"] > 0 and doc["per_second"] > 0
    assert doc["unit"] == UNITS.get(job, "tokens" if "gpt2" in job else "images")
    if job == "gpt2-checkpoint":
        assert doc["save_steps"] == (None if clean else 15)
    if job == "sleepy-loop":
        assert (doc["sleep_seconds"] == 0) is clean
    if job == "lightning-checkpoint":
        assert (doc["saves"] == 0) is clean
    if job == "compile-recompile" and not clean:
        assert doc["lengths"] >= 1


def test_a_job_with_a_defect_runs_alone_without_it_and_the_truth_is_its_throughput(
    tmp_path: Path,
) -> None:
    """spin alone is clean, watched it spins: truth = 1 - watched/alone; packed in one archive.
    (Its value is not asserted: on this shared 2-core machine the two runs differ by more.)"""
    _need("spin")
    out, archive = tmp_path / "out", tmp_path / "res" / "watch_jobs.tgz"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--scale", "tiny", "--seconds", "2.5",
         "--interval", "0.2", "--jobs", "spin", "--out", str(out), "--archive", str(archive)],
        capture_output=True, text=True, timeout=400, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (spin,) = json.loads((out / "watch_jobs.json").read_text())["rows"]
    alone = json.loads((out / "spin.alone.json").read_text())
    watched = json.loads((out / "spin.watched.json").read_text())
    assert alone["clean"] and alone["spins"] == 0 and watched["spins"] >= 1
    assert spin["truth"] == pytest.approx(1 - watched["per_second"] / alone["per_second"])
    assert "overhead" not in spin  # the two runs are not the same job
    with tarfile.open(archive) as tar:
        packed = set(tar.getnames())
    assert {"watch_jobs.json", "watch_jobs.txt", "spin.recording.json"} <= packed


def test_a_run_past_its_time_is_killed_with_its_whole_process_group(tmp_path: Path) -> None:
    """A hung job under watch: at the timeout the job (a grandchild) dies too, not only watch."""
    sys.path.insert(0, str(SCRIPT.parent))
    import watch_jobs

    marker = tmp_path / "pid"
    child = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    with (tmp_path / "err").open("w") as err, pytest.raises(subprocess.TimeoutExpired):
        watch_jobs.run_group([sys.executable, "-c", parent], err, timeout=3)
    pid = int(marker.read_text())
    for _ in range(50):
        if (
            not Path(f"/proc/{pid}").exists()
            or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        ):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the grandchild {pid} outlived the timeout")


def test_every_marked_defect_line_is_in_the_jobs_file() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    import loop_jobs

    lines = (SCRIPT.parent / "loop_jobs.py").read_text().splitlines()
    for _verdict, mark in loop_jobs.EXPECTED.values():
        if mark is not None:
            assert lines[loop_jobs.marked(mark) - 1].rstrip().endswith(f"# watch: {mark}")


def test_the_loop_jobs_under_watch_name_their_lines_and_write_expectations(
    tmp_path: Path,
) -> None:
    """Two torch-only jobs of issue 28 in a CPU dry run (the GPU a scripted fixture): each gets
    its verdict and the marked line of loop_jobs.py, and watch_expected.json lists them for the
    replay test, with no share expected (the fixture's GPU is not the job's)."""
    pytest.importorskip("torch")
    from sparkdiag.sources.host import pyspy

    if pyspy.find() is None:
        pytest.skip("py-spy is not installed here")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--scale", "tiny", "--seconds", "2",
         "--interval", "0.2", "--jobs", "launch-bound,compile-recompile", "--nvml-fixture",
         str(ROOT / "tests/fixtures/nvml/watch-starved.json"), "--out", str(out)],
        capture_output=True, text=True, timeout=400, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((out / "watch_jobs.json").read_text())["rows"]
    for r in rows:
        assert r["verdict_ok"] and r["line_ok"], r
        # the loss against the clean run is computed; its sign is not asserted: 2 s runs of a
        # tiny job on a CPU the rest of the suite shares are not a measurement (it came out
        # negative once beside a full CI run, and positive alone)
        assert isinstance(r["truth"], float), r
    expected = json.loads((out / "watch_expected.json").read_text())
    assert [j["job"] for j in expected["jobs"]] == ["launch-bound", "compile-recompile"]
    assert all(j["truth"] is None and j["line"]["file"] == "loop_jobs.py" for j in expected["jobs"])
    assert "right: verdict 2/2, line 2/2" in result.stdout


def test_the_rerun_mode_runs_each_pair_in_one_process_within_its_deadline(tmp_path: Path) -> None:
    """watch_stacks.sh rerun in its dry mode (DRY=1: CPU, tiny, a scripted GPU), on the one
    job of its list this machine can run (compile-recompile: torch only), watched beside a
    neighbour as the co-tenant is: its run without the defect and its watched run share one
    process (watch --pid), the neighbour is gone after, everything is in ONE archive under
    $OUT/watch and the table is printed last."""
    pytest.importorskip("torch")
    from sparkdiag.sources.host import pyspy

    if pyspy.find() is None:
        pytest.skip("py-spy is not installed here")
    out = tmp_path / "OUT"
    bin_dir = str(Path(sys.executable).parent)
    result = subprocess.run(
        ["bash", "scripts/device/watch_stacks.sh", "rerun", "--jobs", "compile-recompile",
         "--neighbour", "compile-recompile", "--out", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=200, cwd=ROOT,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "DRY": "1", "OUT": str(out),
             "HOME": str(tmp_path)},
    )  # fmt: skip
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "rc=0", result.stdout[-3000:] + result.stderr[-2000:]
    # the neighbour is not seen on the scripted GPU: only the verdict and the line are judged
    assert lines[-4].startswith("right: verdict 1/1, line 1/1"), lines[-6:]
    with tarfile.open(out / "watch" / "rerun.tgz") as tar:
        names = set(tar.getnames())
    for suffix in ("alone.json", "watched.json", "recording.json", "diagnosis.json", "watch.log"):
        assert f"compile-recompile.{suffix}" in names
    assert {"watch_jobs.txt", "watch_expected.json"} <= names
    assert sorted(p.name for p in (out / "watch").iterdir()) == ["log.txt", "rerun.tgz"]
    rows = json.loads((tmp_path / "work" / "watch_jobs.json").read_text())["rows"]
    doc = json.loads((tmp_path / "work" / "compile-recompile.diagnosis.json").read_text())
    assert doc["job"].startswith("pid ") and doc["ended_by"] == "gone"  # watched by --pid
    alone = json.loads((tmp_path / "work" / "compile-recompile.alone.json").read_text())
    assert alone["clean"] is True and rows[0]["watched_per_second"] > 0
    gone = subprocess.run(["pgrep", "-f", "loop_jobs.py neighbour"], capture_output=True)
    assert gone.stdout == b""  # the neighbour was stopped
