"""Driver, CUDA and torch: does the driver support the CUDA that torch was built for?

The NVIDIA driver supports every CUDA up to the one it shipped with ("CUDA Version" in
``nvidia-smi``), and, through minor version compatibility, newer minor releases of that CUDA
major with a limited feature set (no PTX JIT for newer code). A torch built for a newer CUDA
major than the driver's cannot use the GPU at all.

Sources: NVIDIA CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions"
(Linux x86_64 minimum driver of each toolkit's GA release), and the CUDA Compatibility guide,
"Minor Version Compatibility" (CUDA 13.x needs a driver >= 580, 12.x >= 525, 11.x >= 450.80.02).

A driver from a branch newer than the table's last row is not judged against the table: the
CUDA it shipped with is not known here, and guessing would warn about a healthy machine.
"""

from __future__ import annotations

import re

from sparkdiag.check.model import CheckContext, CheckResult, no_gpu_skip
from sparkdiag.probe.document import Software
from sparkdiag.probe.runner import torch_install_hint

# (minimum Linux driver, CUDA toolkit it shipped with), ascending. The minimum is the GA
# release's driver (11.0 GA: 450.51.05; 450.80.02 is the floor for minor version compatibility,
# kept in MAJOR_MINIMUM below, not the driver 11.0 shipped with).
TOOLKIT_DRIVERS: tuple[tuple[tuple[int, ...], tuple[int, int]], ...] = (
    ((450, 51, 5), (11, 0)),
    ((455, 23), (11, 1)),
    ((460, 27, 3), (11, 2)),
    ((465, 19, 1), (11, 3)),
    ((470, 42, 1), (11, 4)),
    ((495, 29, 5), (11, 5)),
    ((510, 39, 1), (11, 6)),
    ((515, 43, 4), (11, 7)),
    ((520, 61, 5), (11, 8)),
    ((525, 60, 13), (12, 0)),
    ((530, 30, 2), (12, 1)),
    ((535, 54, 3), (12, 2)),
    ((545, 23, 6), (12, 3)),
    ((550, 54, 14), (12, 4)),
    ((555, 42, 2), (12, 5)),
    ((560, 28, 3), (12, 6)),
    ((570, 26), (12, 8)),
    ((575, 51, 3), (12, 9)),
    ((580, 65, 6), (13, 0)),
    ((590, 44, 1), (13, 1)),
    ((595, 45, 4), (13, 2)),
    # 13.3: from secondary sources (distribution package lists and driver release announcements
    # naming 610.43.02 with CUDA 13.3), not yet checked against NVIDIA's own table.
    ((610, 43, 2), (13, 3)),
)
# Minimum driver for minor version compatibility within a CUDA major.
MAJOR_MINIMUM: dict[int, tuple[int, ...]] = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580,)}

