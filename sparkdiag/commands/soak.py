"""``sparkdiag soak``: sustained load with measurement windows, the thermal-int4 experiment as one
command (see :mod:`sparkdiag.soak`)."""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import click

from sparkdiag import plotting, terminal
from sparkdiag.commands.common import (
    check_output_folder,
    check_output_path,
    gpus_seen,
    is_stdout,
    no_gpu,
    one_stdout,
    require_torch,
    setup_logging,
)
from sparkdiag.config import duration_seconds
from sparkdiag.errors import Exit, UsageError
from sparkdiag.flags import (
    FiniteRange,
    file_option,
    gpu_option,
    path_type,
    plot_option,
    settings_from,
    settings_options,
    worker_option,
    worker_options,
)
from sparkdiag.lifecycle import LIFECYCLE
from sparkdiag.probe.document import SoakWindow
from sparkdiag.probe.launchers import pinned_env
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.probe.worker.contract import SOAK_WINDOW_SECONDS, SUITES
from sparkdiag.soak import plot as soak_plot
from sparkdiag.soak.model import (
    CSV_COLUMNS,
    NOT_RUN,
    GpuSoak,
    SoakReport,
    Target,
    csv_rows,
    record_json,
    state_entry,
)
from sparkdiag.soak.render import SENSOR_WORDS, text
from sparkdiag.soak.run import Job, SoakRunner
from sparkdiag.soak.state import (
    GpuState,
    SoakState,
    SoakStateError,
    read_state,
    state_path,
    write_state,
)
from sparkdiag.statedir import StateDirError, service_state

MAX_DURATION = 24 * 3600.0


def parse_duration(text: str) -> float:
    """``600``, ``600s``, ``10m``, ``1h30m``, ``1.5h`` -> seconds (positive, at most a day)."""
    total = duration_seconds(text)
    if total is None:
        raise click.BadParameter(f"{text!r}: give seconds, or a duration like 90s, 10m or 1h30m")
    if not 0 < total <= MAX_DURATION:
        raise click.BadParameter(f"{text!r}: must be more than 0 and at most 24 h")
    return total


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    return parse_duration(value)


def _jobs(
    device: str | None, gpus: tuple[int, ...] | None, request: WorkerRequest, fixture: Path | None
) -> list[Job]:
    if device is not None:
        if gpus is not None:
            raise UsageError("give --device or --gpu, not both")
        if fixture is not None:  # not used on a device, but a fixture that is not there is wrong
            from sparkdiag.sources.nvml.fixture import load_fixture

            load_fixture(fixture)  # FixtureError: a usage error naming --nvml-fixture
        return [Job(Target(label=device), request.on_device(device))]
    samples, why = gpus_seen(fixture, gpus)
    if not samples:
        raise no_gpu("soak", why, "--device cpu --small soaks the CPU, for tests")
    return [
        Job(
            Target(f"GPU {g.identity.index}", g.identity.index, g.identity.uuid, g.identity.name),
            request.on_device("cuda:0"),
            pinned_env(g.identity.uuid),
        )
        for g in samples
    ]


