"""The daemon's scan of the probe worker's libraries: once at start, in a thread of its own,
and again every few hours; never during a scrape (a scrape reads :attr:`LibraryWatch.latest`).

Which environment: under ``--path.rootfs`` other than ``/`` (a container with the host's root
mounted, or a fixture tree) the Pythons under that root; else the probe worker's interpreter
(``--probe.python``, default this one). A first scan of torch, its nvidia-* wheels and vLLM
reads the headers of some gigabytes of libraries; the cache in the state directory makes the
later ones read only what changed.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sparkdiag.native import scan_child
from sparkdiag.sources.software.cuda_libraries import CACHE_NAME, LibraryScan, scan_from_json
from sparkdiag.sources.software.pyenv import (
    NotAnEnvironment,
    PythonEnvironment,
    for_python,
    site_dirs_under,
    this_python,
)
from sparkdiag.statedir import StateDirError, state_directory

log = logging.getLogger(__name__)
RESCAN_SECONDS = 6 * 3600.0  # installs change rarely; a restart rescans at once
SCAN_CHILD = ("-m", "sparkdiag.native.scan_child")  # run by this Python
STOP_CHECK_SECONDS = 0.2  # how often a scan under way looks at the stop event
SCAN_TIMEOUT = 600.0  # a cold scan of the H200's torch environment took 2.83 s


class ScanFailed(Exception):
    """The scan's child process failed, hung or answered something else."""


def environment(rootfs: Path, python: Sequence[str] | None) -> PythonEnvironment:
    """The environment whose libraries the probe worker loads (see the module).

    A ``--probe.python`` of one word (an interpreter) is asked for its ``sys.path``; one with
    arguments (``conda run -n env python``, a wrapper script) is not run: it may do anything
    but answer, so NotAnEnvironment says to name the environment instead (``sparkdiag native
    --python``)."""
    if rootfs.resolve() != Path("/"):
        return PythonEnvironment(f"root {rootfs}", tuple(site_dirs_under(rootfs)), None, rootfs)
    if python and tuple(python) != (sys.executable,):
        if len(python) > 1:
            raise NotAnEnvironment(
                f"--probe.python {' '.join(python)!r} is a command, not an interpreter: its "
                "libraries are not scanned (sparkdiag native --python PATH names them)"
            )
        return for_python(python, "the probe worker's")
    return this_python()


def cache_path(state_dir: Path | None) -> Path | None:
    """The scan cache in ``state_dir`` (default: the state directory); None without one."""
    try:
        return (state_dir or state_directory()) / CACHE_NAME
    except StateDirError:
        return None


class LibraryWatch:
    """Keeps the latest :class:`LibraryScan` (``latest``), or why there is none (``error``)."""

    def __init__(
        self,
        find: Callable[[], PythonEnvironment],
        state_dir: Path | None,
        interval: float = RESCAN_SECONDS,
    ) -> None:
        self.find = find
        self.cache_path = cache_path(state_dir)
        self.interval = interval
        self.latest: LibraryScan | None = None
        self.error: str | None = None
        self.finished_at: float | None = None
        self.stop = threading.Event()  # set: a scan under way is killed (run() passes its own)

    def scan_once(self) -> None:
        try:
            env = self.find()
            result = self._scan(env)
        except (NotAnEnvironment, OSError, ScanFailed) as exc:
            if self.stop.is_set():
                return  # the daemon stops: the scan was killed, nothing to say
            self.error = str(exc)
            log.warning("CUDA library scan failed: %s", exc)
            return
        self.latest, self.error, self.finished_at = result, None, time.time()
        log.info(
            "CUDA libraries of %s: %d with GPU code in %d shared libraries (%d from the cache) "
            "in %.2f s",
            result.environment,
            len(result.libraries),
            result.files,
            result.cached,
            result.seconds,
        )

    def _scan(self, env: PythonEnvironment) -> LibraryScan:
        """The scan, in a child process (:mod:`sparkdiag.native.scan_child`: its memory goes
        back when it ends), killed after ``SCAN_TIMEOUT`` seconds or as soon as :attr:`stop` is
        set (a daemon stopping does not wait for a cold scan, nor leave it running)."""
        ask: str | None = json.dumps(scan_child.request(env, self.cache_path))
        child = subprocess.Popen(
            [sys.executable, *SCAN_CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + SCAN_TIMEOUT
        while True:
            try:  # again after a timeout: nothing read so far is lost, the input went once
                out, err = child.communicate(ask, timeout=STOP_CHECK_SECONDS)
                break
            except subprocess.TimeoutExpired:
                ask = None
                if self.stop.is_set() or time.monotonic() > deadline:
                    child.kill()
                    child.communicate()
                    if self.stop.is_set():
                        raise ScanFailed("stopped") from None
                    raise ScanFailed(f"the scan took longer than {SCAN_TIMEOUT:.0f} s") from None
        if child.returncode != 0:
            last = (err.strip().splitlines() or ["no message"])[-1]
            raise ScanFailed(f"the scan's process exited {child.returncode}: {last}")
        try:
            return scan_from_json(json.loads(out))
        except (ValueError, KeyError, TypeError) as exc:
            raise ScanFailed(f"the scan's process answered something else: {exc}") from None

    def run(self, stop: threading.Event) -> None:
        self.stop = stop
        while not stop.is_set():
            self.scan_once()
            stop.wait(self.interval)
