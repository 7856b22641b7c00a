"""The daemon's library scan, run as a child process: ``python -m sparkdiag.native.scan_child``
reads the environment to scan from standard input (JSON: ``described``, ``site_dirs``,
``python``, ``root``, ``cache``) and prints
:func:`~sparkdiag.sources.software.cuda_libraries.scan_json`.

A child because the scan reads every ``*.dist-info/RECORD`` and the headers of every shared
library: on the lent H200 (846 shared libraries, torch and its nvidia-* wheels) the daemon that
scanned in its own process sat 9.7 MiB above the RSS of sparkdiag's imports after the scan was
done (docs/daemon-cost.md); here a scan of this venv added 4.2 MiB that stayed. The child's
memory goes back when it exits; the daemon keeps only the result (the libraries with GPU code).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from sparkdiag.sources.software.cuda_libraries import ScanCache, scan, scan_json
from sparkdiag.sources.software.pyenv import PythonEnvironment


def request(env: PythonEnvironment, cache: Path | None) -> dict[str, Any]:
    """What the child is asked: ``env`` and the scan cache's path."""
    return {
        "described": env.described,
        "site_dirs": [str(d) for d in env.site_dirs],
        "python": None if env.python is None else list(env.python),
        "root": str(env.root),
        "cache": None if cache is None else str(cache),
    }


def main() -> int:
    doc = json.loads(sys.stdin.read())
    env = PythonEnvironment(
        str(doc["described"]),
        tuple(Path(d) for d in doc["site_dirs"]),
        None if doc["python"] is None else tuple(str(p) for p in doc["python"]),
        Path(doc["root"]),
    )
    cache = None if doc["cache"] is None else Path(doc["cache"])
    json.dump(scan_json(scan(env, ScanCache(cache))), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
