"""TLS and basic auth from a web configuration file in the format Prometheus exporters share
(exporter-toolkit's ``--web.config.file``)::

    tls_server_config:
      cert_file: /etc/sparkdiag/tls.crt
      key_file: /etc/sparkdiag/tls.key
      min_version: TLS12          # TLS10..TLS13, default TLS12
      client_ca_file: ca.crt      # optional: verify client certificates
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default)
    basic_auth_users:
      prometheus: $2y$10$...      # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\\n')

Relative paths are relative to the file. Errors raise :class:`WebConfigError` naming the key.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sparkdiag.config import echo
from sparkdiag.errors import UsageError
from sparkdiag.web.basicauth import BasicAuth, hash_problem

MAX_FILE_BYTES = 1 << 20  # a web config is a few hundred bytes; read no more than this

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_KNOWN_TOP = {"tls_server_config", "basic_auth_users", "http_server_config"}
_KNOWN_TLS = {"cert_file", "key_file", "min_version", "client_ca_file", "client_auth_type"}


class WebConfigError(UsageError, ValueError):
    """The web configuration file is unusable; the message names the file and the key."""

    flag = "--web.config.file"


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash, validated
    auth: BasicAuth = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.auth = BasicAuth(self.users)

    def authorized(self, header: str | None) -> bool:
        """Check an ``Authorization: Basic ...`` header; True when no users are configured.
        Blocking (bcrypt); the HTTP server uses ``auth.decide`` and ``auth.verify`` instead."""
        return self.auth.authorized(header)


def load_web_config(path: Path) -> WebConfig:
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise WebConfigError(f"cannot read web config {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise WebConfigError(f"{path}: larger than {MAX_FILE_BYTES} bytes; not a web config")
    try:
        doc = yaml.safe_load(raw.decode("utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise WebConfigError(f"{path}: not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{path}: not valid YAML: {_one_line(exc)}") from None
    except RecursionError:
        raise WebConfigError(f"{path}: not valid YAML: nested too deeply") from None
    if not isinstance(doc, dict):
        raise WebConfigError(f"{path}: must hold a mapping of tls_server_config, basic_auth_users")
    _refuse_unknown(path, doc, _KNOWN_TOP, "unknown key(s) {}")
    ssl_context = None
    tls = doc.get("tls_server_config")
    if tls is not None:
        ssl_context = _ssl_context(path, tls)
    entries = doc.get("basic_auth_users") or {}
    if not isinstance(entries, dict):
        raise WebConfigError(f"{path}: basic_auth_users must map user names to bcrypt hashes")
    users: dict[str, bytes] = {}
    for user, hashed in entries.items():
        name = str(user)
        if ":" in name:
            raise WebConfigError(
                f"{path}: basic_auth_users.{echo(name)}: a user name cannot contain ':'"
            )
        problem = hash_problem(hashed)
        if problem is not None:
            raise WebConfigError(
                f"{path}: basic_auth_users.{echo(name)[1:-1]}: not a bcrypt hash ({problem}); "
                "make one with: htpasswd -nBC 10 USER | cut -d: -f2"
            )
        users[name] = hashed.encode()
    return WebConfig(ssl_context, users)


def _refuse_unknown(path: Path, block: dict[Any, Any], known: set[str], problem: str) -> None:
    """Raise :class:`WebConfigError` when ``block`` has a key outside ``known``: ``problem``
    with the unknown keys in place of ``{}``, then the allowed ones."""
    unknown = sorted(str(key) for key in block if key not in known)
    if unknown:
        listed = echo(", ".join(unknown))[1:-1]
        raise WebConfigError(
            f"{path}: {problem.format(listed)}; allowed: {', '.join(sorted(known))}"
        )


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def _ssl_context(path: Path, tls: Any) -> ssl.SSLContext:
    if not isinstance(tls, dict):
        raise WebConfigError(f"{path}: tls_server_config must be a mapping")
    # Refused rather than ignored: ignoring e.g. client_allowed_sans would accept clients the
    # file means to keep out.
    _refuse_unknown(path, tls, _KNOWN_TLS, "tls_server_config: key(s) {} not supported")

    def file_key(name: str, required: bool) -> Path | None:
        value = tls.get(name)
        if value is None or value == "":
            if required:
                raise WebConfigError(f"{path}: tls_server_config.{name} is required")
            return None
        if not isinstance(value, str) or "\0" in value:
            raise WebConfigError(f"{path}: tls_server_config.{name} {echo(value)} is not a path")
        candidate = Path(value)
        return candidate if candidate.is_absolute() else path.parent / candidate

    def choice(name: str, default: str, allowed: Mapping[str, object]) -> str:
        value = tls.get(name, default)
        if not isinstance(value, str) or value not in allowed:
            raise WebConfigError(
                f"{path}: tls_server_config.{name} {echo(value)}; allowed: " + ", ".join(allowed)
            )
        return value

    cert = file_key("cert_file", True)
    key = file_key("key_file", True)
    assert cert is not None and key is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _TLS_VERSIONS[choice("min_version", "TLS12", _TLS_VERSIONS)]
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise WebConfigError(
            f"{path}: tls_server_config: cannot load cert_file {echo(str(cert))} / key_file "
            f"{echo(str(key))}: {_one_line(exc)}"
        ) from None
    auth = choice("client_auth_type", "NoClientCert", _CLIENT_AUTH)
    context.verify_mode = _CLIENT_AUTH[auth]
    ca = file_key(
        "client_ca_file", auth in ("RequireAndVerifyClientCert", "VerifyClientCertIfGiven")
    )
    if ca is not None:
        try:
            context.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise WebConfigError(
                f"{path}: tls_server_config.client_ca_file {echo(str(ca))}: {_one_line(exc)}"
            ) from None
    return context
