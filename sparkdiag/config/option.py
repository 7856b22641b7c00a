"""One configuration option: its flag, TOML key, kind, default and limits, and how a value given
as a flag or in the file is checked and converted (:meth:`Option.convert`). The options themselves
are declared in :mod:`sparkdiag.config.table`.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
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
    # A directory that must exist when a value is given (flag or file): --path.sysfs and
    # --path.rootfs, where a typo read nothing and said nothing (flags.settings_from checks it).
    existing_dir: bool = False

    def default_for(self, command: str) -> Any:
        return self.command_default.get(command, self.default)

    def allowed(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind in ("float", "int") and self.unit == "bytes":
            return f"{_bytes(self.minimum)} to {_bytes(self.maximum)} (K, M, G: binary units)"
        if self.kind in ("float", "int"):
            unit = f" {self.unit}" if self.unit else ""
            return f"{self.minimum:g} to {self.maximum:g}{unit}"
        if self.kind == "bool":
            return "true or false"
        if self.kind == "listen":
            return f"HOST:PORT, for example {DEFAULT_LISTEN}"
        if self.kind == "argv":
            return "a list of strings, or one string split into arguments as a shell would"
        return "a string" if self.kind == "str" else "a file or directory path"

    def convert(self, value: Any, origin: str) -> Any:
        """Validate and convert one value from a flag or the file; ``origin`` prefixes errors."""
        where = f"{origin}{self.key}"

        def bad(why: str) -> ConfigError:
            return ConfigError(f"{where}: {echo(value)} {why}; allowed: {self.allowed()}")

        if value is None and self.default is None:
            return None
        if value == "" and self.default is None and self.kind != "argv":
            return None  # ``key = ""``, as ``config default`` writes an unset key: not set
        if self.kind in ("float", "int"):
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise bad("is not a number")
            if isinstance(value, str):
                text = value.strip()
                pattern = _INTEGER if self.kind == "int" else _DECIMAL
                seconds = duration_seconds(text) if self.unit == "seconds" else None
                size = size_bytes(text) if self.unit == "bytes" else None
                if seconds is not None:  # "5m", "90s", "1h30m", as --duration takes them
                    value = seconds
                elif size is not None:  # "256M", "1G", "1.5GiB"
                    value = size
                elif not pattern.fullmatch(text):
                    raise bad("is not an integer" if self.kind == "int" else "is not a number")
                else:
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
            if isinstance(value, str):  # split as a shell would, never run by one
                try:
                    value = shlex.split(value)
                except ValueError as exc:  # an unclosed quote
                    raise bad(f"cannot be split into arguments ({exc})") from None
                if not value:
                    return None if self.default is None else tuple(self.default)
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise bad("is not a list of strings")
            return tuple(value)
        if not isinstance(value, (str, Path)):
            raise bad("is not a string")
        text = str(value)
        if self.kind == "choice":
            # any case, as the flag takes it (found in a review), given as declared
            declared = {choice.lower(): choice for choice in self.choices}
            if text.lower() not in declared:
                raise bad("is not allowed")
            text = declared[text.lower()]
        if self.kind == "listen":
            parse_listen(text, where)
        if self.kind == "path":
            if not text:
                raise bad("is empty")
            return Path(text)
        return text


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


ECHO = 80  # characters of a bad value repeated in an error message
# Numbers given as strings (TOML "2", flags): ASCII digits only; int("٣") would be 3.
_INTEGER = re.compile(r"[+-]?[0-9]{1,100}")
_DECIMAL = re.compile(
    r"[+-]?([0-9]{1,100}(\.[0-9]{0,100})?|\.[0-9]{1,100})([eE][+-]?[0-9]{1,4})?|[+-]?(inf|nan)",
    re.IGNORECASE,
)


def echo(value: Any) -> str:
    """``repr(value)`` cut to ECHO characters, for error messages; a TOML date or time as the
    file writes it (``1979-05-27``, where repr gave ``datetime.date(1979, 5, 27)``)."""
    import datetime

    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date too
        kind = type(value).__name__.replace("datetime", "date-time")
        text = f"{value.isoformat()} (a TOML {kind})"
    elif isinstance(value, dict):
        text = f"a table {value!r}"
    else:
        text = repr(value)
    return text if len(text) <= ECHO else text[:ECHO] + "…"


# A duration as a number of seconds or with units: 600, 90s, 10m, 1h30m, 1.5h.
_DURATION = re.compile(r"(?:(\d+(?:\.\d*)?)h)?(?:(\d+(?:\.\d*)?)m)?(?:(\d+(?:\.\d*)?)s?)?")


def duration_seconds(text: str) -> float | None:
    """``"600"``, ``"90s"``, ``"10m"``, ``"1h30m"``, ``"1.5h"`` -> seconds; None when ``text`` is
    not such a duration (signs, exponents and the like are left to the caller's number rules)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None or not any(match.groups()):
        return None
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


# A size in bytes, plain or with a binary unit: 1073741824, 1G, 1GiB, 256M, 1.5G, 64k.
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?")


def size_bytes(text: str) -> int | None:
    """``"256M"``, ``"1G"``, ``"1GiB"``, ``"1.5g"``, ``"4096"`` -> bytes (K, M, G, T are powers of
    1024); None when ``text`` is not such a size."""
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None:
        return None
    scale = 1024 ** "kmgt".find(match.group(2)) * 1024 if match.group(2) else 1
    return int(float(match.group(1)) * scale)


def _bytes(value: float | None) -> str:
    if value is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale and value % scale == 0:
            return f"{value / scale:g} {unit}"
    return f"{value:g} bytes"
