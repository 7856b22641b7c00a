"""What several commands do the same way at run time: set up logging, find the GPUs ``--gpu`` names,
check the output paths before any work starts. (Their flags come from :mod:`sparkdiag.flags`; errors
are raised, never translated here: :mod:`sparkdiag.errors`.)"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkdiag import terminal
from sparkdiag.config import Settings
from sparkdiag.errors import Exit, SparkdiagError, UsageError
from sparkdiag.snapshot import GpuSample

if TYPE_CHECKING:  # the worker's tables load with the commands that run it, not with serve
    from sparkdiag.probe.request import WorkerRequest

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _TerminalFormatter(logging.Formatter):
    """On a terminal a log record wraps at words within its width, later lines indented (the
    daemon's first lines ran to 219 columns at 80: "NVML unavailable (...): GPU telemetry
    skipped; exporting ..."); in a pipe, a file or journald each record stays one line."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        width = terminal.width(sys.stderr)
        return "\n".join(
            part for line in text.splitlines() for part in terminal.wrap(line, width, "", "    ")
        )


def setup_logging(level: str, prefix: str | None = None) -> None:
    """Log lines at ``level`` (a ``--log-level`` choice) and above on standard error.

    ``prefix`` gives short lines for an interactive command ("sparkdiag watch: message")
    instead of the daemon's timestamped ones.
    """
    fmt = LOG_FORMAT if prefix is None else f"{prefix}: %(message)s"
    logging.basicConfig(level=getattr(logging, level.upper()), format=fmt, stream=sys.stderr)
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty:
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
                handler.setFormatter(_TerminalFormatter(fmt))


def is_stdout(path: Path | str | None) -> bool:
    """``-`` given to an output flag (``--json``, ``--csv``): standard output, printed instead
    of the text."""
    return path is not None and str(path) == "-"


def one_stdout(csv_path: Path | str | None, json_path: Path | str | None) -> None:
    """Standard output holds one document: ``-`` for both --csv and --json is a usage error;
    so is one file for both (the last write kept one, and the other was lost without a word:
    the bad-input review). Paths are compared as they resolve (links followed)."""
    if is_stdout(csv_path) and is_stdout(json_path):
        raise UsageError("give - (standard output) to --csv or to --json, not to both")
    if csv_path is None or json_path is None or is_stdout(csv_path) or is_stdout(json_path):
        return
    if Path(csv_path).resolve() != Path(json_path).resolve():
        return
    mode = _mode(Path(json_path), "--json")
    if mode is None or stat.S_ISREG(mode):  # a file both would write; /dev/null twice is fine
        raise UsageError(
            f"--csv and --json both name {json_path}: one would overwrite the other; give two "
            "files",
            flag="--json",
        )


def check_output_path(path: Path | str | None, flag: str, replaced: str = "") -> None:
    """A file the command will write at the end, checked before the work starts by doing what
    the write will do: a new file is created and removed again, an existing one is opened for
    writing and closed (appending nothing: it keeps its contents), so that the reason is the
    system's own. os.access alone said yes to root for /proc/x.csv, which no one can create,
    and a sweep was lost after it ran. Its folder must exist (nothing is created for it) and
    the path must not be a folder. A usage error naming ``flag`` otherwise; None and ``-``
    (standard output) pass, and so does a pipe or a device (/dev/null), which is only asked
    whether it may be written: opening a pipe with no reader yet would wait for one. Where the
    command ``replaced`` the file whole (a new file, then a rename), only a regular file may be
    there: ``replaced`` says why, after "not a regular file: "."""
    if path is None or is_stdout(path):
        return
    target = Path(path)
    mode = _mode(target, flag)
    if mode is not None and stat.S_ISDIR(mode):
        raise UsageError(f"{target} is a folder; give a file name", flag=flag)
    if replaced and mode is not None and not stat.S_ISREG(mode):
        raise UsageError(f"{target} is not a regular file: {replaced}", flag=flag)
    _writable_folder(target.parent, flag, f"for {target.name}", write=False)
    if mode is not None and not stat.S_ISREG(mode):
        if not os.access(target, os.W_OK):
            raise UsageError(f"cannot write {target}: permission denied", flag=flag)
        return
    how = os.O_WRONLY | os.O_CLOEXEC | (os.O_APPEND if mode is not None else os.O_CREAT | os.O_EXCL)
    try:
        fd = os.open(target, how, 0o666)
    except FileExistsError:  # a dangling link, or made meanwhile: not ours to remove
        if target.is_symlink():  # the write creates what it points at: check that place
            check_output_path(target.resolve(), flag)
        return
    except OSError as exc:
        verb = "write" if mode is not None else "create"
        raise UsageError(f"cannot {verb} {target}: {_why(exc)}", flag=flag) from None
    os.close(fd)
    if mode is None:  # ours: the command writes it at the end
        with contextlib.suppress(OSError):
            os.unlink(target)


def _mode(path: Path, flag: str) -> int | None:
    """``path``'s mode (links followed), None where nothing is there; a usage error naming
    ``flag`` where it cannot be looked at (a parent folder that cannot be entered: Path.exists
    raises then)."""
    try:
        return path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise UsageError(f"cannot look at {path}: {_why(exc)}", flag=flag) from None


def check_output_folder(folder: Path | str, flag: str, parents: bool = False) -> None:
    """A folder the command will write files in, created at the end if missing: it, or else
    its parent (one level is created, never a whole chain such as /nonexistent/dir; with
    ``parents`` the first folder of the path that exists, for a chain made as the state
    directory is), must be a folder in which a file can be created (one is, and removed). A
    usage error naming ``flag`` otherwise."""
    target = Path(folder)
    if _mode(target, flag) is not None:
        _writable_folder(target, flag, "")
        return
    parent = target.parent
    while parents and _mode(parent, flag) is None and parent != parent.parent:
        parent = parent.parent
    _writable_folder(parent, flag, f"to create {target.relative_to(parent)} in")


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _writable_folder(folder: Path, flag: str, what: str, write: bool = True) -> None:
    """``folder`` exists and is a folder; with ``write`` a file is created in it and removed,
    so that the reason is the system's own (a read-only file system, permission denied) and
    holds for root too (os.access says yes to root on /proc)."""
    shown = str(folder) or "."
    where = f" ({what})" if what else ""
    mode = _mode(folder, flag)
    if mode is None:
        raise UsageError(f"folder {shown} does not exist{where}", flag=flag)
    if not stat.S_ISDIR(mode):
        raise UsageError(f"{shown} is not a folder{where}", flag=flag)
    if not write:
        return
    import tempfile  # loads random and shutil: only where a folder is checked

    try:
        fd, name = tempfile.mkstemp(prefix=".sparkdiag-check-", dir=folder)
    except OSError as exc:
        why = f"cannot write in folder {shown}{where}: {_why(exc)}"
        raise UsageError(why, flag=flag) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)


