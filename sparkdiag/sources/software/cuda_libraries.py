"""Every shared library with CUDA device code in a Python environment, with the package that
ships it: what the architecture lint (:mod:`sparkdiag.native`) judges.

The package directories are walked for shared libraries (symlinks not followed); each is read
with :func:`sparkdiag.sources.software.fatbin.read_fatbin` (headers only). A site-packages with
torch, its nvidia-* wheels and vLLM holds gigabytes of libraries, so results are kept in a
:class:`ScanCache` keyed by (path, size, modification time): a library that did not change is
not read again. The cache is a JSON file in the state directory
(``cuda-libraries.json``); a cache that cannot be read or written costs a rescan, nothing else.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkdiag.sources.files import MIB, read_text_limited
from sparkdiag.sources.software.elf import NotElf, is_shared_library_name, walk_libraries
from sparkdiag.sources.software.fatbin import FatbinReport, read_fatbin
from sparkdiag.sources.software.pyenv import Owner, PythonEnvironment, file_owners, is_site_dir
from sparkdiag.statedir import StateDirError, write_atomically

CACHE_NAME = "cuda-libraries.json"
# 2: an architecture number no GPU has is a problem, no longer a target (sm_4294967295): the
# reports cached before are read again. 3: a small fat binary says whether the library has fat
# binaries elsewhere (FatbinReport.elsewhere), which the lint's stub rule needs. 4: that search
# counts alignment in the file (a report of 3 said libcufft.so.12 had none: check failed it),
# and a small fat binary's cubins are read for kernels (FatbinReport.kernels: libcufftw's none)
CACHE_FORMAT = "sparkdiag-cuda-libraries/4"
CACHE_LIMIT = 32 * MIB


@dataclass(frozen=True)
class CudaLibrary:
    """One library with device code: where it is (as the machine names it, and ``relative`` to
    its package directory: ``torch/lib/libtorch_cuda.so``, the same on every machine), the
    distribution that ships it (when no RECORD lists it, ``package`` is its top directory's
    name and ``listed`` False), its size and what it carries."""

    path: str
    relative: str
    package: str
    version: str
    size_bytes: int
    report: FatbinReport
    listed: bool = True

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class LibraryScan:
    """environment: what was scanned; libraries: those with device code, by path;
    files: shared libraries looked at; cached: of those, answered from the cache;
    unreadable: path -> why (not ELF, permission ...); seconds: how long it took."""

    environment: str
    site_dirs: tuple[str, ...]
    libraries: tuple[CudaLibrary, ...]
    files: int
    cached: int
    unreadable: Mapping[str, str]
    seconds: float
    # path -> the package directory Python imports its package from instead, earlier in the
    # interpreter's sys.path: that copy is never loaded and is not judged
    shadowed: Mapping[str, str] = field(default_factory=dict)


_Key = tuple[str, int, int]


class ScanCache:
    """(path, size, mtime_ns) -> the library's report, or None for no device code."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[_Key, FatbinReport | None] = {}
        self.changed = False
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            doc = json.loads(read_text_limited(path, CACHE_LIMIT))
            if doc.get("format") != CACHE_FORMAT:
                return
            for item in doc["libraries"]:
                key = (str(item["path"]), int(item["size"]), int(item["mtime_ns"]))
                report = item["report"]
                self.entries[key] = None if report is None else FatbinReport.from_json(report)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.entries = {}  # unreadable or another format: start again

    def get(self, key: _Key) -> tuple[bool, FatbinReport | None]:
        if key in self.entries:
            return True, self.entries[key]
        return False, None

    def put(self, key: _Key, report: FatbinReport | None) -> None:
        self.entries[key] = report
        self.changed = True

    def keep_only(self, keys: Iterable[_Key], under: Iterable[Path]) -> None:
        """Forget the libraries under the directories ``under`` that this scan did not see as
        they are now (removed or changed), so the file does not grow forever; entries of other
        environments stay."""
        wanted = set(keys)
        prefixes = tuple(str(p.resolve()) + os.sep for p in under)
        stale = [k for k in self.entries if k not in wanted and k[0].startswith(prefixes)]
        for key in stale:
            del self.entries[key]
        self.changed = self.changed or bool(stale)

    def save(self) -> None:
        """Write the cache (atomically) when it changed; errors are ignored (a rescan)."""
        if self.path is None or not self.changed:
            return
        doc = {
            "format": CACHE_FORMAT,
            "libraries": [
                {
                    "path": path,
                    "size": size,
                    "mtime_ns": mtime,
                    "report": None if report is None else report.as_json(),
                }
                for (path, size, mtime), report in sorted(self.entries.items())
            ],
        }
        if not self.path.parent.is_dir():
            return  # not made here: the state directory is the command's to create
        try:  # a temporary file of its own, removed when the write fails (a full disk)
            write_atomically(self.path, json.dumps(doc).encode("utf-8"))
            self.changed = False
        except (OSError, StateDirError):
            return


