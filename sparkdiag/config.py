"""Settings: embedded defaults, a TOML file, and flags, in rising precedence.

Every option is declared once in :data:`OPTIONS`; the command-line flags, the TOML keys and the
commented default configuration (``sparkdiag config default``) are all generated from it. A TOML
key is the flag's name without the dashes in front (``poll-interval = 2.0``; ``path.sysfs`` is the
key ``sysfs`` in table ``[path]``). A bad value raises :class:`ConfigError` naming the key, the
value and what is allowed; the CLI turns it into exit status 2, which the systemd unit treats as
final (no restart loop).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

DEFAULT_PORT = 10942  # outside 9100-9999, which the Prometheus port allocation list has used up
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"


class ConfigError(ValueError):
    """A setting has a bad value; the message names the setting, the value and what is allowed."""


@dataclass(frozen=True)
class Option:
    key: str  # flag name without "--", and the TOML key (dots are tables)
    attr: str  # Settings attribute
    kind: str  # "float", "int", "str", "path", "bool", "choice", "listen", "argv"
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    unit: str = ""
    scopes: frozenset[str] = frozenset({"serve"})  # commands that take the flag

    def allowed(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind in ("float", "int"):
            unit = f" {self.unit}" if self.unit else ""
            return f"{self.minimum:g} to {self.maximum:g}{unit}"
        if self.kind == "bool":
            return "true or false"
        if self.kind == "listen":
            return f"HOST:PORT, for example {DEFAULT_LISTEN}"
        if self.kind == "argv":
            return "a list of strings (an argument list, never a shell string)"
        return "a string" if self.kind == "str" else "a file or directory path"

    def convert(self, value: Any, origin: str) -> Any:
        """Validate and convert one value from a flag or the file; ``origin`` prefixes errors."""
        where = f"{origin}{self.key}"

        def bad(why: str) -> ConfigError:
            return ConfigError(f"{where}: {value!r} {why}; allowed: {self.allowed()}")

        if value is None and self.default is None:
            return None
        if self.kind in ("float", "int"):
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise bad("is not a number")
            try:
                number = float(value) if self.kind == "float" else int(value)
            except ValueError:
                raise bad("is not a number") from None
            if not math.isfinite(number):
                raise bad("is not finite")
            if self.minimum is not None and number < self.minimum:
                raise bad("is out of range")
            if self.maximum is not None and number > self.maximum:
                raise bad("is out of range")
            return number
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            raise bad("is not a boolean")
        if self.kind == "argv":
            if isinstance(value, str):
                raise bad("is a string")
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise bad("is not a list of strings")
            return tuple(value)
        if not isinstance(value, (str, Path)):
            raise bad("is not a string")
        text = str(value)
        if self.kind == "choice" and text not in self.choices:
            raise bad("is not allowed")
        if self.kind == "listen":
            parse_listen(text, where)
        if self.kind == "path":
            if not text:
                raise bad("is empty")
            return Path(text)
        return text


OPTIONS: tuple[Option, ...] = (
    Option(
        "listen",
        "listen",
        "listen",
        DEFAULT_LISTEN,
        "HOST:PORT to serve /metrics, /healthz and / on; 0.0.0.0:PORT lets other hosts scrape.",
    ),
    Option(
        "poll-interval",
        "poll_interval",
        "float",
        1.0,
        "Seconds between telemetry polls; scrapes render the latest poll and never wait.",
        minimum=0.05,
        maximum=3600,
        unit="seconds",
    ),
    Option(
        "pcie-interval",
        "pcie_interval",
        "float",
        10.0,
        "Seconds between reads of the host PCIe links in sysfs.",
        minimum=0,
        maximum=86400,
        unit="seconds",
    ),
    Option(
        "nvml-fixture",
        "nvml_fixture",
        "path",
        None,
        "Replay NVML answers from this fixture (recorded by record-fixture) instead of the driver.",
        scopes=frozenset({"serve", "dump", "check", "probe"}),
    ),
    Option(
        "path.sysfs",
        "sysfs",
        "path",
        Path("/sys"),
        "sysfs mount point to read PCIe links from (a fake tree for tests).",
        scopes=frozenset({"serve", "dump", "check"}),
    ),
    Option(
        "path.rootfs",
        "rootfs",
        "path",
        Path("/"),
        "Root filesystem to detect the execution context (container or native) under.",
        scopes=frozenset({"serve", "dump", "check", "probe"}),
    ),
    Option(
        "log-level",
        "log_level",
        "choice",
        "info",
        "Logging verbosity on stderr.",
        choices=("debug", "info", "warning", "error"),
        scopes=frozenset({"serve", "dump", "check", "probe"}),
    ),
    Option(
        "state-dir",
        "state_dir",
        "path",
        None,
        "Directory for the baseline database; default $STATE_DIRECTORY under systemd, else "
        "$XDG_STATE_HOME/sparkdiag.",
        scopes=frozenset({"serve", "check", "probe"}),
    ),
    Option(
        "web.config.file",
        "web_config_file",
        "path",
        None,
        "Web configuration (TLS, basic auth with bcrypt hashes) in the exporter-toolkit "
        "format that Prometheus exporters share.",
    ),
    Option(
        "web.max-requests",
        "web_max_requests",
        "int",
        40,
        "Concurrent HTTP requests served; more get 503. 0 means no limit.",
        minimum=0,
        maximum=10000,
    ),
    Option(
        "probe.enabled",
        "probe_enabled",
        "bool",
        True,
        "Run the periodic GEMM and bandwidth probe (needs torch in --probe.python).",
    ),
    Option(
        "probe.interval",
        "probe_interval",
        "float",
        300.0,
        "Seconds between probe cycles (a random jitter of up to 10 % is added).",
        minimum=1,
        maximum=86400,
        unit="seconds",
    ),
    Option(
        "probe.when",
        "probe_when",
        "choice",
        "idle",
        "idle: skip a cycle while another process computes on the GPU; always: run anyway.",
        choices=("idle", "always"),
        scopes=frozenset({"serve", "probe"}),
    ),
    Option(
        "probe.busy-utilization",
        "probe_busy_utilization",
        "float",
        0.10,
        "GPU utilization (0..1) above which the GPU counts as busy.",
        minimum=0,
        maximum=1,
        scopes=frozenset({"serve", "probe"}),
    ),
    Option(
        "probe.timeout",
        "probe_timeout",
        "float",
        60.0,
        "Seconds after which a probe worker is killed (with its process group).",
        minimum=1,
        maximum=3600,
        unit="seconds",
        scopes=frozenset({"serve", "probe"}),
    ),
    Option(
        "probe.python",
        "probe_python",
        "argv",
        None,
        "Interpreter that runs the probe worker, as an argument list; default this Python.",
        scopes=frozenset({"serve"}),
    ),
    Option(
        "probe.container-command",
        "probe_container_command",
        "argv",
        None,
        "Also probe inside a container: the argument list that starts a Python reading a script "
        "on standard input, e.g. docker run -i --rm --gpus all IMAGE python3 - . Its results "
        'carry context="container" beside the native ones.',
        scopes=frozenset({"serve"}),
    ),
    Option(
        "probe.container-interval",
        "probe_container_interval",
        "float",
        1800.0,
        "Seconds between container probe cycles.",
        minimum=1,
        maximum=86400,
        unit="seconds",
    ),
    Option(
        "probe.fixture",
        "probe_fixture",
        "path",
        None,
        "Replay probe results recorded on a real GPU (worker JSON documents) instead of "
        "running the worker; for tests and demonstrations without a GPU.",
        scopes=frozenset({"serve"}),
    ),
    Option(
        "probe.first-delay",
        "probe_first_delay",
        "float",
        30.0,
        "Seconds after start before the first probe cycle.",
        minimum=0,
        maximum=86400,
        unit="seconds",
    ),
    Option(
        "process-metrics",
        "process_metrics",
        "bool",
        False,
        "Export per-process GPU memory and SM utilization, labelled with the process name, user, "
        "container id and pod uid read from /proc under --path.rootfs (in a container, run it "
        "with the host's PID namespace).",
        scopes=frozenset({"serve", "dump"}),
    ),
    Option(
        "process-metrics-top",
        "process_metrics_top",
        "int",
        10,
        "Per-process metrics for at most this many processes per GPU, those using the most GPU "
        "memory.",
        minimum=1,
        maximum=1000,
        scopes=frozenset({"serve", "dump"}),
    ),
)
OPTIONS_BY_KEY = {option.key: option for option in OPTIONS}


@dataclass(frozen=True)
class Settings:
    listen: str = DEFAULT_LISTEN
    poll_interval: float = 1.0
    pcie_interval: float = 10.0
    nvml_fixture: Path | None = None
    sysfs: Path = Path("/sys")
    rootfs: Path = Path("/")
    log_level: str = "info"
    state_dir: Path | None = None
    web_config_file: Path | None = None
    web_max_requests: int = 40
    probe_enabled: bool = True
    probe_interval: float = 300.0
    probe_when: str = "idle"
    probe_busy_utilization: float = 0.10
    probe_timeout: float = 60.0
    probe_python: tuple[str, ...] | None = None
    probe_container_command: tuple[str, ...] | None = None
    probe_container_interval: float = 1800.0
    probe_fixture: Path | None = None
    probe_first_delay: float = 30.0
    process_metrics: bool = False
    process_metrics_top: int = 10

    def __post_init__(self) -> None:
        for option in OPTIONS:
            option.convert(getattr(self, option.attr), "")


assert {o.attr for o in OPTIONS} == {f.name for f in fields(Settings)}, (
    "OPTIONS and Settings differ"
)


def parse_listen(value: str, where: str = "listen") -> tuple[str, int]:
    """``"127.0.0.1:10942"``, ``"[::1]:10942"`` or ``":10942"`` (all interfaces) -> (host, port)."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError(
            f"{where}: {value!r} is not HOST:PORT; allowed: HOST:PORT, for example {DEFAULT_LISTEN}"
        )
    port = int(port_text)
    if not 0 < port < 65536:
        raise ConfigError(f"{where}: port {port} is out of range; allowed: 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def load_file(path: Path) -> dict[str, Any]:
    """Read a TOML configuration: {Settings attribute: validated value}."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc.strerror or exc}") from None
    try:
        table = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    for key, value in _flatten(table).items():
        option = OPTIONS_BY_KEY.get(key)
        if option is None:
            known = ", ".join(o.key for o in OPTIONS)
            raise ConfigError(f"{path}: {key}: unknown key; allowed keys: {known}")
        values[option.attr] = option.convert(value, f"{path}: ")
    return values


def build_settings(
    config_file: Path | None, flags: Mapping[str, Any], base: Settings | None = None
) -> Settings:
    """Defaults, then the file, then the flags given on the command line ({attribute: value})."""
    values: dict[str, Any] = {} if config_file is None else load_file(config_file)
    for attr, value in flags.items():
        option = next(o for o in OPTIONS if o.attr == attr)
        values[attr] = option.convert(value, "--")
    return replace(base or Settings(), **values)


def default_config_text() -> str:
    """The default configuration as commented TOML: every key, its default and what it does."""
    lines = [
        "# sparkdiag configuration (TOML). Every key is also a command-line flag",
        "# (--KEY, with a dot for a [table] key, e.g. --probe.interval); flags win over this file.",
        "# Uncomment a line to change it.",
        "",
    ]
    table = ""
    # TOML: keys of the root table come before the first [table].
    for option in sorted(OPTIONS, key=lambda o: "." in o.key):
        head, _, name = option.key.rpartition(".")
        if head != table:
            lines += ["", f"[{head}]"]
            table = head
        lines.append(f"# {option.help} Allowed: {option.allowed()}.")
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
