"""What the daemon says about where it listens (issue 21): an IPv6 address in brackets in its URL
(``http://[::1]:PORT/metrics``, was ``http://::1:PORT``), and one line saying that
``--listen :PORT`` binds every interface."""

from __future__ import annotations

import signal
import socket
import subprocess

import pytest

from sparkdiag.daemon import url_host
from tests.support import NVML, ROOT, free_port, sparkdiag_cmd


def serve_lines(listen: str) -> list[str]:
    """The daemon's log lines up to its 'serving' line (then it is stopped)."""
    proc = subprocess.Popen(
        sparkdiag_cmd(
            "serve",
            "--listen",
            listen,
            "--no-probe.enabled",
            "--nvml-fixture",
            str(NVML / "no-nvml.json"),
            "--poll-interval",
            "5",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "INFO sparkdiag: serving " in line:
                break
        proc.send_signal(signal.SIGTERM)
        lines += proc.communicate(timeout=30)[1].splitlines(keepends=True)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return lines


def test_url_host() -> None:
    assert [url_host(h) for h in ("::1", "::", "127.0.0.1", "node-3", "[::1]")] == [
        "[::1]",
        "[::]",
        "127.0.0.1",
        "node-3",
        "[::1]",
    ]


def test_an_ipv6_address_is_printed_in_brackets() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    port = free_port()
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("::1 cannot be bound here")
    text = "".join(serve_lines(f"[::1]:{port}"))
    assert f"serving http://[::1]:{port}/metrics" in text, text
    assert "every interface" not in text


def test_listen_on_every_interface_says_so_once() -> None:
    port = free_port()
    text = "".join(serve_lines(f":{port}"))
    assert f"serving http://0.0.0.0:{port}/metrics" in text, text
    assert text.count("binds every interface") == 1
    assert f"--listen :{port} binds every interface (0.0.0.0)" in text
    assert f"--listen 127.0.0.1:{port} serves this machine only" in text
