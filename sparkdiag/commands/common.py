"""What several commands do the same way at run time: set up logging, find the GPUs ``--gpu``
names. (Their flags come from :mod:`sparkdiag.flags`; errors are raised, never translated here:
:mod:`sparkdiag.errors`.)"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from sparkdiag.errors import UsageError
from sparkdiag.snapshot import GpuSample

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str, prefix: str | None = None) -> None:
    """Log lines at ``level`` (a ``--log-level`` choice) and above on standard error.

    ``prefix`` gives short lines for an interactive command ("sparkdiag watch: message")
    instead of the daemon's timestamped ones.
    """
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format=LOG_FORMAT if prefix is None else f"{prefix}: %(message)s",
        stream=sys.stderr,
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
    from sparkdiag.sources.backends import make_backend
    from sparkdiag.sources.gpu import GpuSource

    source = GpuSource(make_backend(nvml_fixture))
    if not source.start():
        return choose_gpus([], chosen), source.unavailable_reason
    try:
        source.backend.advance()
        return choose_gpus([g for g in source.read() if g.up], chosen), None
    finally:
        source.stop()
