"""The GPUDirect RDMA rules of the lint (:mod:`sparkdiag.link.lint`), pure functions of
:class:`~sparkdiag.link.readings.FabricReadings`:

``gdr-forced``
    an NCCL setting that makes NCCL try GPUDirect RDMA (``NCCL_NET_GDR_LEVEL`` above ``LOC``,
    ``NCCL_NET_GDR_READ=1``, ``NCCL_DMABUF_ENABLE=1``, ``NCCL_GDRCOPY_ENABLE=1``) on a GPU where
    it cannot work: the CUDA driver says ``CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`` is 0,
    or, unasked, the GPU is a GB10, where NVIDIA does not support it by design of its unified
    memory (nvidia-peermem, dma-buf and GDRCopy do not work; NVIDIA developer forum thread
    348787). Owners spent days on it: "could not insert 'nvidia_peermem': Invalid argument",
    NCCL "GPU Direct RDMA Disabled", 208 Gb/s of a 400 Gb/s pair (thread 352051);
``peermem-boot``
    the same GPU with ``nvidia-peermem`` set to load at boot (``/etc/modules``,
    ``/etc/modules-load.d``): its failure to load is expected there, not a fault to repair;
``gdr-unused``
    a GPU that supports GPUDirect RDMA (attribute 1) beside an RDMA device, with neither
    ``nvidia_peermem`` loaded nor dma-buf supported: NCCL then stages every transfer through
    host memory (NCCL documentation, NCCL_NET_GDR_LEVEL; NVIDIA GPUDirect RDMA documentation).
"""

from __future__ import annotations

from sparkdiag.link.findings import Finding
from sparkdiag.link.readings import FabricReadings
from sparkdiag.sources.software.nccl import NcclSetting

UNSUPPORTED_FIGURE = (
    "NVIDIA: GPUDirect RDMA is not supported on DGX Spark, by design of its unified memory; "
    "nvidia-peermem, dma-buf and GDRCopy do not work there, and applications should query "
    "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED and register cudaHostAlloc buffers instead "
    "(NVIDIA developer forum thread 348787); owners who forced it got 'could not insert "
    "nvidia_peermem: Invalid argument' and 208 Gb/s of a 400 Gb/s pair (thread 352051)"
)
STAGING_FIGURE = (
    "without nvidia_peermem or dma-buf NCCL cannot register GPU memory with the NIC and stages "
    "every transfer through host memory (NCCL documentation, NCCL_NET_GDR_LEVEL; NVIDIA "
    "GPUDirect RDMA documentation)"
)


def forces(setting: NcclSetting) -> bool:
    """Whether the setting asks NCCL for GPUDirect RDMA (or GDRCopy) explicitly."""
    value = setting.value.strip().upper()
    if setting.name == "NCCL_NET_GDR_LEVEL":
        return value not in ("", "LOC", "0")
    return setting.name in ("NCCL_NET_GDR_READ", "NCCL_DMABUF_ENABLE", "NCCL_GDRCOPY_ENABLE") and (
        value == "1"
    )


def impossible(readings: FabricReadings) -> str | None:
    """Why GPUDirect RDMA cannot work on this machine's GPUs, or None where it can (or nothing
    says it cannot)."""
    no = [g for g in readings.gpudirect if g.rdma is False]
    if no:
        g = no[0]
        return f"CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED is 0 on GPU {g.index} ({g.name})"
    if readings.gpudirect and all(g.rdma for g in readings.gpudirect):
        return None
    names = [*readings.gpu_models, *(g.name for g in readings.gpudirect)]
    if any("GB10" in name for name in names):
        return "this GPU is a GB10 (DGX Spark), where NVIDIA does not support it"
    return None


def _unset(setting: NcclSetting) -> str:
    if setting.origin == "environment":
        return f"unset {setting.name}"
    return f"remove the {setting.name} line from {setting.origin}"


def gpudirect(readings: FabricReadings) -> list[Finding]:
    """The module's rules, in its order."""
    why = impossible(readings)
    findings = []
    if why is not None:
        forced = [s for s in readings.nccl.effective.values() if forces(s)]
        if forced:
            shown = ", ".join(f"{s.name}={s.value}" for s in forced)
            findings.append(
                Finding(
                    "gdr-forced",
                    ",".join(s.name for s in forced),
                    f"{shown} makes NCCL try GPUDirect RDMA, which cannot work here: {why}",
                    UNSUPPORTED_FIGURE,
                    "; ".join(_unset(s) for s in forced) + ", on both machines: NCCL then moves "
                    "data through host memory, which on GB10 is the GPU's own memory; tune the "
                    "link instead (MTU 9000, both halves of the port in NCCL_IB_HCA)",
                )
            )
        if readings.peermem_boot:
            files = ", ".join(readings.peermem_boot)
            findings.append(
                Finding(
                    "peermem-boot",
                    "nvidia-peermem",
                    f"{files} loads nvidia-peermem at boot, which cannot work here ({why}): "
                    "its 'Invalid argument' when it loads is expected, not a fault to repair",
                    UNSUPPORTED_FIGURE,
                    f"remove nvidia-peermem from {files}",
                )
            )
        return findings
    supported = [g for g in readings.gpudirect if g.rdma]
    rdma = any(f.rdma for f in readings.functions)
    dmabuf = any(g.dmabuf for g in supported)
    if supported and rdma and readings.peermem_loaded is False and not dmabuf:
        findings.append(
            Finding(
                "gdr-unused",
                "nvidia_peermem",
                f"GPU {supported[0].index} ({supported[0].name}) supports GPUDirect RDMA, "
                "but nvidia_peermem is not loaded and the driver offers no dma-buf",
                STAGING_FIGURE,
                "sudo modprobe nvidia-peermem (and list it in /etc/modules-load.d/ to keep "
                "it), or use the open kernel modules on a kernel with dma-buf (5.12+)",
            )
        )
    return findings


def state(readings: FabricReadings) -> str:
    """One line on GPUDirect RDMA here, for the readings' text."""
    why = impossible(readings)
    if why is not None:
        return (
            f"GPUDirect RDMA: not possible here ({why}); nvidia-peermem failing to load is expected"
        )
    peermem = {True: "loaded", False: "not loaded", None: "unknown"}[readings.peermem_loaded]
    supported = [g for g in readings.gpudirect if g.rdma]
    if supported:
        dmabuf = "yes" if any(g.dmabuf for g in supported) else "no"
        return f"GPUDirect RDMA: supported; nvidia_peermem {peermem}; dma-buf {dmabuf}"
    return f"GPUDirect RDMA: unknown ({readings.gpudirect_note or 'not asked'})"
