"""Run the measuring program in a subprocess of its own session, and kill it at its timeout.

The program (:mod:`sparkdiag.storage.measure`) is started as a script with this Python, in a new
session, so that its whole process group can be killed: at the timeout SIGTERM, then SIGKILL
after a grace period; at once with SIGKILL when the caller is interrupted (Ctrl-C, SIGTERM). Its
test file has no name (``O_TMPFILE``), so a killed probe leaves nothing behind. The daemon ends
running probes when it stops (:func:`kill_running`), as it does the GEMM workers.

With a :class:`GpuRequest` the program then starts the probe worker (its storage mode,
probe/worker/storage.py) in the same process group, handing it the test file's descriptor: the
timeout grows by the worker's reads and start, and the group's kill takes the worker too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkdiag.errors import Exit, SparkdiagError
from sparkdiag.lifecycle import Sessions
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.probe.runner import worker_path
from sparkdiag.storage import measure
from sparkdiag.storage.model import DocumentError, ProbeDocument, parse_document

KILL_GRACE = 2.0
# How long a SIGKILLed probe may take to be gone. A process in uninterruptible sleep (a write
# to a dead drive, a hung NFS server) does not act on SIGKILL until the kernel lets it go,
# maybe never: waiting without a bound hung the command, or the daemon's storage thread, for
# ever, where the timeout's message asks whether the drive is hung (found in a review of the
# same wait in the GPU probe's runner)
KILLED_WAIT = 10.0
# how long the output readers are waited for once the probe's process group is gone (its pipes
# then close at once); a reader still blocked after it is one on a process stuck in the kernel,
# which KILLED_WAIT has already reported
READERS_WAIT = 1.0
STARTUP_SECONDS = 15.0  # on top of the probe's own --seconds: the interpreter, fallocate, flush
_OUT_LIMIT = 1 << 20


class StorageProbeError(SparkdiagError):
    """The probe could not measure (exit 3), or refused the target (exit 2, a usage error)."""


GPU_SHARE = 0.35  # of the probe's seconds: the worker's reads, as long as the host read's


@dataclass(frozen=True)
class GpuRequest:
    """The path into GPU ``index`` (CUDA's, which the worker orders by PCI bus as NVML does),
    read by the probe worker run with ``python`` for ``seconds`` (its stages share them), by
    GPUDirect Storage too unless ``gds`` is off."""

    index: int = 0
    seconds: float = 7.0
    gds: bool = True
    python: tuple[str, ...] = (sys.executable,)

    def command(self, block: int, threads: int) -> list[str]:
        """The worker's command line but for ``--storage-read``, which the program adds."""
        request = WorkerRequest(
            device=f"cuda:{self.index}", storage_block=block, storage_threads=threads,
            storage_seconds=self.seconds, storage_gds=self.gds,
        )  # fmt: skip
        return [*self.python, str(worker_path()), *request.argv()]

    @property
    def timeout(self) -> float:
        return self.seconds + measure.GPU_STARTUP_SECONDS


@dataclass(frozen=True)
class ProbeRequest:
    """One run of the probe: where, how much (``size`` bytes, ``seconds`` at most), how
    (``pages``: the buffers in ``huge`` pages where given, or ``small``), and the path into the
    GPU after it (``gpu``; None: host memory only)."""

    directory: Path
    size: int = 1 << 30
    seconds: float = 20.0
    block: int = 1 << 20
    threads: int = 8
    random_ops: int = 20000
    min_free: int | None = None
    pages: str = "huge"
    gpu: GpuRequest | None = None

    def argv(self) -> list[str]:
        """The program's arguments: the options, then ``--`` and the directory, so that a
        directory named ``-d`` or ``--size`` is one (argparse read it as an option, exit 3)."""
        args = [
            "--size", str(self.size), "--seconds", f"{self.seconds:g}",
            "--block", str(self.block), "--threads", str(self.threads),
            "--random-ops", str(self.random_ops), "--pages", self.pages, "--progress",
        ]  # fmt: skip
        if self.min_free is not None:
            args += ["--min-free", str(self.min_free)]
        if self.gpu is not None:
            args += ["--gpu-worker", json.dumps(self.gpu.command(self.block, self.threads)),
                     "--gpu-timeout", f"{self.gpu.timeout:g}"]  # fmt: skip
        return [*args, "--", str(self.directory)]

    @property
    def file_size(self) -> int:
        """The test file's size: ``size`` rounded down to a multiple of threads x block."""
        return measure.file_size(self.size, self.threads, self.block)

    @property
    def timeout(self) -> float:
        """How long the program may run: its seconds, its start, and the GPU path's."""
        extra = 0.0 if self.gpu is None else self.gpu.timeout + KILL_GRACE
        return self.seconds + STARTUP_SECONDS + extra


@dataclass(frozen=True)
class Progress:
    phase: str  # write, flush, read, random, gpu (the worker started)
    bytes: int
    seconds: float


_LIVE = Sessions()
_LIVE_LOCK = _LIVE.lock


def kill_running() -> int:
    """SIGKILL every running probe's process group; how many there were."""
    return _LIVE.kill()


def _progress_reader(
    stream: Any, on_progress: Callable[[Progress], None] | None, tail: list[str]
) -> None:
    for raw in stream:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        if not line.startswith(measure.PROGRESS_PREFIX):
            tail.append(line)
            del tail[:-20]
            continue
        if on_progress is None:
            continue
        try:
            item = json.loads(line[len(measure.PROGRESS_PREFIX) :])
            on_progress(Progress(str(item["phase"]), int(item["bytes"]), float(item["seconds"])))
        except (ValueError, KeyError, TypeError):
            continue


def program_environment() -> dict[str, str]:
    """The measuring program's environment: this one, with the folder that holds this sparkdiag
    package (a checkout, or site-packages) in :data:`measure.ROOT_VARIABLE`. The program runs
    as a script, so Python puts its own folder on sys.path, not this package's root: from a
    checkout that was not installed (``python -m sparkdiag storage`` in it) it could not import
    the one sparkdiag module it needs, and beside another installed sparkdiag it imported that
    one's (seen while reading why a test of the program failed on the lent H100, where
    sparkdiag is not installed). Not PYTHONPATH: the program hands its environment on to the
    GPU worker (``--probe.python``), whose own packages (its torch) must not come after this
    one's site-packages (a review)."""
    return {**os.environ, measure.ROOT_VARIABLE: str(Path(measure.__file__).resolve().parents[2])}


def run_probe(
    request: ProbeRequest,
    on_progress: Callable[[Progress], None] | None = None,
    timeout: float | None = None,
) -> ProbeDocument:
    """Measure ``request.directory``; the parsed document when the probe measured. A refused
    target raises StorageProbeError with exit status 2 (nothing was written), a failure with 3.
    ``timeout`` defaults to :attr:`ProbeRequest.timeout`."""
    limit = request.timeout if timeout is None else timeout
    cmd = [sys.executable, measure.__file__, *request.argv()]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True, close_fds=True, env=program_environment(),
    )  # fmt: skip
    _LIVE.add(proc.pid)
    tail: list[str] = []
    out: list[bytes] = []
    readers = [
        threading.Thread(
            target=_progress_reader, args=(proc.stderr, on_progress, tail), daemon=True
        ),
        threading.Thread(target=lambda: out.append(proc.stdout.read(_OUT_LIMIT)), daemon=True),  # type: ignore[union-attr]
    ]
    for reader in readers:
        reader.start()
    timed_out = stuck = False
    try:
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=KILL_GRACE)
            except subprocess.TimeoutExpired:
                _stop(proc, signal.SIGKILL)
                try:
                    proc.wait(timeout=KILLED_WAIT)
                except subprocess.TimeoutExpired:
                    stuck = True
    except BaseException:
        _stop(proc, signal.SIGKILL)
        with contextlib.suppress(Exception):
            proc.wait(timeout=KILL_GRACE)
        raise
    finally:
        _stop(proc, signal.SIGKILL)  # anything the probe left in its group
        if proc.returncode is None:  # stuck in the kernel: reaped when it is let go
            _LIVE.reap_when_gone(proc)
        else:
            with _LIVE_LOCK:
                _LIVE.discard(proc.pid)
        for reader in readers:
            reader.join(timeout=READERS_WAIT)
    if stuck:
        raise StorageProbeError(
            f"the storage probe of {request.directory} did not finish within {limit:g} s and "
            f"could not be killed: pid {proc.pid} is still there {KILLED_WAIT:g} s after "
            "SIGKILL, stuck in the kernel (a hung drive or network filesystem?); its test file "
            "goes when it ends"
        )
    if timed_out:
        raise StorageProbeError(
            f"the storage probe of {request.directory} did not finish within {limit:g} s and was "
            "killed (its test file went with it): is the drive hung or very slow?"
        )
    return _document(proc.returncode, b"".join(out), tail, request.directory)


def _stop(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _document(code: int, stdout: bytes, tail: list[str], directory: Path) -> ProbeDocument:
    try:
        doc = parse_document(json.loads(stdout.decode("utf-8", "replace").strip().splitlines()[-1]))
    except (ValueError, IndexError, DocumentError):
        detail = tail[-1] if tail else f"exit status {code}"
        raise StorageProbeError(f"the storage probe of {directory} failed: {detail}") from None
    if doc.status == "refused":
        raise StorageProbeError(f"refused: {doc.reason}", exit_code=Exit.USAGE)
    if doc.status != "ok":
        raise StorageProbeError(f"the storage probe failed: {doc.reason}")
    return doc
