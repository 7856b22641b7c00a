"""The ``sparkdiag`` command line. Thin: it parses flags and calls into the modules."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from sparkdiag import __version__
from sparkdiag.config import ConfigError, default_config_text
from sparkdiag.exporter.webconfig import WebConfigError
from sparkdiag.flags import settings_from, settings_options
from sparkdiag.sources.fixture import FixtureError


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="sparkdiag")
def main() -> None:
    """GPU health and performance-regression diagnostics.

    sparkdiag polls NVML (temperatures, clocks, clock event reasons, power, PCIe, ECC, XID) and
    the host's PCIe links, and exports them for Prometheus. On a machine without an NVIDIA GPU
    it still exports host metrics, with sparkdiag_nvml_up 0.
    """


@main.command()
@settings_options("serve", config_file=True)
def serve(config: Path | None, **given: Any) -> None:
    """Run the exporter daemon until SIGTERM or Ctrl-C.

    Exit status: 0 after a clean stop, 1 when it cannot start (port in use), 2 for a
    configuration or usage error (the systemd unit does not restart on 2).
    """
    from sparkdiag import daemon

    settings = settings_from("serve", given, config)
    _setup_logging(settings.log_level)
    try:
        daemon.serve(settings)
    except FixtureError as exc:
        raise click.BadParameter(str(exc), param_hint="--nvml-fixture") from None
    except (WebConfigError, ConfigError) as exc:
        raise click.UsageError(str(exc)) from None
    except daemon.StartupError as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
@settings_options("dump")
def dump(**given: Any) -> None:
    """Poll once and print the metrics in the Prometheus text format to stdout."""
    from sparkdiag import daemon

    settings = settings_from("dump", given)
    _setup_logging(settings.log_level)
    try:
        body = daemon.dump(settings)
    except FixtureError as exc:
        raise click.BadParameter(str(exc), param_hint="--nvml-fixture") from None
    sys.stdout.buffer.write(body)
    sys.stdout.flush()


@main.command("record-fixture")
@click.argument("output", type=click.Path(dir_okay=False, writable=True, path_type=Path))
@click.option(
    "--description", default="", help="What the machine was doing (idle, under load ...)."
)
@settings_options("record-fixture")
def record_fixture(output: Path, description: str, **given: Any) -> None:
    """Record every NVML answer sparkdiag uses, errors included, into OUTPUT (JSON).

    Run it on a real GPU; replay the file with --nvml-fixture on any machine.
    """
    from sparkdiag.sources.backends import make_backend
    from sparkdiag.sources.nvml_api import NvmlUnavailable
    from sparkdiag.sources.record import record, write_atomic

    try:
        backend = make_backend(settings_from("record-fixture", given).nvml_fixture)
        doc = record(backend, description)
    except FixtureError as exc:
        raise click.BadParameter(str(exc), param_hint="--nvml-fixture") from None
    except NvmlUnavailable as exc:
        raise click.ClickException(f"cannot record: NVML is unavailable here ({exc})") from None
    try:
        write_atomic(output, doc)
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from None
    n = len(doc["devices"])
    click.echo(
        f"recorded {n} GPU{'s' if n != 1 else ''} (driver {doc['driver_version']}) to {output}"
    )


@main.group()
def config() -> None:
    """Configuration helpers."""


@config.command("default")
def config_default() -> None:
    """Print the default configuration, every key commented, as TOML.

    Start a configuration with: sparkdiag config default > /etc/sparkdiag/config.toml
    """
    click.echo(default_config_text(), nl=False)


@config.command("check")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def config_check(file: Path) -> None:
    """Validate a configuration file; exit 2 with the bad key and value when it is wrong."""
    settings = settings_from("serve", {}, file)
    click.echo(f"{file}: ok (listen {settings.listen}, poll every {settings.poll_interval:g} s)")


def _register() -> None:
    from sparkdiag.assets_command import assets
    from sparkdiag.check.command import check
    from sparkdiag.probe.commands.baseline import baseline
    from sparkdiag.probe.commands.bench import bench
    from sparkdiag.probe.commands.probe import probe
    from sparkdiag.probe.compare.command import compare
    from sparkdiag.soak.command import soak
    from sparkdiag.watch.command import watch

    for command in (check, probe, bench, compare, baseline, assets, watch, soak):
        main.add_command(command)


_register()

if __name__ == "__main__":  # pragma: no cover
    main()
