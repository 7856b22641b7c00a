#!/usr/bin/env python3
"""Benchmark: what the daemon costs sitting idle, against floors measured in the same run.

Prints figures; asserts nothing (issue 35's targets are read from the output, on the H200: idle
CPU at most 0.25 % of a core, RSS at most 1.15x the NVML floor, one GPU, 1 s poll).

    python benchmarks/idle_cost.py                          # fixtures: 1 GPU, 8, 8 + options
    python benchmarks/idle_cost.py --real --peer-cmd \\
        "python3 -m nvitop_exporter --bind-address 127.0.0.1 --port {port} --interval 1"

Everything runs at the same time, for one window of ``--seconds`` (default 120):

* sparkdiag ``serve`` once per variant (``--variant`` picks), with ``--no-probe.enabled`` as the
  peers have no probe, but ``+probe``: the default configuration, its probe scheduler and store
  there, its first cycle after the window. On fixtures: ``1gpu`` (h200-idle.json), ``8gpu``
  (h200-x8.json and its sysfs tree), ``8gpu+dcgm+proc`` (the same with ``--compat.dcgm
  --process-metrics``) and ``1gpu+probe`` (the recorded H200 probe document); with ``--real``:
  ``real``, ``real+dcgm+proc`` and ``real+probe``;
* the peer (``--peer-cmd``, ``{port}`` replaced by a free port), if given;
* the floors, each a Python that wakes once a second as the daemon polls: ``python`` (nothing
  imported), ``nvml`` (NVML initialised and one query a second; on fixtures: the fixture
  backend loaded and one query a second, so the floor here is Python + the fixture backend, not
  the NVML library), ``stack`` (that and what the idle daemon imports from outside sparkdiag
  that weighs: asyncio without ssl, click, h11, pyudev), ``deps`` (``nvml`` and the list
  the issue's floor imported: psutil, prometheus-client, click, PyYAML, h11, bcrypt) and
  ``cli`` (``deps`` and ``sparkdiag.cli``); beside them ``gpu-source``, sparkdiag's GPU source
  alone polled once a second (``nvml`` and every NVML query the daemon makes: GPM, process
  samples, field values; on fixtures, the fixture's answers).

Before the window each exporter is scraped ``--warm-scrapes`` times, 1.1 s apart, as Prometheus
asks (the issue's figure was taken after such scrapes); in the window nobody scrapes, unless
``--scrape-every S``. For each process: CPU (user + system) over the window as a percentage of
one core, RSS at the end and its peak (sampled every second), threads, and the anonymous and
file-backed parts of RSS (``/proc/PID/smaps_rollup``). The packages involved are byte-compiled
first (``compileall``), so no process pays for compiling as an installed package would not.

``--py-spy BIN``: one more daemon of the first variant, profiled by ``py-spy record`` through
the window (not measured); its top frames by samples are printed and the raw profile written
under ``--out``. ``--nvml-profile``: one more process polls the GPU source as the daemon does,
once a second, and reports the CPU and wall time of each NVML query.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks.common
from benchmarks.common import fetch, free_port, proc_usage, stop, wait_http  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
PROMETHEUS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}
DEPS = ("psutil", "prometheus_client", "click", "yaml", "h11", "bcrypt")
# What the idle daemon without a probe imports from outside sparkdiag that weighs (sys.modules of
# a `serve`, 2026-12-04): its HTTP server runs on asyncio, imported without ssl by
# sparkdiag/web/__init__.py (which is all `import sparkdiag.web` loads), the CLI on click, h11
# parses HTTP, pyudev lists the host's PCI devices on a real /sys. sqlite3 keeps the probe's
# baselines (with a probe only); ssl comes with a TLS web config; psutil, prometheus_client,
# PyYAML and bcrypt are not among them (prometheus_client and bcrypt are imported only when a
# scrape asks for OpenMetrics or basic auth is configured; psutil is a test dependency).
STACK = ("sparkdiag.web", "click", "h11", "pyudev")
PEERS = ("nvitop", "nvitop_exporter", "pynvml")

# The floors: each prints "ready" once set up, then wakes once a second.
_LOOP = "import sys, time\nprint('ready', flush=True)\nwhile True:\n    {work}\n    time.sleep(1)\n"
_NVML_REAL = (
    "import pynvml\npynvml.nvmlInit()\nh = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
    "pynvml.nvmlDeviceGetTemperature(h, 0)\n"
)
_NVML_FIXTURE = (
    "from pathlib import Path\nfrom sparkdiag.sources.nvml.fixture import FixtureBackend\n"
    "b = FixtureBackend(Path({fixture!r}))\nb.init()\nb.query(0, 'temperature', 0)\n"
)
# sparkdiag's GPU source alone, polled once a second: NVML answering every query the daemon
# makes (GPM samples, process samples, field values), with nothing else of the daemon around it
_GPU_SOURCE = (
    "from pathlib import Path\nfrom sparkdiag.sources.nvml.backends import make_backend\n"
    "from sparkdiag.sources.nvml.gpu import GpuSource\n"
    "b = make_backend({fixture})\ns = GpuSource(b)\ns.start()\ns.read()\n"
)
_NVML_WORK = {
    True: "pynvml.nvmlDeviceGetTemperature(h, 0)",
    False: "b.query(0, 'temperature', 0)",
}


def floors(real: bool, fixture: Path) -> dict[str, str]:
    """Python source of each floor, in order: each adds to the one before."""
    setup = _NVML_REAL if real else _NVML_FIXTURE.format(fixture=str(fixture))
    deps = "".join(f"import {name}\n" for name in DEPS)
    work = _NVML_WORK[real]
    return {
        "python": _LOOP.format(work="pass"),
        "nvml": setup + _LOOP.format(work=work),
        "stack": setup + "".join(f"import {name}\n" for name in STACK) + _LOOP.format(work=work),
        "deps": setup + deps + _LOOP.format(work=work),
        "cli": setup + deps + "import sparkdiag.cli\n" + _LOOP.format(work=work),
        "gpu-source": _GPU_SOURCE.format(fixture="None" if real else f"Path({str(fixture)!r})")
        + _LOOP.format(work="b.advance(); s.read(); s.events()"),
    }


@dataclass
class Target:
    """One process measured (or profiled) in the window."""

    name: str
    kind: str  # "sparkdiag", "peer", "floor", "profiled"
    cmd: list[str]
    port: int | None = None
    src: Path = ROOT
    proc: subprocess.Popen[bytes] | None = None
    cpu0: float = 0.0
    scan_seconds: float | None = None
    peak: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)


def serve_variants(opts: argparse.Namespace, state: Path) -> dict[str, list[str]]:
    """The sparkdiag variants measured, name -> serve arguments (besides --listen). Each runs
    without the probe (as the peers do), but ``+probe``: the default configuration, whose probe
    scheduler and store are there but whose first cycle comes after the window."""
    off = ["--no-probe.enabled"]
    probe = ["--probe.first-delay", str(int(opts.seconds) + 600), "--state-dir", str(state)]
    if opts.real:
        variants = {
            "real": off,
            "real+dcgm+proc": [*off, "--compat.dcgm", "--process-metrics"],
            "real+probe": probe,
        }
    else:
        one = ["--nvml-fixture", str(FIXTURES / "nvml" / "h200-idle.json")]
        eight = [
            "--nvml-fixture",
            str(FIXTURES / "nvml" / "h200-x8.json"),
            "--path.sysfs",
            str(FIXTURES / "sysfs" / "h200-x8"),
        ]
        extra = [
            "--compat.dcgm",
            "--process-metrics",
            "--path.rootfs",
            str(FIXTURES / "rootfs" / "gpu-host"),
        ]
        replay = ["--probe.fixture", str(FIXTURES / "probe" / "h200-default.json")]
        variants = {
            "1gpu": [*off, *one],
            "8gpu": [*off, *eight],
            "8gpu+dcgm+proc": [*off, *eight, *extra],
            "1gpu+probe": [*one, *replay, *probe],
        }
    chosen = opts.variant or list(variants)
    unknown = [v for v in chosen if v not in variants]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; these exist: {list(variants)}")
    return {name: variants[name] + opts.serve_arg for name in chosen}


def precompile(src: Path) -> None:
    """Byte-compile sparkdiag and the packages the processes import, as an install would."""
    dirs = [src / "sparkdiag"]
    for name in (*DEPS, *PEERS):
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.origin:
                origin = Path(spec.origin)
                dirs.append(origin.parent if origin.name == "__init__.py" else origin)
    for path in dirs:
        if path.is_dir():
            compileall.compile_dir(path, quiet=1, workers=0)
        elif path.suffix == ".py":
            compileall.compile_file(path, quiet=1)


def smaps(pid: int) -> dict[str, float]:
    """Anonymous and file-backed RSS in MiB, from /proc/PID/smaps_rollup."""
    kib: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("Rss", "Anonymous") and rest.split():
                kib[name] = int(rest.split()[0])
    rss, anon = kib.get("Rss", 0), kib.get("Anonymous", 0)
    return {"anonymous_mib": anon / 1024, "file_mib": (rss - anon) / 1024}


def environment(src: Path) -> dict[str, str]:
    """The children's environment: ``src`` first on the path, byte-code files read."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _log_name(target: Target) -> str:
    """A target's log file: "base:real" as base-real.log (a colon is no name on every system)."""
    return target.name.replace(":", "-") + ".log"


