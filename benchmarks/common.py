"""What the benchmarks and the device scripts share (standard library only, so that a script
copied to the lent GPU machine runs with nothing installed but sparkdiag's own dependencies).

Import it as ``benchmarks.common`` with the repository root on ``sys.path`` (each script puts
it there)."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

# nvidia-smi --query-gpu fields the scrape benchmarks time against sparkdiag's own scrape
SMI_FIELDS = (
    "temperature.gpu,temperature.memory,clocks.sm,clocks.mem,clocks.gr,clocks.video,"
    "clocks.max.sm,clocks.max.mem,clocks_event_reasons.active,power.draw,enforced.power.limit,"
    "utilization.gpu,utilization.memory,memory.total,memory.used,memory.free,"
    "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,"
    "ecc.errors.corrected.aggregate.total,ecc.errors.uncorrected.aggregate.total,pstate"
)


def stop(proc: subprocess.Popen[Any], seconds: float = 10) -> None:
    """Stop a child that still runs as systemd would: SIGTERM, then SIGKILL after ``seconds``;
    reaped either way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fetch(port: int, headers: dict[str, str]) -> tuple[float, bytes]:
    """One GET /metrics on a fresh connection to 127.0.0.1:``port``: (seconds until the body was
    read, the body decompressed). Anything but 200 ends the benchmark."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        took = time.perf_counter() - start
        if resp.status != 200:
            raise SystemExit(f"/metrics answered {resp.status}")
        if resp.getheader("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return took, body
    finally:
        conn.close()


def poll_time(body: bytes) -> float | None:
    """The poll a scrape rendered (sparkdiag_last_poll_timestamp_seconds); None if it has none."""
    for line in body.splitlines():
        if line.startswith(b"sparkdiag_last_poll_timestamp_seconds "):
            return float(line.split()[1])
    return None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proc_usage(pid: int) -> tuple[float, float]:
    """(CPU seconds user + system, RSS MiB) of a running process, from /proc. The CPU counts
    the children it has waited for (cutime, cstime) too: the daemon's library scan and probe
    workers run as its children, and their time is the daemon's cost."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = sum(int(v) for v in stat[11:15]) / os.sysconf("SC_CLK_TCK")
    return cpu, int(stat[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def wait_http(port: int, proc: subprocess.Popen[Any], seconds: float = 60, path: str = "/") -> None:
    """Wait until 127.0.0.1:``port`` answers ``path`` with 200; RuntimeError when ``proc`` exits
    first or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited {proc.returncode} before answering")
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                conn.request("GET", path)
                if conn.getresponse().status == 200:
                    return
            finally:
                conn.close()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args!r} did not answer {path} within {seconds:.0f} s")
        time.sleep(0.1)
