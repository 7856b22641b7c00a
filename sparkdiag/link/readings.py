"""Everything the ConnectX-7 / NCCL lint reads, gathered once from :mod:`sparkdiag.sources`.

:class:`FabricReadings` is plain data: the lint (:mod:`sparkdiag.link.lint`) is a pure function
of it, so every finding can be driven from the fixture trees
(``tests/fixtures/sysfs/dgx-spark``, ``tests/fixtures/rootfs/dgx-spark-nccl``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkdiag.sources.host.gpudirect import (
    GpuDirect,
    cuda_attributes,
    gpu_models,
    module_loaded,
    modules_configured,
)
from sparkdiag.sources.host.meminfo import meminfo_bytes, read_proc_file
from sparkdiag.sources.host.netif import (
    NetInterface,
    NicFunction,
    interface_kind,
    read_connectx7,
    read_interfaces,
    route_interface,
)
from sparkdiag.sources.software.nccl import (
    NcclLibrary,
    NcclSettings,
    find_libraries,
    read_nccl_settings,
)
from sparkdiag.sources.software.pyenv import site_dirs_under

# Seconds the CUDA attributes' subprocess may take (a Python that imports the driver's library
# and calls cuInit: seconds on a busy or just-loaded driver). ``link test`` waits longer than
# this for the hello that follows its proof (sparkdiag.link.session.HELLO_AFTER_PROOF).
CUDA_TIMEOUT = 20.0
RETRY_SECONDS = 60.0  # a failed read of them is asked again after this (CudaOnce)

Attributes = Callable[[], "tuple[GpuDirect, ...] | str"]


class CudaOnce:
    """The CUDA attributes read once and kept, for a process that reads the fabric again and
    again (``link serve``: every session's hello, every ``ib_write_bw`` request). Read in each
    session, after the peer's proof, they held its hello back for up to :data:`CUDA_TIMEOUT`
    seconds, and ``link test``, waiting 5 s, said it was not ``link serve``. The GPUs and
    their driver do not change under a running server. A read that failed (the driver slow to
    answer at boot) is kept only :data:`RETRY_SECONDS`, then asked again: kept for good, it
    spoiled every later session's GPUDirect readings until a restart (found in a review).
    :meth:`start` reads them in the background; a call waits for that read (or makes it)."""

    def __init__(
        self, read: Attributes | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._read = read or (lambda: cuda_attributes(timeout=CUDA_TIMEOUT))
        self._clock = clock
        self._lock = threading.Lock()
        self._value: tuple[GpuDirect, ...] | str | None = None
        self._failed_at = 0.0
        self.reads = 0  # for tests: how many times the attributes were asked

    def __call__(self) -> tuple[GpuDirect, ...] | str:
        with self._lock:
            stale = isinstance(self._value, str) and (
                self._clock() - self._failed_at >= RETRY_SECONDS
            )
            if self._value is None or stale:
                self.reads += 1
                self._value = self._read()
                self._failed_at = self._clock()
            return self._value

    def start(self) -> None:
        """Read them now, in a thread of their own."""
        threading.Thread(target=self, name="cuda-attributes", daemon=True).start()


@dataclass(frozen=True)
class FabricReadings:
    """functions: the ConnectX-7 PCI functions; interfaces: every network interface by name;
    nccl: NCCL's settings as it would see them; libraries: every libnccl.so in sight;
    cma_total_bytes / cma_free_bytes: ``CmaTotal`` / ``CmaFree`` of /proc/meminfo (None: absent);
    cmdline: the kernel command line (/proc/cmdline);
    gpudirect: each CUDA device's GPUDirect attributes (empty: not read, why in
    ``gpudirect_note``); gpu_models: the GPUs the driver lists (/proc/driver/nvidia/gpus);
    peermem_loaded: nvidia_peermem is loaded (None: unknown); peermem_boot: files that load it
    at boot; kinds: interface -> (driver, Wi-Fi); peer_route: (peer address, the interface the
    routing table takes to it) for ``--peer``."""

    functions: tuple[NicFunction, ...]
    interfaces: Mapping[str, NetInterface]
    nccl: NcclSettings
    libraries: tuple[NcclLibrary, ...]
    cma_total_bytes: float | None
    cma_free_bytes: float | None
    cmdline: str | None
    gpudirect: tuple[GpuDirect, ...] = ()
    gpudirect_note: str = ""
    gpu_models: tuple[str, ...] = ()
    peermem_loaded: bool | None = None
    peermem_boot: tuple[str, ...] = ()
    kinds: Mapping[str, tuple[str | None, bool]] = field(default_factory=dict)
    peer_route: tuple[str, str | None] | None = None

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
            "gpudirect": [
                {
                    "gpu": g.index,
                    "name": g.name,
                    "rdma_supported": g.rdma,
                    "dmabuf_supported": g.dmabuf,
                    "host_alloc_dmabuf_supported": g.host_dmabuf,
                }
                for g in self.gpudirect
            ],
            "gpudirect_note": self.gpudirect_note,
            "gpu_models": list(self.gpu_models),
            "nvidia_peermem_loaded": self.peermem_loaded,
            "nvidia_peermem_at_boot": list(self.peermem_boot),
            **(
                {"peer_route": {"peer": self.peer_route[0], "interface": self.peer_route[1]}}
                if self.peer_route is not None
                else {}
            ),
        }


def python_site_dirs(rootfs: Path) -> list[Path]:
    """Where the probe's Python finds packages: this interpreter's ``sys.path`` on the real root;
    under any other root (a fixture tree) the usual ``site-packages``/``dist-packages``
    directories of every Python 3 there
    (:func:`sparkdiag.sources.software.pyenv.site_dirs_under`)."""
    if rootfs.resolve() == Path("/"):
        return [Path(p) for p in sys.path if p and Path(p).is_dir()]
    return site_dirs_under(rootfs)


def read_fabric(
    sysfs: Path,
    rootfs: Path,
    environ: Mapping[str, str],
    site_dirs: Sequence[Path] | None = None,
    peer: str | None = None,
    cuda: Attributes | None = None,
) -> FabricReadings:
    """Read the ConnectX-7 functions and interfaces (sysfs), NCCL's settings (``environ`` and the
    configuration files under ``rootfs``), the NCCL libraries, CMA and the kernel command line,
    GPUDirect RDMA (the CUDA attributes, asked in a subprocess on the real root only, or of
    ``cuda``: a :class:`CudaOnce` asks them once; the driver's GPU list; nvidia_peermem), each
    interface's driver, and the route to ``peer`` (on the real root only).

    Raises FileNotFoundError when ``sysfs`` is not a directory.
    """
    meminfo = read_proc_file(rootfs / "proc" / "meminfo")
    fields = meminfo_bytes(meminfo) if meminfo is not None else {}
    library_path = environ.get("LD_LIBRARY_PATH", "") if rootfs.resolve() == Path("/") else ""
    cmdline = read_proc_file(rootfs / "proc" / "cmdline")
    real = rootfs.resolve() == Path("/")
    interfaces = read_interfaces(sysfs)
    functions = read_connectx7(sysfs)
    attributes: tuple[GpuDirect, ...] | str = (
        (cuda or (lambda: cuda_attributes(timeout=CUDA_TIMEOUT)))()
        if real and functions
        else "not asked: no ConnectX-7 here"
    )
    if not real:
        attributes = "not asked: --path.rootfs is not /"
    return FabricReadings(
        functions=functions,
        interfaces=interfaces,
        nccl=read_nccl_settings(rootfs, environ),
        libraries=find_libraries(
            rootfs,
            python_site_dirs(rootfs) if site_dirs is None else site_dirs,
            [d for d in library_path.split(":") if d.startswith("/")],
        ),
        cma_total_bytes=fields.get("CmaTotal"),
        cma_free_bytes=fields.get("CmaFree"),
        cmdline=cmdline.strip() if cmdline is not None else None,
        gpudirect=attributes if not isinstance(attributes, str) else (),
        gpudirect_note=attributes if isinstance(attributes, str) else "",
        gpu_models=gpu_models(rootfs),
        peermem_loaded=module_loaded(sysfs, "nvidia_peermem"),
        peermem_boot=modules_configured(rootfs, "nvidia-peermem"),
        kinds={name: interface_kind(sysfs, name) for name in interfaces},
        peer_route=route_interface(peer) if peer and real else None,
    )
