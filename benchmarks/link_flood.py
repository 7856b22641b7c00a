#!/usr/bin/env python3
"""Benchmark: ``sparkdiag link serve`` under a flood, for a minute: does what it holds stay flat?

Prints figures; asserts nothing.

    python benchmarks/link_flood.py [--seconds 60] [--nofile 256] [--json out.json]

``link serve`` runs as its own process on 127.0.0.1 (with ``--nofile``, its open-files limit
lowered so that the flood runs it out of descriptors), and these run against it at once for
``--seconds``, each in its own thread, as fast as they can:

* silent: connections from 127.0.0.2-9 that say nothing, up to 600 held open at once;
* strangers: control connections that answer the challenge with a wrong proof;
* garbage: connections that send random bytes, a 100 kB line, JSON nested 5000 deep;
* session: one client holding the secret, in a loop: set up tests past the bound (64 streams
  each), start ``iperf3`` servers past the bound (where iperf3 is installed), open data
  connections with its token and send, open ping connections; a new session whenever one ends.

Every 5 s: the server's RSS (``VmRSS``), open files (``/proc/PID/fd``), threads, children (and
how many are zombies), and the flood's counts. After the flood, a real ``link test`` against the
server must measure (shown as its verdict), and the server must still run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import stop  # noqa: E402
from sparkdiag.link import auth  # noqa: E402
from sparkdiag.link.client import LinkError, Options, measure_link  # noqa: E402
from sparkdiag.link.session import open_control  # noqa: E402
from sparkdiag.link.wire import VERSION, LineReader, encode, send  # noqa: E402

SECRET = auth.nonce().encode()


def proc_figures(pid: int) -> dict[str, Any]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    children = zombies = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == pid:
            children += 1
            zombies += stat[0] == "Z"
    return {
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "open_files": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(fields["Threads"]),
        "children": children,
        "zombies": zombies,
    }


class Flood:
    def __init__(self, port: int, until: float) -> None:
        self.port = port
        self.until = until
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + n

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), 5, (source, 0))

    def silent(self) -> None:
        held: list[socket.socket] = []
        n = 0
        while time.monotonic() < self.until:
            try:
                held.append(self.connect(f"127.0.0.{2 + n % 8}"))
                self.count("silent connections")
            except OSError:
                self.count("silent refused")
                time.sleep(0.01)
            n += 1
            if len(held) > 600:
                held.pop(0).close()
        for sock in held:
            sock.close()

    def strangers(self) -> None:
        while time.monotonic() < self.until:
            try:
                with self.connect("127.0.0.10") as sock:
                    sock.settimeout(5)
                    reader = LineReader(sock)
                    send(
                        sock, {"sparkdiag-link": VERSION, "kind": "control", "nonce": auth.nonce()}
                    )
                    reader.read(5)
                    send(sock, {"proof": "0" * 64})
                    reader.read(5)
                    self.count("wrong proofs")
            except (OSError, ValueError):
                self.count("stranger errors")
                time.sleep(0.01)

    def garbage(self) -> None:
        stranger = {"sparkdiag-link": VERSION, "kind": "data", "session": "00", "test": "t"}
        junk = [os.urandom(200), b"x" * 100_000 + b"\n", b"[" * 5000 + b"]" * 5000 + b"\n",
                encode(stranger)]  # fmt: skip
        while time.monotonic() < self.until:
            try:
                with self.connect("127.0.0.11") as sock:
                    sock.sendall(random.choice(junk))
                    self.count("garbage connections")
            except OSError:
                self.count("garbage errors")
                time.sleep(0.01)

    def session(self) -> None:
        iperf3 = shutil.which("iperf3") is not None
        while time.monotonic() < self.until:
            try:
                control = open_control("127.0.0.1", self.port, 5.0, SECRET)
            except LinkError:
                self.count("session busy or refused")
                time.sleep(0.1)
                continue
            self.count("sessions")
            token = control.token
            try:
                n = 0
                while time.monotonic() < self.until:
                    n += 1
                    answer = control.ask({"op": "sink", "test": f"t{n}", "streams": 64,
                                          "seconds": 60})  # fmt: skip
                    self.count("tests set up" if answer.get("ok") else "tests refused")
                    if iperf3 and n % 5 == 0:
                        answer = control.ask({"op": "tool", "tool": "iperf3",
                                              "address": "127.0.0.1", "seconds": 60})  # fmt: skip
                        self.count("tools started" if "port" in answer else "tools refused")
                    for kind in ("data", "ping"):
                        try:
                            opening = {"sparkdiag-link": VERSION, "kind": kind, "session": token,
                                       "test": f"t{n}"}  # fmt: skip
                            with self.connect() as sock:
                                sock.sendall(encode(opening))
                                sock.sendall(bytes(65536))
                                self.count(f"{kind} connections")
                        except OSError:
                            self.count(f"{kind} errors")
            except (OSError, ValueError):
                self.count("sessions ended by the server")
            finally:
                control.sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--nofile", type=int, default=256, help="link serve's open-files limit")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="link-flood-"))
    secret = work / "link.secret"
    secret.write_text(SECRET.decode() + "\n")
    secret.chmod(0o600)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, args.nofile))

    server = subprocess.Popen(
        [sys.executable, "-m", "sparkdiag", "link", "serve", "--listen", f"127.0.0.1:{port}",
         "--link.secret-file", str(secret)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=limit,
    )  # fmt: skip
    assert server.stderr is not None
    line = server.stderr.readline()
    if "listening on" not in line:
        raise SystemExit(f"link serve did not start: {line}{server.stderr.read()}")
    said: list[str] = []
    threading.Thread(target=lambda: said.extend(server.stderr or []), daemon=True).start()
    samples = [{"t": 0.0, **proc_figures(server.pid)}]
    print(f"link serve pid {server.pid}, open-files limit {args.nofile}, {args.seconds:g} s flood")
    started = time.monotonic()
    flood = Flood(port, started + args.seconds)
    workers = [threading.Thread(target=getattr(flood, name), daemon=True)
               for name in ("silent", "strangers", "garbage", "session")]  # fmt: skip
    for worker in workers:
        worker.start()
    try:
        while time.monotonic() < flood.until:
            time.sleep(5.0)
            samples.append({"t": time.monotonic() - started, **proc_figures(server.pid)})
        for worker in workers:
            worker.join(30)
        time.sleep(6.0)  # the unproved connections' 5 s, then the figures after the flood
        samples.append({"t": time.monotonic() - started, **proc_figures(server.pid)})
        report = measure_link("127.0.0.1", Options(port=port, seconds=1.0, streams=4,
                              use_tools=False, secret=SECRET), Path("/sys"), Path("/"),
                              dict(os.environ))  # fmt: skip
        verdict = f"{report.paths[0].verdict}, " + ", ".join(
            f"{t.direction} {t.gbps:.1f} Gb/s" for t in report.paths[0].throughput if t.gbps
        )
    except (LinkError, OSError) as exc:
        verdict = f"failed: {exc}"
    finally:
        alive = server.poll() is None
        stop(server)
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'t s':>5} {'RSS MiB':>8} {'files':>6} {'threads':>8} {'children':>9} {'zombies':>8}")
    for s in samples:
        print(f"{s['t']:5.0f} {s['rss_mib']:8.1f} {s['open_files']:6d} {s['threads']:8d} "
              f"{s['children']:9d} {s['zombies']:8d}")  # fmt: skip
    print("flood: " + ", ".join(f"{k} {v}" for k, v in sorted(flood.counts.items())))
    lines = [line.strip() for line in said]
    fd_lines = sum("out of file descriptors" in line for line in lines)
    tracebacks = sum("Traceback" in line for line in lines)
    print(f"link serve said {len(lines)} line(s): {fd_lines} 'out of file descriptors', "
          f"{tracebacks} traceback(s); still running after the flood: {alive}")  # fmt: skip
    print(f"a link test after the flood: {verdict}")
    if args.json is not None:
        args.json.write_text(json.dumps({"samples": samples, "flood": flood.counts,
                                         "after": verdict, "alive": alive}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
