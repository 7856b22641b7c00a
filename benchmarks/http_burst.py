#!/usr/bin/env python3
"""Benchmark: how the HTTP server holds under bursts, idle sockets and a wrong-password flood.

Prints figures; asserts nothing (the behaviours are proven by tests/test_http_limits.py, this
shows the numbers). Runs ``sparkdiag serve`` on the 8-GPU NVML fixture, loopback only:

    python benchmarks/http_burst.py                      # this checkout
    python benchmarks/http_burst.py --src /tmp/orig      # another checkout (e.g. the old code)

* static: the 8-GPU scrape against a static server of the same bytes on the same HTTP layer
  (sparkdiag's HttpServer serving the body it got), in alternating rounds: p50/p99 and the
  ratio (issue 23's target: at most 1.5x) for back-to-back scrapes; then rounds, one or two
  poll intervals apart, of the first scrape of a new snapshot (checked by its poll timestamp)
  and a back-to-back one, then the static server's first after a pause and back-to-back, plain
  and as Prometheus asks (gzip): the ratios, measured in the same rounds;
* tls-idle: with TLS, RSS before, beside T silent connections (default 700), beside T
  connections that finished a handshake and then stay idle, and after they close;
* burst: N simultaneous scrapes of /metrics (default 200), each its own connection: how many
  got 200, 503, another answer or none, and the slowest;
* idle: M connections that send nothing (default 1000): the server's threads and RSS beside
  them, a scrape's latency beside them, and how long until the server closes them (watched up
  to --idle-watch seconds);
* auth: with basic auth (bcrypt cost 10), 20 wrong passwords one at a time (the cost of one
  attempt), then W wrong passwords (default 200) sent by 50 clients at once: the answers, time
  per attempt (queueing included), and the latency of correct-password scrapes made every
  0.1 s during the flood; then a few hostile credentials (73-byte password, lower-case scheme,
  bad base64), each answered or dropped.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import http.client
import os
import random
import resource
import selectors
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bcrypt

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks.common
from benchmarks.common import fetch, stop  # noqa: E402
from benchmarks.common import poll_time as common_poll_time  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "nvml" / "h200-x8.json"
USER, PASSWORD = "prometheus", "correct horse"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def auth_header(user: str, password: str | bytes, scheme: str = "Basic") -> str:
    raw = password if isinstance(password, bytes) else password.encode()
    return f"{scheme} " + base64.b64encode(user.encode() + b":" + raw).decode()


def scrape(port: int, timeout: float, headers: dict[str, str] | None = None) -> tuple[str, float]:
    """One GET /metrics on a fresh connection: (status or error name, seconds)."""
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/metrics", headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        result = str(resp.status)
    except TimeoutError:
        result = "no answer"
    except (http.client.HTTPException, OSError) as exc:
        result = f"dropped ({type(exc).__name__})"
    finally:
        conn.close()
    return result, time.monotonic() - start


def proc_status(pid: int) -> tuple[int, float]:
    """(threads, RSS in MiB) of a process, from /proc/PID/status."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) / 1024


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def summary(times: list[float]) -> str:
    if not times:
        return "none"
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"median {ms(statistics.median(ordered))}, p90 {ms(p90)}, slowest {ms(ordered[-1])}"


