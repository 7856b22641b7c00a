"""One HTTP(S) GET with every bound a query to a server we do not control needs.

The response is parsed by h11 (the same parser the exporter's server uses), so a malformed
answer (a bad status line, a bad chunk, an over-long head) is one :class:`FetchError` line, not
a traceback from ``http.client``. One deadline covers the whole exchange: name resolution,
connecting (each address of the host in turn, with the time left), the TLS handshake, sending
and every byte of the answer; a server that sends one byte a second is cut off at the deadline
by a timer that shuts the socket down, whatever the per-call timeouts would allow. The body is
read up to a limit.

Redirects are followed only where credentials cannot leak: to the same host, with the same
scheme and port, or from ``http`` to ``https`` on the same host. A redirect to another host, and
any redirect from ``https`` to ``http``, is refused with the place it pointed to (Go's
``net/http``, which promtool and Grafana use, drops the ``Authorization`` header on a redirect
to another host; refusing is stricter: neither the header, the query nor a client certificate
goes anywhere the user did not name).
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import h11

from sparkdiag.bounded import Overran, call_within

if TYPE_CHECKING:  # ssl (OpenSSL, some 5 MiB) is loaded by whoever makes the context
    import ssl

MAX_HEAD = 64 << 10  # a response head (status line and headers) larger than this is refused
MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)


class FetchError(Exception):
    """The answer could not be had; the message is one line that ends with a hint where one
    helps. ``kind`` is ``unreachable``, ``timeout``, ``tls``, ``malformed``, ``too_large`` or
    ``redirect``."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    body: bytes
    url: str  # where it came from, after redirects


def _origin(url: urllib.parse.SplitResult) -> tuple[str, str, int]:
    port = url.port or (443 if url.scheme == "https" else 80)
    return url.scheme, (url.hostname or "").lower(), port


USERINFO = (
    "an '@' in the URL is taken for a user and password, which are not used (not sent, not "
    "shown): give them with --prometheus-username and --prometheus-password-file (or the "
    "--http.config.file); percent-encode an '@' of a path or query (%40)"
)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be asked, or None: an http(s) URL with a host that can be looked up
    (each label at most 63 characters), a port from 0 to 65535, no user or password (they would
    be neither sent nor kept out of messages: credentials come from their own flags and files)
    and a path of printable ASCII without spaces (a request target; percent-encode the rest).
    A value typed by the user and a server's redirect are both checked with it: either made a
    traceback (the hostile-client review).

    Any '@' after the '//' is taken for a user and password before the URL is parsed: a
    password may hold a '/', '?' or '#', which ends the host for the parser (``http://bob:
    Zx9/kQ2p@host`` is host ``bob``, port ``Zx9`` to urllib), and urllib's own words quote
    what it could not read. No message here holds any part of the URL."""
    if "@" in url.partition("//")[2]:
        return USERINFO
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # urllib's text quotes the URL: our words instead
        return "not a URL (an IPv6 host needs both its brackets: [::1]:9090)"
    try:
        parts.port  # noqa: B018  # ValueError: a port out of range or not a number
    except ValueError:
        return "not a URL (its port is not a number from 0 to 65535)"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http:// or https:// URL"
    try:
        parts.hostname.encode("idna")
    except UnicodeError:
        return "its host name is not one that can be looked up"
    target = parts.path + parts.query
    if not target.isascii() or any(ch <= " " or ch == "\x7f" for ch in target):
        return "its path holds a space, a control or a non-ASCII character (percent-encode it)"
    return None


def redirect_allowed(source: str, target: str) -> str | None:
    """None when a redirect from ``source`` to ``target`` may be followed with the request's
    credentials, else why not."""
    old, new = urllib.parse.urlsplit(source), urllib.parse.urlsplit(target)
    if new.scheme not in ("http", "https") or not new.hostname:
        return "not an http:// or https:// URL"
    (old_scheme, old_host, _), (new_scheme, new_host, _) = _origin(old), _origin(new)
    if old_scheme == "https" and new_scheme == "http":
        return "from https to http: the credentials and the answer would travel unencrypted"
    if new_host != old_host:
        return "to another host: the credentials must not go there"
    if new_scheme == old_scheme and _origin(new) != _origin(old):
        return "to another port of the host: another service"
    return None


class _Deadline:
    """Shuts the socket down when the time is up, so that no read or write outlives it."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.seconds = seconds
        self.expired = False
        self._timer: threading.Timer | None = None

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            self.expired = True
            raise TimeoutError
        return left

    def guard(self, sock: socket.socket) -> None:
        def expire() -> None:
            self.expired = True
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

        self._timer = threading.Timer(max(self.end - time.monotonic(), 0.0), expire)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def get(
    url: str,
    headers: dict[str, str],
    timeout: float,
    context: ssl.SSLContext | None,
    max_body: int,
    server_name: str | None = None,
) -> Answer:
    """GET ``url`` within ``timeout`` seconds in all, redirects included (see the module);
    FetchError in one line on any failure. ``context`` is used for https."""
    deadline = _Deadline(timeout)
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        answer, location = _one(current, headers, deadline, context, max_body, server_name)
        if location is None:
            return answer
        why: str | None
        try:
            target = urllib.parse.urljoin(current, location)
        except ValueError:
            target, why = location, "not a URL"
        else:
            why = url_problem(target) or redirect_allowed(current, target)
            if why is None and context is None and target[:6].lower() == "https:":
                why = "to https, which was not asked for: no TLS settings were made for it"
        if why is not None:
            raise FetchError(
                f"redirected (HTTP {answer.status}) to {shown_url(target)}, not followed: {why}; "
                "if that is where the server is, give that URL",
                "redirect",
            )
        current = target
    raise FetchError(
        f"more than {MAX_REDIRECTS} redirects, the last to {shown_url(current)}", "redirect"
    )