NAME = "versions"


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """Leading dotted number: ``580.159.04`` -> (580, 159, 4), ``13.0`` -> (13, 0); else None."""
    if not text:
        return None
    match = re.match(r"^\s*(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def beyond_table(driver: tuple[int, ...]) -> bool:
    """True for a driver from a branch newer than the table's last row (``620.x`` when the last
    row is 610.43.02): the CUDA it shipped with is not known here."""
    return bool(driver) and driver[0] > TOOLKIT_DRIVERS[-1][0][0]


def driver_cuda(driver: tuple[int, ...]) -> tuple[int, int] | None:
    """The newest CUDA the driver shipped with (``nvidia-smi``'s "CUDA Version"), as known here."""
    found = None
    for minimum, cuda in TOOLKIT_DRIVERS:
        if driver >= minimum:
            found = cuda
    return found


def _show(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def check_versions(ctx: CheckContext) -> list[CheckResult]:
    """Driver present, and the driver supports torch's CUDA (software block of the probe, or
    the installed torch read without importing it)."""
    snap = ctx.snapshot
    documents = [p.document for p in ctx.probes.values() if p.document is not None]
    software = next((d.software for d in documents if d.software.torch), Software())
    driver_text = snap.driver_version or software.driver or ""
    torch_version = software.torch or (ctx.torch.version if ctx.torch else None)
    if software.torch:
        torch_cuda = software.cuda or None
        origin = "probe worker"
    else:
        torch_cuda = ctx.torch.cuda if ctx.torch else None
        origin = "installed package"
    data: dict[str, object] = {
        "driver": driver_text or None,
        "torch": torch_version,
        "torch_cuda": torch_cuda,
    }
    driver = parse_version(driver_text)
    if driver is None and not ctx.snapshot.nvml_up:
        return [no_gpu_skip(NAME, ctx.snapshot, **data)]
    if driver is None:
        return [CheckResult(NAME, "skip", "driver version unknown: NVML gave none", data=data)]
    supported = driver_cuda(driver)
    data["driver_cuda"] = None if supported is None else _show(supported)
    newer = beyond_table(driver)
    data["beyond_table"] = newer
    if newer:
        driver_part = (
            f"driver {driver_text} (a branch newer than sparkdiag's table, which ends at "
            f"CUDA {_show(TOOLKIT_DRIVERS[-1][1])})"
        )
    else:
        driver_part = f"driver {driver_text}" + (
            f" (CUDA ≤ {_show(supported)})" if supported else " (older than CUDA 11)"
        )
    if not torch_version:
        python = ctx.torch.python if ctx.torch else "this Python"
        return [
            CheckResult(
                NAME,
                "skip",
                f"{driver_part}; torch not installed for {python}: nothing to compare",
                torch_install_hint(ctx.torch.python) if ctx.torch else torch_install_hint(),
                data=data,
            )
        ]
    if torch_cuda is None:
        if not ctx.gpus_up():
            return [
                CheckResult(
                    NAME, "pass", f"{driver_part}; torch {torch_version} (CPU build)", data=data
                )
            ]
        return [
            CheckResult(
                NAME,
                "fail",
                f"{driver_part}; torch {torch_version} is a CPU-only build: it cannot use the GPU",
                f"install a CUDA build of torch{_for_cuda(supported)} "
                "(the selector on https://pytorch.org/get-started/locally/ gives the command)",
                data=data,
            )
        ]
    wanted = parse_version(torch_cuda)
    torch_part = f"torch {torch_version} built for CUDA {torch_cuda} ({origin})"
    if wanted is None or len(wanted) < 2:
        return [
            CheckResult(
                NAME, "skip", f"{driver_part}; {torch_part}: CUDA version unreadable", data=data
            )
        ]
    major_min = MAJOR_MINIMUM.get(wanted[0])
    if supported is not None and wanted[:2] <= supported:
        return [CheckResult(NAME, "pass", f"{driver_part} supports {torch_part}", data=data)]
    if newer:
        # Not known here, so not judged: a warning would be a guess about a newer driver.
        return [
            CheckResult(NAME, "pass", f"{driver_part} is taken to support {torch_part}", data=data)
        ]
    if major_min is not None and driver < major_min:
        return [
            CheckResult(
                NAME,
                "fail",
                f"{driver_part} is too old for {torch_part} (CUDA {wanted[0]}.x needs driver "
                f"≥ {_show(major_min)})",
                f"upgrade the NVIDIA driver to ≥ {_show(major_min)}, or install a CUDA build "
                f"of torch{_for_cuda(supported)} (https://pytorch.org/get-started/locally/)",
                data=data,
            )
        ]
    if major_min is None:
        # A CUDA major this table does not know: newer than any driver listed here.
        return [
            CheckResult(
                NAME,
                "warn",
                f"{driver_part}; {torch_part}: sparkdiag does not know which driver CUDA "
                f"{wanted[0]}.x needs",
                "check the driver requirement in the CUDA release notes (Table 3)",
                data=data,
            )
        ]
    return [
        CheckResult(
            NAME,
            "warn",
            f"{driver_part} is older than {torch_part}: runs through minor version "
            "compatibility (no PTX JIT, some features missing)",
            f"upgrade the driver to the branch of CUDA {_show(wanted[:2])}, or install a CUDA "
            f"build of torch{_for_cuda(supported)}",
            data=data,
        )
    ]


def _for_cuda(cuda: tuple[int, int] | None) -> str:
    """The CUDA versions the driver runs, said of a torch build: the bound is CUDA's, not
    torch's ("torch ≤ 13.0" read as a torch version)."""
    return " for an older CUDA" if cuda is None else f" for CUDA {_show(cuda)} or older"
