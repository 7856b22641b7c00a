"""Whether GPUDirect RDMA can work on this machine's GPUs, and whether it is set up: the CUDA
device attributes, the ``nvidia_peermem`` module, and which GPUs the driver lists.

The attributes come from the CUDA driver (``libcuda.so.1``) through ctypes, in a subprocess of
this interpreter (``cuInit`` loads the driver and can take a few hundred ms; it is never done
in the daemon): ``CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`` (116),
``CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`` (124) and
``CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED`` (146, CUDA 13's cuda.h: page-locked host
memory shared through dma-buf), as NVIDIA asks applications to query them on DGX Spark, where
GPUDirect RDMA is not supported (NVIDIA developer forum thread 348787).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from sparkdiag.sources.files import KIB, read_text_limited
from sparkdiag.sources.software.pyenv import run_json

RDMA_SUPPORTED = 116
DMA_BUF_SUPPORTED = 124
HOST_ALLOC_DMA_BUF_SUPPORTED = 146
ATTRIBUTES_SCRIPT = f"""
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
if cuda.cuInit(0) != 0:
    raise SystemExit("cuInit failed")
count = ctypes.c_int()
cuda.cuDeviceGetCount(ctypes.byref(count))
out = []
for index in range(count.value):
    device = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(device), index)
    name = ctypes.create_string_buffer(256)
    cuda.cuDeviceGetName(name, 256, device)
    row = {{"index": index, "name": name.value.decode(errors="replace")}}
    for key, attribute in (("rdma", {RDMA_SUPPORTED}), ("dmabuf", {DMA_BUF_SUPPORTED}),
                           ("host_dmabuf", {HOST_ALLOC_DMA_BUF_SUPPORTED}),
                           ("major", 75), ("minor", 76)):
        value = ctypes.c_int()
        rc = cuda.cuDeviceGetAttribute(ctypes.byref(value), attribute, device)
        row[key] = value.value if rc == 0 else None
    out.append(row)
print(json.dumps(out))
"""


@dataclass(frozen=True)
class GpuDirect:
    """One GPU as the CUDA driver describes it (CUDA device order). None: the driver did not
    answer for that attribute (an older driver)."""

    index: int
    name: str
    rdma: bool | None
    dmabuf: bool | None
    host_dmabuf: bool | None
    capability: str


def _flag(value: object) -> bool | None:
    return bool(value) if isinstance(value, int) else None


def cuda_attributes(
    python: str = sys.executable, timeout: float = 20.0
) -> tuple[GpuDirect, ...] | str:
    """The GPUDirect attributes of every CUDA device, or why they could not be read.

    Same reading as a program calling ``cuDeviceGetAttribute(&v,
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, dev)``; ``nvidia-smi`` shows none of them.
    """
    rows, why = run_json([python, "-c", ATTRIBUTES_SCRIPT], timeout)
    try:
        return tuple(
            GpuDirect(
                int(row["index"]),
                str(row["name"]),
                _flag(row["rdma"]),
                _flag(row["dmabuf"]),
                _flag(row["host_dmabuf"]),
                f"{row['major']}.{row['minor']}",
            )
            for row in rows
        )
    except (KeyError, TypeError, ValueError):
        return f"the CUDA driver did not answer: {why or 'an unexpected answer'}"


def gpu_models(rootfs: Path) -> tuple[str, ...]:
    """The model of every GPU the NVIDIA driver lists (``Model:`` of
    ``ROOT/proc/driver/nvidia/gpus/*/information``: "NVIDIA GB10"), without NVML."""
    models = []
    try:
        entries = sorted((rootfs / "proc/driver/nvidia/gpus").iterdir())
    except OSError:
        return ()
    for entry in entries:
        try:
            text = read_text_limited(entry / "information", 16 * KIB)
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model" and value.strip():
                models.append(value.strip())
    return tuple(models)


def module_loaded(sysfs: Path, name: str) -> bool | None:
    """Whether the kernel module ``name`` is loaded (``SYSFS/module/NAME`` exists, as
    ``lsmod | grep NAME`` shows); None where sysfs has no module directory at all."""
    modules = sysfs / "module"
    if not modules.is_dir():
        return None
    return (modules / name).is_dir()


def modules_configured(rootfs: Path, name: str) -> tuple[str, ...]:
    """The files that load module ``name`` at boot: ``/etc/modules`` and
    ``/etc/modules-load.d/*.conf`` lines naming it (``-`` and ``_`` alike)."""
    want = name.replace("-", "_")
    files = [rootfs / "etc/modules"]
    directory = rootfs / "etc/modules-load.d"
    if directory.is_dir():
        files += sorted(directory.glob("*.conf"))
    found = []
    for path in files:
        try:
            text = read_text_limited(path, 64 * KIB)
        except OSError:
            continue
        names = {line.split("#")[0].strip().replace("-", "_") for line in text.splitlines()}
        if want in names:
            found.append("/" + str(path.relative_to(rootfs)))
    return tuple(found)
