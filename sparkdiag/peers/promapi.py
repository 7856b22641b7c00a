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
import math
import re
import ssl
import stat
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sparkdiag import safeload
from sparkdiag.errors import Exit, SparkdiagError, UsageError
from sparkdiag.peers.httpget import FetchError, get, url_problem

MAX_ANSWER_BYTES = 64 << 20  # a fleet of 1000 GPUs answers a few MiB; never read more than this
# Series in one answer: 10,000 GPUs at 10 kernels. 580,000 short ones fit in 64 MiB, and six
# such answers held 2.7 GiB and took 80 s (the hostile-client review); counted in the body's
# bytes before it is parsed (a parse of 1.49 million took 641 MiB, the review of that fix).
MAX_SAMPLES = 100_000
# Lists, objects and their items in one answer, counted in the body before the parse: a series
# is about 20 (its labels, its value); 20 million empty lists in 57 MiB held 1.8 GiB, and one
# series of 4 million labels 2.4 GiB (the security review of 2026-12-05)
MAX_TOKENS = 20 * MAX_SAMPLES
MAX_LABELS = 64  # labels of one series (Prometheus' own label limits are of this order)
MAX_CONFIG_BYTES = 1 << 20  # an HTTP config is a few hundred bytes
MAX_SECRET_BYTES = 1 << 16
MAX_SERVER_NAME = 253  # characters of a DNS name (RFC 1035), dots included
Say = Callable[[str], None]  # where a warning goes (the command's standard error)
# A sample value as Prometheus writes it (Go's strconv.FormatFloat, 'f' or 'e'), or one of its
# three special values; nothing that Python's float() also takes ("1_000", " 12", "infinity").
_VALUE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
_SPECIAL = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf, "Inf": math.inf}


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
        why = url_problem(self.url)
        if why is not None:  # the URL itself is not echoed: it may hold a password
            raise UsageError(why, flag="--prometheus")
        if (self.cert_file is None) != (self.key_file is None):
            raise UsageError("a client certificate needs both its cert file and its key file")
        if (self.username is not None or self.password is not None) and self.bearer is not None:
            raise UsageError("give basic auth or an authorization token, not both")
        if self.bearer is not None and not (self.bearer.isascii() and self.bearer.isprintable()):
            raise UsageError("the authorization token must be printable ASCII (it is a header)")


def read_secret(path: Path, flag: str, what: str = "the password", say: Say | None = None) -> str:
    """A password or token file, trailing whitespace removed (as Prometheus reads them): a
    regular file of at most 64 KiB, UTF-8, without control characters (it goes into a header).
    One that its group or other users may read or write is used, with a warning to ``say``
    (``what``: the password or the token, in the warning's words)."""
    with safeload.reading(path, lambda line: UsageError(line, flag=flag)):
        secret = safeload.text(safeload.read_file(path, MAX_SECRET_BYTES)).strip()
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in secret):
        raise UsageError(f"{path}: a control character in the secret", flag=flag)
    warn_if_open(path, what, say)
    return secret


def warn_if_open(path: Path, what: str, say: Say | None) -> None:
    """Tell ``say`` in one line, in the words ``link`` refuses such a secret file with, when
    users other than its owner may read, write or execute ``path`` (a file read a moment ago:
    it is warned about, not refused, as promtool and Prometheus use such files too)."""
    if say is None:
        return
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) and mode & 0o077:
        from sparkdiag.link.auth import open_to_others

        say(f"warning: {path} {open_to_others(mode, what)}: chmod 600 {path}")


