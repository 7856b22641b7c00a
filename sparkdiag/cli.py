"""The ``sparkdiag`` command line. Thin: it parses flags and calls into the modules."""

from __future__ import annotations

import logging
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from sparkdiag import __version__
from sparkdiag.config import (
    OPTIONS,
    ConfigError,
    Option,
    Settings,
    build_settings,
    default_config_text,
)
from sparkdiag.exporter.webconfig import WebConfigError
from sparkdiag.sources.fixture import FixtureError

F = TypeVar("F", bound=Callable[..., Any])
OPTION_ATTRS = {option.attr for option in OPTIONS}


def _click_option(option: Option) -> Callable[[F], F]:
    """A click flag generated from a config :class:`Option` (default None: "not given")."""
    default = option.default
    shown = "" if default is None else f" [default: {_shown(default)}]"
    help_text = f"{option.help}{shown}"
    flag = f"--{option.key}"
    if option.kind == "bool":
        return click.option(f"{flag}/--no-{option.key}", option.attr, default=None, help=help_text)
    types: dict[str, Any] = {
        "float": float,
        "int": int,
        "path": click.Path(path_type=Path),
        "choice": click.Choice(option.choices),
        "str": str,
        "listen": str,
        "argv": str,
    }
    if option.kind == "argv":
        help_text += " Given as one string on the command line, split like a shell would."
    return click.option(flag, option.attr, type=types[option.kind], default=None, help=help_text)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return " ".join(value)
    return str(value)


def _options(scope: str) -> Callable[[F], F]:
    """Every option of ``scope`` (a command name) as click flags, plus --config for serve."""

    def decorate(fn: F) -> F:
        for option in reversed(OPTIONS):
            if scope in option.scopes:
                fn = _click_option(option)(fn)
        return fn

    return decorate


def _settings(config: Path | None, given: dict[str, Any]) -> Settings:
    """Settings from the config file and the flags actually given; usage errors exit 2."""
    flags = {k: v for k, v in given.items() if v is not None and k in OPTION_ATTRS}
    for attr in ("probe_python", "probe_container_command"):
        if attr in flags:
            flags[attr] = shlex.split(flags[attr])
    try:
        return build_settings(config, flags)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


_CONFIG = click.option(
    "--config",
    "config",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="TOML configuration file (keys as in 'sparkdiag config default'); flags win over it.",
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
@_CONFIG
@_options("serve")
def serve(config: Path | None, **given: Any) -> None:
    """Run the exporter daemon until SIGTERM or Ctrl-C.

    Exit status: 0 after a clean stop, 1 when it cannot start (port in use), 2 for a
    configuration or usage error (the systemd unit does not restart on 2).
    """
    from sparkdiag import daemon

    settings = _settings(config, given)
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
@_options("dump")
def dump(**given: Any) -> None:
    """Poll once and print the metrics in the Prometheus text format to stdout."""
    from sparkdiag import daemon

    settings = _settings(None, given)
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
@click.option(
    "--nvml-fixture",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Re-record from a fixture instead of the driver (to normalise an old file).",
)
def record_fixture(output: Path, description: str, nvml_fixture: Path | None) -> None:
    """Record every NVML answer sparkdiag uses, errors included, into OUTPUT (JSON).

    Run it on a real GPU; replay the file with --nvml-fixture on any machine.
    """
    from sparkdiag.sources.backends import make_backend
    from sparkdiag.sources.nvml_api import NvmlUnavailable
    from sparkdiag.sources.record import record, write_atomic

    try:
        backend = make_backend(nvml_fixture)
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
    settings = _settings(file, {})
    click.echo(f"{file}: ok (listen {settings.listen}, poll every {settings.poll_interval:g} s)")


@main.command("assets")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite files that already exist.")
def assets(directory: Path, force: bool) -> None:
    """Write the shipped Prometheus rules, Grafana dashboards and provisioning files, the
    systemd unit and a commented default config.toml into DIRECTORY (for pip installs)."""
    from sparkdiag.assets import write_assets

    try:
        written = write_assets(directory, force)
    except (FileExistsError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    for path in written:
        click.echo(path)


def _register() -> None:
    from sparkdiag.check.command import check
    from sparkdiag.probe.commands import baseline, bench, probe
    from sparkdiag.probe.compare_command import compare
    from sparkdiag.watch.command import watch

    for command in (check, probe, bench, compare, baseline, watch):
        main.add_command(command)


_register()

if __name__ == "__main__":  # pragma: no cover
    main()
