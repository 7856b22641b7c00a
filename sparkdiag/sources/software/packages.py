"""Installed Python packages, read from their metadata and files without importing them.

An ``import torch`` costs seconds and initialises CUDA; the probe worker is the only place that
imports torch. Here the installed version comes from the package metadata and the CUDA torch
was built for from the text of ``torch/version.py``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from sparkdiag.sources.files import KIB, read_text_limited

# ``cuda: Optional[str] = '13.0'`` (or ``= None`` for a CPU-only build) in torch/version.py.
_TORCH_CUDA = re.compile(r"""^cuda\s*(?::[^=]*)?=\s*(?:['"]([^'"]*)['"]|None)\s*$""", re.M)


@dataclass(frozen=True)
class TorchInfo:
    """The torch that the probe worker would import, read without importing it.

    version: ``importlib.metadata.version("torch")`` ("2.11.0+cu130"); None when not installed
    cuda: the CUDA it was built for (``torch.version.cuda``: "13.0"); None for a CPU-only build
    python: the interpreter looked at
    """

    version: str | None
    cuda: str | None
    python: str


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` for this interpreter; None when not installed.

    Unit: none (the version string, "2.11.0+cu130"). Same reading as
    ``python -m pip show DISTRIBUTION`` ("Version:"), or
    ``python -c 'import importlib.metadata as m; print(m.version("DISTRIBUTION"))'``.
    """
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_cuda() -> str | None:
    """The CUDA version the installed torch was built for, read from ``torch/version.py``.

    Unit: none (a CUDA version, "13.0"). Same reading as
    ``python -c 'import torch; print(torch.version.cuda)'``, without the import: the package is
    located with ``importlib.util.find_spec`` and ``cuda = ...`` is read from the file's text.
    None for a CPU-only build, when torch is not installed, or when the file is unreadable.
    """
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        try:
            text = read_text_limited(Path(location) / "version.py", 64 * KIB)
        except OSError:
            continue
        match = _TORCH_CUDA.search(text)
        if match is not None:
            return match.group(1) or None
    return None


def read_torch(python: str = sys.executable) -> TorchInfo:
    """The torch installed for this interpreter (``python``), found without importing it.

    Units: none (version strings). Same reading as ``python -m pip show torch`` for the version
    and ``python -c 'import torch; print(torch.version.cuda)'`` for the CUDA it was built for
    (see :func:`installed_version` and :func:`torch_cuda`). ``version.py`` is only looked at
    when the torch distribution is installed.
    """
    version = installed_version("torch")
    if version is None:
        return TorchInfo(None, None, python)
    return TorchInfo(version, torch_cuda(), python)