@contextlib.contextmanager
def daemon(src: Path, python: str, extra: list[str]) -> Iterator[tuple[int, int]]:
    """Run ``sparkdiag serve`` from ``src``; yield (port, pid) once /healthz answers."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="http-burst-") as state:
        cmd = [
            python, "-m", "sparkdiag", "serve", "--listen", f"127.0.0.1:{port}",
            "--nvml-fixture", str(FIXTURE), "--no-probe.enabled", "--log-level", "error",
            *extra,
        ]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(src), XDG_STATE_HOME=state)
        proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"sparkdiag exited {proc.returncode}")
                with contextlib.suppress(OSError):
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                if time.monotonic() > deadline:
                    raise SystemExit("sparkdiag did not start listening in time")
                time.sleep(0.05)
            time.sleep(0.5)  # the first poll
            yield port, proc.pid
        finally:
            stop(proc)


def together(count: int, work: Callable[[int], tuple[str, float]]) -> list[tuple[str, float]]:
    """Run ``work(i)`` for i in range(count) in as many threads, released at once."""
    results: list[tuple[str, float]] = [("not run", 0.0)] * count
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def burst(port: int, count: int, timeout: float) -> None:
    print(f"== {count} simultaneous scrapes (own connection each, client timeout {timeout:g} s)")
    start = time.monotonic()
    results = together(count, lambda _i: scrape(port, timeout))
    wall = time.monotonic() - start
    answers = Counter(status for status, _ in results)
    print("answers:", ", ".join(f"{k}: {v}" for k, v in sorted(answers.items())))
    print(f"all done after {wall:.2f} s; time per scrape: {summary([t for _, t in results])}")
    for status in sorted(answers):
        times = [t for s, t in results if s == status]
        print(f"  {status}: {summary(times)}")


def idle(port: int, pid: int, count: int, watch: float) -> None:
    print(f"== {count} idle connections (connect, send nothing)")
    threads0, rss0 = proc_status(pid)
    print(f"server before: {threads0} threads, RSS {rss0:.1f} MiB")
    socks: list[socket.socket] = []
    opened: dict[int, float] = {}  # fileno -> when its connect returned
    start = time.monotonic()
    refused = 0
    for _ in range(count):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            refused += 1
            continue
        socks.append(sock)
        opened[sock.fileno()] = time.monotonic()
    print(f"opened {len(socks)} in {time.monotonic() - start:.2f} s ({refused} failed)")
    time.sleep(1.0)
    threads1, rss1 = proc_status(pid)
    print(f"server beside them: {threads1} threads, RSS {rss1:.1f} MiB")
    beside = [scrape(port, 30) for _ in range(5)]
    print("5 scrapes beside them: " + ", ".join(f"{status} in {ms(t)}" for status, t in beside))
    # Watch every socket until the server closes it (EOF, a reset, or an answer then EOF).
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    closed: list[float] = []
    answered: Counter[str] = Counter()
    deadline = time.monotonic() + watch
    while selector.get_map() and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.2):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                answered[data.split(b"\r\n", 1)[0].decode("latin-1")] += 1
                continue
            closed.append(time.monotonic() - opened[sock.fileno()])
            selector.unregister(sock)
            sock.close()
    still_open = len(selector.get_map())
    for key in list(selector.get_map().values()):
        sock = key.fileobj
        assert isinstance(sock, socket.socket)
        sock.close()
    selector.close()
    if answered:
        print("answers before close:", ", ".join(f"{k!r}: {v}" for k, v in answered.items()))
    if closed:
        closed.sort()
        at_once = sum(1 for t in closed if t < 2.0)
        print(
            f"closed by the server: {len(closed)} (within 2 s: {at_once}); close times: "
            f"median {closed[len(closed) // 2]:.1f} s, last {closed[-1]:.1f} s after its connect"
        )
    print(f"still open {watch:g} s after the 5 scrapes: {still_open}")
    time.sleep(0.5)
    threads2, rss2 = proc_status(pid)
    print(f"server after: {threads2} threads, RSS {rss2:.1f} MiB")


PROMETHEUS = {  # what Prometheus 2.42 sends with each scrape
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}
VARIANTS = {"text": {}, "prometheus (text, gzip)": PROMETHEUS}


def poll_time(body: bytes) -> float:
    """The poll a scrape rendered; 0 for the static server's copy."""
    return common_poll_time(body) or 0.0


def figures(times: list[float]) -> str:
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"p50 {ms(statistics.median(ordered))}, p90 {ms(p90)}, max {ms(ordered[-1])}"


def static_compare(src: Path, python: str, rounds: int, per_round: int, spaced: int) -> None:
    print(f"== 8-GPU scrape against a static server of the same bytes ({rounds} rounds of "
          f"{per_round}, alternating)")  # fmt: skip
    sys.path.insert(0, str(src))
    from sparkdiag.web.serving import HttpServer, Limits, Response

    with daemon(src, python, []) as (port, _pid):
        _, body = fetch(port, {})
        zipped = gzip.compress(body, 6, mtime=0)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        static_port = int(sock.getsockname()[1])

        async def handler(request: Any) -> Response:
            kind = "text/plain; version=0.0.4; charset=utf-8"
            if "gzip" in request.headers.get("accept-encoding", ""):
                return Response(200, zipped, kind, (("Content-Encoding", "gzip"),))
            return Response(200, body, kind)

        import asyncio

        loop = asyncio.new_event_loop()
        stop = asyncio.Event()
        engine = HttpServer(sock, handler, Limits())
        thread = threading.Thread(target=loop.run_until_complete, args=(engine.serve(stop),))
        thread.start()
        try:
            times: dict[str, list[float]] = {"sparkdiag": [], "static": []}
            for r in range(rounds):
                order = [("sparkdiag", port), ("static", static_port)]
                for name, target in order if r % 2 == 0 else order[::-1]:
                    times[name] += [scrape(target, 10)[1] for _ in range(per_round)]
            p50 = {k: statistics.median(v) for k, v in times.items()}
            p99 = {k: sorted(v)[round(0.99 * (len(v) - 1))] for k, v in times.items()}
            for name in times:
                print(f"  {name:<10} p50 {ms(p50[name])}, p99 {ms(p99[name])} ({len(body)} bytes)")
            print(f"  sparkdiag / static: p50 {p50['sparkdiag'] / p50['static']:.2f}x, "
                  f"p99 {p99['sparkdiag'] / p99['static']:.2f}x")  # fmt: skip
            if spaced:
                fresh_rounds(port, static_port, spaced)
        finally:
            loop.call_soon_threadsafe(stop.set)
            thread.join(10)
            sock.close()


