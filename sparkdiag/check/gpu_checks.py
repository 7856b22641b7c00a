"""Per-GPU deployment checks on one NVML poll: presence, idleness, and the GPU's modes
(persistence, compute mode, MIG); and :func:`per_gpu` and :func:`each_gpu`, which the other
per-GPU checks share.

Each function takes the :class:`CheckContext` and returns one result per GPU (or one skip when
there is no GPU); none of them touches the hardware.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from sparkdiag.check.model import CheckContext, CheckResult, no_gpu_reason, no_gpu_skip
from sparkdiag.check.model import gpu_index as _idx
from sparkdiag.snapshot import GpuSample
from sparkdiag.sources.nvml.xid import BUCKETS

GpuCheck = Callable[[CheckContext, GpuSample], CheckResult]


def per_gpu(name: str, ctx: CheckContext, check: GpuCheck) -> list[CheckResult]:
    """Run ``check`` on every GPU that is up; a lost GPU or no GPU at all is a skip."""
    if not ctx.snapshot.gpus:
        return [no_gpu_skip(name, ctx.snapshot)]
    results = []
    for gpu in ctx.snapshot.gpus:
        if not gpu.up:
            results.append(
                CheckResult(name, "skip", f"GPU lost ({gpu.error or 'no answer'})", gpu=_idx(gpu))
            )
        else:
            results.append(check(ctx, gpu))
    return results


def each_gpu(name: str, check: GpuCheck) -> Callable[[CheckContext], list[CheckResult]]:
    """The check named ``name`` that runs ``check`` on every GPU (:func:`per_gpu`), with
    ``check``'s docstring (what it wants)."""

    def run(ctx: CheckContext) -> list[CheckResult]:
        return per_gpu(name, ctx, check)

    run.__doc__ = check.__doc__
    run.__name__ = run.__qualname__ = f"check_{name.replace('-', '_')}"
    run.__module__ = check.__module__  # its kind in docs/check.md: thermal, health, stall ...
    return run


# -- presence ---------------------------------------------------------------------------------

# Drivers that hand a PCI device to a virtual machine: a GPU bound to one is a VM's, not missing
PASSTHROUGH = ("vfio-pci", "pci-stub")
NOUVEAU_ACTION = (
    "the open-source nouveau driver holds the GPU: blacklist it (echo 'blacklist nouveau' | sudo "
    "tee /etc/modprobe.d/blacklist-nouveau.conf; sudo update-initramfs -u), reboot, and check "
    "that nvidia-smi answers"
)


def _bound(ctx: CheckContext, addresses: list[str]) -> dict[str, str]:
    """The driver sysfs shows bound to each of ``addresses`` ("" for none, or where the device
    reports no link and so was not read)."""
    drivers = {pci_key(link.address): link.driver for link in ctx.snapshot.pcie_links}
    return {a: drivers.get(pci_key(a), "") for a in addresses}


def _passed_through(bound: dict[str, str]) -> list[str]:
    return [a for a, driver in bound.items() if driver in PASSTHROUGH]


# What nvmlInit's answer says when the NVML library itself is absent: the fixtures' and
# error_text's code name, pynvml's message for it, and the driver module's own message when
# ctypes cannot load libnvidia-ml
_NO_LIBRARY = ("LIBRARY_NOT_FOUND", "Shared Library Not Found", "libnvidia-ml could not be loaded")
LOAD_ACTION = (
    "load the NVIDIA driver: nvidia-smi says why it cannot; check lsmod | grep nvidia and "
    "sudo dmesg | grep NVRM (a driver/library version mismatch needs a reboot)"
)
# No modprobe brings a missing library: it comes with the driver's package, or, in a
# container, from the runtime that mounts the host's driver in (found in a review: this case
# said "load the NVIDIA driver")
INSTALL_ACTION = (
    "install the NVIDIA driver: NVML's library (libnvidia-ml.so.1) is not found; install the "
    "driver (where its kernel module is loaded, the version cat /proc/driver/nvidia/version "
    "gives) until nvidia-smi answers; in a container, run it with the GPU (--gpus all, with "
    "the NVIDIA Container Toolkit), which mounts the library in"
)


