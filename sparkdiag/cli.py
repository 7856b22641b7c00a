"""The ``sparkdiag`` command line: the click group, and the one place every command is registered.

Each command lives in its own module under :mod:`sparkdiag.commands`.
"""

from __future__ import annotations

from typing import Any

import click

from sparkdiag import __version__
from sparkdiag.errors import Exit, SparkdiagError


class _Failed(click.ClickException):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it a class variable


class _Group(click.Group):
    """The command group: a :class:`SparkdiagError` raised anywhere below becomes one line on
    standard error and its exit status, here and nowhere else; Ctrl-C that no command handles
    itself exits INTERRUPTED (130), not click's 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SparkdiagError as exc:
            raise _Failed(exc.line(), int(exc.exit_code)) from None
        except KeyboardInterrupt:
            raise _Failed("interrupted", Exit.INTERRUPTED) from None


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="sparkdiag")
def main() -> None:
    """GPU health and performance-regression diagnostics.

    sparkdiag polls NVML (temperatures, clocks, clock event reasons, power, PCIe, ECC, XID) and
    the host's PCIe links, and exports them for Prometheus. On a machine without an NVIDIA GPU
    it still exports host metrics, with sparkdiag_nvml_up 0.
    """


def _register() -> None:
    from sparkdiag.commands.assets import assets
    from sparkdiag.commands.baseline import baseline
    from sparkdiag.commands.bench import bench
    from sparkdiag.commands.check import check
    from sparkdiag.commands.compare import compare
    from sparkdiag.commands.configure import config
    from sparkdiag.commands.fixture import record_fixture
    from sparkdiag.commands.fleet import fleet
    from sparkdiag.commands.link import link
    from sparkdiag.commands.probe import probe
    from sparkdiag.commands.serve import dump, serve
    from sparkdiag.commands.soak import soak
    from sparkdiag.commands.watch import watch

    for command in (
        serve, dump, record_fixture, config, check, probe, bench, compare, baseline, assets, watch,
        soak, fleet, link,
    ):  # fmt: skip
        main.add_command(command)


_register()

if __name__ == "__main__":  # pragma: no cover
    main()
