"""The daemon's scan of the probe worker's libraries: once at start, in a thread of its own,
and again every few hours; never during a scrape (a scrape reads :attr:`LibraryWatch.latest`).

Which environment: under ``--path.rootfs`` other than ``/`` (a container with the host's root
mounted, or a fixture tree) the Pythons under that root; else the probe worker's interpreter
(``--probe.python``, default this one). A first scan of torch, its nvidia-* wheels and vLLM
reads the headers of some gigabytes of libraries; the cache in the state directory makes the
later ones read only what changed.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sparkdiag.sources.software.cuda_libraries import CACHE_NAME, LibraryScan, ScanCache, scan
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

    def scan_once(self) -> None:
        try:
            env = self.find()
            result = scan(env, ScanCache(self.cache_path))
        except (NotAnEnvironment, OSError) as exc:
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

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.scan_once()
            stop.wait(self.interval)
