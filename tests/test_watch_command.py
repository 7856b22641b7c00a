"""``sparkdiag watch`` end to end: scripted NVML fixtures with real jobs, this machine without a
GPU, exit statuses passed through, Ctrl-C, --pid, --record/--replay, --plot, usage errors; and
the host sampler's rates over a fake /proc."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sparkdiag.cli import main
from sparkdiag.watch import plot as plotting
from sparkdiag.watch.sampler import HostSampler
from tests.support import NVML, ROOT, alive, fake_stat, invoke_cli, sparkdiag_cmd
from tests.support.watch import PollGate, short_window, timeline


def run_watch(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``sparkdiag watch ARGS`` in this process (its job in its own); Ctrl-C and the import of
    pyudev are tested on a process of its own below."""
    return invoke_cli("watch", *args, timeout=timeout)


def watch_json(fixture: str, *job: str, interval: str = "0.1") -> dict[str, Any]:
    result = run_watch(
        "--json", "--interval", interval, "--nvml-fixture", str(NVML / f"{fixture}.json"),
        "--", *job,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


# ---- end to end on scripted fixtures ------------------------------------------------------------


# each window at least MIN_WINDOW_TICKS ticks and the SHORT_WINDOW (0.3 s) that short_window
# lets a diagnosis have: a shorter one is too short (at its real 2 s in the test of that rule)
@pytest.mark.parametrize(
    ("fixture", "polls", "interval", "verdict"),
    [
        ("watch-healthy", 8, "0.1", "healthy"),
        ("watch-starved", 8, "0.1", "input-starved"),  # busy one poll in three
        ("watch-throttled", 20, "0.05", "throttled"),  # throttled from poll 10: half the ticks
        ("watch-fp32", 8, "0.1", "low-tensor-activity"),
        ("watch-launch", 6, "0.2", "cpu-bound-launcher"),  # a thread busy on a core: the spinner
    ],
)
def test_diagnosis_on_scripted_fixtures(
    fixture: str,
    polls: int,
    interval: str,
    verdict: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    short_window(monkeypatch)
    gate = PollGate(monkeypatch, tmp_path, polls)
    job = gate.spinner if fixture == "watch-launch" else gate.sleeper
    doc = watch_json(fixture, *job, interval=interval)
    assert doc["schema"] == "sparkdiag-watch/1"
    assert doc["verdict"] == verdict, doc["causes"]
    assert doc["exit_status"] == 0 and doc["ended_by"] == "exit"
    assert doc["gpus"][0]["name"] == "NVIDIA H200"
    if verdict == "healthy":
        assert doc["causes"] == []
    else:
        cause = doc["causes"][0]
        assert cause["share"] > 0.1 and cause["evidence"] and cause["actions"]


def test_a_job_too_short_to_diagnose_gets_its_figures_and_no_cause() -> None:
    """``-- true`` under the starved fixture: one 0.1 s tick read "input-starved (96 % of the
    time lost)"; now "too short to diagnose" with what was measured, and the job's own exit
    status (a diagnosis never sets it)."""
    result = run_watch("--interval", "0.1", "--nvml-fixture", str(NVML / "watch-starved.json"),
                       "--", "true")  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())  # unwrapped
    assert "diagnosis: too short to diagnose: the job was active on the GPU for" in out, out
    assert "at least 2 s and 3 ticks are needed" in out and "GPU busy 4 %" in out
    assert "input-starved" not in out and "of the time lost" not in out
    failed = run_watch("--json", "--interval", "0.1", "--nvml-fixture",
                       str(NVML / "watch-starved.json"), "--", "false")  # fmt: skip
    assert failed.returncode == 1, failed.stderr
    doc = json.loads(failed.stdout)
    assert doc["verdict"] == "too-short" and doc["causes"] == []
    assert doc["headline"].startswith("too short to diagnose")


NOWHERE = 4_194_304  # above Linux's PID_MAX_LIMIT: no process here has it (another namespace)


def neighbour_fixture(folder: Path, pid: int) -> Path:
    """The H200 load recording, busy (99 %, GPM as watch-healthy's) with one compute process,
    ``pid``, on GPU 0, which is never the watched job's."""
    shutil.copy(NVML / "h200-load.json", folder)
    doc = {
        "format": "sparkdiag-nvml-fixture/1",
        "description": "the H200 busy with one compute process that is not the watched job",
        "base": "h200-load.json",
        "devices": [{
            "from": 0,
            "set": {
                "gpm": {"sm": 92.0, "sm_occupancy": 45.0, "tensor": 70.0, "dram": 35.0},
                "compute_processes": [{"pid": pid, "used_memory": 12_000_000_000}],
                "process_utilization": [{"pid": pid, "sm": 99.0, "memory": 24.0,
                                         "encoder": 0.0, "decoder": 0.0}],
            },
            "why": {"gpm": "as watch-healthy.json, made up",
                    "compute_processes": "a process outside the job, made up",
                    "process_utilization": "that process busy, made up"},
        }],
        "script": [],
    }  # fmt: skip
    path = folder / "neighbour.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_another_process_s_work_is_not_the_job_s(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A job that never touches the GPU (``cat`` on a FIFO) beside another process of this
    machine that keeps it busy: the busy time is the other's, the job held no GPU (watch called
    it healthy at 99 %, from "the GPUs that ran kernels")."""
    neighbour = subprocess.Popen(["sleep", "60"])
    try:
        gate = PollGate(monkeypatch, tmp_path, 8)
        result = run_watch(
            "--json", "--interval", "0.1", "--nvml-fixture",
            str(neighbour_fixture(tmp_path, neighbour.pid)), "--", *gate.sleeper,
        )  # fmt: skip
    finally:
        neighbour.kill()
        neighbour.wait()
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "gpu-unused", doc["causes"]
    assert doc["gpu_busy"] == 0.0
    (note,) = doc["notes"]
    assert f"pid {neighbour.pid} sleep" in note and "other processes" in note, note
    assert "the job held no GPU" in note and "no kernel ran" not in note


def test_a_process_this_namespace_does_not_show_keeps_the_busy_gpu_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """NVML lists a pid that /proc here does not hold (the job in a container, or watch in
    one): it may be the job's, so the GPU that ran kernels is still taken as the job's, and the
    report says that which GPU it used is not known."""
    short_window(monkeypatch)
    gate = PollGate(monkeypatch, tmp_path, 8)
    result = run_watch(
        "--json", "--interval", "0.1", "--nvml-fixture",
        str(neighbour_fixture(tmp_path, NOWHERE)), "--", *gate.sleeper,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "healthy", doc["causes"]
    (note,) = [n for n in doc["notes"] if "which GPU the job used is not known" in n]
    assert "1 compute process that this PID namespace does not show" in note, note
    assert "may include other processes' work" in note


def test_text_report_names_the_cause_its_evidence_and_what_to_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    short_window(monkeypatch)
    with tempfile.TemporaryDirectory(prefix="gate") as short:  # the job's line fits 80 columns
        gate = PollGate(monkeypatch, Path(short), 8)
        result = run_watch(
            "--interval", "0.1", "--nvml-fixture", str(NVML / "watch-starved.json"), "--",
            *gate.sleeper,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"sparkdiag watch: cat {gate.fifo}, exit status 0;")
    assert "diagnosis: input-starved (" in out and "of the time lost" in out
    assert "- the GPU waited" in out and "idle gaps in the driver's samples" not in out  # none
    # `cat` on a FIFO uses no CPU and reads nothing while the GPU waits: find what it waits for
    assert "nobody in the job was busy" in out, out
    assert "try: find what the job waits for" in out


def test_without_a_gpu_it_says_what_it_skipped_and_still_diagnoses(tmp_path: Path) -> None:
    result = run_watch(
        "--interval", "0.1", "--nvml-fixture", str(NVML / "no-nvml.json"), "--", "sleep", "0.3"
    )
    assert result.returncode == 0
    assert "NVML unavailable" in result.stderr and "not sampled" in result.stderr
    assert "no GPU sampled" in result.stdout
    assert "not assessed here:" in result.stdout


def test_exit_status_of_the_job_is_passed_through() -> None:
    result = run_watch(
        "--interval", "0.1", "--nvml-fixture", str(NVML / "watch-healthy.json"),
        "--", "sh", "-c", "sleep 0.5; exit 7",
    )  # fmt: skip
    assert result.returncode == 7
    assert "sh -c 'sleep 0.5; exit 7', exit status 7" in result.stdout


def test_ctrl_c_stops_the_job_prints_the_diagnosis_and_passes_its_status(tmp_path: Path) -> None:
    started = tmp_path / "started"
    proc = subprocess.Popen(
        sparkdiag_cmd(
            "watch", "--interval", "0.1", "--nvml-fixture", str(NVML / "watch-healthy.json"),
            "--json", "--", "sh", "-c", f"touch {started}; exec sleep 60",
        ),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    # Ctrl-C once watch runs its job (a fixed sleep raced sparkdiag's import on a loaded machine)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert started.exists(), proc.communicate()
    time.sleep(0.3)  # a few ticks sampled
    proc.send_signal(signal.SIGINT)  # to watch only: it must stop its job itself
    out, _ = proc.communicate(timeout=30)
    doc = json.loads(out)
    assert doc["ended_by"] == "interrupt"
    assert proc.returncode == 130 == doc["exit_status"]  # the job ended by SIGINT


def test_duration_then_waits_for_the_job(tmp_path: Path) -> None:
    start = time.monotonic()
    result = run_watch(
        "--interval", "0.1", "--duration", "0.3", "--json",
        "--nvml-fixture", str(NVML / "watch-healthy.json"), "--", "sh", "-c", "sleep 1.2; exit 4",
    )  # fmt: skip
    assert result.returncode == 4
    assert time.monotonic() - start >= 1.2
    doc = json.loads(result.stdout)
    assert doc["ended_by"] == "duration" and doc["exit_status"] is None
    assert doc["duration_seconds"] < 1.0  # sampling stopped at 0.3 s, the job ran 1.2


def test_attach_to_a_running_process() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        result = run_watch(
            "--pid", str(sleeper.pid), "--duration", "0.3", "--interval", "0.1",
            "--nvml-fixture", str(NVML / "watch-healthy.json"),
        )  # fmt: skip
    finally:
        sleeper.kill()
        sleeper.wait()
    assert result.returncode == 0, result.stderr
    assert f"pid {sleeper.pid} (sleep)" in result.stdout
    assert "(duration)" in result.stdout


def test_record_replay_and_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = PollGate(monkeypatch, tmp_path, 8)
    recording, png = tmp_path / "run.json", tmp_path / "run.png"
    result = run_watch(
        "--interval", "0.1", "--json", "--record", str(recording), "--plot", str(png),
        "--nvml-fixture", str(NVML / "watch-starved.json"), "--", *gate.sleeper,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    live = json.loads(result.stdout)
    replayed = run_watch("--replay", str(recording), "--json", "--plot", str(tmp_path / "r.png"))
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout) == live
    assert (tmp_path / "r.png").stat().st_size > 10_000
    assert replayed.stderr.splitlines()[-1] == f"wrote {tmp_path / 'r.png'}"


PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("as_json", [False, True])
def test_plot_to_a_folder_creates_it_and_says_what_it_wrote(tmp_path: Path, as_json: bool) -> None:
    """``--plot DIR/`` as soak's: DIR created (its parent exists) with watch.png in it, not
    DIR.png beside it; the file written named on standard error, standard output the report
    (the JSON document alone with --json)."""
    pytest.importorskip("matplotlib")
    recording = tmp_path / "run.json"
    timeline(n=12).save(recording)
    json_flag = ["--json"] if as_json else []
    result = run_watch("--replay", str(recording), *json_flag, "--plot", f"{tmp_path}/plots/")
    assert result.returncode == 0, result.stderr
    written = tmp_path / "plots" / "watch.png"
    assert written.read_bytes()[:8] == PNG
    assert not (tmp_path / "plots.png").exists()
    assert result.stderr.splitlines() == [f"wrote {written}"]
    assert "wrote" not in result.stdout
    if as_json:  # the rest does not depend on --json: once is enough (a plot is 1 s of CPU)
        assert json.loads(result.stdout)["verdict"] == "healthy"
        return
    # an existing folder without the slash is a folder too; a name without a suffix gets .png
    (tmp_path / "plots" / "watch.png").unlink()
    again = run_watch("--replay", str(recording), "--plot", str(tmp_path / "plots"))
    assert again.stderr.splitlines() == [f"wrote {written}"] and written.exists()
    bare = run_watch("--replay", str(recording), "--plot", str(tmp_path / "timeline"))
    assert bare.stderr.splitlines() == [f"wrote {tmp_path / 'timeline.png'}"]
    assert (tmp_path / "timeline.png").read_bytes()[:8] == PNG


def test_plot_to_a_folder_whose_parent_is_missing_fails_before_the_job(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    marker = tmp_path / "ran"
    result = CliRunner().invoke(
        main, ["watch", "--plot", f"{tmp_path}/no/dir/", "--", "touch", str(marker)]
    )
    assert result.exit_code == 2, result.output
    assert f"folder {tmp_path}/no does not exist (to create dir in)" in result.output
    assert not marker.exists() and not (tmp_path / "no").exists()


def test_watch_does_not_need_pyudev(tmp_path: Path) -> None:
    """The H200 has no pyudev: watch must not import it."""
    fixture = str(NVML / "watch-healthy.json")
    code = (
        "import sys; sys.modules['pyudev'] = None\n"
        "from sparkdiag.cli import main\n"
        f"main(['watch', '--interval', '0.1', '--nvml-fixture', {fixture!r}, '--', 'true'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "diagnosis:" in result.stdout


# ---- usage errors: one line, exit 2 -------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give exactly one of --pid PID, --replay FILE or -- COMMAND"),
        (["--pid", "1", "--", "true"], "give exactly one of"),
        (["--pid", "999999999"], "no running process 999999999 under /proc\n"),
        (
            ["--pid", "999999999", "--path.rootfs", "/"],  # said //proc
            "Invalid value for '--pid': no running process 999999999 under /proc\n",
        ),
        (["--replay", "/nonexistent.json"], "cannot read /nonexistent.json"),
        (["--gpu", "a,b", "--", "true"], "'a' is not a GPU index"),
        (
            ["--gpu", "5", "--nvml-fixture", str(NVML / "h200-idle.json"), "--", "true"],
            "no GPU with index 5 (NVML sees: 0)",
        ),
        (["--interval", "0", "--", "true"], "0.05"),
        (["--nvml-fixture", "/nonexistent.json", "--", "true"], "cannot read NVML fixture"),
        (  # --record was ignored: no file written, exit 0
            ["--replay", "/nonexistent.json", "--record", "/tmp/never-written.json"],
            "--record saves the samples of a job being watched; --replay reads a recording",
        ),
    ],
)
def test_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["watch", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_bad_recording_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something else"}')
    result = CliRunner().invoke(main, ["watch", "--replay", str(bad)])
    assert result.exit_code == 2 and "not a sparkdiag watch recording" in result.output


def test_plot_without_matplotlib_fails_before_starting_the_job(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("sparkdiag.plotting.available", lambda: False)
    marker = tmp_path / "ran"
    result = CliRunner().invoke(
        main, ["watch", "--plot", str(tmp_path / "x.png"), "--", "touch", str(marker)]
    )
    assert result.exit_code == 2
    assert "pip install matplotlib" in result.output
    assert not marker.exists()


# ---- the host sampler over a fake /proc ---------------------------------------------------------


def _task(root: Path, pid: int, tid: int, name: str, ticks: int, run_ns: int, wait_ns: int) -> None:
    task = root / "proc" / str(pid) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    fields = ["S"] + ["0"] * 10 + [str(ticks), "0"] + ["0"] * 30
    (task / "stat").write_text(f"{tid} ({name}) " + " ".join(fields) + "\n")
    (task / "schedstat").write_text(f"{run_ns} {wait_ns} 1\n")


def _fake_job(root: Path, step: int) -> None:
    """pid 100 (on the GPU; its launcher thread 101 busy but starved of CPU: on a CPU half the
    time, waiting in the run queue the other half) and its loader child 200 (one busy core)."""
    s = 10**9
    _task(root, 100, 100, "python3", 0, step * s // 10, 0)
    _task(root, 100, 101, "launcher", 0, step * s // 2, step * s // 2)
    _task(root, 200, 200, "pt_data_worker", 0, step * s, 0)
    (root / "proc" / "100" / "task" / "100" / "children").write_text("200 ")
    for pid in (100, 200):
        (root / "proc" / str(pid) / "io").write_text(
            f"rchar: {step * 40_000_000 * (pid // 100)}\nwchar: {step * 1000}\n"
            "read_bytes: 0\nwrite_bytes: 0\n"
        )
    pressure = root / "proc" / "pressure"
    pressure.mkdir(parents=True, exist_ok=True)
    (pressure / "memory").write_text(f"some avg10=0 avg60=0 avg300=0 total={step * 100000}\n")
    (root / "proc" / "meminfo").write_text("MemAvailable: 1048576 kB\n")
    (root / "proc" / "vmstat").write_text(f"pswpin {step * 10}\npswpout 0\n")


def test_host_sampler_rates(tmp_path: Path) -> None:
    now = [0.0]
    sampler = HostSampler(tmp_path, tmp_path / "sys", 100, clock=lambda: now[0])
    _fake_job(tmp_path, 1)
    assert sampler.tree() == [100, 200]
    first, _ = sampler.sample({100})
    assert first.cpu_cores is None and first.processes == 2  # the first sample is a baseline
    now[0] = 1.0
    _fake_job(tmp_path, 2)
    sampler.tree()
    job, host = sampler.sample({100})
    assert job.gpu_thread == pytest.approx(1.0)  # runnable all the time, though on a CPU half
    assert job.gpu_thread_name == "launcher"
    assert job.cpu_cores == pytest.approx(0.1 + 0.5 + 1.0)
    assert job.other_cpu_cores == pytest.approx(1.0)  # the loader
    assert job.read_bps == pytest.approx(40e6 + 80e6)
    assert job.write_bps == pytest.approx(2000)
    assert host.memory_stall == pytest.approx(0.1)
    assert host.swap_bps == pytest.approx(10 * os.sysconf("SC_PAGE_SIZE"))
    assert host.available_bytes == 1048576 * 1024.0
    # per process, busiest first: the loader (no GPU, one core, reading) and the GPU process
    loader, main = job.loads
    assert (loader.pid, loader.name, loader.on_gpu) == (200, "pt_data_worker", False)
    assert loader.cpu_cores == pytest.approx(1.0) and loader.read_bps == pytest.approx(80e6)
    assert (main.pid, main.on_gpu) == (100, True) and main.cpu_cores == pytest.approx(0.6)


def _job_in_a_cgroup(root: Path, members: dict[str, str]) -> None:
    """pid 100 (the job) with its child 200, in the cgroup /job.scope with I/O PSI; ``members``:
    the cgroup.procs of that cgroup and those below it, by path under it."""
    _fake_job(root, 1)
    (root / "proc" / "100" / "cgroup").write_text("0::/job.scope\n")
    base = root / "sys" / "fs" / "cgroup" / "job.scope"
    for path, procs in members.items():
        (base / path).mkdir(parents=True, exist_ok=True)
        (base / path / "cgroup.procs").write_text(procs)
    (base / "io.pressure").write_text("some avg10=0 avg60=0 avg300=0 total=500000\n")


def _scope(root: Path, ticks: int = 2, own_pid: int = 400) -> tuple[str, set[int]]:
    """The PSI scope after ``ticks`` ticks, watch being ``own_pid`` (its parent pid 1)."""
    if not (root / "proc" / str(own_pid)).exists():
        fake_stat(root, own_pid, 1)
    sampler = HostSampler(root, root / "sys", 100, own_pid=own_pid)
    for _ in range(ticks):
        sampler.tree()
        sampler.sample({100})
    return sampler.pressure_scope, sampler.sharers


def test_psi_of_a_cgroup_that_holds_the_job_alone_is_the_job_s(tmp_path: Path) -> None:
    _job_in_a_cgroup(tmp_path, {".": "100\n", "loader": "200\n"})
    assert _scope(tmp_path) == ("cgroup", set())


def test_psi_of_a_cgroup_shared_with_other_processes_is_said_so(tmp_path: Path) -> None:
    """A process in the job's cgroup (or one below it) that is not the job's nor watch's nor a
    parent of either, on two ticks in a row: as 16 parallel tests beside watch's job in the
    lent H100's container, whose I/O stalls watch took for the job's and advised "read
    faster" for a job that read nothing."""
    _job_in_a_cgroup(tmp_path, {".": "100\n300\n", "loader": "200\n"})
    fake_stat(tmp_path, 300, 1)
    assert _scope(tmp_path) == ("shared-cgroup", {300})
    assert _scope(tmp_path, ticks=1) == ("cgroup", set())  # seen once: a child that ended?
    # watch's parent (300, the shell that started it) is not a sharer; another process (500) is
    fake_stat(tmp_path, 400, 300)
    assert _scope(tmp_path) == ("cgroup", set())
    (tmp_path / "sys/fs/cgroup/job.scope/other").mkdir()
    (tmp_path / "sys/fs/cgroup/job.scope/other/cgroup.procs").write_text("500\n")
    assert _scope(tmp_path) == ("shared-cgroup", {500})