def check_nvml(ctx: CheckContext) -> list[CheckResult]:
    """NVML loads and the driver answers; without it, fail only where a GPU is expected."""
    snap = ctx.snapshot
    if snap.nvml_up:
        return [
            CheckResult(
                "nvml",
                "pass",
                f"NVML up, driver {snap.driver_version}",
                data={"driver": snap.driver_version},
            )
        ]
    why = no_gpu_reason(snap).removeprefix("no GPU: ")
    bound = [link.address for link in snap.pcie_links if link.driver == "nvidia"]
    action = INSTALL_ACTION if any(words in why for words in _NO_LIBRARY) else LOAD_ACTION
    if bound:
        return [
            CheckResult(
                "nvml",
                "fail",
                f"{why}, yet the nvidia driver is bound to {bound[0]}",
                action,
                data={"bound": bound},
            )
        ]
    bound_to = _bound(ctx, list(snap.gpu_pci_devices or ()))
    on_bus = [a for a, driver in bound_to.items() if driver not in PASSTHROUGH]
    if on_bus:  # a GPU whose driver is not loaded is bound to nothing; or nouveau holds it
        n = len(on_bus)
        held = [a for a in on_bus if bound_to[a]]
        return [
            CheckResult(
                "nvml",
                "fail",
                f"{why}, yet {n} NVIDIA GPU{'s are' if n != 1 else ' is'} on the PCI bus "
                f"({on_bus[0]}" + (f", bound to {bound_to[held[0]]}" if held else "") + ")",
                NOUVEAU_ACTION if any(bound_to[a] == "nouveau" for a in on_bus) else action,
                data={"on_bus": on_bus, "drivers": {a: bound_to[a] for a in held}},
            )
        ]
    if ctx.expect_gpus:
        return [CheckResult("nvml", "fail", f"{why}, yet --expect-gpus {ctx.expect_gpus}", action)]
    passed = _passed_through(bound_to)
    if passed:
        n = len(passed)
        return [
            CheckResult(
                "nvml",
                "skip",
                f"{why}: the {n} NVIDIA GPU{'s' if n != 1 else ''} on the PCI bus "
                f"{'are' if n != 1 else 'is'} bound to {bound_to[passed[0]]} ({passed[0]}), "
                "passed through to a virtual machine",
                "none on this host: run sparkdiag inside the virtual machine that owns the GPU",
                data={"passed_through": passed},
            )
        ]
    return [
        CheckResult(
            "nvml",
            "skip",
            f"{why}: no NVIDIA driver here",
            "none without an NVIDIA GPU; on a GPU machine, install the NVIDIA driver "
            "until nvidia-smi answers",
        )
    ]


def check_gpus(ctx: CheckContext) -> list[CheckResult]:
    """Every GPU answers, and as many as expected (``--expect-gpus``)."""
    snap = ctx.snapshot
    up = ctx.gpus_up()
    lost = [g for g in snap.gpus if not g.up]
    expected = ctx.expect_gpus
    data = {"visible": len(up), "lost": [g.identity.index for g in lost], "expected": expected}
    names = Counter(g.identity.name for g in up)
    listing = ", ".join(f"{n}× {name}" if n > 1 else name for name, n in names.items())
    seen = f"{len(up)} GPU{'s' if len(up) != 1 else ''} visible" + (f": {listing}" if up else "")
    if lost:
        first = lost[0]
        return [
            CheckResult(
                "gpus",
                "fail",
                f"GPU {first.identity.index} ({first.identity.pci_bus_id}) lost: "
                f"{first.error or 'no answer'}; {seen}",
                _lost_action(first),
                data=data,
            )
        ]
    if expected is not None and len(up) < expected:
        return [
            CheckResult(
                "gpus",
                "fail",
                f"{seen}, {expected} expected",
                "a GPU is missing: check lspci | grep -i nvidia, sudo dmesg | grep NVRM, "
                "and CUDA_VISIBLE_DEVICES / the container's --gpus",
                data=data,
            )
        ]
    if expected is not None and len(up) > expected:
        return [
            CheckResult(
                "gpus",
                "warn",
                f"{seen}, only {expected} expected",
                "check --expect-gpus, or which GPUs this job should see",
                data=data,
            )
        ]
    if not up and expected == 0:
        return [CheckResult("gpus", "pass", f"{seen} (as expected)", data=data)]
    if not up:
        if expected:
            return [CheckResult("gpus", "fail", f"{seen}, {expected} expected", data=data)]
        return [no_gpu_skip("gpus", snap, **data)]
    suffix = " (as expected)" if expected is not None else ""
    return [CheckResult("gpus", "pass", seen + suffix, data=data)]


