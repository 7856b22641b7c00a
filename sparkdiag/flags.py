"""Command-line flags generated from :data:`sparkdiag.config.OPTIONS`, for every command.

A setting is declared once, as an :class:`~sparkdiag.config.Option`; each command that takes it
(its ``scopes``) gets the same flag, with the same spelling, type, validation and help, plus the
command's own default and help where the Option gives one. Commands call :func:`settings_options`
to add the flags and :func:`settings_from` to turn what was given into
:class:`~sparkdiag.config.Settings` (defaults, then ``--config``, then flags).

The probe worker's own flags (``--dtype``, ``--shape``, ``--small``, ``--device``, ``--iters``
...), taken by ``probe``, ``bench``, ``compare`` and ``soak``, come from :func:`worker_options`:
each is declared once, in the worker's ``FLAGS`` table, and validated by the worker module's own
parsers and minimums, so that a value the worker would reject is a usage error here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from sparkdiag.config import (
    OPTIONS,
    OPTIONS_BY_ATTR,
    OPTIONS_BY_KEY,
    ConfigError,
    Option,
    Settings,
    load_file,
    merge_settings,
)
from sparkdiag.errors import UsageError as SparkdiagUsageError

if TYPE_CHECKING:
    from sparkdiag.probe.worker.contract import Flag

F = TypeVar("F", bound=Callable[..., Any])


class PathParam(click.Path):
    """click's Path that refuses an empty value: the type of every path flag and argument.

    click.Path with ``path_type=Path`` turns '' into '.', so an unset shell variable
    (``--storage "$DIR"``) meant the current directory: a test file, assets, state or a plot
    written where the command happened to run, and a file flag answered "Error: .: not a
    regular file (a directory)" (found in a review). A usage error names the flag instead. An
    empty value in the configuration file still means "not set" (``Option.convert``): this
    type sees the command line only."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (str, bytes)) and not value:
            if self.dir_okay and not self.file_okay:
                what = "a directory ('.' for the current one)"
            elif self.file_okay and not self.dir_okay:
                what = "a file"
            else:
                what = "a path ('.' for the current directory)"
            self.fail(f"is empty; give {what}", param, ctx)
        return super().convert(value, param, ctx)


def path_type(
    dir_okay: bool = True, file_okay: bool = True, allow_dash: bool = False, as_text: bool = False
) -> PathParam:
    """The path type of a flag or argument (:class:`PathParam`): a ``Path``, or with
    ``as_text`` the string as given (a trailing slash kept)."""
    return PathParam(
        dir_okay=dir_okay,
        file_okay=file_okay,
        allow_dash=allow_dash,
        path_type=None if as_text else Path,
    )


_TYPES: dict[str, Any] = {
    "float": float,
    "int": int,
    "path": path_type(),
    "str": str,
    "listen": str,
    "argv": str,
}


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return " ".join(value)
    return str(value)


def click_option(option: Option, command: str) -> Callable[[F], F]:
    """One click flag for ``option`` as ``command`` takes it (default None: "not given")."""
    default = option.default_for(command)
    parts = [option.help, option.command_help.get(command, "")]
    if option.kind == "argv":
        parts.append("Given as one string on the command line, split like a shell would.")
    if default is not None:
        parts.append(f"[default: {_shown(default)}]")
    help_text = " ".join(p for p in parts if p)
    flag = f"--{option.key}"
    if option.kind == "bool":
        return click.option(f"{flag}/--no-{option.key}", option.attr, default=None, help=help_text)
    # any case: a level or mode is the same word in capitals ('--log-level DEBUG' was refused:
    # found in a review); click gives the command the choice as declared
    kind = (
        click.Choice(option.choices, case_sensitive=False)
        if option.kind == "choice"
        else _TYPES[option.kind]
    )
    if option.unit == "bytes":
        kind = str  # "256M", "1G": Option.convert reads the unit
    return click.option(
        flag, option.attr, type=kind, default=None, help=help_text, metavar=option.metavar
    )


def path_option(
    flag: str, dest: str, help: str, metavar: str = "PATH", dir_okay: bool = True
) -> Callable[[F], F]:
    """``--flag PATH``: a path given to the command as ``dest``, or None; ``dir_okay=False``
    refuses a directory."""
    return click.option(
        flag,
        dest,
        type=path_type(dir_okay=dir_okay),
        default=None,
        metavar=metavar,
        help=help,
    )


def file_option(flag: str, dest: str, help: str, metavar: str = "FILE") -> Callable[[F], F]:
    """``--flag FILE``: a file path (not a directory) given to the command as ``dest``, or None."""
    return path_option(flag, dest, help, metavar, dir_okay=False)