def start(target: Target, logs: Path) -> None:
    log = (logs / _log_name(target)).open("wb")
    target.proc = subprocess.Popen(
        target.cmd,
        cwd=target.src,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environment(target.src),
    )


def ready(target: Target, logs: Path) -> None:
    """Wait until an exporter answers /metrics, or a floor printed "ready"."""
    assert target.proc is not None
    if target.port is not None:
        wait_http(target.port, target.proc, 90, "/metrics")
        return
    log = logs / _log_name(target)
    deadline = time.monotonic() + 60
    while "ready" not in log.read_text(errors="replace"):
        if target.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"floor {target.name} did not start: {log.read_text()[-800:]}")
        time.sleep(0.1)


SCAN_DONE = re.compile(rb"^sparkdiag_cuda_library_scan_duration_seconds (\S+)$", re.MULTILINE)


def scanned(targets: list[Target], logs: Path, seconds: float = 60.0) -> None:
    """Wait, at most ``seconds`` in all, until each daemon's CUDA library scan has finished (its
    figure is on /metrics; its duration goes to ``scan_seconds``), so that the window does not
    take in the start-up's work: the scan runs in a child process once at start and every 6
    hours, and the daemon's CPU counts its children's once it has waited for them. A daemon that
    exited, or whose log says the scan failed, is not waited for; those still scanning at the
    deadline are named on stderr."""
    deadline = time.monotonic() + seconds
    waiting = [t for t in targets if t.port is not None and t.kind in ("sparkdiag", "profiled")]
    while waiting and time.monotonic() < deadline:
        for target in list(waiting):
            assert target.proc is not None and target.port is not None
            log = (logs / _log_name(target)).read_text(errors="replace")
            if target.proc.poll() is not None or "CUDA library scan failed" in log:
                waiting.remove(target)
                continue
            try:
                match = SCAN_DONE.search(fetch(target.port, PROMETHEUS)[1])
            except OSError:
                continue
            if match:
                target.scan_seconds = float(match.group(1))
                waiting.remove(target)
        if waiting:
            time.sleep(1.0)
    for target in waiting:
        print(f"{target.name}: library scan not finished after {seconds:g} s", file=sys.stderr)


