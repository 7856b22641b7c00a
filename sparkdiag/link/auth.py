"""Who may use a ``link serve``: the machines that hold the same secret file.

Setting it up takes one copy. ``sparkdiag link serve`` makes the file where none is (64
hexadecimal characters from ``secrets``, mode 0600, in ``~/.config/sparkdiag/link.secret`` or
the path ``--link.secret-file`` gives) and says so; copy it to the measuring machine, to the same
place (``scp``), and ``link test`` (and ``check --peer``) read it there. A file that its group
or other users can read or write is refused, as ssh refuses such a key, and so is one owned by
another user than the one sparkdiag runs as (or root): its owner can chmod it or write another
secret into it at any time. A directory of the file that others may write is warned about (they
could put another file in its place). Rotating it takes no restart: a running ``link serve``
reads the file again when it changes (:class:`LiveSecret`).

On the wire (:mod:`sparkdiag.link.wire`), HMAC-SHA256 challenge and response in both
directions, so that neither side learns anything from the other before it has proved it holds
the secret, and the secret never travels::

    measuring side  -> {"sparkdiag-link": 3, "kind": "control", "nonce": C}
    listening side  -> {"sparkdiag-link": 3, "challenge": S}             (nothing else)
    measuring side  -> {"proof": HMAC(secret, "client" S C)}
    listening side  -> {"sparkdiag-link": 3, "proof": HMAC(secret, "server" C S), hello...,
                        "mac": MAC(K, "server", 0, the line)}
    measuring side  -> {"op": ..., "mac": MAC(K, "client", 0, the line)}, and so on

``S`` and ``C`` are 32 random bytes each (hexadecimal), fresh per connection, so a recorded
proof answers no later challenge. The listening side checks the proof before it reads its
fabric, runs its lint or looks at whether it is busy.

The proofs alone would let a man in the middle relay them and then rewrite the hello (its
addresses: the data connections go to his machine) or a result. So, once through them, both
sides derive the session key ``K = HMAC(secret, "session" S C)`` (:func:`session_key`; it never
travels), and every control line from the hello on, both ways, carries ``mac``: HMAC-SHA256
under ``K`` of the sending side's role, its count of lines sent (8 bytes, big-endian, from 0)
and the line's canonical JSON without ``mac`` (:func:`mac`). The counts are not sent: each side
counts, so a line replayed, reordered or dropped fails the next check
(:class:`sparkdiag.link.wire.Sealed`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sparkdiag import safeload
from sparkdiag.errors import UsageError
from sparkdiag.filewatch import FileWatch

NONCE_BYTES = 32
MIN_SECRET = 16  # characters of a secret written by hand; the one made here has 64
MAX_SECRET_BYTES = 4096
FLAG = "--link.secret-file"
RECHECK_SECONDS = 1.0  # how often a running link serve looks at the file (stat) for a change
MAC = "mac"  # the field of a control line that carries its mac
MAKE = "python3 -c 'import secrets; print(secrets.token_hex(32))'"  # a secret, by hand


def default_path(environ: dict[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/sparkdiag/link.secret`` (``~/.config`` when unset)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sparkdiag" / "link.secret"


def read_secret(
    path: Path, *, serving: bool = False, say: Callable[[str], None] | None = None
) -> bytes:
    """The secret in ``path``; UsageError (exit 2) in one line when it is missing (or a
    symbolic link to nothing), open to other users, owned by another user (than the one this
    process runs as, or root), not a regular file, too long or too short. ``serving``: read
    again by a running ``link serve`` (:class:`LiveSecret`), which makes no secret, so the
    advice for a missing or short one is to write the new one. ``say`` is told of a directory
    that others may write (:func:`directory_warning`)."""
    try:
        found = path.stat()
    except FileNotFoundError:
        raise UsageError(_missing(path, serving), flag=FLAG) from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}", flag=FLAG) from None
    mode = found.st_mode
    if stat.S_ISREG(mode) and mode & 0o077:
        raise UsageError(f"{path} {open_to_others(mode)}: chmod 600 {path}", flag=FLAG)
    if stat.S_ISREG(mode) and found.st_uid not in (os.geteuid(), 0):
        raise UsageError(_not_owned(path, found.st_uid), flag=FLAG)
    with safeload.reading(path, lambda line: UsageError(line, flag=FLAG)):
        secret = safeload.text(safeload.read_file(path, MAX_SECRET_BYTES)).strip()
    if len(secret) < MIN_SECRET:
        fix = (
            f"write the new secret there, the same on every machine ({MAKE} makes one of 64)"
            if serving
            else "remove the file and 'sparkdiag link serve' makes one of 64"
        )
        raise UsageError(
            f"{path}: a secret of {len(secret)} characters is too short (at least {MIN_SECRET}; "
            f"{fix})",
            flag=FLAG,
        )
    if say is not None:
        warning = directory_warning(path)
        if warning is not None:
            say(warning)
    return secret.encode()


def _not_owned(path: Path, uid: int) -> str:
    """Why a secret file owned by user ``uid`` is refused, with the fix (as ssh refuses a key
    that another user owns: that user can change it whenever they like)."""
    me = os.geteuid()
    return (
        f"{path} is owned by {_user(uid)}, not by {_user(me)} that runs sparkdiag (or root): "
        f"its owner can read or replace the secret at any time; chown {_user(me)} {path} "
        "(as root), or use a copy of your own"
    )


def _user(uid: int) -> str:
    """A user's name where the system knows it, else the number."""
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def directory_warning(path: Path) -> str | None:
    """One line when users other than its owner may write the directory that holds the
    secret file (the file itself checked as it is: they could rename it away and put a file
    of their own in its place, or a symbolic link), else None."""
    directory = path.absolute().parent
    try:
        mode = directory.stat().st_mode
    except OSError:
        return None
    if not mode & 0o022:
        return None
    sticky = (
        " (sticky: only while none is there, as they cannot remove it)"
        if mode & stat.S_ISVTX
        else ""
    )
    who = _listed([n for n, bit in (("its group", 0o020), ("other users", 0o002)) if mode & bit])
    return (
        f"warning: the directory {directory} of the link secret is mode "
        f"{stat.S_IMODE(mode):03o}: {who} can write it, and so put another file in the "
        f"secret's place{sticky}: chmod go-w {directory}, or keep the secret elsewhere"
    )


