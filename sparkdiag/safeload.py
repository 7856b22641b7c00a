"""Reading and parsing what comes from outside, within bounds: one place for every loader.

Every loader of sparkdiag (the TOML configuration, the web config and the HTTP config in YAML
through :mod:`sparkdiag.safeyaml`, the NVML fixtures and watch recordings in JSON, a peer's
``link`` messages, Prometheus' answers) reads through here, so that whatever the input, the
answer is the document or one :class:`LoadError` line, never a traceback or an unbounded read:

* :func:`read_file` refuses what is not a regular file before reading a byte of it (a FIFO would
  block the open forever, ``/dev/zero`` never ends) and reads at most ``limit`` bytes;
* :func:`text` names the first byte that is not UTF-8;
* the parsers measure the nesting depth first (:func:`nesting`: a linear scan, no recursion) and
  refuse more than ``max_depth`` levels, so that no parser ever reaches Python's recursion limit
  (``[[[[...`` 5000 deep raised RecursionError in json, yaml and tomllib alike);
* integers longer than :data:`MAX_DIGITS` digits are refused before they are converted (Python
  3.11 raises ValueError past 4300 digits; a 400-digit byte count raised OverflowError when it
  was turned into a rate), and so are the non-finite floats (``NaN``, ``Infinity``, ``1e999``).

Also :func:`load_cert_chain`: a TLS key that is encrypted is refused at once, never prompted for.

Standard library only (layer 1); the YAML loader, which imports PyYAML, is
:mod:`sparkdiag.safeyaml`, imported by its callers when they read a YAML file.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # ssl (OpenSSL, some 5 MiB) loads where TLS is used
    import ssl

MAX_DEPTH = 64  # nesting levels; every format sparkdiag reads uses fewer than 10
MAX_DIGITS = 40  # digits of an integer: 2**128 has 39; a 64-bit counter has 20
MAX_NUMBER_CHARS = 400  # characters of one number literal (a float written out in full)


class LoadError(ValueError):
    """The input cannot be used; the message is one line that says why (the caller adds which
    file or which peer)."""


def read_file(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them. Raises OSError when it
    cannot be opened or read, LoadError when it is not a regular file (a FIFO, a device, a
    directory) or holds more than ``limit`` bytes."""
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LoadError(f"not a regular file (a {_kind(mode)})")
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > limit:
        raise LoadError(f"larger than {_size(limit)}")
    return b"".join(chunks)


@contextmanager
def reading(path: Path, error: Callable[[str], Exception], what: str = "") -> Iterator[None]:
    """Within it, an OSError or a :class:`LoadError` about ``path`` is raised again as
    ``error(line)``, one line that names the file: ``cannot read WHAT PATH: REASON`` or ``WHAT
    PATH: REASON`` (``what``: the file's kind, ``NVML fixture``; none by default)."""
    named = f"{what} {path}" if what else str(path)
    try:
        yield
    except OSError as exc:
        raise error(f"cannot read {named}: {exc.strerror or exc}") from None
    except LoadError as exc:
        raise error(f"{named}: {exc}") from None


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def _size(limit: int) -> str:
    if limit >= 1 << 20 and limit % (1 << 20) == 0:
        return f"{limit >> 20} MiB"
    if limit >= 1 << 10 and limit % (1 << 10) == 0:
        return f"{limit >> 10} KiB"
    return f"{limit} bytes"


def text(data: bytes) -> str:
    """``data`` decoded as UTF-8; LoadError naming the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        byte = data[exc.start]
        raise LoadError(f"not UTF-8 text: byte 0x{byte:02x} at offset {exc.start}") from None


# -- nesting, measured without recursion ---------------------------------------------------------

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.S)
_TOML_SKIP = re.compile(
    r'"""[\s\S]*?(?:"""|$)|\'\'\'[\s\S]*?(?:\'\'\'|$)|"(?:[^"\\\n]|\\.)*"?'
    r"|'[^'\n]*'?|#[^\n]*"
)
_BRACKETS = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def nesting(source: str, skip: re.Pattern[str] = _JSON_STRING) -> int:
    """The deepest nesting of brackets and braces in ``source``, strings and comments (matched
    by ``skip``) left out: a linear scan, so that it can be asked before any parser recurses."""
    brackets = _BRACKETS.sub("", skip.sub("", source))
    return max(accumulate(_STEP[c] for c in brackets), default=0)


def depth(document: Any) -> int:
    """How deep lists and mappings nest in a parsed document (a scalar is 0), found without
    recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, level + 1)
        stack.extend((child, level + 1) for child in item)
    return deepest


def _check_depth(found: int, max_depth: int) -> None:
    if found > max_depth:
        raise LoadError(f"nested too deeply (more than {max_depth} levels)")


# -- numbers ---------------------------------------------------------------------------------------


