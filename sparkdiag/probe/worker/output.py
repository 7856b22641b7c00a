"""The one JSON document the worker prints (schema ``contract.SCHEMA``): its every key from the
start (so a worker that breaks still prints a whole document), the overall status, the int4
ratios, and the software identity (torch, CUDA, cuBLAS, driver, GPU)."""

from __future__ import annotations

import ctypes
import platform
import re
from collections.abc import Sequence
from typing import Any

from sparkdiag.probe.worker.contract import SCHEMA
from sparkdiag.probe.worker.dtypes import DeviceInfo
from sparkdiag.probe.worker.nvml import Nvml, summarize_conditions


def empty_document(started: float) -> dict[str, Any]:
    """The document with every key, before anything ran (status "error" until it did)."""
    return {
        "schema": SCHEMA,
        "status": "error",
        "reason": None,
        "software": {
            "torch": None,
            "cuda": None,
            "cublas": None,
            "driver": None,
            "python": platform.python_version(),
            "gpu_name": None,
            "compute_capability": None,
            "gpu_uuid": None,
            "device": None,
        },
        "suite": None,
        "results": [],
        "ratios": {},
        "bandwidth": None,
        "transfers": [],
        "soak": None,
        "storage": None,
        "conditions": summarize_conditions([]),
        "busy": {"other_pids": [], "utilization": None, "nvml": False},
        "gpu_busy_seconds": 0.0,
        "config": None,
        "started_at": started,
        "finished_at": None,
    }


def _item_name(item: dict[str, Any]) -> str:
    if "direction" in item:
        return f"{item['memory']} {item['direction']} {item['size_bytes']} B copies"
    return f"{item.get('dtype', 'bandwidth')} {item.get('shape', '')}".strip()


def overall_status(doc: dict[str, Any]) -> tuple[str, str | None]:
    results = doc.get("results") or []
    bandwidth = doc.get("bandwidth")
    transfers = doc.get("transfers") or []
    items = list(results) + ([bandwidth] if bandwidth else []) + list(transfers)
    failed = [r for r in items if r.get("status") == "error"]
    if failed:
        names = [_item_name(r) for r in failed]
        return "error", f"{len(failed)} kernel(s) failed: " + ", ".join(names)
    if items and all(r.get("status") == "unsupported" for r in items):
        return "unsupported", "no requested kernel is supported here"
    if not items:
        return "unsupported", "nothing to probe"
    return "ok", None


def decode_ratios(results: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """int4 over bf16 and over fp16 at the same decode shape, from the median iteration (peak);
    None when missing.

    The median, not the delivered figure: a decode kernel runs whole inside another process's
    time slice, so contention removes batches' time between iterations but leaves the median
    iteration alone, while the heat that collapses 4-bit GEMMs slows every int4 iteration. On
    the H200 (docs/device/2026-12-01/part-b) beside a bf16 matmul loop, int4/bf16 from the
    median read 1.54-1.57 (idle 1.59-1.61), from delivered 1.05-2.55.
    """
    decode = {
        r["dtype"]: r
        for r in results
        if r.get("kind") == "decode" and r.get("status") == "ok" and r.get("peak")
    }
    out: dict[str, float | None] = {}
    for other in ("bf16", "fp16"):
        a, b = decode.get("int4"), decode.get(other)
        ok = a is not None and b is not None and a["shape"] == b["shape"]
        out[f"int4/{other}"] = a["peak"] / b["peak"] if ok and a and b else None
    return out


# --------------------------------------------------------------------------
# identity


def cublas_version() -> str | None:
    """Version of the libcublas this process loaded (Linux), e.g. '13.1.0'."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            paths = {
                line.split()[-1]
                for line in fh
                if "libcublas.so" in line and "libcublasLt" not in line
            }
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
            parts = []
            for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
                value = ctypes.c_int()
                if lib.cublasGetProperty(prop, ctypes.byref(value)) != 0:
                    break
                parts.append(str(value.value))
            if len(parts) == 3:
                return ".".join(parts)
        except (OSError, AttributeError):
            continue
    return None


def driver_version(nvml: Nvml | None) -> str | None:
    if nvml is not None:
        value = nvml.driver_version()
        if value:
            return value
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as fh:
            found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", fh.read())
        return found.group(1) if found else None
    except OSError:
        return None


def software_identity(
    torch: Any, info: DeviceInfo | None, device: str, nvml: Nvml | None
) -> dict[str, Any]:
    ident: dict[str, Any] = {
        "torch": None if torch is None else str(torch.__version__),
        "cuda": None if torch is None else torch.version.cuda,
        "cublas": None,
        "driver": driver_version(nvml),
        "python": platform.python_version(),
        "gpu_name": None,
        "compute_capability": None,
        "gpu_uuid": None,
        "device": device,
    }
    if nvml is not None:
        ident["gpu_name"] = nvml.name()
        ident["gpu_uuid"] = nvml.uuid()
    if info is not None and info.is_cuda:
        idx = torch.device(device).index or 0
        ident["gpu_name"] = torch.cuda.get_device_name(idx)
        if info.capability is not None:
            ident["compute_capability"] = f"{info.capability[0]}.{info.capability[1]}"
        props = torch.cuda.get_device_properties(idx)
        uuid = getattr(props, "uuid", None)
        if uuid is not None:
            text = str(uuid)
            ident["gpu_uuid"] = text if text.startswith("GPU-") else "GPU-" + text
        ident["cublas"] = cublas_version()
    return ident
