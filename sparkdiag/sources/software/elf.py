"""Section headers of a 64-bit little-endian ELF file, read without loading the file.

A shared library with CUDA kernels can be a gigabyte (torch's ``libtorch_cuda.so``); the
architecture lint needs three of its sections (``.nv_fatbin``, ``__nv_relfatbin``,
``.nvFatBinSegment``). Everything here reads through a :class:`Reader` (``read(offset, size)``),
so that the same code walks a real file (:class:`FileReader`: seek and read, never the whole
file) or a recorded trace of the reads it made (:class:`TraceReader`: the fixtures of real
libraries' headers, ``tests/fixtures/fatbin/``).

Same reading as ``readelf -S -W FILE``. Only ELFCLASS64 / ELFDATA2LSB (x86-64 and aarch64, the
machines sparkdiag runs on) are read; anything else is :class:`NotElf`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

ELF_MAGIC = b"\x7fELF"
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr (64 bytes)
_SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr (64 bytes)
SHT_NOBITS = 8


class NotElf(ValueError):
    """Not a 64-bit little-endian ELF file, or its section table is damaged."""


class Reader(Protocol):
    def read(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (fewer at the end of the file)."""
        ...


class FileReader:
    """Reads an open binary file by seeking; counts the calls (``reads``) and bytes. A read at
    or past the file's end (an offset a damaged header gives, up to 2**64 - 1) is empty: such
    an offset was a ValueError from seek (2**63 and more) or EINVAL (past the filesystem's
    largest file), a traceback of ``sparkdiag native`` (the hostile review)."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.size = os.fstat(fh.fileno()).st_size
        self.reads = 0
        self.bytes = 0

    def read(self, offset: int, size: int) -> bytes:
        if offset < 0 or offset >= self.size:
            return b""
        self.fh.seek(offset)
        data = self.fh.read(size)
        self.reads += 1
        self.bytes += len(data)
        return data


class RecordingReader:
    """Wraps a reader and keeps every read it answered: ``trace`` (offset -> bytes) is what a
    :class:`TraceReader` needs to walk the same headers again without the file."""

    def __init__(self, inner: Reader) -> None:
        self.inner = inner
        self.trace: dict[int, bytes] = {}

    def read(self, offset: int, size: int) -> bytes:
        data = self.inner.read(offset, size)
        known = self.trace.get(offset)
        if known is None or len(known) < len(data):
            self.trace[offset] = data
        return data


class TraceReader:
    """Answers reads from a recorded trace (offset -> bytes). A read must start at a recorded
    offset (or inside a recorded chunk) and is cut to what was recorded there: the walk that
    made the trace asked for no more, so a replay that asks for more is a different walk and
    sees the file end early."""

    def __init__(self, trace: Mapping[int, bytes]) -> None:
        self.trace = dict(trace)
        self._starts = sorted(self.trace)

    def read(self, offset: int, size: int) -> bytes:
        data = self.trace.get(offset)
        if data is not None:
            return data[:size]
        for start in self._starts:  # a read inside a chunk (rare: only the gap search)
            chunk = self.trace[start]
            if start < offset < start + len(chunk):
                return chunk[offset - start : offset - start + size]
        return b""


class SliceReader:
    """Reads ``size`` bytes of ``inner`` from ``start`` as a file of its own: an ELF file
    embedded in another (a cubin in a fat binary). Nothing past the slice is read."""

    def __init__(self, inner: Reader, start: int, size: int) -> None:
        self.inner, self.start, self.size = inner, start, size

    def read(self, offset: int, size: int) -> bytes:
        if offset < 0 or offset >= self.size:
            return b""
        return self.inner.read(self.start + offset, min(size, self.size - offset))


@dataclass(frozen=True)
class Section:
    """One section: its name, where its bytes are in the file, how many, and its alignment."""

    name: str
    offset: int
    size: int
    align: int
    nobits: bool = False  # SHT_NOBITS (.bss): no bytes in the file


def _ehdr(reader: Reader) -> tuple[Any, ...]:
    """The ELF header's fields (:data:`_EHDR`); NotElf unless a 64-bit little-endian one."""
    raw = reader.read(0, _EHDR.size)
    if len(raw) < _EHDR.size or raw[:4] != ELF_MAGIC:
        raise NotElf("not an ELF file")
    ident = raw[:16]
    if ident[4] != 2 or ident[5] != 1:
        raise NotElf("not a 64-bit little-endian ELF file")
    return _EHDR.unpack(raw)


