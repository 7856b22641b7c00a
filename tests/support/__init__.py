"""Helpers shared by the end-to-end tests: run a real sparkdiag daemon and scrape it."""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from benchmarks.common import stop as terminate  # SIGTERM, SIGKILL after 10 s
from sparkdiag.snapshot import Snapshot
from sparkdiag.sources.nvml.fixture import FixtureBackend
from sparkdiag.sources.nvml.gpu import GpuSource
from sparkdiag.telemetry.poller import Poller
from sparkdiag.web.http import ExporterServer

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
NVML = FIXTURES / "nvml"
SYSFS = FIXTURES / "sysfs"
ROOTFS = FIXTURES / "rootfs"
PROBE = FIXTURES / "probe"


class CountingBackend(FixtureBackend):
    """A FixtureBackend that counts every query it is asked, keyed (index, query, arg)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.asked: Counter[tuple[int, str, int | None]] = Counter()

    def query(self, index: int, query: str, arg: int | None = None) -> Any:
        self.asked[(index, query, arg)] += 1
        return super().query(index, query, arg)


def skip_unless_installed(name: str) -> None:
    """Skip the test module being collected where ``name`` is not installed: the skip of
    ``pytest.importorskip`` without its import. Every xdist worker collects every test module,
    and torch's import was 2.5 s of each worker's 8.5 s of collection here, for about 2 s of
    tests that use it in the process (most run it in a child): those ask for the ``torch``
    fixture (tests/conftest.py), which imports it in the worker that runs them."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed", allow_module_level=True)


def fake_stat(root: Path, pid: int, ppid: int, state: str = "S", ticks: int | None = None) -> None:
    """``ROOT/proc/PID/stat`` of an ``sh`` in ``state`` whose parent is ``ppid``; with ``ticks``
    the clock ticks it has run (utime), else the line ends before them."""
    (root / "proc" / str(pid)).mkdir(parents=True, exist_ok=True)
    times = "" if ticks is None else f" 0 0 0 0 0 {ticks} 0 0 0"
    (root / "proc" / str(pid) / "stat").write_text(
        f"{pid} (sh) {state} {ppid} {pid} {pid} 0 -1{times}\n"
    )


def gpu_here() -> bool:
    """This machine shows an NVIDIA GPU (``/dev/nvidia0``, ``/dev/nvidia1`` ... or the driver's
    list in ``/proc/driver/nvidia/gpus``), read without NVML or torch. Some tests are of a
    machine without one (a CPU-only torch, the quick start's preflight with --expect-gpus 0);
    beside a GPU, on the lent machine, they judged the GPU instead."""
    from sparkdiag.sources.host.procfs import driver_gpus

    return any(Path("/dev").glob("nvidia[0-9]*")) or bool(driver_gpus(Path("/")))


# A test of a machine without a GPU, skipped beside one (gpu_here)
without_gpu = pytest.mark.skipif(gpu_here(), reason="of a machine without a GPU; one is here")


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (``/proc/PID/stat`` state)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_dead(pids: Sequence[int], seconds: float = 5.0) -> list[int]:
    """Wait up to ``seconds`` for every pid to end; return those still alive."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not any(alive(p) for p in pids):
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sparkdiag_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "sparkdiag", *args]


def run_python(script: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGS`` in this interpreter, its output captured as text."""
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout
    )


def basic_auth(auth: tuple[str, str]) -> str:
    """The ``Authorization`` header value for HTTP basic authentication as (user, password)."""
    return "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()


