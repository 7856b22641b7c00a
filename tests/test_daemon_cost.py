"""What the daemon does when nobody reads it (issue 35): polls spaced out until a scrape is
expected, then fresh polls before each scrape; and the modules ``serve`` loads, without those that
only other commands, the probe, OpenMetrics or a web config need."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from tests.support import NVML, ROOT, SYSFS, free_port, http_get, running_daemon

FIXTURE = ("--nvml-fixture", str(NVML / "h200-idle.json"), "--path.sysfs", str(SYSFS / "h200-vm"))


def _poll(base: str) -> int:
    status, _, body = http_get(base + "/healthz")  # not a scrape: /metrics alone counts
    assert status == 200, body
    match = re.search(rb"poll (\d+)", body)
    assert match, body
    return int(match.group(1))


def _shown_poll_age(body: bytes) -> float:
    match = re.search(rb"^sparkdiag_last_poll_timestamp_seconds (\S+)$", body, re.MULTILINE)
    assert match, body[:300]
    return time.time() - float(match.group(1))


def test_polls_are_spaced_out_until_a_scraper_comes_and_then_follow_it() -> None:
    # every time at half the scale it was written at (polls every 0.1 s, 1 s when idle, a
    # scrape every 0.5 s): the poller's spacing is in poll intervals and scrape gaps
    args = ("--no-probe.enabled", "--poll-interval", "0.05", "--idle-poll-interval", "0.5")
    with running_daemon((*args, *FIXTURE)) as base:
        first = _poll(base)
        time.sleep(1.0)
        idle = _poll(base) - first
        assert 1 <= idle <= 4  # two polls a second, not twenty

        before = _poll(base)
        ages = []
        for _ in range(8):  # a regular scraper, every 0.25 s
            status, _, body = http_get(base + "/metrics")
            assert status == 200
            ages.append(_shown_poll_age(body))
            time.sleep(0.25)
        scraped = _poll(base) - before
        assert scraped >= 10  # polls at the poll interval around the scrapes again
        # once its period is known, each scrape gets a poll made just before it
        assert max(ages[3:]) < 0.25, ages


# The daemon's modules once its late work has run, instead of after a fixed 4 s (3 s of it
# idle here): the CUDA library scan once, the poller thread's first poll (the second poll; the
# first is made before serving), and then no new module for QUIET seconds. Both classes patched
# are imported by sparkdiag.daemon itself, so importing them first adds no module to the set.
_MODULES = """
import json, os, signal, sys, threading, time
from sparkdiag.native.watch import LibraryWatch
from sparkdiag.telemetry.poller import Poller
scanned, polled = threading.Event(), threading.Event()
scan, poll = LibraryWatch.scan_once, Poller.poll_once
def scan_once(self):
    scan(self)
    scanned.set()
def poll_once(self):
    snap = poll(self)
    if self.poll_count >= 2:
        polled.set()
    return snap
LibraryWatch.scan_once, Poller.poll_once = scan_once, poll_once
def later():
    deadline = time.monotonic() + float(sys.argv[1])
    scanned.wait(deadline - time.monotonic())
    polled.wait(max(0.0, deadline - time.monotonic()))
    quiet, count = time.monotonic(), len(sys.modules)
    while time.monotonic() - quiet < QUIET and time.monotonic() < deadline:
        time.sleep(0.05)
        if len(sys.modules) != count:
            quiet, count = time.monotonic(), len(sys.modules)
    print(json.dumps(sorted(sys.modules)), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=later, daemon=True).start()
