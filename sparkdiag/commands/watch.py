"""``sparkdiag watch``: follow a job, then say why it is slow.

Registered in :mod:`sparkdiag.cli`. Sampling lives in :mod:`.sampler`, the loop in :mod:`.job`,
the diagnosis (a pure function of the recording) in :mod:`.diagnose`, the output in
:mod:`.render` and :mod:`.plot`.

Exit status: the job's own when watch started it (128 + N when a signal N ended it), else 0,
whatever the diagnosis (a cause, healthy, or too short to diagnose: a report, not an error);
2 for bad usage, an unusable fixture or recording, a command that cannot start, a --pid that is
not running (or is watch's own, or a kernel thread's), or --plot without matplotlib (the errors
of :mod:`sparkdiag.errors`, translated by the command group). Standard output that cannot be
written: the job's status where it is not 0, else 1 (:func:`_status`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from sparkdiag import terminal
from sparkdiag.commands.common import (
    check_gpu_indices,
    check_output_folder,
    check_output_path,
    is_stdout,
    setup_logging,
)
from sparkdiag.errors import Exit, UsageError
from sparkdiag.flags import (
    FiniteRange,
    file_option,
    gpu_option,
    plot_option,
    settings_from,
    settings_options,
)
from sparkdiag.lifecycle import LIFECYCLE
from sparkdiag.plotting import INSTALL_HINT, is_folder
from sparkdiag.plotting import require as require_plotting
from sparkdiag.sources.host import pyspy
from sparkdiag.sources.host.procfs import ProcessIdentities
from sparkdiag.sources.nvml.backends import make_backend
from sparkdiag.sources.nvml.gpu import GpuSource
from sparkdiag.watch import compact
from sparkdiag.watch import plot as plotting
from sparkdiag.watch.diagnose import Diagnosis, diagnose
from sparkdiag.watch.job import (
    AttachedJob,
    SpawnedJob,
    alive,
    check_runnable,
    follow,
    unwatchable,
)
from sparkdiag.watch.model import MAX_RECORDING_BYTES, Recording, load
from sparkdiag.watch.places import locate_places, read_stores
from sparkdiag.watch.render import status as status_text
from sparkdiag.watch.render import text, to_json
from sparkdiag.watch.sampler import GpuSampler, HostSampler, Sampler
from sparkdiag.watch.stack_sampler import StackSampler

log = logging.getLogger("sparkdiag.watch")
PCIE_SECONDS = 2.0  # PCIe throughput blocks ~20 ms per direction: read it this often


def _start_gpu(
    fixture: Path | None, gpus: tuple[int, ...] | None, rootfs: Path
) -> tuple[GpuSampler | None, str]:
    """The GPU sampler, or None with what is skipped (one line, also logged). FixtureError for
    an unusable fixture; a --gpu index NVML does not list is a usage error."""
    source = GpuSource(make_backend(fixture), slow_seconds=PCIE_SECONDS)
    if not source.start():
        why = (
            f"NVML unavailable ({source.unavailable_reason}): GPU utilization, activity, "
            "clocks, reasons, temperatures, power and PCIe throughput are not sampled, so "
            "only memory pressure and where ranks waited for one another are diagnosed (the "
            "job's CPU and I/O are recorded, not judged)"
        )
        return None, why
    try:
        check_gpu_indices([g.index for g in source.identities], gpus)
    except UsageError:
        source.stop()
        raise
    sampler = GpuSampler(
        source, None if gpus is None else set(gpus), ProcessIdentities(rootfs), rootfs=rootfs
    )
    if not sampler.indices:
        source.stop()
        return None, "no GPU to watch (NVML lists none)"
    return sampler, ""


NO_STACKS = "its lost time is judged from the counters alone"


def _stack_binary(mode: str) -> tuple[Path | None, str]:
    """The py-spy to sample the job's stacks with, or None and why not (one line)."""
    if mode == "off":
        return None, "the job's Python stacks: not sampled (--stacks off)"
    binary = pyspy.find()
    if binary is None:
        where = f" at ${pyspy.ENV}" if pyspy.ENV in os.environ else ""
        return None, (
            f"py-spy not found{where}: the job's Python stacks are not sampled, so {NO_STACKS} "
            f"(pip install 'sparkdiag[stacks]', or set {pyspy.ENV} to the py-spy binary)"
        )
    return binary, ""


def _ptracer(binary: Path | None, rootfs: Path) -> bool:
    """Start the job through the shim that declares watch its tracer: only where Yama's
    ptrace_scope 1 would refuse py-spy otherwise."""
    own = Path("/proc/self/status").read_text(encoding="utf-8", errors="replace")
    return (
        binary is not None
        and pyspy.yama_scope(rootfs) == "1"
        and not pyspy.has_ptrace_capability(own)
    )


