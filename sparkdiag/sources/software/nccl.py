"""What NCCL would read and load on this machine: its settings and every ``libnccl.so`` in sight.

Settings. NCCL reads ``$NCCL_CONF_FILE`` (else ``~/.nccl.conf``), then ``/etc/nccl.conf``; a line
``KEY=VALUE`` sets ``KEY`` only when it is not already set, so the environment wins over the
files and the user's file over ``/etc/nccl.conf`` (NCCL ``src/misc/param.cc``: ``initEnv``,
``setEnvFile``). NCCL takes the key up to the first ``=`` as it stands and skips lines that
start with ``#``: ``NCCL_IB_HCA = mlx5_0`` sets a variable named ``"NCCL_IB_HCA "``, which NCCL
never reads. :func:`read_nccl_settings` reads the same files, under ``--path.rootfs``.

Libraries. A pip install of torch brings NCCL as a wheel (``nvidia-nccl-cu12``/``-cu13``:
``site-packages/nvidia/nccl/lib/libnccl.so.2``); DGX OS and the CUDA repositories install
``libnccl2`` (``/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9``). :func:`find_libraries` lists
both kinds, with their versions, without loading either.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkdiag.sources.files import KIB, read_text_limited
from sparkdiag.sources.software.pyenv import distributions

SETTINGS = (
    "NCCL_IB_HCA",
    "NCCL_SOCKET_IFNAME",
    # GPUDirect RDMA: set, they make NCCL try it (link/gpudirect.py)
    "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ",
    "NCCL_DMABUF_ENABLE",
    "NCCL_GDRCOPY_ENABLE",
)
_LIBRARY = re.compile(r"^libnccl\.so(\.\d+)*$")
_VERSION = re.compile(r"^libnccl\.so\.(\d+\.\d+\.\d+)$")
# Where Debian/Ubuntu, the CUDA repositories and NGC images put libnccl2.
SYSTEM_DIRS = (
    "usr/lib/aarch64-linux-gnu",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "usr/local/lib",
    "usr/local/cuda/lib64",
)


@dataclass(frozen=True)
class ConfFile:
    """One NCCL configuration file: ``values`` it sets, ``ignored`` keys NCCL never reads (a
    space before ``=``)."""

    path: str
    values: Mapping[str, str]
    ignored: tuple[str, ...] = ()


@dataclass(frozen=True)
class NcclSetting:
    """The value NCCL would use for one variable and where it comes from: ``environment`` or a
    file path; ``shadowed`` holds the other places that set it, which lose."""

    name: str
    value: str
    origin: str
    shadowed: tuple[str, ...] = ()


@dataclass(frozen=True)
class NcclSettings:
    files: tuple[ConfFile, ...]
    effective: Mapping[str, NcclSetting]


def parse_conf(text: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """``KEY=VALUE`` lines as NCCL's ``setEnvFile`` reads them: (values, ignored keys)."""
    values: dict[str, str] = {}
    ignored = []
    for line in text.splitlines():
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        if key != key.strip() and key.strip():
            ignored.append(key.strip())
            continue
        values.setdefault(key, value)  # NCCL's setenv does not overwrite: the first line wins
    return values, tuple(ignored)


def _read_conf(path: Path, shown: str) -> ConfFile | None:
    try:
        text = read_text_limited(path, 64 * KIB)
    except OSError:
        return None
    values, ignored = parse_conf(text)
    return ConfFile(shown, values, ignored)


def _under(rootfs: Path, path: str) -> Path:
    return rootfs / path.lstrip("/")


def read_nccl_settings(
    rootfs: Path, environ: Mapping[str, str], home: str | None = None
) -> NcclSettings:
    """The :data:`SETTINGS` (NCCL_IB_HCA, NCCL_SOCKET_IFNAME, the GPUDirect ones) as NCCL would
    see them, and the files that set any.

    Same reading as ``env | grep ^NCCL_`` and ``cat ~/.nccl.conf /etc/nccl.conf`` (or
    ``$NCCL_CONF_FILE`` instead of the first). ``home`` is the user's home directory (default
    ``$HOME``); files are read under ``rootfs``.
    """
    conf_file = environ.get("NCCL_CONF_FILE")
    first = conf_file if conf_file else (f"{home or environ.get('HOME', '')}/.nccl.conf")
    files = []
    for shown in dict.fromkeys((first, "/etc/nccl.conf")):
        if shown.startswith("/"):
            found = _read_conf(_under(rootfs, shown), shown)
            if found is not None:
                files.append(found)
    effective: dict[str, NcclSetting] = {}
    for name in SETTINGS:
        places = [("environment", environ[name])] if environ.get(name) else []
        places += [(f.path, f.values[name]) for f in files if f.values.get(name)]
        if places:
            (origin, value), rest = places[0], places[1:]
            effective[name] = NcclSetting(name, value, origin, tuple(p for p, _ in rest))
    return NcclSettings(tuple(files), effective)


