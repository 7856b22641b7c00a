"""Settings: embedded defaults, overridden by flags. Every value is validated with a clear error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 10942  # outside 9100-9999, which the Prometheus port allocation list has used up
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"


class ConfigError(ValueError):
    """A setting has a bad value; the message names the setting, the value and what is allowed."""


@dataclass(frozen=True)
class Settings:
    listen: str = DEFAULT_LISTEN
    poll_interval: float = 1.0
    pcie_interval: float = 10.0
    nvml_fixture: Path | None = None
    sysfs: Path = Path("/sys")
    rootfs: Path = Path("/")

    def __post_init__(self) -> None:
        if not 0.05 <= self.poll_interval <= 3600:
            raise ConfigError(
                f"poll-interval: {self.poll_interval} is out of range; allowed 0.05 to 3600 seconds"
            )
        if not 0 <= self.pcie_interval <= 86400:
            raise ConfigError(
                f"pcie-interval: {self.pcie_interval} is out of range; allowed 0 to 86400 seconds"
            )
        parse_listen(self.listen)


def parse_listen(value: str) -> tuple[str, int]:
    """``"127.0.0.1:10942"``, ``"[::1]:10942"`` or ``":10942"`` (all interfaces) -> (host, port)."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError(
            f"listen: {value!r} is not HOST:PORT (for example 127.0.0.1:{DEFAULT_PORT})"
        )
    port = int(port_text)
    if not 0 < port < 65536:
        raise ConfigError(f"listen: port {port} is out of range; allowed 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port