def server_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be the TLS server name (SNI and the name the certificate is checked
    against), or None: at most 253 characters, no control character (a NUL made a TypeError
    traceback), each label 1 to 63 characters that IDNA can encode (``prometheus..example``
    and a label of 64 made a UnicodeError traceback)."""
    if len(name) > MAX_SERVER_NAME:
        return f"is longer than the {MAX_SERVER_NAME} characters of a host name"
    if not name.isprintable():
        return "holds a control character (a NUL, a newline)"
    try:
        name.encode("idna")
    except UnicodeError:
        return (
            "is not a host name (an empty label, a label over 63 characters, or a character "
            "that IDNA cannot encode)"
        )
    return None


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


def from_http_config(path: Path, url: str, timeout: float, say: Say | None = None) -> Connection:
    """A connection from promtool's ``--http.config.file``; paths in it are relative to it.
    ``say`` is warned of the file, or a password or token file it names, open to others."""
    flag = "--http.config.file"
    from sparkdiag.safeyaml import load_yaml  # PyYAML only when a YAML file is read

    with safeload.reading(path, lambda line: UsageError(line, flag=flag)):
        doc = load_yaml(path, MAX_CONFIG_BYTES) or {}
    top = _table(doc, _HTTP_KEYS, "the file", path)
    basic = _table(top.get("basic_auth"), _BASIC_KEYS, "basic_auth", path)
    auth = _table(top.get("authorization"), _AUTHORIZATION_KEYS, "authorization", path)
    tls = _table(top.get("tls_config"), _TLS_KEYS, "tls_config", path)

    def file(value: Any) -> Path | None:
        if value is None:
            return None
        found = Path(str(value))
        return found if found.is_absolute() else path.parent / found

    warn_if_open(path, "the credentials or settings in it", say)
    password = basic.get("password")
    if basic.get("password_file") is not None:
        password = read_secret(file(basic["password_file"]) or path, flag, "the password", say)
    bearer = auth.get("credentials") or top.get("bearer_token")
    token_file = auth.get("credentials_file") or top.get("bearer_token_file")
    if token_file is not None:
        bearer = read_secret(file(token_file) or path, flag, "the token", say)
    if auth.get("type", "Bearer") != "Bearer":
        raise UsageError(f"{path}: authorization type {auth['type']!r}: only Bearer", flag=flag)
    skip = tls.get("insecure_skip_verify", False)
    if not isinstance(skip, bool):
        raise UsageError(
            f"{path}: tls_config.insecure_skip_verify must be true or false", flag=flag
        )
    server_name = None if tls.get("server_name") is None else str(tls["server_name"])
    why = None if server_name is None else server_name_problem(server_name)
    if why is not None:
        shown = repr(server_name)[:80]
        raise UsageError(f"{path}: tls_config.server_name {shown} {why}", flag=flag)
    return Connection(
        url=url,
        ca_file=file(tls.get("ca_file")),
        cert_file=file(tls.get("cert_file")),
        key_file=file(tls.get("key_file")),
        insecure_skip_verify=skip,
        server_name=server_name or None,
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
    say: Say | None = None,
) -> Connection:
    """The connection the command's flags describe (``http_config`` first, the flags over it);
    ``say`` is warned of a file of credentials that others may read or write."""
    base = (
        from_http_config(http_config, url, timeout, say)
        if http_config
        else Connection(url, timeout=timeout)
    )
    changes: dict[str, Any] = {}
    for name, value in (
        ("ca_file", ca_file),
        ("cert_file", cert_file),
        ("key_file", key_file),
        ("insecure_skip_verify", insecure_skip_verify),
        ("username", username),
    ):
        if value is not None:
            changes[name] = value
    if password_file is not None:
        changes["password"] = read_secret(
            password_file, "--prometheus-password-file", "the password", say
        )
    if "username" in changes or "password" in changes:  # basic auth by flag: the file's token goes
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
        # the scheme as urlsplit reads it (lower case): "HTTPS://" is https too
        https = urllib.parse.urlsplit(conn.url).scheme == "https"
        self._context = self._ssl() if https else None

    def _ssl(self) -> ssl.SSLContext:
        conn = self.conn
        try:
            context = ssl.create_default_context(cafile=str(conn.ca_file) if conn.ca_file else None)
            if conn.cert_file is not None and conn.key_file is not None:
                safeload.load_cert_chain(context, conn.cert_file, conn.key_file)
        except safeload.EncryptedKey as exc:
            raise UsageError(str(exc), flag="--prometheus-key-file") from None
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"TLS files: {exc}", flag="--prometheus-ca-file") from None
        if conn.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "sparkdiag-fleet"}
        if self.conn.username is not None or self.conn.password is not None:
            # a password without a user name is sent with an empty one, as Prometheus' own
            # client does (prometheus/common config: basic auth when basic_auth is set); before,
            # nothing at all was sent, and the 401 advised the flags already given
            pair = f"{self.conn.username or ''}:{self.conn.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        elif self.conn.bearer is not None:
            headers["Authorization"] = f"Bearer {self.conn.bearer}"
        return headers

    def query(self, expr: str) -> list[Sample]:
        """An instant query of a vector expression; its samples (any other answer, a scalar
        too, is a :class:`PrometheusError`: every query fleet asks is a vector).
        ``conn.timeout`` bounds the whole query (connecting, TLS, every byte of the answer)."""
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        where = f"Prometheus at {self.base}"
        try:
            answer = get(
                url,
                self._headers(),
                self.conn.timeout,
                self._context,
                MAX_ANSWER_BYTES,
                self.conn.server_name,
            )
        except FetchError as exc:
            raise PrometheusError(self._failed(where, exc)) from None
        if answer.status != 200:
            raise PrometheusError(
                self._http_error(where, answer.status, answer.reason, answer.body)
            )
        return parse_answer(where, answer.body)

    def _http_error(self, where: str, status: int, reason: str, body: bytes) -> str:
        if status in (401, 403):
            return f"{where} refused the query (HTTP {status} {reason}): {self._refused()}"
        detail = ""
        try:
            doc = safeload.parse_json(body[: 1 << 16])
        except safeload.LoadError:
            doc = None
        if isinstance(doc, Mapping) and isinstance(doc.get("error"), str):
            detail = " ".join(doc["error"].split())[:300]
        return f"{where} answered HTTP {status} {reason}" + (f": {detail}" if detail else "")

    def _refused(self) -> str:
        """What was sent with a refused query, and what to check: the credentials' flags are
        advised only where none were sent."""
        conn = self.conn
        if conn.username is None and conn.password is None:
            if conn.bearer is not None:
                return (
                    "it refused the bearer token sent (authorization in --http.config.file); "
                    "check the token, and that it may query"
                )
            return (
                "it wants credentials, and none were sent; give --prometheus-username and "
                "--prometheus-password-file (or --http.config.file)"
            )
        user = f"user {conn.username!r}"[:80] if conn.username else "an empty user name"
        sent = f"it refused the basic auth sent ({user}, {'a' if conn.password else 'no'} password)"
        if not conn.username:
            return f"{sent}; give the user name with --prometheus-username (or basic_auth.username)"
        if not conn.password:
            return (
                f"{sent}; give the password with --prometheus-password-file (or "
                "basic_auth.password_file)"
            )
        return f"{sent}; check the user name and the password, and that the user may query"

    def _failed(self, where: str, exc: FetchError) -> str:
        text = str(exc)
        if exc.kind in ("malformed", "too_large", "redirect"):
            return f"{where} {text}"
        if exc.kind == "timeout":
            return f"{where}: {text}; raise --prometheus-timeout, or check that it is not slow"
        if "Hostname mismatch" in text or "IP address mismatch" in text:
            hint = (
                "the certificate is not for the host in the URL: give the name it is for in the "
                "URL, or as tls_config.server_name in --http.config.file"
            )
        elif "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            hint = "give its CA with --prometheus-ca-file (or --prometheus-insecure-skip-verify)"
        elif exc.kind == "tls":
            hint = "check the URL's scheme (http or https) and the TLS files"
        else:
            hint = "check the URL, that Prometheus runs and that this host may reach it"
        return f"cannot reach {where}: {text}; {hint}"


def parse_answer(where: str, body: bytes) -> list[Sample]:
    """The samples of an API answer, read strictly: a label value is a string, a sample's
    value a string in Prometheus' number format (NaN and the infinities are kept as such: the
    caller names them as bad data). PrometheusError for an error or a body that is not one."""
    series = body.count(b'"metric"')  # counted before the parse builds them all
    if series > MAX_SAMPLES:
        raise PrometheusError(_too_many(where, series))
    tokens = body.count(b"[") + body.count(b"{") + body.count(b",")
    if tokens > MAX_TOKENS:
        raise PrometheusError(
            f"{where} answered {tokens} lists, objects and items, more than the {MAX_TOKENS} "
            f"sparkdiag reads ({MAX_SAMPLES} series of some 20): is that a sparkdiag fleet?"
        )
    try:
        doc = safeload.parse_json(body)
    except safeload.LoadError as exc:
        if str(exc).startswith(("not valid JSON", "not UTF-8")):
            raise PrometheusError(f"{where} did not answer JSON: is the URL Prometheus'?") from None
        raise PrometheusError(f"{where} answered JSON that is not read: {exc}") from None
    if not isinstance(doc, Mapping) or doc.get("status") != "success":
        error = doc.get("error") if isinstance(doc, Mapping) else None
        shown = " ".join(error.split())[:300] if isinstance(error, str) else "no status"
        raise PrometheusError(f"{where} answered an error: {shown}")
    data = doc.get("data")
    if not isinstance(data, Mapping):
        raise PrometheusError(f"{where} answered no data: is the URL Prometheus'?")
    kind, result = data.get("resultType"), data.get("result")
    if kind != "vector" or not isinstance(result, list):
        shown = kind if isinstance(kind, str) else "answer"
        raise PrometheusError(f"{where} answered a {shown[:40]}, not an instant vector")
    if len(result) > MAX_SAMPLES:  # one whose "metric" keys were written some other way
        raise PrometheusError(_too_many(where, len(result)))
    samples = []
    for item in result:
        metric = item.get("metric") if isinstance(item, Mapping) else None
        if not isinstance(metric, Mapping) or not all(isinstance(v, str) for v in metric.values()):
            raise PrometheusError(f"{where} answered a sample whose labels are not strings")
        if len(metric) > MAX_LABELS:
            raise PrometheusError(
                f"{where} answered a series of {len(metric)} labels, more than the "
                f"{MAX_LABELS} sparkdiag reads"
            )
        samples.append(Sample(dict(metric), _value(where, item.get("value"))))
    return samples


def _too_many(where: str, series: int) -> str:
    return (
        f"{where} answered {series} series, more than the {MAX_SAMPLES} sparkdiag reads "
        "(10,000 GPUs at 10 kernels): is that a sparkdiag fleet?"
    )


def _value(where: str, pair: Any) -> float:
    """The value of ``[timestamp, "value"]``, strictly (see :func:`parse_answer`)."""
    if (
        not isinstance(pair, list)
        or len(pair) != 2
        or isinstance(pair[0], bool)
        or not isinstance(pair[0], (int, float))
        or not isinstance(pair[1], str)
    ):
        raise PrometheusError(
            f'{where} answered a sample that is not [timestamp, "value"]: {_shown_json(pair)}'
        )
    text = pair[1]
    if text in _SPECIAL:
        return _SPECIAL[text]
    if not _VALUE.fullmatch(text):
        raise PrometheusError(f"{where} answered the value {text[:40]!r}, not a number")
    number = float(text)
    if not math.isfinite(number):  # 1e999
        raise PrometheusError(f"{where} answered the value {text[:40]!r}, out of range")
    return number


def _shown_json(value: Any) -> str:
    return repr(value)[:60]
