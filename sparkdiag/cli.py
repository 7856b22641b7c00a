"""The ``sparkdiag`` command line. Thin: it parses flags and calls into the modules."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from sparkdiag import __version__
from sparkdiag.config import DEFAULT_LISTEN, ConfigError, Settings
from sparkdiag.sources.fixture import FixtureError

F = TypeVar("F", bound=Callable[..., Any])


def _source_options(fn: F) -> F:
    """Flags every command that reads hardware shares."""
    options = [
        click.option(
            "--nvml-fixture",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="Replay NVML answers from this fixture (recorded by record-fixture) instead of "
            "asking the driver.",
        ),
        click.option(
            "--path.sysfs",
            "sysfs",
            type=click.Path(file_okay=False, path_type=Path),
            default=Path("/sys"),
            show_default=True,
            help="sysfs mount point to read PCIe links from (a fake tree for tests).",
        ),
        click.option(
            "--path.rootfs",
            "rootfs",
            type=click.Path(file_okay=False, path_type=Path),
            default=Path("/"),
            show_default=True,
            help="Root filesystem to detect the execution context (container or native) under.",
        ),
        click.option(
            "--log-level",
            type=click.Choice(["debug", "info", "warning", "error"]),
            default="info",
            show_default=True,
            help="Logging verbosity on stderr.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _settings(**kwargs: Any) -> Settings:
    try:
        return Settings(**kwargs)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="sparkdiag")
def main() -> None:
    """GPU health and performance-regression diagnostics.

    sparkdiag polls NVML (temperatures, clocks, clock event reasons, power, PCIe, ECC, XID) and
    the host's PCIe links, and exports them for Prometheus. On a machine without an NVIDIA GPU
    it still exports host metrics, with sparkdiag_nvml_up 0.
    """


@main.command()
@_source_options
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    help="HOST:PORT to serve /metrics, /healthz and / on. Use 0.0.0.0:PORT to let other hosts "
    "scrape it.",
)
@click.option(
    "--poll-interval",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between telemetry polls; scrapes render the latest poll and never wait.",
)
@click.option(
    "--pcie-interval",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds between reads of the host PCIe links in sysfs.",
)
def serve(
    nvml_fixture: Path | None,
    sysfs: Path,
    rootfs: Path,
    log_level: str,
    listen: str,
    poll_interval: float,
    pcie_interval: float,
) -> None:
    """Run the exporter daemon until SIGTERM or Ctrl-C."""
    from sparkdiag import daemon

    _setup_logging(log_level)
    settings = _settings(
        listen=listen,
        poll_interval=poll_interval,
        pcie_interval=pcie_interval,
        nvml_fixture=nvml_fixture,
        sysfs=sysfs,
        rootfs=rootfs,
    )
    try:
        daemon.serve(settings)
    except FixtureError as exc:
        raise click.BadParameter(str(exc), param_hint="--nvml-fixture") from None
    except daemon.StartupError as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
@_source_options
def dump(nvml_fixture: Path | None, sysfs: Path, rootfs: Path, log_level: str) -> None:
    """Poll once and print the metrics in the Prometheus text format to stdout."""
    from sparkdiag import daemon

    _setup_logging(log_level)
    settings = _settings(nvml_fixture=nvml_fixture, sysfs=sysfs, rootfs=rootfs)
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
    from sparkdiag.daemon import make_backend
    from sparkdiag.sources.nvml_api import NvmlUnavailable
    from sparkdiag.sources.record import record, write_atomic

    try:
        backend = make_backend(Settings(nvml_fixture=nvml_fixture))
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


if __name__ == "__main__":  # pragma: no cover
    main()
