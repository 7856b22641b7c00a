"""The ``sparkdiag`` command line: the click group, and the one place every command is registered.

Each command lives in its own module under :mod:`sparkdiag.commands`, imported when the command
is run (or listed by ``--help``): ``sparkdiag serve`` does not pay for importing ``check``,
``watch`` or ``link``.
"""

from __future__ import annotations

import importlib
import sys
from typing import IO, Any, TextIO, cast

import click

from sparkdiag import __version__, terminal
from sparkdiag.errors import Exit, SparkdiagError
from sparkdiag.lifecycle import LIFECYCLE


class _Failed(click.ClickException):
    """A :class:`SparkdiagError` as click shows it: ``Error: message`` on standard error, one
    line in a pipe or a log, wrapped at words to the width of a terminal (a 280-column line
    was wrapped mid-word by the terminal itself)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it a class variable

    def show(self, file: IO[Any] | None = None) -> None:
        stream = sys.stderr if file is None else file
        line = f"Error: {self.format_message()}"
        if stream.isatty():
            line = terminal.fill(line, terminal.width(cast(TextIO, stream)), "", "    ")
        click.echo(line, file=stream)


# Every command: its name, and the module under sparkdiag.commands and the attribute that hold it.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("serve", "serve"),
    "dump": ("serve", "dump"),
    "record-fixture": ("fixture", "record_fixture"),
    "config": ("configure", "config"),
    "check": ("check", "check"),
    "probe": ("probe", "probe"),
    "bench": ("bench", "bench"),
    "compare": ("compare", "compare"),
    "baseline": ("baseline", "baseline"),
    "assets": ("assets", "assets"),
    "watch": ("watch", "watch"),
    "soak": ("soak", "soak"),
    "fleet": ("fleet", "fleet"),
    "link": ("link", "link"),
    "native": ("native", "native"),
    "storage": ("storage", "storage"),
    "nvme-log": ("nvme_log", "nvme_log"),
}


class _Group(click.Group):
    """The command group, and the one place a command's ending becomes the process's status.

    A command returns its :class:`Exit` (or, for ``watch``, its job's status; nothing is OK) or
    raises a :class:`SparkdiagError`, which becomes one line on standard error and its status.
    SIGINT and SIGTERM are the group's too (:meth:`Lifecycle.owning`): they interrupt the
    command, which exits INTERRUPTED (130), not click's 1 or the signal's own death, unless the
    command stops by itself (:meth:`Lifecycle.stop_on_signal`) and returns its own status.
    Commands are imported when first asked for (:data:`COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(f"sparkdiag.commands.{module}"), attr)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        # click suggests a close name from the commands it has loaded, which here (lazy) are
        # none: give it every name, so that "sparkdiag chek" asks "Did you mean 'check'?"
        name = click.utils.make_str(args[0]) if args else ""
        known = self.list_commands(ctx)
        if name and not name.startswith("-") and name not in known and not ctx.resilient_parsing:
            import difflib  # only for a command that does not exist

            close = difflib.get_close_matches(name, known)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise click.UsageError(f"No such command {name!r}.{hint}", ctx)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        with LIFECYCLE.owning():
            try:
                status = super().invoke(ctx)
            except SparkdiagError as exc:
                raise _Failed(terminal.safe(exc.line()), int(exc.exit_code)) from None
            except KeyboardInterrupt:  # Interrupted: SIGINT or SIGTERM
                raise _Failed("interrupted", Exit.INTERRUPTED) from None
        if status:
            ctx.exit(int(status))
        return status


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


if __name__ == "__main__":  # pragma: no cover
    main()