sys.argv = ["sparkdiag", "serve", *sys.argv[2:]]
from sparkdiag.entry import main
main()
""".replace("QUIET", "0.3")
# Loaded by no daemon without a web config, an OpenMetrics scrape or a --config file:
# client_python's package (its servers, WSGI, e-mail), psutil, YAML, bcrypt, TOML.
NEVER = {"prometheus_client", "psutil", "tomllib", "difflib", "yaml", "bcrypt"}
# Loaded only where TLS or basic auth asks for them: OpenSSL's modules (asyncio is imported
# without ssl: sparkdiag/web/__init__.py), hashlib, e-mail (HTTP dates), the IDNA codec
# (unicodedata), html (the landing page).
PLAIN_HTTP = {
    "ssl",
    "_ssl",
    "hashlib",
    "_hashlib",
    "hmac",
    "secrets",
    "email",
    "encodings.idna",
    "unicodedata",
    "html",
}
# Loaded only where a file is written or a tool looked up: shutil and tempfile (with bz2, lzma
# and random). On a real /sys pyudev loads them anyway (pyudev._ctypeslib.utils imports
# tempfile), so a daemon keeps them out with a sysfs fixture only.
NO_WRITES = {"shutil", "tempfile", "random", "bz2", "lzma"}
# Loaded with a probe only: SQLite and the store, the worker (and its argparse), statistics.
PROBE = {"sqlite3", "statistics", "argparse", "sparkdiag.probe.worker", "sparkdiag.baseline.store"}


def _modules(*args: str) -> set[str]:
    port = str(free_port())  # a clock-made port collided under 16 workers on the H200
    # polls every 0.1 s: the poller thread's first poll comes one interval after the start,
    # 0.1 s and not the default 1 s later (what a poll loads is the same at any interval)
    listen = ("--listen", f"127.0.0.1:{port}", "--poll-interval", "0.1")
    out = subprocess.run(
        [sys.executable, "-c", _MODULES, "30", *listen, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("[")]
    assert lines, out.stderr[-2000:]
    return set(json.loads(lines[-1]))


def _loaded_by_daemon(*args: str) -> set[str]:
    """What the daemon loaded beyond what the interpreter had at its start: for the checks
    that a module stays out (what is loaded anyway is not the daemon's to keep out)."""
    return _modules(*args) - _startup_modules()


def _startup_modules() -> set[str]:
    """What this interpreter loads before any code runs (``site``, and whatever the
    environment's ``.pth`` files import): not the daemon's doing. On the lent H200 the
    environment's own start loaded tempfile, shutil, random, bz2 and lzma."""
    out = subprocess.run(
        [sys.executable, "-c", "import sys; print(' '.join(sys.modules))"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return set(out.stdout.split())


PROBE_FIXTURE = (
    "--probe.fixture",
    str(ROOT / "tests" / "fixtures" / "probe" / "h200-default.json"),
)


@pytest.mark.parametrize(
    "probe_inputs",
    [(), PROBE_FIXTURE, ("--probe.container-command", "podman run --rm -i img python3 -")],
    ids=["plain", "probe-fixture", "container-command"],
)
def test_serve_without_a_probe_loads_neither_the_probe_nor_what_other_commands_need(
    probe_inputs: tuple[str, ...],
) -> None:
    """With the probe off, its fixture or container command named (a configuration file often
    keeps them) loads none of the probe's modules: a review found serve's check of its inputs
    loading seven of them."""
    loaded = _loaded_by_daemon("--no-probe.enabled", *probe_inputs, *FIXTURE)
    assert "sparkdiag.web.http" in loaded and "sparkdiag.exporter.gpu" in loaded
    unused = NEVER | PROBE | PLAIN_HTTP | NO_WRITES
    assert not unused & loaded, unused & loaded
    assert not any(m.startswith("sparkdiag.compare") for m in loaded)


def test_serve_on_the_real_sys_keeps_tls_and_auth_modules_out() -> None:
    fixture = ("--nvml-fixture", str(NVML / "h200-idle.json"), "--no-nvme.smart")
    loaded = _loaded_by_daemon("--no-probe.enabled", *fixture)
    assert not (NEVER | PROBE | PLAIN_HTTP) & loaded, (NEVER | PROBE | PLAIN_HTTP) & loaded


def test_asyncio_comes_without_ssl_which_still_imports_for_tls() -> None:
    code = (
        "import sys, sparkdiag.web, asyncio.base_events as base\n"
        "assert 'ssl' not in sys.modules and base.ssl is None, sys.modules.get('ssl')\n"
        "import ssl, sparkdiag.web.tls\n"
        "print(ssl.MemoryBIO.__name__, base.ssl)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["MemoryBIO", "None"], out.stderr


def test_serve_with_a_probe_loads_the_probe_but_not_the_rest(tmp_path: object) -> None:
    loaded = _modules(*PROBE_FIXTURE, "--state-dir", str(tmp_path), *FIXTURE)
    assert loaded >= PROBE
    added = loaded - _startup_modules()
    assert not NEVER & added, NEVER & added