def http_get(
    url: str, timeout: float = 5.0, auth: tuple[str, str] | None = None
) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET; HTTP errors are returned, not raised."""
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", basic_auth(auth))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read()


def healthy_ok() -> tuple[bool, str]:
    """A health check that always passes."""
    return True, "ok"


@contextlib.contextmanager
def serving(
    healthy: Callable[[], tuple[bool, str]] = healthy_ok, **kwargs: Any
) -> Iterator[ExporterServer]:
    """An :class:`ExporterServer` over an empty registry on a free loopback port, served in a
    thread; ``kwargs`` go to the server. On exit it is shut down and its thread has ended."""
    server = ExporterServer(("127.0.0.1", 0), CollectorRegistry(), healthy, **kwargs)
    thread = server.serve_in_thread()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        assert not thread.is_alive()


def self_signed_cert(
    directory: Path,
    name: str = "tls",
    subject: str = "localhost",
    alt_names: str | None = "IP:127.0.0.1,DNS:localhost",
) -> None:
    """Write ``NAME.key`` and ``NAME.crt`` into ``directory``: a self-signed RSA certificate for
    CN=SUBJECT (valid two days); skips without openssl (fails in CI)."""
    openssl = required_tool("openssl", "openssl")
    extensions = [] if alt_names is None else ["-addext", f"subjectAltName={alt_names}"]
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", f"/CN={subject}", *extensions,
         "-keyout", str(directory / f"{name}.key"), "-out", str(directory / f"{name}.crt")],
        check=True, capture_output=True,
    )  # fmt: skip


def tls_web_config(directory: Path) -> Path:
    """``directory`` with a self-signed certificate for 127.0.0.1 (tls.crt, tls.key) and a
    ``web.yml`` serving TLS with it (the exporter-toolkit file)."""
    self_signed_cert(directory, alt_names="IP:127.0.0.1")
    (directory / "web.yml").write_text(
        "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
    )
    return directory


@contextlib.contextmanager
def running_daemon(
    args: Sequence[str],
    startup_timeout: float = 20.0,
    scheme: str = "http",
    auth: tuple[str, str] | None = None,
) -> Iterator[str]:
    """Start ``sparkdiag serve ARGS`` on a free loopback port; yield its base URL.

    Readiness is a TCP connect followed by a GET of /healthz where that is possible (plain
    HTTP; with ``auth`` the credentials are sent)."""
    port = free_port()
    cmd = sparkdiag_cmd("serve", "--listen", f"127.0.0.1:{port}", *args)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=dict(os.environ)
    )
    base = f"{scheme}://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                _, err = proc.communicate()
                raise AssertionError(f"sparkdiag exited {proc.returncode}: {err.decode()}")
            try:
                if scheme == "https":
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                status, _, _ = http_get(base + "/healthz", timeout=1, auth=auth)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("sparkdiag did not become healthy in time")
            time.sleep(0.05)
        yield base
    finally:
        terminate(proc)
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()


def required_tool(name: str, package: str) -> str:
    """Path of a system tool; skip the test where it is missing, but fail in CI (CI=true),
    which installs it."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is required in CI (apt-get install {package})")
        pytest.skip(f"{name} not installed (apt-get install {package})")
    return path


def resolver_answers(name: str = "no-such-host.invalid") -> None:
    """Skip the test where this machine's resolver cannot say that ``name`` does not exist
    (EAI_AGAIN: no DNS server reachable, as on the lent GPU machines, which reach nothing
    outside); fail in CI (CI=true), whose machine resolves. The daemon's answer to EAI_AGAIN
    (exit 1, worth a restart) is tested with a stubbed getaddrinfo."""
    try:
        socket.getaddrinfo(name, 80)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return
        if os.environ.get("CI") == "true":
            pytest.fail(f"no resolver answers for {name} in CI: {exc}")
        pytest.skip(f"no resolver answers here ({exc.strerror}): {name} cannot be refused")
    else:
        pytest.skip(f"{name} resolves here")


def promtool() -> str:
    return required_tool("promtool", "prometheus")


# Samples whose values change from run to run; the golden files keep their names and labels.
# (Host memory is read from the fixture root's proc/meminfo, so its values are in the files.)
VOLATILE = re.compile(
    r"^(sparkdiag_collector_duration_seconds|sparkdiag_last_poll_timestamp_seconds"
    r"|sparkdiag_gpu_xid_last_timestamp_seconds"
    r"|sparkdiag_probe_last_success_timestamp_seconds"
    r"|sparkdiag_cuda_library_scan_timestamp_seconds|sparkdiag_cuda_library_scan_duration_seconds"
    r"|sparkdiag_nvme_smart_log_age_seconds"
    r")(\{.*\})? .*$"
)


def normalise(exposition: str) -> str:
    """Replace volatile values by ``<volatile>`` and the Python version label by ``<python>``."""
    lines = []
    for line in exposition.splitlines():
        line = re.sub(r'python="[^"]*"', 'python="<python>"', line)
        match = VOLATILE.match(line)
        if match:
            line = f"{match.group(1)}{match.group(2) or ''} <volatile>"
        lines.append(line)
    return "\n".join(lines) + "\n"