class _Progress:
    """On a terminal one status line (:class:`terminal.StatusLine`, cut to the terminal's width):
    a bar of the seconds of load of the furthest worker and the latest window; elsewhere (a log,
    a pipe) one line per window, wrapped at its width. Both say the seconds of load left, from
    the soak's own clock (click's ETA counted the worker's start and the cold window as load:
    33 s left at 10 % of a 10 s soak)."""

    def __init__(
        self,
        jobs: list[Job],
        duration: float,
        tty: bool | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.jobs = jobs
        self.duration = duration
        self.stream = sys.stderr if stream is None else stream
        self.line = terminal.StatusLine(self.stream, every=0.0)
        self.tty = self.line.enabled if tty is None else tty
        self.furthest = 0.0
        self.status = ""

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.line.clear()

    def window(self, i: int, w: SoakWindow) -> None:
        temps = w.conditions.temperatures()
        shown = [f"{temps[s]:.0f} °C {SENSOR_WORDS[s]}" for s in ("memory", "gpu") if s in temps]
        for name, ratio in sorted(w.ratios.items()):
            shown.append(f"{name} {ratio:.2f}")
        left = max(self.duration - w.elapsed_seconds, 0.0)
        self.status = (
            f"{self.jobs[i].target.label} window {w.index} ({w.elapsed_seconds:.1f} s, "
            f"{left:.0f} s left): " + (", ".join(shown) or "measured")
        )
        self.furthest = max(self.furthest, w.elapsed_seconds)
        if not self.tty:
            click.echo(
                terminal.fill(self.status, terminal.width(self.stream), "", "    "), err=True
            )
            return
        # the bar says how far: the line keeps the window, the seconds left and the readings
        head = f"soak {terminal.bar(self.furthest, self.duration)} {self.jobs[i].target.label}"
        where = f"window {w.index}, {left:.0f} s left"
        self.line.show(f"{head} {where}: " + (", ".join(shown) or "measured"), time.monotonic())


def _write_outputs(
    report: SoakReport,
    json_to: Path | None,
    csv_to: Path | None,
    plot_to: str | None,
    record: bool,
    state_dir: Path | None,
) -> bool:
    """Every file asked for; a file that cannot be written is one line on stderr (returns
    False), never a reason to lose the others."""
    ok = True

    def failed(what: str, exc: Exception) -> None:
        nonlocal ok
        ok = False
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        click.echo(f"sparkdiag soak: cannot write {what}: {detail}", err=True)

    if json_to is not None and not is_stdout(json_to):
        try:
            json_to.write_text(json.dumps(record_json(report), indent=1) + "\n")
        except OSError as exc:
            failed(str(json_to), exc)
    if csv_to is not None and not is_stdout(csv_to):
        try:
            with csv_to.open("w", newline="") as fh:
                _csv(fh, report)
        except OSError as exc:
            failed(str(csv_to), exc)
    if plot_to is not None:
        try:
            for path in soak_plot.plot(report, plot_to):
                click.echo(f"wrote {path}", err=True)
        except (OSError, plotting.PlotUnavailable) as exc:
            failed(f"the plots ({plot_to})", exc)
    ran = [g for g in report.gpus if g.stopped not in NOT_RUN]
    if record and ran:
        try:
            path = state_path(state_dir)
            entries = [state_entry(g, report.finished_at, report.duration_seconds) for g in ran]
            write_state(path, _not_over_a_finished_soak(path, entries))
        except (StateDirError, SoakStateError) as exc:
            failed("the soak state", exc)
        else:
            _say_where_the_service_reads(path)
    return ok


def _say_where_the_service_reads(path: Path) -> None:
    """One line on stderr where the systemd service keeps its state in another directory than
    the one the soak was kept in: the service exports the soak it finds there, so a soak run
    as you (``~/.local/state``) never showed in its metrics, silently (found in a review)."""
    service = service_state(Path("/"), path.parent)
    if service is None:
        return
    said = (
        f"kept in {path}; the sparkdiag service exports the soak in {service} (systemd's "
        f"StateDirectory), not this one: run the soak as root with --state-dir {service} for "
        "its metrics to show it"
    )
    click.echo(terminal.fill(said, terminal.width(sys.stderr)), err=True)


def _not_over_a_finished_soak(path: Path, entries: list[GpuState]) -> list[GpuState]:
    """The entries to record: an interrupted run does not replace a GPU's last soak that ran
    to its end (a Ctrl-C after seconds hid a kernel that fell, from check and the metrics),
    unless it saw a fall or a wrong result itself; said on stderr."""
    try:
        kept = {g.key: g for g in (read_state(path) or SoakState(())).gpus}
    except SoakStateError:
        return entries  # a damaged file is replaced, as before
    out = []
    for entry in entries:
        before = kept.get(entry.key)
        if (
            entry.stopped == "interrupted"
            and not entry.degraded
            and not entry.failed
            and before is not None
            and before.stopped != "interrupted"
        ):
            click.echo(
                f"soak.json keeps {entry.key}'s last soak that ran to its end: an interrupted "
                "one that saw no fall does not replace it",
                err=True,
            )
            continue
        out.append(entry)
    return out


def _csv(fh: TextIO, report: SoakReport) -> None:
    writer = csv.writer(fh)
    writer.writerow(CSV_COLUMNS)
    writer.writerows(csv_rows(report))


def _check_state_dir(state_dir: Path | None) -> None:
    """--record writes soak.json in the state directory after the load: checked before it (a
    file is created there and removed; a missing directory's first existing parent), a usage
    error naming --state-dir (the load used to run in full, then the verdict was not kept)."""
    problem: StateDirError | None = None
    try:
        folder = state_path(state_dir).parent
    except StateDirError as exc:
        if state_dir is None:
            raise UsageError(f"{exc.message}; give --state-dir, or --no-record") from None
        # a state directory that is not one (under a file): said by the folder check below,
        # which names the file and the flag ("Invalid value for '--state-dir'")
        folder, problem = state_dir, exc
    try:
        check_output_folder(folder, "--state-dir", parents=True)
        if problem is not None:
            raise UsageError(problem.message)
    except UsageError as exc:
        raise UsageError(
            f"{exc.message} (the soak's verdict is kept there: give another --state-dir, or "
            "--no-record)",
            flag="--state-dir",
        ) from None


def exit_status(gpus: tuple[GpuSoak, ...], interrupted: bool, files_ok: bool) -> Exit:
    """FAILED a worker failed, or a kernel gave a wrong result (or failed) in a window;
    INTERRUPTED; ATTENTION a kernel fell, a GPU was not soaked or measured nothing (every kernel
    asked for unsupported there: it was loaded for the whole duration and "completed", exit 0,
    before) or a file was not written; else OK."""
    if any(g.stopped == "error" for g in gpus):
        return Exit.FAILED
    if any(k.status == "error" for g in gpus for k in g.verdict.kernels):
        return Exit.FAILED
    if interrupted or any(g.stopped == "interrupted" for g in gpus):
        return Exit.INTERRUPTED
    if not files_ok or any(
        g.stopped in NOT_RUN or g.verdict.degraded or not _measured(g) for g in gpus
    ):
        return Exit.ATTENTION
    return Exit.OK


def _measured(gpu: GpuSoak) -> bool:
    return any(k.status != "unsupported" for k in gpu.verdict.kernels)


@click.command()
@click.option(
    "--duration",
    default="10m",
    show_default=True,
    callback=_duration,
    help="How long to load the GPU: seconds, or 90s, 10m, 1h30m (at most 24 h).",
)
@click.option(
    "--window",
    "window",
    type=FiniteRange(min=0.1, max=3600),
    default=SOAK_WINDOW_SECONDS,
    show_default=True,
    metavar="SECONDS",
    help="Seconds of load between two measurement windows.",
)
@gpu_option("The GPUs to soak, all at once (one worker per GPU).")
@worker_option("--dtype", shown="the hot suite's, " + ",".join(SUITES["hot"].dtypes))
@worker_options("--small", "--device", shown={"--device": "every GPU at once, a worker each"})
@click.option(
    "--json",
    "json_to",
    is_flag=False,
    flag_value="-",
    default=None,
    type=path_type(dir_okay=False, allow_dash=True),
    metavar="[FILE]",
    help="Write the JSON record to FILE; --json alone prints it instead of the text.",
)
@file_option(
    "--csv",
    "csv_to",
    "Write one row per window and kernel to FILE; - prints them instead of the text.",
)
@plot_option(
    "DIR|PREFIX",
    "Write PREFIX-time.png and PREFIX-temperature.png (DIR/soak-*.png for a directory); "
    f"needs matplotlib: {plotting.INSTALL_HINT}.",
)
@click.option(
    "--record/--no-record",
    default=True,
    show_default=True,
    help="Keep the verdict in the state directory (soak.json), which the daemon exports and "
    "check reports.",
)
@settings_options("soak")
def soak(
    duration: float,
    window: float,
    gpus: tuple[int, ...] | None,
    dtypes: list[str],
    small: bool,
    device: str | None,
    json_to: Path | None,
    csv_to: Path | None,
    plot_to: str | None,
    record: bool,
    **given: Any,
) -> Exit:
    """Sustained load with measurement windows: does throughput hold when the GPU is hot?

    Runs bf16 matmuls on every chosen GPU at once for --duration, and measures the hot suite's
    kernels (int4, bf16, fp16, fp8 and nvfp4 where supported, at a decode and an LLM shape,
    interleaved, with the int4/bf16 and int4/fp16 ratios) once before the load (cold) and every
    --window seconds during it, with the memory and GPU temperature, SM and memory clocks, clock
    event reasons and power of each window.

    It ends with a verdict per kernel: its cold rate, its hottest rate, and the memory
    temperature at which it first fell below 0.9 of cold, or that it held ("held 0.98 of cold
    up to 61 °C memory"); on a GPU without a memory sensor (GB10) the GPU temperature is used
    and the output says so. The latest verdict per GPU is kept in the state directory, exported
    by the daemon (sparkdiag_soak_*) and reported by sparkdiag check.

    Safety: each worker stops 5 °C below the GPU's slowdown threshold and the memory's maximum
    operating temperature, on any hardware (thermal) slowdown, and on Ctrl-C, SIGTERM or SIGHUP (a
    second one kills the workers); the GPU is left idle and the windows measured so far are
    still written. Why it stopped is the last line per GPU.

    --device cpu --small is a smoke test of the command: a CPU measures its own noise, not
    heat, so its kernels "ran" (with the range of their fractions of cold) and get no verdict;
    its record is shown by check as a test run and not exported by the daemon.

    Exit status: 0 every kernel held (a CPU soak: ran); 1 a kernel fell below 0.9 of cold, a
    GPU was not soaked (busy, unsupported) or measured nothing (every kernel asked for
    unsupported there), or an output could not be written; 2 usage error
    (checked before any load: each output path is created, or opened, and left as it was, and
    with --record the state directory must take a file); 3 a worker failed, a kernel gave a
    wrong result (or failed) in a window, or torch is not installed; 130 interrupted.
    """
    settings = settings_from("soak", given)
    setup_logging(settings.log_level)
    check_output_path(json_to, "--json")
    check_output_path(csv_to, "--csv")
    if plot_to is not None:
        plotting.require("--plot")
        prefix = soak_plot.prefix_for(plot_to)
        if soak_plot.is_folder(plot_to):
            check_output_folder(prefix.parent, "--plot")  # DIR/: created if its parent exists
        else:
            for kind in ("time", "temperature"):
                check_output_path(prefix.with_name(f"{prefix.name}-{kind}.png"), "--plot")
    one_stdout(csv_to, json_to)
    if record:
        _check_state_dir(settings.state_dir)
    require_torch("soak")
    request = WorkerRequest(
        dtypes=tuple(dtypes),
        small=small,
        probe_when=settings.probe_when,
        busy_utilization=settings.probe_busy_utilization,
        soak_seconds=duration,
        window_seconds=window,
        progress=True,
    )
    jobs = _jobs(device, gpus, request, settings.nvml_fixture)
    names = ", ".join(j.target.label for j in jobs)
    click.echo(
        terminal.fill(
            f"soaking {names} for {duration:g} s (a measurement window every {window:g} s); "
            "Ctrl-C stops it cleanly",
            terminal.width(sys.stderr),
        ),
        err=True,
    )
    runner = SoakRunner(jobs, timeout=duration + window + settings.probe_timeout)
    started = time.time()
    with _Progress(jobs, duration) as progress:
        outcomes = runner.run(on_window=progress.window)
    LIFECYCLE.interrupt_on_signal()  # the load is over: Ctrl-C interrupts the writes again
    report = SoakReport(
        started_at=started,
        finished_at=time.time(),
        duration_seconds=duration,
        window_seconds=window,
        interrupted=runner.interrupted,
        gpus=tuple(outcomes),
    )
    files_ok = _write_outputs(report, json_to, csv_to, plot_to, record, settings.state_dir)
    if is_stdout(json_to):
        click.echo(json.dumps(record_json(report), indent=1))
    elif is_stdout(csv_to):
        _csv(sys.stdout, report)
    else:
        click.echo(text(report), nl=False)
    return exit_status(report.gpus, runner.interrupted is not None, files_ok)
