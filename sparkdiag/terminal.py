"""Text that fits the terminal it is printed to.

Every text renderer takes a ``width`` (columns) and lays its lines out within it: prose wraps at
full words with a hanging indent (never mid-word: a word longer than the line, a path or a URL,
stays whole on a line of its own), tables keep their columns and wrap their last, free-text
column, or, where even the fixed columns do not fit, list each row as ``name value`` pairs.
:func:`width` is the width to use for a stream: the width its terminal reports, or
:data:`DEFAULT_WIDTH` when it is not a terminal (piped, redirected, click's CliRunner), so that
what scripts read does not depend on the terminal of whoever ran them.

Text from outside (label values from a Prometheus, its error text, a peer's messages, fixture
strings) may hold terminal control sequences: ``ESC ] 0 ; title BEL`` retitles the window, others
move the cursor or rewrite what is on the screen. :func:`safe` shows every control character
as an escape (``\\x1b``) instead; :func:`wrap` and :func:`table`, through which the renderers lay
out their text, apply it, and so does the one place that prints an error line (``cli``).
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Collection, Sequence
from typing import TextIO

DEFAULT_WIDTH = 100  # not a terminal
MIN_WIDTH = 40  # narrower terminals are laid out as if this wide
MIN_TEXT = 24  # a wrapped column narrower than this moves its text under the row

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
NBSP = "\xa0"  # a space that wrap() keeps (put back as a plain space)
# spaces never broken: a figure and its unit (91 °C, 20.0 %, 4.2 TB/s), GPU 0
_GLUE = re.compile(
    r"(?<=\d) (?=(?:°C|%|s|ms|µs|W|MHz|GHz|kB|MB|GB|B/s|MB/s|GB/s|Gb/s|TB/s|TFLOPS|TOPS|cores?)"
    r"(?:[\s,;:.)]|$))|(?<=\bGPU) (?=\d)"
)


# C0 and C1 controls and DEL, the Unicode controls that reorder text (bidi overrides and
# isolates, as in Trojan Source), and lone surrogates: a file name that is not UTF-8 reaches
# Python as one surrogate a byte (os.fsdecode), which no UTF-8 stream can write
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_SPACES = re.compile("[\t\n\r\x0b\x0c]")
_BYTE_SURROGATES = range(0xDC80, 0xDD00)  # the undecodable bytes 0x80-0xff of a file name


def byte_text(code: int) -> str | None:
    """``\\xe9`` for the lone surrogate os.fsdecode makes of an undecodable byte of a file name
    (the byte the name holds), None for any other code point: the one rule that terminal text
    (:func:`safe`) and the exposition's labels (exporter.registry) both show such a byte by."""
    return f"\\x{code - 0xDC00:02x}" if code in _BYTE_SURROGATES else None


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    shown = byte_text(code)
    if shown is not None:
        return shown
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: str) -> str:
    """``text`` with every control character shown as an escape (``ESC`` as ``\\x1b``, a bidi
    override as ``\\u202e``, a newline as ``\\x0a``): nothing in it can act on a terminal. A
    byte of a file name that is not UTF-8 is shown as ``\\xe9``: printed as it came, it
    stopped the command with a UnicodeEncodeError (found in a review)."""
    return _UNSAFE.sub(_escape, text)


def width(stream: TextIO | None = None) -> int:
    """The columns to lay text out in for ``stream`` (standard output by default): $COLUMNS or
    the terminal's width when it is a terminal, :data:`DEFAULT_WIDTH` otherwise."""
    stream = sys.stdout if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a file
        tty = False
    if not tty:
        return DEFAULT_WIDTH
    columns = 0
    env = os.environ.get("COLUMNS", "")
    if env.isdigit():
        columns = int(env)
    if columns <= 0:
        try:
            columns = os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            import shutil  # loads bz2 and lzma: imported only where the call above fails

            columns = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    if columns <= 0:
        return DEFAULT_WIDTH
    return max(MIN_WIDTH, columns)


def visible(text: str) -> int:
    """The columns ``text`` takes, colour codes left out."""
    return len(_ANSI.sub("", text))


def wrap(text: str, width: int, indent: str = "", hanging: str | None = None) -> list[str]:
    """``text`` in lines of at most ``width`` columns, broken between words only: the first
    line starts with ``indent``, the others with ``hanging`` (as many spaces as ``indent`` by
    default). A word longer than a line stays whole. Always at least one line. The text is
    made :func:`safe` (its tabs and line breaks become spaces, as textwrap makes them)."""
    text = safe(_SPACES.sub(" ", text))
    hanging = " " * visible(indent) if hanging is None else hanging
    # wrap with a plain stand-in for a coloured indent, so that its codes take no columns
    plain = " " * visible(indent)
    lines = textwrap.wrap(
        _GLUE.sub(NBSP, text),
        width=max(width, visible(plain) + 1, len(hanging) + 1),
        initial_indent=plain,
        subsequent_indent=hanging,
        break_long_words=False,
        break_on_hyphens=False,
    )
    if not lines:
        return [indent.rstrip()]
    lines[0] = indent + lines[0][len(plain) :]
    return [line.replace(NBSP, " ") for line in lines]


def hang(prefix: str, text: str, width: int, hanging: int | None = None) -> list[str]:
    """``prefix`` then ``text``, the text's later lines indented under its start (or by
    ``hanging`` columns); where that leaves fewer than :data:`MIN_TEXT` columns, the text is
    indented by four columns instead."""
    indent = visible(prefix) if hanging is None else hanging
    if width - indent < MIN_TEXT:
        indent = min(4, indent)
    return wrap(text, width, prefix, " " * indent)


def fill(text: str, width: int, indent: str = "", hanging: str | None = None) -> str:
    """:func:`wrap` joined into one string (no trailing newline)."""
    return "\n".join(wrap(text, width, indent, hanging))


