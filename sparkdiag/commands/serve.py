"""``sparkdiag serve`` (the exporter daemon) and ``sparkdiag dump`` (one poll, printed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from sparkdiag.commands.common import setup_logging
from sparkdiag.flags import settings_from, settings_options


@click.command()
@settings_options("serve", config_file=True)
def serve(config: Path | None, **given: Any) -> None:
    """Run the exporter daemon until SIGTERM or Ctrl-C.

    Exit status: 0 after a clean stop, by SIGTERM, Ctrl-C (SIGINT) or SIGQUIT alike (stopping is
    how a daemon ends, and systemd counts 0 a success; the other commands exit 130 on Ctrl-C
    because it cut their work short), 1 when it cannot start (port in use), 2 for a
    configuration or usage error (the systemd unit does not restart on 2).
    """
    from sparkdiag import daemon

    settings = settings_from("serve", given, config)
    setup_logging(settings.log_level)
    daemon.serve(settings)


@click.command()
@settings_options("dump")
def dump(**given: Any) -> None:
    """Poll once and print the metrics in the Prometheus text format to stdout.

    Exit status: 0 printed (a machine without a GPU still prints its host metrics), 2 for a
    bad flag or fixture.
    """
    from sparkdiag import daemon

    settings = settings_from("dump", given)
    setup_logging(settings.log_level)
    body = daemon.dump(settings)
    sys.stdout.buffer.write(body)
    sys.stdout.flush()