def _header(reader: Reader) -> tuple[int, int, int, int]:
    fields = _ehdr(reader)
    shoff, shentsize, shnum, shstrndx = fields[6], fields[11], fields[12], fields[13]
    if shnum == 0 or shoff == 0:
        raise NotElf("no section table")
    if shentsize != _SHDR.size or shstrndx >= shnum:
        raise NotElf("damaged section table")
    return shoff, shentsize, shnum, shstrndx


EM_CUDA = 190  # e_machine of a cubin


def machine(reader: Reader) -> int:
    """The file's e_machine (``EM_CUDA`` for a cubin, 62 for x86-64). Raises :class:`NotElf`
    when the header is not a 64-bit little-endian ELF one."""
    return int(_ehdr(reader)[2])


def read_sections(reader: Reader) -> tuple[Section, ...]:
    """Every section of the file, in table order (two reads: the table and its name table).

    Same reading as ``readelf -S -W FILE``. Raises :class:`NotElf`.
    """
    shoff, shentsize, shnum, shstrndx = _header(reader)
    table = reader.read(shoff, shentsize * shnum)
    if len(table) < shentsize * shnum:
        raise NotElf("section table past the end of the file")
    raw = [_SHDR.unpack_from(table, i * shentsize) for i in range(shnum)]
    names_at, names_size = raw[shstrndx][4], raw[shstrndx][5]
    if names_size > 16 * 1024 * 1024:
        raise NotElf("section name table too large")
    names = reader.read(names_at, names_size)
    out = []
    for name_offset, kind, _flags, _addr, offset, size, _link, _info, align, _ent in raw:
        end = names.find(b"\0", name_offset)
        name = names[name_offset : end if end >= 0 else len(names)].decode("ascii", "replace")
        out.append(Section(name, offset, size, align, kind == SHT_NOBITS))
    return tuple(out)


def section_map(sections: tuple[Section, ...]) -> dict[str, Section]:
    """Name -> section (the first of a name, as the loader and readelf's lookups take it)."""
    out: dict[str, Section] = {}
    for section in sections:
        out.setdefault(section.name, section)
    return out


def is_shared_library_name(name: str) -> bool:
    """``libx.so``, ``libx.so.12``, ``_C.abi3.so``, ``x.cpython-312-x86_64-linux-gnu.so``."""
    return name.endswith(".so") or ".so." in name


def walk_libraries(root: Path, unlisted: dict[str, str] | None = None) -> Iterator[Path]:
    """Every regular file under ``root`` whose name is a shared library's, symlinks not
    followed (a wheel's ``libx.so.12`` -> ``libx.so.12.1`` is read once, as the file). A
    directory that cannot be listed goes into ``unlisted`` (path -> why): it was passed over
    without a word, and the libraries in it never judged (found in a review).

    With ``os.scandir``, whose entries carry the file type readdir gives: a site-packages with
    torch holds tens of thousands of files, and a stat of each cost 1.8 s of a 2.3 s scan here.
    """
    stack = [str(root)]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            if unlisted is not None:
                unlisted[directory] = exc.strerror or str(exc)
            continue
        for entry in entries:
            try:
                if entry.is_symlink():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif is_shared_library_name(entry.name) and entry.is_file(follow_symlinks=False):
                    yield Path(entry.path)
            except OSError:
                continue