def plot_option(metavar: str, help: str) -> Callable[[F], F]:
    """``--plot``: a path given as a string, so that a trailing slash (a directory the command
    creates) survives (click.Path with ``path_type=Path`` drops it); soak's and watch's."""
    return click.option(
        "--plot", "plot_to", type=path_type(as_text=True), default=None, metavar=metavar, help=help
    )


def parse_gpus(values: Sequence[str]) -> tuple[int, ...] | None:
    """``--gpu`` as given (repeatable): ``all`` or nothing -> None (every GPU); ``N``, ``N,M``
    and ``--gpu 0 --gpu 2`` -> NVML indices, in order, once each. ValueError says what is wrong,
    an empty value included.
    """
    # an empty value ('--gpu "$GPUS"' with the variable unset) meant every GPU (found in a
    # review): only no --gpu at all, or all, means that
    if any(not value.replace(",", "").strip() for value in values):
        raise ValueError("a value is empty: give all, N or N,M (NVML indices), or no --gpu")
    words = [w.strip().lower() for value in values for w in value.split(",") if w.strip()]
    if not words or words == ["all"]:
        return None
    if "all" in words:
        raise ValueError("give all or GPU indices, not both")
    indices: list[int] = []
    for word in words:
        if not (word.isascii() and word.isdigit()):
            raise ValueError(f"{word!r} is not a GPU index: give all, N or N,M (NVML indices)")
        if int(word) not in indices:
            indices.append(int(word))
    return tuple(indices)


