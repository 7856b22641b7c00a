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
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from sparkdiag.errors import UsageError

DEFAULT_PORT = 10942  # outside 9100-9999, which the Prometheus port allocation list has used up
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"


class ConfigError(UsageError, ValueError):
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
    # Per command: a default other than ``default`` (check's shorter worker timeout, ...) and
    # help text appended to ``help`` (what the setting means for that command).
    command_default: Mapping[str, Any] = field(default_factory=dict)
    command_help: Mapping[str, str] = field(default_factory=dict)
    metavar: str | None = None

    def default_for(self, command: str) -> Any:
        return self.command_default.get(command, self.default)

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
            return ConfigError(f"{where}: {echo(value)} {why}; allowed: {self.allowed()}")

        if value is None and self.default is None:
            return None
        if self.kind in ("float", "int"):
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise bad("is not a number")
            if isinstance(value, str):
                text = value.strip()
                pattern = _INTEGER if self.kind == "int" else _DECIMAL
                if not pattern.fullmatch(text):
                    raise bad("is not an integer" if self.kind == "int" else "is not a number")
                value = int(text) if self.kind == "int" else float(text)
            elif self.kind == "int" and isinstance(value, float):
                # 0.9 is refused, not truncated to 0 (which would mean "no limit").
                if not value.is_integer():
                    raise bad("is not an integer")
                value = int(value)
            number: float = value
            if self.kind == "float":
                try:
                    number = float(value)
                except OverflowError:  # an integer beyond the float range
                    raise bad("is out of range") from None
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
        scopes=frozenset({"serve", "dump", "check", "probe", "record-fixture", "watch", "soak"}),
        command_help={
            "record-fixture": "(to normalise an old fixture file)",
            "soak": "(lists the GPUs to soak; the workers still need the real GPUs)",
        },
        metavar="FILE",
    ),
    Option(
        "path.sysfs",
        "sysfs",
        "path",
        Path("/sys"),
        "sysfs mount point to read PCIe links from (a fake tree for tests).",
        scopes=frozenset({"serve", "dump", "check", "watch", "link"}),
        command_help={
            "check": "check also reads the cpufreq governors under it.",
            "watch": "watch reads the job's cgroup pressure under DIR/fs/cgroup (cgroup v2), "
            "else the host's.",
            "link": "link reads the network interfaces, ConnectX-7 functions and RDMA devices "
            "under it.",
        },
        metavar="DIR",
    ),
    Option(
        "path.rootfs",
        "rootfs",
        "path",
        Path("/"),
        "Root filesystem to detect the execution context (container or native) under.",
        scopes=frozenset({"serve", "dump", "check", "probe", "watch", "link"}),
        command_help={
            "link": "link reads /proc/meminfo, /proc/cmdline, /etc/nccl.conf and the system's "
            "NCCL libraries under it.",
            "check": "check also reads the kernel log (ROOT/dev/kmsg; dmesg on the real root) "
            "and process names (ROOT/proc/PID/comm) under it.",
            "watch": "watch reads the job (its process tree, threads, I/O) and the host's "
            "memory pressure under ROOT/proc.",
        },
        metavar="DIR",
    ),
    Option(
        "log-level",
        "log_level",
        "choice",
        "info",
        "Logging verbosity on stderr.",
        choices=("debug", "info", "warning", "error"),
        scopes=frozenset({"serve", "dump", "check", "probe", "soak"}),
        # check is quiet by default: every problem a log line would mention is a row of its report.
        command_default={"check": "error"},
    ),
    Option(
        "state-dir",
        "state_dir",
        "path",
        None,
        "Directory for the baseline database; default $STATE_DIRECTORY under systemd, else "
        "$XDG_STATE_HOME/sparkdiag.",
        scopes=frozenset({"serve", "check", "probe", "baseline", "soak"}),
        command_help={
            "check": "check only reads baselines.sqlite there: it never creates nor teaches one.",
            "soak": "soak keeps the latest verdict per GPU there, in soak.json.",
        },
        metavar="DIR",
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
        scopes=frozenset({"serve", "probe", "compare", "soak"}),
        command_help={
            "compare": "(idle stops the comparison when another process uses it)",
            "soak": "(idle: a GPU another process computes on is not soaked)",
        },
    ),
    Option(
        "probe.busy-utilization",
        "probe_busy_utilization",
        "float",
        0.10,
        "GPU utilization (0..1) above which the GPU counts as busy.",
        minimum=0,
        maximum=1,
        scopes=frozenset({"serve", "probe", "check", "soak"}),
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
        scopes=frozenset({"serve", "probe", "check", "compare", "bench", "soak"}),
        # check's short suite takes about a second of GPU time; compare's cycles include a
        # container start; a bench sweep is one long worker run; a soak's worker gets its
        # --duration and --window on top.
        command_default={"check": 25.0, "compare": 120.0, "bench": 1800.0, "soak": 120.0},
        command_help={
            "compare": "(per cycle, container start included)",
            "bench": "(for the whole sweep)",
            "soak": "(on top of --duration and one --window: the setup and the way out)",
        },
        metavar="SECONDS",
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
        scopes=frozenset({"serve", "probe", "check"}),
        metavar="FILE",
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
        "probe.hot-enabled",
        "probe_hot_enabled",
        "bool",
        True,
        "Run the short hot probe (int4, bf16, fp16, fp8 at decode and LLM shapes, about 100 ms "
        "of GPU time) when the GPU runs hot, even while it is busy, so that 4-bit throughput is "
        "measured when memory is hot (the thermal-int4 alert needs it).",
    ),
    Option(
        "probe.hot-memory-celsius",
        "probe_hot_memory_celsius",
        "float",
        80.0,
        "Memory temperature at which the GPU counts as hot (HBM throttles above about 85 °C).",
        minimum=20,
        maximum=150,
        unit="°C",
    ),
    Option(
        "probe.hot-gpu-celsius",
        "probe_hot_gpu_celsius",
        "float",
        85.0,
        "GPU temperature at which the GPU counts as hot where memory has no sensor (GB10's "
        "LPDDR5X): GB10 was reported to slow down at 91-92 °C, the H200 at 89 °C.",
        minimum=20,
        maximum=150,
        unit="°C",
    ),
    Option(
        "probe.hot-interval",
        "probe_hot_interval",
        "float",
        120.0,
        "Seconds between hot probes while the GPU stays hot (one also runs when it becomes "
        "hot, and when a thermal clock event reason turns on).",
        minimum=1,
        maximum=86400,
        unit="seconds",
    ),
    Option(
        "probe.hot-min-interval",
        "probe_hot_min_interval",
        "float",
        60.0,
        "At most one hot probe per GPU within this many seconds, whatever triggers it.",
        minimum=1,
        maximum=86400,
        unit="seconds",
    ),
    Option(
        "web.read-timeout",
        "web_read_timeout",
        "float",
        10.0,
        "Seconds a client has for each step of a connection: the TLS handshake, sending a "
        "whole request, reading the answer; and how long an idle kept-alive connection stays "
        "open. Slower or silent clients are disconnected.",
        minimum=0.1,
        maximum=3600,
        unit="seconds",
    ),
    Option(
        "web.max-connections",
        "web_max_connections",
        "int",
        512,
        "Open HTTP connections kept. At the limit a new connection closes the longest-idle "
        "one; when none is idle it gets 503 (TLS: is closed). Keep it below the open-files "
        "limit.",
        minimum=1,
        maximum=100000,
    ),
    Option(
        "peer",
        "peer",
        "str",
        None,
        "Also measure the link to this host (HOST or HOST:PORT), which runs 'sparkdiag link "
        "serve': a short 'sparkdiag link test' (2 s per direction and path, at most 30 s).",
        scopes=frozenset({"check"}),
        metavar="HOST",
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
    Option(
        "compat.dcgm",
        "compat_dcgm",
        "bool",
        False,
        "Also export dcgm-exporter's fields under its names, units and labels "
        "(DCGM_FI_DEV_GPU_TEMP, DCGM_FI_DEV_FB_USED, ...), beside the sparkdiag series, so that "
        "dashboards and alerts written for dcgm-exporter work unchanged (docs/metrics.md).",
        scopes=frozenset({"serve", "dump"}),
    ),
    # sparkdiag fleet: the Prometheus it asks, with promtool's TLS and basic-auth settings.
    *(
        Option(
            key,
            attr,
            kind,
            default,
            text,
            scopes=frozenset({"fleet"}),
            metavar=metavar,
            minimum=low,
            maximum=high,
            unit=unit,
        )
        for key, attr, kind, default, text, metavar, low, high, unit in (
            (
                "prometheus",
                "prometheus_url",
                "str",
                "http://localhost:9090",
                "The Prometheus that scrapes the sparkdiag daemons (its HTTP API is all fleet "
                "uses).",
                "URL",
                None,
                None,
                "",
            ),
            (
                "http.config.file",
                "http_config_file",
                "path",
                None,
                "Prometheus' HTTP client configuration, as promtool's --http.config.file reads it "
                "(basic_auth, authorization, tls_config); the prometheus-* settings win over it.",
                "FILE",
                None,
                None,
                "",
            ),
            (
                "prometheus-ca-file",
                "prometheus_ca_file",
                "path",
                None,
                "CA certificate(s) to verify an https Prometheus with.",
                "FILE",
                None,
                None,
                "",
            ),
            (
                "prometheus-cert-file",
                "prometheus_cert_file",
                "path",
                None,
                "Client certificate for TLS client authentication.",
                "FILE",
                None,
                None,
                "",
            ),
            (
                "prometheus-key-file",
                "prometheus_key_file",
                "path",
                None,
                "Key of the client certificate.",
                "FILE",
                None,
                None,
                "",
            ),
            (
                "prometheus-insecure-skip-verify",
                "prometheus_insecure_skip_verify",
                "bool",
                False,
                "Do not verify the Prometheus certificate (tests only).",
                None,
                None,
                None,
                "",
            ),
            (
                "prometheus-username",
                "prometheus_username",
                "str",
                None,
                "Basic-auth username.",
                "NAME",
                None,
                None,
                "",
            ),
            (
                "prometheus-password-file",
                "prometheus_password_file",
                "path",
                None,
                "File holding the basic-auth password (never on the command line).",
                "FILE",
                None,
                None,
                "",
            ),
            (
                "prometheus-timeout",
                "prometheus_timeout",
                "float",
                15.0,
                "Seconds each query may take.",
                "SECONDS",
                0.1,
                600,
                "seconds",
            ),
        )
    ),
)
OPTIONS_BY_KEY = {option.key: option for option in OPTIONS}
OPTIONS_BY_ATTR = {option.attr: option for option in OPTIONS}


