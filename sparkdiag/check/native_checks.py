"""The software's native code: ``native-code`` (every library with GPU code the probe worker's
Python can load, judged for each GPU by :mod:`sparkdiag.native.lint`: one row per package with
a library that does not run natively, with what to install instead; a library whose fat binary
is a stub is not judged, :func:`sparkdiag.native.lint.kernels_elsewhere`) and ``dtype-order``
(under load: a dtype the GPU runs natively on its tensor cores delivering less than a wider
one, :mod:`sparkdiag.native.dtypes`)."""

from __future__ import annotations

from collections import defaultdict

from sparkdiag.check.model import CheckContext, CheckResult, GpuProbe, no_gpu_skip, worst
from sparkdiag.check.probe_checks import per_probe
from sparkdiag.native.compat import parse_capability
from sparkdiag.native.dtypes import SLOWER, orders
from sparkdiag.native.lint import (
    Gpu,
    LibraryVerdict,
    judge_library,
    judged,
    not_judged,
    stub_json,
)

NAME = "native-code"


def lint_gpus(ctx: CheckContext) -> list[Gpu]:
    """The GPUs that are up and report a compute capability, for the lint."""
    out = []
    for sample in ctx.gpus_up():
        identity = sample.identity
        capability = parse_capability(identity.cuda_capability)
        if capability is not None:
            out.append(Gpu(str(identity.index), identity.uuid, identity.name, capability))
    return out


def check_native_code(ctx: CheckContext) -> list[CheckResult]:
    """Every library with GPU code runs natively (a cubin for the GPU loads)."""
    scan = ctx.libraries
    if scan is None:
        return [CheckResult(NAME, "skip", ctx.libraries_note or "the libraries were not read")]
    gpus = lint_gpus(ctx)
    if not gpus:
        if not ctx.snapshot.nvml_up or not ctx.snapshot.gpus:
            return [no_gpu_skip(NAME, ctx.snapshot)]
        return [CheckResult(NAME, "skip", "no GPU with a known compute capability")]
    if not scan.libraries:
        return [
            CheckResult(
                NAME,
                "skip",
                f"no library with GPU code in {scan.environment} ({scan.files} shared "
                f"libraries in {len(scan.site_dirs)} package directories)",
            )
        ]
    libraries, stubs = judged(scan.libraries), not_judged(scan.libraries)
    names = ", ".join(lib.name for lib in stubs)
    aside = f"; not judged, their kernels are not in their fat binaries: {names}" if stubs else ""
    if not libraries:
        return [
            CheckResult(
                NAME,
                "skip",
                f"no library in {scan.environment} whose kernels are in its fat binary{aside}",
                data={"not_judged": [stub_json(lib) for lib in stubs]},
            )
        ]
    by_package: dict[str, list[LibraryVerdict]] = defaultdict(list)
    verdicts = [judge_library(lib, gpu) for lib in libraries for gpu in gpus]
    for verdict in verdicts:
        if verdict.status != "pass":
            by_package[verdict.library.package].append(verdict)
    # a library or directory that could not be read was not judged: the row said all ran
    # natively and passed (found in a review)
    unread = f"; {len(scan.unreadable)} not readable (sparkdiag native names them)"
    unread_action = (
        "run sparkdiag native as the user who runs the jobs, or make those files readable"
    )
    if not by_package:
        sms = ", ".join(sorted({g.sm for g in gpus}))
        return [
            CheckResult(
                NAME,
                "warn" if scan.unreadable else "pass",
                f"all {len(libraries)} libraries with GPU code{' read' if scan.unreadable else ''}"
                f" in {scan.environment} run natively on {sms}"
                f"{unread if scan.unreadable else ''}{aside}",
                unread_action if scan.unreadable else "",
                data={
                    "libraries": [v.as_json() for v in verdicts],
                    "not_judged": [stub_json(lib) for lib in stubs],
                    "unreadable": dict(scan.unreadable),
                },
            )
        ]
    rows = []
    for _package, verdicts in sorted(by_package.items()):
        for gpu in gpus:
            mine = [v for v in verdicts if v.gpu == gpu]
            if not mine:
                continue
            more = f" (+{len(mine) - 1} more: sparkdiag native lists each)" if len(mine) > 1 else ""
            rows.append(
                CheckResult(
                    NAME,
                    worst(tuple(v.status for v in mine)),
                    f"on {gpu.sm}: {mine[0].finding}{more}",
                    mine[0].action,
                    gpu=gpu.index,
                    data={"libraries": [v.as_json() for v in mine]},
                )
            )
    if scan.unreadable:
        rows.append(
            CheckResult(
                NAME,
                "warn",
                f"not judged in {scan.environment}{unread}",
                unread_action,
                data={"unreadable": dict(scan.unreadable)},
            )
        )
    return rows


def _dtype_order(ctx: CheckContext, probe: GpuProbe) -> CheckResult:
    name = "dtype-order"
    index = str(probe.gpu.identity.index)
    capability = parse_capability(probe.gpu.identity.cuda_capability)
    if capability is None:
        return CheckResult(name, "skip", "compute capability unknown", gpu=index)
    delivered = [
        (f.dtype, f.shape, f.delivered)
        for f in probe.figures
        if f.kind == "compute" and f.beta == 0 and f.status == "ok" and f.delivered is not None
    ]
    found = orders(delivered, capability)
    if not found:
        return CheckResult(
            name,
            "skip",
            "no pair of dtypes to compare (fp8 and bf16, or nvfp4 and fp8, at a "
            "compute shape, on a GPU that runs the narrower one)",
            gpu=index,
        )
    data = {"orders": [o.as_json() for o in found]}
    slower = [o for o in found if o.slower]
    text = "; ".join(
        f"{o.dtype} {o.tflops:.0f} vs {o.wider} {o.wider_tflops:.0f} TFLOPS ({o.ratio:.2f}x)"
        for o in found
    )
    if not slower:
        return CheckResult(name, "pass", f"at {found[0].shape}: {text}", gpu=index, data=data)
    first = slower[0]
    return CheckResult(
        name,
        "warn",
        f"{first.dtype} delivers {first.ratio:.2f}x of {first.wider} at {first.shape} (below "
        f"{SLOWER:.1f}), though this GPU runs {first.dtype} natively: {text}",
        f"the {first.dtype} kernels are not the GPU's native ones: see the native-code rows "
        "and 'sparkdiag native' for libraries without code for this GPU (an NVFP4 GEMM needs "
        "a library built for the arch-specific target, sm_121a on GB10), and update torch "
        "and its cuBLAS",
        gpu=index,
        data=data,
    )


def check_dtype_order(ctx: CheckContext) -> list[CheckResult]:
    """A narrower dtype the GPU runs natively is not slower than a wider one (nvfp4 vs fp8,
    fp8 vs bf16) at a compute shape."""
    return per_probe("dtype-order", ctx, _dtype_order)