def scaled_cycle(out: Path, factor: float, pids: Sequence[int] = (), **software: object) -> Path:
    """The recorded H200 cycle (tests/fixtures/probe/h200-default.json) with every delivered
    figure times ``factor`` and ``pids`` seen on the GPU, written to ``out``: at 0.48 with a pid,
    what the probe read beside a ViT training job (CONTEXT.md: 0.45-0.51 of its baselines).
    ``software`` replaces fields of its software block (``device="cpu"`` for a CPU run)."""
    doc = json.loads((PROBE / "h200-default.json").read_text())
    for result in doc["results"]:
        if result.get("delivered"):
            result["delivered"] *= factor
    doc["busy"]["other_pids"] = list(pids)
    doc["software"].update(software)
    out.write_text(json.dumps(doc))
    return out


def machine_args(sysfs: str | Path, rootfs: str = "native") -> tuple[str, ...]:
    """``--path.sysfs``, ``--path.rootfs`` for a recorded machine: ``sysfs`` a tree under
    tests/fixtures/sysfs (or a path), ``rootfs`` one under tests/fixtures/rootfs."""
    tree = SYSFS / sysfs if isinstance(sysfs, str) else sysfs
    return ("--path.sysfs", str(tree), "--path.rootfs", str(ROOTFS / rootfs))


def subcommands(group: Any) -> dict[str, Any]:
    """A click group's commands by name, each imported (the top group loads them when asked)."""
    import click

    ctx = click.Context(group)
    return {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}


def signal_when(
    proc: subprocess.Popen[str],
    ready: Callable[[], bool],
    signum: int,
    wait: float = 120,
    timeout: float = 30,
) -> tuple[str, str]:
    """Send ``signum`` to ``proc`` once ``ready()`` holds (within ``wait`` seconds, while it
    runs) and return its output; a process that has not ended on the way out is killed."""
    try:
        deadline = time.monotonic() + wait
        while not ready():
            assert proc.poll() is None and time.monotonic() < deadline, "never ready"
            time.sleep(0.05)
        proc.send_signal(signum)
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sparkdiag_cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def invoke_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``sparkdiag ARGS`` run in this process (click's CliRunner), its ending given as
    :func:`run_cli` gives a child's: the exit status, standard output, standard error (with the
    traceback of an exception the command let out, as Python prints it). For a test of what a
    command says and its status, not of the process (its signals, environment or imports): a
    fresh interpreter costs 0.3-0.6 s of CPU here for the imports alone. The command's log
    lines go to its standard error as in a process (the root logger is emptied for the run, so
    that its ``basicConfig`` installs the handler); a command still running after ``timeout``
    seconds ends the test run with every thread's stack (faulthandler), not a hang."""
    import faulthandler
    import logging
    import traceback

    from click.testing import CliRunner

    from sparkdiag.cli import main

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []
    cwd = os.getcwd()
    os.chdir(ROOT)
    faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        result = CliRunner().invoke(main, list(args), prog_name="python -m sparkdiag")
    finally:
        faulthandler.cancel_dump_traceback_later()
        os.chdir(cwd)
        root.handlers = handlers
        root.setLevel(level)
    stderr = result.stderr
    if result.exc_info is not None and not isinstance(result.exc_info[1], SystemExit):
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(
        ["sparkdiag", *args], result.exit_code, result.stdout, stderr
    )


def assert_clean_error(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


def fixture_snapshot(
    fixture: str, tmp_path: Path, overrides: dict[str, Any] | None = None
) -> Snapshot:
    """One poll of the GPU source over NVML fixture ``fixture`` (``overrides`` set on GPU 0)."""
    path = NVML / f"{fixture}.json"
    if overrides:
        derived = tmp_path / "derived.json"
        derived.write_text(
            json.dumps(
                {
                    "format": "sparkdiag-nvml-fixture/1",
                    "base": str(path),
                    "devices": [{"from": 0, "set": overrides}],
                }
            )
        )
        path = derived
    source = GpuSource(FixtureBackend(path))
    assert source.start()
    poller = Poller(source, None, None, None)
    return poller.poll_once()