def shown_url(url: str) -> str:
    """A URL for a message: without user and password, cut to 200 characters (by text, as a
    URL that cannot be parsed is shown too). Greedy: everything from the '//' to the last '@'
    goes, as a password may hold '/', '?', '#' and '@', and ``…@`` stands where it was
    (``http://bob:Zx9/kQ2p@host`` shows as ``http://…@host``: an '@' of a path, taken for
    credentials, does not leave a host the URL never named); without a '//', everything up to
    the last '@' (``bob:pw@host``: the user's name could be read as the scheme)."""
    if "@" in url:
        head, sep, rest = url.partition("//")
        tail = rest.rpartition("@")[2] if sep else url.rpartition("@")[2]
        url = f"{head}//…@{tail}" if sep else f"…@{tail}"
    return url[:200]


def _resolve(host: str, port: int, deadline: _Deadline) -> list[tuple[Any, ...]]:
    """The addresses of ``host`` (getaddrinfo), within what is left of the deadline: the
    lookup runs in a thread of its own (:func:`sparkdiag.bounded.call_within`), as getaddrinfo
    takes no timeout (a resolver that does not answer held the command for its own retries, 5 s
    and more per server in resolv.conf). TimeoutError when the time is up (the thread is left
    to finish by itself)."""

    def look_up() -> list[tuple[Any, ...]]:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)

    try:
        return call_within(deadline.left(), f"resolve {host}", look_up)
    except Overran:
        deadline.expired = True
        raise


def _connect(parts: urllib.parse.SplitResult, deadline: _Deadline) -> socket.socket:
    """A connection to the URL's host within the deadline, name resolution included: each of
    its addresses is tried in turn with the time left then (not the whole timeout each, as
    ``socket.create_connection`` gave: three addresses that never answer took three times
    ``--prometheus-timeout``), none once the time is up. TimeoutError when it is."""
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = _resolve(host, port, deadline)
    except TimeoutError:
        raise FetchError(
            f"the host name {host!r} was not resolved within {deadline.seconds:g} s", "timeout"
        ) from None
    except socket.gaierror as exc:
        raise FetchError(
            f"the host name {host!r} does not resolve ({exc.strerror})", "unreachable"
        ) from None
    except (OSError, ValueError) as exc:  # UnicodeError: a name IDNA cannot encode
        raise FetchError(
            f"the host name {host!r} cannot be looked up ({exc})", "unreachable"
        ) from None
    failed: OSError | None = None
    for tried, (family, kind, proto, _, address) in enumerate(addresses):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())  # TimeoutError once the time is up
            sock.connect(address)
        except TimeoutError:
            sock.close()
            deadline.expired = True
            many = len(addresses) > 1
            of = f" ({tried + 1} of its {len(addresses)} addresses tried)" if many else ""
            raise FetchError(
                f"no connection within {deadline.seconds:g} s{of}", "timeout"
            ) from None
        except OSError as exc:
            sock.close()
            failed = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    if failed is None:
        raise FetchError(f"the host name {host!r} has no address", "unreachable")
    raise FetchError(str(failed.strerror or failed), "unreachable")