def _top_package(path: Path, site: Path) -> str:
    try:
        first = path.relative_to(site).parts[0]
    except (ValueError, IndexError):
        return ""
    return first.split(".", 1)[0].replace("_", "-").lower()


def _import_root(relative: Path, site: Path) -> Path:
    """What Python imports ``relative`` under: its top package (``torch``), a top-level
    module's name (``_foo`` of ``_foo.cpython-312-x86_64-linux-gnu.so``), or within a namespace
    package (a directory without ``__init__.py``, as ``nvidia`` of the CUDA wheels, which spans
    package directories) the package below it (``nvidia/cublas``)."""
    parts = relative.parts
    if len(parts) == 1:
        return Path(parts[0].split(".", 1)[0])
    if len(parts) > 2 and not (site / parts[0] / "__init__.py").exists():
        return Path(parts[0], parts[1])
    return Path(parts[0])


def _shadowing(root: Path, earlier: Sequence[Path]) -> Path | None:
    """The first of the ``earlier`` package directories from which Python imports ``root``
    instead: one holding it as a regular package (with ``__init__.py``) or as a module file
    (a suffix Python imports: ``.py``, ``.cpython-312-x86_64-linux-gnu.so`` ...); None when
    none does. A directory without ``__init__.py``, an ``.egg-link`` or a ``.pth`` of that name
    is no import of it (they hid the editable source trees a .pth adds: found in a review)."""
    for site in earlier:
        where = site / root
        if (where / "__init__.py").is_file():
            return site
        if any((where.parent / f"{where.name}{suffix}").is_file() for suffix in MODULE_SUFFIXES):
            return site
    return None


MODULE_SUFFIXES = tuple(importlib.machinery.all_suffixes())


def _walk_site(site: Path, unlisted: dict[str, str]) -> Iterator[Path]:
    """The shared libraries under ``site``. A directory a ``.pth`` file adds (not a package
    directory: an editable install's project root) is walked in what Python imports from it,
    its packages (directories with ``__init__.py``) and top-level modules: walked whole, its
    ``.venv``, ``build`` and ``.git`` were judged as this interpreter's (found in a review)."""
    if is_site_dir(site):
        yield from walk_libraries(site, unlisted)
        return
    try:
        entries = sorted(os.scandir(site), key=lambda e: e.name)
    except OSError as exc:
        unlisted[str(site)] = exc.strerror or str(exc)
        return
    for entry in entries:
        path = Path(entry.path)
        try:
            if entry.is_dir(follow_symlinks=False) and (path / "__init__.py").is_file():
                yield from walk_libraries(path, unlisted)
            elif is_shared_library_name(entry.name) and entry.is_file(follow_symlinks=False):
                yield path
        except OSError:
            continue


