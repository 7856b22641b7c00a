"""``sparkdiag storage [DIR]``: how fast a directory's drive reads and writes, against its ceiling
and the baseline learned on this machine (see :mod:`sparkdiag.storage` and docs/storage.md)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import click

from sparkdiag import terminal
from sparkdiag.commands.common import setup_logging
from sparkdiag.errors import Exit, SparkdiagError, UsageError
from sparkdiag.flags import settings_from, settings_options
from sparkdiag.sources.host.nvme import read_controller
from sparkdiag.statedir import ensure_state_directory, state_directory
from sparkdiag.storage.evaluate import StorageReport
from sparkdiag.storage.render import size, temperatures, text
from sparkdiag.storage.run import Progress, StorageProbeError
from sparkdiag.storage.session import Where, probe_directory, request_for
from sparkdiag.storage.target import StorageTarget

SCHEMA = "sparkdiag-storage-report/1"


@click.command("storage")
@click.argument("directory", required=False, type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead of text.")
@click.option(
    "--record/--no-record",
    default=True,
    help="Keep the figures in the baseline store and storage.json (learning the baseline "
    "from healthy runs) [default: record].",
)
@settings_options("storage")
@click.pass_context
def storage(
    ctx: click.Context, /, directory: str | None, as_json: bool, record: bool, **given: Any
) -> Exit:
    """Measure how fast DIR's drive reads and writes (default: the state directory).

    WRITES a test file of --storage.size into DIR (O_DIRECT, 1 MiB blocks, 8 threads; an
    O_TMPFILE, so nothing is left behind however the probe ends, even killed), reads it back,
    then times 4 KiB random reads. With --storage.gpu N it then reads the file into GPU N:
    through pinned host memory, and by GPUDirect Storage where kvikio is installed (a
    compatibility mode is labelled compat). Each figure is held against the drive's PCIe link
    and the baseline learned here (the median of the first healthy runs, set at 3 and frozen
    at 5; a run judged slow against it, beside other I/O or read from a cache is not learned
    from). Where the device read under half of what the probe read back, the reads came from
    a cache (a filesystem that ignores O_DIRECT): the verdict is CACHED, and nothing is
    learned or kept in storage.json. It refuses a raw device, a symlink, a kernel's
    pseudo-filesystem (/proc, /sys, /dev, cgroup), a read-only filesystem, and one that would
    keep less than 5 % plus 64 MiB free; a tmpfs is measured and named memory, and refused
    where the test file would leave less than 1 GiB of the memory available or of what this
    process's memory cgroup may still use. The test file is --storage.size rounded down to a
    multiple of 8 MiB (8 threads x 1 MiB blocks; a note says so). Against fio with the same
    flags: within 10 % on a throttled loop device (the tests); on the H200's virtio disk, reads
    within 10 % and writes up to 28 % apart (docs/storage.md).

    \b
    Exit status:
      0  measured; every figure at least 0.7 of its baseline, or still learning
      1  a figure under 0.7 of its baseline (slow), the reads came from a cache
         (cached), or --storage.gpu measured nothing (no GPU, the GPU busy,
         unsupported; not a path skipped because the write ran out of time,
         which exits by the verdict)
      2  refused (nothing was written), a bad flag, or DIR given empty ("")
      3  the probe failed or timed out (its test file went with it), or the
         path into the GPU failed or delivered data that was not the file's
    130  interrupted
    """
    try:
        report, started, sysfs = _measure(directory, record, given)
    except SparkdiagError as exc:
        if as_json:  # a document on standard output whatever happened; the line on stderr too
            click.echo(json.dumps(failure_document(directory, exc), indent=1))
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM: the test file went with the probe
        if as_json:
            why = getattr(exc, "signal_name", "") or "SIGINT"
            reason = f"{why} received: nothing measured, the test file removed"
            stopped = unmeasured(directory, "interrupted", reason, Exit.INTERRUPTED)
            click.echo(json.dumps(stopped, indent=1))
        raise
    before = started[0].nvme if started else ()
    after = tuple(c for b in before if (c := read_controller(sysfs, b.name)))
    status = exit_status(report)
    if as_json:
        ends = {a.name: a.temperature_celsius.get("composite") for a in after}
        doc = {"schema": SCHEMA, "status": "measured", **report.as_json(), "drive_temperatures": [
            {"controller": b.name, "before_celsius": b.temperature_celsius.get("composite"),
             "after_celsius": ends.get(b.name)}
            for b in before
        ], "exit_status": int(status)}  # fmt: skip
        click.echo(json.dumps(doc, indent=1, allow_nan=False))
    else:
        click.echo(text(report, terminal.width(), temperatures(before, after)), nl=False)
    return status


def _measure(
    directory: str | None, record: bool, given: dict[str, Any]
) -> tuple[StorageReport, list[StorageTarget], Path]:
    """Resolve the settings and DIR, and probe it (the progress on standard error): the report,
    the target it started on (none when it refused before starting) and --path.sysfs."""
    if directory == "":  # Path("") is ".": an unset variable ('storage "$DIR"') measured the
        # current directory, writing a test file where the command happened to run
        raise UsageError(
            "DIR is empty: give the directory to measure ('.' for the current one), or leave it "
            "out for the state directory"
        )
    settings = settings_from("storage", given)
    setup_logging(settings.log_level)
    where = Where(settings.sysfs, settings.rootfs, settings.state_dir)
    # the state directory by default, made as every command that writes there does
    target = (
        Path(directory)
        if directory is not None
        else ensure_state_directory(settings.state_dir or state_directory())
    )
    request = request_for(target, settings)
    shown = _Progress(size(request.file_size))
    started: list[StorageTarget] = []

    def on_start(target: StorageTarget) -> None:
        started.append(target)
        shown.line.show(f"probing {target.directory}: {shown.file}…", time.monotonic())

    try:
        report = probe_directory(request, where, record, shown.show, on_start)
    finally:
        shown.line.clear()
    return report, started, settings.sysfs


# what each phase of the program is doing, said as it starts
PHASES = {
    "write": "writing a {file} test file",
    "flush": "flushing it to the drive (fdatasync)",
    "read": "reading it back",
    "random": "random 4 KiB reads",
    "gpu": "reading it into the GPU (the probe worker)",
}


class _Progress:
    """On a terminal one status line, rewritten as the program's progress lines come (the
    bytes and seconds of each phase); elsewhere (a log, a pipe) one line as each phase starts,
    so that a run of a minute is not a silence. Before, the flush and the random reads showed
    nothing, and off a terminal nothing was shown at all."""

    def __init__(self, file: str, stream: TextIO | None = None) -> None:
        self.file = file
        self.stream = sys.stderr if stream is None else stream
        # every line shown: they come once a second at the most, and a phase's first is its only
        # one where it is short (a flush's is its only one)
        self.line = terminal.StatusLine(self.stream, every=0.0)
        self.phase: str | None = None

    def show(self, item: Progress) -> None:
        doing = PHASES.get(item.phase, item.phase).format(file=self.file)
        if not self.line.enabled:
            if item.phase != self.phase:
                click.echo(f"sparkdiag storage: {doing}…", file=self.stream)
            self.phase = item.phase
            return
        self.phase = item.phase
        if item.phase in ("write", "read"):
            doing = f"{item.phase}: {size(item.bytes)} in {item.seconds:.0f} s"
        elif item.phase == "random":
            doing = f"{doing}: {item.bytes // 4096:,} in {item.seconds:.0f} s"
        self.line.show(f"{doing}…", time.monotonic())


def failure_document(directory: str | None, exc: SparkdiagError) -> dict[str, Any]:
    """``--json``'s document when nothing was measured: ``status`` refused (nothing was
    written), failed (the probe started and did not finish) or error (a bad flag, DIR empty),
    why, and the exit status. Before, a refusal printed nothing on standard output."""
    if isinstance(exc, StorageProbeError):
        status = "refused" if exc.exit_code == Exit.USAGE else "failed"
    else:
        status = "error"
    return unmeasured(directory, status, exc.line(), exc.exit_code)


def unmeasured(directory: str | None, status: str, reason: str, code: int) -> dict[str, Any]:
    """``--json``'s document of a run that measured nothing: its status, why, the exit status."""
    return {
        "schema": SCHEMA,
        "status": status,
        "directory": directory,
        "reason": reason,
        "exit_status": int(code),
    }


def exit_status(report: StorageReport) -> Exit:
    """FAILED where the path into the GPU failed (a worker that could not start, a CUDA error),
    ATTENTION where it measured nothing (no GPU, busy, unsupported), a figure is slow or the
    reads came from a cache: a --storage.gpu run that failed exited 0 (the bad-input review).
    A path skipped because the write ran out of time exits by the verdict: the drive's
    slowness, not the path's failure (it exited 3 while the verdict said SLOW)."""
    gpu = report.document.gpu
    if gpu is not None and gpu.status == "skipped":
        gpu = None
    if gpu is not None and (gpu.status == "error" or any(s.checked is False for s in gpu.stages)):
        return Exit.FAILED  # an error, or data that arrived WRONG (its check failed)
    if gpu is not None and not any(s.status == "ok" for s in gpu.stages):
        return Exit.ATTENTION
    return Exit.ATTENTION if report.verdict in ("slow", "cached") else Exit.OK