def fresh_rounds(port: int, static_port: int, count: int) -> None:
    """Each round: wait 1-2 poll intervals (a random phase against the 1 s poll, as a
    Prometheus' scrapes fall), then the first scrape of the new snapshot and a second one right
    after it (back-to-back); then, after a pause of its own (0.3-1 s), the same two of the
    static server: a first request after a pause is slower on any server (the process and its
    caches wake up), so the first scrape is compared with the static server's first."""
    rng = random.Random(23)
    print(f"== {count} rounds per variant: the first scrape of a new snapshot and a back-to-back "
          "one; the same two of the static server, after a pause")  # fmt: skip
    for variant, headers in VARIANTS.items():
        fresh: list[float] = []
        again: list[float] = []
        static_first: list[float] = []
        static_again: list[float] = []
        stale = 0
        last = 0.0
        for _ in range(count):
            time.sleep(1.0 + rng.random())
            took, body = fetch(port, headers)
            seen = poll_time(body)
            if seen <= last:
                stale += 1  # no poll since the last round: not a new snapshot, left out
            else:
                fresh.append(took)
            last = seen
            again.append(fetch(port, headers)[0])
            time.sleep(0.3 + 0.7 * rng.random())
            static_first.append(fetch(static_port, headers)[0])
            static_again.append(fetch(static_port, headers)[0])
        f50, a50 = statistics.median(fresh), statistics.median(again)
        sf50, sa50 = statistics.median(static_first), statistics.median(static_again)
        print(f"  {variant}: {len(fresh)} first scrapes of a new snapshot ({stale} left out: "
              "no new poll)")  # fmt: skip
        print(f"    first of a snapshot       {figures(fresh)}")
        print(f"    back-to-back              {figures(again)}")
        print(f"    static, first after pause {figures(static_first)}")
        print(f"    static, back-to-back      {figures(static_again)}")
        print(f"    first / back-to-back p50 {f50 / a50:.2f}x; first / static first p50 "
              f"{f50 / sf50:.2f}x; back-to-back / static back-to-back p50 "
              f"{a50 / sa50:.2f}x")  # fmt: skip


def tls_idle(src: Path, python: str, count: int) -> None:
    print(f"== {count} idle TLS connections")
    with tempfile.TemporaryDirectory(prefix="http-burst-tls-") as tmp:
        d = Path(tmp)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", str(d / "tls.key"), "-out", str(d / "tls.crt")],
            check=True, capture_output=True,
        )  # fmt: skip
        web = d / "web.yml"
        web.write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
        extra = ["--web.config.file", str(web), "--web.max-connections", str(count + 100),
                 "--web.read-timeout", "120"]  # fmt: skip
        with daemon(src, python, extra) as (port, pid):
            _, rss0 = proc_status(pid)
            silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
            time.sleep(1.0)
            _, rss1 = proc_status(pid)
            for sock in silent:
                sock.close()
            time.sleep(1.0)
            context = ssl.create_default_context(cafile=str(d / "tls.crt"))
            shaken = []
            for _ in range(count):
                raw = socket.create_connection(("127.0.0.1", port))
                shaken.append(context.wrap_socket(raw, server_hostname="127.0.0.1"))
            time.sleep(1.0)
            _, rss2 = proc_status(pid)
            for sock in shaken:
                sock.close()
            time.sleep(1.5)
            _, rss3 = proc_status(pid)
        print(f"  RSS before {rss0:.1f} MiB; beside {count} silent {rss1:.1f} "
              f"(+{(rss1 - rss0) * 1024 / count:.1f} KiB each); beside {count} handshaken and "
              f"idle {rss2:.1f} (+{(rss2 - rss0) * 1024 / count:.1f} KiB each); after they "
              f"closed {rss3:.1f} MiB")  # fmt: skip


def partial(port: int, watch: float) -> None:
    print("== a partial request, an HTTP/0.9 request line")
    for name, data in (
        ("partial request", b"GET /metrics HTTP/1.1\r\nHost: x\r\n"),
        ("HTTP/0.9 line", b"GET /metrics\r\n"),
    ):
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=watch) as sock:
            sock.sendall(data)
            reply = b""
            try:
                while chunk := sock.recv(4096):
                    reply += chunk
                what = f"closed after {time.monotonic() - start:.1f} s"
            except TimeoutError:
                what = f"still open after {watch:g} s"
            except OSError as exc:
                what = f"reset after {time.monotonic() - start:.1f} s ({exc})"
        first = reply.split(b"\r\n", 1)[0].decode("latin-1") or "no answer"
        print(f"{name}: {what}; {first}")


