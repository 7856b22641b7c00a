"""Instant queries to a Prometheus through its HTTP API (``GET /api/v1/query``), nothing else.

TLS and basic auth are given as promtool takes them: either flags (a CA file, a client
certificate and key, skipping verification, a username and a password file) or the file that
promtool reads with ``--http.config.file`` (Prometheus' HTTP client configuration: ``basic_auth``,
``authorization``, ``tls_config``); flags win over the file. Every failure is one
:class:`PrometheusError` line that says which Prometheus, what went wrong and what to try; it ends
the command with exit status 3.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from sparkdiag.errors import Exit, SparkdiagError, UsageError

MAX_ANSWER_BYTES = 64 << 20  # a fleet of 1000 GPUs answers a few MiB; never read more than this


class PrometheusError(SparkdiagError):
    """Prometheus could not be asked, refused, or answered with an error."""

    exit_code = Exit.FAILED


@dataclass(frozen=True)
class Connection:
    """Where and how to ask. ``password`` and ``bearer`` are secrets read from files."""

    url: str
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure_skip_verify: bool = False
    server_name: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    bearer: str | None = field(default=None, repr=False)
    timeout: float = 10.0

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UsageError(f"{self.url!r} is not an http:// or https:// URL", flag="--prometheus")
        if (self.cert_file is None) != (self.key_file is None):
            raise UsageError("a client certificate needs both its cert file and its key file")
        if self.username is not None and self.bearer is not None:
            raise UsageError("give basic auth or an authorization token, not both")


def read_secret(path: Path, flag: str) -> str:
    """A password or token file, trailing whitespace removed (as Prometheus reads them)."""
    try:
        with path.open("rb") as stream:
            raw = stream.read(1 << 16)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}", flag=flag) from None
    try:
        return raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text", flag=flag) from None


_HTTP_KEYS = {"basic_auth", "authorization", "tls_config", "bearer_token", "bearer_token_file"}
_BASIC_KEYS = {"username", "password", "password_file"}
_AUTHORIZATION_KEYS = {"type", "credentials", "credentials_file"}
_TLS_KEYS = {"ca_file", "cert_file", "key_file", "insecure_skip_verify", "server_name"}


def _table(raw: Any, keys: set[str], where: str, path: Path) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise UsageError(f"{path}: {where} must be a mapping", flag="--http.config.file")
    unknown = sorted(set(map(str, raw)) - keys)
    if unknown:
        raise UsageError(
            f"{path}: {where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(keys))})",
            flag="--http.config.file",
        )
    return raw


def from_http_config(path: Path, url: str, timeout: float) -> Connection:
    """A connection from promtool's ``--http.config.file``; paths in it are relative to it."""
    flag = "--http.config.file"
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}", flag=flag) from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not YAML: {str(exc).splitlines()[0]}", flag=flag) from None
    top = _table(doc, _HTTP_KEYS, "the file", path)
    basic = _table(top.get("basic_auth"), _BASIC_KEYS, "basic_auth", path)
    auth = _table(top.get("authorization"), _AUTHORIZATION_KEYS, "authorization", path)
    tls = _table(top.get("tls_config"), _TLS_KEYS, "tls_config", path)

    def file(value: Any) -> Path | None:
        if value is None:
            return None
        found = Path(str(value))
        return found if found.is_absolute() else path.parent / found

    password = basic.get("password")
    if basic.get("password_file") is not None:
        password = read_secret(file(basic["password_file"]) or path, flag)
    bearer = auth.get("credentials") or top.get("bearer_token")
    token_file = auth.get("credentials_file") or top.get("bearer_token_file")
    if token_file is not None:
        bearer = read_secret(file(token_file) or path, flag)
    if auth.get("type", "Bearer") != "Bearer":
        raise UsageError(f"{path}: authorization type {auth['type']!r}: only Bearer", flag=flag)
    skip = tls.get("insecure_skip_verify", False)
    if not isinstance(skip, bool):
        raise UsageError(
            f"{path}: tls_config.insecure_skip_verify must be true or false", flag=flag
        )
    return Connection(
        url=url,
        ca_file=file(tls.get("ca_file")),
        cert_file=file(tls.get("cert_file")),
        key_file=file(tls.get("key_file")),
        insecure_skip_verify=skip,
        server_name=None if tls.get("server_name") is None else str(tls["server_name"]),
        username=None if basic.get("username") is None else str(basic["username"]),
        password=None if password is None else str(password),
        bearer=None if bearer is None else str(bearer),
        timeout=timeout,
    )