def _lost_action(gpu: GpuSample) -> str:
    """What to do about a GPU NVML lost, in the words of the XID catalog (the xid row gives
    the same advice for the XID the kernel logged): gone from the bus (GPU_IS_LOST,
    GPU_NOT_FOUND), XID 79's power cycle; a reset asked for (RESET_REQUIRED), a reset."""
    error = gpu.error or ""
    if "RESET_REQUIRED" in error:
        return "the driver asks for a reset: " + BUCKETS["reset_gpu"].action.format(
            gpu=gpu.identity.index
        )
    if "GPU_IS_LOST" in error or "GPU_NOT_FOUND" in error:
        return "as for XID 79 (fallen off the bus): " + BUCKETS["restart_bm"].action
    return (
        f"NVML no longer answers for it: the xid row names what the kernel logged (sudo dmesg "
        f"| grep NVRM); without an XID, reset it (sudo nvidia-smi -r -i {gpu.identity.index}) "
        "or reboot"
    )


def pci_key(address: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of a PCI address as NVML (``00000000:18:00.0``, GB10
    ``0000000F:01:00.0``) or sysfs (``0000:18:00.0``) writes it; None when it is neither."""
    parts = address.strip().replace(".", ":").split(":")
    if len(parts) != 4:
        return None
    try:
        domain, bus, device, function = (int(p, 16) for p in parts)
    except ValueError:
        return None
    return domain, bus, device, function


def check_gpus_on_bus(ctx: CheckContext) -> list[CheckResult]:
    """Every NVIDIA GPU function on the PCI bus (sysfs) is a GPU NVML lists: a GPU the driver
    did not bring up, or lost, fails by its PCI address, with no configuration."""
    snap = ctx.snapshot
    on_bus = snap.gpu_pci_devices
    if on_bus is None:
        return [
            CheckResult(
                "gpus-on-bus",
                "skip",
                "the NVIDIA GPU functions on the PCI bus were not read (no sysfs, or a "
                "container without /proc/driver/nvidia/gpus)",
            )
        ]
    listed = {pci_key(g.identity.pci_bus_id) for g in snap.gpus}
    bound_to = _bound(ctx, [a for a in on_bus if pci_key(a) not in listed])
    passed = _passed_through(bound_to)
    missing = [a for a in on_bus if pci_key(a) not in listed and a not in passed]
    data = {
        "pci": list(on_bus),
        "nvml": [g.identity.pci_bus_id for g in snap.gpus],
        "missing": missing,
        "passed_through": passed,
    }
    n = len(on_bus)
    counted = f"{n} NVIDIA GPU function{'s' if n != 1 else ''} on the PCI bus" + (
        f" ({len(passed)} bound to {bound_to[passed[0]]}, passed through to virtual machines)"
        if passed
        else ""
    )
    if not on_bus:
        return [CheckResult("gpus-on-bus", "skip", "no NVIDIA GPU on the PCI bus", data=data)]
    if missing and not snap.nvml_up:
        # NVML did not start, so it lists no GPU: every GPU on the bus would be "missing" and
        # the hardware blamed for what the nvml row reports (found in a review)
        return [
            CheckResult(
                "gpus-on-bus",
                "skip",
                f"{counted}; not compared: NVML did not start, so it lists none (see nvml)",
                data=data,
            )
        ]
    if missing:
        shown = ", ".join(missing[:4]) + (
            f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        )
        return [
            CheckResult(
                "gpus-on-bus",
                "fail",
                f"{counted}, {len(missing)} not listed by NVML: {shown}",
                f"the driver did not bring it up, or lost it: read sudo dmesg | grep -iE "
                f"'NVRM|Xid' for {missing[0]} and lspci -vv -s {missing[0]}; reboot (or reset "
                "it once NVML lists it); if it stays missing, reseat the GPU and check its power "
                "cables, and have it serviced if it persists",
                data=data,
            )
        ]
    rest = "every other one" if passed else "every one"
    return [CheckResult("gpus-on-bus", "pass", f"{counted}, {rest} listed by NVML", data=data)]


# -- idle ------------------------------------------------------------------------------------


def _idle(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """No other compute process on the GPU, utilization low."""
    evidence = ctx.busy(gpu)
    others = list(evidence.other_pids) if evidence else []
    util = gpu.utilization_ratio.get("gpu")
    data = {"other_pids": others, "utilization": util}
    util_text = "" if util is None else f", utilization {util:.0%}"
    if evidence is not None and others:
        first = ctx.describe_pid(others[0])
        # "kill PID" only for a real pid: kill 0 signals the caller's process group, kill -1
        # every process the user may signal
        how = f"kill {others[0]}, or " if others[0] > 0 else ""
        return CheckResult(
            "idle",
            "fail",
            f"{evidence.describe(ctx.describe_pid)} computing on the GPU{util_text}",
            f"stop {first}: {how}wait for it to finish; a benchmark on a shared GPU measures "
            "the sharing",
            _idx(gpu),
            data,
        )
    if evidence is not None:
        return CheckResult(
            "idle",
            "warn",
            f"{evidence.describe()} with no compute process visible here",
            "another container, VM or a graphics client uses the GPU: check nvidia-smi on the host",
            _idx(gpu),
            data,
        )
    if gpu.compute_pids is None and util is None:
        return CheckResult(
            "idle",
            "skip",
            "neither the process list nor utilization is reported",
            gpu=_idx(gpu),
        )
    return CheckResult(
        "idle", "pass", f"no other compute process{util_text}", gpu=_idx(gpu), data=data
    )


check_idle = each_gpu("idle", _idle)


# -- modes ------------------------------------------------------------------------------------


def _persistence(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """Persistence mode on."""
    mode = gpu.persistence_mode
    if mode is None:
        return CheckResult("persistence", "skip", "persistence mode not reported", gpu=_idx(gpu))
    if not mode:
        return CheckResult(
            "persistence",
            "warn",
            "persistence mode off: the driver tears down and re-initialises the GPU between "
            "jobs (slow first launch, clocks reset)",
            f"sudo nvidia-smi -i {gpu.identity.index} -pm 1 (or enable nvidia-persistenced)",
            _idx(gpu),
            {"enabled": False},
        )
    return CheckResult(
        "persistence", "pass", "persistence mode on", gpu=_idx(gpu), data={"enabled": True}
    )


check_persistence = each_gpu("persistence", _persistence)


def _compute_mode(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """Compute mode allows compute (prohibited fails)."""
    mode = gpu.compute_mode
    if mode is None:
        return CheckResult("compute-mode", "skip", "compute mode not reported", gpu=_idx(gpu))
    if mode == "prohibited":
        return CheckResult(
            "compute-mode",
            "fail",
            "compute mode prohibited: no process can use the GPU",
            f"sudo nvidia-smi -i {gpu.identity.index} -c DEFAULT",
            _idx(gpu),
            {"mode": mode},
        )
    note = " (one process at a time)" if mode.startswith("exclusive") else ""
    return CheckResult(
        "compute-mode", "pass", f"compute mode {mode}{note}", gpu=_idx(gpu), data={"mode": mode}
    )


check_compute_mode = each_gpu("compute-mode", _compute_mode)


def _mig(ctx: CheckContext, gpu: GpuSample) -> CheckResult:
    """MIG off (on warns: a benchmark would measure one slice)."""
    mode = gpu.mig_mode
    if mode is None:
        return CheckResult("mig", "skip", "MIG not supported", gpu=_idx(gpu))
    if mode:
        return CheckResult(
            "mig",
            "warn",
            "MIG on: CUDA sees GPU instances (slices), not the whole GPU",
            f"to benchmark the whole GPU: sudo nvidia-smi -i {gpu.identity.index} -mig 0 "
            "(then reset the GPU)",
            _idx(gpu),
            {"enabled": True},
        )
    return CheckResult("mig", "pass", "MIG off", gpu=_idx(gpu), data={"enabled": False})


check_mig = each_gpu("mig", _mig)
