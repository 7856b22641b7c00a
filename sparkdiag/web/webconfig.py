"""The web configuration file in the format Prometheus exporters share (exporter-toolkit's
``--web.config.file``), read so that every key means what exporter-toolkit does with it, or is
refused at start with the key named::

    tls_server_config:
      cert_file: /etc/sparkdiag/tls.crt        # both re-read when they change on disk
      key_file: /etc/sparkdiag/tls.key
      client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven, NoClientCert
      client_ca_file: ca.crt                   # or client_ca: inline PEM
      client_allowed_sans: [prometheus]        # optional: the client certificate must name one
      min_version: TLS12                       # TLS12 (default) or TLS13; max_version likewise
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]   # Go's names, TLS 1.2 suites
      prefer_server_cipher_suites: true
      curve_preferences: [X25519]              # one curve (Python's ssl sets no list)
    http_server_config:
      headers: {X-Frame-Options: deny, Strict-Transport-Security: max-age=31536000}
      http2: true                              # accepted; sparkdiag speaks HTTP/1.1 only
    rate_limit: {interval: 1s, burst: 10}      # requests beyond it get 429
    basic_auth_users:
      prometheus: $2y$10$...                   # bcrypt, cost at most MAX_BCRYPT_COST

Relative paths are relative to the file. Refused, where Python's ``ssl`` module cannot do what
exporter-toolkit (Go's ``crypto/tls``) does: ``client_auth_type`` ``RequestClientCert`` and
``RequireAnyClientCert`` (accepting a client certificate without verifying it needs a verify
callback that Python does not expose), inline ``cert`` and ``key`` (OpenSSL loads them from
files only), TLS 1.0 and 1.1 (OpenSSL 3 refuses them at its default security level; RFC 8996
deprecates them), several ``curve_preferences``. Also refused, as exporter-toolkit refuses
them: unknown keys, ``client_ca_file`` without a ``client_auth_type`` that checks certificates,
headers other than its five and values outside its lists. ``docs/web.md`` has the table.

Errors raise :class:`WebConfigError` naming the file and the key (exit status 2 at start).
:class:`LiveWebConfig` re-reads the file and the files it names when one changes, as
exporter-toolkit does for every connection and request.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkdiag import safeload
from sparkdiag.config import echo
from sparkdiag.errors import UsageError
from sparkdiag.filewatch import FileWatch, Stamp, stamp
from sparkdiag.web.basicauth import BasicAuth, hash_problem
from sparkdiag.web.channels import Tls

if TYPE_CHECKING:  # ssl (OpenSSL, some 5 MiB) loads when a file turns TLS on
    import ssl

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 1 << 20  # a web config is a few hundred bytes; read no more than this
RECHECK_SECONDS = 1.0  # how often the files are looked at (stat) for a change

# the names of ssl.TLSVersion and ssl.VerifyMode members: ssl is imported with TLS on only
_TLS_VERSIONS = {"TLS12": "TLSv1_2", "TLS13": "TLSv1_3"}
_OLD_TLS = ("TLS10", "TLS11")
_CLIENT_AUTH = {
    "": "CERT_NONE",
    "NoClientCert": "CERT_NONE",
    "VerifyClientCertIfGiven": "CERT_OPTIONAL",
    "RequireAndVerifyClientCert": "CERT_REQUIRED",
}
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# Go's names of the TLS 1.2 suites that crypto/tls offers (tls.CipherSuites()), as OpenSSL names
# them. Go's TLS 1.3 suites are accepted and, as in Go, not configurable.
_CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
_TLS13_CIPHERS = (
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
)
_CURVES = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}
# exporter-toolkit's extraHTTPHeaders: the only headers a web config may set, and for two of
# them the only values.
_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
_TOP = {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"}
_TLS_KEYS = {
    "cert_file",
    "key_file",
    "cert",
    "key",
    "client_ca_file",
    "client_ca",
    "client_auth_type",
    "cipher_suites",
    "curve_preferences",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
    "client_allowed_sans",
}
_TLS_ENABLING = (
    "cert_file",
    "cert",
    "key_file",
    "key",
    "client_ca_file",
    "client_ca",
    "client_auth_type",
)
_HTTP_KEYS = {"headers", "http2"}
_RATE_KEYS = {"interval", "burst"}
_DURATION = re.compile(r"(?:(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


class WebConfigError(UsageError, ValueError):
    """The web configuration file is unusable; the message names the file and the key."""

    flag = "--web.config.file"


@dataclass(frozen=True)
class RateLimit:
    """exporter-toolkit's ``rate_limit``: a token bucket of ``burst`` tokens, one more every
    ``interval`` seconds (Go's ``rate.NewLimiter(rate.Every(interval), burst)``)."""

    interval: float
    burst: int


@dataclass
class WebConfig:
    tls: Tls | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash, validated
    headers: tuple[tuple[str, str], ...] = ()  # http_server_config.headers, validated
    rate_limit: RateLimit | None = None
    files: tuple[Path, ...] = ()  # the files read, watched for a change
    stamps: dict[Path, Stamp] = field(default_factory=dict)  # each file's, taken before its read
    auth: BasicAuth = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.auth = BasicAuth(self.users)

    def authorized(self, header: str | None) -> bool:
        """Check an ``Authorization: Basic ...`` header; True when no users are configured.
        Blocking (bcrypt); the HTTP server uses ``auth.decide`` and ``auth.verify`` instead."""
        return self.auth.authorized(header)


def load_web_config(path: Path) -> WebConfig:
    return _load(path, _Named())


def _load(path: Path, named: _Named) -> WebConfig:
    """The config of ``path``; ``named`` collects the file and every file it names as it is
    read, each stamped before it is read, so that a config that fails on one of them knows which
    to watch for the fix, and a file that changes during the read is read again."""
    named.add(path)
    doc = _read(path)
    where = _Where(path)
    _refuse_unknown(where, doc, _TOP, "")
    tls = None
    block = doc.get("tls_server_config")
    if block is not None:
        if not isinstance(block, dict):
            raise where.error("tls_server_config", "must be a mapping")
        tls = _tls(where, block, named)
    headers, http2 = _http(where, doc.get("http_server_config"))
    if tls is not None and http2 and isinstance(block, dict):
        _http2_ciphers(where, block, tls.context)
    rate = _rate_limit(where, doc.get("rate_limit"))
    users = _users(where, doc.get("basic_auth_users"))
    files = tuple(named.paths)
    return WebConfig(tls, users, headers, rate, files, named.stamps)


class _Named:
    """The files one read of the config names, in order, each stamped when it is named, which
    is before it is read: a file that changes while the read goes on no longer matches its
    stamp, and the next look reads again. ``earlier`` are stamps taken before the read began
    (the files watched until then, as that look saw them); a file keeps its earliest stamp."""

    def __init__(self, earlier: dict[Path, Stamp] | None = None) -> None:
        self.paths: list[Path] = []
        self.stamps = dict(earlier or {})

    def add(self, path: Path) -> Path:
        self.paths.append(path)
        if path not in self.stamps:
            self.stamps[path] = stamp(path)
        return path


class LiveWebConfig:
    """The web config as it is on disk now: re-read when the file or a file it names changes
    (looked at once per ``RECHECK_SECONDS`` at most), as exporter-toolkit re-reads it for every
    connection and request. A change that makes it unusable refuses new connections (TLS) and
    answers requests 500 until the file is fixed, as exporter-toolkit does; each such change is
    logged once."""

    def __init__(self, path: Path, first: WebConfig, clock: Callable[[], float] = time.monotonic):
        self.path = path
        self._config: WebConfig | None = first
        self._tls_on = first.tls is not None
        self._files = FileWatch(first.files, RECHECK_SECONDS, clock, first.stamps)
        self.reloads = 0

    def current(self) -> WebConfig | None:
        # each file is stamped before it is read (those followed now at the look, one named
        # for the first time when it is named): one that changes while they are read (a renewal
        # writing the key, then the certificate; web.yml rewritten) is read again at the next look
        if not self._files.changed():
            return self._config  # unchanged: the config in use, or None while it is unusable
        named = _Named(self._files.stamps())
        try:
            new = _load(self.path, named)
        except WebConfigError as exc:
            log.error(
                "web config changed and is unusable (refusing connections and requests "
                "until it is fixed): %s",
                exc,
            )
            self._unusable(named)
            return None
        if (new.tls is not None) != self._tls_on:
            log.error(
                "web config %s changed: turning TLS on or off needs a restart; refusing "
                "connections and requests until it is restored",
                self.path,
            )
            self._unusable(named)
            return None
        previous = self._config
        if previous is not None and previous.users == new.users:
            new.auth = previous.auth  # keep what bcrypt already verified
        self._config = new
        self._files.watch(new.files, named.stamps)
        self.reloads += 1
        log.info("web config %s re-read: it or a file it names changed", self.path)
        return new

    def _unusable(self, named: _Named) -> None:
        """Refuse until a fix: watched are the files named as far as it was read and those of
        before (a certificate that failed to load is one of them), so that fixing any of them,
        not only the config file, is seen."""
        self._config = None
        self._files.watch((*named.paths, *self._files.files), named.stamps)


@dataclass(frozen=True)
class _Where:
    path: Path

    def error(self, key: str, problem: str) -> WebConfigError:
        return WebConfigError(f"{self.path}: {key}: {problem}")


def _read(path: Path) -> dict[Any, Any]:
    from sparkdiag.safeyaml import load_yaml  # PyYAML only when a YAML file is read

    try:
        doc = load_yaml(path, MAX_FILE_BYTES) or {}
    except OSError as exc:
        raise WebConfigError(f"cannot read web config {path}: {exc.strerror or exc}") from None
    except safeload.LoadError as exc:
        raise WebConfigError(f"{path}: {exc}") from None
    if not isinstance(doc, dict):
        raise WebConfigError(f"{path}: must hold a mapping of " + ", ".join(sorted(_TOP)))
    return doc


def _refuse_unknown(where: _Where, block: dict[Any, Any], known: set[str], parent: str) -> None:
    unknown = sorted(str(key) for key in block if key not in known)
    if unknown:
        listed = echo(", ".join(unknown))[1:-1]
        prefix = f"unknown key(s) {listed}"
        if parent:
            prefix = f"{parent}: key(s) {listed} not supported"
        raise WebConfigError(f"{where.path}: {prefix}; allowed: {', '.join(sorted(known))}")


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def _string(where: _Where, key: str, value: Any) -> str:
    if not isinstance(value, str) or "\0" in value:
        raise where.error(key, f"{echo(value)} is not a string")
    return value


def _strings(where: _Where, key: str, value: Any) -> list[str]:
    if not isinstance(value, list):
        raise where.error(key, f"{echo(value)} is not a list")
    return [_string(where, key, item) for item in value]


def _tls(where: _Where, tls: dict[Any, Any], named: _Named) -> Tls | None:
    _refuse_unknown(where, tls, _TLS_KEYS, "tls_server_config")
    key = "tls_server_config."
    set_keys = [name for name in tls if tls[name] not in (None, "", [], False)]
    if not any(tls.get(name) not in (None, "") for name in _TLS_ENABLING):
        if set_keys:  # exporter-toolkit would serve plain HTTP and ignore them: say so instead
            raise where.error(
                key + "cert_file",
                "missing one of cert or cert_file: TLS settings without a certificate "
                "would leave TLS off",
            )
        return None
    import ssl

    for inline in ("cert", "key"):
        if tls.get(inline) not in (None, ""):
            raise where.error(
                key + inline,
                "inline certificates and keys are not supported (OpenSSL loads them from "
                f"files): put it in a file and name it with {inline}_file",
            )

    def file_key(name: str) -> Path | None:
        value = tls.get(name)
        if value is None or value == "":
            return None
        if not isinstance(value, str) or "\0" in value:
            raise where.error(key + name, f"{echo(value)} is not a path")
        candidate = Path(value)
        resolved = candidate if candidate.is_absolute() else where.path.parent / candidate
        return named.add(resolved)

    cert, private = file_key("cert_file"), file_key("key_file")
    if cert is None:
        raise where.error(key + "cert_file", "missing one of cert or cert_file")
    if private is None:
        raise where.error(key + "key_file", "missing one of key or key_file")
    versions = [
        _version(where, tls, "min_version", "TLS12"),
        _version(where, tls, "max_version", "TLS13"),
    ]
    if versions[0] > versions[1]:
        raise where.error(key + "min_version", "is above max_version: no version is left")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version, context.maximum_version = versions
    context.options |= ssl.OP_NO_RENEGOTIATION  # Go's crypto/tls never renegotiates
    try:
        # a callback that refuses: OpenSSL would otherwise ask the terminal for the pass phrase
        # of an encrypted key ("Enter PEM pass phrase:"), at start and at every reload
        safeload.load_cert_chain(context, cert, private)
    except safeload.EncryptedKey as exc:
        raise where.error(key + "key_file", str(exc)) from None
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise where.error(
            key + "cert_file",
            f"cannot load cert_file {echo(str(cert))} / key_file {echo(str(private))}: "
            f"{_one_line(exc)}",
        ) from None
    _ciphers(where, tls, context)
    _curve(where, tls, context)
    auth = tls.get("client_auth_type", "")
    if auth is None:
        auth = ""
    if auth in _UNVERIFIED_CLIENT_AUTH:
        raise where.error(
            key + "client_auth_type",
            f"{auth} (a client certificate taken without verifying it) is not supported: "
            "Python's ssl module verifies every certificate it accepts; use "
            "VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file",
        )
    if not isinstance(auth, str) or auth not in _CLIENT_AUTH:
        raise where.error(
            key + "client_auth_type",
            f"invalid ClientAuth {echo(auth)}; allowed: " + ", ".join(a for a in _CLIENT_AUTH if a),
        )
    context.verify_mode = ssl.VerifyMode[_CLIENT_AUTH[auth]]
    ca_file = file_key("client_ca_file")
    ca_text = tls.get("client_ca")
    if (ca_file is not None or ca_text not in (None, "")) and context.verify_mode == ssl.CERT_NONE:
        raise where.error(
            key + "client_ca_file",
            "client CA's have been configured without a Client Auth Policy: set "
            "client_auth_type to RequireAndVerifyClientCert (or VerifyClientCertIfGiven), "
            "or client certificates would not be checked at all",
        )
    try:
        if ca_file is not None:
            context.load_verify_locations(cafile=ca_file)
        elif ca_text not in (None, ""):
            context.load_verify_locations(cadata=_string(where, key + "client_ca", ca_text))
        elif context.verify_mode != ssl.CERT_NONE:
            # Go verifies against the system's roots when ClientCAs is empty; so do we.
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    except (OSError, ssl.SSLError, ValueError) as exc:
        name = "client_ca_file" if ca_file is not None else "client_ca"
        shown = echo(str(ca_file)) + ": " if ca_file is not None else ""
        raise where.error(key + name, f"{shown}{_one_line(exc)}") from None
    sans = tls.get("client_allowed_sans")
    allowed = None
    if sans is not None:
        names = _strings(where, key + "client_allowed_sans", sans)
        if context.verify_mode == ssl.CERT_NONE:
            raise where.error(
                key + "client_allowed_sans",
                "needs client_auth_type RequireAndVerifyClientCert (or VerifyClientCertIfGiven): "
                "without it no client certificate is asked for",
            )
        allowed = frozenset(_normal_san(name) for name in names)
    return Tls(context, allowed)


def _version(where: _Where, tls: dict[Any, Any], name: str, default: str) -> ssl.TLSVersion:
    value = tls.get(name, default)
    if value is None:
        value = default
    if value in _OLD_TLS:
        raise where.error(
            f"tls_server_config.{name}",
            f"{value} is not supported: TLS 1.0 and 1.1 are deprecated (RFC 8996) and OpenSSL 3 "
            "refuses them at its default security level; allowed: TLS12, TLS13",
        )
    if not isinstance(value, str) or value not in _TLS_VERSIONS:
        raise where.error(
            f"tls_server_config.{name}",
            f"unknown TLS version {echo(value)}; allowed: " + ", ".join(_TLS_VERSIONS),
        )
    import ssl

    return ssl.TLSVersion[_TLS_VERSIONS[value]]


def _ciphers(where: _Where, tls: dict[Any, Any], context: ssl.SSLContext) -> None:
    import ssl

    key = "tls_server_config.cipher_suites"
    prefer = tls.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise where.error(
            "tls_server_config.prefer_server_cipher_suites", f"{echo(prefer)} is not true or false"
        )
    if prefer:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    suites = tls.get("cipher_suites")
    if suites is None:
        return
    names = _strings(where, key, suites)
    openssl = []
    for name in names:
        if name in _TLS13_CIPHERS:
            continue
        if name not in _CIPHERS:
            raise where.error(key, f"unknown cipher: {echo(name)}")
        openssl.append(_CIPHERS[name])
    if not openssl:
        if context.minimum_version < ssl.TLSVersion.TLSv1_3:
            raise where.error(
                key,
                "lists no TLS 1.2 suite (TLS 1.3 suites are not configurable, as in Go), so "
                "TLS 1.2 clients could not connect; add one or set min_version: TLS13",
            )
        return
    try:
        context.set_ciphers(":".join(openssl))
    except ssl.SSLError as exc:
        raise where.error(key, f"not available in this OpenSSL: {_one_line(exc)}") from None


# Go's HTTP/2 server refuses to start on a TLS 1.2 cipher list without one of these (RFC 7540
# 9.2.2; net/http's http2ConfigureServer), so exporter-toolkit refuses such a list while
# http2 is on: sparkdiag speaks HTTP/1.1 only, but refuses the same files.
_HTTP2_REQUIRED = (
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
)


def _http2_ciphers(where: _Where, tls: dict[Any, Any], context: ssl.SSLContext) -> None:
    import ssl

    suites = tls.get("cipher_suites")
    if not suites or context.minimum_version >= ssl.TLSVersion.TLSv1_3:
        return
    if not any(name in _HTTP2_REQUIRED for name in suites):
        raise where.error(
            "tls_server_config.cipher_suites",
            "lacks an HTTP/2-required AES_128_GCM_SHA256 suite while http2 is on "
            f"(http_server_config.http2, true by default): add {_HTTP2_REQUIRED[0]} or "
            f"{_HTTP2_REQUIRED[1]}, or set http2: false (exporter-toolkit refuses it too)",
        )


def _curve(where: _Where, tls: dict[Any, Any], context: ssl.SSLContext) -> None:
    import ssl

    key = "tls_server_config.curve_preferences"
    curves = tls.get("curve_preferences")
    if curves is None or curves == []:
        return
    names = _strings(where, key, curves)
    for name in names:
        if name not in _CURVES:
            raise where.error(key, f"unknown curve: {echo(name)}; allowed: " + ", ".join(_CURVES))
    if len(set(names)) > 1:
        raise where.error(
            key,
            "lists several curves: Python's ssl module sets one (set_ecdh_curve); "
            "list the one to use",
        )
    try:
        context.set_ecdh_curve(_CURVES[names[0]])
    except (ValueError, ssl.SSLError) as exc:
        raise where.error(key, f"{names[0]}: {_one_line(exc)}") from None


def _normal_san(name: str) -> str:
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(name))
    return name