def test_an_idle_process_does_not_share_the_cgroup_s_stalls(tmp_path: Path) -> None:
    """A shell asleep at its prompt in the job's tmux scope stalls on nothing; one that ran, or
    waits in the disk's queue (D), may."""
    _job_in_a_cgroup(tmp_path, {".": "100\n300\n", "loader": "200\n"})
    fake_stat(tmp_path, 400, 1)
    fake_stat(tmp_path, 300, 1, "S", ticks=7)
    sampler = HostSampler(tmp_path, tmp_path / "sys", 100, own_pid=400)

    def tick() -> str:
        sampler.tree()
        sampler.sample({100})
        return sampler.pressure_scope

    assert [tick(), tick(), tick()] == ["cgroup"] * 3  # asleep, 7 ticks of CPU throughout
    fake_stat(tmp_path, 300, 1, "S", ticks=9)  # it ran between two ticks
    assert tick() == "shared-cgroup" and sampler.sharers == {300}
    again = HostSampler(tmp_path, tmp_path / "sys", 100, own_pid=400)
    fake_stat(tmp_path, 300, 1, "D", ticks=9)  # in the disk's queue at both
    for _ in range(2):
        again.tree()
        again.sample({100})
    assert again.pressure_scope == "shared-cgroup"


def test_the_job_s_parent_and_pid_1_do_not_share_its_cgroup(tmp_path: Path) -> None:
    """``watch --pid`` of a job started by a shell in the same login or tmux scope, and a
    container whose first process (pid 1: the shell of ``docker run -it``, tini) started
    watch."""
    _job_in_a_cgroup(tmp_path, {".": "100\n350\n1\n", "loader": "200\n"})
    fake_stat(tmp_path, 100, 350)
    fake_stat(tmp_path, 350, 1)
    fake_stat(tmp_path, 400, 1)
    assert _scope(tmp_path) == ("cgroup", set())


