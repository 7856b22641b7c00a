"""The CUDA fat binaries embedded in a shared library, read from the ELF file without the CUDA
toolkit: which GPU architectures its kernels were compiled for (SASS, in cubins) and which
virtual architectures it carries PTX for (compiled by the driver at load time).

Layout, as nvcc 13.0 writes it and cuobjdump 13.4 reads it (checked on every fixture of
``tests/fixtures/fatbin/``, built by its ``build.sh``, and on bitsandbytes 0.50.2's libraries
built with CUDA 11.8 to 13.2)::

    section .nv_fatbin        fat binary containers, one after another (8-byte aligned)
    section __nv_relfatbin    relocatable containers (-rdc): inputs of the device linker, never
                              loaded by the driver; cuobjdump does not list them either
    container header (16 bytes)   u32 magic 0xBA55ED50, u16 version (1), u16 header size,
                                  u64 size of the entries that follow
    entry header (64..112 bytes)  u16 kind (1 PTX, 2 ELF cubin), u16 version, u32 header size,
                                  u64 padded payload size, u32 compressed size, ...,
                                  u32 PTX ISA version at 24 (major << 16 | minor) for PTX,
                                  u32 architecture at 28 (90 for sm_90, 121 for sm_121),
                                  u64 flags at 40, u64 uncompressed size at 56
    flags   0x1 64-bit, 0x10 Linux host, 0x2000 LZ4-compressed payload (CUDA 11-12),
            0x8000 zstd-compressed payload (CUDA 13; PTX is compressed by default),
            0x100000 architecture-specific target (sm_90a, sm_121a),
            0x200000 family target (sm_120f)

Only headers are read: a container's entries are walked by their sizes and payloads are
skipped, so a gigabyte library costs a few reads a container
(:class:`sparkdiag.sources.software.elf.FileReader` counts them). Same reading as ``cuobjdump
--list-elf --list-ptx FILE``, except that cuobjdump names a family cubin without its ``f``
(``sm_120f`` is listed as ``sm_120``); the arch-specific ``a`` it shows.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import subprocess
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkdiag.sources.software.elf import (
    EM_CUDA,
    FileReader,
    NotElf,
    Reader,
    RecordingReader,
    Section,
    SliceReader,
    TraceReader,
    machine,
    read_sections,
    section_map,
)

MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_CONTAINER = struct.Struct("<IHHQ")
ENTRY_READ = 64  # the fields read from each entry header (they are 64 to 112 bytes long)
KIND_PTX = 1
KIND_ELF = 2
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000
SECTION = ".nv_fatbin"
RELOCATABLE_SECTION = "__nv_relfatbin"
GAP_CHUNK = 4096  # bytes read at a time when the next container does not start where one ended
MAX_ENTRIES = 2_000_000  # a hostile or damaged file stops here
# The architecture numbers a GPU can have: nvcc's run from 20 (Fermi; sm_10 was CUDA 1.0's) to
# 121 (GB10). One outside (0, or 4294967295 from a damaged header) is damage: shown as
# sm_4294967295 it read as a target (the hostile review). 999 leaves room for compute
# capability 99.9.
MIN_ARCH, MAX_ARCH = 10, 999
# A .nv_fatbin this small (a kernel or two for a target or two: nvcc 13.0 writes 0.5 to 5.4 KB
# for one trivial kernel and target) may be a stub whose library keeps its kernels elsewhere
# (nvidia-cufft's libcufft.so.12: 672 bytes, its FFT kernels fat binaries in .ldata): the
# walk looks in the library's other sections for a fat binary container (native/lint.py)
SMALL_FATBIN = 4 * 1024


@dataclass(frozen=True, order=True)
class Target:
    """A compilation target: ``sm_90a`` (SASS, ``ptx`` False) or ``compute_80`` (PTX).

    arch: the number nvcc writes (90, 100, 121): major = arch // 10, minor = arch % 10
    variant: "" plain, "a" architecture-specific, "f" family-specific (CUDA 12.9+)
    """

    arch: int
    variant: str = ""
    ptx: bool = False

    @property
    def name(self) -> str:
        return f"{'compute' if self.ptx else 'sm'}_{self.arch}{self.variant}"

    @property
    def capability(self) -> tuple[int, int]:
        return self.arch // 10, self.arch % 10

    @classmethod
    def parse(cls, name: str) -> Target:
        """``sm_121a`` / ``compute_80`` / ``sm_120f``; ValueError for anything else."""
        kind, _, rest = name.partition("_")
        if kind not in ("sm", "compute") or not rest:
            raise ValueError(f"not a CUDA target: {name!r}")
        variant = rest[-1] if rest[-1] in "af" else ""
        digits = rest[:-1] if variant else rest
        if not digits.isdigit():
            raise ValueError(f"not a CUDA target: {name!r}")
        return cls(int(digits), variant, kind == "compute")


@dataclass(frozen=True)
class FatbinReport:
    """What one library carries. Counts are of entries (one per translation unit and target).

    sass: cubin target name (``sm_90a``) -> cubins in ``.nv_fatbin``
    ptx: PTX target name (``compute_80``) -> PTX entries in ``.nv_fatbin``
    ptx_isa: PTX target name -> the newest PTX ISA version among them ("9.0"): a driver older
        than the CUDA that wrote it cannot compile it
    compression: "none" / "lz4" / "zstd" -> entries
    relocatable: target name -> entries in ``__nv_relfatbin`` (device-linker input, not loaded)
    containers: fat binary containers in ``.nv_fatbin``
    fatbin_bytes: size of ``.nv_fatbin``
    elsewhere: fat binaries found in other sections (see the field)
    kernels: kernels in a small fat binary's cubins (see the field)
    problems: damaged or unexpected structures met (the walk stops at the first in a section)
    """

    sass: Mapping[str, int] = field(default_factory=dict)
    ptx: Mapping[str, int] = field(default_factory=dict)
    ptx_isa: Mapping[str, str] = field(default_factory=dict)
    compression: Mapping[str, int] = field(default_factory=dict)
    relocatable: Mapping[str, int] = field(default_factory=dict)
    containers: int = 0
    fatbin_bytes: int = 0
    problems: tuple[str, ...] = ()
    # where .nv_fatbin is at most SMALL_FATBIN: whether another section holds a fat binary
    # container with a target in it; None where it was not looked for (a larger .nv_fatbin,
    # a header trace)
    elsewhere: bool | None = None
    # where .nv_fatbin is at most SMALL_FATBIN: how many kernels (a cubin's .text.NAME sections)
    # its cubins hold; None where one entry cannot be read so (compressed, PTX, damaged) or it
    # was not looked for. A cubin nvcc writes for a unit without kernels holds none
    # (libcufftw.so.12's sm_75 cubin: its FFTs are libcufft's)
    kernels: int | None = None

    @property
    def has_gpu_code(self) -> bool:
        return bool(self.sass or self.ptx)

    def targets(self) -> tuple[Target, ...]:
        """Every target the driver can load from this library, SASS first, sorted."""
        return tuple(sorted(Target.parse(n) for n in (*self.sass, *self.ptx)))

    def as_json(self) -> dict[str, Any]:
        return {
            "sass": dict(sorted(self.sass.items())),
            "ptx": dict(sorted(self.ptx.items())),
            "ptx_isa": dict(sorted(self.ptx_isa.items())),
            "compression": dict(sorted(self.compression.items())),
            "relocatable": dict(sorted(self.relocatable.items())),
            "containers": self.containers,
            "fatbin_bytes": self.fatbin_bytes,
            "problems": list(self.problems),
            # only where it was looked for: the documents of the traces kept lack it
            **({} if self.elsewhere is None else {"elsewhere": self.elsewhere}),
            **({} if self.kernels is None else {"kernels": self.kernels}),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> FatbinReport:
        """The inverse of :meth:`as_json` (the scan cache); KeyError/TypeError when malformed."""
        return cls(
            sass={str(k): int(v) for k, v in doc["sass"].items()},
            ptx={str(k): int(v) for k, v in doc["ptx"].items()},
            ptx_isa={str(k): str(v) for k, v in doc["ptx_isa"].items()},
            compression={str(k): int(v) for k, v in doc["compression"].items()},
            relocatable={str(k): int(v) for k, v in doc["relocatable"].items()},
            containers=int(doc["containers"]),
            fatbin_bytes=int(doc["fatbin_bytes"]),
            problems=tuple(str(p) for p in doc["problems"]),
            elsewhere=None if doc.get("elsewhere") is None else bool(doc["elsewhere"]),
            kernels=None if doc.get("kernels") is None else int(doc["kernels"]),
        )


def _variant(flags: int) -> str:
    if flags & FLAG_ARCH_SPECIFIC:
        return "a"
    return "f" if flags & FLAG_FAMILY else ""


def _compression(flags: int) -> str:
    if flags & FLAG_ZSTD:
        return "zstd"
    return "lz4" if flags & FLAG_LZ4 else "none"


class _Walk:
    """Counts of one section's containers and entries (see the module's layout)."""

    def __init__(self, keep: bool = False) -> None:
        # keep: every entry's (payload offset, padded size, kind, flags), for a small fat
        # binary's cubins to be read (:func:`_kernels`)
        self.kept: list[tuple[int, int, int, int]] | None = [] if keep else None
        self.sass: Counter[str] = Counter()
        self.ptx: Counter[str] = Counter()
        self.ptx_isa: dict[str, tuple[int, int]] = {}
        self.compression: Counter[str] = Counter()
        self.containers = 0
        self.entries = 0
        self.problems: list[str] = []
        self.implausible: Counter[int] = Counter()  # architecture number -> entries

    def section(self, reader: Reader, start: int, size: int, name: str) -> None:
        pos, end = start, start + size
        while pos + _CONTAINER.size <= end:
            head = reader.read(pos, _CONTAINER.size)
            if len(head) < _CONTAINER.size:  # the file ends inside the section it declares
                self.problems.append(f"{name}: nothing in the file at {pos:#x}: it is cut short")
                return
            if head[:4] != _MAGIC_BYTES:
                found = _next_container(reader, pos, end, start)
                if found is None:
                    return
                pos = found
                continue
            _magic, _version, header_size, body = _CONTAINER.unpack(head)
            body_start, body_end = pos + header_size, pos + header_size + body
            if header_size < _CONTAINER.size or body_end > end:
                self.problems.append(f"{name}: container at {pos:#x} runs past the section")
                return
            self.containers += 1
            if not self._entries(reader, body_start, body_end, name):
                return
            pos = body_end

    def _entries(self, reader: Reader, pos: int, end: int, name: str) -> bool:
        while pos + ENTRY_READ <= end:
            raw = reader.read(pos, ENTRY_READ)
            if len(raw) < ENTRY_READ:
                self.problems.append(f"{name}: entry at {pos:#x} cut short")
                return False
            kind, _version, header_size, padded = struct.unpack_from("<HHIQ", raw)
            isa, arch = struct.unpack_from("<II", raw, 24)
            (flags,) = struct.unpack_from("<Q", raw, 40)
            if header_size < ENTRY_READ or pos + header_size + padded > end:
                self.problems.append(f"{name}: entry at {pos:#x} runs past its container")
                return False
            self.entries += 1
            if self.kept is not None:
                self.kept.append((pos + header_size, padded, kind, flags))
            if self.entries > MAX_ENTRIES:
                self.problems.append(f"{name}: more than {MAX_ENTRIES} entries; stopped")
                return False
            if kind in (KIND_PTX, KIND_ELF) and not MIN_ARCH <= arch <= MAX_ARCH:
                self.implausible[arch] += 1  # counted as damage, not as a target
            elif kind in (KIND_PTX, KIND_ELF):
                target = Target(arch, _variant(flags), kind == KIND_PTX)
                self.compression[_compression(flags)] += 1
                if target.ptx:
                    self.ptx[target.name] += 1
                    version = (isa >> 16, isa & 0xFFFF)
                    self.ptx_isa[target.name] = max(version, self.ptx_isa.get(target.name, (0, 0)))
                else:
                    self.sass[target.name] += 1
            pos += header_size + padded
        return True

    def implausible_problem(self, name: str) -> None:
        """One problem for the entries whose architecture number no GPU has (left out of the
        targets), naming up to three of the numbers."""
        if not self.implausible:
            return
        count = sum(self.implausible.values())
        shown = ", ".join(str(a) for a in sorted(self.implausible)[:3])
        more = ", ..." if len(self.implausible) > 3 else ""
        self.problems.append(
            f"{name}: {count} {'entry names' if count == 1 else 'entries name'} an architecture "
            f"no GPU has ({shown}{more}; plausible: {MIN_ARCH} to {MAX_ARCH}): damaged, not "
            "counted as targets"
        )


def _next_container(
    reader: Reader, pos: int, end: int, start: int, in_file: bool = False
) -> int | None:
    """The next container header at or after ``pos`` that is 8-byte aligned counted from
    ``start`` (the section's start), or with ``in_file`` from the file's start too, reading
    ``GAP_CHUNK`` bytes at a time; None when the section holds no more."""
    while pos < end:
        chunk = reader.read(pos, min(GAP_CHUNK, end - pos))
        if not chunk:
            return None
        at = chunk.find(_MAGIC_BYTES)
        while at >= 0:
            if (pos + at - start) % 8 == 0 or (in_file and (pos + at) % 8 == 0):
                return pos + at
            at = chunk.find(_MAGIC_BYTES, at + 1)
        # overlap: a magic split by the chunk edge is found in the next chunk. A step of 0 (a
        # chunk of 10 bytes or fewer) leaves no room for another header: the walk read the
        # same 9 or 10 bytes at the end of a section for ever (the hostile review)
        step = (len(chunk) - 3) // 8 * 8
        if step <= 0:
            return None
        pos += step
    return None


def _found_elsewhere(reader: Reader, sections: tuple[Section, ...]) -> bool:
    """Whether a section other than the fat binary ones holds a fat binary container (aligned,
    whole within the section) with a cubin or PTX entry: a stub's kernels, where the library
    keeps them. Reads until the first is found: the whole file where there is none.

    Aligned in the file, or from the section's start: libcufft.so.12's .ldata begins at
    0x81d874 (4 past an 8-byte boundary) and all 23,983 of its containers are 16-byte aligned
    in the file, so none is 8-aligned from the section's start. Counted from there alone, none
    was found, the stub was judged by its one sm_75 cubin, and `check` failed on every GPU but
    7.x (the H200 on 2026-12-03, the H100 on 2026-12-05)."""
    for section in sections:
        if section.name in (SECTION, RELOCATABLE_SECTION) or section.nobits:
            continue
        pos, end = section.offset, section.offset + section.size
        while (found := _next_container(reader, pos, end, section.offset, True)) is not None:
            head = reader.read(found, _CONTAINER.size)
            if len(head) == _CONTAINER.size:
                _magic, version, header_size, body = _CONTAINER.unpack(head)
                body_end = found + header_size + body
                if version == 1 and header_size >= _CONTAINER.size and body_end <= end:
                    probe = _Walk()
                    probe._entries(reader, found + header_size, body_end, section.name)
                    if probe.sass or probe.ptx:
                        return True
            pos = found + 8
    return False


def _kernels(reader: Reader, walked: _Walk) -> int | None:
    """The kernels in the cubins ``walked`` kept: each cubin is an ELF file for the CUDA
    machine, whose kernels are named by its ``.text.NAME``, ``.nv.info.NAME`` and
    ``.nv.constant0.NAME`` sections. None where an entry is not a cubin that can be read so:
    PTX, a compressed payload (zstd needs a library this module does without), or a damaged
    one: another machine, a nameless section, or no .shstrtab, .strtab and .symtab (a cubin
    whose name table was lost read as one without kernels, and a library with a real kernel
    passed as a stub: found in a review, by mutating sm90.so)."""
    if walked.kept is None or walked.problems:
        return None
    count = 0
    for start, size, kind, flags in walked.kept:
        if kind != KIND_ELF or _compression(flags) != "none":
            return None
        cubin = SliceReader(reader, start, size)
        try:
            sections = read_sections(cubin)
        except NotElf:
            return None
        names = [s.name for s in sections[1:]]
        if machine(cubin) != EM_CUDA or "" in names or not _CUBIN_TABLES.issubset(names):
            return None
        count += len({_kernel_name(n) for n in names} - {None})
    return count


_CUBIN_TABLES = {".shstrtab", ".strtab", ".symtab"}
_KERNEL_SECTIONS = (".text.", ".nv.info.", ".nv.constant0.")


def _kernel_name(section: str) -> str | None:
    """The kernel a cubin section belongs to (``.text.scale`` -> ``scale``), or None."""
    for prefix in _KERNEL_SECTIONS:
        if section.startswith(prefix):
            return section[len(prefix) :]
    return None


def walk(reader: Reader, look_elsewhere: bool = True) -> FatbinReport | None:
    """The fat binaries of the ELF file behind ``reader``; None when it has no ``.nv_fatbin``
    and no ``__nv_relfatbin`` (no CUDA device code). Where ``.nv_fatbin`` is at most
    ``SMALL_FATBIN`` and ``look_elsewhere``, the other sections are searched for fat binaries
    (:attr:`FatbinReport.elsewhere`). Raises :class:`sparkdiag.sources.software.elf.NotElf`."""
    table = read_sections(reader)
    sections = section_map(table)
    main, relocatable = sections.get(SECTION), sections.get(RELOCATABLE_SECTION)
    if main is None and relocatable is None:
        return None
    small = main is not None and not main.nobits and main.size <= SMALL_FATBIN
    loaded = _Walk(keep=small and look_elsewhere)
    if main is not None and not main.nobits:
        loaded.section(reader, main.offset, main.size, SECTION)
        loaded.implausible_problem(SECTION)
    rel = _Walk()
    if relocatable is not None and not relocatable.nobits:
        rel.section(reader, relocatable.offset, relocatable.size, RELOCATABLE_SECTION)
        rel.implausible_problem(RELOCATABLE_SECTION)
    elsewhere = None
    if small and look_elsewhere:
        elsewhere = _found_elsewhere(reader, table)
    return FatbinReport(
        sass=dict(loaded.sass),
        ptx=dict(loaded.ptx),
        ptx_isa={k: f"{v[0]}.{v[1]}" for k, v in loaded.ptx_isa.items()},
        compression=dict(loaded.compression),
        relocatable=dict(rel.sass + rel.ptx),
        containers=loaded.containers,
        fatbin_bytes=main.size if main is not None else 0,
        problems=(*loaded.problems, *rel.problems),
        elsewhere=elsewhere,
        kernels=_kernels(reader, loaded),
    )


def read_fatbin(path: Path) -> FatbinReport | None:
    """:func:`walk` of the file at ``path`` (seeks and reads headers only).

    Same reading as ``cuobjdump --list-elf --list-ptx PATH``. Raises OSError (unreadable, or
    not a regular file) and :class:`sparkdiag.sources.software.elf.NotElf`.

    Opened without blocking and held to a regular file before a byte is read: the scan walks
    regular files only, but a file replaced by a FIFO between the walk and this open waited for
    a writer forever (the hostile review).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with fh:
        return walk(FileReader(fh))


# -- cuobjdump, where installed: the reference the parser is checked against ------------------


def cuobjdump_listing(text: str) -> tuple[Counter[str], Counter[str]]:
    """(cubin targets, PTX targets) counted from ``cuobjdump --list-elf --list-ptx`` output,
    PTX named as here (``compute_80``; cuobjdump writes ``sm_80`` in a ``.ptx`` name)."""
    sass: Counter[str] = Counter()
    ptx: Counter[str] = Counter()
    for line in text.splitlines():
        kind, _, name = line.partition(":")
        parts = name.strip().rsplit(".", 2)
        if len(parts) < 3 or not parts[1].startswith("sm_"):
            continue
        if kind.startswith("ELF file") and parts[2] == "cubin":
            sass[parts[1]] += 1
        elif kind.startswith("PTX file") and parts[2] == "ptx":
            ptx["compute_" + parts[1][3:]] += 1
    return sass, ptx


def as_cuobjdump(report: FatbinReport) -> tuple[Counter[str], Counter[str]]:
    """The report's targets as cuobjdump names them: a family cubin loses its ``f``."""
    sass: Counter[str] = Counter()
    for name, count in report.sass.items():
        sass[name[:-1] if name.endswith("f") else name] += count
    return sass, Counter(report.ptx)


@dataclass(frozen=True)
class CuobjdumpRun:
    """cuobjdump's listing of one file: ``text`` (its standard output) and ``error`` (its
    "fatal" line, or why it did not run; None when it listed the file)."""

    text: str
    error: str | None


def run_cuobjdump(binary: str, path: Path, timeout: float = 120.0) -> CuobjdumpRun:
    """``BINARY --list-elf --list-ptx PATH``. A library with PTX only, or cubins only, makes
    cuobjdump print "No ELF file found" (or "No PTX ...") as info and exit non-zero: that is a
    listing; a "fatal" line is not (cuobjdump 13.4 stops with "Invalid ELF" on bitsandbytes
    0.50.2's libbitsandbytes_cuda121.so after its first cubin, which this module reads whole)."""
    try:
        done = subprocess.run(
            [binary, "--list-elf", "--list-ptx", str(path)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return CuobjdumpRun("", f"{binary} did not run: {exc}")
    fatal = [line for line in done.stderr.splitlines() if "fatal" in line]
    return CuobjdumpRun(done.stdout, fatal[0].strip() if fatal else None)


# -- header traces: fixtures of real libraries without their payloads -------------------------

TRACE_FORMAT = "sparkdiag-fatbin-trace/1"


def trace_document(path: Path, name: str | None = None) -> dict[str, Any]:
    """Walk ``path`` and keep every read the walk made: the ELF header, the section table and
    names, and each container and entry header (a few kB for a library of 100s of MB). The
    document replays through :func:`replay` without the library; ``report`` is what this walk
    saw, for the replay to be held to."""
    with path.open("rb") as fh:
        recorder = RecordingReader(FileReader(fh))
        report = walk(recorder, look_elsewhere=False)  # a trace keeps headers, not sections
    return {
        "format": TRACE_FORMAT,
        "library": name or path.name,
        "size_bytes": path.stat().st_size,
        "report": report.as_json() if report is not None else None,
        "reads": {str(offset): data.hex() for offset, data in sorted(recorder.trace.items())},
    }


def replay(doc: Mapping[str, Any]) -> FatbinReport | None:
    """:func:`walk` over a :func:`trace_document`'s reads. ValueError for another format."""
    if doc.get("format") != TRACE_FORMAT:
        raise ValueError(f"not a {TRACE_FORMAT} document")
    trace = {int(offset): bytes.fromhex(data) for offset, data in doc["reads"].items()}
    return walk(TraceReader(trace), look_elsewhere=False)
