"""``sparkdiag nvme-log``: each NVMe drive's SMART log, read as root and left in a directory for a
daemon that may not read it itself.

The SMART / health log needs root (an NVMe admin command: CAP_SYS_ADMIN), which the daemon under
the shipped systemd unit (a dynamic user, no capabilities, ``DevicePolicy=closed``) does not
have, so its SMART alerts could never fire there. The root timer ``sparkdiag-nvme-log.timer``
runs this every few minutes; the daemon reads the files with ``--nvme.log-dir``
(:func:`~sparkdiag.sources.host.nvme_tools.log_dir_reader`), each with its age. node_exporter's
textfile collector is the same split: a privileged job writes, the exporter reads.

Per controller under ``/sys/class/nvme``: ``DIR/nvme0.smartctl.json`` (smartctl's JSON,
parsed and written again; preferred: it carries the temperature thresholds) or
``DIR/nvme0.nvme-cli.json``, replaced atomically (a reader sees the old file or the new one),
mode 0644 in a 0755 directory; the other tool's file of that controller, and the files of a
controller no longer there, are removed. A controller neither tool read this time keeps its
last file: it ages, the daemon drops its health past ``--nvme.log-max-age`` and
``SparkdiagNvmeSmartLogStale`` fires (removing it made a failing drive's alerts resolve with
nothing in their place: no file, no age, no alert; found in a review).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkdiag.sources.host.nvme import controller_names
from sparkdiag.sources.host.nvme_tools import RECORDED, read_with_tools
from sparkdiag.statedir import write_atomically

FILE_MODE = 0o644  # the daemon's dynamic user reads them
DIR_MODE = 0o755
_FILE = re.compile(r"^(nvme\d+)\.(smartctl|nvme-cli)\.json$")


@dataclass(frozen=True)
class Written:
    """One controller: the file written and by which tool, or why none (``note``)."""

    controller: str
    path: Path | None
    tool: str | None
    note: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "device": self.controller,
            "file": None if self.path is None else str(self.path),
            "tool": self.tool,
            "note": self.note,
        }


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def prepare(directory: Path) -> None:
    """The directory, made when missing with each directory made 0755 (whatever the umask: the
    daemon's user must reach it); OSError where it cannot be, or is no directory. An existing
    one keeps its mode (systemd's RuntimeDirectoryMode=)."""
    missing = [d for d in (directory, *directory.parents) if not d.is_dir()]
    for made in reversed(missing):
        made.mkdir(mode=DIR_MODE)
        os.chmod(made, DIR_MODE)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(13, "not writable", str(directory))


def write_logs(
    directory: Path,
    sysfs: Path,
    rootfs: Path,
    smartctl: str | None,
    nvme: str | None,
) -> list[Written]:
    """Read every controller under ``sysfs`` with the tools given and write its log to
    ``directory`` (made ready by :func:`prepare`); one :class:`Written` per controller, in
    order. OSError when a file cannot be written."""
    names = controller_names(sysfs)
    for stale in directory.iterdir():
        match = _FILE.match(stale.name)
        if match and match.group(1) not in names:  # a drive that is gone
            _remove(stale)
    written = []
    for name in names:
        reading, found = read_with_tools(smartctl, nvme, str(rootfs / "dev" / name))
        paths = {tool: directory / f"{name}{suffix}" for tool, suffix, _parse in RECORDED}
        if found is None:  # its last file, if any, stays and ages
            written.append(Written(name, None, None, reading.note or "no tool answered"))
            continue
        tool, doc = found
        text = json.dumps(doc, indent=1, sort_keys=False) + "\n"
        write_atomically(paths[tool], text.encode(), mode=FILE_MODE)
        for other, path in paths.items():
            if other != tool:
                _remove(path)
        written.append(Written(name, paths[tool], tool))
    return written