def test_nothing_is_judged_once_the_job_ended_or_of_another_root(tmp_path: Path) -> None:
    """A worker of the job still exiting after the job's root was reaped is not another's;
    without watch's own pid (``--path.rootfs``), the cgroup's pids may be of another PID
    namespace than that /proc's."""
    _job_in_a_cgroup(tmp_path, {".": "100\n300\n", "loader": "200\n"})
    fake_stat(tmp_path, 400, 1)
    sampler = HostSampler(tmp_path, tmp_path / "sys", 100, own_pid=400)
    for _ in range(2):
        sampler.pids = []  # the job has ended
        sampler.sample(set())
    assert sampler.pressure_scope == "cgroup"
    other_root = HostSampler(tmp_path, tmp_path / "sys", 100, own_pid=None)
    for _ in range(2):
        other_root.tree()
        other_root.sample({100})
    assert other_root.pressure_scope == "cgroup"


def test_a_cgroup_once_shared_stays_so_for_the_recording(tmp_path: Path) -> None:
    _job_in_a_cgroup(tmp_path, {".": "100\n300\n", "loader": "200\n"})
    fake_stat(tmp_path, 400, 1)
    sampler = HostSampler(tmp_path, tmp_path / "sys", 100, own_pid=400)
    for _ in range(2):
        sampler.tree()
        sampler.sample({100})
    (tmp_path / "sys/fs/cgroup/job.scope/cgroup.procs").write_text("100\n")  # 300 has gone
    sampler.tree()
    sampler.sample({100})
    assert sampler.pressure_scope == "shared-cgroup"  # its stalls are in the window's PSI