def _one(
    url: str,
    headers: dict[str, str],
    deadline: _Deadline,
    context: ssl.SSLContext | None,
    max_body: int,
    server_name: str | None,
) -> tuple[Answer, str | None]:
    parts = urllib.parse.urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    raw = _connect(parts, deadline)
    deadline.guard(raw)
    sock: socket.socket = raw
    try:
        if parts.scheme == "https":
            if context is None:
                raise FetchError("https without a TLS context", "tls")
            raw.settimeout(deadline.left())
            name = server_name or parts.hostname
            try:  # the name is checked here; the handshake (its errors are OSErrors) below
                sock = context.wrap_socket(raw, server_hostname=name, do_handshake_on_connect=False)
            except (ValueError, TypeError) as exc:  # UnicodeError too: a name that is none
                raise FetchError(
                    f"TLS: {name!r} cannot be the server name ({type(exc).__name__}): give a "
                    "host name or address as tls_config.server_name",
                    "tls",
                ) from None
            sock.do_handshake()
        return _exchange(sock, parts, target, headers, deadline, max_body)
    except (TimeoutError, OSError) as exc:
        if deadline.expired or isinstance(exc, TimeoutError):
            raise FetchError(
                f"no complete answer within {deadline.seconds:g} s (the whole exchange)", "timeout"
            ) from None
        if context is not None:  # only then can it be a TLS error, and ssl is loaded
            import ssl

            if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
                # OpenSSL's words: "Hostname mismatch, certificate is not valid for ...",
                # "self-signed certificate": the reason alone said only that it failed
                said = f"{exc.reason}: {exc.verify_message}"
                raise FetchError(f"TLS: {said[:300]}", "tls") from exc
            if isinstance(exc, ssl.SSLError):
                raise FetchError(f"TLS: {exc.reason or exc}", "tls") from exc
        raise FetchError(str(exc.strerror or exc), "unreachable") from None
    finally:
        deadline.cancel()
        sock.close()
        raw.close()


def _exchange(
    sock: socket.socket,
    parts: urllib.parse.SplitResult,
    target: str,
    headers: dict[str, str],
    deadline: _Deadline,
    max_body: int,
) -> tuple[Answer, str | None]:
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
    host = parts.netloc.rpartition("@")[2]
    request = h11.Request(
        method="GET",
        target=target.encode("ascii", "strict"),
        headers=[("Host", host), *headers.items(), ("Connection", "close")],
    )
    sock.settimeout(deadline.left())
    sock.sendall(conn.send(request) + conn.send(h11.EndOfMessage()))
    response: h11.Response | None = None
    body = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise FetchError(f"answered malformed HTTP ({plain(str(exc))})", "malformed") from None
        if event is h11.NEED_DATA:
            sock.settimeout(deadline.left())
            data = sock.recv(65536)
            if deadline.expired:  # the timer shut the socket down: that is the empty read
                raise TimeoutError
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > max_body:
                raise FetchError(f"answered more than {max_body >> 20} MiB", "too_large")
        elif isinstance(event, h11.EndOfMessage) and response is not None:
            break
        elif isinstance(event, h11.ConnectionClosed):
            raise FetchError("closed the connection before the whole answer", "malformed")
        elif isinstance(event, h11.InformationalResponse):
            continue
    status = response.status_code
    reason = response.reason.decode("latin-1")
    location = None
    if status in REDIRECTS:
        found = [v for k, v in response.headers if k == b"location"]
        if found:
            location = found[0].decode("latin-1")
    return Answer(status, reason, bytes(body), urllib.parse.urlunsplit(parts)), location


_BYTES_REPR = re.compile(r"""bytearray\(b('|")(.*?)\1\)|\bb('|")(.*?)\3""")


def plain(message: str) -> str:
    """h11's message in words: a ``bytearray(b'X Y: v')`` in it shown as ``'X Y: v'`` (the
    exporter's server says its 400s with it too)."""
    return _BYTES_REPR.sub(lambda m: f"'{m.group(2) or m.group(4) or ''}'", message)[:200]