def _say(line: str) -> None:
    """One line of what watch cannot do, on standard error, wrapped to its width."""
    click.echo(terminal.fill(line, terminal.width(sys.stderr), "sparkdiag watch: ", "    "),
               err=True)  # fmt: skip


# what matplotlib's Agg backend writes (another suffix raised a ValueError after the job ended)
PLOT_SUFFIXES = frozenset({".png", ".pdf", ".svg"})


def _check_plot(plot_to: str | None) -> None:
    """``--plot`` before the job runs, not after it ended: a folder (``DIR/``: created at the
    end where its parent exists) or the file it names (:func:`.plot.path_for`)."""
    if plot_to is None:
        return
    require_plotting("--plot")
    path = plotting.path_for(plot_to)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(
            f"{path.name}: the timeline is written as {', '.join(sorted(PLOT_SUFFIXES))}; give "
            "a name with one of those suffixes, or none (.png is added)",
            flag="--plot",
        )
    if is_folder(plot_to):
        check_output_folder(plot_to, "--plot")
        if not Path(plot_to).is_dir():
            return  # created at the end, empty
    check_output_path(path, "--plot")  # DIR/watch.png too: it may be a folder already


def _report(
    rec: Recording, diagnosis: Diagnosis, as_json: bool, plot_to: str | None, saved: Path | None
) -> bool:
    """The diagnosis on standard output; the timeline written where --plot says, and which file
    that was on standard error (standard output stays the report, or the JSON document). True
    when standard output could not be written (:func:`_stdout_lost`)."""
    wrote = None
    if plot_to is not None:
        try:
            wrote = plotting.plot(rec, diagnosis, plot_to)
        except plotting.PlotUnavailable as exc:
            click.echo(f"sparkdiag watch: {exc}", err=True)
        except OSError as exc:
            where = exc.filename or plotting.path_for(plot_to)
            click.echo(f"sparkdiag watch: cannot write {where}: {exc.strerror or exc}", err=True)
    lost = False
    try:
        click.echo(to_json(rec, diagnosis) if as_json else text(rec, diagnosis), nl=False)
        sys.stdout.flush()
    except OSError as exc:
        _stdout_lost(exc, saved)
        lost = True
    if wrote is not None:
        click.echo(f"wrote {wrote}", err=True)
    return lost


def _stdout_lost(exc: OSError, saved: Path | None) -> None:
    """Standard output that cannot be written (``> /dev/full``, a full disk, ``| head -1``):
    one line (none for a reader that went away, as for every command), and what is still
    buffered dropped, so that the exit's own flush does not fail again and end watch with 1
    before it waited for its job and passed its status on (:func:`_status`)."""
    with contextlib.suppress(OSError, ValueError):
        with open(os.devnull, "wb") as sink:
            os.dup2(sink.fileno(), sys.stdout.fileno())
        sys.stdout.flush()
    if exc.errno == errno.EPIPE:
        return
    kept = (
        f"the recording is in {saved} (sparkdiag watch --replay {saved} prints it again)"
        if saved is not None
        else "give --record FILE to keep the samples, and read them with --replay FILE"
    )
    click.echo(
        f"Error: cannot write standard output: {exc.strerror or exc}; the report is lost, {kept}",
        err=True,
    )


def _status(status: int | None, lost: bool) -> int:
    """What watch exits with: the job's own status (None: a --pid or a --replay, 0); where
    standard output could not be written, 1 (ATTENTION, as every command's) unless the job's
    status says more, which then stands."""
    status = status or Exit.OK
    if lost and status == Exit.OK:
        return Exit.ATTENTION
    return status


