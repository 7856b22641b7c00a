#!/usr/bin/env python3
"""On the lent GPU machine: training jobs, each run alone and under ``sparkdiag watch``.

    python3 scripts/device/watch_jobs.py --seconds 12 --budget 540 --out /tmp/watch \
        --archive $OUT/watch/watch_jobs.tgz                  # issue 28's jobs (the default)
    python3 scripts/device/watch_jobs.py --jobs resnet-loader,spin     # issue 19's
    python3 scripts/device/watch_jobs.py --jobs healthy,fp32 --seconds 25   # synthetic ones

Issue 28's jobs (scripts/device/loop_jobs.py, the default list): a co-tenant, a host sync, data
prepared in the loop, pageable copies, a launch-bound loop, a Lightning checkpoint, torch.compile
recompiling (each built with a defect, the line of it marked ``# watch: NAME``), and resnet, vit
and lightning-gpt2 (healthy). The co-tenant's defect is a neighbour process this script starts
beside the watched run, outside the job's tree. Each row checks the verdict, the line watch
names first against the mark, the co-tenant's pid, and the share against the truth (within
0.10; scripts/device/watch_report.py), and ``watch_expected.json`` records what each recording
must replay to (tests/test_watch_device_recordings.py reads it).

Issue 19's framework jobs (scripts/device/framework_jobs.py: timm, torchvision, transformers,
Lightning; random data, random weights): resnet-loader, sleepy-loop, gpt2-checkpoint, spin,
resnet-fp32. A job with a defect runs alone *without* it (``job NAME --clean``) and under watch
*with* it, so that its true lost share is 1 - watched/alone throughput, to set beside the share
watch reports; a healthy job runs watched only (truth 0), or with ``--alone-healthy`` the same
both ways, which measures the watch's overhead.

Synthetic jobs (torch only; each prints nothing on stdout, it writes its throughput to
--result), run the same both ways (their overhead):

  healthy     bf16 8192^3 matmuls back to back, data on the GPU
  starved     the same step fed by a data-loader thread that needs ~3x the step's time
  checkpoint  the healthy loop, stopped every 5 s to torch.save 2 GiB of state and fsync it
  launch      1-element additions: tiny kernels, the launching thread pinned on its core
  fp32        fp32 8192^3 matmuls with TF32 off: the math on CUDA cores, tensor pipes idle

Each job runs alone and under ``python3 -m sparkdiag watch --json --record ... -- <job>``,
``--pairs`` times, the order alternating (alone first in even pairs, watched first in odd
ones) so that drift cancels; the watch's overhead is the median over the pairs of
1 - watched/alone (target: at most 2 %). A launch-bound job's throughput alone varied from
127 000 to 152 000 kernels a second between runs on the H200, so one pair cannot resolve 2 %.
``--pin CPU`` runs each job on that CPU only (both ways). ``--budget S`` starts no run that
would likely end after S seconds of wall time (the device's limit per call).
Written under --out (default $OUT/watch, else /tmp/out/watch): per job the diagnosis
(``<job>.diagnosis.json``), the recording (``<job>.recording.json``), the timeline
(``<job>.png``, when matplotlib is importable; otherwise render it from the recording with
``sparkdiag watch --replay <job>.recording.json --plot <job>.png``), the logs
(``<job>.watch.log``, ``<job>.alone.log``), the jobs' throughput documents
(``<job>.alone.json``, ``<job>.watched.json``); and ``watch_jobs.json`` and ``watch_jobs.txt``,
the table job -> truth -> diagnosis -> share -> overhead -> line named, and
``watch_expected.json``. With ``--archive FILE`` everything is
packed into that one tar archive after each job. A job that fails is reported as such and the
others still run; the exit status is 1 when one failed.

Test it on a CPU with tiny settings: ``--device cpu --scale tiny --seconds 1`` (with
``--nvml-fixture tests/fixtures/nvml/watch-starved.json`` the watch has a scripted GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import loop_jobs  # noqa: E402
from framework_jobs import FRAMEWORK_JOBS  # noqa: E402  (beside this script)
from loop_jobs import EXPECTED as LOOP_EXPECTED  # noqa: E402
from loop_jobs import LOOP_JOBS  # noqa: E402
from watch_report import expectations, pack, row, table  # noqa: E402

JOBS = ("healthy", "starved", "checkpoint", "launch", "fp32")
EXPECTED = {
    "healthy": "healthy",
    "starved": "input-starved",
    "checkpoint": "checkpoint-stalls",
    "launch": "cpu-bound-launcher",
    "fp32": "low-tensor-activity",
    "resnet-loader": "input-starved",
    "sleepy-loop": "input-starved",
    "gpt2-checkpoint": "checkpoint-stalls",
    "spin": "stalled-kernel",
    "resnet-fp32": "low-tensor-activity",
    "resnet": "healthy",
    "lightning-gpt2": "healthy",
    **{name: verdict for name, (verdict, _) in LOOP_EXPECTED.items()},
}
# jobs whose alone run leaves the defect out: their truth is 1 - watched/alone
CLEAN_ALONE = frozenset({"resnet-loader", "sleepy-loop", "gpt2-checkpoint", "spin", "resnet-fp32"}
                        | {n for n, (v, _) in LOOP_EXPECTED.items() if v != "healthy"})  # fmt: skip
WITH_NEIGHBOUR = frozenset({"cotenant"})  # another process on the GPU while watched
NEIGHBOUR_START_SECONDS = 5.0  # its CUDA context and first matmuls before the job starts
NEIGHBOURS: dict[str, int] = {}  # job -> the pid of its last neighbour
# issue 28's run: a job per cause in the training loop's code, a co-tenant, three healthy jobs
DEFAULT_JOBS = (*LOOP_JOBS[:-1], "resnet", "vit", "lightning-gpt2")
# Sizes per scale: matmul edge, checkpoint bytes, loader delay factor, checkpoint period (s).
SCALES: dict[str, dict[str, Any]] = {
    "full": {"n": 8192, "ckpt_bytes": 2 << 30, "ckpt_every": 5.0, "steps_per_sync": 10},
    "tiny": {"n": 128, "ckpt_bytes": 8 << 20, "ckpt_every": 0.4, "steps_per_sync": 4},
}


# -- the jobs (child mode) ----------------------------------------------------------------------


GO_TIMEOUT = 120.0  # seconds a pair's job waits for the orchestration's go


def run_pair(
    name: str, seconds: float, device: str, scale: str, alone: Path, result: Path, ready: Path,
    go: Path, alone_seconds: float | None = None,
) -> None:  # fmt: skip
    """Both runs of a job in one process (its imports and start-up paid once): without its
    defect (``alone``, timed ``alone_seconds``: a job without its defect is steady sooner),
    then, once the orchestration has attached ``sparkdiag watch --pid`` and created ``go``,
    with it (``result``). ``ready`` says the first run is done."""
    run_job(name, alone_seconds or seconds, device, scale, alone, clean=True)
    ready.touch()
    end = time.monotonic() + GO_TIMEOUT
    while not go.exists():
        if time.monotonic() > end:
            raise SystemExit(f"no go after {GO_TIMEOUT:.0f} s")
        time.sleep(0.05)
    run_job(name, seconds, device, scale, result, clean=False)


def run_job(
    name: str,
    seconds: float,
    device: str,
    scale: str,
    result: Path,
    pin: int | None = None,
    clean: bool = False,
) -> None:
    if pin is not None:
        os.sched_setaffinity(0, {pin})
    if name in LOOP_JOBS or name in FRAMEWORK_JOBS:
        import framework_jobs

        jobs = loop_jobs if name in LOOP_JOBS else framework_jobs
        fscale = "tiny" if scale == "tiny" else "full"
        doc = jobs.run(name, seconds, device, fscale, clean)
        doc = {"job": name, "clean": clean, "device": device, **doc}
        result.write_text(json.dumps(doc) + "\n", encoding="utf-8")
        return
    import torch

    size = SCALES[scale]
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    half = torch.bfloat16 if cuda else torch.float32
    n = size["n"]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def timed(step: Any, per_sync: int = size["steps_per_sync"]) -> tuple[int, float]:
        """Warm up for 1 s (or 3 steps), then run ``step`` for ``seconds``: (steps, seconds)."""
        warm_end = time.monotonic() + min(1.0, seconds / 4)
        while time.monotonic() < warm_end:
            step()
            sync()
        steps, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            for _ in range(per_sync):
                step()
            sync()
            steps += per_sync
        return steps, time.monotonic() - start

    unit = "matmuls"
    if name == "healthy":
        a, b = (torch.randn(n, n, device=dev, dtype=half) for _ in range(2))
        steps, elapsed = timed(lambda: a @ b)
    elif name == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        a, b = (torch.randn(n, n, device=dev, dtype=torch.float32) for _ in range(2))
        steps, elapsed = timed(lambda: a @ b, per_sync=max(1, size["steps_per_sync"] // 2))
    elif name == "launch":
        x = torch.zeros(1, device=dev)
        unit = "kernels"

        def tiny() -> None:
            x.add_(1.0)

        steps, elapsed = timed(tiny, per_sync=1000)
    elif name == "starved":
        steps, elapsed = _starved(torch, dev, half, n, seconds, sync)
        unit = "steps"
    elif name == "checkpoint":
        steps, elapsed = _checkpoint(torch, dev, half, n, seconds, sync, size)
    elif name == "broken":  # for the script's own test: a job that fails
        raise SystemExit("this job fails on purpose")
    else:
        raise SystemExit(f"unknown job {name}")
    doc = {"job": name, "steps": steps, "seconds": elapsed, "per_second": steps / elapsed,
           "unit": unit, "device": str(dev)}  # fmt: skip
    result.write_text(json.dumps(doc) + "\n", encoding="utf-8")


def _starved(
    torch: Any, dev: Any, dtype: Any, n: int, seconds: float, sync: Any
) -> tuple[int, float]:
    """A training step of 7 matmuls fed one batch at a time by a loader thread whose batches
    take three times as long to prepare (it sleeps, as a loader waiting on storage does)."""
    a = torch.randn(n, n, device=dev, dtype=dtype)
    batch_cpu = torch.randn(n, n, dtype=dtype)
    if dev.type == "cuda":
        batch_cpu = batch_cpu.pin_memory()

    def step(x: Any) -> None:
        for _ in range(7):
            x = x @ a
        sync()

    probe = batch_cpu.to(dev)
    step(probe)
    start = time.monotonic()
    for _ in range(3):
        step(probe)
    delay = 3 * ((time.monotonic() - start) / 3)  # three times the mean step
    batches: queue.Queue[Any] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def loader() -> None:
        while not stop.wait(delay):
            while not stop.is_set():
                try:
                    batches.put(batch_cpu, timeout=0.05)
                    break
                except queue.Full:
                    continue

    # The loader is joined before returning: a thread still alive while the interpreter (and
    # torch's thread pools) shut down made the process abort now and then ("terminate called
    # without an active exception").
    thread = threading.Thread(target=loader, name="loader")
    thread.start()
    try:
        steps, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            step(batches.get().to(dev, non_blocking=True))
            steps += 1
        elapsed = time.monotonic() - start
    finally:
        stop.set()
        thread.join()
    return steps, elapsed


def _checkpoint(
    torch: Any, dev: Any, dtype: Any, n: int, seconds: float, sync: Any, size: dict[str, Any]
) -> tuple[int, float]:
    """The healthy loop; every ``ckpt_every`` seconds the job copies its state to the host,
    writes it with torch.save and fsyncs it, the GPU idle meanwhile."""
    a, b = (torch.randn(n, n, device=dev, dtype=dtype) for _ in range(2))
    elements = size["ckpt_bytes"] // torch.tensor([], dtype=dtype).element_size()
    state = {"weights": torch.randn(elements, device=dev, dtype=dtype)}
    path = Path(tempfile.gettempdir()) / f"sparkdiag-watch-ckpt-{os.getpid()}.pt"
    steps, start = 0, time.monotonic()
    last = start
    try:
        while time.monotonic() - start < seconds:
            for _ in range(size["steps_per_sync"]):
                a @ b
            sync()
            steps += size["steps_per_sync"]
            if time.monotonic() - last >= size["ckpt_every"]:
                with path.open("wb") as fh:
                    torch.save({k: v.cpu() for k, v in state.items()}, fh)
                    fh.flush()
                    os.fsync(fh.fileno())
                last = time.monotonic()
    finally:
        path.unlink(missing_ok=True)
    return steps, time.monotonic() - start


# -- the orchestration ----------------------------------------------------------------------------


def job_argv(args: argparse.Namespace, name: str, result: Path, clean: bool = False) -> list[str]:
    return [
        sys.executable, str(Path(__file__).resolve()), "job", name,
        "--seconds", str(args.seconds), "--device", args.device, "--scale", args.scale,
        "--result", str(result), *(["--pin", str(args.pin)] if args.pin is not None else []),
        *(["--clean"] if clean else []),
    ]  # fmt: skip


DEADLINE: list[float] = []  # the monotonic time no run may outlive (--deadline), if any


def _timeout(seconds: float) -> float:
    """``seconds``, cut at the deadline."""
    return min([seconds, *(d - time.monotonic() for d in DEADLINE)])


def run_group(cmd: list[str], err: Any, timeout: float) -> subprocess.CompletedProcess[str]:
    """``cmd`` in a session of its own; at the timeout (or the deadline) its whole process
    group is killed (the watched job and its loader workers too, not only watch) and
    TimeoutExpired raised."""
    timeout = _timeout(timeout)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def start_neighbour(args: argparse.Namespace, go: Path | None = None) -> subprocess.Popen[bytes]:
    """Another process's bf16 matmul loop on the same GPU (loop_jobs.neighbour), outside the
    watched job's process tree: the co-tenant job's defect. Given a few seconds to start; with
    ``go`` it imports torch and waits for that file before it touches the GPU (started early,
    beside a job's run alone)."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve().parent / "loop_jobs.py"), "neighbour",
         args.device, "tiny" if args.scale == "tiny" else "full", *([str(go)] if go else [])],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    if go is None:
        time.sleep(NEIGHBOUR_START_SECONDS)
    return proc


