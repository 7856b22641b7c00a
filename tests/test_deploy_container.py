"""The container image (Containerfile) and a real container engine (podman) for ``compare`` and
the daemon's container probe.

The images are built once a run by tests/support/engine.py: the shipped Containerfile on a
Debian base made by mmdebstrap, offline from the wheels pip makes here, without and with the
probe extra (CPU torch). The probe image is also the "PyTorch container" that ``compare`` and
``probe.container-command`` talk to, through ``podman run -i``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import NVML, ROOT, free_port, http_get, sparkdiag_cmd, terminate
from tests.support.engine import (
    ENGINE,
    LABEL,
    RUN_LIMITS,
    Images,
    container,
    containers_with_label,
    podman,
    wait_for,
)

pytestmark = pytest.mark.container

PYTHON_IN_IMAGE = "/opt/sparkdiag/bin/python"


# Every container of this test process also carries this label: "none left" is checked with
# it, as another pytest-xdist worker's test may have its containers running meanwhile (a hung
# container of test_a_container_that_never_answers, seen by the compare test's check)
WORKER = f"{LABEL}.worker={os.getpid()}"


def engine_run(*options: str) -> list[str]:
    """``podman --runtime runc run -i --rm`` with this host's limits and our labels."""
    return [*ENGINE, "run", "-i", "--rm", *RUN_LIMITS, "--label", f"{LABEL}=1",
            "--label", WORKER, *options]  # fmt: skip