def connection(
    url: str,
    timeout: float,
    http_config: Path | None = None,
    ca_file: Path | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    insecure_skip_verify: bool | None = None,
    username: str | None = None,
    password_file: Path | None = None,
) -> Connection:
    """The connection the command's flags describe (``http_config`` first, the flags over it)."""
    base = (
        from_http_config(http_config, url, timeout)
        if http_config
        else Connection(url, timeout=timeout)
    )
    changes: dict[str, Any] = {}
    for name, value in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file),
                        ("insecure_skip_verify", insecure_skip_verify),
                        ("username", username)):  # fmt: skip
        if value is not None:
            changes[name] = value
    if password_file is not None:
        changes["password"] = read_secret(password_file, "--prometheus-password-file")
    if "username" in changes:
        changes["bearer"] = None
    return replace(base, **changes)


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


class PrometheusClient:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.base = conn.url.rstrip("/")
        self._context = self._ssl() if conn.url.startswith("https:") else None

    def _ssl(self) -> ssl.SSLContext:
        conn = self.conn
        try:
            context = ssl.create_default_context(cafile=str(conn.ca_file) if conn.ca_file else None)
            if conn.cert_file is not None and conn.key_file is not None:
                context.load_cert_chain(str(conn.cert_file), str(conn.key_file))
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"TLS files: {exc}", flag="--prometheus-ca-file") from None
        if conn.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "sparkdiag-fleet"}
        if self.conn.username is not None:
            pair = f"{self.conn.username}:{self.conn.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        elif self.conn.bearer is not None:
            headers["Authorization"] = f"Bearer {self.conn.bearer}"
        return headers

    def query(self, expr: str) -> list[Sample]:
        """An instant query; the vector's samples (a scalar as one sample without labels)."""
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        request = urllib.request.Request(url, headers=self._headers())
        where = f"Prometheus at {self.base}"
        try:
            with urllib.request.urlopen(  # http and https only (Connection checks)
                request, timeout=self.conn.timeout, context=self._context
            ) as answer:
                body = answer.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise PrometheusError(self._http_error(where, exc)) from None
        except urllib.error.URLError as exc:
            raise PrometheusError(self._unreachable(where, exc.reason)) from None
        except (TimeoutError, OSError) as exc:
            raise PrometheusError(self._unreachable(where, exc)) from None
        if len(body) > MAX_ANSWER_BYTES:
            raise PrometheusError(f"{where} answered more than {MAX_ANSWER_BYTES >> 20} MiB")
        return parse_answer(where, body)

    def _http_error(self, where: str, exc: urllib.error.HTTPError) -> str:
        if exc.code in (401, 403):
            given = (
                "credentials were refused"
                if "Authorization" in self._headers()
                else ("it wants credentials")
            )
            return (
                f"{where} refused the query (HTTP {exc.code} {exc.reason}): {given}; give "
                "--prometheus-username and --prometheus-password-file (or --http.config.file)"
            )
        detail = ""
        with contextlib.suppress(ValueError, AttributeError, OSError):
            detail = str(json.loads(exc.read(1 << 16)).get("error", ""))
        return f"{where} answered HTTP {exc.code} {exc.reason}" + (f": {detail}" if detail else "")

    def _unreachable(self, where: str, reason: object) -> str:
        text = str(reason)
        if isinstance(reason, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
            hint = "give its CA with --prometheus-ca-file (or --prometheus-insecure-skip-verify)"
        elif isinstance(reason, ssl.SSLError):
            hint = "check the URL's scheme (http or https) and the TLS files"
        else:
            hint = "check the URL, that Prometheus runs and that this host may reach it"
        return f"cannot reach {where}: {text or type(reason).__name__}; {hint}"


def parse_answer(where: str, body: bytes) -> list[Sample]:
    """The samples of an API answer; PrometheusError for an error or a body that is not one."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise PrometheusError(f"{where} did not answer JSON: is the URL Prometheus'?") from None
    if not isinstance(doc, Mapping) or doc.get("status") != "success":
        error = doc.get("error") if isinstance(doc, Mapping) else None
        raise PrometheusError(f"{where} answered an error: {error or 'no status'}")
    data = doc.get("data")
    if not isinstance(data, Mapping):
        raise PrometheusError(f"{where} answered no data: is the URL Prometheus'?")
    kind, result = data.get("resultType"), data.get("result")
    try:
        if kind == "scalar":
            return [Sample({}, float(result[1]))]  # type: ignore[index]
        if kind != "vector" or not isinstance(result, list):
            raise PrometheusError(f"{where} answered a {kind}, not an instant vector")
        return [
            Sample({str(k): str(v) for k, v in item["metric"].items()}, float(item["value"][1]))
            for item in result
        ]
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        raise PrometheusError(f"{where} answered a vector this sparkdiag cannot read") from None
