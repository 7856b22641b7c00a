"""``sparkdiag nvme-log``: read each NVMe drive's SMART log as root and leave it in a directory for
the daemon (``--nvme.log-dir``), which under the shipped systemd unit may not read it itself.
The root timer ``systemd/sparkdiag-nvme-log.timer`` runs it; :mod:`sparkdiag.sources.host.nvme_log`
says what is written.
"""

from __future__ import annotations

import json
from typing import Any

import click

from sparkdiag import terminal
from sparkdiag.errors import Exit, SparkdiagError, UsageError
from sparkdiag.flags import settings_from, settings_options
from sparkdiag.sources.host.nvme_log import prepare, write_logs
from sparkdiag.sources.host.nvme_tools import NO_TOOL, installed_tools, own_sysfs


@click.command("nvme-log")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead of text.")
@settings_options("nvme-log")
def nvme_log(as_json: bool, **given: Any) -> Exit:
    """Read each NVMe drive's SMART / health log and write it to --nvme.log-dir, for a daemon
    that may not read it itself.

    The log needs root (an NVMe admin command), which the daemon under the shipped systemd
    unit does not have: run this as root, as systemd/sparkdiag-nvme-log.timer does every 5
    minutes, and give the daemon --nvme.log-dir with the same directory; it exports each
    file's age (sparkdiag_nvme_smart_log_age_seconds) and leaves out a file older than
    --nvme.log-max-age.

    Per drive under /sys/class/nvme it writes DIR/nvme0.smartctl.json (smartctl --json -a
    /dev/nvme0; preferred: it also has the temperature thresholds) or DIR/nvme0.nvme-cli.json
    (nvme smart-log -o json), replaced whole, mode 0644. A drive neither tool read this time
    keeps its last file, which ages until the daemon leaves it out and
    SparkdiagNvmeSmartLogStale fires.

    \b
    Exit status:
      0  every drive's log written (or no NVMe drive: nothing to do)
      1  a drive's log could not be read (it says why; the timer's unit fails)
      2  usage error
      3  neither smartctl nor nvme is installed, --path.sysfs is not /sys, or
         the directory cannot be written
    """
    settings = settings_from("nvme-log", given)
    directory = settings.nvme_log_dir
    if directory is None:  # a config file's empty value: the command's own default is a path
        raise UsageError("give the directory to write to", flag="--nvme.log-dir")
    if not own_sysfs(settings.sysfs):
        raise SparkdiagError(f"--path.sysfs {settings.sysfs} is not /sys: the tools read /dev")
    smartctl, nvme = installed_tools()
    if smartctl is None and nvme is None:
        raise SparkdiagError(f"{NO_TOOL}: apt-get install smartmontools")
    try:
        prepare(directory)
        written = write_logs(directory, settings.sysfs, settings.rootfs, smartctl, nvme)
    except OSError as exc:
        raise SparkdiagError(f"cannot write to {directory}: {exc.strerror or exc}") from None
    missed = [w for w in written if w.path is None]
    if as_json:
        doc = {"directory": str(directory), "drives": [w.as_json() for w in written]}
        click.echo(json.dumps(doc, indent=2))
    else:
        width = terminal.width()
        if not written:
            click.echo(f"no NVMe drive under {settings.sysfs}/class/nvme: nothing to read")
        for w in written:
            said = (
                f"{w.controller}: {w.tool} log in {w.path}"
                if w.path
                else (f"{w.controller}: not read ({w.note}); its last file, if any, left to age")
            )
            click.echo(terminal.fill(said, width, hanging="    "))
    return Exit.ATTENTION if missed else Exit.OK
