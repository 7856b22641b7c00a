"""``iperf3`` and perftest's ``ib_write_bw``, when installed: their command lines, their one-shot
servers, and their answers parsed.

Each tool is run with an argument list (never a shell), in its own session, and killed with its
process group at a deadline. A server is ready once its TCP port is taken (a ``bind`` to it
fails): no connection is made to it before the measuring side's.

``iperf3 -c ADDR -p PORT -t S -P N -J [-R] -B LOCAL`` reports ``end.sum_received`` measured by the
receiver. ``ib_write_bw -d DEV -i 1 -p PORT -F --report_gbits -q 4 -D S [ADDR]`` is the command
NVIDIA's DGX Spark guide and its ``check-connectx-bandwidth`` helper run (four queue pairs, five
seconds there); its last result row is ``#bytes #iterations BW-peak BW-average MsgRate`` in
Gb/s (NVIDIA/dgx-spark-playbooks, connect-two-sparks/assets).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

IPERF3 = "iperf3"
IB_WRITE_BW = "ib_write_bw"
TOOLS = (IPERF3, IB_WRITE_BW)
OUTPUT_LIMIT = 1 << 20  # bytes of a tool's output kept


def installed() -> dict[str, bool]:
    """Which of the tools this machine has on its PATH (``command -v iperf3 ib_write_bw``)."""
    return {tool: shutil.which(tool) is not None for tool in TOOLS}


def free_port(address: str) -> int:
    """A TCP port free on ``address`` now (the kernel's pick)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        port: int = probe.getsockname()[1]
        return port


def port_taken(address: str, port: int) -> bool:
    """Whether something listens on ``address:port`` (a bind to it fails with EADDRINUSE)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


@dataclass
class ToolRun:
    """One finished run: ``argv``, exit status (None: killed at its deadline), its output."""

    argv: tuple[str, ...]
    returncode: int | None
    output: str


class Process:
    """A tool running in its own session, its output collected; :meth:`finish` waits for it up
    to a deadline and kills its process group past it. ``lifetime`` (seconds) is how long it may
    run at all: :meth:`overdue` says when that has passed. A killed tool is waited for (no
    zombie) and its pipe closed. Raises OSError when it cannot be started (EMFILE, ENOENT)."""

    def __init__(self, argv: Sequence[str], lifetime: float | None = None) -> None:
        self.argv = tuple(argv)
        self.started = time.monotonic()
        self.lifetime = lifetime
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def alive(self) -> bool:
        """Still running (a tool that ended is reaped by this call)."""
        return self.proc.poll() is None

    def overdue(self, now: float) -> bool:
        return self.lifetime is not None and now - self.started > self.lifetime

    def wait_listening(self, address: str, port: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if port_taken(address, port):
                return True
            time.sleep(0.02)
        return False

    def finish(self, timeout: float) -> ToolRun:
        try:
            out, _ = self.proc.communicate(timeout=max(timeout, 0.1))
            code: int | None = self.proc.returncode
        except subprocess.TimeoutExpired:
            self._kill_group()
            out, _ = self.proc.communicate()
            code = None
        except BaseException:  # Ctrl-C: the tool runs in its own session, so end it here
            self.kill()
            raise
        return ToolRun(self.argv, code, out[-OUTPUT_LIMIT:].decode(errors="replace"))

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        """Kill its process group, reap it and close its pipe."""
        if self.proc.returncode is None:
            self._kill_group()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5.0)
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()


def run(argv: Sequence[str], timeout: float) -> ToolRun:
    """Run ``argv`` to its end, or kill it at ``timeout`` seconds."""
    return Process(argv).finish(timeout)


def iperf3_server(address: str, port: int) -> list[str]:
    """One client, then exit: ``iperf3 -s -1 -B ADDRESS -p PORT``."""
    return [IPERF3, "-s", "-1", "-B", address, "-p", str(port)]


def iperf3_client(
    peer: str, port: int, seconds: float, streams: int, reverse: bool, local: str | None
) -> list[str]:
    argv = [IPERF3, "-c", peer, "-p", str(port), "-t", f"{max(1, round(seconds))}"]
    argv += ["-P", str(streams), "-J"]
    if reverse:
        argv.append("-R")
    if local:
        argv += ["-B", local]
    return argv


def parse_iperf3(output: str) -> tuple[float | None, str | None]:
    """(Gb/s the receiver counted, or None; iperf3's own error, or None) from ``-J`` output."""
    try:
        doc = json.loads(output)
    except ValueError:
        tail = output.strip().splitlines()[-1:] or ["no output"]
        return None, f"iperf3 printed no JSON: {tail[0][:120]}"
    if not isinstance(doc, dict):
        return None, "iperf3 printed no JSON object"
    if isinstance(doc.get("error"), str):
        return None, f"iperf3: {doc['error']}"
    received = doc.get("end", {}).get("sum_received", {}).get("bits_per_second")
    if isinstance(received, (int, float)) and not isinstance(received, bool) and received > 0:
        return received / 1e9, None
    return None, "iperf3 reported no received bytes"


def ib_write_bw(device: str, port: int, seconds: float, peer: str | None = None) -> list[str]:
    """The server side (``peer`` None) or the client side that writes to ``peer``."""
    argv = [IB_WRITE_BW, "-d", device, "-i", "1", "-p", str(port), "-F", "--report_gbits"]
    argv += ["-q", "4", "-D", f"{max(1, round(seconds))}"]
    return [*argv, peer] if peer else argv


def parse_ib_write_bw(output: str) -> float | None:
    """The average of the last result row (Gb/s with ``--report_gbits``), or None."""
    found = None
    for line in output.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit():
            try:
                found = float(fields[3])
            except ValueError:
                continue
    return found if found is not None and found > 0 else None