# Every Settings field's default is the one declared in OPTIONS.
DEFAULTS: Mapping[str, Any] = {option.attr: option.default for option in OPTIONS}


@dataclass(frozen=True)
class Settings:
    listen: str = DEFAULTS["listen"]
    poll_interval: float = DEFAULTS["poll_interval"]
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
    probe_hot_enabled: bool = DEFAULTS["probe_hot_enabled"]
    probe_hot_memory_celsius: float = DEFAULTS["probe_hot_memory_celsius"]
    probe_hot_gpu_celsius: float = DEFAULTS["probe_hot_gpu_celsius"]
    probe_hot_interval: float = DEFAULTS["probe_hot_interval"]
    probe_hot_min_interval: float = DEFAULTS["probe_hot_min_interval"]
    peer: str | None = DEFAULTS["peer"]
    process_metrics: bool = DEFAULTS["process_metrics"]
    process_metrics_top: int = DEFAULTS["process_metrics_top"]
    compat_dcgm: bool = DEFAULTS["compat_dcgm"]
    prometheus_url: str = DEFAULTS["prometheus_url"]
    http_config_file: Path | None = DEFAULTS["http_config_file"]
    prometheus_ca_file: Path | None = DEFAULTS["prometheus_ca_file"]
    prometheus_cert_file: Path | None = DEFAULTS["prometheus_cert_file"]
    prometheus_key_file: Path | None = DEFAULTS["prometheus_key_file"]
    prometheus_insecure_skip_verify: bool = DEFAULTS["prometheus_insecure_skip_verify"]
    prometheus_username: str | None = DEFAULTS["prometheus_username"]
    prometheus_password_file: Path | None = DEFAULTS["prometheus_password_file"]
    prometheus_timeout: float = DEFAULTS["prometheus_timeout"]

    def __post_init__(self) -> None:
        for option in OPTIONS:
            option.convert(getattr(self, option.attr), "")