def check_shapes(dtypes: Sequence[str], shapes: Sequence[str], flag: str) -> None:
    """A shape that a dtype named in ``--dtype`` cannot run (the worker contract's
    ``shape_problem``: int4 needs K divisible by its group size) is a usage error naming
    ``flag``, before the worker starts. ``--dtype all`` names none: the worker reports such a
    kernel unsupported, as it does for a dtype the suite chose."""
    from sparkdiag.probe.worker.contract import ALL_DTYPES, parse_shape, shape_problem

    if tuple(dtypes) == ALL_DTYPES:
        return
    for dtype in dtypes:
        bad = [(s, shape_problem(dtype, *parse_shape(s)[1:])) for s in shapes]
        bad = [(s, why) for s, why in bad if why]
        if bad:
            more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            raise UsageError(
                f"{bad[0][1]} ({bad[0][0]}{more}); give another K, or leave {dtype} out",
                flag=flag,
            )


def check_gpu_indices(listed: Sequence[int], chosen: tuple[int, ...] | None) -> None:
    """A ``--gpu`` index that NVML does not list (``listed``) is a usage error naming those it
    does; None (every GPU) always passes."""
    missing = sorted(set(chosen or ()) - set(listed))
    if missing:
        seen = ", ".join(map(str, listed)) or "none"
        raise UsageError(
            f"no GPU with index {', '.join(map(str, missing))} (NVML sees: {seen})",
            flag="--gpu",
        )


