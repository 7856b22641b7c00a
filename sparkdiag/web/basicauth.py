"""HTTP basic auth against bcrypt hashes, at bounded cost.

bcrypt is slow by design (about 50 ms of one core at cost 10, doubling with each step of cost),
so a check is split in two: :meth:`BasicAuth.decide` answers at once whatever needs no bcrypt,
and :meth:`BasicAuth.verify` runs bcrypt for the rest; the HTTP server runs the latter in a
small pool with a bounded queue, so a flood of wrong passwords cannot take the CPU or the
request slots from scrapes.

Answered at once:

* no users configured: allowed;
* a missing or malformed header, another scheme than ``Basic`` (matched case-insensitively), no
  ``:`` in the credentials, a user name that is not UTF-8: refused;
* a password over 72 bytes: refused (bcrypt reads only the first 72 bytes, and bcrypt 5 refuses
  longer passwords, so none can be the configured one);
* a credential seen before: its remembered answer. Credentials are remembered as
  HMAC-SHA256 under a key drawn at start (never in clear, nothing to crack offline): the ones
  that verified (Prometheus then pays bcrypt once, not every scrape) and, in a bounded LRU, the
  ones that failed (a client retrying a wrong password pays once).

An unknown user costs the bcrypt of the slowest configured user, so where every user's hash has
one cost, timing does not tell a user from a name that does not exist (exporter-toolkit uses one
fixed cost-10 hash, which a cost-12 user's timing gives away); a user of a lower cost than
another answers sooner, and the web config's loader warns of mixed costs.
Costs above :data:`MAX_BCRYPT_COST` are refused at load.
Hashes are checked whole at load (:func:`hash_problem`), so a login can never make bcrypt raise.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_PASSWORD_BYTES = 72
# The highest bcrypt cost accepted. Each step doubles the time of a check: on the shared 2-core
# development machine a check took 146 ms at cost 10, 489 ms at 12 and 2.0 s at 14 (median of a
# few, loaded; docs/web.md). At 14 the first scrape after a start, and an unknown user's attempt
# (costed like the slowest user), still finish inside Prometheus' default 10 s scrape timeout.
# exporter-toolkit takes up to 31: above 14 the file is refused, naming the user.
MAX_BCRYPT_COST = 14
REMEMBER_FAILED = 1024  # wrong credentials remembered (LRU)
REMEMBER_VERIFIED = 64  # right credentials remembered (normally one per user)

_B64 = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
# $2a$/$2b$/$2y$, a cost of 04..31, 22 characters of salt (16 bytes: the last character carries
# 2 bits, so only . O e u are canonical) and 31 of hash (23 bytes: the last carries 4 bits).
_HASH = re.compile(
    r"\$2[aby]\$(?P<cost>\d\d)\$"
    rf"(?P<salt>[{re.escape(_B64)}]{{21}}[.Oeu])"
    rf"(?P<hash>[{re.escape(_B64)}]{{30}}[{re.escape(_B64[::4])}])"
)


def hash_problem(hashed: object) -> str | None:
    """Why ``hashed`` is not a usable bcrypt hash, or None when it is."""
    if not isinstance(hashed, str):
        return "not a string"
    if not hashed.startswith(("$2a$", "$2b$", "$2y$")):
        return "expected $2a$, $2b$ or $2y$ in front"
    match = _HASH.fullmatch(hashed)
    if match is None:
        return "malformed: expected $2y$CC$ and 53 characters of salt and hash"
    if not 4 <= int(match["cost"]) <= MAX_BCRYPT_COST:
        return f"cost {match['cost']} is out of range; allowed: 04 to {MAX_BCRYPT_COST}"
    return None


@dataclass(frozen=True)
class Credential:
    """A credential that needs bcrypt; ``key`` identifies it in the caches."""

    user: str
    password: bytes
    key: bytes


def parse_basic(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) from an ``Authorization: Basic ...`` value, or None if malformed."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


class BasicAuth:
    """Checks credentials against ``users`` (user name -> bcrypt hash, validated)."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self.users = dict(users)
        # what secrets.token_bytes(32) returns, without the imports of secrets (hmac, hashlib:
        # OpenSSL's libcrypto) in a daemon that has no users to check
        self._secret = os.urandom(32)
        self._verified: OrderedDict[bytes, None] = OrderedDict()
        self._failed: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()
        # For unknown users: a hash of the highest configured cost that no password matches (its
        # hash part is not what any password gives for that salt, barring a 2^-184 accident), so
        # an unknown user costs what the slowest configured user costs (and timing tells nothing
        # where all users share one cost: webconfig warns of mixed costs).
        cost = max((int(h[4:6]) for h in self.users.values()), default=10)
        self._dummy = b""  # without users nothing is ever checked: bcrypt is not even loaded
        if self.users:
            import bcrypt

            self._dummy = bcrypt.gensalt(rounds=cost) + b"." * 31
        self.bcrypt_runs = 0

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def decide(self, header: str | None) -> bool | Credential:
        """The answer when it needs no bcrypt, else the :class:`Credential` to :meth:`verify`."""
        if not self.users:
            return True
        parsed = parse_basic(header)
        if parsed is None:
            return False
        user, password = parsed
        if len(password) > MAX_PASSWORD_BYTES:
            return False
        key = self._key(user, password)
        with self._lock:
            if key in self._verified:
                self._verified.move_to_end(key)
                return True
            if key in self._failed:
                self._failed.move_to_end(key)
                return False
        return Credential(user, password, key)

    def verify(self, credential: Credential) -> bool:
        """Run bcrypt for ``credential`` (blocking, tens of ms) and remember the answer."""
        import bcrypt

        stored = self.users.get(credential.user)
        try:
            ok = bcrypt.checkpw(credential.password, stored or self._dummy) and stored is not None
        except ValueError as exc:  # not for validated hashes and passwords of <= 72 bytes
            log.warning("basic auth: bcrypt refused the check for %r: %s", credential.user, exc)
            ok = False
        with self._lock:
            self.bcrypt_runs += 1
            table, size = (
                (self._verified, REMEMBER_VERIFIED) if ok else (self._failed, REMEMBER_FAILED)
            )
            table[credential.key] = None
            while len(table) > size:
                table.popitem(last=False)
        return ok

    def authorized(self, header: str | None) -> bool:
        """:meth:`decide`, then :meth:`verify` where needed, in the calling thread."""
        answer = self.decide(header)
        return answer if isinstance(answer, bool) else self.verify(answer)

    def _key(self, user: str, password: bytes) -> bytes:
        import hashlib
        import hmac

        name = user.encode("utf-8")
        message = len(name).to_bytes(4, "big") + name + password
        return hmac.new(self._secret, message, hashlib.sha256).digest()