def _neighboured(args: argparse.Namespace) -> frozenset[str]:
    """The jobs watched beside a neighbour: the co-tenant's, and those --neighbour names."""
    return WITH_NEIGHBOUR | {j for j in (args.neighbour or "").split(",") if j}


def stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def watch_argv(args: argparse.Namespace, out: Path, name: str) -> list[str]:
    """``sparkdiag watch`` as every run calls it: JSON, the tick interval, the recording, the
    plot where matplotlib is there and the NVML fixture of a dry run; the job comes after."""
    watch = [sys.executable, "-m", "sparkdiag", "watch", "--json", "--interval",
             str(args.interval), "--record", str(out / f"{name}.recording.json")]  # fmt: skip
    if not args.no_plot and importlib.util.find_spec("matplotlib") is not None:
        watch += ["--plot", str(out / f"{name}.png")]
    if args.nvml_fixture:
        watch += ["--nvml-fixture", args.nvml_fixture]
    return watch


def run_once(
    args: argparse.Namespace, name: str, watched: bool, out: Path
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str]:
    """(the job's result, the watch's diagnosis or None, an error or ""). A job with a
    neighbour (the co-tenant) gets it beside its watched run; its pid is kept in
    ``NEIGHBOURS``."""
    result = out / f"{name}.{'watched' if watched else 'alone'}.json"
    result.unlink(missing_ok=True)
    cmd = job_argv(args, name, result, clean=not watched and name in CLEAN_ALONE)
    if watched:
        watch = watch_argv(args, out, name)
        cmd = [*watch, "--", *cmd]
    log = out / f"{name}.{'watch' if watched else 'alone'}.log"
    neighbour = start_neighbour(args) if watched and name in _neighboured(args) else None
    if neighbour is not None:
        NEIGHBOURS[name] = neighbour.pid
    try:
        with log.open("w") as err:
            proc = run_group(cmd, err, args.seconds + args.startup_timeout)
    except subprocess.TimeoutExpired:
        return None, None, f"timed out after {args.seconds + args.startup_timeout:.0f} s"
    finally:
        if neighbour is not None:
            stop(neighbour)
    diagnosis = None
    if watched:
        try:
            diagnosis = json.loads(proc.stdout)
            (out / f"{name}.diagnosis.json").write_text(proc.stdout, encoding="utf-8")
        except json.JSONDecodeError:
            return None, None, f"watch printed no JSON (exit {proc.returncode}; see {log.name})"
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        return None, diagnosis, f"exit status {proc.returncode}: {tail[0][:120]}"
    try:
        return json.loads(result.read_text()), diagnosis, ""
    except (OSError, json.JSONDecodeError) as exc:
        return None, diagnosis, f"no result ({exc})"