def choose_gpus(seen: list[GpuSample], chosen: tuple[int, ...] | None) -> list[GpuSample]:
    """The GPUs of ``seen`` that ``--gpu`` names (None: all of them), in NVML's order."""
    check_gpu_indices([g.identity.index for g in seen], chosen)
    return [g for g in seen if chosen is None or g.identity.index in chosen]


def gpus_seen(
    nvml_fixture: Path | None, chosen: tuple[int, ...] | None = None
) -> tuple[list[GpuSample], str | None]:
    """The GPUs NVML sees and ``--gpu`` names (one poll, for their uuid, name and busy state),
    and why there are none when NVML cannot be used. An unusable fixture raises FixtureError."""
    from sparkdiag.sources.nvml.backends import make_backend
    from sparkdiag.sources.nvml.gpu import GpuSource

    source = GpuSource(make_backend(nvml_fixture))
    if not source.start():
        return choose_gpus([], chosen), source.unavailable_reason
    try:
        source.backend.advance()
        return choose_gpus([g for g in source.read() if g.up], chosen), None
    finally:
        source.stop()


def worker_request(
    settings: Settings,
    device: str | None,
    dtypes: Sequence[str],
    shapes: Sequence[str],
    small: bool,
    probe_when: str | None = None,
    **more: Any,
) -> WorkerRequest:
    """The worker request a command's worker flags make (``--device``, ``--dtype``, ``--shape``,
    ``--small``), with the settings' ``probe.when`` unless the command fixes its own."""
    from sparkdiag.probe.request import WorkerRequest

    return WorkerRequest(
        device=device,
        dtypes=tuple(dtypes),
        shapes=tuple(shapes),
        small=small,
        probe_when=settings.probe_when if probe_when is None else probe_when,
        **more,
    )


# PyTorch's own CPU-only index (pytorch.org, "Get started"): from the public index, torch on
# Linux x86-64 is the CUDA build and pulls several GB of nvidia-* wheels.
CPU_TORCH = "the CPU-only build: add --index-url https://download.pytorch.org/whl/cpu"


def require_torch(command: str) -> None:
    """The worker imports torch: without it ``probe``, ``bench`` and ``soak`` say so in the same
    one line, how to install it, and exit FAILED (3), before anything else is printed or run
    (they used to say it three ways: a line, "sweep failed: worker exited 1", and "soaking cpu
    for 10 s" before the import error)."""
    from sparkdiag.probe.runner import torch_install_hint
    from sparkdiag.sources.software.packages import read_torch

    torch = read_torch()
    if torch.version is None:
        raise SparkdiagError(
            f"torch is not installed for {torch.python}, and sparkdiag {command} needs it: "
            + torch_install_hint(torch.python)
            + f"; on a machine without a GPU, {CPU_TORCH}"
        )


def no_gpu(verb: str, why: str | None, cpu_run: str) -> SparkdiagError:
    """The one refusal of a command that loads a GPU when NVML sees none (``soak``, ``bench``):
    why there is none, and the CPU run that smoke-tests the command instead. ATTENTION (1), as
    a GPU that is not measured (busy, unsupported)."""
    return SparkdiagError(
        f"no GPU to {verb}: {why or 'NVML lists none'} ({cpu_run})", exit_code=Exit.ATTENTION
    )