def _gpus(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> Any:
    try:
        return parse_gpus(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def gpu_option(help: str) -> Callable[[F], F]:
    """``--gpu all|N|N,M`` (repeatable), given to the command as ``gpus``: a tuple of NVML
    indices, or None for every GPU. The same flag for every command that takes GPUs."""
    return click.option(
        "--gpu",
        "gpus",
        multiple=True,
        callback=_gpus,
        metavar="all|N|N,M",
        help=f"{help} NVML indices, comma separated or repeated (--gpu 0 --gpu 2) [default: all].",
    )


def settings_options(command: str, config_file: bool = False) -> Callable[[F], F]:
    """Every setting ``command`` takes, as click flags (plus ``--config`` when asked)."""

    def decorate(fn: F) -> F:
        for option in reversed(OPTIONS):
            if command in option.scopes:
                fn = click_option(option, command)(fn)
        if config_file:
            fn = file_option(
                "--config",
                "config",
                "TOML configuration file (keys as in 'sparkdiag config default'); flags win "
                "over it.",
            )(fn)
        return fn

    return decorate


def settings_from(
    command: str,
    given: dict[str, Any],
    config: Path | None = None,
    inputs: Callable[[Settings], None] | None = None,
) -> Settings:
    """Settings for ``command`` from its defaults, ``config`` and the flags given.

    ``given`` holds the command's keyword arguments; the setting flags are taken out of it (so
    what remains is the command's own arguments). A bad value raises
    :class:`~sparkdiag.config.ConfigError` (a usage error: exit 2) with the flag, the value and
    what is allowed. A directory setting that is not one, and whatever ``inputs`` raises (the
    command opening the files its settings name: ``serve``'s fixtures and web config), is a
    usage error too: it names the flag, or, where the value came from ``config``, the file and
    the key (``config.toml: path.sysfs: ...``), since the user has no such flag to look for.
    """
    flags: dict[str, Any] = {}
    for attr in list(given):
        if attr in OPTIONS_BY_ATTR:
            value = given.pop(attr)
            if value is not None:
                flags[attr] = value
    from_file = load_file(config) if config is not None else {}
    settings = merge_settings(from_file, flags, command)
    try:
        _check_directories(settings, command)
        if inputs is not None:
            inputs(settings)
    except SparkdiagUsageError as exc:
        # the setting to blame: the error's flag, or the key its message starts with
        key = exc.flag.removeprefix("--") if exc.flag else exc.message.partition(": ")[0]
        option = OPTIONS_BY_KEY.get(key)
        # a flag given wins over the file: then the flag is to blame, as the error says
        if config is None or option is None or option.attr not in from_file.keys() - flags:
            raise
        message = f"{key}: {exc.message}" if exc.flag else exc.message
        raise ConfigError(f"{config}: {message}") from None
    return settings


def _check_directories(settings: Settings, command: str) -> None:
    """A directory option given (flag or file) that is not a directory is a usage error, for
    every command that takes it: ``dump`` and ``check`` read nothing from a mistyped
    ``--path.sysfs`` and said nothing (exit 0 with skips), where ``link lint`` exited 2. Only a
    value that was given is checked, never a default."""
    for option in OPTIONS:
        if not option.existing_dir:
            continue
        value = getattr(settings, option.attr)
        if value is None or value == option.default_for(command) or Path(value).is_dir():
            continue
        if not Path(value).exists():
            # a dangling link or a loop of links "did not exist" where it plainly does
            why = (
                "is a symbolic link to nothing (or a loop)"
                if os.path.lexists(value)
                else "does not exist"
            )
        else:
            why = "is not a directory"
        raise SparkdiagUsageError(f"{value} {why}; give a directory", flag=f"--{option.key}")


# -- the worker's flags ---------------------------------------------------------------------


# The worker module (its flag table and parsers) is imported by the functions below, which only
# the commands that run the worker call: ``serve`` takes settings flags only and never loads it.


def _dtypes(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> list[str]:
    """Repeatable and comma separated: ``--dtype bf16,fp8 --dtype int4``; ``all`` for all."""
    from sparkdiag.probe.worker.contract import UsageError, parse_dtypes

    try:
        return parse_dtypes(values)
    except UsageError as exc:
        raise click.BadParameter(str(exc)) from None


def _shapes(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> list[str]:
    from sparkdiag.probe.worker.contract import UsageError, parse_shape, shape_label

    out = []
    for value in values:
        try:
            out.append(shape_label(*parse_shape(value)))
        except UsageError as exc:
            raise click.BadParameter(str(exc)) from None
    return out


def _device(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    if value in ("cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit()):
        return value
    raise click.BadParameter(f"{value!r}: expected cpu, cuda or cuda:N")


# The worker parses these after argparse; the click flag checks the same rule at once.
_CALLBACKS: dict[str, Callable[..., Any]] = {
    "--dtype": _dtypes,
    "--shape": _shapes,
    "--device": _device,
}


class FiniteRange(click.FloatRange):
    """click's FloatRange without NaN and the infinities: NaN passes every comparison, so a
    FloatRange took ``--interval nan`` (watch then ticked at full speed) and, without a maximum,
    ``inf`` (the bad-input review)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


def _click_type(flag: Flag) -> Any:
    if flag.kind == "int":
        return click.IntRange(min=None if flag.minimum is None else int(flag.minimum))
    if flag.kind == "float":
        return FiniteRange(min=flag.minimum, min_open=flag.above)
    return click.Choice(flag.choices) if flag.kind == "choice" else str


def worker_option(
    name: str, default: Any = None, help: str | None = None, shown: str | None = None
) -> Callable[[F], F]:
    """The click flag of the worker's flag ``name`` (``--dtype``), declared in ``worker.FLAGS``:
    its spelling, kind, minimum and help from there, given to the command as ``Flag.field``.
    ``default`` is the command's own (None: the worker decides), ``help`` replaces the worker's
    sentence where the command means something narrower, ``shown`` the default it shows."""
    from sparkdiag.probe.worker.contract import FLAGS_BY_NAME

    flag = FLAGS_BY_NAME[name]
    text = help or flag.help
    if default is not None and shown is None:
        shown = ",".join(default) if isinstance(default, (list, tuple)) else _shown(default)
    shown = shown or flag.cli_default
    if flag.kind == "switch":
        return click.option(name, flag.field, is_flag=True, help=text)
    if shown:
        text = f"{text} [default: {shown}]"
    if flag.kind == "toggle":
        return click.option(f"{name}/--no-{name[2:]}", flag.field, default=default, help=text)
    return click.option(
        name,
        flag.field,
        type=_click_type(flag),
        multiple=flag.repeat,
        default=tuple(default or ()) if flag.repeat else default,
        callback=_CALLBACKS.get(name),
        metavar=flag.metavar,
        help=text,
    )


def worker_options(
    *names: str, shown: dict[str, str] | None = None, **defaults: Any
) -> Callable[[F], F]:
    """The worker's flags ``names`` (``"--dtype", "--small"``) for a command; ``defaults`` maps a
    flag's field (``dtypes=("bf16",)``) to the command's own default, ``shown`` a flag's name
    (``"--device"``) to the default its help states, where the command decides it."""
    from sparkdiag.probe.worker.contract import FLAGS_BY_NAME

    by_field = {FLAGS_BY_NAME[name].field: name for name in names}
    unknown = set(defaults) - set(by_field)
    assert not unknown, f"defaults for flags not asked for: {unknown}"
    shown = shown or {}
    assert not set(shown) - set(names), f"shown defaults for flags not asked for: {shown}"
    decorators = [
        worker_option(name, defaults.get(FLAGS_BY_NAME[name].field), shown=shown.get(name))
        for name in names
    ]

    def decorate(fn: F) -> F:
        for decorator in reversed(decorators):
            fn = decorator(fn)
        return fn

    return decorate