def test_job_cpus_from_the_affinity_list(tmp_path: Path) -> None:
    from sparkdiag.sources.host.procfs import allowed_cpus

    status = tmp_path / "proc" / "100" / "status"
    status.parent.mkdir(parents=True)
    status.write_text("Name:\tpython3\nCpus_allowed:\tffff\nCpus_allowed_list:\t0-7,12,14-15\n")
    assert allowed_cpus(tmp_path, 100) == 11
    assert HostSampler(tmp_path, tmp_path / "sys", 100).job_cpus == 11
    status.write_text("Cpus_allowed_list:\tgarbage\n")
    assert allowed_cpus(tmp_path, 100) is None
    assert allowed_cpus(tmp_path, 999) is None  # gone


# ---- the GPU sampler over fixtures --------------------------------------------------------------


def _gpu_sampler(path: Path) -> Any:
    from sparkdiag.sources.nvml.fixture import FixtureBackend
    from sparkdiag.sources.nvml.gpu import GpuSource
    from sparkdiag.watch.sampler import GpuSampler

    source = GpuSource(FixtureBackend(path))
    assert source.start()
    return GpuSampler(source)


def test_gpu_sampler_reads_driver_samples_newer_than_the_start(derive_fixture: Any) -> None:
    started = 1_800_000_000.0
    stamps = [(started - 5) * 1e6, (started + 0.25) * 1e6, (started + 0.5) * 1e6]
    path = derive_fixture(
        "watch-healthy",
        devices=[
            {
                "from": 0,
                "set": {"utilization_samples": [[stamps[0], 0], [stamps[1], 40], [stamps[2], 60]]},
            }
        ],
    )
    (tick,) = _gpu_sampler(path).sample(started, {4194305})
    assert tick.samples == ((0.25, 0.4), (0.5, 0.6))  # the one from before the start is dropped
    assert tick.utilization == pytest.approx(0.5)
    assert tick.job_on_gpu  # the fixture's compute process (pid 547 in the recording)
    assert tick.job_memory_bytes == 1050673152  # what NVML says it holds
    assert tick.memory_utilization == 0.24  # utilization.memory of the recording
    assert tick.tensor_activity == 0.7 and tick.sm_clock_hz == 1455e6
    # the recording's PCIe throughput (KiB/s), in bytes per second
    assert tick.pcie_tx == 7273 * 1024.0 and tick.pcie_rx == 15947 * 1024.0


