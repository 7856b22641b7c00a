"""Which Python environment to look at, and where its packages are: the probe worker's
interpreter, one given by path (an interpreter, a virtual environment, a ``site-packages``
directory), or an unpacked root (a container image's).

An interpreter is asked for its ``sys.path`` in a subprocess (``python -c``: about 20 ms, no
import of anything but the standard library); the rest is read from the file system. The
distributions that own files come from their ``*.dist-info/METADATA`` and ``RECORD``, read here
through the bounded reader (regular files only, size-bounded), not by ``importlib.metadata``:
it opened a ``METADATA`` that was a FIFO and waited for a writer forever (the hostile review).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkdiag.lifecycle import Sessions
from sparkdiag.sources.files import MIB, read_text_limited

# sys.path, the standard library's directories and $PYTHONPATH's: the rest of sys.path is where
# packages are (package directories, and what .pth files add). $PYTHONPATH is left out: one
# naming a home directory would have the scan walk all of it
PATH_SCRIPT = (
    "import json, os, sys, sysconfig; print(json.dumps({'path': [p for p in sys.path if p], "
    "'stdlib': [sysconfig.get_path(n) for n in ('stdlib', 'platstdlib')], "
    "'pythonpath': [os.path.abspath(p) for p in "
    "os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]}))"
)
# Where Debian/Ubuntu Pythons, python.org builds, NGC images and conda put packages.
ROOT_PATTERNS = (
    "usr/lib/python3*/site-packages",
    "usr/lib/python3*/dist-packages",
    "usr/local/lib/python3*/site-packages",
    "usr/local/lib/python3*/dist-packages",
    "opt/*/lib/python3*/site-packages",
)


class NotAnEnvironment(ValueError):
    """The path or interpreter given is not a Python environment (the message says why)."""


@dataclass(frozen=True)
class PythonEnvironment:
    """described: what it is, for people ("/usr/bin/python3", "venv /opt/venv", "root /mnt");
    site_dirs: its package directories, existing ones only; python: the interpreter command when
    there is one to run (None for a site directory or a root); root: the root its paths are
    shown relative to ("/" unless a root was given)."""

    described: str
    site_dirs: tuple[Path, ...]
    python: tuple[str, ...] | None
    root: Path = Path("/")

    def show(self, path: Path) -> str:
        """``path`` as the machine under ``root`` names it."""
        if self.root == Path("/"):
            return str(path)
        try:
            return "/" + str(path.relative_to(self.root))
        except ValueError:
            return str(path)


OUTPUT_LIMIT = 4 * MIB  # of each stream kept: a sys.path or torch's build is a few kB
DRAIN_SECONDS = 1.0  # for the rest of its output after it exits


# The sessions of the run_json children running now: the daemon's stop kills them
# (scheduling.wiring.stop_workers). A library scan's sys.path question to a slow --probe.python
# was left running under init when the daemon stopped, and held the stop for 5 s (a review).
_LIVE = Sessions()


def kill_running() -> int:
    """SIGKILL the session of every run_json child running now; how many there were."""
    return _LIVE.kill()


def run_json(argv: Sequence[str], timeout: float) -> tuple[Any, str | None]:
    """Run ``argv`` (standard input closed) and parse the last line it prints as JSON:
    (value, None), or (None, why) when it could not run, timed out, exited non-zero or printed
    no JSON (why: the last line of its standard error, else its exit status).

    It runs in a session of its own, killed whole at the timeout: a script given as
    ``--python`` that started a child and hung left that child running (a ``sleep`` of the
    script's outlived the command). Of each stream the last :data:`OUTPUT_LIMIT` bytes are
    kept: one that printed 300 MB took 1.8 GB of memory (the hostile review)."""
    import collections

    try:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        return None, f"cannot run {argv[0]}: {exc.strerror or exc}"
    _LIVE.add(proc.pid)
    tails: dict[str, collections.deque[bytes]] = {
        "out": collections.deque(),
        "err": collections.deque(),
    }

    def drain(name: str, stream: Any) -> None:
        tail, size = tails[name], 0
        while chunk := stream.read1(64 * 1024):  # what has come: read() waits for 64 KiB
            tail.append(chunk)
            size += len(chunk)
            while size - len(tail[0]) >= OUTPUT_LIMIT:  # the oldest chunk is not needed
                size -= len(tail.popleft())

    readers = [
        threading.Thread(target=drain, args=(n, s), daemon=True)
        for n, s in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer within {timeout:g} s (killed)"
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # what it left behind in its session
        proc.wait()
        with _LIVE.lock:
            _LIVE.discard(proc.pid)
        # its output is read to the end within a second of its exit; a process it started in
        # a session of its own that holds the pipes open is not waited for (it held this 10 s)
        drained = time.monotonic() + DRAIN_SECONDS
        for reader in readers:
            reader.join(timeout=max(0.0, drained - time.monotonic()))
    # what was read by now, also where a process left running holds a pipe open
    out, err = (
        b"".join(list(tails[n]))[-OUTPUT_LIMIT:].decode("utf-8", "replace") for n in ("out", "err")
    )
    lines = out.strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            return json.loads(lines[-1]), None
        except ValueError:
            pass
    errors = err.strip().splitlines()
    if errors:
        return None, errors[-1][:500]
    if proc.returncode == 0:
        return None, "it exited 0 and printed no JSON: is it a Python interpreter?"
    return None, f"exit status {proc.returncode}"


def interpreter_paths(python: Sequence[str], timeout: float = 30.0) -> list[Path]:
    """The ``sys.path`` directories of the interpreter command ``python`` that exist here.

    Same reading as ``python -c 'import sys; print(sys.path)'``. Raises NotAnEnvironment when
    it cannot run, fails or prints something else.
    """
    doc, why = run_json([*python, "-c", PATH_SCRIPT], timeout)
    if isinstance(doc, list):  # sys.path alone (a wrapper that answers the script its own way)
        return [Path(p) for p in doc if isinstance(p, str) and is_site_dir(Path(p))]
    paths = doc.get("path") if isinstance(doc, dict) else None
    if not isinstance(paths, list):
        raise NotAnEnvironment(f"{' '.join(python)} did not give its sys.path: {why}")
    stdlib = [Path(p) for p in doc.get("stdlib") or () if isinstance(p, str)]
    given = {Path(p) for p in doc.get("pythonpath") or () if isinstance(p, str)}
    return [
        Path(p)
        for p in paths
        if isinstance(p, str)
        and Path(p).is_dir()
        and not _in_stdlib(Path(p), stdlib)
        and (Path(p) not in given or is_site_dir(Path(p)))
    ]


def _in_stdlib(path: Path, stdlib: Sequence[Path]) -> bool:
    """Whether ``path`` is the standard library or inside it (``lib-dynload``), and not a
    package directory (a python.org build's ``site-packages`` is inside ``lib/python3.X``)."""
    if path.name in ("site-packages", "dist-packages"):
        return False
    return any(path == lib or lib in path.parents for lib in stdlib)


def site_dirs_under(root: Path) -> list[Path]:
    """The package directories of every Python 3 under ``root`` (``ROOT_PATTERNS``)."""
    found: list[Path] = []
    for pattern in ROOT_PATTERNS:
        found += sorted(root.glob(pattern))
    return found


def is_site_dir(path: Path) -> bool:
    """A package directory: named ``site-packages`` or ``dist-packages``, or holding a
    ``*.dist-info``."""
    if path.name in ("site-packages", "dist-packages"):
        return True
    try:
        return any(p.suffix == ".dist-info" for p in path.iterdir())
    except OSError:
        return False


def for_python(python: Sequence[str], label: str = "") -> PythonEnvironment:
    """The environment of the interpreter command ``python`` (the probe worker's): every
    directory of its ``sys.path`` outside the standard library, in that order. The package
    directories, and the directories a ``.pth`` file adds (an editable install's source tree:
    ``TORCH_CUDA_ARCH_LIST=12.1a pip install -e .``, as the lint itself advises), which were
    left out for holding no ``*.dist-info`` (found in a review). An editable install whose
    ``.pth`` imports a finder (setuptools' for a layout it cannot map to one directory) puts
    no directory on ``sys.path`` and is still not seen."""
    dirs = interpreter_paths(python)
    shown = " ".join(python) + (f" ({label})" if label else "")
    return PythonEnvironment(shown, tuple(dict.fromkeys(dirs)), tuple(python))


def resolve(path: Path) -> PythonEnvironment:
    """``--python PATH``: an interpreter, a virtual environment (``pyvenv.cfg``), a package
    directory (``site-packages``, ``dist-packages`` or one holding ``*.dist-info``), or a root
    with Pythons under it (an unpacked container image). Raises NotAnEnvironment."""
    if not path.exists():
        raise NotAnEnvironment(f"{path} does not exist")
    if path.is_file():
        if not os.access(path, os.X_OK):
            raise NotAnEnvironment(f"{path} is a file but not an executable interpreter")
        # absolute: a bare name ('python3' in the current directory) was looked up in PATH
        return for_python((str(path.absolute()),))
    if (path / "pyvenv.cfg").is_file():
        for name in ("python3", "python"):
            exe = path / "bin" / name
            if exe.exists():
                env = for_python((str(exe),))
                return PythonEnvironment(f"venv {path}", env.site_dirs, env.python)
        dirs = sorted(path.glob("lib/python3*/site-packages"))
        return PythonEnvironment(f"venv {path}", tuple(dirs), None)
    if is_site_dir(path):
        return PythonEnvironment(f"packages {path}", (path,), None)
    dirs = site_dirs_under(path)
    if not dirs:
        raise NotAnEnvironment(
            f"{path} is not an interpreter, a venv, a site-packages directory or a root with "
            "Pythons under it (looked for " + ", ".join(ROOT_PATTERNS) + ")"
        )
    return PythonEnvironment(f"root {path}", tuple(dirs), None, path)


def this_python() -> PythonEnvironment:
    """This interpreter's environment, without a subprocess."""
    dirs = [Path(p) for p in sys.path if p and Path(p).is_dir() and is_site_dir(Path(p))]
    return PythonEnvironment(sys.executable, tuple(dict.fromkeys(dirs)), (sys.executable,))


METADATA_LIMIT = 16 * MIB  # torch's METADATA is some 50 kB, its long description included
RECORD_LIMIT = 64 * MIB  # torch's RECORD is some 2 MB


@dataclass(frozen=True)
class Distribution:
    """One ``*.dist-info`` directory of a package directory: the distribution's name as its
    ``METADATA`` gives it (``nvidia_nccl_cu13``), its version ("" when none) and the directory."""

    name: str
    version: str
    directory: Path

    @property
    def normalized(self) -> str:
        """The name as pip shows it in lower case, ``_`` as ``-`` (``nvidia-nccl-cu13``)."""
        return self.name.lower().replace("_", "-")


def _headers(text: str) -> dict[str, str]:
    """The first value of each header of a ``METADATA`` (RFC 822: up to the first blank line,
    continuation lines skipped), by lower-case name."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        if line[:1] in (" ", "\t"):
            continue
        key, sep, value = line.partition(":")
        if sep:
            found.setdefault(key.strip().lower(), value.strip())
    return found


def distributions(site: Path) -> list[Distribution]:
    """The distributions installed in ``site`` (its ``*.dist-info`` directories whose
    ``METADATA`` names one), by directory name. Same reading as ``pip list --path SITE``.

    Every file is read through :func:`sparkdiag.sources.files.read_text_limited`: one that is
    not a regular file (a FIFO, a device) or is larger than :data:`METADATA_LIMIT` is skipped
    with its distribution, never opened for a blocking read (``importlib.metadata`` waited
    forever on a FIFO named ``METADATA``)."""
    try:
        with os.scandir(site) as it:
            names = sorted(entry.name for entry in it if entry.name.endswith(".dist-info"))
    except OSError:
        return []
    found = []
    for name in names:
        directory = site / name
        try:
            headers = _headers(read_text_limited(directory / "METADATA", METADATA_LIMIT))
        except OSError:
            continue
        if headers.get("name"):
            found.append(Distribution(headers["name"], headers.get("version", ""), directory))
    return found


@dataclass(frozen=True)
class Owner:
    """The distribution a file belongs to (``torch`` 2.11.0+cu130)."""

    package: str
    version: str


def file_owners(site: Path, suffixes: tuple[str, ...] = (".so",)) -> dict[Path, Owner]:
    """Resolved file path -> owning distribution, for the files in ``site``'s RECORDs whose
    name is a shared library's (ends ``.so`` or holds ``.so.``).

    Same reading as ``python -m pip show -f PACKAGE``. A RECORD that is not a regular file or
    is larger than :data:`RECORD_LIMIT` is skipped (its files are then named by their
    directory), as is a distribution without a readable ``METADATA`` (:func:`distributions`).
    """
    owners: dict[Path, Owner] = {}
    for dist in distributions(site):
        try:
            record = read_text_limited(dist.directory / "RECORD", RECORD_LIMIT)
        except OSError:
            continue
        owner = Owner(dist.normalized, dist.version)
        for line in record.splitlines():
            relative = line.rsplit(",", 2)[0] if line.count(",") >= 2 else line
            base = relative.rsplit("/", 1)[-1]
            if not (base.endswith(suffixes) or ".so." in base):
                continue
            owners[(site / relative).resolve()] = owner
    return owners


TORCH_SCRIPT = (
    "import json, torch\n"
    "flags = getattr(torch._C, '_cuda_getArchFlags', lambda: None)()\n"
    "print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda,"
    " 'arch_list': (flags or '').split()}))\n"
)


@dataclass(frozen=True)
class TorchBuild:
    """What the interpreter's torch was built for: ``arch_list`` is what
    ``torch.cuda.get_arch_list()`` returns on a GPU machine (``['sm_80', ..., 'compute_120']``),
    read from ``torch._C._cuda_getArchFlags()``, which answers without a GPU too; [] for a
    CPU build."""

    version: str
    cuda: str | None
    arch_list: tuple[str, ...]


def torch_build(python: Sequence[str], timeout: float = 120.0) -> TorchBuild | str:
    """Import torch in a subprocess of ``python`` (seconds: torch's import) and read its build;
    the reason as text when it cannot (no torch, a timeout). Same reading as
    ``python -c 'import torch; print(torch.cuda.get_arch_list())'`` on a GPU machine."""
    doc, why = run_json([*python, "-c", TORCH_SCRIPT], timeout)
    try:
        return TorchBuild(
            str(doc["version"]),
            None if doc["cuda"] is None else str(doc["cuda"]),
            tuple(str(a) for a in doc["arch_list"]),
        )
    except (KeyError, TypeError):
        return why or "torch answered something else"