def _missing(path: Path, serving: bool) -> str:
    """Why ``path`` is not there, and what to do: a symbolic link to nothing is named with
    where it points (copying a secret to the link's own path, as the plain advice says, would
    not be where the link leads, and 'sparkdiag link serve' makes no secret through a link)."""
    try:
        target = os.readlink(path)
    except OSError:  # not a link (or gone since)
        if serving:
            return (
                f"no link secret at {path} any more: write the new one there, the same file as "
                f"on the machines that measure this one (mode 0600; {MAKE} makes one)"
            )
        return (
            f"no link secret at {path}: copy the one 'sparkdiag link serve' made on the peer "
            f"to this machine (scp PEER:{path} {path}; chmod 600 {path})"
        )
    joined = os.path.join(path.parent, target)  # target itself when absolute
    shown = target if os.path.isabs(target) else f"{target} ({os.path.abspath(joined)})"
    if os.path.lexists(joined):  # a link to a link: where the chain ends
        shown += f", which leads to {os.path.realpath(path)}"
    return (
        f"{path} is a symbolic link to {shown}, which does not exist: put the link secret "
        f"there (the same file as on the peer, mode 0600), or point the link at the file that "
        f"holds it (ln -sfn FILE {path})"
    )


def open_to_others(mode: int, what: str = "the secret") -> str:
    """What users other than the owner may do with a file of ``mode`` (group and others told
    apart, reading and writing too), and what that lets them do to ``what`` it holds: ``is mode
    602: other users can write it, and so replace the secret with one they know``. ``sparkdiag
    fleet`` warns of its password and token files in the same words."""
    verbs = (("read", 4), ("write", 2), ("execute", 1))
    can = {
        name: _listed([verb for verb, bit in verbs if bits & bit])
        for name, bits in (("its group", (mode >> 3) & 7), ("other users", mode & 7))
        if bits
    }
    if len(can) == 2 and len(set(can.values())) == 1:
        who = f"its group and other users can {can['its group']} it"
    else:
        who = ", ".join(f"{name} can {done} it" for name, done in can.items())
    harm = {
        (True, True): f", and so learn or replace {what}",
        (True, False): f", and so learn {what}",
        (False, True): f", and so replace {what} with one they know",
    }.get((bool(mode & 0o044), bool(mode & 0o022)), "")
    return f"is mode {stat.S_IMODE(mode):03o}: {who}{harm}"


def _listed(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]


