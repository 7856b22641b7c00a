"""``sparkdiag config default|check``: the configuration file, written out and validated."""

from __future__ import annotations

from pathlib import Path

import click

from sparkdiag.config import default_config_text
from sparkdiag.flags import path_type


@click.group()
def config() -> None:
    """Configuration helpers.

    Exit status: 0 done; 2 the configuration file is wrong (config check names the file and
    key, the value and what is wrong).
    """


@config.command("default")
def config_default() -> None:
    """Print the default configuration, every key commented, as TOML.

    Start a configuration with: sparkdiag config default > /etc/sparkdiag/config.toml

    Exit status: 0 printed; 2 a usage error (an unknown flag or argument).
    """
    click.echo(default_config_text(), nl=False)


@config.command("check")
@click.argument("file", type=path_type())  # a directory: one line, as a missing file
def config_check(file: Path) -> None:
    """Validate a configuration file as serve reads it: every key and value, and every file or
    directory it names (fixtures, web config, paths) opened as serve opens them.

    Exit status: 0 valid: every key and value is allowed, and every file and directory it names
    opens as serve opens it; 2 it is wrong or cannot be read (one line naming the file and key,
    the value and what is wrong).
    """
    from sparkdiag.commands.serve import serve_settings

    settings = serve_settings(file, {}, every_input=True)
    click.echo(f"{file}: ok (listen {settings.listen}, poll every {settings.poll_interval:g} s)")