def test_gpu_sampler_without_driver_samples_uses_the_instantaneous_figure(
    derive_fixture: Any,
) -> None:
    # the recording's driver samples are emptied: NVML had none since the last read
    path = derive_fixture(
        "watch-healthy", devices=[{"from": 0, "set": {"utilization_samples": []}}]
    )
    (tick,) = _gpu_sampler(path).sample(1.8e9, set())
    assert tick.samples == () and tick.utilization == 0.99 and not tick.job_on_gpu
    assert tick.job_memory_bytes is None  # none of the job's processes holds memory there


def test_gpu_sampler_leaves_unsupported_pcie_throughput_out(derive_fixture: Any) -> None:
    unsupported = {"error": "NOT_SUPPORTED"}
    path = derive_fixture(
        "watch-healthy",
        devices=[
            {
                "from": 0,
                "set": {"pcie_throughput/0": unsupported, "pcie_throughput/1": unsupported},
            }
        ],
    )
    (tick,) = _gpu_sampler(path).sample(1.8e9, set())
    assert tick.pcie_tx is None and tick.pcie_rx is None  # left out, never 0


def test_a_long_command_line_is_cut_in_the_middle_of_the_plot_title() -> None:
    job = "/opt/torch/.venv/bin/python3 " + "x" * 200 + " --result /tmp/res/jobs/r.json"
    title = plotting.shorten(job)
    assert len(title) == plotting.TITLE_CHARS
    assert title.startswith("/opt/torch/.venv/bin/python3 ") and title.endswith("/r.json")
    assert "…" in title
    assert plotting.shorten("python train.py") == "python train.py"