class LiveSecret:
    """The link secret as its file holds it now, for a ``link serve`` that runs for weeks: an
    operator rotates the secret by writing a new file on every machine, and no ``link serve``
    needs a restart (which would drop a measurement under way). The file is looked at (stat)
    at most once per :data:`RECHECK_SECONDS` (:class:`~sparkdiag.filewatch.FileWatch`, as
    ``serve`` follows its web config) and read again when it changed; what it holds then is
    the secret the next session must prove. A session under way proved itself at its start
    and goes on.

    A changed file that cannot be used (gone, a symbolic link to nothing, open to other users,
    empty, too short) leaves the last good secret in use: ``say`` is told once per problem,
    with what to do, and again when the file is usable."""

    def __init__(
        self,
        path: Path,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._say = say
        self._lock = threading.Lock()
        # looked at before the first read: a file replaced while it is read is read again
        self._file = FileWatch([path], RECHECK_SECONDS, clock)
        self._warned: set[str] = set()  # warnings said (a directory others may write): once
        self._secret = read_secret(path, say=self._warn)  # at start: a UsageError, exit 2
        self._problem: str | None = None  # what is wrong with the file, while it is unusable
        self.rotations = 0  # new secrets taken, for tests

    def current(self) -> bytes:
        """The secret a session starting now must prove."""
        with self._lock:
            if self._file.changed():
                self._reread()
            return self._secret

    def _warn(self, line: str) -> None:
        if line not in self._warned:
            self._warned.add(line)
            self._say(line)

    def _reread(self) -> None:
        try:
            secret = read_secret(self.path, serving=True, say=self._warn)
        except UsageError as exc:
            if exc.message != self._problem:  # once per problem, not per look or connection
                self._say(
                    "the link secret file changed and cannot be used, so new sessions still "
                    f"need the last good secret: {exc.message}"
                )
            self._problem = exc.message
            return
        was_unusable, self._problem = self._problem is not None, None
        if hmac.compare_digest(secret, self._secret):
            if was_unusable:
                self._say(f"the link secret file {self.path} is usable again (the same secret)")
            return
        self._secret = secret
        self.rotations += 1
        again = " is usable again and" if was_unusable else ""
        self._say(
            f"the link secret file {self.path}{again} holds a new secret: new sessions must "
            "prove it (a session under way goes on)"
        )


def make_secret(path: Path) -> bool:
    """Write a new secret to ``path`` unless a file is there; whether one was made."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}", flag=FLAG) from None
    with os.fdopen(fd, "w") as stream:
        stream.write(secrets.token_hex(32) + "\n")
    return True


def nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def proof(secret: bytes, role: str, first: str, second: str) -> str:
    """HMAC-SHA256 of ``role``, then the two nonces, under ``secret``."""
    message = f"sparkdiag-link {role} {first} {second}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def valid(secret: bytes, role: str, first: str, second: str, given: object) -> bool:
    """Whether ``given`` is the proof of ``role`` (compared in constant time). A proof is 64
    ASCII characters: compare_digest raises TypeError on any other str, which ended the session
    without its "authentication failed" answer or the server's "refused" line."""
    if not isinstance(given, str) or len(given) != 64 or not given.isascii():
        return False
    return hmac.compare_digest(proof(secret, role, first, second), given)


def valid_nonce(value: object) -> bool:
    return (
        isinstance(value, str)
        and len(value) == 2 * NONCE_BYTES
        and all(c in "0123456789abcdef" for c in value)
    )


def session_key(secret: bytes, server_nonce: str, client_nonce: str) -> bytes:
    """``K = HMAC-SHA256(secret, "session" S C)``, the nonces as the proofs take them (their
    hexadecimal text): the key of a session's macs, derived by both sides, never sent."""
    message = b"session" + server_nonce.encode() + client_nonce.encode()
    return hmac.new(secret, message, hashlib.sha256).digest()


def canonical(message: Mapping[str, Any]) -> bytes:
    """``message`` without ``mac`` as the mac takes it: sorted keys, no spaces, ASCII."""
    body = {key: value for key, value in message.items() if key != MAC}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def mac(key: bytes, role: str, counter: int, message: Mapping[str, Any]) -> str:
    """HMAC-SHA256 under the session ``key`` of ``role`` ("server" or "client"), the sender's
    ``counter`` of lines (8 bytes, big-endian) and the :func:`canonical` ``message``."""
    data = role.encode() + counter.to_bytes(8, "big") + canonical(message)
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def valid_mac(
    key: bytes, role: str, counter: int, message: Mapping[str, Any], given: object
) -> bool:
    """Whether ``given`` is the mac of ``message`` (compared in constant time; 64 ASCII
    characters, as :func:`valid` takes a proof)."""
    if not isinstance(given, str) or len(given) != 64 or not given.isascii():
        return False
    return hmac.compare_digest(mac(key, role, counter, message), given)