def _int(literal: str) -> int:
    digits = len(literal.lstrip("+-").lstrip("0")) if literal else 0
    if digits > MAX_DIGITS:
        raise LoadError(f"an integer of {digits} digits (more than {MAX_DIGITS})")
    return int(literal)


def _float(literal: str) -> float:
    if len(literal) > MAX_NUMBER_CHARS:
        raise LoadError(f"a number written in {len(literal)} characters")
    number = float(literal)
    if not math.isfinite(number):
        raise LoadError(f"the number {literal[:40]} is not finite")
    return number


def _constant(name: str) -> Any:
    raise LoadError(f"{name} is not a number (only finite numbers are read)")


# -- JSON ------------------------------------------------------------------------------------------


def parse_json(source: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """A JSON document: finite numbers only, integers of at most :data:`MAX_DIGITS` digits, at
    most ``max_depth`` levels; LoadError in one line otherwise."""
    if isinstance(source, bytes):
        source = text(source)
    _check_depth(nesting(source), max_depth)
    try:
        return json.loads(source, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        said = exc.msg.removesuffix(" at")  # json's "Invalid control character at"
        raise LoadError(f"not valid JSON: {said} at line {exc.lineno}") from None
    except RecursionError:  # not reachable past the depth check; kept as the last guard
        raise LoadError(f"nested too deeply (more than {max_depth} levels)") from None


def load_json(path: Path, limit: int, max_depth: int = MAX_DEPTH) -> Any:
    """:func:`read_file` then :func:`parse_json`."""
    return parse_json(read_file(path, limit), max_depth)


# -- TOML ------------------------------------------------------------------------------------------


def parse_toml(source: str | bytes, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """A TOML document, bounded as :func:`parse_json` is (its floats may be ``nan`` or ``inf``:
    the options refuse them by name)."""
    if isinstance(source, bytes):
        source = text(source)
    # an editor's byte-order mark ("UTF-8 with BOM") is no content: tomllib refused it as
    # "Invalid statement (at line 1, column 1)", which names nothing to fix
    source = source.removeprefix("\ufeff")
    _check_depth(nesting(source, _TOML_SKIP), max_depth)
    import tomllib  # a TOML file is read only when given (docs/daemon-cost.md)

    try:
        document = tomllib.loads(source, parse_float=_toml_float)
    except tomllib.TOMLDecodeError as exc:
        raise LoadError(f"not valid TOML: {_toml_error(str(exc), source)}") from None
    except LoadError:
        raise
    except ValueError:  # an integer past Python's own limit of 4300 digits
        raise LoadError("not valid TOML: an integer of more than 4300 digits") from None
    except RecursionError:
        raise LoadError(f"nested too deeply (more than {max_depth} levels)") from None
    _check_depth(depth(document), max_depth)  # dotted keys nest tables without brackets
    return document


_TOML_AT = re.compile(r"\(at line (\d+), column (\d+)\)$")


def _toml_error(message: str, source: str) -> str:
    """tomllib's message with the line it names quoted, and what to do where it says a value is
    given twice ("Cannot overwrite a value (at line 2, column 18)" named neither the key nor
    the fix)."""
    match = _TOML_AT.search(message)
    if match is None:
        return message
    lines = source.split("\n")  # tomllib counts "\n" alone; splitlines() splits on \u2028 too
    number = int(match.group(1))
    if 1 <= number <= len(lines):
        shown = lines[number - 1].strip()
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        message = f"{message[: match.start()]}(line {number}, column {match.group(2)}: {shown!r})"
    if "overwrite" in message or "twice" in message:
        message += ": a key or table is given twice; keep one"
    return message


def _toml_float(literal: str) -> float:
    if len(literal) > MAX_NUMBER_CHARS:
        raise LoadError(f"a number written in {len(literal)} characters")
    return float(literal)


# -- TLS keys --------------------------------------------------------------------------------------


class EncryptedKey(LoadError):
    """A private key that needs a pass phrase: sparkdiag never asks for one."""


def _refuse_passphrase(*_args: object) -> bytes:
    raise EncryptedKey("encrypted")


def load_cert_chain(context: ssl.SSLContext, cert: str | Path, key: str | Path) -> None:
    """``context.load_cert_chain(cert, key)``, except that an encrypted key raises
    :class:`EncryptedKey` at once: without a password callback OpenSSL asks the terminal
    ("Enter PEM pass phrase:") and waits, at start and at every reload of the files."""
    try:
        context.load_cert_chain(cert, key, _refuse_passphrase)
    except EncryptedKey:
        raise EncryptedKey(
            f"{key} is encrypted: sparkdiag does not ask for pass phrases; decrypt it "
            f"(openssl pkey -in {key} -out KEY; chmod 600 KEY) and name that file"
        ) from None
