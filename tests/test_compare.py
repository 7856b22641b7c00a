"""``sparkdiag compare``: native against a container, driven through real processes.

No Docker engine here (nor in CI): the "container" is a stand-in command that starts a different
interpreter environment, a second virtual environment with its own torch, under a cleared
environment (``env -i``), and the worker reaches it on standard input exactly as it would reach
``docker run -i IMAGE python3 -``. The failure modes use stand-in scripts in
``tests/support/compare_scripts``. Nothing mocks subprocess.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sparkdiag.cli import main
from sparkdiag.commands.compare import container_argv
from sparkdiag.compare import report
from sparkdiag.compare.causes import explain
from sparkdiag.compare.rounds import compare
from sparkdiag.errors import Exit
from sparkdiag.probe.container import container_command
from sparkdiag.probe.diagnosis import diagnose
from sparkdiag.probe.runner import ProbeCycle, ProbeResult
from tests.support import signal_when, wait_dead

HELPERS = Path(__file__).parent / "support" / "compare_scripts"
FAKE_SIDE = HELPERS / "fake_side.py"
FAKE_RUNTIME = HELPERS / "fake_runtime.py"
# The stand-in container's cleared environment. One intra-op thread on both sides: with two
# threads on a small shared CPU, tiny GEMMs stall on thread hand-offs and the figures scatter
# over two orders of magnitude; with one they repeat within some 20 %.
THREADS = "OMP_NUM_THREADS=1"
CLEARED = ["env", "-i", "PATH=/usr/bin:/bin", THREADS]
ROOT = Path(__file__).resolve().parent.parent


def side(mode: str, *opts: str) -> list[str]:
    return [sys.executable, str(FAKE_SIDE), mode, *opts]


def container_side(mode: str, *opts: str) -> list[str]:
    """A stand-in container that insists on receiving the worker's source on stdin."""
    return [*side(mode, "stdin=1", *opts), "-"]


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkdiag", "compare", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def read_pids(path: Path, seconds: float = 10.0) -> list[int]:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if path.exists() and path.read_text().endswith("\n"):
            return [int(x) for x in path.read_text().split()]
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


