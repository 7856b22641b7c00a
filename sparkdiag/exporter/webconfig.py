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

import base64
import hashlib
import hmac
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

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


class WebConfigError(ValueError):
    """The web configuration file is unusable; the message names the file and the key."""


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    _verified: dict[str, bytes] = field(default_factory=dict)  # user -> sha256(password) cache
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def authorized(self, header: str | None) -> bool:
        """Check an ``Authorization: Basic ...`` header; True when no users are configured.

        bcrypt is slow by design (tens of ms at cost 10); a password that verified once is
        remembered as its SHA-256, so that Prometheus' scrape every 15 s does not pay it again.
        """
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        stored = self.users.get(user)
        if stored is None:
            # Spend the same time as a real check, so a scan cannot tell users apart.
            bcrypt.checkpw(password.encode(), _DUMMY_HASH)
            return False
        digest = hashlib.sha256(password.encode()).digest()
        with self._lock:
            cached = self._verified.get(user)
        if cached is not None and hmac.compare_digest(cached, digest):
            return True
        if bcrypt.checkpw(password.encode(), stored):
            with self._lock:
                self._verified[user] = digest
            return True
        return False


_DUMMY_HASH = bcrypt.hashpw(b"sparkdiag-no-such-user", bcrypt.gensalt(rounds=10))


def load_web_config(path: Path) -> WebConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WebConfigError(f"cannot read web config {path}: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise WebConfigError(f"{path}: must hold a mapping of tls_server_config, basic_auth_users")
    unknown = sorted(set(doc) - _KNOWN_TOP)
    if unknown:
        raise WebConfigError(
            f"{path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_KNOWN_TOP))}"
        )
    config = WebConfig()
    tls = doc.get("tls_server_config")
    if tls is not None:
        config.ssl_context = _ssl_context(path, tls)
    users = doc.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise WebConfigError(f"{path}: basic_auth_users must map user names to bcrypt hashes")
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(
                f"{path}: basic_auth_users.{user}: not a bcrypt hash (expected $2a$, $2b$ or $2y$)"
            )
        config.users[str(user)] = hashed.encode()
    return config


def _ssl_context(path: Path, tls: Any) -> ssl.SSLContext:
    if not isinstance(tls, dict):
        raise WebConfigError(f"{path}: tls_server_config must be a mapping")

    def file_key(name: str, required: bool) -> Path | None:
        value = tls.get(name)
        if value in (None, ""):
            if required:
                raise WebConfigError(f"{path}: tls_server_config.{name} is required")
            return None
        candidate = Path(str(value))
        return candidate if candidate.is_absolute() else path.parent / candidate

    cert = file_key("cert_file", True)
    key = file_key("key_file", True)
    assert cert is not None and key is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    version = str(tls.get("min_version", "TLS12"))
    if version not in _TLS_VERSIONS:
        raise WebConfigError(
            f"{path}: tls_server_config.min_version {version!r}; allowed: "
            + ", ".join(_TLS_VERSIONS)
        )
    context.minimum_version = _TLS_VERSIONS[version]
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(
            f"{path}: tls_server_config: cannot load cert_file {cert} / key_file {key}: {exc}"
        ) from None
    auth = str(tls.get("client_auth_type", "NoClientCert"))
    if auth not in _CLIENT_AUTH:
        raise WebConfigError(
            f"{path}: tls_server_config.client_auth_type {auth!r}; allowed: "
            + ", ".join(_CLIENT_AUTH)
        )
    context.verify_mode = _CLIENT_AUTH[auth]
    ca = file_key(
        "client_ca_file", auth in ("RequireAndVerifyClientCert", "VerifyClientCertIfGiven")
    )
    if ca is not None:
        try:
            context.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"{path}: tls_server_config.client_ca_file {ca}: {exc}") from None
    return context