@dataclass(frozen=True)
class NcclLibrary:
    """One NCCL library file.

    path: where it is found (``.../nvidia/nccl/lib/libnccl.so.2``)
    real: the file it resolves to (``.../libnccl.so.2.28.9``)
    origin: ``pip`` (a wheel in a site directory of the probe's Python) or ``system``
    version: ``2.28.9``, from the wheel's metadata or the library's file name; None if neither
    package: the wheel (``nvidia-nccl-cu13``) or None
    size_bytes: of the real file
    """

    path: str
    real: str
    origin: str
    version: str | None
    package: str | None
    size_bytes: int | None


def _candidates(directory: Path) -> list[Path]:
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    return [directory / name for name in names if _LIBRARY.match(name)]


def _resolved(path: Path) -> tuple[Path, int | None] | None:
    try:
        real = path.resolve(strict=True)
        return real, real.stat().st_size
    except (OSError, RuntimeError):
        return None


def _wheels(site: Path) -> dict[str, str]:
    """``nvidia-nccl-cu13`` -> ``2.28.9`` for every NCCL wheel installed in ``site``."""
    return {
        dist.normalized: dist.version
        for dist in distributions(site)
        if dist.normalized.startswith("nvidia-nccl")
    }


def ld_conf_dirs(rootfs: Path) -> list[str]:
    """The directories ``/etc/ld.so.conf.d/*.conf`` adds to the loader's search (absolute paths
    only; ``include`` lines are not followed)."""
    dirs = []
    conf_d = _under(rootfs, "/etc/ld.so.conf.d")
    for name in sorted(os.listdir(conf_d)) if conf_d.is_dir() else []:
        if not name.endswith(".conf"):
            continue
        try:
            text = read_text_limited(conf_d / name, 16 * KIB)
        except OSError:
            continue
        dirs += [line.strip() for line in text.splitlines() if line.strip().startswith("/")]
    return dirs


def find_libraries(
    rootfs: Path, site_dirs: Sequence[Path], library_path: Sequence[str] = ()
) -> tuple[NcclLibrary, ...]:
    """Every distinct ``libnccl.so`` the probe's Python could load: the wheels' in ``site_dirs``
    (``nvidia/nccl/lib``, ``torch/lib``) and the system's (``SYSTEM_DIRS``, ``ld.so.conf.d``,
    ``library_path`` for ``$LD_LIBRARY_PATH``) under ``rootfs``.

    Same reading as ``python -m pip show nvidia-nccl-cu13``, ``ldconfig -p | grep libnccl`` and
    ``find / -name 'libnccl.so*'``. Files that resolve to the same one are listed once.
    """
    seen: set[Path] = set()
    found: list[NcclLibrary] = []
    root = rootfs.resolve()

    def show(path: Path) -> str:
        """The path as the machine under ``rootfs`` names it."""
        try:
            return "/" + str(path.relative_to(root)) if root != Path("/") else str(path)
        except ValueError:
            return str(path)

    def add(path: Path, origin: str, package: str | None, version: str | None) -> None:
        resolved = _resolved(path)
        if resolved is None or resolved[0] in seen:
            return
        real, size = resolved
        seen.add(real)
        named = _VERSION.match(real.name)
        version = version or (named.group(1) if named else None)
        shown = show(path.parent.resolve() / path.name)
        found.append(NcclLibrary(shown, show(real), origin, version, package, size))

    for site in site_dirs:
        wheels = _wheels(site)
        package, version = next(iter(sorted(wheels.items())), (None, None))
        for sub in ("nvidia/nccl/lib", "torch/lib"):
            wheel = sub.startswith("nvidia")
            for path in _candidates(site / sub):
                add(path, "pip", package if wheel else None, version if wheel else None)
    dirs = [*library_path, *ld_conf_dirs(rootfs), *(f"/{d}" for d in SYSTEM_DIRS)]
    for directory in dict.fromkeys(dirs):
        for path in _candidates(_under(rootfs, directory)):
            add(path, "system", None, None)
    return tuple(found)
