"""Everything the ConnectX-7 / NCCL lint reads, gathered once from :mod:`sparkdiag.sources`.

:class:`FabricReadings` is plain data: the lint (:mod:`sparkdiag.link.lint`) is a pure function
of it, so every finding can be driven from the fixture trees
(``tests/fixtures/sysfs/dgx-spark``, ``tests/fixtures/rootfs/dgx-spark-nccl``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkdiag.sources.meminfo import meminfo_bytes, read_proc_file
from sparkdiag.sources.nccl import NcclLibrary, NcclSettings, find_libraries, read_nccl_settings
from sparkdiag.sources.netif import NetInterface, NicFunction, read_connectx7, read_interfaces


@dataclass(frozen=True)
class FabricReadings:
    """functions: the ConnectX-7 PCI functions; interfaces: every network interface by name;
    nccl: NCCL's settings as it would see them; libraries: every libnccl.so in sight;
    cma_total_bytes / cma_free_bytes: ``CmaTotal`` / ``CmaFree`` of /proc/meminfo (None: absent);
    cmdline: the kernel command line (/proc/cmdline)."""

    functions: tuple[NicFunction, ...]
    interfaces: Mapping[str, NetInterface]
    nccl: NcclSettings
    libraries: tuple[NcclLibrary, ...]
    cma_total_bytes: float | None
    cma_free_bytes: float | None
    cmdline: str | None

    def rdma_devices(self) -> dict[str, tuple[NicFunction, bool]]:
        """RDMA device name -> (its function, its port is ACTIVE)."""
        return {name: (f, f.rdma_active) for f in self.functions for name in f.rdma}

    def as_json(self) -> dict[str, Any]:
        return {
            "connectx7": [
                {
                    "pci": f.address,
                    "interfaces": [i.name for i in f.interfaces],
                    "rdma": list(f.rdma),
                    "rdma_active": f.rdma_active,
                }
                for f in self.functions
            ],
            "nccl_settings": {
                name: {"value": s.value, "origin": s.origin, "shadowed": list(s.shadowed)}
                for name, s in self.nccl.effective.items()
            },
            "nccl_libraries": [
                {
                    key: value
                    for key, value in {
                        "path": lib.path,
                        "real": lib.real,
                        "origin": lib.origin,
                        "version": lib.version,
                        "package": lib.package,
                        "size_bytes": lib.size_bytes,
                    }.items()
                    if value is not None
                }
                for lib in self.libraries
            ],
            **(
                {"cma_total_bytes": self.cma_total_bytes}
                if self.cma_total_bytes is not None
                else {}
            ),
            **({"cma_free_bytes": self.cma_free_bytes} if self.cma_free_bytes is not None else {}),
        }


def python_site_dirs(rootfs: Path) -> list[Path]:
    """Where the probe's Python finds packages: this interpreter's ``sys.path`` on the real root;
    under any other root (a fixture tree) the usual ``site-packages``/``dist-packages``
    directories of every Python 3 there."""
    if rootfs.resolve() == Path("/"):
        return [Path(p) for p in sys.path if p and Path(p).is_dir()]
    found = []
    for pattern in (
        "usr/lib/python3*/site-packages",
        "usr/lib/python3*/dist-packages",
        "usr/local/lib/python3*/site-packages",
        "usr/local/lib/python3*/dist-packages",
    ):
        found += sorted(rootfs.glob(pattern))
    return found


def read_fabric(
    sysfs: Path,
    rootfs: Path,
    environ: Mapping[str, str],
    site_dirs: Sequence[Path] | None = None,
) -> FabricReadings:
    """Read the ConnectX-7 functions and interfaces (sysfs), NCCL's settings (``environ`` and the
    configuration files under ``rootfs``), the NCCL libraries, CMA and the kernel command line.

    Raises FileNotFoundError when ``sysfs`` is not a directory.
    """
    meminfo = read_proc_file(rootfs / "proc" / "meminfo")
    fields = meminfo_bytes(meminfo) if meminfo is not None else {}
    library_path = environ.get("LD_LIBRARY_PATH", "") if rootfs.resolve() == Path("/") else ""
    cmdline = read_proc_file(rootfs / "proc" / "cmdline")
    return FabricReadings(
        functions=read_connectx7(sysfs),
        interfaces=read_interfaces(sysfs),
        nccl=read_nccl_settings(rootfs, environ),
        libraries=find_libraries(
            rootfs,
            python_site_dirs(rootfs) if site_dirs is None else site_dirs,
            [d for d in library_path.split(":") if d.startswith("/")],
        ),
        cma_total_bytes=fields.get("CmaTotal"),
        cma_free_bytes=fields.get("CmaFree"),
        cmdline=cmdline.strip() if cmdline is not None else None,
    )