assert {o.attr for o in OPTIONS} == {f.name for f in fields(Settings)}, (
    "OPTIONS and Settings differ"
)


def parse_listen(value: str, where: str = "listen") -> tuple[str, int]:
    """``"127.0.0.1:10942"``, ``"[::1]:10942"`` or ``":10942"`` (all interfaces) -> (host, port)."""
    host, sep, port_text = value.rpartition(":")
    if (
        not sep
        or not (port_text.isascii() and port_text.isdigit())
        or not all(c.isascii() and c.isprintable() and not c.isspace() for c in host)
    ):
        raise ConfigError(
            f"{where}: {echo(value)} is not HOST:PORT; allowed: HOST:PORT, "
            f"for example {DEFAULT_LISTEN}"
        )
    port = int(port_text)
    if not 0 < port < 65536:
        raise ConfigError(f"{where}: port {port} is out of range; allowed: 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


MAX_CONFIG_BYTES = 1 << 20  # a configuration is a few KiB; read no more than this
ECHO = 80  # characters of a bad value repeated in an error message
# Numbers given as strings (TOML "2", flags): ASCII digits only; int("٣") would be 3.
_INTEGER = re.compile(r"[+-]?[0-9]{1,100}")
_DECIMAL = re.compile(
    r"[+-]?([0-9]{1,100}(\.[0-9]{0,100})?|\.[0-9]{1,100})([eE][+-]?[0-9]{1,4})?|[+-]?(inf|nan)",
    re.IGNORECASE,
)


def echo(value: Any) -> str:
    """``repr(value)`` cut to ECHO characters, for error messages."""
    text = repr(value)
    return text if len(text) <= ECHO else text[:ECHO] + "…"


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
        with path.open("rb") as stream:
            raw = stream.read(MAX_CONFIG_BYTES + 1)  # /dev/zero must not fill the memory
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a configuration")
    try:
        flat = _flatten(tomllib.loads(raw.decode("utf-8")))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except ValueError as exc:  # TOMLDecodeError, or an integer of more than 4300 digits
        raise ConfigError(f"{path}: not valid TOML: {echo(str(exc))[1:-1]}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None
    values: dict[str, Any] = {}
    for key, value in flat.items():
        option = OPTIONS_BY_KEY.get(key)
        if option is None:
            known = ", ".join(o.key for o in OPTIONS)
            raise ConfigError(f"{path}: {echo(key)[1:-1]}: unknown key; allowed keys: {known}")
        values[option.attr] = option.convert(value, f"{path}: ")
    return values


def build_settings(
    config_file: Path | None, flags: Mapping[str, Any], command: str = "serve"
) -> Settings:
    """The command's defaults, then the file, then the flags given ({attribute: value}).

    Raises :class:`ConfigError` for a bad value, an unreadable file or an unknown key.
    """
    values: dict[str, Any] = {
        o.attr: o.command_default[command] for o in OPTIONS if command in o.command_default
    }
    if config_file is not None:
        values.update(load_file(config_file))
    for attr, value in flags.items():
        values[attr] = OPTIONS_BY_ATTR[attr].convert(value, "--")
    return replace(Settings(), **values)


def default_config_text() -> str:
    """The default configuration as commented TOML: every key, its default and what it does."""
    lines = [
        "# sparkdiag configuration (TOML). Every key is also a command-line flag",
        "# (--KEY, with a dot for a [table] key, e.g. --probe.interval); flags win over this file.",
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
