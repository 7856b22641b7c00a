"""``sparkdiag soak`` end to end on CPU torch (``--device cpu --small``, short windows): the JSON
record, the CSV, the PNGs, the state file; Ctrl-C leaving a partial record and no worker alive;
the runner's parallel workers, its second-signal and grace kills on stand-in workers; the plots
of a GPU soak; usage errors and the message without matplotlib."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sparkdiag import plotting
from sparkdiag.cli import main
from sparkdiag.commands import soak as soak_command
from sparkdiag.commands.soak import exit_status, parse_duration
from sparkdiag.flags import settings_from
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.soak import plot as soak_plot
from sparkdiag.soak.model import CSV_COLUMNS, Target
from sparkdiag.soak.run import Job, SoakRunner
from sparkdiag.soak.state import FILENAME, read_state
from tests.support import (
    NVML,
    ROOT,
    alive,
    http_get,
    running_daemon,
    signal_when,
    sparkdiag_cmd,
    wait_dead,
)
from tests.support.soak import gpu_soak, heating, report

FAKE = Path(__file__).parent / "support" / "probe_scripts" / "fake_soak_worker.py"
CPU = ["--device", "cpu", "--small", "--window", "0.5"]
PNG = b"\x89PNG"


def run_soak(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sparkdiag_cmd("soak", *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.worker
def test_cpu_soak_writes_the_record_csv_plots_and_state(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    state = tmp_path / "state"
    result = run_soak(
        *CPU,
        "--duration",
        "2",
        "--json",
        str(tmp_path / "soak.json"),
        "--csv",
        str(tmp_path / "soak.csv"),
        "--plot",
        f"{tmp_path}/plots/",
        "--state-dir",
        str(state),
    )
    record = json.loads((tmp_path / "soak.json").read_text())
    assert record["schema"] == "sparkdiag-soak/1" and record["interrupted"] is None
    (gpu,) = record["gpus"]
    assert gpu["gpu"] == "cpu" and gpu["device"] == "cpu" and gpu["stopped"] == "completed"
    assert gpu["result"] == "ok" and gpu["sensor"] is None
    windows = gpu["windows"]
    assert windows[0]["phase"] == "cold" and len(windows) >= 3
    assert windows[-1]["elapsed_seconds"] >= 2.0
    delivered = {(r["dtype"], r["shape"]): r["delivered"] for r in windows[-1]["results"]}
    assert all(delivered[(d, s)] > 0 for d, s in delivered if d in ("int4", "bf16", "fp16"))
    assert delivered[("fp8", "1x256x256")] is None  # not on a CPU
    verdicts = {(v["dtype"], v["shape"]): v for v in gpu["verdicts"]}
    assert len(verdicts) == 10  # 5 dtypes at a decode and an LLM shape
    ran = [v for v in verdicts.values() if v["status"] == "ran"]  # a CPU: no thermal verdict
    assert len(ran) == 6 and all(v["cold"] > 0 and v["hottest"] > 0 for v in ran)
    assert all("no thermal verdict" in v["note"] for v in ran)
    assert verdicts[("nvfp4", "1x256x256")]["status"] == "unsupported"
    assert result.returncode == 0, result.stderr  # however noisy the CPU
    # the text: a verdict line per kernel, the unsupported ones together, why it stopped
    assert "int4 1x256x256" in result.stdout and "not measured: fp8, nvfp4" in result.stdout
    assert "stopped: completed after 2 s of load" in result.stdout
    assert "cpu window 1" in result.stderr  # one line per window outside a terminal
    with (tmp_path / "soak.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert len(rows) == 10 * len(windows)
    int4 = [r for r in rows if r["dtype"] == "int4" and r["shape"] == "1x256x256"]
    assert float(int4[0]["of_cold"]) == 1.0 and float(int4[-1]["delivered_tflops"]) > 0
    assert float(int4[-1]["int4_bf16"]) > 0
    for name in ("soak-time.png", "soak-temperature.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == PNG
    saved = read_state(state / FILENAME)
    assert saved is not None
    (entry,) = saved.gpus
    assert entry.gpu == "cpu" and entry.stopped == "completed" and entry.judged == ()
    assert len([k for k in entry.kernels if k.status == "ran"]) == 6


@pytest.mark.worker
def test_the_readme_cpu_smoke_soak_passes_and_its_record_poses_as_no_gpu(tmp_path: Path) -> None:
    """Issue 21: ``soak --device cpu --small --duration 10 --window 1`` exited 1 in 7 of 7 runs
    (CPU noise read as a thermal fall), check then warned about cooling on a machine without a
    GPU, and the daemon served sparkdiag_soak_*{gpu="cpu"}."""
    pytest.importorskip("torch")
    state = tmp_path / "state"
    started = time.monotonic()
    result = run_soak(
        "--device", "cpu", "--small", "--duration", "10", "--window", "1", "--state-dir", str(state)
    )
    took = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert took < 60, f"the CPU smoke soak took {took:.1f} s"
    assert "fell" not in result.stdout  # not even the rule for judging a fall
    words = " ".join(result.stdout.split())  # the verdict column wraps at the terminal's width
    assert "ran at" in words and "no thermal verdict" in words
    assert "s left" in result.stderr  # the soak's own clock: cpu window 1 (1.0 s, 9 s left)
    check = subprocess.run(
        sparkdiag_cmd(
            "check",
            "--quick",
            "--json",
            "--state-dir",
            str(state),
            "--nvml-fixture",
            str(NVML / "no-nvml.json"),
        ),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    rows = [r for r in json.loads(check.stdout)["checks"] if r["name"] == "soak"]
    assert [r["status"] for r in rows] == ["skip"], rows
    assert "CPU test soak" in rows[0]["finding"] and "cooling" not in json.dumps(rows)
    with running_daemon(
        [
            "--nvml-fixture",
            str(NVML / "no-nvml.json"),
            "--no-probe.enabled",
            "--state-dir",
            str(state),
        ]
    ) as base:
        status, _, body = http_get(base + "/metrics")
    assert status == 200
    served = [line for line in body.decode().splitlines() if line.startswith("sparkdiag_soak")]
    assert served == []  # as dump, which reads no soak


@pytest.mark.worker
def test_json_alone_prints_the_record_and_no_record_keeps_no_state(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    state = tmp_path / "state"
    result = run_soak(
        *CPU,
        "--duration",
        "1",
        "--dtype",
        "int4,bf16",
        "--json",
        "--no-record",
        "--state-dir",
        str(state),
    )
    record = json.loads(result.stdout)
    (gpu,) = record["gpus"]
    assert {v["dtype"] for v in gpu["verdicts"]} == {"int4", "bf16"}
    assert not state.exists()


@pytest.mark.worker
@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
def test_ctrl_c_stops_cleanly_with_a_partial_record_and_no_worker_left(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C, SIGTERM and SIGHUP (the terminal closed) alike; each is reported by its own name
    (issue 21: a SIGTERM was passed on as SIGINT and the record said "SIGINT received"). SIGHUP
    killed the command at its default: no record, no state, exit 129."""
    pytest.importorskip("torch")
    record, table = tmp_path / "soak.json", tmp_path / "soak.csv"
    proc = subprocess.Popen(
        sparkdiag_cmd(
            "soak",
            *CPU,
            "--duration",
            "120",
            "--json",
            str(record),
            "--csv",
            str(table),
            "--state-dir",
            str(tmp_path / "state"),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + 120
    for line in proc.stderr:  # wait for the first window under load
        seen.append(line)
        if "cpu window 1" in line or time.monotonic() > deadline:
            break
    started = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - started < 30, "the worker did not stop promptly"
    assert proc.returncode == 130, "".join(seen) + err
    body = json.loads(record.read_text())
    assert body["interrupted"] == sig.name
    (gpu,) = body["gpus"]
    # the worker stopped by itself (its document, exit 0), not killed
    assert gpu["stopped"] == "interrupted" and gpu["reason"] == f"{sig.name} received"
    assert gpu["result"] == "ok" and len(gpu["windows"]) >= 2
    assert gpu["elapsed_seconds"] < 60
    assert wait_dead([gpu["worker_pid"]], 5) == []
    assert len(table.read_text().splitlines()) == 1 + 10 * len(gpu["windows"])
    assert f"stopped: interrupted: {sig.name} received" in out
    saved = read_state(tmp_path / "state" / FILENAME)
    assert saved is not None and saved.gpus[0].stopped == "interrupted"


# -- the runner, on stand-in workers ------------------------------------------------------------


def fake_runner(modes: list[str], grace: float = 30.0) -> SoakRunner:
    """A runner whose job i runs the stand-in in ``modes[i]``."""
    jobs = [
        Job(
            Target(f"GPU {i}", i, f"GPU-{i}"),
            WorkerRequest(soak_seconds=60),
            python=(sys.executable, str(FAKE), mode),
        )
        for i, mode in enumerate(modes)
    ]
    return SoakRunner(jobs, timeout=60, grace=grace)


def interrupt_after(runner: SoakRunner, windows: int) -> Any:
    seen: list[int] = []

    def on_window(i: int, _w: object) -> None:
        seen.append(i)
        if len(seen) == windows:
            runner.interrupt()

    return on_window


@pytest.mark.worker
def test_under_nohup_sighup_is_still_ignored(tmp_path: Path) -> None:
    """A soak started with nohup (SIGHUP ignored) is not stopped by SIGHUP: the command group
    catches SIGHUP only where it is not ignored."""
    pytest.importorskip("torch")
    proc = subprocess.Popen(
        ["nohup", *sparkdiag_cmd("soak", *CPU, "--duration", "3", "--no-record")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # the soak runs: its first window
        if "cpu window" in line:
            break
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "stopped: completed" in out


def test_every_gpu_soaks_at_once_and_one_interrupt_stops_them_all() -> None:
    runner = fake_runner(["polite", "polite"])
    started = time.monotonic()
    outcomes = runner.run(on_window=interrupt_after(runner, 6))
    assert time.monotonic() - started < 20
    assert runner.interrupted == "SIGINT" and not runner.killed
    for gpu in outcomes:
        assert gpu.stopped == "interrupted" and gpu.reason == "SIGINT received"
        assert gpu.result == "ok" and len(gpu.windows) >= 2
        assert gpu.verdict.sensor == "memory"
        assert gpu.worker_pid is not None and not alive(gpu.worker_pid)
    assert outcomes[0].worker_pid != outcomes[1].worker_pid
    assert exit_status(tuple(outcomes), True, True) == 130


def test_sigterm_is_passed_on_and_reported_as_sigterm() -> None:
    """Issue 21: a SIGTERM was passed on as SIGINT, so the record said "SIGINT received"."""
    runner = fake_runner(["polite"])
    seen: list[int] = []

    def on_window(i: int, _w: object) -> None:
        seen.append(i)
        if len(seen) == 3:
            runner.interrupt("SIGTERM")

    (gpu,) = runner.run(on_window=on_window)
    assert runner.interrupted == "SIGTERM" and not runner.killed
    assert gpu.stopped == "interrupted" and gpu.reason == "SIGTERM received"


def test_a_worker_that_ignores_the_interrupt_is_killed_after_the_grace() -> None:
    runner = fake_runner(["stubborn"], grace=0.5)
    (gpu,) = runner.run(on_window=interrupt_after(runner, 1))
    assert runner.killed
    assert gpu.stopped == "interrupted" and "killed" in (gpu.reason or "")
    assert len(gpu.windows) == 1  # from its progress line: it printed no document
    assert gpu.worker_pid is not None and not alive(gpu.worker_pid)


def test_a_second_interrupt_kills_at_once() -> None:
    runner = fake_runner(["stubborn"])
    seen: list[int] = []

    def on_window(i: int, _w: object) -> None:
        seen.append(i)
        runner.interrupt()
        runner.interrupt("SIGTERM")

    started = time.monotonic()
    (gpu,) = runner.run(on_window=on_window)
    assert time.monotonic() - started < 10 and runner.killed
    assert runner.interrupted == "SIGINT" and gpu.stopped == "interrupted"


def test_a_worker_killed_mid_soak_keeps_its_windows_and_a_reason_of_one_line() -> None:
    """The worker killed (kill -9) after 60 windows: they are kept, and the reason is the kill,
    not the last progress line (300 characters of window JSON, cut at the stderr tail's
    start: 'worker killed by SIGKILL: ll, "iters": 0, ...')."""
    runner = fake_runner(["dies"])
    (gpu,) = runner.run()
    assert gpu.stopped == "error" and len(gpu.windows) == 60
    assert gpu.reason == "worker killed by SIGKILL", gpu.reason
    assert exit_status((gpu,), False, True) == 3


def test_a_busy_gpu_is_not_soaked() -> None:
    (gpu,) = fake_runner(["busy"]).run()
    assert gpu.stopped == "skipped" and "other compute processes" in (gpu.reason or "")
    assert exit_status((gpu,), False, True) == 1


# -- plots of a GPU soak, usage, exit status -------------------------------------------------


def test_plots_of_gpu_soaks_one_pair_per_gpu(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    hot = heating(
        int4=[6.4, 6.3, 5.5, 4.2],
        bf16=[4.0, 4.0, 3.9, 3.9],
        memory=[45, 70, 86, 91],
        gpu=[40, 60, 72, 78],
    )
    spark = heating(int4=[3.0, 2.9, 2.9], bf16=[1.5, 1.5, 1.5], memory=[None] * 3, gpu=[38, 55, 71])
    paths = soak_plot.plot(report(gpu_soak(hot), gpu_soak(spark, index=1)), tmp_path / "h200.png")
    assert [p.name for p in paths] == [
        "h200-gpu0-time.png",
        "h200-gpu0-temperature.png",
        "h200-gpu1-time.png",
        "h200-gpu1-temperature.png",
    ]
    assert all(p.read_bytes()[:4] == PNG for p in paths)


def test_plot_without_matplotlib_is_a_usage_error_before_any_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(plotting, "available", lambda: False)
    result = CliRunner().invoke(main, ["soak", *CPU, "--duration", "1", "--plot", str(tmp_path),
                                       "--state-dir", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 2
    assert "--plot needs matplotlib, which is not installed: pip install matplotlib" in (
        result.output
    )
    assert "soaking" not in result.output and not (tmp_path / FILENAME).exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--duration", "ten"], "give seconds, or a duration like 90s, 10m or 1h30m"),
        (["--duration", "0"], "must be more than 0"),
        (["--duration", "25h"], "at most 24 h"),
        (["--window", "0"], "--window"),
        (["--gpu", "x"], "give all, N or N,M"),
        (["--gpu", "all,0"], "give all or GPU indices, not both"),
        (["--device", "cpu", "--gpu", "0"], "give --device or --gpu, not both"),
        (
            ["--gpu", "5", "--nvml-fixture", str(NVML / "h200-idle.json")],
            "no GPU with index 5 (NVML sees: 0)",
        ),
        (["--dtype", "fp64"], "--dtype"),
        (["--probe.timeout", "0"], "probe.timeout"),
    ],
)
def test_usage_errors(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(main, ["soak", *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output


def test_a_missing_nvml_fixture_is_refused_with_device_cpu(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["soak", *CPU, "--duration", "1", "--nvml-fixture",
                                       str(tmp_path / "missing.json"),
                                       "--state-dir", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--nvml-fixture" in result.output and "missing.json" in result.output
    assert "soaking" not in result.output and not (tmp_path / FILENAME).exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--csv", "/nonexistent/dir/soak.csv"], "'--csv': folder /nonexistent/dir does not exist"),
        (["--csv", "{tmp}"], "'--csv': File '{tmp}' is a directory"),  # click's own check
        (["--json", "/nonexistent/soak.json"], "'--json': folder /nonexistent does not exist"),
        (["--plot", "/nonexistent/dir"], "'--plot': folder /nonexistent does not exist"),
        (["--plot", "/nonexistent/dir/"], "'--plot': folder /nonexistent does not exist"),
        # os.access says yes to root for these: the soak ran, then could not write them
        (["--csv", "/proc/soak.csv"], "'--csv': cannot create /proc/soak.csv: No such file"),
        (["--json", "/proc/soak.json"], "'--json': cannot create /proc/soak.json: No such file"),
        (["--csv", "-", "--json", "-"], "give - (standard output) to --csv or to --json, not"),
        (["--csv", "{tmp}/s.out", "--json", "{tmp}/s.out"], "both name {tmp}/s.out: one would"),
    ],
)
def test_output_paths_are_checked_before_any_load(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    """Issue 21: a bad --csv failed after the soak ran, --plot made any folder it was given."""
    pytest.importorskip("matplotlib")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = CliRunner().invoke(main, ["soak", *CPU, "--duration", "1", *args,
                                       "--state-dir", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert needle.replace("{tmp}", str(tmp_path)) in result.output
    assert "soaking" not in result.output and not (tmp_path / FILENAME).exists()
    assert not Path("/nonexistent").exists()


@pytest.mark.parametrize(
    ("state", "needle"),
    [
        ("/proc/sparkdiag-state", "cannot write in folder /proc (to create sparkdiag-state in)"),
        ("{tmp}/file/state", "{tmp}/file is not a folder (to create state in)"),
    ],
)
def test_the_state_directory_is_checked_before_any_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str, needle: str
) -> None:
    """With --record (the default) soak loaded in full, then said "cannot write the soak state:
    ... not writable" (exit 1); --no-record keeps nothing there and needs no check."""
    (tmp_path / "file").write_text("")
    state = state.replace("{tmp}", str(tmp_path))

    def past_the_checks(_command: str) -> None:
        raise soak_command.UsageError("past the checks")

    monkeypatch.setattr(soak_command, "require_torch", past_the_checks)
    result = CliRunner().invoke(main, ["soak", *CPU, "--duration", "1", "--state-dir", state])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: Invalid value for '--state-dir': ")
    assert needle.replace("{tmp}", str(tmp_path)) in result.output
    assert "give another --state-dir, or --no-record" in result.output
    unrecorded = ["soak", *CPU, "--duration", "1", "--state-dir", state, "--no-record"]
    assert CliRunner().invoke(main, unrecorded).output == "Error: past the checks\n"


@pytest.mark.worker
def test_csv_dash_prints_the_rows_instead_of_the_text(tmp_path: Path) -> None:
    """``--csv -`` made a file named ``-``; as ``--json`` alone, it is standard output."""
    pytest.importorskip("torch")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        sparkdiag_cmd("soak", *CPU, "--duration", "1", "--dtype", "bf16", "--csv", "-",
                      "--no-record"),
        capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = list(csv.reader(result.stdout.splitlines()))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) > 1
    assert list(tmp_path.iterdir()) == []


def test_the_progress_says_the_seconds_of_load_left() -> None:
    """Issue 21: click's ETA counted the worker's start as load (33 s left at 10 % of 10 s)."""
    hot = heating(int4=[6.4, 6.3], bf16=[4.0, 4.0], memory=[40, 50])
    job = Job(Target("GPU 0", 0, "GPU-0"), WorkerRequest(soak_seconds=10))
    progress = soak_command._Progress([job], 10.0, tty=False)
    progress.window(0, replace(hot[1], elapsed_seconds=1.0))
    assert "(1.0 s, 9 s left)" in progress.status


def test_no_gpu_is_one_line() -> None:
    result = CliRunner().invoke(main, ["soak", "--nvml-fixture", str(NVML / "no-nvml.json")])
    assert result.exit_code == 1
    assert "no GPU to soak" in result.output and "--device cpu --small" in result.output


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("600", 600), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("1.5h", 5400), ("2m30s", 150)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_help_explains() -> None:
    result = CliRunner().invoke(main, ["soak", "--help"])
    assert result.exit_code == 0
    for needle in (
        "--duration",
        "--window",
        "--gpu",
        "--json [FILE]",
        "--csv FILE",
        "--plot DIR|PREFIX",
        "--state-dir",
        "--probe.timeout",
        "Exit status",
        "Ctrl-C",
        "memory",
    ):
        assert needle in result.output, needle


def test_soak_takes_its_settings_from_the_option_table() -> None:
    settings = settings_from("soak", {})
    assert settings.probe_timeout == 120.0 and settings.probe_when == "idle"
    assert settings.log_level == "info" and settings.state_dir is None


@pytest.mark.worker  # the real probe worker on CPU torch, as the other soaks on --device cpu
def test_a_soak_that_measured_nothing_is_not_ok(tmp_path: Path) -> None:
    """Every kernel asked for unsupported on the device: it was loaded for the whole duration,
    then "completed", exit 0 (the bad-input review); exit 1, as the help says."""
    pytest.importorskip("torch")
    result = run_soak("--device", "cpu", "--small", "--no-record", "--dtype", "fp8",
                      "--duration", "1", "--window", "0.5")  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "not measured: fp8" in " ".join(result.stdout.split())


@pytest.mark.worker  # the real probe worker on CPU torch, as the other soaks on --device cpu
def test_ctrl_c_while_the_results_are_written_still_interrupts(tmp_path: Path) -> None:
    """After the load the signals only set the stop: a --json into a FIFO nobody read held soak
    in its write, Ctrl-C twice was swallowed, and once a reader came it exited 0 "completed"
    (the hostile review). Now a signal interrupts the writes: exit 130."""
    pytest.importorskip("torch")
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        sparkdiag_cmd("soak", *CPU, "--duration", "0.5", "--json", str(fifo), "--no-record"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    wchan = Path(f"/proc/{proc.pid}/wchan")
    # blocked opening the FIFO to write
    _out, err = signal_when(proc, lambda: wchan.read_text() == "wait_for_partner", signal.SIGINT)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