PAIR_NEIGHBOUR_SECONDS = 1.0  # a neighbour told to go: its CUDA context (the watched run's
# warm-up gives it seconds more before the timing starts)
ATTACH_SECONDS = 1.0  # watch --pid and py-spy attached before the job's defect runs


def _wait_for(path: Path, proc: subprocess.Popen[Any], seconds: float) -> bool:
    end = time.monotonic() + _timeout(seconds)
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def _kill(proc: subprocess.Popen[Any] | None) -> None:
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    if proc is not None:
        proc.wait()


def run_pair_once(
    args: argparse.Namespace, name: str, out: Path
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None, str]:
    """(the run alone, the run watched, the diagnosis, an error or "") of a job whose two runs
    share one process (``job NAME --pair``): its run without the defect, then, the neighbour
    started where the job has one and ``sparkdiag watch --pid`` attached to it, its run with
    the defect. Its imports and start-up (half a run's wall time on the H200) are paid once."""
    alone, watched = out / f"{name}.alone.json", out / f"{name}.watched.json"
    ready, go, neighbour_go = (out / f".{name}.{x}" for x in ("ready", "go", "neighbour-go"))
    for path in (alone, watched, ready, go, neighbour_go):
        path.unlink(missing_ok=True)
    timed = ["--alone-seconds", str(args.alone_seconds)] if args.alone_seconds else []
    cmd = [*job_argv(args, name, watched), "--pair", "--alone-result", str(alone), "--ready",
           str(ready), "--go", str(go), *timed]  # fmt: skip
    neighbour = start_neighbour(args, neighbour_go) if name in _neighboured(args) else None
    job: subprocess.Popen[Any] | None = None
    watcher: subprocess.Popen[Any] | None = None
    try:
        with (out / f"{name}.alone.log").open("w") as job_log:
            job = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=job_log,
                                   start_new_session=True)  # fmt: skip
        if not _wait_for(ready, job, args.seconds + args.startup_timeout):
            tail = (out / f"{name}.alone.log").read_text(errors="replace").strip()
            last = (tail.splitlines() or [""])[-1][:120]
            return None, None, None, f"alone: no result (exit {job.poll()}): {last}"
        if neighbour is not None:
            neighbour_go.touch()
            NEIGHBOURS[name] = neighbour.pid
            time.sleep(PAIR_NEIGHBOUR_SECONDS)
        watch = watch_argv(args, out, name)
        with (out / f"{name}.watch.log").open("w") as watch_log:
            watcher = subprocess.Popen([*watch, "--pid", str(job.pid)], cwd=ROOT,
                                       stdout=subprocess.PIPE, stderr=watch_log, text=True,
                                       start_new_session=True)  # fmt: skip
        time.sleep(ATTACH_SECONDS)
        go.touch()
        try:
            printed, _ = watcher.communicate(timeout=_timeout(args.seconds + args.startup_timeout))
        except subprocess.TimeoutExpired:
            return _read(alone), None, None, "watched: timed out"
        job.wait(timeout=max(1.0, _timeout(30.0)))
    except subprocess.TimeoutExpired:
        return _read(alone), None, None, "watched: the job did not end"
    finally:
        _kill(watcher)
        _kill(job)
        _kill(neighbour)
    try:
        diagnosis = json.loads(printed)
        (out / f"{name}.diagnosis.json").write_text(printed, encoding="utf-8")
    except json.JSONDecodeError:
        return _read(alone), None, None, "watch printed no JSON (see the watch log)"
    result = _read(watched)
    problem = "" if result is not None else f"watched: no result (exit {job.returncode})"
    return _read(alone), result, diagnosis, problem