def scan(env: PythonEnvironment, cache: ScanCache | None = None) -> LibraryScan:
    """Every library with device code under ``env``'s package directories.

    Same reading as ``find SITE -name '*.so*' -exec cuobjdump --list-elf --list-ptx {} \\;``
    with ``pip show -f`` for the owner. Files that resolve to one already seen are read once.
    """
    started = time.monotonic()
    cache = cache or ScanCache(None)
    found: list[CudaLibrary] = []
    unreadable: dict[str, str] = {}
    seen: set[Path] = set()
    keys: list[_Key] = []
    shadowed: dict[str, str] = {}
    files = cached = 0
    for number, site in enumerate(env.site_dirs):
        owners = file_owners(site)
        # an interpreter's package directories are in its sys.path order: a package in an
        # earlier one hides its copies in the later ones (pip install --user over the
        # distribution's torch). Both were judged, and the copy never loaded could fail the
        # lint (found in a review). A root's Pythons are several interpreters: none hides
        earlier = env.site_dirs[:number] if env.python is not None else ()
        hidden_by: dict[Path, Path | None] = {}
        unlisted: dict[str, str] = {}
        for path in _walk_site(site, unlisted):
            if earlier:
                root = _import_root(path.relative_to(site), site)
                if root not in hidden_by:  # a few stats an import root, not a library
                    hidden_by[root] = _shadowing(root, earlier)
                first = hidden_by[root]
                if first is not None:
                    shadowed[env.show(path)] = env.show(first)
                    continue
            real = path.resolve()
            if real in seen:
                continue
            seen.add(real)
            files += 1
            try:
                stat = real.stat()
            except OSError as exc:
                unreadable[env.show(path)] = exc.strerror or str(exc)
                continue
            key = (str(real), stat.st_size, stat.st_mtime_ns)
            keys.append(key)
            hit, report = cache.get(key)
            if hit:
                cached += 1
            else:
                try:
                    report = read_fatbin(real)
                except NotElf:
                    report = None  # a linker script or a stub named .so
                except OSError as exc:
                    unreadable[env.show(path)] = exc.strerror or str(exc)
                    continue
                cache.put(key, report)
            if report is None or not report.has_gpu_code:
                continue
            owner = owners.get(real)
            listed = owner is not None
            owner = owner or Owner(_top_package(path, site), "")
            relative = str(path.relative_to(site))
            found.append(
                CudaLibrary(
                    env.show(path),
                    relative,
                    owner.package,
                    owner.version,
                    stat.st_size,
                    report,
                    listed,
                )
            )
        for directory, why in unlisted.items():
            unreadable[env.show(Path(directory))] = f"cannot list it: {why}"
    cache.keep_only(keys, env.site_dirs)
    cache.save()
    return LibraryScan(
        environment=env.described,
        site_dirs=tuple(env.show(d) for d in env.site_dirs),
        libraries=tuple(sorted(found, key=lambda lib: (lib.package, lib.path))),
        files=files,
        cached=cached,
        unreadable=unreadable,
        seconds=time.monotonic() - started,
        shadowed=shadowed,
    )


def scan_json(result: LibraryScan) -> dict[str, Any]:
    """The scan as JSON (the library reports in full)."""
    return {
        "environment": result.environment,
        "site_dirs": list(result.site_dirs),
        "files": result.files,
        "cached": result.cached,
        "seconds": round(result.seconds, 3),
        "unreadable": dict(result.unreadable),
        "shadowed": dict(result.shadowed),
        "libraries": [
            {
                "path": lib.path,
                "relative": lib.relative,
                "package": lib.package,
                "version": lib.version,
                "listed_in_record": lib.listed,
                "size_bytes": lib.size_bytes,
                **lib.report.as_json(),
            }
            for lib in result.libraries
        ],
    }


def scan_from_json(doc: Mapping[str, Any]) -> LibraryScan:
    """The inverse of :func:`scan_json` (the daemon reads the scan its child process made);
    ValueError, KeyError or TypeError on a document that is not one."""
    return LibraryScan(
        environment=str(doc["environment"]),
        site_dirs=tuple(str(d) for d in doc["site_dirs"]),
        libraries=tuple(
            CudaLibrary(
                path=str(item["path"]),
                relative=str(item["relative"]),
                package=str(item["package"]),
                version=str(item["version"]),
                size_bytes=int(item["size_bytes"]),
                report=FatbinReport.from_json(item),
                listed=bool(item["listed_in_record"]),
            )
            for item in doc["libraries"]
        ),
        files=int(doc["files"]),
        cached=int(doc["cached"]),
        unreadable={str(k): str(v) for k, v in dict(doc["unreadable"]).items()},
        seconds=float(doc["seconds"]),
        shadowed={str(k): str(v) for k, v in dict(doc.get("shadowed", {})).items()},
    )
