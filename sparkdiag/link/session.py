"""The measuring side's connections: the control session with the peer's ``link serve`` (both
sides proving they hold the link secret, then its hello read and checked, and every control line
after it sealed with a mac under the session key) and the data sockets, bound to the path's
interface and address; each failure to connect said in one line."""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkdiag.errors import Exit, SparkdiagError, UsageError
from sparkdiag.link import auth
from sparkdiag.link.model import DIRECTIONS
from sparkdiag.link.readings import CUDA_TIMEOUT
from sparkdiag.link.wire import (
    HELLO_TIMEOUT,
    PORT,
    VERSION,
    LineReader,
    MacError,
    ProtocolError,
    Sealed,
    hello,
    is_hello,
    send,
)

# Seconds to wait for the hello once the peer has taken this side's proof: it reads its fabric
# then (its lint, its interfaces) and, once per process, the CUDA attributes in a subprocess
# of up to CUDA_TIMEOUT seconds. 5 s (HELLO_TIMEOUT) read a slow first hello as "not link serve".
HELLO_AFTER_PROOF = CUDA_TIMEOUT + 2 * HELLO_TIMEOUT


class LinkError(SparkdiagError):
    """The test could not be done: the peer unreachable, refusing, not ``link serve``, busy,
    or no path with a carrier."""

    exit_code = Exit.FAILED


@dataclass(frozen=True)
class Options:
    """port: the peer's; seconds: per method and direction; streams: parallel TCP streams;
    directions: ``to-peer``, ``from-peer``; interfaces: only these local interfaces;
    address_only: only the route to PEER; use_tools: run iperf3/ib_write_bw where both sides
    have them; connect_timeout: seconds; budget: stop starting measurements after this many
    seconds (None: no bound); secret: the link secret both machines hold."""

    port: int = PORT
    seconds: float = 3.0
    streams: int = 8
    directions: tuple[str, ...] = DIRECTIONS
    interfaces: tuple[str, ...] = ()
    address_only: bool = False
    use_tools: bool = True
    connect_timeout: float = 3.0
    budget: float | None = None
    secret: bytes = field(default=b"", repr=False)


def endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def connect_error(exc: OSError, where: str, timeout: float) -> str:
    """One line for a failed connect to ``where``."""
    if isinstance(exc, ConnectionRefusedError):
        return (
            f"{where} refused the connection: nothing listens on that port there; start "
            "'sparkdiag link serve' on the peer (or give the port it listens on with --port)"
        )
    if isinstance(exc, TimeoutError):
        return (
            f"{where} did not answer within {timeout:g} s: the host is down or unreachable, or "
            "a firewall drops the port"
        )
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL):
        return (
            f"{where} is unreachable ({exc.strerror}): no host answers at that address; check "
            "the address and that both ends of the cable are up (ip -br addr)"
        )
    return f"{where}: {exc.strerror or exc}"


def peer_and_port(text: str, flag: str = "--peer") -> tuple[str, int | None]:
    """``HOST``, ``HOST:PORT``, ``[V6]``, ``[V6]:PORT`` or a bare IPv6 address -> (host, the
    port it gives, or None); a malformed one is a usage error naming ``flag``: after ``]``
    nothing or ``:PORT`` (``[::1]x`` was taken as ``::1``), and a ``:`` with no port after it
    (``127.0.0.1:``) is refused, not read as the default port."""
    text = text.strip()
    port_text: str | None = None
    bad = False
    if text.startswith("["):
        host, closed, rest = text[1:].partition("]")
        bad = not closed or not (rest == "" or rest.startswith(":"))
        port_text = rest[1:] if rest.startswith(":") else None
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host = text
    if (
        bad
        or not host
        or (
            port_text is not None
            and not (port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536)
        )
    ):
        raise UsageError(
            f"{text!r}: give HOST or HOST:PORT ([IPV6]:PORT for an IPv6 address; a port from 1 "
            "to 65535)",
            flag=flag,
        )
    return host, None if port_text is None else int(port_text)


def split_peer(text: str, flag: str = "--peer") -> tuple[str, int]:
    """``HOST``, ``HOST:PORT``, ``[V6]:PORT`` or a bare IPv6 address -> (host, port), the
    default port where it gives none."""
    host, port = peer_and_port(text, flag)
    return host, PORT if port is None else port


