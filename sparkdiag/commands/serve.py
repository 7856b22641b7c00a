"""``sparkdiag serve`` (the exporter daemon) and ``sparkdiag dump`` (one poll, printed)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from sparkdiag.config import ConfigError
from sparkdiag.flags import settings_from, settings_options
from sparkdiag.sources.fixture import FixtureError
from sparkdiag.web.webconfig import WebConfigError


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@click.command()
@settings_options("serve", config_file=True)
def serve(config: Path | None, **given: Any) -> None:
    """Run the exporter daemon until SIGTERM or Ctrl-C.

    Exit status: 0 after a clean stop, 1 when it cannot start (port in use), 2 for a
    configuration or usage error (the systemd unit does not restart on 2).
    """
    from sparkdiag import daemon

    settings = settings_from("serve", given, config)
    setup_logging(settings.log_level)
    try:
        daemon.serve(settings)
    except FixtureError as exc:
        raise click.BadParameter(str(exc), param_hint="--nvml-fixture") from None
    except (WebConfigError, ConfigError) as exc:
        raise click.UsageError(str(exc)) from None
    except daemon.StartupError as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@settings_options("dump")
def dump(**given: Any) -> None:
    """Poll once and print the metrics in the Prometheus text format to stdout."""
    from sparkdiag import daemon

    settings = settings_from("dump", given)
    setup_logging(settings.log_level)
    try:
        body = daemon.dump(settings)
    except FixtureError as exc:
        raise click.BadParameter(str(exc), param_hint="--nvml-fixture") from None
    sys.stdout.buffer.write(body)
    sys.stdout.flush()