def compare(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sparkdiag_cmd("compare", *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


SMALL = ["--small", "--dtype", "bf16", "--device", "cpu", "--no-bandwidth"]


# -- the image


def test_image_serves_metrics_and_says_nvml_is_down(images: Images) -> None:
    image = images.sparkdiag()
    inspected = json.loads(podman("image", "inspect", image).stdout)[0]
    assert inspected["Config"]["User"] == "10942:10942"
    assert "/healthz" in " ".join(inspected["Healthcheck"]["Test"])
    port = free_port()
    with container(image, run_options=["-p", f"127.0.0.1:{port}:10942"]) as name:
        base = f"http://127.0.0.1:{port}"
        up = wait_for(lambda: _status(base + "/healthz") == 200, 30)
        assert up, podman("logs", name).stderr
        status, _, body = http_get(base + "/metrics")
        text = body.decode()
        assert status == 200
        assert "sparkdiag_nvml_up 0.0" in text
        assert 'sparkdiag_context_info{context="container",runtime="podman"} 1.0' in text
        logs = podman("logs", name)
        assert re.search(
            r"WARNING sparkdiag: NVML unavailable \(nvmlInit failed: .+\): GPU "
            r"telemetry skipped",
            logs.stderr + logs.stdout,
        ), logs.stderr
        assert podman("exec", name, "id", "-u").stdout.strip() == "10942"
        health = podman("healthcheck", "run", name, check=False)
        assert health.returncode == 0, health.stdout + health.stderr
        state = json.loads(podman("inspect", name).stdout)[0]["State"]
        assert state["Health"]["Status"] == "healthy", state["Health"]
        # the state directory (baselines) belongs to the image's user
        touched = podman("exec", name, "sh", "-c", "touch /var/lib/sparkdiag/x && echo ok")
        assert touched.stdout.strip() == "ok"


def _status(url: str) -> int:
    try:
        return http_get(url, timeout=1)[0]
    except OSError:
        return 0


def test_probe_image_runs_the_probe_on_cpu(images: Images) -> None:
    image = images.sparkdiag(probe=True)
    done = podman(
        "run",
        "--rm",
        *RUN_LIMITS,
        "-e",
        "OMP_NUM_THREADS=1",
        image,
        "probe",
        "--small",
        "--dtype",
        "bf16",
        "--json",
        timeout=180,
    )
    doc = json.loads(done.stdout)
    (gpu,) = doc["gpus"]
    assert gpu["result"] == "ok", gpu
    figures = [f for f in gpu["figures"] if f["status"] == "ok"]
    assert figures and all(f["delivered_tflops"] > 0 for f in figures)
    assert doc["context"] == "container"


# -- compare against the real engine


def test_compare_native_against_a_podman_container(images: Images) -> None:
    image = images.sparkdiag(probe=True)
    done = compare(
        *SMALL,
        "--rounds",
        "2",
        "--json",
        "--container",
        *engine_run("--entrypoint", PYTHON_IN_IMAGE, "-e", "OMP_NUM_THREADS=1"),
        image,
        "-",
    )
    # 1 would only mean the CPU figures differ by more than --max-gap on a shared machine
    assert done.returncode in (0, 1), done.stderr
    doc = json.loads(done.stdout)
    container_side = doc["container"]
    assert container_side["software"]["torch"] == "2.13.0+cpu"
    assert container_side["software"]["python"].startswith("3.11.")  # Debian's, in the image
    assert doc["rows"], doc
    for row in doc["rows"]:
        assert row["native_median"] > 0 and row["container_median"] > 0, row
    cycles = [c for c in doc["cycles"] if c["side"] == "container"]
    assert len(cycles) == 3 and all(c["result"] == "ok" for c in cycles), cycles
    assert not containers_with_label(WORKER)


def test_compare_image_missing(images: Images) -> None:
    images.base()  # only the engine is needed; the image is absent on purpose
    missing = f"localhost/sparkdiag-test-missing:{uuid.uuid4().hex[:8]}"
    done = compare(*SMALL, "--rounds", "1", "--container", *engine_run(), missing, "python3", "-")
    assert done.returncode == 3, done.stderr
    said = " ".join(done.stderr.split())  # wrapped to the width of standard error
    assert f"image not found: {missing} (podman pull {missing})" in said, done.stderr
    assert "Traceback" not in done.stderr


def test_compare_no_torch_in_the_image(images: Images) -> None:
    image = images.sparkdiag(probe=False)
    done = compare(
        *SMALL,
        "--rounds",
        "1",
        "--container",
        *engine_run("--entrypoint", PYTHON_IN_IMAGE),
        image,
        "-",
    )
    assert done.returncode == 3, done.stderr
    said = " ".join(done.stderr.split())  # wrapped to the width of standard error
    assert "the interpreter inside the container has no torch" in said, done.stderr


def test_compare_hang_kills_the_container(images: Images) -> None:
    """A container that never answers: the cycle times out and no container is left running
    (podman keeps one whose client was killed, with --rm too, unless sparkdiag stops it)."""
    base = images.base()
    tag = f"{LABEL}.hang={uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    done = compare(
        *SMALL,
        "--rounds",
        "1",
        "--warmup-rounds",
        "0",
        "--probe.timeout",
        "8",
        "--container",
        *engine_run("--label", tag),
        base,
        "sh",
        "-c",
        "sleep 600",
        "sh",
    )
    assert done.returncode == 3, done.stderr
    said = " ".join(done.stderr.split())  # wrapped to the width of standard error
    assert "container did not answer within 8 s" in said, done.stderr
    assert "the container stopped (podman kill)" in said, done.stderr
    left = wait_for(lambda: not containers_with_label(tag), 15)
    assert left, f"containers left running: {containers_with_label(tag)}"
    assert time.monotonic() - started < 60


# -- the daemon's container probe


@pytest.fixture
def container_daemons(images: Images, tmp_path: Path) -> Iterator[list[tuple[str, Path]]]:
    """Two daemons (H200 fixture, native probe off) whose container probe runs podman.

    "as documented": the README's command form; the worker inside asks for cuda:0, which CPU
    torch has not got (what a user sees who forgot --device nvidia.com/gpu=all).
    "cpu": the same command behind a shell that appends --device cpu --small --dtype bf16 to
    the worker's arguments (the last --device wins), so the cycle measures."""
    image = images.sparkdiag(probe=True)
    commands = {
        "documented": [*engine_run("--entrypoint", PYTHON_IN_IMAGE), image, "-"],
        "cpu": [
            *engine_run("--entrypoint", "/bin/sh", "-e", "OMP_NUM_THREADS=1"),
            image,
            "-c",
            f'exec {PYTHON_IN_IMAGE} "$@" --device cpu --small --dtype bf16 --no-bandwidth',
            "sh",
        ],
    }
    started: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
    try:
        for name, command in commands.items():
            port = free_port()
            log = tmp_path / f"{name}.log"
            argv = sparkdiag_cmd(
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--nvml-fixture",
                str(NVML / "h200-idle.json"),
                "--probe.python",
                "/bin/false",  # the native probe fails at once and says so
                "--probe.first-delay",
                "0",
                "--probe.interval",
                "3600",
                "--probe.container-command",
                shlex.join(command),
                "--probe.container-interval",
                "3600",
                "--probe.timeout",
                "120",
                "--state-dir",
                str(tmp_path / name),
            )
            with log.open("wb") as fh:
                proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
            started.append((f"http://127.0.0.1:{port}", log, proc))
        yield [(url, log) for url, log, _ in started]
    finally:
        for _, _, proc in started:
            terminate(proc, seconds=20)


def _container_runs(url: str) -> dict[str, float]:
    try:
        status, _, body = http_get(url + "/metrics", timeout=2)
    except OSError:
        return {}
    if status != 200:
        return {}
    runs = {}
    for match in re.finditer(
        r'^sparkdiag_probe_runs_total\{([^}]*context="container"[^}]*)\} (\S+)$',
        body.decode(),
        re.M,
    ):
        result = re.search(r'result="(\w+)"', match.group(1))
        assert result
        runs[result.group(1)] = float(match.group(2))
    return runs


def test_daemon_probes_inside_a_podman_container(
    container_daemons: list[tuple[str, Path]],
) -> None:
    (documented, documented_log), (cpu, cpu_log) = container_daemons
    # the container cycle starts 60 s after the native one (first-delay 0)
    done = wait_for(
        lambda: (
            sum(_container_runs(documented).values()) >= 1
            and sum(_container_runs(cpu).values()) >= 1
        ),
        150,
        every=1,
    )
    assert done, documented_log.read_text()[-3000:] + cpu_log.read_text()[-3000:]
    # diagnosed as sparkdiag compare diagnoses it: the image's torch has no CUDA
    assert _container_runs(documented)["error"] == 1.0
    assert re.search(
        r"probe GPU 0: error \(the torch inside the container \(2\.13\.0\+cpu\) is a CPU-only"
        r" build",
        documented_log.read_text(),
    ), documented_log.read_text()[-3000:]
    assert _container_runs(cpu)["ok"] == 1.0, cpu_log.read_text()[-3000:]
    body = http_get(cpu + "/metrics")[2].decode()
    tflops = re.findall(
        r'^sparkdiag_gemm_tflops\{[^}]*context="container"[^}]*dtype="bf16"[^}]*\} (\S+)$|'
        r'^sparkdiag_gemm_tflops\{[^}]*dtype="bf16"[^}]*context="container"[^}]*\} (\S+)$',
        body,
        re.M,
    )
    values = [float(a or b) for a, b in tflops]
    assert values and all(v > 0 for v in values), body[-3000:]
    assert not containers_with_label(WORKER)