# Leaf frames of a thread that waits (py-spy records with --idle, so that time in a native
# call, an NVML ioctl, is not left out as idle): not work. The signals' thread blocks in
# os.read on its pipe, a C call with no frame of its own, so its leaf is its own function (on
# the H200, 2026-12-04, it took all 11,997 samples of "[other]" while the daemon used 0.16 %
# of a core).
WAITING = ("Condition.wait", "Event.wait", "Selector.select", "Thread.join", "_worker (concurrent",
           "Lifecycle._signals")  # fmt: skip


# What a working sample was doing, by the first of these frames in its stack.
ACTIVITIES = (
    ("Prerenderer._run", "render ahead"),
    ("Poller.poll_once", "poll"),
    ("HotProbeScheduler", "hot probe"),
    ("ProbeScheduler", "probe"),
    ("ExporterServer", "HTTP"),
    ("BaseEventLoop", "HTTP"),
)


def pyspy_top(raw: Path, top: int = 15) -> list[tuple[int, str]]:
    """(samples, what) from a ``--format raw`` file, waiting threads left out: every working
    sample, then by activity (the thread's work: render ahead, poll ...), then the frames on
    top of the most samples."""
    leaves: Counter[str] = Counter()
    activities: Counter[str] = Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        leaf = stack.split(";")[-1]
        if stack and count.isdigit() and not any(w in leaf for w in WAITING):
            leaves[leaf] += int(count)
            what = next((name for frame, name in ACTIVITIES if frame in stack), "other")
            activities[f"[{what}]"] += int(count)
    total = (sum(leaves.values()), "(every sample of a working thread)")
    return [
        total,
        *((n, what) for what, n in activities.most_common()),
        *((n, frame) for frame, n in leaves.most_common(top)),
    ]