def _read(path: Path) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = json.loads(path.read_text())
        return found
    except (OSError, json.JSONDecodeError):
        return None


def versions() -> dict[str, str]:
    """The frameworks' versions and the GPU, as the jobs' interpreter sees them."""
    code = (
        "import importlib, json\n"
        "v = {}\n"
        "for m in ('torch', 'torchvision', 'timm', 'transformers', 'lightning'):\n"
        "    try:\n"
        "        v[m] = importlib.import_module(m).__version__\n"
        "    except Exception as e:\n"
        "        v[m] = 'missing: ' + type(e).__name__\n"
        "import torch\n"
        "v['gpu'] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'\n"
        "print(json.dumps(v))\n"
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        found: dict[str, str] = json.loads(proc.stdout)
        return found
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        return {"error": str(exc)}


def preflight() -> str:
    """Why ``python3 -m sparkdiag watch`` cannot run here ("" when it can): a missing
    dependency must stop the script before it spends device time."""
    proc = subprocess.run(
        [sys.executable, "-m", "sparkdiag", "watch", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if proc.returncode == 0:
        return ""
    return (proc.stderr.strip().splitlines() or ["no output"])[-1]


def orchestrate(args: argparse.Namespace) -> int:
    out = Path(args.out or Path(os.environ.get("OUT", "/tmp/out")) / "watch")
    out.mkdir(parents=True, exist_ok=True)
    archive = Path(args.archive) if args.archive else None
    problem = preflight()
    if problem:
        print(f"python3 -m sparkdiag watch cannot run here: {problem}", file=sys.stderr)
        print("install what is missing (e.g. the wheels under .whl/, as scripts/device/final.sh "
              "does) and run again", file=sys.stderr)  # fmt: skip
        return 2
    names = [j for j in args.jobs.split(",") if j]
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    if args.deadline is not None:
        DEADLINE.append(started + args.deadline)
    env = {} if args.no_versions else versions()
    print("versions:", json.dumps(env), flush=True)
    longest = 0.0  # the longest run so far, seconds
    for name in names:
        alone = args.alone_healthy or EXPECTED.get(name) != "healthy"
        print(f"== {name}: {'alone and ' if alone else ''}watched, {args.pairs} pair(s) of "
              f"{args.seconds:g} s runs", flush=True)  # fmt: skip
        pairs: list[tuple[Any, Any]] = []
        errors: list[str] = []
        diagnosis = None
        for n in range(args.pairs):
            got: dict[bool, Any] = {False: None}
            order = (False, True) if n % 2 == 0 else (True, False)
            if args.same_process and name in CLEAN_ALONE:
                elapsed = time.monotonic() - started
                guess = max(longest, 2 * args.seconds + 30.0)
                if args.budget is not None and elapsed + guess > args.budget:
                    errors.append(
                        f"not run: {elapsed:.0f} s used of the {args.budget:.0f} s budget"
                    )
                    break
                began = time.monotonic()
                a, w, doc, problem = run_pair_once(args, name, out)
                longest = max(longest, time.monotonic() - began)
                diagnosis = doc or diagnosis
                pairs.append((a, w))
                if problem:
                    errors.append(problem)
                    break
                continue
            for watched in order if alone else (True,):
                elapsed = time.monotonic() - started
                guess = max(longest, args.seconds + 10.0)
                if args.budget is not None and elapsed + guess > args.budget:
                    errors.append(
                        f"not run: {elapsed:.0f} s used of the {args.budget:.0f} s budget"
                    )
                    got[watched] = None
                    continue
                began = time.monotonic()
                result, doc, problem = run_once(args, name, watched, out)
                longest = max(longest, time.monotonic() - began)
                got[watched] = result
                if doc is not None:
                    diagnosis = doc
                if problem:
                    errors.append(f"{'watched' if watched else 'alone'}: {problem}")
            pairs.append((got[False], got[True]))
            if errors:
                break
        marker = LOOP_EXPECTED.get(name, ("", None))[1]
        line = None if marker is None else ("loop_jobs.py", loop_jobs.marked(marker))
        rows.append(row(name, EXPECTED.get(name, "?"), pairs, diagnosis, "; ".join(errors),
                        name in CLEAN_ALONE, line, NEIGHBOURS.get(name)))  # fmt: skip
        print(table(rows[-1:]).splitlines()[2], flush=True)
        write_summary(args, out, rows, started, env)
        expectations(rows, out, truth=args.nvml_fixture is None)
        pack(out, archive)
    text = (out / "watch_jobs.txt").read_text(encoding="utf-8")
    print()
    print(text, end="")
    wall = time.monotonic() - started
    print(
        f"wall time {wall:.0f} s; files under {out}" + (f", packed in {archive}" if archive else "")
    )
    return 1 if any(r["error"] for r in rows) else 0


def write_summary(
    args: argparse.Namespace,
    out: Path,
    rows: list[dict[str, Any]],
    started: float,
    env: dict[str, str],
) -> None:
    summary = {
        "seconds_per_job": args.seconds,
        "device": args.device,
        "scale": args.scale,
        "interval": args.interval,
        "pairs": args.pairs,
        "pin": args.pin,
        "versions": env,
        "wall_seconds": time.monotonic() - started,
        "rows": rows,
    }
    (out / "watch_jobs.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out / "watch_jobs.txt").write_text(table(rows), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--jobs",
        default=",".join(DEFAULT_JOBS),
        help=f"comma-separated job names: {', '.join(DEFAULT_JOBS + FRAMEWORK_JOBS + JOBS)}",
    )
    parser.add_argument(
        "--alone-healthy",
        action="store_true",
        help="run the healthy jobs alone too (their watch overhead); by default only watched",
    )
    parser.add_argument(
        "--nvml-fixture", default=None, help="watch with this NVML fixture (a dry run on a CPU)"
    )
    parser.add_argument("--seconds", type=float, default=12.0, help="timed run of each job")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument("--interval", type=float, default=0.5, help="watch's sampling interval")
    parser.add_argument("--pairs", type=int, default=1, help="alone/watched pairs per job")
    parser.add_argument("--pin", type=int, default=None, help="run each job on this CPU only")
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=120.0,
        help="seconds allowed beyond --seconds for imports and start-up",
    )
    parser.add_argument("--out", default=None, help="default $OUT/watch, else /tmp/out/watch")
    parser.add_argument("--archive", default=None, help="pack --out into this tar.gz")
    parser.add_argument(
        "--budget", type=float, default=None, help="start no run likely to end after S seconds"
    )
    parser.add_argument(
        "--deadline", type=float, default=None,
        help="kill any run still going S seconds after the start (the table is still written)",
    )  # fmt: skip
    parser.add_argument(
        "--same-process", action="store_true",
        help="a job with a defect runs without it and then with it in one process (watched by "
        "--pid for the second run): its imports and start-up paid once",
    )  # fmt: skip
    parser.add_argument(
        "--alone-seconds", type=float, default=None,
        help="--same-process: the timed run without the defect (default --seconds)",
    )  # fmt: skip
    parser.add_argument("--no-plot", action="store_true", help="no timeline PNGs")
    parser.add_argument(
        "--neighbour", default="", help="these jobs too are watched beside a neighbour (a test)"
    )
    parser.add_argument("--no-versions", action="store_true", help="do not list the frameworks")
    sub = parser.add_subparsers(dest="mode")
    job = sub.add_parser("job", help="run one job (what the orchestration starts)")
    job.add_argument("name")
    job.add_argument("--seconds", type=float, required=True)
    job.add_argument("--device", default="cuda")
    job.add_argument("--scale", choices=sorted(SCALES), default="full")
    job.add_argument("--result", type=Path, required=True)
    job.add_argument("--pin", type=int, default=None)
    job.add_argument("--clean", action="store_true", help="leave the job's defect out")
    job.add_argument("--pair", action="store_true", help="without the defect, then with it")
    job.add_argument("--alone-result", type=Path, help="--pair: the run without the defect")
    job.add_argument("--ready", type=Path, help="--pair: created when that run is done")
    job.add_argument("--go", type=Path, help="--pair: waited for before the run with it")
    job.add_argument("--alone-seconds", type=float, default=None, help="--pair: its timed run")
    args = parser.parse_args()
    if args.mode == "job":
        # under watch the job shares watch's stdout, which must hold watch's JSON alone: what
        # the frameworks print there (Trainer prints its metrics) goes to stderr instead
        sys.stdout.flush()
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        if args.pair:
            run_pair(args.name, args.seconds, args.device, args.scale, args.alone_result,
                     args.result, args.ready, args.go, args.alone_seconds)  # fmt: skip
            return
        run_job(args.name, args.seconds, args.device, args.scale, args.result, args.pin, args.clean)
        return
    sys.exit(orchestrate(args))


if __name__ == "__main__":
    main()
