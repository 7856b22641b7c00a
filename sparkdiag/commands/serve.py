"""``sparkdiag serve`` (the exporter daemon) and ``sparkdiag dump`` (one poll, printed)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import click

from sparkdiag.commands.common import setup_logging
from sparkdiag.config import ConfigError, Settings, parse_listen
from sparkdiag.flags import settings_from, settings_options


def serve_settings(
    config: Path | None, given: dict[str, Any], *, every_input: bool = False
) -> Settings:
    """serve's settings, with every file they name opened as serve opens it (the NVML, probe and
    NVMe fixtures, the web config), the container command and the listen host checked as serve
    checks them (the host resolved, not bound). ``serve`` and ``config check`` both
    take their settings from here, so that a file ``config check`` approves is one serve
    starts with, and a fixture serve would not read on this machine (the probe's, without a
    GPU) is refused all the same. A bad one is a usage error (exit 2) naming the flag, or the
    configuration file and key it came from. The probe's inputs are opened where the probe is
    on, or with ``every_input`` (``config check``): a daemon with ``--no-probe.enabled`` loads
    none of the probe's modules (tests/test_daemon_cost.py)."""
    return settings_from(
        "serve", given, config, inputs=lambda settings: _open_inputs(settings, every_input)
    )


def _open_inputs(settings: Settings, every_input: bool) -> None:
    if settings.nvml_fixture is not None:
        from sparkdiag.sources.nvml.backends import make_backend

        make_backend(settings.nvml_fixture)  # FixtureError
    if settings.nvme_fixture is not None:
        from sparkdiag.sources.host.nvme_tools import fixture_reader

        fixture_reader(settings.nvme_fixture)  # NvmeFixtureError
    if settings.web_config_file is not None:
        from sparkdiag.web.webconfig import load_web_config

        load_web_config(settings.web_config_file)  # WebConfigError
    if every_input and settings.state_dir is not None:
        # config check said "ok" of a file there; serve starts, warns and learns nothing,
        # retrying at every cycle (probe and check go on without a store as well: their choice)
        from sparkdiag.statedir import StateDirError, state_file

        try:
            state_file(settings.state_dir, "")
        except StateDirError as exc:
            raise ConfigError(
                f"state-dir: {exc.message} (serve would learn no baselines)"
            ) from None
    probe = every_input or settings.probe_enabled
    if probe and settings.probe_fixture is not None:
        from sparkdiag.probe.launchers import FixtureLauncher

        FixtureLauncher(settings.probe_fixture)  # ProbeFixtureError
    if probe and settings.probe_container_command:
        from sparkdiag.probe.launchers import ContainerLauncher
        from sparkdiag.probe.request import WorkerRequest

        try:
            command = settings.probe_container_command
            ContainerLauncher(command, settings.probe_timeout, WorkerRequest())
        except ValueError as exc:  # as the daemon's wiring says it
            raise ConfigError(f"probe.container-command: {exc}") from None
    from sparkdiag.web.http import listen_address

    # ListenError: no such host; OSError: the resolver does not answer now (serve exits 1 then,
    # and systemd retries)
    with contextlib.suppress(OSError):
        listen_address(parse_listen(settings.listen))


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

    settings = serve_settings(config, given)
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