def test_with_json_the_started_job_writes_to_stderr_and_stdout_is_the_document() -> None:
    """``watch --json -- CMD > report.json``: the job's own output must not corrupt the JSON
    (on the H200, gpu_load.py's "ready" came first on standard output and the document did
    not parse); it goes to standard error. Without --json the job keeps standard output."""
    job = ["sh", "-c", "echo job-said-this; sleep 0.3"]
    fixture = ["--interval", "0.1", "--nvml-fixture", str(NVML / "watch-healthy.json")]
    done = subprocess.run(
        sparkdiag_cmd("watch", *fixture, "--json", "--", *job),
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["exit_status"] == 0
    assert "job-said-this" in done.stderr
    plain = subprocess.run(
        sparkdiag_cmd("watch", *fixture, "--", *job),
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.startswith("job-said-this\n")
    assert "job-said-this" not in plain.stderr


def test_plot_names_that_cannot_be_written_are_refused_before_the_work(tmp_path: Path) -> None:
    """``--plot out.txt`` raised matplotlib's ValueError after the job ended, and ``--plot
    DIR/`` with DIR/watch.png a folder said so only after the job, exit 0 (a review)."""
    pytest.importorskip("matplotlib")
    recording = ROOT / "docs" / "device" / "2026-12-01" / "part-c" / "fp32.recording.json"
    (tmp_path / "d" / "watch.png").mkdir(parents=True)
    for target, needle in (
        (tmp_path / "out.txt", "the timeline is written as .pdf, .png, .svg"),
        (f"{tmp_path / 'd'}/", "watch.png is a folder"),
    ):
        done = run_watch("--replay", str(recording), "--plot", str(target))
        assert done.returncode == 2 and needle in done.stderr, done.stderr
    svg = run_watch("--replay", str(recording), "--plot", str(tmp_path / "t.svg"))
    assert svg.returncode == 0 and (tmp_path / "t.svg").read_text().lstrip().startswith("<?xml")


# ---- standard output that cannot be written, recordings that cannot be -------------------------


def _watch_into(stdout: Any, *args: str, **popen: Any) -> subprocess.CompletedProcess[str]:
    fixture = [
        "--interval",
        "0.1",
        "--stacks",
        "off",
        "--nvml-fixture",
        str(NVML / "watch-healthy.json"),
    ]
    return subprocess.run(
        sparkdiag_cmd("watch", *fixture, *args), stdout=stdout, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True, timeout=60, cwd=ROOT, check=False, **popen,
    )  # fmt: skip


def test_unwritable_standard_output_keeps_the_job_s_status_and_waits_for_it(
    tmp_path: Path,
) -> None:
    """``sparkdiag watch --json -- make train > /dev/full``: watch exited 1 whatever the job
    did, and with --duration before the job had ended (it ran on, not waited for). A script
    must still see a failed job fail: the job's status stands where it is not 0; a job that
    succeeded with its report lost is 1, as every command whose output was not written."""
    recording = tmp_path / "run.json"
    with open("/dev/full", "w") as full:
        failed = _watch_into(
            full, "--json", "--duration", "0.2", "--record", str(recording),
            "--", "sh", "-c", "sleep 1; exit 4",
        )  # fmt: skip
        succeeded = _watch_into(full, "--json", "--", "true")
    assert failed.returncode == 4, failed.stderr
    assert failed.stderr.splitlines()[-1] == (
        "Error: cannot write standard output: No space left on device; the report is lost, "
        f"the recording is in {recording} (sparkdiag watch --replay {recording} prints it again)"
    )
    assert "Traceback" not in failed.stderr
    replayed = run_watch("--replay", str(recording), "--json")
    assert json.loads(replayed.stdout)["ended_by"] == "duration"
    assert succeeded.returncode == 1, succeeded.stderr
    assert succeeded.stderr.splitlines()[-1].endswith(
        "the report is lost, give --record FILE to keep the samples, and read them with "
        "--replay FILE"
    )


def test_sigterm_after_the_duration_stops_the_job_watch_waits_for() -> None:
    """After --duration watch waits for its job; SIGTERM (or Ctrl-C) then was not looked at,
    and watch waited for as long as the job ran."""
    proc = subprocess.Popen(
        sparkdiag_cmd(
            "watch", "--interval", "0.1", "--duration", "0.2", "--stacks", "off",
            "--nvml-fixture", str(NVML / "watch-healthy.json"), "--", "sleep", "60",
        ),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("sparkdiag watch: sleep 60;")  # the report
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGINT, err  # the job, stopped by watch's SIGINT


def _limit_file_size() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # a disk that fills at 4 KiB


def test_a_recording_that_cannot_be_written_whole_leaves_the_last_one_as_it_was(
    tmp_path: Path,
) -> None:
    """--record onto a disk that filled left a truncated recording (4096 bytes here) that
    --replay refused, in place of the one that was there; now it is written beside and renamed
    over, and removed when the write fails. The job's status and the report are unchanged."""
    recording = tmp_path / "run.json"
    timeline(n=2).save(recording)
    before = recording.read_bytes()
    assert len(before) < 4096
    done = _watch_into(
        subprocess.PIPE, "--record", str(recording), "--", "sh", "-c", "sleep 1; exit 3",
        preexec_fn=_limit_file_size,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "diagnosis:" in done.stdout
    said = " ".join(done.stderr.split())
    assert f"cannot write {recording}: File too large; the recording is lost" in said, said
    assert recording.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_recording_from_a_newer_sparkdiag_says_so(tmp_path: Path) -> None:
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"schema": "sparkdiag-watch-recording/9", "ticks": []}))
    result = CliRunner().invoke(main, ["watch", "--replay", str(newer)])
    assert result.exit_code == 2
    assert "recorded as 'sparkdiag-watch-recording/9' by a newer sparkdiag" in result.output


def test_watch_is_not_part_of_the_job_it_attaches_to(tmp_path: Path) -> None:
    """``--pid`` of the shell that runs watch (or PID 1): watch and its py-spy are under it,
    and were sampled as the job's processes."""
    _fake_job(tmp_path, 1)
    (tmp_path / "proc" / "200" / "task" / "200" / "children").write_text("300 ")
    _task(tmp_path, 300, 300, "py-spy", 0, 0, 0)
    assert HostSampler(tmp_path, tmp_path / "sys", 100).tree() == [100, 200, 300]
    assert HostSampler(tmp_path, tmp_path / "sys", 100, own_pid=200).tree() == [100]


def test_a_failure_while_watching_leaves_no_job_running_unwaited(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Anything that went wrong while watching (before: a stdout that could not be written)
    ended watch with its job still running, orphaned, unwaited: watch now waits for it first
    (Ctrl-C stops it), then lets the error out."""
    from sparkdiag.watch.sampler import Sampler

    calls = {"n": 0}
    real = Sampler.tick

    def failing(self: Sampler) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("a bug while sampling")
        return real(self)

    monkeypatch.setattr(Sampler, "tick", failing)
    pid_file = tmp_path / "pid"
    result = run_watch(
        "--interval", "0.1", "--stacks", "off", "--nvml-fixture", str(NVML / "watch-healthy.json"),
        "--", "sh", "-c", f"echo $$ > {pid_file}; sleep 1",
    )  # fmt: skip
    assert "a bug while sampling" in result.stderr
    assert "waiting for the job to end (Ctrl-C stops it)" in " ".join(result.stderr.split())
    assert not alive(int(pid_file.read_text()))


def test_a_recording_too_large_to_replay_is_said_when_it_is_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A job watched for hours wrote a recording over the 64 MiB --replay reads (about 1 KB a
    tick, 9 h at 0.5 s) without a word; --replay then refused it. Said at the end, with the
    way out (the limit lowered here to 1 KB)."""
    monkeypatch.setattr("sparkdiag.commands.watch.MAX_RECORDING_BYTES", 1024)
    recording = tmp_path / "run.json"
    result = run_watch(
        "--interval", "0.1", "--stacks", "off", "--record", str(recording),
        "--nvml-fixture", str(NVML / "watch-healthy.json"), "--", "sleep", "0.3",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert f"{recording} holds 0 MiB, more than the 0 MiB --replay reads" in said, said
    assert "with a longer --interval" in said and recording.stat().st_size > 1024