def resolve(peer: str, port: int) -> tuple[int, tuple[Any, ...]]:
    """(family, socket address) of ``peer``; UsageError (exit 2) for a name that does not
    resolve."""
    try:
        info = socket.getaddrinfo(peer, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            raise UsageError(
                f"{peer!r}: not an address, and no such host name ({exc.strerror})", flag="PEER"
            ) from None
        raise LinkError(f"{peer}: the name cannot be resolved now ({exc.strerror})") from None
    except UnicodeError as exc:
        raise UsageError(f"{peer!r}: not a host name ({exc})", flag="PEER") from None
    family, _, _, _, address = info[0]
    return family, address


def open_socket(
    address: str,
    port: int,
    timeout: float,
    source: str | None = None,
    device: str | None = None,
) -> socket.socket:
    """A TCP connection to ``address:port``, from ``source`` and through ``device`` when given
    (SO_BINDTODEVICE, where this process may; else the source address alone picks the route)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if device:
            with contextlib.suppress(PermissionError, OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
        if source:
            sock.bind((source, 0))
        sock.settimeout(timeout)
        sock.connect((address, port))
    except BaseException:
        sock.close()
        raise
    return sock


# said of a line read before the session key exists (it cannot carry a mac): taken at its word
UNSEALED = "unless something on the path answered in its place: this line cannot be checked"
ALTERED = (
    "something between the two machines alters this session's control lines; nothing from it "
    "is believed"
)


@dataclass
class Control:
    """The session: its hello (checked, without its mac) and its sealed control channel."""

    hello: Mapping[str, Any]
    channel: Sealed
    where: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def sock(self) -> socket.socket:
        return self.channel.sock

    @property
    def token(self) -> str:
        return str(self.hello.get("session", ""))

    def ask(self, request: dict[str, Any], timeout: float = 30.0) -> Mapping[str, Any]:
        """The peer's answer to ``request``; LinkError when it fails its mac, or when the peer
        ended the session because ``request`` failed the peer's (the rest of the session is
        not to be believed either way)."""
        with self.lock:
            self.channel.send(request)
            try:
                answer = self.channel.read(timeout)
            except MacError as exc:
                raise LinkError(f"{self.where}: session refused: {exc}: {ALTERED}") from None
        if "refused" in answer:
            refused = str(answer["refused"])[:200]
            raise LinkError(f"{self.where} ended the session: {refused}: {ALTERED}")
        return answer


def open_control(peer: str, port: int, timeout: float, secret: bytes) -> Control:
    """Connect to the peer's ``link serve``, prove this side holds ``secret`` and check that it
    does too, then read its hello; LinkError in one line when it is not there, refuses, is
    something else, holds another secret, or is busy."""
    family, address = resolve(peer, port)
    where = endpoint(peer, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(address)
    except OSError as exc:
        sock.close()
        raise LinkError(connect_error(exc, where, timeout)) from None
    try:
        channel, answer = _open(sock, where, secret)
    except BaseException:
        sock.close()
        raise
    return Control(answer, channel, where)


def _open(sock: socket.socket, where: str, secret: bytes) -> tuple[Sealed, dict[str, Any]]:
    reader = LineReader(sock)
    mine = auth.nonce()
    try:
        send(sock, hello("control", nonce=mine))
        try:
            challenge = reader.read(HELLO_TIMEOUT)
        except ConnectionError:
            if reader.rest:  # something, then closed: said below as another service
                raise
            # a link serve of protocol 2 (or 1) closes on this opening without a word
            raise LinkError(
                f"{where} closed the connection at once, without a word: it is not 'sparkdiag "
                "link serve', or one of another sparkdiag (one of protocol 2 or older closes "
                "so): both sides must run the same sparkdiag"
            ) from None
        if is_hello(challenge) and auth.valid_nonce(challenge.get("challenge")):
            theirs = str(challenge["challenge"])
            send(sock, {"proof": auth.proof(secret, "client", theirs, mine)})
            try:
                answer = reader.read(HELLO_AFTER_PROOF)
            except TimeoutError:
                # it sent a sparkdiag challenge and took the proof: it is link serve, slow
                raise LinkError(
                    f"{where}: 'sparkdiag link serve' took this machine's proof but sent no "
                    f"hello within {HELLO_AFTER_PROOF:g} s (it reads its fabric and the CUDA "
                    "driver then): its log says why; try again"
                ) from None
            except (ConnectionError, OSError) as exc:  # closed; a garbled answer is said below
                # it sent a sparkdiag challenge: it is link serve, and it gave up after the proof
                raise LinkError(
                    f"{where} (sparkdiag link serve) closed the session after this machine's "
                    f"proof ({exc}): its log says why (out of file descriptors, a restart)"
                ) from None
        else:
            answer = challenge
    except TimeoutError:
        raise LinkError(
            f"{where} accepted the connection but sent nothing within {HELLO_TIMEOUT:g} s: it "
            "is not 'sparkdiag link serve' (another service on that port?)"
        ) from None
    except (ProtocolError, ConnectionError, OSError) as exc:
        raise LinkError(
            f"{where} answered, but not as 'sparkdiag link serve' ({exc}): another service "
            "listens on that port"
        ) from None
    spoken = challenge.get("sparkdiag-link")
    if spoken == 1:
        raise LinkError(
            f"{where} runs the 'sparkdiag link serve' of an older sparkdiag (protocol 1, "
            "without the link secret): both sides must run the same sparkdiag; update it there"
        )
    if type(spoken) is int and spoken != VERSION:
        raise LinkError(
            f"{where} runs the 'sparkdiag link serve' of another sparkdiag (protocol "
            f"{str(spoken)[:40]}, this one speaks {VERSION}): both sides must run the same "
            f"sparkdiag; update the older one ({UNSEALED})"
        )
    if not is_hello(challenge) or not is_hello(answer):
        raise LinkError(
            f"{where} answered, but not as 'sparkdiag link serve' (a JSON line without "
            f"sparkdiag-link {VERSION}: another version, or another service)"
        )
    if "challenge" not in challenge:
        raise LinkError(f"{where} answered without the challenge of 'sparkdiag link serve'")
    if not auth.valid(secret, "server", mine, str(challenge["challenge"]), answer.get("proof")):
        if str(answer.get("error", "")).startswith("authentication failed"):
            raise LinkError(
                f"{where} refused this machine's link secret: the two secret files differ; "
                f"copy the peer's (see 'sparkdiag link serve' there) to this machine ({UNSEALED})"
            )
        raise LinkError(
            f"{where} did not prove it holds the link secret: it is not your peer's "
            "'sparkdiag link serve'; nothing was measured"
        )
    key = auth.session_key(secret, str(challenge["challenge"]), mine)
    channel = Sealed(sock, reader, key, "client")
    try:  # the proof is right: the hello (or busy) must carry the mac of line 0 under the key
        answer = channel.check(answer)
    except MacError as exc:
        raise LinkError(f"{where}: session refused: {exc}: {ALTERED}") from None
    if answer.get("error"):
        raise LinkError(f"{where}: {str(answer['error'])[:200]}; try again when it is done")
    return channel, answer