def _http(where: _Where, block: Any) -> tuple[tuple[tuple[str, str], ...], bool]:
    """The headers, and whether HTTP/2 is on (exporter-toolkit's default)."""
    if block is None:
        return (), True
    if not isinstance(block, dict):
        raise where.error("http_server_config", "must be a mapping")
    _refuse_unknown(where, block, _HTTP_KEYS, "http_server_config")
    http2 = block.get("http2", True)
    if not isinstance(http2, bool):
        raise where.error("http_server_config.http2", f"{echo(http2)} is not true or false")
    headers = block.get("headers") or {}
    if not isinstance(headers, dict):
        raise where.error("http_server_config.headers", "must map header names to values")
    out: list[tuple[str, str]] = []
    for name, value in headers.items():
        if name not in _HEADERS:
            raise where.error(
                "http_server_config.headers",
                f"HTTP header {echo(name)} can not be configured; allowed: " + ", ".join(_HEADERS),
            )
        key = f"http_server_config.headers.{name}"
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise where.error(key, f"{echo(value)} is not a string")
        text = str(value)  # YAML reads X-XSS-Protection: 1 as a number; Go's yaml as "1"
        if not text.isascii() or any(ch < " " or ch == "\x7f" for ch in text):
            raise where.error(key, f"{echo(text)}: a header value must be printable ASCII")
        allowed = _HEADERS[name]
        if allowed and text not in allowed:
            raise where.error(
                key, f"invalid value for {name}. Expected one of: {', '.join(allowed)}"
            )
        out.append((name, text))
    return tuple(out), http2