def invocations(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _venv_python(root: Path) -> Path:
    return root / "bin" / "python"


def _make_venv(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "venv", *extra, str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="session")
def torch_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second virtual environment with its own torch: the stand-in container's interpreter.

    pip installs the CPU build of torch 2.13.0 (as scripts/test does for the main environment);
    this takes about a minute. Without it the real-path tests are skipped locally, and fail in
    CI (CI=true), where they must run.
    """
    root = tmp_path_factory.mktemp("container-venv") / "venv"

    def unavailable(why: str) -> None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot build the stand-in container environment: {why}")
        pytest.skip(f"cannot build the stand-in container environment: {why}")

    made = _make_venv(root)
    if made.returncode != 0:
        unavailable(made.stderr[-2000:])
    pip = subprocess.run(
        [
            str(_venv_python(root)),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "torch==2.13.0",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if pip.returncode != 0:
        unavailable(f"pip install torch==2.13.0 failed: {pip.stderr[-2000:]}")
    return root


@pytest.fixture(scope="session")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter environment with nothing installed: no pip, no torch."""
    root = tmp_path_factory.mktemp("bare-venv") / "venv"
    made = _make_venv(root, "--without-pip")
    assert made.returncode == 0, made.stderr
    return root


def _version_in(python: Path, dist: str) -> str:
    """A distribution's version as that interpreter sees it (without importing it)."""
    out = subprocess.run(
        [
            *CLEARED,
            str(python),
            "-c",
            f"import importlib.metadata as m; print(m.version({dist!r}))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


# --------------------------------------------------------------------------------------------
# the whole path, for real: this environment natively, a second one as the "container"


def test_real_second_environment_json(torch_venv: Path) -> None:
    python = _venv_python(torch_venv)
    started = time.monotonic()
    done = cli(
        "--json",
        "--device",
        "cpu",
        "--small",
        "--dtype",
        "bf16",
        "--iters",
        "5",
        "--rounds",
        "2",
        "--max-gap",
        "0.9",
        "--container",
        *CLEARED,
        str(python),
        "-",
    )
    elapsed = time.monotonic() - started
    doc = json.loads(done.stdout)  # one complete JSON document on stdout
    assert doc["schema"] == "sparkdiag-compare/1"
    assert done.returncode == doc["exit_code"], done.stderr
    assert doc["failures"] == [], doc["failures"]
    assert doc["verdict"] in ("ok", "gap")
    assert done.returncode in (0, 1)
    # A B A B: one warm-up pair, then two measured pairs, native first in each
    assert [(c["label"], c["side"]) for c in doc["cycles"]] == [
        ("warm-up 1", "native"),
        ("warm-up 1", "container"),
        ("round 1/2", "native"),
        ("round 1/2", "container"),
        ("round 2/2", "native"),
        ("round 2/2", "container"),
    ]
    assert all(c["result"] == "ok" for c in doc["cycles"])
    # the container side got the worker on stdin: its command ends with "-", nothing else
    assert doc["container"]["command"] == [*CLEARED, str(python)]
    assert "--device" in doc["container_args"] and "cpu" in doc["container_args"]
    # each side's identity comes from its own environment
    assert doc["native"]["software"]["torch"] == importlib.metadata.version("torch")
    assert doc["container"]["software"]["torch"] == _version_in(python, "torch")
    assert doc["native"]["software"]["device"] == doc["container"]["software"]["device"] == "cpu"
    rows = {r["dtype"] + " " + r["shape"] + f" {r['beta']}": r for r in doc["rows"]}
    assert "bf16 256x256x256 0" in rows and "bandwidth copy 0" in rows
    for row in doc["rows"]:
        # both sides measured every round
        assert len(row["native"]) == len(row["container"]) == 2
        assert all(v is not None and v > 0 for v in row["native"] + row["container"])
        assert row["ratio"] is not None
        assert row["ratio_min"] <= row["ratio_max"]
    compute = rows["bf16 256x256x256 0"]
    assert 0.3 < compute["ratio"] < 3.0, compute  # CPU timings are noisy; a loose band
    print(
        f"\nreal CPU comparison in {elapsed:.1f} s: "
        + "; ".join(
            f"{r['dtype']} {r['shape']} beta={r['beta']}: native {r['native_median']:.4g} "
            f"container {r['container_median']:.4g} {r['unit']} ratio {r['ratio']:.3f} "
            f"({r['ratio_min']:.3f}-{r['ratio_max']:.3f})"
            for r in doc["rows"]
        )
    )


def test_real_second_environment_human(torch_venv: Path) -> None:
    python = _venv_python(torch_venv)
    done = cli(
        "--device",
        "cpu",
        "--small",
        "--dtype",
        "bf16",
        "--shape",
        "128x128x128",
        "--iters",
        "5",
        "--no-bandwidth",
        "--rounds",
        "1",
        "--warmup-rounds",
        "0",
        "--max-gap",
        "90%",
        "--",
        *CLEARED,
        str(python),
        "-",
    )
    assert done.returncode in (0, 1), done.stderr
    out = done.stdout
    assert "128x128x128" in out and "TFLOPS" in out
    assert "software" in out and "torch" in out
    torch_line = next(line for line in out.splitlines() if line.startswith("torch "))
    native_torch, venv_torch = importlib.metadata.version("torch"), _version_in(python, "torch")
    # the software table says "same" where both sides agree
    assert torch_line.split()[1:3] == [
        native_torch,
        "same" if venv_torch == native_torch else venv_torch,
    ]
    assert "worst gap:" in out and "why:" in out
    assert "round 1/1: container…" in done.stderr
    assert "round 1/1: native…" in done.stderr
    print("\n" + out)


# --------------------------------------------------------------------------------------------
# failure modes


def test_runtime_binary_missing_fails_before_any_cycle() -> None:
    result = compare(
        ["sparkdiag-no-such-runtime", "run", "-i", "--rm", "IMAGE", "python3", "-"],
        native=side("gpu"),
    )
    assert result.cycles == ()  # not even the native cycle ran
    (failure,) = result.failures
    assert failure.kind == "runtime_missing"
    assert "container runtime 'sparkdiag-no-such-runtime' not found on PATH" in failure.message
    assert result.exit_code(0.15) == Exit.FAILED


def test_runtime_start_failure_reported_by_the_runner_is_classified() -> None:
    # the runner's own wording when Popen fails (the pre-flight check catches most cases)
    cycle = ProbeCycle(
        result="error",
        reason="cannot start worker 'docker': [Errno 2] No such file or directory: 'docker'",
        document=None,
        stderr_tail="",
        returncode=None,
        wall_seconds=0.0,
        worker_pid=None,
    )
    failure = diagnose("container", cycle, ["docker", "run"], 120)
    assert failure is not None and failure.kind == "runtime_missing"
    assert failure.message == "container runtime 'docker' not found on PATH"


def test_native_interpreter_missing(tmp_path: Path) -> None:
    result = compare(container_side("gpu"), native=[str(tmp_path / "no-python")])
    (failure,) = result.failures
    assert failure.side == "native" and failure.kind == "runtime_missing"
    assert "native interpreter" in failure.message and "not found" in failure.message
    assert [c.side for c in result.cycles] == ["native"]


def _docker_shim(tmp_path: Path) -> Path:
    """The fake runtime under the name users know: an executable file named docker."""
    shim = tmp_path / "bin" / "docker"
    shim.parent.mkdir()
    shim.write_text(f"#!{sys.executable}\n" + FAKE_RUNTIME.read_text(), encoding="utf-8")
    shim.chmod(0o755)
    return shim


def test_image_missing(tmp_path: Path) -> None:
    docker = _docker_shim(tmp_path)
    image = "nvcr.io/nvidia/pytorch:99.01-py3"
    result = compare(
        [str(docker), "missing-image", "-i", "--rm", "--gpus", "all", image, "python3", "-"],
        native=side("gpu"),
    )
    (failure,) = result.failures
    assert failure.kind == "image_missing"
    assert failure.message == f"image not found: {image} (docker pull {image})"
    assert "manifest unknown" in failure.stderr_tail
    assert failure.detail is not None and "125" in failure.detail
    # the broken container ran once, after the native warm-up cycle
    assert [c.side for c in result.cycles] == ["native", "container"]


def test_no_torch_inside(bare_venv: Path) -> None:
    result = compare([*CLEARED, str(_venv_python(bare_venv)), "-"], native=side("cpu"))
    (failure,) = result.failures
    assert failure.kind == "no_torch"
    assert failure.message.startswith("the interpreter inside the container has no torch")
    assert "NGC PyTorch image" in failure.message
    # the worker got far enough to say so in its document, with its python
    assert result.container.software.get("torch") is None
    assert result.container.software.get("python")


def test_no_torch_natively(bare_venv: Path) -> None:
    result = compare(container_side("cpu"), native=[*CLEARED, str(_venv_python(bare_venv))])
    (failure,) = result.failures
    assert failure.side == "native" and failure.kind == "no_torch"
    assert "--native-python" in failure.message


def test_container_hangs_killed_with_its_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    started = time.monotonic()
    result = compare(
        container_side("hang", f"pidfile={pidfile}"),
        native=side("cpu"),
        timeout=2,
        kill_grace=0.5,
    )
    elapsed = time.monotonic() - started
    (failure,) = result.failures
    assert failure.kind == "timeout"
    assert failure.message.startswith(
        "container did not answer within 2 s; killed with its process group"
    )
    pids = read_pids(pidfile)
    assert len(pids) == 2
    assert wait_dead(pids) == []  # the stand-in container and the child it started
    # one native cycle (a fraction of a second) + 2 s timeout + 0.5 s grace + slack
    assert elapsed < 2 + 6, elapsed
    assert [c.result for c in result.cycles] == ["ok", "timeout"]


def test_garbage_output_stops_after_one_container_cycle(tmp_path: Path) -> None:
    record = tmp_path / "calls"
    result = compare(container_side("garbage", f"record={record}"), native=side("cpu"), rounds=3)
    (failure,) = result.failures
    assert failure.kind == "not_json"
    assert failure.message.startswith(
        "container printed something that is not sparkdiag's worker JSON: first bytes "
    )
    assert "502 Bad Gateway" in failure.message
    assert len(invocations(record)) == 1  # a broken container is not started again


@pytest.mark.parametrize("tflops", ["-5", "0", "nan", "inf", "1e30"])
def test_a_document_with_impossible_figures_is_not_a_measurement(tflops: str) -> None:
    """A container that prints a worker document of the right schema whose figures no GPU
    gives: negative, zero, NaN or infinite TFLOPS were dropped to n/a and the rest judged (exit
    0 "within --max-gap" on the bandwidth row alone), 1e30 TFLOPS passed as a 10^30 speed-up.
    It is a failed side (exit 3) that names the figure."""
    result = compare(container_side("gpu", f"tflops={tflops}"), native=side("gpu"), rounds=2)
    (failure,) = result.failures
    assert failure.side == "container" and failure.kind == "not_json"
    assert failure.message.startswith(
        "container printed a worker document with an impossible figure (bf16 8192x8192x8192 "
        "delivered "
    ), failure.message
    assert result.rows == () and result.exit_code(0.15) == Exit.FAILED
    # a real worker's document, figures and all, is no such thing
    assert compare(container_side("gpu"), native=side("gpu"), rounds=1).failures == ()


def test_a_side_that_measured_no_kernel_is_no_verdict() -> None:
    """A container whose document held no kernel (its results empty) left the GEMM rows n/a
    and the verdict to the copy bandwidth alone: exit 1 or 0 on a comparison of GEMMs that never
    ran there. Nothing was measured on both sides: exit 3 (the hostile review)."""
    result = compare(container_side("gpu", "results=none"), native=side("gpu"), rounds=1)
    assert result.failures == ()
    assert {r.key: r.ratio for r in result.rows}["bandwidth copy"] == pytest.approx(1.0)
    assert result.worst_row is None and result.verdict(0.15) == "no-data"
    assert result.exit_code(0.15) == Exit.FAILED
    assert "no kernel was measured on both sides" in explain(result, 0.15)


def test_no_gpu_inside_container(tmp_path: Path) -> None:
    record = tmp_path / "calls"
    result = compare(container_side("nogpu", f"record={record}"), native=side("gpu"))
    (failure,) = result.failures
    assert failure.kind == "no_gpu"
    assert failure.message.startswith("no GPU inside the container: add --gpus all (docker)")
    assert "--device nvidia.com/gpu=all (podman)" in failure.message
    # the container was asked for the device native used
    (argv,) = invocations(record)
    assert argv[argv.index("--device") + 1] == "cuda:0"


def test_no_gpu_inside_docker_container(tmp_path: Path) -> None:
    docker = _docker_shim(tmp_path)
    result = compare(
        [str(docker), "exec", "--", *container_side("nogpu-unsupported")], native=side("gpu")
    )
    (failure,) = result.failures
    assert failure.kind == "no_gpu"
    assert failure.message.startswith("no GPU inside the container: add --gpus all (docker)")
    assert "cuda:0 is not available to torch" in failure.message
    assert result.container.software["torch"] == "2.11.0+cu130"


def test_shell_metacharacters_are_passed_literally(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    pwned2 = tmp_path / "pwned2"
    record = tmp_path / "calls"
    tricky = [f"--name=x; touch {pwned}", f"$(touch {pwned2})", "`id`", "a && b | c > d"]
    container = [
        sys.executable,
        str(FAKE_RUNTIME),
        "exec",
        f"record={record}",
        *tricky,
        "--",
        *container_side("gpu"),
    ]
    result = compare(container, native=side("gpu"), rounds=1)
    assert result.failures == ()
    calls = invocations(record)
    assert len(calls) == 2  # warm-up and one round
    assert all(call[3 : 3 + len(tricky)] == tricky for call in calls)
    assert not pwned.exists() and not pwned2.exists()
    assert not (tmp_path / "d").exists()


def test_shell_metacharacters_through_the_command_line(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    record = tmp_path / "calls"
    one_string = (
        f"{sys.executable} {FAKE_RUNTIME} exec record={record} "
        f"'--label=x; touch {pwned}' -- {sys.executable} {FAKE_SIDE} gpu stdin=1 -"
    )
    done = cli(
        "--json",
        "--rounds",
        "1",
        "--native-python",
        f"{sys.executable} {FAKE_SIDE} gpu",
        "--container",
        one_string,
    )
    doc = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert doc["failures"] == []
    assert f"--label=x; touch {pwned}" in doc["container"]["command"]
    assert all(f"--label=x; touch {pwned}" in call for call in invocations(record))
    assert not pwned.exists()


# --------------------------------------------------------------------------------------------
# figures, verdicts and the why


def test_ngc_banner_on_stdout_is_tolerated_and_gap_reported() -> None:
    result = compare(
        container_side("banner", "tflops=560", "torch=2.9.0a0+50eac81"),
        native=side("gpu", "tflops=700"),
        rounds=2,
    )
    assert result.failures == ()
    rows = {r.key: r for r in result.rows}
    bf16 = rows["bf16 8192x8192x8192"]
    assert bf16.native == (700.0, 700.0) and bf16.container == (560.0, 560.0)
    assert bf16.ratio == pytest.approx(0.8)
    assert bf16.gap == pytest.approx(0.2)
    assert bf16.verdict(0.15) == "slower"
    assert rows["bandwidth copy"].ratio == pytest.approx(1.0)
    assert rows["nvfp4 8192x8192x8192"].ratio is None
    assert "unsupported on both sides" in (rows["nvfp4 8192x8192x8192"].note() or "")
    assert result.worst_gap == pytest.approx(0.2)
    assert result.exit_code(0.15) == Exit.ATTENTION
    assert result.exit_code(0.25) == Exit.OK
    assert [d.component for d in result.differences] == ["torch"]
    why = explain(result, 0.15)
    assert "different libraries (torch 2.11.0+cu130 vs 2.9.0a0+50eac81)" in why


def test_same_libraries_gap_blames_the_environment() -> None:
    result = compare(
        container_side("gpu", "tflops=500"), native=side("gpu", "tflops=700"), rounds=1
    )
    assert result.differences == ()
    assert result.exit_code(0.15) == Exit.ATTENTION
    assert "container environment itself" in explain(result, 0.15)


def test_cli_gap_exit_code_and_human_report() -> None:
    done = cli(
        "--rounds",
        "2",
        "--native-python",
        f"{sys.executable} {FAKE_SIDE} gpu",
        "--container",
        *container_side("banner", "tflops=560", "torch=2.9.0a0+50eac81"),
    )
    assert done.returncode == 1, done.stderr
    out = done.stdout
    assert "SLOWER" in out
    assert "worst gap: 20.0 % (bf16 " in out
    assert "exceeds --max-gap 15 %: the container is SLOWER" in out
    assert "differ (*): torch" in out
    assert "sw_power_cap" in out  # conditions of each side
    assert "round 2/2: container…" in done.stderr


def test_an_interrupted_compare_reports_the_rounds_it_measured(tmp_path: Path) -> None:
    """Ctrl-C in round 2 lost round 1's measured pair: "Error: interrupted", exit 130 and no
    report (the hostile review). Now the pairs measured before are reported, exit 130."""
    record = tmp_path / "starts"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkdiag", "compare", "--rounds", "3", "--warmup-rounds", "0",
         "--native-python", f"{sys.executable} {FAKE_SIDE} gpu",
         "--container", *container_side("gpu", f"record={record}", "hang_from=2")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    out, err = signal_when(
        proc,
        lambda: record.exists() and len(record.read_text().splitlines()) >= 2,
        signal.SIGINT,
        timeout=60,
    )
    assert proc.returncode == 130, err
    assert "bf16 8192x8192x8192" in out and "worst gap: 0.0 %" in out, out
    assert "interrupted (SIGINT) after 1 of 3 measured round(s)" in " ".join(err.split())


def test_cli_failure_exit_code_and_json_document() -> None:
    done = cli(
        "--json",
        "--native-python",
        f"{sys.executable} {FAKE_SIDE} cpu",
        "--container",
        *container_side("garbage"),
    )
    assert done.returncode == 3
    doc = json.loads(done.stdout)
    assert doc["verdict"] == "failed" and doc["exit_code"] == 3
    assert doc["rows"] == []
    assert doc["failures"][0]["kind"] == "not_json"


def test_cli_failure_human_goes_to_stderr(tmp_path: Path) -> None:
    docker = _docker_shim(tmp_path)
    image = "nvcr.io/nvidia/pytorch:99.01-py3"
    done = cli(
        "--native-python",
        f"{sys.executable} {FAKE_SIDE} gpu",
        "--container",
        str(docker),
        "missing-image",
        "-i",
        "--rm",
        image,
        "python3",
        "-",
    )
    assert done.returncode == 3
    assert done.stdout == ""
    said = " ".join(done.stderr.split())  # the words, as wrapped to the terminal's width
    assert f"image not found: {image} (docker pull {image})" in said
    assert "| docker: Error response from daemon" in done.stderr


def test_sigterm_kills_the_running_side(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sparkdiag",
            "compare",
            "--probe.timeout",
            "60",
            "--native-python",
            f"{sys.executable} {FAKE_SIDE} cpu",
            "--container",
            *container_side("hang", f"pidfile={pidfile}"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        pids = read_pids(pidfile, seconds=30)
        proc.send_signal(signal.SIGTERM)
        # interrupted, as Ctrl-C: the README's exit table (SIGTERM exited 143 before issue 34)
        assert proc.wait(timeout=10) == 130
        assert wait_dead(pids) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()


# --------------------------------------------------------------------------------------------
# the command line's shapes of CMD, and usage errors


def test_container_command_strips_one_trailing_dash() -> None:
    assert container_command(["docker", "run", "-i", "IMG", "python3", "-"]) == (
        "docker",
        "run",
        "-i",
        "IMG",
        "python3",
    )
    assert container_command(["docker", "run", "-i", "IMG", "python3"])[-1] == "python3"
    with pytest.raises(ValueError):
        container_command(["-"])


def test_container_argv_forms() -> None:
    assert container_argv(["docker run -i --rm 'my image' python3 -"]) == [
        "docker",
        "run",
        "-i",
        "--rm",
        "my image",
        "python3",
        "-",
    ]
    assert container_argv(["docker", "run", "-i"]) == ["docker", "run", "-i"]


@pytest.mark.parametrize("marker", ["--container", "--"])
def test_cli_takes_everything_after_the_marker_as_cmd(marker: str) -> None:
    runner = CliRunner()
    cmd = ["sparkdiag-no-such-docker", "run", "-i", "--rm", "--gpus", "all", "--json", "-"]
    result = runner.invoke(main, ["compare", "--json", "--rounds", "1", marker, *cmd])
    assert result.exit_code == 3, result.output
    doc = json.loads(result.stdout)
    # "-i", "--rm", "--json" belong to CMD, not to sparkdiag; the trailing "-" is dropped
    assert doc["container"]["command"] == cmd[:-1]
    assert doc["failures"][0]["kind"] == "runtime_missing"


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--container"],
        ["--max-gap", "1.5", "--container", "docker", "run"],
        ["--max-gap", "abc", "--container", "docker", "run"],
        ["--dtype", "fp64", "--container", "docker", "run"],
        ["--shape", "8x8", "--container", "docker", "run"],
        ["--device", "gpu0", "--container", "docker", "run"],
        ["--container", "docker run 'unbalanced"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    result = CliRunner().invoke(main, ["compare", *args])
    assert result.exit_code == 2, result.output


@pytest.mark.parametrize("args", [[], ["--container"], ["--"], ["--container", "-"]])
def test_no_container_command_is_one_line_with_the_example(args: list[str]) -> None:
    """Its newline came out as a literal \\x0a (cli.py escapes control characters in errors)."""
    result = CliRunner().invoke(main, ["compare", *args])
    assert result.exit_code == 2
    example = "sparkdiag compare --container docker run -i --rm --gpus all IMAGE python3 -"
    assert result.stderr == (
        "Error: give the container command after --container (or after --), for example: "
        f"{example}\n"
    )


def test_max_gap_accepts_percentages() -> None:
    result = CliRunner().invoke(
        main, ["compare", "--json", "--max-gap", "20%", "--", "sparkdiag-no-such-docker"]
    )
    assert json.loads(result.stdout)["max_gap"] == pytest.approx(0.2)


def test_to_dict_is_strict_json() -> None:
    result = compare(container_side("gpu"), native=side("gpu"), rounds=1, warmup_rounds=0)
    text = json.dumps(report.to_dict(result, 0.15), allow_nan=False)
    doc: dict[str, Any] = json.loads(text)
    assert doc["verdict"] == "ok" and doc["worst_gap"] == pytest.approx(0.0)


def _cycle(
    stderr: str, returncode: int | None = 125, result: ProbeResult = "error", reason: str = "x"
) -> ProbeCycle:
    return ProbeCycle(
        result=result,
        reason=reason,
        document=None,
        stderr_tail=stderr,
        returncode=returncode,
        wall_seconds=1.0,
        worker_pid=1,
    )


@pytest.mark.parametrize(
    ("command", "cycle", "kind", "expected"),
    [
        (
            ["docker", "run", "-i", "IMG", "python3"],
            _cycle(
                "docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                "Is the docker daemon running?"
            ),
            "runtime_unusable",
            "docker cannot reach its daemon",
        ),
        (
            ["docker", "run", "-i", "IMG", "python3"],
            _cycle(
                'docker: Error response from daemon: could not select device driver "" with '
                "capabilities: [[gpu]]."
            ),
            "runtime_unusable",
            "NVIDIA Container Toolkit",
        ),
        (
            ["docker", "run", "-i", "IMG", "python9"],
            _cycle(
                'docker: Error response from daemon: failed to create task: exec: "python9": '
                "executable file not found in $PATH: unknown.",
                returncode=127,
            ),
            "no_interpreter",
            "no interpreter 'python9' inside the container",
        ),
        (
            ["podman", "run", "-i", "nvcr.io/x:1", "python3"],
            _cycle(
                "Error: initializing source docker://nvcr.io/x:1: reading manifest 1 in "
                "nvcr.io/x: manifest unknown"
            ),
            "image_missing",
            "image not found: nvcr.io/x:1 (podman pull nvcr.io/x:1)",
        ),
        (
            ["docker", "run", "-it", "IMG", "python3"],
            _cycle("the input device is not a TTY", returncode=1),
            "error",
            "drop it",
        ),
        (
            ["docker", "run", "--rm", "IMG", "python3"],
            _cycle("", returncode=0, reason="worker printed no JSON"),
            "not_json",
            "docker needs -i to pass standard input into the container",
        ),
        (
            ["docker", "run", "-i", "nvcr.io/nvidia/pytorch:25.09-py3", "python3"],
            _cycle(
                "Unable to find image 'nvcr.io/nvidia/pytorch:25.09-py3' locally\n"
                "25.09-py3: Pulling from nvidia/pytorch\n",
                returncode=-9,
                result="timeout",
            ),
            "timeout",
            "docker was still pulling the image: pull it first "
            "(docker pull nvcr.io/nvidia/pytorch:25.09-py3) or raise --probe.timeout",
        ),
    ],
)
def test_diagnose_runtime_messages(
    command: list[str], cycle: ProbeCycle, kind: str, expected: str
) -> None:
    failure = diagnose("container", cycle, command, 120)
    assert failure is not None
    assert failure.kind == kind
    assert expected in failure.message


def test_diagnosis_names_another_process_on_the_gpu() -> None:
    """Seen on the lent H200: a second process loading the GPU only during the container rounds
    lowered their clock too; the cause to name is the other process, not heat."""
    from sparkdiag.compare.causes import _sharing_text, _throttle_text

    native = {
        "mean_sm_clock_hertz": 1838e6,
        "clock_event_reasons": ["sw_power_cap"],
        "other_pids": [],
    }
    container = {
        "mean_sm_clock_hertz": 1715e6,
        "clock_event_reasons": ["sw_power_cap"],
        "other_pids": [601],
    }
    text = _sharing_text(native, container)
    assert text is not None and "pid 601" in text and "another process" in text
    assert _sharing_text(native, native) is None
    assert _throttle_text(native, container) is not None  # the clock drop is still visible


def test_progress_lines_wrap_to_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in a review: at 40 columns compare's progress lines on standard error ran past
    the edge ('sparkdiag compare: both sides probe cuda:0 (the device native chose)')."""
    from sparkdiag import terminal

    monkeypatch.setattr(terminal, "width", lambda stream=None: terminal.MIN_WIDTH)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = ["compare", "--rounds", "1", "--warmup-rounds", "0",
            "--native-python", f"{sys.executable} {FAKE_SIDE} gpu",
            "--container", *container_side("gpu")]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    said = result.stderr.splitlines()
    assert "both sides probe" in " ".join(result.stderr.split())
    assert all(len(line) <= terminal.MIN_WIDTH for line in said), "\n".join(said)


def test_a_side_that_could_not_be_killed_is_not_said_killed() -> None:
    """A worker still there after SIGKILL was reported "killed with its process group" above
    the runner's own line saying it could not be killed (found in a review)."""
    reason = (
        "worker did not finish within 2 s and could not be killed: pid 4242 still there 10 s "
        "after SIGKILL (stuck in the driver?)"
    )
    cycle = ProbeCycle("timeout", reason, None, "", None, 12.0, 4242)
    failure = diagnose("container", cycle, ["podman", "run", "img"], 2.0)
    assert failure is not None and failure.kind == "timeout"
    assert failure.message.startswith(f"container did not answer within 2 s, and {reason}")
    assert "killed with its process group" not in failure.message


def test_a_kernel_that_fails_in_the_container_fails_the_comparison() -> None:
    """The container's bf16 cube crashed every round: the row dropped out of the verdict,
    which read 'worst gap: 0.0 % ... OK', exit 0 (found in a review)."""
    crash = "kernel_error=CUDA error: an illegal memory access"
    done = cli("--native-python", shlex.join(side("gpu")), "--rounds", "1",
               "--warmup-rounds", "0", "--container", *container_side("gpu", crash))  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "not judged: a kernel failed" in said
    assert (
        "why: a kernel failed: bf16 8192x8192x8192 (container: CUDA error: an illegal memory "
        "access)" in said
    )


def test_sides_on_different_gpus_are_not_comparable() -> None:
    """A container on another GPU (model) within --max-gap read OK, exit 0 (found in a
    review)."""
    done = cli("--native-python", shlex.join(side("gpu")), "--rounds", "1",
               "--warmup-rounds", "0", "--container",
               *container_side("gpu", "gpu_uuid=GPU-other", "gpu_name=NVIDIA B200"))  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "why: not comparable: the sides ran on different GPUs (gpu_name" in said


def test_a_gap_between_sides_timed_differently_says_so() -> None:
    """The decode shape timed as a CUDA graph natively and by events in the container read as
    'the container's CPU side is the bottleneck' (found in a review): the timing is named."""
    done = cli("--native-python", shlex.join(side("gpu", "timing=graph")), "--rounds", "1",
               "--warmup-rounds", "0", "--container",
               *container_side("gpu", "timing=events", "decode=4.5"))  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "the sides timed bf16 1x8192x8192 differently (CUDA graph replays on one" in said
    assert "CPU side is the bottleneck" not in said


def test_an_ok_on_the_cpu_or_from_one_round_says_what_it_rests_on() -> None:
    """Native's torch without CUDA compared CPU GEMMs on a GPU machine, and one round gave a
    verdict with no spread: both read as a plain OK, exit 0 (found in a review)."""
    done = cli("--native-python", shlex.join(side("cpu")), "--rounds", "1",
               "--warmup-rounds", "0", "--container", *container_side("cpu"))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "but both sides ran on the CPU: native's torch has no CUDA" in said
    assert "but one measured round: no spread to tell noise from a gap (--rounds 3)" in said