def table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    right: Collection[int] = (),
    indent: str = "",
    free: bool = False,
    under: tuple[str, Sequence[str]] | None = None,
    key: int = 0,
) -> list[str]:
    """An aligned table within ``width`` columns: ``right`` names the columns aligned right;
    with ``free`` the last column is prose that wraps under itself; ``under`` (a header and one
    value per row) puts a long value on a line of its own under its row (a uuid). Where the
    fixed columns do not fit with two spaces between them, they get one; where they still do
    not, every row is listed on its own as ``header value`` pairs, wrapped, after its ``key``
    column's value."""
    if under is not None and free:
        raise ValueError("a table with a free-text column has no line under its rows")
    rows = [[safe(cell) for cell in row] for row in rows]
    if under is not None:
        under = (under[0], [safe(value) for value in under[1]])
    every = [list(header), *[list(r) for r in rows]]
    fixed = len(header) - 1 if free else len(header)
    widths = [max(visible(r[i]) for r in every) for i in range(fixed)]
    for gap in ("  ", " "):
        used = len(indent) + sum(widths) + len(gap) * max(fixed - 1, 0)
        if free:
            used += len(gap)
        if used <= width and (not free or width - used >= MIN_TEXT or fixed == 0):
            lines = _aligned(every, widths, gap, right, indent, free, width)
            if under is None:
                return lines
            below = indent + " " * min(4, width // 10)
            return [lines[0]] + [
                part
                for line, value in zip(lines[1:], under[1], strict=True)
                for part in (line, *wrap(value, width, below))
            ]
    if under is not None:  # listed: the value under the row becomes its last pair
        label, values = under
        return _listed(
            [*header, label],
            [[*r, v] for r, v in zip(rows, values, strict=True)],
            width,
            indent,
            key,
        )
    return _listed(header, rows, width, indent, key)


def _pad(cell: str, size: int, right: bool) -> str:
    space = " " * max(size - visible(cell), 0)
    return space + cell if right else cell + space


def _aligned(
    every: list[list[str]],
    widths: list[int],
    gap: str,
    right: Collection[int],
    indent: str,
    free: bool,
    width: int,
) -> list[str]:
    lines = []
    for row in every:
        cells = [_pad(c, widths[i], i in right) for i, c in enumerate(row[: len(widths)])]
        line = indent + gap.join(cells)
        if free and row[-1]:
            lines += wrap(row[-1], width, line + gap)
        else:
            lines.append(line.rstrip())
    return lines


def _listed(
    header: Sequence[str], rows: Sequence[Sequence[str]], width: int, indent: str, key: int
) -> list[str]:
    lines = []
    for row in rows:
        # a header stays with its value (and the value's own spaces, when it is short)
        pairs = [
            (f"{h}{NBSP}" if h else "") + (c.replace(" ", NBSP) if len(h) + len(c) < 40 else c)
            for i, (h, c) in enumerate(zip(header, row, strict=False))
            if c and c != "-" and i != key  # a dash says "none": a list leaves it out
        ]
        lines += wrap(f"{row[key]}: " + ", ".join(pairs), width, indent, indent + "    ")
    return lines


def fit(text: str, width: int) -> str:
    """``text`` on one line of fewer than ``width`` columns: cut after its last whole word
    that fits, with an ellipsis (for a status line, which must not wrap)."""
    text = safe(text)
    if len(text) < width:
        return text
    cut = text[: max(width - 2, 1)]
    space = cut.rfind(" ")
    return (cut[:space] if space > 0 else cut).rstrip(" ,;·") + " …"


BAR = 12  # cells inside a progress bar's brackets (the line's text gets the rest)


def bar(done: float, total: float, columns: int = BAR) -> str:
    """``[#######-------------] 35 %``: ``done`` of ``total`` as a bar of ``columns`` cells and
    a percentage, for the head of a :class:`StatusLine` (which cuts the line's tail to fit)."""
    fraction = min(max(done / total, 0.0), 1.0) if total > 0 else 0.0
    filled = round(fraction * columns)
    return f"[{'#' * filled}{'-' * (columns - filled)}] {fraction:4.0%}"


class StatusLine:
    """One line of progress on a terminal, rewritten in place with a carriage return and
    erased by :meth:`clear`. Silent where ``stream`` is not a terminal (piped, redirected,
    CliRunner): nothing of it ever reaches a file. At most one write per ``every`` seconds,
    whatever the rate of :meth:`show`. The one progress line of every command (``watch``'s
    status, ``soak``'s windows, ``bench``'s and ``probe``'s kernels): cut to the terminal's
    width, so that it never wraps and never leaves a piece of itself behind."""

    def __init__(self, stream: TextIO, every: float = 0.2) -> None:
        self.stream = stream
        try:
            self.enabled = stream.isatty()
        except (AttributeError, ValueError):
            self.enabled = False
        self.every = every
        self._shown = 0  # columns of what is on the line now
        self._last: float | None = None

    def show(self, text: str, now: float) -> None:
        """Put ``text`` on the line (cut to the terminal's width) unless one was put there less
        than ``every`` seconds before ``now``."""
        if not self.enabled or (self._last is not None and now - self._last < self.every):
            return
        self._last = now
        line = fit(text, width(self.stream))
        pad = " " * max(self._shown - len(line), 0)  # what is left of a longer line before
        self._write(f"\r{line}{pad}" + (f"\r{line}" if pad else ""))
        self._shown = len(line)

    def clear(self) -> None:
        """Erase the line and leave the cursor at its start (nothing when nothing is shown)."""
        if self.enabled and self._shown:
            self._write("\r" + " " * self._shown + "\r")
        self._shown = 0

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: say nothing more
            self.enabled = False