def _rate_limit(where: _Where, block: Any) -> RateLimit | None:
    if block is None:
        return None
    if not isinstance(block, dict):
        raise where.error("rate_limit", "must be a mapping of interval and burst")
    _refuse_unknown(where, block, _RATE_KEYS, "rate_limit")
    interval = _duration(where, "rate_limit.interval", block.get("interval", 0))
    burst = block.get("burst", 0)
    if isinstance(burst, bool) or not isinstance(burst, int) or not 0 <= burst <= 1_000_000:
        raise where.error("rate_limit.burst", f"{echo(burst)}; allowed: 0 to 1000000")
    if interval == 0:
        return None  # exporter-toolkit: no limiter
    return RateLimit(interval, burst)


def _duration(where: _Where, key: str, value: Any) -> float:
    """Seconds from a Go duration (``1s``, ``500ms``, ``1m30s``) or an integer of nanoseconds,
    as Go's YAML reads a ``time.Duration``."""
    if isinstance(value, bool):
        raise where.error(key, f"{echo(value)} is not a duration")
    if isinstance(value, int):
        if value < 0:
            raise where.error(key, f"{value} is negative")
        return value * 1e-9
    if isinstance(value, str) and (value == "0" or _DURATION.fullmatch(value)):
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value))
        if seconds > 86400 * 365:
            raise where.error(key, f"{echo(value)} is out of range")
        return seconds
    raise where.error(key, f"{echo(value)} is not a duration such as 1s, 500ms or 1m30s")


def _users(where: _Where, entries: Any) -> dict[str, bytes]:
    if entries is None:
        return {}
    if not isinstance(entries, dict):
        raise where.error("basic_auth_users", "must map user names to bcrypt hashes")
    users: dict[str, bytes] = {}
    for user, hashed in entries.items():
        name = str(user)
        shown = echo(name)[1:-1]
        if ":" in name:
            raise where.error(f"basic_auth_users.{shown}", "a user name cannot contain ':'")
        problem = hash_problem(hashed)
        if problem is not None:
            raise where.error(
                f"basic_auth_users.{shown}",
                f"not a bcrypt hash ({problem}); "
                "make one with: htpasswd -nBC 10 USER | cut -d: -f2",
            )
        users[name] = hashed.encode()
    costs = {int(h[4:6]) for h in users.values()}
    if len(costs) > 1:  # an unknown name costs the highest: a cheaper user answers sooner
        log.warning(
            "%s: basic_auth_users hashed at bcrypt costs %s: a wrong password for a user of a "
            "lower cost is answered sooner than one for a name that does not exist, which "
            "tells that the name exists; hash them all at one cost",
            where.path,
            ", ".join(f"{c:02d}" for c in sorted(costs)),
        )
    return users