def flood(port: int, wrong: int, clients: int) -> None:
    print(f"== {wrong} wrong passwords from {clients} clients at once (bcrypt cost 10)")
    good = {"Authorization": auth_header(USER, PASSWORD)}
    for name in ("first correct scrape (pays bcrypt)", "second correct scrape"):
        status, took = scrape(port, 30, good)
        print(f"{name}: {status} in {ms(took)}")
    one_by_one = [
        scrape(port, 30, {"Authorization": auth_header(USER, f"seq-{i}")}) for i in range(20)
    ]
    print(
        "20 wrong passwords one at a time: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(Counter(s for s, _ in one_by_one).items()))
        + f"; {summary([t for _, t in one_by_one])}"
    )
    stop = threading.Event()
    during: list[tuple[str, float]] = []

    def scraper() -> None:
        while not stop.is_set():
            during.append(scrape(port, 30, good))
            stop.wait(0.1)

    watcher = threading.Thread(target=scraper)
    results: list[tuple[str, float]] = []
    lock = threading.Lock()
    per_client = wrong // clients

    def attacker(i: int) -> tuple[str, float]:
        for j in range(per_client):
            header = {"Authorization": auth_header(USER, f"wrong-{i}-{j}")}
            result = scrape(port, 60, header)
            with lock:
                results.append(result)
        return "done", 0.0

    start = time.monotonic()
    watcher.start()
    together(clients, attacker)
    wall = time.monotonic() - start
    stop.set()
    watcher.join()
    answers = Counter(status for status, _ in results)
    print("answers:", ", ".join(f"{k}: {v}" for k, v in sorted(answers.items())))
    print(f"flood took {wall:.2f} s; time per attempt: {summary([t for _, t in results])}")
    scrape_answers = Counter(status for status, _ in during)
    print(
        f"{len(during)} correct scrapes during the flood: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(scrape_answers.items()))
        + f"; {summary([t for _, t in during])}"
    )
    print("hostile credentials:")
    for name, header in (
        ("73-byte password", auth_header(USER, "x" * 73)),
        ("lower-case scheme, right password", auth_header(USER, PASSWORD, "basic")),
        ("bad base64", "Basic %%%"),
        ("no colon", "Basic " + base64.b64encode(b"prometheus").decode()),
    ):
        status, took = scrape(port, 10, {"Authorization": header})
        print(f"  {name}: {status} in {ms(took)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=ROOT, help="checkout whose sparkdiag to run")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the daemon")
    parser.add_argument("--rounds", type=int, default=10, help="static comparison rounds")
    parser.add_argument("--per-round", type=int, default=30)
    parser.add_argument("--spaced", type=int, default=30, help="fresh-snapshot rounds per variant")
    parser.add_argument("--tls-idle", type=int, default=700)
    parser.add_argument("--skip", action="append", default=[],
                        help="static, burst, idle, tls-idle or auth (repeatable)")  # fmt: skip
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--burst-timeout", type=float, default=60.0)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--idle-watch", type=float, default=30.0)
    parser.add_argument("--wrong", type=int, default=200)
    parser.add_argument("--clients", type=int, default=50)
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * args.idle + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # the daemon inherits it
    commit = subprocess.run(
        ["git", "-C", str(args.src), "log", "-1", "--format=%h %s"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    print(f"sparkdiag from {args.src} ({commit or 'not a git checkout'}); open files {want}")
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")

    if "static" not in args.skip:
        static_compare(args.src, args.python, args.rounds, args.per_round, args.spaced)
    if "burst" not in args.skip:
        with daemon(args.src, args.python, []) as (port, pid):
            burst(port, args.burst, args.burst_timeout)
    if "tls-idle" not in args.skip:
        tls_idle(args.src, args.python, args.tls_idle)
    if "idle" not in args.skip:
        with daemon(args.src, args.python, []) as (port, pid):
            idle(port, pid, args.idle, args.idle_watch)
            partial(port, min(args.idle_watch, 20.0))
    if "auth" in args.skip:
        return
    with tempfile.TemporaryDirectory(prefix="http-burst-web-") as tmp:
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
        web = Path(tmp) / "web.yml"
        web.write_text(f"basic_auth_users:\n  {USER}: {hashed.replace('$2b$', '$2y$')}\n")
        with daemon(args.src, args.python, ["--web.config.file", str(web)]) as (port, pid):
            flood(port, args.wrong, args.clients)


if __name__ == "__main__":
    main()
