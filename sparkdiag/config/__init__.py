"""Settings: embedded defaults, a TOML file, and flags, in rising precedence.

Every option is declared once in :data:`OPTIONS`; the command-line flags, the TOML keys and the
commented default configuration (``sparkdiag config default``) are all generated from it. A TOML
key is the flag's name without the dashes in front (``poll-interval = 2.0``; ``path.sysfs`` is the
key ``sysfs`` in table ``[path]``). A bad value raises :class:`ConfigError` naming the key, the
value and what is allowed; the CLI turns it into exit status 2, which the systemd unit treats as
final (no restart loop).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from sparkdiag import safeload
from sparkdiag.config.option import (
    DEFAULT_LISTEN,
    DEFAULT_PORT,
    ECHO,
    ConfigError,
    Option,
    duration_seconds,
    echo,
    parse_listen,
)
from sparkdiag.config.table import DEFAULTS, OPTIONS, OPTIONS_BY_ATTR, OPTIONS_BY_KEY
from sparkdiag.terminal import wrap

__all__ = [
    "CONFIG_FILE_COMMANDS",
    "DEFAULTS",
    "DEFAULT_LISTEN",
    "DEFAULT_PORT",
    "ECHO",
    "OPTIONS",
    "OPTIONS_BY_ATTR",
    "OPTIONS_BY_KEY",
    "ConfigError",
    "Option",
    "Settings",
    "build_settings",
    "default_config_text",
    "duration_seconds",
    "echo",
    "load_file",
    "merge_settings",
    "parse_listen",
]


@dataclass(frozen=True)
class Settings:
    listen: str = DEFAULTS["listen"]
    poll_interval: float = DEFAULTS["poll_interval"]
    idle_poll_interval: float = DEFAULTS["idle_poll_interval"]
    pcie_interval: float = DEFAULTS["pcie_interval"]
    nvml_fixture: Path | None = DEFAULTS["nvml_fixture"]
    sysfs: Path = DEFAULTS["sysfs"]
    rootfs: Path = DEFAULTS["rootfs"]
    log_level: str = DEFAULTS["log_level"]
    state_dir: Path | None = DEFAULTS["state_dir"]
    web_config_file: Path | None = DEFAULTS["web_config_file"]
    web_max_requests: int = DEFAULTS["web_max_requests"]
    probe_enabled: bool = DEFAULTS["probe_enabled"]
    probe_interval: float = DEFAULTS["probe_interval"]
    probe_when: str = DEFAULTS["probe_when"]
    probe_busy_utilization: float = DEFAULTS["probe_busy_utilization"]
    probe_timeout: float = DEFAULTS["probe_timeout"]
    probe_python: tuple[str, ...] | None = DEFAULTS["probe_python"]
    probe_container_command: tuple[str, ...] | None = DEFAULTS["probe_container_command"]
    probe_container_interval: float = DEFAULTS["probe_container_interval"]
    probe_fixture: Path | None = DEFAULTS["probe_fixture"]
    probe_first_delay: float = DEFAULTS["probe_first_delay"]
    web_read_timeout: float = DEFAULTS["web_read_timeout"]
    web_max_connections: int = DEFAULTS["web_max_connections"]
    baseline_history_runs: int = DEFAULTS["baseline_history_runs"]
    baseline_history_days: float = DEFAULTS["baseline_history_days"]
    probe_hot_enabled: bool = DEFAULTS["probe_hot_enabled"]
    probe_hot_memory_celsius: float = DEFAULTS["probe_hot_memory_celsius"]
    probe_hot_gpu_celsius: float = DEFAULTS["probe_hot_gpu_celsius"]
    probe_hot_interval: float = DEFAULTS["probe_hot_interval"]
    probe_hot_min_interval: float = DEFAULTS["probe_hot_min_interval"]
    peer: str | None = DEFAULTS["peer"]
    link_secret_file: Path | None = DEFAULTS["link_secret_file"]
    process_metrics: bool = DEFAULTS["process_metrics"]
    process_metrics_top: int = DEFAULTS["process_metrics_top"]
    compat_dcgm: bool = DEFAULTS["compat_dcgm"]
    prometheus_url: str = DEFAULTS["prometheus_url"]
    http_config_file: Path | None = DEFAULTS["http_config_file"]
    prometheus_ca_file: Path | None = DEFAULTS["prometheus_ca_file"]
    prometheus_cert_file: Path | None = DEFAULTS["prometheus_cert_file"]
    prometheus_key_file: Path | None = DEFAULTS["prometheus_key_file"]
    prometheus_insecure_skip_verify: bool | None = DEFAULTS["prometheus_insecure_skip_verify"]
    prometheus_username: str | None = DEFAULTS["prometheus_username"]
    prometheus_password_file: Path | None = DEFAULTS["prometheus_password_file"]
    prometheus_timeout: float = DEFAULTS["prometheus_timeout"]
    storage_enabled: bool = DEFAULTS["storage_enabled"]
    storage_directory: Path | None = DEFAULTS["storage_directory"]
    storage_interval: float = DEFAULTS["storage_interval"]
    storage_size: int = DEFAULTS["storage_size"]
    storage_duration: float = DEFAULTS["storage_duration"]
    storage_first_delay: float = DEFAULTS["storage_first_delay"]
    storage_gpu: int | None = DEFAULTS["storage_gpu"]
    storage_gds: bool = DEFAULTS["storage_gds"]
    nvme_smart: bool = DEFAULTS["nvme_smart"]
    nvme_fixture: Path | None = DEFAULTS["nvme_fixture"]
    nvme_log_dir: Path | None = DEFAULTS["nvme_log_dir"]
    nvme_log_max_age: float = DEFAULTS["nvme_log_max_age"]

    def __post_init__(self) -> None:
        for option in OPTIONS:
            option.convert(getattr(self, option.attr), "")


assert {o.attr for o in OPTIONS} == {f.name for f in fields(Settings)}, (
    "OPTIONS and Settings differ"
)


MAX_CONFIG_BYTES = 1 << 20  # a configuration is a few KiB; read no more than this

# The commands that read a configuration file: those given --config
# (flags.settings_options(..., config_file=True); tests/test_config.py holds the two together).
# Every other command takes its settings as flags only.
CONFIG_FILE_COMMANDS = frozenset({"serve", "fleet"})

# The [table]s of the file: every dotted prefix of a key ("probe", "web.config", ...)
TABLES = frozenset(
    head
    for o in OPTIONS
    for head in (o.key.rsplit(".", n)[0] for n in range(1, o.key.count(".") + 1))
)


def file_readers(option: Option) -> frozenset[str]:
    """The commands that read ``option`` from a configuration file (it may be a flag of
    others)."""
    return option.scopes & CONFIG_FILE_COMMANDS


def _flags_of(option: Option) -> str:
    """'a flag of check and link (--link.secret-file)'."""
    commands = sorted(option.scopes)
    named = commands[0] if len(commands) == 1 else ", ".join(commands[:-1]) + " and " + commands[-1]
    return f"a flag of {named} (--{option.key})"


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name not in OPTIONS_BY_KEY:  # a key's value is its own
            flat.update(_flatten(value, name + "."))  # (a table there: "is not a boolean")
        else:
            flat[name] = value
    return flat


def load_file(path: Path, say: Callable[[str], None] = _to_stderr) -> dict[str, Any]:
    """Read a TOML configuration: {Settings attribute: validated value}.

    A key that no command reads from a file (a flag of check or link only: ``peer``) is
    valid, and read by nothing: a warning to ``say`` (standard error) names it."""
    try:
        # bounded, and never a FIFO or a device (/dev/zero must not fill the memory);
        # safeload imports tomllib here, only with --config
        flat = _flatten(safeload.parse_toml(safeload.read_file(path, MAX_CONFIG_BYTES)))
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc.strerror or exc}") from None
    except safeload.LoadError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    values: dict[str, Any] = {}
    for key, value in flat.items():
        option = OPTIONS_BY_KEY.get(key)
        if option is None and key in TABLES:  # "probe = 3" was "did you mean probe.when?"
            inside = [o.key[len(key) + 1 :] for o in OPTIONS if o.key.startswith(key + ".")]
            more = " ..." if len(inside) > 3 else ""
            raise ConfigError(
                f"{path}: {echo(key)[1:-1]}: a table ([{key}]), not a value: set its keys under "
                f"[{key}] ({', '.join(inside[:3])}{more}; 'sparkdiag config default' lists them)"
            )
        if option is None:
            import difflib  # only to name the key that was meant

            close = difflib.get_close_matches(key, list(OPTIONS_BY_KEY), n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            raise ConfigError(
                f"{path}: {echo(key)[1:-1]}: unknown key; {hint}"
                "every key is listed by 'sparkdiag config default'"
            )
        values[option.attr] = option.convert(value, f"{path}: ")
        if not file_readers(option):
            say(
                f"warning: {path}: {option.key}: no command reads this key from a configuration "
                f"file: it is {_flags_of(option)} only; give it there, and remove it here"
            )
    return values


def build_settings(
    config_file: Path | None, flags: Mapping[str, Any], command: str = "serve"
) -> Settings:
    """The command's defaults, then the file, then the flags given ({attribute: value}).

    Raises :class:`ConfigError` for a bad value, an unreadable file or an unknown key.
    """
    from_file = load_file(config_file) if config_file is not None else {}
    return merge_settings(from_file, flags, command)


def merge_settings(
    from_file: Mapping[str, Any], flags: Mapping[str, Any], command: str = "serve"
) -> Settings:
    """The command's defaults, then ``from_file`` (what :func:`load_file` read), then the flags
    given ({attribute: value}); raises :class:`ConfigError` for a bad flag value."""
    values: dict[str, Any] = {
        o.attr: o.command_default[command] for o in OPTIONS if command in o.command_default
    }
    values.update(from_file)
    for attr, value in flags.items():
        values[attr] = OPTIONS_BY_ATTR[attr].convert(value, "--")
    return replace(Settings(), **values)


CONFIG_COLUMNS = 79  # the default configuration's comments fit an 80-column editor


def default_config_text() -> str:
    """The default configuration as commented TOML: every key, its default and what it does."""
    lines = [
        "# sparkdiag configuration (TOML), read by 'serve --config FILE'; 'fleet",
        "# --config FILE' reads the keys marked for fleet. Every key is also a",
        "# command-line flag (--KEY, with a dot for a [table] key, e.g.",
        "# --probe.interval); flags win over this file.",
        "# Uncomment a line to change it.",
        "",
    ]
    table = ""
    # TOML: keys of the root table come before the first [table], and each table is declared
    # once (its keys together, tables in the order they first appear in OPTIONS).
    first: dict[str, int] = {}
    for index, option in enumerate(OPTIONS):
        first.setdefault(option.key.rpartition(".")[0], index)
    for option in sorted(OPTIONS, key=lambda o: ("." in o.key, first[o.key.rpartition(".")[0]])):
        head, _, name = option.key.rpartition(".")
        if head != table:
            lines += ["", f"[{head}]"]
            table = head
        # within 80 columns (a help of 300 characters on one line read badly in an editor)
        # a key the daemon does not read says who reads it from this file, if anyone: 'peer =
        # "spark-2"' passed config check, and neither the daemon nor check (which takes no
        # --config) did anything with it (found in reviews)
        readers = file_readers(option)
        if "serve" in readers:
            said = ""
        elif readers:
            said = (
                f" Read from this file by {' and '.join(sorted(readers))} (with --config), "
                "not by serve."
            )
        else:
            said = f" Not read from this file by any command: {_flags_of(option)}."
        text = f"{option.help} Allowed: {option.allowed()}.{said}"
        lines += wrap(text, CONFIG_COLUMNS, "# ", "# ")
        lines.append(f"# {name} = {_toml_value(option.default)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if value is None:
        return '""  # not set'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    return f'"{value}"'
