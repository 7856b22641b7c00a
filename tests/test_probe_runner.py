"""The probe runner, driven by real subprocesses (no mocks of subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sparkdiag.probe import runner
from sparkdiag.probe.document import SCHEMA, find_document, parse_document
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.probe.runner import ProbeCycle, run_worker, worker_path, worker_source
from tests.support import wait_dead

FAKE = Path(__file__).parent / "support" / "probe_scripts" / "fake_worker.py"


def fake(mode: str, *args: str) -> list[str]:
    """The stand-in worker in ``mode``; ``args`` are the mode's own (before the worker's)."""
    return [sys.executable, str(FAKE), mode, *args]


def read_pids(path: Path) -> list[int]:
    end = time.monotonic() + 5
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.02)
    return [int(x) for x in path.read_text().split()]


def test_worker_path_and_source() -> None:
    assert worker_path().name == "worker"
    assert (worker_path() / "__main__.py").is_file()  # the package runs as one script
    assert SCHEMA in worker_source()


@pytest.mark.parametrize("ignore_term", [False, True])
def test_timeout_kills_worker_and_grandchild(tmp_path: Path, ignore_term: bool) -> None:
    pidfile = tmp_path / "pids"
    args = [str(pidfile)] + (["--ignore-term"] if ignore_term else [])
    start = time.monotonic()
    cycle = run_worker(fake("sleep", *args), timeout=1.5, kill_grace=0.5)
    elapsed = time.monotonic() - start
    assert cycle.result == "timeout"
    assert "1.5 s" in (cycle.reason or "")
    assert cycle.document is None
    assert cycle.returncode is not None and cycle.returncode < 0  # killed by a signal
    assert 1.4 < elapsed < 6.0
    worker, grandchild = read_pids(pidfile)
    assert worker == cycle.worker_pid
    assert wait_dead([worker, grandchild]) == []


def test_crash_is_error_and_keeps_stderr() -> None:
    cycle = run_worker(fake("crash"), timeout=20)
    assert cycle.result == "error"
    assert cycle.returncode == 3
    assert cycle.reason is not None
    assert cycle.reason.startswith("worker exited 3")
    assert "RuntimeError: CUDA error: an illegal memory access" in cycle.reason
    assert "Traceback (most recent call last)" in cycle.stderr_tail
    assert cycle.document is None


def test_garbage_output_is_error() -> None:
    cycle = run_worker(fake("garbage"), timeout=20)
    assert cycle.result == "error"
    assert cycle.returncode == 0
    assert "no JSON" in (cycle.reason or "")
    assert "hello, this is not JSON" in (cycle.reason or "")


def test_no_output_is_error() -> None:
    cycle = run_worker(fake("silent"), timeout=20)
    assert cycle.result == "error"
    assert (cycle.reason or "").startswith("worker printed no JSON")


def test_missing_interpreter_is_error() -> None:
    cycle = run_worker(["/nonexistent/bin/python3"], timeout=5)
    assert cycle.result == "error"
    assert cycle.returncode is None and cycle.worker_pid is None
    assert "cannot start worker" in (cycle.reason or "")


@pytest.fixture(scope="module")
def python_without_torch(tmp_path_factory: pytest.TempPathFactory) -> str:
    venv = tmp_path_factory.mktemp("notorch") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    python = str(venv / "bin" / "python")
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=60)
    if probe.returncode == 0:
        pytest.skip("the base interpreter has torch installed globally")
    return python


@pytest.mark.parametrize("stdin_script", [False, True])
def test_missing_torch_is_error(python_without_torch: str, stdin_script: bool) -> None:
    cycle = run_worker(
        [python_without_torch], WorkerRequest(small=True), timeout=30, stdin_script=stdin_script
    )
    assert cycle.result == "error"
    assert cycle.returncode == 1
    assert "torch" in (cycle.reason or "")
    assert "No module named 'torch'" in (cycle.reason or "")
    assert cycle.document is not None and cycle.document.status == "error"


@pytest.mark.parametrize(
    ("mode", "expected", "reason_part"),
    [
        ("ok", "ok", None),
        ("busy", "skipped_busy", "pids [4242]"),
        ("unsupported", "unsupported", "not available"),
        ("all_unsupported", "unsupported", "no requested kernel"),
        ("result_error", "error", "int8 256x256x256"),
    ],
)
def test_classification_of_documents(mode: str, expected: str, reason_part: str | None) -> None:
    cycle = run_worker(fake(mode), timeout=20)
    assert cycle.result == expected, cycle
    assert cycle.document is not None
    if reason_part is None:
        assert cycle.reason is None
    else:
        assert reason_part in (cycle.reason or "")


def test_stderr_tail_is_bounded() -> None:
    cycle = run_worker(fake("noisy"), timeout=20)
    assert cycle.result == "ok"
    assert len(cycle.stderr_tail.encode()) <= runner.STDERR_TAIL_BYTES
    assert cycle.stderr_tail.rstrip().endswith("last stderr line")


def test_lingering_grandchild_does_not_hold_the_cycle(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    start = time.monotonic()
    cycle = run_worker(fake("linger", str(pidfile)), timeout=30)
    assert cycle.result == "ok"
    assert time.monotonic() - start < 10
    worker, grandchild = read_pids(pidfile)
    assert wait_dead([worker, grandchild]) == []


def test_stdin_script_feeds_the_worker_source() -> None:
    cycle = run_worker(fake("echo_stdin"), timeout=20, stdin_script=True)
    assert cycle.result == "ok"
    assert cycle.document is not None
    size = len(worker_source().encode())
    assert cycle.document.results[0].reason == f"stdin {size} bytes"


def test_environment_is_passed(tmp_path: Path) -> None:
    script = tmp_path / "env_doc.py"
    script.write_text(
        "import json, os, sys\n"
        f"print(json.dumps({{'schema': {SCHEMA!r}, 'status': 'ok', 'reason': None,"
        " 'results': [], 'bandwidth': {'status': 'ok'}, 'env': dict(os.environ)}))\n"
    )
    cycle = run_worker([sys.executable, str(script)], env={"PATH": "/usr/bin", "X_PROBE": "1"})
    assert cycle.result == "ok"
    assert cycle.document is not None
    assert cycle.document.raw["env"].get("X_PROBE") == "1"
    assert "HOME" not in cycle.document.raw["env"]


def test_classify_directly() -> None:
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "status": "ok",
        "results": [],
        "bandwidth": None,
    }
    nothing = parse_document(doc)
    assert runner.classify(0, nothing, b"{}", "") == ("unsupported", "the worker probed nothing")
    doc["results"] = [{"dtype": "bf16", "shape": "1x2x3", "status": "ok"}]
    assert runner.classify(0, parse_document(doc), b"{}", "") == ("ok", None)
    assert runner.classify(-9, None, b"", "")[1] == "worker killed by SIGKILL"
    assert find_document(b'{"schema": "other/1"}') is None
    found = find_document(b"NGC banner\n" + json.dumps(doc).encode())
    assert found is not None and found.raw == doc


def test_probe_cycle_is_frozen() -> None:
    cycle = run_worker(fake("ok"), timeout=20)
    assert isinstance(cycle, ProbeCycle)
    with pytest.raises(AttributeError):
        cycle.result = "error"  # type: ignore[misc]
    assert cycle.wall_seconds > 0
    assert cycle.worker_pid is not None and cycle.worker_pid != os.getpid()


def test_a_worker_that_cannot_be_killed_does_not_hold_the_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in a review: after SIGKILL the runner waited for the worker with no timeout, so a
    worker stuck in the driver (D state: SIGKILL stays pending) held the probe thread, and with
    it the GPU's lock, for ever; its pid had already left the workers a stopping daemon kills.
    Stuck is stood in for by signals that never arrive: the runner's killpg drops them."""
    pidfile = tmp_path / "pids"
    deliver = runner.killpg
    stuck = threading.Event()
    stuck.set()

    def pending(pgid: int, sig: signal.Signals) -> None:
        if not stuck.is_set():
            deliver(pgid, sig)

    monkeypatch.setattr(runner, "killpg", pending)
    monkeypatch.setattr(runner, "KILLED_WAIT_SECONDS", 0.5, raising=False)
    out: dict[str, ProbeCycle] = {}

    def probe() -> None:
        out["cycle"] = run_worker(fake("sleep", str(pidfile)), timeout=1.0, kill_grace=0.3)

    thread = threading.Thread(target=probe, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(10)
    try:
        assert not thread.is_alive(), "the cycle waited for a worker that cannot be killed"
        assert time.monotonic() - start < 6
        cycle = out["cycle"]
        assert cycle.result == "timeout" and cycle.returncode is None
        assert "could not be killed" in (cycle.reason or "")
        assert "stuck in the driver?" in (cycle.reason or "")
        assert cycle.worker_pid in runner._LIVE  # a daemon that stops still signals it
        assert runner.kill_running_workers() == 1
    finally:
        worker, grandchild = read_pids(pidfile)
        stuck.clear()  # the driver lets it go
        deliver(worker, signal.SIGKILL)
        thread.join(10)
    # reaped by the runner's daemon thread, and out of the live workers once reaped
    end = time.monotonic() + 5
    while worker in runner._LIVE and time.monotonic() < end:
        time.sleep(0.02)
    assert worker not in runner._LIVE
    assert wait_dead([worker, grandchild]) == []
    with pytest.raises(ChildProcessError):
        os.waitpid(worker, os.WNOHANG)  # reaped: no zombie left behind
