"""The periodic storage probe's own cost when it is off (the default): the daemon starts no
storage loop and writes nothing over a run (``write_bytes`` of /proc/PID/io, which also counts
the children it has reaped: a probe's measuring program among them). The same daemon with the
probe on, started at once, shows that the count sees the probe's bytes."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.support import NVML, ROOT, SYSFS, free_port, http_get, sparkdiag_cmd

pytestmark = pytest.mark.storage
MIB = 1 << 20


def write_bytes(pid: int) -> int:
    """Bytes the process (and the children it reaped) caused to be written to storage."""
    found = re.search(r"^write_bytes: (\d+)$", Path(f"/proc/{pid}/io").read_text(), re.M)
    assert found is not None
    return int(found.group(1))


class Daemon:
    """``sparkdiag serve`` on fixtures, without the GEMM probe (whose baselines it would write),
    its log collected as it comes."""

    def __init__(self, state: Path, *args: str) -> None:
        port = free_port()
        cmd = sparkdiag_cmd(
            "serve", "--listen", f"127.0.0.1:{port}", "--nvml-fixture",
            str(NVML / "h200-idle.json"), "--path.sysfs", str(SYSFS / "h200-vm"), "--state-dir",
            str(state), "--no-probe.enabled", *args,
        )  # fmt: skip
        self.base = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.log: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def settled(self) -> None:
        """Serving, and done with what it does once at start (the CUDA library scan)."""
        end = time.monotonic() + 30
        while not any("CUDA libraries of" in line for line in self.log):
            assert self.proc.poll() is None, "".join(self.log)
            assert time.monotonic() < end, "the daemon did not settle in 30 s"
            time.sleep(0.05)
        assert http_get(self.base + "/healthz")[0] == 200
        time.sleep(0.5)

    def stop(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        return "".join(self.log)


def test_with_the_periodic_probe_off_the_daemon_writes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    daemon = Daemon(state)
    try:
        daemon.settled()
        before = write_bytes(daemon.proc.pid)
        end = time.monotonic() + 6.0
        scrapes = 0
        while time.monotonic() < end:  # a run: polls every second, a scrape every 0.25 s
            assert http_get(daemon.base + "/metrics")[0] == 200
            scrapes += 1
            time.sleep(0.25)
        written = write_bytes(daemon.proc.pid) - before
    finally:
        log = daemon.stop()
    assert scrapes >= 10
    assert written == 0, f"the daemon wrote {written} bytes with the storage probe off"
    assert "periodic storage probe on" not in log  # its loop never started
    assert not (state / "storage.json").exists()


def test_the_count_sees_the_probe_when_it_is_on(tmp_path: Path) -> None:
    state, measured = tmp_path / "state", tmp_path / "measured"
    measured.mkdir()
    daemon = Daemon(
        state, "--storage.enabled", "--storage.first-delay", "0", "--storage.directory",
        str(measured), "--storage.size", "16M", "--storage.duration", "2",
    )  # fmt: skip
    try:
        daemon.settled()
        end = time.monotonic() + 30
        while not any("storage probe of" in line for line in daemon.log):
            assert time.monotonic() < end, "no periodic probe in 30 s"
            time.sleep(0.1)
        total = write_bytes(daemon.proc.pid)
    finally:
        log = daemon.stop()
    assert "periodic storage probe on (storage.enabled)" in log
    assert total >= 16 * MIB, log  # the test file, written by the probe's (reaped) program
    assert list(measured.iterdir()) == []
