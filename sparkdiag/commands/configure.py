"""``sparkdiag config default|check``: the configuration file, written out and validated."""

from __future__ import annotations

from pathlib import Path

import click

from sparkdiag.config import default_config_text
from sparkdiag.flags import settings_from


@click.group()
def config() -> None:
    """Configuration helpers.

    Exit status: 0 done; 2 the configuration file is wrong (config check names the key, the
    value and what is allowed).
    """


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
