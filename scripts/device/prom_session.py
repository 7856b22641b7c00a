#!/usr/bin/env python3
"""A real Prometheus for device scripts: scrape sparkdiag targets with the shipped rules, ask it.

Reusable (stall.py uses it; ``sparkdiag fleet`` scripts can too). Standard library only, so it
runs under the H200 image's python3. The binary is ``$PROMETHEUS`` (default ``prometheus`` on
the PATH); the lead carries it to the device machine.

    from prom_session import PromSession, shorten_for
    rules = shorten_for(Path("prometheus/sparkdiag-rules.yml").read_text(), {"X": "30s"})
    with PromSession(["127.0.0.1:10942"], rules, workdir) as prom:
        prom.alerts()                 # [{"labels": {...}, "state": "firing", ...}]
        prom.query("sparkdiag_gpu_up")

Command line (a smoke test): ``python3 scripts/device/prom_session.py TARGET [SECONDS]`` scrapes
TARGET with the shipped rules for SECONDS and prints its alerts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "prometheus" / "sparkdiag-rules.yml"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def shorten_for(rules: str, durations: dict[str, str]) -> str:
    """The rule file with the ``for:`` of each named alert replaced, nothing else changed.

    Every rule with that alert name is changed (one ``for:`` line each, the first after its
    ``- alert: NAME`` line); raises ValueError when a name is not found, so a renamed alert
    cannot leave the shipped duration in place unnoticed."""
    lines = rules.splitlines(keepends=True)
    for name, duration in durations.items():
        changed = 0
        for i, line in enumerate(lines):
            if line.strip() != f"- alert: {name}":
                continue
            for j in range(i + 1, len(lines)):
                if lines[j].strip().startswith("- alert:") or lines[j].strip().startswith(
                    "- record:"
                ):
                    break
                match = re.match(r"^(\s*)for:\s*\S+\s*$", lines[j])
                if match:
                    lines[j] = f"{match.group(1)}for: {duration}\n"
                    changed += 1
                    break
        if not changed:
            raise ValueError(f"alert {name} (with a for:) not found in the rules")
    return "".join(lines)


class PromSession:
    """Prometheus scraping ``targets`` (host:port) every ``interval``, evaluating ``rules`` (the
    text of a rule file) as often; its data and log under ``workdir``."""

    def __init__(
        self,
        targets: list[str],
        rules: str | None,
        workdir: Path,
        interval: str = "1s",
        binary: str | None = None,
        job: str = "sparkdiag",
    ) -> None:
        self.targets = targets
        self.rules = rules
        self.workdir = workdir
        self.interval = interval
        self.binary = binary or os.environ.get("PROMETHEUS", "prometheus")
        self.job = job
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "prometheus.log"

    def config(self) -> str:
        targets = ", ".join(json.dumps(t) for t in self.targets)
        rule_files = "rule_files:\n  - rules.yml\n" if self.rules is not None else ""
        return (
            f"global:\n  scrape_interval: {self.interval}\n  evaluation_interval: {self.interval}\n"
            f"{rule_files}"
            f"scrape_configs:\n  - job_name: {self.job}\n    static_configs:\n"
            f"      - targets: [{targets}]\n"
        )

    def start(self, timeout: float = 60.0) -> None:
        binary = shutil.which(self.binary) or self.binary
        if not Path(binary).exists():
            raise FileNotFoundError(f"no Prometheus binary {self.binary!r} (set PROMETHEUS)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "prometheus.yml").write_text(self.config(), encoding="utf-8")
        if self.rules is not None:
            (self.workdir / "rules.yml").write_text(self.rules, encoding="utf-8")
        log = self.log.open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: see {self.log}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"prometheus not ready after {timeout:.0f} s: see {self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> PromSession:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise RuntimeError(f"{path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts, as /api/v1/alerts gives them."""
        return list(self.api("alerts")["alerts"])

    def targets_up(self) -> bool:
        return bool(self.query("up == 1"))


def main(argv: list[str]) -> int:
    target = argv[1] if len(argv) > 1 else "127.0.0.1:10942"
    seconds = float(argv[2]) if len(argv) > 2 else 10.0
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"prom-session-{os.getpid()}"
    with PromSession([target], RULES.read_text(encoding="utf-8"), workdir) as prom:
        time.sleep(seconds)
        print(json.dumps({"up": prom.query("up"), "alerts": prom.alerts()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