@click.command(
    "watch", context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False}
)
@click.option("--pid", type=int, default=None, help="Watch this running process and its children.")
@click.option(
    "--duration",
    type=FiniteRange(min=0.1, max=7 * 86400),
    default=None,
    help="Stop watching after this many seconds (a started job keeps running; watch then waits "
    "for it and passes its exit status through). Default: the job's whole life.",
)
@click.option(
    "--interval",
    type=FiniteRange(min=0.05, max=60),
    default=0.5,
    show_default=True,
    help="Seconds between samples of the job, its GPUs and the host (the GPU's utilization "
    "comes at the driver's own rate, about 6 samples a second, whatever this is).",
)
@gpu_option("Watch only these GPUs; the diagnosis looks at the ones the job runs on.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the diagnosis as JSON; standard output is then the document alone (a job "
    "watch starts writes its own standard output to standard error).",
)
@plot_option(
    "FILE|DIR/",
    "Write a timeline PNG to FILE (.png added where it has no suffix; .svg and .pdf work too), "
    "or DIR/watch.png for a directory (DIR/ is created where its parent exists), and say which "
    f"on standard error; needs matplotlib: {INSTALL_HINT}.",
)
@file_option(
    "--record", "record_to", "Save every sample as JSON, to diagnose or plot later with --replay."
)
@file_option(
    "--replay", "replay", "Diagnose a recording saved with --record instead of watching a job."
)
@click.option(
    "--stacks",
    type=click.Choice(["auto", "off", "native"]),
    default="auto",
    show_default=True,
    help="Sample the job's Python stacks with py-spy (pip install 'sparkdiag[stacks]') to name "
    "the line of code that cost the GPU its time: auto where py-spy is found and may read the "
    "job; native adds C/C++ frames (py-spy then stops the job at each sample); off.",
)
@settings_options("watch")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def watch(
    pid: int | None,
    duration: float | None,
    interval: float,
    gpus: tuple[int, ...] | None,
    as_json: bool,
    plot_to: str | None,
    record_to: Path | None,
    replay: Path | None,
    stacks: str,
    command: tuple[str, ...],
    **given: Any,
) -> int:
    """Follow a job (its whole process tree) and say why it is slow.

    \b
      sparkdiag watch -- python train.py --epochs 1
      sparkdiag watch --pid 4242 --duration 60 --plot timeline.png
      sparkdiag watch --replay run.json --json

    Samples the GPU's utilization at the driver's rate, GPM activity (SM, tensor, DRAM),
    clocks, clock event reasons, temperatures, power and PCIe traffic, the processes on the
    GPU, the job's CPU per thread, its reads and writes, memory pressure (PSI) and, with
    py-spy, the job's Python stacks. At the end (the job exits, --duration passes, or Ctrl-C)
    it prints the share of time lost to each cause it finds: another process on the GPU,
    input-starved, data prepared in the loop, host sync, copies to the GPU, recompiling,
    logging, the optimizer step, a collective, stalled kernel, CPU-bound launcher, checkpoint
    stalls, throttled, memory pressure, kernels that keep few SMs busy, low tensor activity,
    or healthy, each with its evidence, the lines of code that took the time and what to try
    (docs/watch.md defines them). Reading another user's job (--pid) needs root or
    CAP_SYS_PTRACE. While it samples, a status line on
    standard error (a terminal only) shows the time watched, the samples taken, each GPU's
    utilization and whether the job is on it.

    Exit status: the job's own when watch started it (128 + N when signal N ended it), else 0,
    whatever the diagnosis (a cause, healthy, or a job on the GPU under 2 s: too short to
    diagnose); 2 usage error (a bad flag, fixture or recording, a command that cannot start:
    missing, not executable, or not on PATH; a --pid not running, watch's own or a kernel
    thread's; --replay with --record; --plot without matplotlib). Standard
    output that cannot be written (a full disk, a reader gone as with | head -1): 1 where the
    job's status is 0 or there is no job, the job's own where it is not 0; watch still waits
    for the job and writes --record.
    """
    settings = settings_from("watch", given)
    nvml_fixture, rootfs, sysfs = settings.nvml_fixture, settings.rootfs, settings.sysfs
    modes = sum(x is not None for x in (pid, replay)) + (1 if command else 0)
    if modes != 1:
        raise UsageError("give exactly one of --pid PID, --replay FILE or -- COMMAND ARGS...")
    if replay is not None and record_to is not None:  # it was ignored: no file, status 0
        raise UsageError(
            "--record saves the samples of a job being watched; --replay reads a recording "
            "already saved: give one of them (cp copies a recording)"
        )
    _check_plot(plot_to)  # before the job runs, not after it ended
    if is_stdout(record_to):  # standard output holds the diagnosis
        raise UsageError("the recording goes to a file; for one named -, give ./-", flag="--record")
    check_output_path(record_to, "--record")
    if replay is not None:
        rec = load(replay)  # RecordingError: a usage error naming --replay
        return _status(None, _report(rec, diagnose(rec), as_json, plot_to, replay))
    if pid is not None and not alive(rootfs, pid):
        raise UsageError(f"no running process {pid} under {rootfs / 'proc'}", flag="--pid")
    if pid is not None and (why_not := unwatchable(rootfs, pid, os.getpid())):
        raise UsageError(why_not, flag="--pid")

    if command:  # a program that cannot start is said alone, before NVML's own lines
        try:
            check_runnable(command[0])
        except OSError as exc:
            raise UsageError(f"cannot start {command[0]}: {exc.strerror or exc}") from None
    setup_logging("warning", prefix="sparkdiag watch")
    gpu, why = _start_gpu(nvml_fixture, gpus, rootfs)
    binary, no_stacks = _stack_binary(stacks)
    ptracer = command != () and _ptracer(binary, rootfs)
    skipped = [line for line in (why, no_stacks) if line]
    for line in skipped:
        _say(line)
    stop = LIFECYCLE.stop_on_signal()  # Ctrl-C and SIGTERM end the watching, not watch
    hurry = lambda: len(LIFECYCLE.received)  # noqa: E731  # a further Ctrl-C: the next signal
    started_at = time.time()
    live = terminal.StatusLine(sys.stderr)  # silent unless stderr is a terminal
    job: SpawnedJob | AttachedJob
    try:
        job = (
            SpawnedJob(command, ptracer, output_to_stderr=as_json)
            if command
            else AttachedJob(pid or 0, rootfs)
        )
    except OSError as exc:
        raise UsageError(f"cannot start {command[0]}: {exc.strerror or exc}") from None
    stack = None
    try:
        if binary is not None:
            problem = pyspy.ptrace_problem(rootfs, job.pid, descendant=ptracer)
            if problem:
                skipped.append(f"cannot read the Python stacks of pid {job.pid}: {problem}")
                skipped[-1] += f"; {NO_STACKS}"
                _say(skipped[-1])
            else:
                stack = StackSampler(binary, rootfs, native=stacks == "native")
        own = os.getpid() if rootfs.resolve() == Path("/") else None
        host = HostSampler(rootfs, sysfs, job.pid, own_pid=own)
        cwd = pyspy.process_cwd(rootfs, job.pid)
        sampler = Sampler(gpu, host, started_at, stacks=stack)
        followed = follow(
            sampler, job.ended, interval, duration, stop,
            on_tick=lambda tick, n: live.show(status_text(tick, n), time.monotonic()),
        )  # fmt: skip
        ticks, ended_by = followed.ticks, followed.ended_by
        if followed.halved:
            skipped.append(
                f"anything shorter than {followed.interval:g} s: watched for over "
                f"{compact.MAX_TICKS} ticks, neighbouring ticks were merged in pairs "
                f"{followed.halved} time(s) and sampled {followed.interval:g} s apart from then, "
                "so that watch's memory and --record stay bounded"
            )
        live.clear()
        tables = None
        if stack is not None:
            sampler.problems += stack.finish()
            # as they stand at the end, not as first said: a process on the GPU that found no
            # slot left may have had one later
            sampler.problems = stack.settled(sampler.problems, sampler.start)
            tables = stack.tables(ticks, sampler.start)
            ticks = list(tables.ticks)
        for line in sampler.problems:
            _say(line)
        skipped += sampler.problems
        status = job.exit_status()
        if isinstance(job, SpawnedJob) and ended_by == "interrupt":
            status = job.stop(hurry=hurry)
        if isinstance(job, AttachedJob) and ended_by == "exit":
            ended_by = "gone"
        stores, unread = read_stores(settings.state_dir)
        if unread:
            skipped.append(unread)
        rec = Recording(
            started_at=started_at,
            interval=followed.interval,
            job=job.description,
            gpus=gpu.infos() if gpu else (),
            ticks=tuple(ticks),
            ended_by=ended_by,
            exit_status=status,
            pressure_scope=host.pressure_scope,
            skipped=tuple(skipped),
            job_cpus=host.job_cpus,
            frames=tables.frames if tables else (),
            stacks=tables.stacks if tables else (),
            threads=tables.threads if tables else (),
            stack_sampler=stack.describe() if stack is not None else "",
            tenants=tuple(gpu.tenants.values()) if gpu else (),
            cwd=cwd,
            places=locate_places(rootfs, sysfs, job.pid, host.paths),
            stores=stores,
            ranks=stack.ranks if stack is not None else (),
        )
        saved = False
        if record_to is not None:
            try:
                size = rec.save(record_to)
                saved = True
                if size > MAX_RECORDING_BYTES:  # written, but --replay would refuse it
                    _say(
                        f"{record_to} holds {size >> 20} MiB, more than the "
                        f"{MAX_RECORDING_BYTES >> 20} MiB --replay reads: watch a job this long "
                        "with a longer --interval (each tick is about 1 KB), or a --duration"
                    )
            except OSError as exc:
                _say(
                    f"cannot write {record_to}: {exc.strerror or exc}; the recording is lost "
                    "(a file there before is left as it was), the report follows: free space "
                    "there or give --record another place next time"
                )
        lost = _report(rec, diagnose(rec), as_json, plot_to, record_to if saved else None)
        if gpu is not None:
            gpu.source.stop()
        if isinstance(job, SpawnedJob) and status is None:
            # --duration passed: the job goes on; wait for it, or stop it on Ctrl-C or SIGTERM
            status = job.wait_unless(stop, hurry)
        return _status(status, lost)
    except Exception:
        if isinstance(job, SpawnedJob) and not job.ended():  # not left running, unwaited
            live.clear()
            _say("watching failed (below); waiting for the job to end (Ctrl-C stops it)")
            job.wait_unless(stop, hurry)
        raise
    finally:
        live.clear()
        if stack is not None:
            stack.finish()  # py-spy stopped, its files removed, whatever happened
        if gpu is not None:
            gpu.source.stop()