def profile_nvml(seconds: float, fixture: str | None) -> None:
    """The child of --nvml-profile: poll the GPU source once a second and time each query."""
    from sparkdiag.sources.nvml.backends import make_backend
    from sparkdiag.sources.nvml.gpu import GpuSource

    backend = make_backend(Path(fixture) if fixture else None)
    times: dict[str, list[float]] = {}
    real_query = backend.query

    def timed(index: int, query: str, arg: int | None = None) -> Any:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            return real_query(index, query, arg)
        finally:
            key = query if arg is None else f"{query}/{arg}"
            entry = times.setdefault(key, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += time.thread_time() - cpu
            entry[2] += time.perf_counter() - wall

    backend.query = timed  # type: ignore[method-assign]
    source = GpuSource(backend)
    source.start()
    source.read()
    times.clear()  # the first poll asks every tier: count the steady state only
    polls = 0
    cpu0, start = time.process_time(), time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(1.0)
        backend.advance()
        source.read()
        source.events()
        polls += 1
    cpu = time.process_time() - cpu0
    source.stop()
    rows = sorted(times.items(), key=lambda kv: -kv[1][1])
    print(
        json.dumps(
            {
                "polls": polls,
                "process_cpu_ms_per_poll": 1e3 * cpu / max(polls, 1),
                "queries": {
                    k: {
                        "calls": int(v[0]),
                        "cpu_us_per_call": 1e6 * v[1] / v[0],
                        "wall_us_per_call": 1e6 * v[2] / v[0],
                        "cpu_ms_per_poll": 1e3 * v[1] / max(polls, 1),
                    }
                    for k, v in rows
                },
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="the idle window")
    parser.add_argument("--real", action="store_true", help="the real GPU, not fixtures")
    parser.add_argument("--variant", action="append", help="only these variants (repeatable)")
    parser.add_argument("--serve-arg", action="append", default=[], help="more serve arguments")
    parser.add_argument("--peer-cmd", help="the peer exporter's command; {port} is replaced")
    parser.add_argument("--no-floors", action="store_true")
    parser.add_argument("--warm-scrapes", type=int, default=3)
    parser.add_argument("--scrape-every", type=float, default=0.0, help="scrape in the window")
    parser.add_argument("--py-spy", help="py-spy binary: profile one more daemon")
    parser.add_argument("--nvml-profile", action="store_true", help="time each NVML query")
    parser.add_argument("--out", type=Path, help="folder for logs and the py-spy profile")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--src", type=Path, default=ROOT, help="the checkout of sparkdiag run")
    parser.add_argument(
        "--base-src", type=Path, help="also run the variants of this checkout (base:NAME)"
    )
    parser.add_argument("--profile-nvml-child", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--fixture", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.profile_nvml_child is not None:
        profile_nvml(opts.profile_nvml_child, opts.fixture)
        return

    python, src = sys.executable, opts.src.resolve()
    sources = [("", src)] + ([("base:", opts.base_src.resolve())] if opts.base_src else [])
    for _, tree in sources:
        precompile(tree)
    one_gpu = FIXTURES / "nvml" / "h200-idle.json"
    state = Path(tempfile.mkdtemp(prefix="idle-cost-state-"))  # +probe variants' stores
    targets: list[Target] = []
    for prefix, tree in sources:
        for name, args in serve_variants(opts, state / prefix.rstrip(":")).items():
            port = free_port()
            cmd = [
                python,
                "-m",
                "sparkdiag",
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--log-level",
                "warning",
                *args,
            ]
            targets.append(Target(prefix + name, "sparkdiag", cmd, port, tree))
    if opts.peer_cmd:
        port = free_port()
        peer = shlex.split(opts.peer_cmd.format(port=port))
        targets.append(Target("peer", "peer", peer, port, src))
    if not opts.no_floors:
        for name, code in floors(opts.real, one_gpu).items():
            targets.append(Target(name, "floor", [python, "-c", code], None, src))
    first = targets[0]
    if opts.py_spy:
        port = free_port()
        cmd = [*first.cmd[:5], f"127.0.0.1:{port}", *first.cmd[6:]]
        targets.append(Target(f"{first.name}-profiled", "profiled", cmd, port, src))
    results: dict[str, Any] = {
        "host": os.uname().nodename,
        "python": sys.version.split()[0],
        "seconds": opts.seconds,
        "real": opts.real,
        "scrape_every": opts.scrape_every,
        "src": str(src),
        "base_src": str(opts.base_src or ""),
    }
    with tempfile.TemporaryDirectory(prefix="idle-cost-") as tmp:
        logs = opts.out or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        profiler: subprocess.Popen[bytes] | None = None
        nvml: subprocess.Popen[bytes] | None = None
        try:
            for target in targets:
                start(target, logs)
            for target in list(targets):  # one that cannot start is reported, not fatal
                try:
                    ready(target, logs)
                except RuntimeError as exc:
                    print(f"{target.name}: left out: {exc}", file=sys.stderr)
                    results.setdefault("left_out", {})[target.name] = str(exc)[-500:]
                    assert target.proc is not None
                    stop(target.proc)
                    targets.remove(target)
            exporters = [t for t in targets if t.port is not None]
            scanned(exporters, logs)  # the start-up work done, which the window is not about
            for _ in range(opts.warm_scrapes):
                for target in exporters:
                    assert target.port is not None
                    fetch(target.port, PROMETHEUS)
                time.sleep(1.1)
            profiled = next((t for t in targets if t.kind == "profiled"), None)
            if opts.py_spy and profiled is not None:
                assert profiled.proc is not None
                spy = [
                    opts.py_spy,
                    "record",
                    "--pid",
                    str(profiled.proc.pid),
                    "--duration",
                    str(int(opts.seconds)),
                    "--rate",
                    "100",
                    "--idle",
                    "--nonblocking",
                    "--format",
                    "raw",
                    "--output",
                    str(logs / "py-spy.txt"),
                ]
                profiler = subprocess.Popen(
                    spy, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
                )
            if opts.nvml_profile:
                child = [python, __file__, "--profile-nvml-child", str(opts.seconds)]
                if not opts.real:
                    child += ["--fixture", str(one_gpu)]
                nvml = subprocess.Popen(
                    child, cwd=src, env=environment(src), stdout=subprocess.PIPE
                )
            for target in targets:
                assert target.proc is not None
                target.cpu0 = proc_usage(target.proc.pid)[0]
            began = time.monotonic()
            next_scrape = began + opts.scrape_every
            while (elapsed := time.monotonic() - began) < opts.seconds:
                for target in targets:
                    assert target.proc is not None
                    if target.proc.poll() is not None:
                        raise RuntimeError(f"{target.name} exited {target.proc.returncode}")
                    target.peak = max(target.peak, proc_usage(target.proc.pid)[1])
                if opts.scrape_every and time.monotonic() >= next_scrape:
                    for target in exporters:
                        assert target.port is not None
                        fetch(target.port, PROMETHEUS)
                    next_scrape += opts.scrape_every
                time.sleep(min(1.0, max(0.0, opts.seconds - elapsed)))
            wall = time.monotonic() - began
            for target in targets:
                assert target.proc is not None
                pid = target.proc.pid
                cpu, rss = proc_usage(pid)
                target.figures = {
                    "kind": target.kind,
                    "cpu_percent_of_one_core": 100 * (cpu - target.cpu0) / wall,
                    "cpu_seconds_before_window": target.cpu0,
                    "library_scan_seconds": target.scan_seconds,
                    "rss_mib": rss,
                    "peak_rss_mib": max(target.peak, rss),
                    "threads": len(os.listdir(f"/proc/{pid}/task")),
                    **smaps(pid),
                }
            if profiler is not None:
                profiler.wait(timeout=60)
            if nvml is not None:
                out, _ = nvml.communicate(timeout=60)
                results["nvml_profile"] = json.loads(out)
        finally:
            for proc in (profiler, nvml, *(t.proc for t in targets)):
                if proc is not None:
                    stop(proc)
            shutil.rmtree(state, ignore_errors=True)
        results["processes"] = {t.name: t.figures for t in targets}
        if opts.py_spy and (logs / "py-spy.txt").exists():
            results["py_spy_top"] = pyspy_top(logs / "py-spy.txt")
    report(results)
    if opts.json:
        opts.json.write_text(json.dumps(results, indent=1))


def report(results: dict[str, Any]) -> None:
    procs: dict[str, dict[str, Any]] = results["processes"]
    for name, why in results.get("left_out", {}).items():
        print(f"{name}: left out ({why.strip().splitlines()[-1] if why.strip() else '?'})")
    floor = procs.get("nvml", {}).get("rss_mib")
    what = "the real GPU" if results["real"] else "fixtures (NVML floor = Python + fixture backend)"
    scraped = f"scraped every {results['scrape_every']:g} s" if results["scrape_every"] else "idle"
    print(
        f"{results['seconds']:.0f} s {scraped}, {what}, {results['host']}, "
        f"Python {results['python']}"
    )
    print(
        f"{'process':<22} {'CPU %core':>9} {'RSS MiB':>8} {'peak':>6} {'x floor':>7} "
        f"{'anon':>6} {'file':>6} {'threads':>7}"
    )
    for name, fig in procs.items():
        if not fig:
            continue
        ratio = f"{fig['rss_mib'] / floor:7.2f}" if floor else f"{'':>7}"
        print(
            f"{name:<22} {fig['cpu_percent_of_one_core']:9.3f} {fig['rss_mib']:8.1f} "
            f"{fig['peak_rss_mib']:6.1f} {ratio} {fig['anonymous_mib']:6.1f} "
            f"{fig['file_mib']:6.1f} {fig['threads']:7d}"
        )
    for name, fig in procs.items():
        if fig and fig.get("library_scan_seconds") is not None:
            print(
                f"{name}: before the window {fig['cpu_seconds_before_window']:.2f} s of CPU "
                f"(imports, first polls, the library scan of {fig['library_scan_seconds']:.2f} s)"
            )
    for prefix in ("", "base:"):
        one, eight = procs.get(prefix + "1gpu"), procs.get(prefix + "8gpu")
        full = procs.get(prefix + "8gpu+dcgm+proc")
        if one and eight:
            cpu = (eight["cpu_percent_of_one_core"] - one["cpu_percent_of_one_core"]) / 7
            rss = (eight["rss_mib"] - one["rss_mib"]) / 7
            print(
                f"{prefix}per GPU beyond the first: CPU {cpu:+.3f} % of a core, RSS {rss:+.2f} MiB"
            )
        if eight and full:
            cpu = full["cpu_percent_of_one_core"] - eight["cpu_percent_of_one_core"]
            rss = full["rss_mib"] - eight["rss_mib"]
            print(
                f"{prefix}--compat.dcgm --process-metrics on 8 GPUs: CPU {cpu:+.3f} % of a "
                f"core, RSS {rss:+.2f} MiB"
            )
    for samples, frame in results.get("py_spy_top", []):
        print(f"py-spy {samples:6d}  {frame}")
    profile = results.get("nvml_profile")
    if profile:
        print(
            f"NVML poll, once a second: {profile['process_cpu_ms_per_poll']:.3f} ms CPU per "
            f"poll (the whole profiling process, {profile['polls']} polls); by query:"
        )
        for query, q in list(profile["queries"].items())[:25]:
            print(
                f"  {query:<34} {q['calls']:5d} calls {q['cpu_us_per_call']:9.1f} us CPU "
                f"{q['wall_us_per_call']:9.1f} us wall {q['cpu_ms_per_poll']:7.3f} ms/poll"
            )


if __name__ == "__main__":
    main()
