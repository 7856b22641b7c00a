"""The architecture lint: each library with GPU code judged for each GPU, with what to do.

A pure function of a :class:`~sparkdiag.sources.software.cuda_libraries.LibraryScan` and the GPUs'
compute capabilities (:class:`Gpu`), so that every verdict is driven by the fixtures of
``tests/fixtures/fatbin/`` without a GPU. The statuses:

``fail``  no code that this GPU loads (:func:`sparkdiag.native.compat.judge` mode ``none``):
          the library's kernels cannot start here ("no kernel image is available");
``warn``  only PTX loads (``ptx-jit``): the driver compiles it at the first start, and the
          kernels use nothing newer than the PTX's architecture. vLLM's Marlin MoE library
          carried only compute_80 PTX for SM 12.x, and its JIT-compiled kernels gave wrong
          output on GB10 until native sm_120/sm_121 cubins were built (vllm-project/vllm
          PR #40923);
``warn``  SASS loads, but not for this very architecture, and the library's arch-specific or
          family builds (``sm_90a``, ``sm_100a``, ``sm_120a``) all belong to other GPUs: the
          tensor-core paths it builds only that way are missing here. vLLM's published aarch64
          MoE library (SASS up to sm_120 plus sm_90a, PTX sm_80) left GB10's NVFP4 MoE on the
          Marlin fallback (vllm-project/vllm#50925); block-scaled FP4 needs sm_121a
          (mit-han-lab/fouroversix#33);
``pass``  otherwise: a cubin for this architecture, or an earlier minor of the same major
          (sm_120 on a 12.1 GPU) where the library builds nothing arch-specific.

A library whose fat binary is a stub is not judged at all (:func:`kernels_elsewhere`): its
kernels reach the GPU another way, so its fat binary says nothing about whether they run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sparkdiag.native.advice import advice
from sparkdiag.native.compat import Verdict, judge, newest_first, sm_name
from sparkdiag.sources.files import MIB
from sparkdiag.sources.software.cuda_libraries import CudaLibrary, LibraryScan
from sparkdiag.sources.software.fatbin import SMALL_FATBIN, FatbinReport, Target

Status = Literal["pass", "warn", "fail"]
SHOWN = 4  # targets named in a one-line finding before "..."

# A stub: a fat binary of at most STUB_BYTES that is under STUB_SHARE of its library. On the
# lent H200 (docs/device/2026-12-03/call-b/native/scan.json) nvidia-cufft 12.0.0.61's
# libcufft.so.12 carries one sm_75 cubin in 672 bytes of .nv_fatbin, 0.0002 % of its
# 286,542,352 bytes, and libcufftw.so.12 one in 1,984 bytes, 0.2 % of 991,704: judged by them,
# cuFFT could not run on any GPU but 7.x. Its FFT kernels are elsewhere: 23,983 fat binary
# containers (266 MB) in the library's .ldata section, 393 of their cubins sm_90 and 420
# sm_120 (read from the same wheel on the development machine), which neither
# `cuobjdump --list-elf` nor this walk of .nv_fatbin sees; libcufftw calls libcufft. The 29
# other libraries with GPU code there carry 14,992 bytes of fat binary or more (jax's
# _prng.so: six cubins and a PTX), and nvcc 13.0 writes 0.5 to 5.4 KB for one trivial kernel
# and one target (tests/fixtures/fatbin/): 4 KiB holds a kernel or two for a target or two,
# not a library's GPU code. The share keeps judged a small library that is mostly its fat
# binary (the fixtures: 8 to 72 %); the smallest share of a library with real kernels on the
# H200 is 1.5 % (libcufile.so.0, 47,320 bytes).
STUB_BYTES = SMALL_FATBIN
STUB_SHARE = 0.01
NOT_JUDGED = "not judged: its kernels are not in its fat binary"


@dataclass(frozen=True)
class Gpu:
    """A GPU the lint judges for: NVML index and uuid ("" for --capability without a GPU)."""

    index: str
    uuid: str
    name: str
    capability: tuple[int, int]

    @property
    def sm(self) -> str:
        return sm_name(self.capability)


@dataclass(frozen=True)
class LibraryVerdict:
    """One library on one GPU: the verdict, its status, why (``reason``; ``finding`` names
    the library first), what to do."""

    library: CudaLibrary
    gpu: Gpu
    verdict: Verdict
    status: Status
    reason: str
    action: str

    @property
    def finding(self) -> str:
        lib = self.library
        owner = " ".join(p for p in (lib.package, lib.version) if p) or "no package"
        return f"{lib.name} ({owner}): {self.reason}"

    def as_json(self) -> dict[str, Any]:
        return {
            "library": self.library.path,
            "package": self.library.package,
            "version": self.library.version,
            "gpu": self.gpu.index,
            "status": self.status,
            "finding": self.finding,
            "action": self.action,
            **self.verdict.as_json(),
        }


def _names(targets: Sequence[str]) -> str:
    if not targets:
        return "none"
    shown = ", ".join(targets[:SHOWN])
    return shown + (f" (+{len(targets) - SHOWN})" if len(targets) > SHOWN else "")


def judge_library(library: CudaLibrary, gpu: Gpu) -> LibraryVerdict:
    """The status and line for ``library`` on ``gpu`` (the module's rules)."""
    verdict = judge(library.report, gpu.capability)
    carries = f"SASS {_names(verdict.sass)}; PTX {_names(verdict.ptx)}"
    todo = advice(library.package, gpu.capability)
    if verdict.mode == "none":
        return LibraryVerdict(
            library,
            gpu,
            verdict,
            "fail",
            f"nothing {gpu.sm} loads ({carries}): its kernels fail with 'no kernel "
            "image is available for execution on the device'",
            todo,
        )
    if verdict.mode == "ptx-jit":
        return LibraryVerdict(
            library,
            gpu,
            verdict,
            "warn",
            f"no SASS {gpu.sm} loads, only PTX {verdict.target}, which the driver "
            f"compiles at the first start ({carries}); the kernels use nothing newer than "
            f"{verdict.target}",
            todo,
        )
    # arch-specific builds for other GPUs and none here: the kernels built only that way (the
    # tensor-core paths) fall back. Beside a plain cubin of this very GPU, only where one of
    # them is of its major: TORCH_CUDA_ARCH_LIST="12.0a;12.1" passed on GB10 without sm_121a
    # (found in a review), while CuPy's cub with sm_100f and sm_120f beside a plain sm_90 is
    # as CuPy builds it for Hopper, not a fallback (the H200's scan)
    same_major = [
        t for t in verdict.specific_elsewhere if Target.parse(t).capability[0] == gpu.capability[0]
    ]
    if verdict.specific_elsewhere and not verdict.specific and (not verdict.exact or same_major):
        runs = (
            f"runs {verdict.target} SASS"
            if verdict.exact
            else f"runs {verdict.target} SASS, none for {gpu.sm} itself"
        )
        return LibraryVerdict(
            library,
            gpu,
            verdict,
            "warn",
            f"{runs}; its arch-specific builds ({_names(verdict.specific_elsewhere)}) are for "
            f"other GPUs and none ({gpu.sm}a or a family target) loads here, so the "
            "tensor-core paths built only that way fall back",
            todo,
        )
    how = "" if verdict.exact else " (an earlier minor of the same major runs here)"
    return LibraryVerdict(library, gpu, verdict, "pass", f"native, {verdict.target}{how}", "")


def kernels_elsewhere(library: CudaLibrary) -> bool:
    """Whether ``library``'s fat binary is a stub (see ``STUB_BYTES``): its kernels are not in
    it, and it is not judged by it. Where the scan looked in the library's other sections
    (``report.elsewhere``), a fat binary must be found there, or its cubins must hold no kernel
    (``report.kernels`` 0: libcufftw.so.12, whose FFTs are libcufft's): a one-kernel extension
    built for the wrong GPU (3.7 KB of fat binary in 0.6 MB) read as a stub and passed
    unjudged (found in a review). A header trace was not searched: size and share alone
    decide."""
    fat = library.report.fatbin_bytes
    small = fat <= STUB_BYTES and fat < STUB_SHARE * library.size_bytes
    if library.report.kernels == 0:  # its cubins hold no kernel: libcufftw calls libcufft's
        return small
    return small and library.report.elsewhere is not False


def judged(libraries: Iterable[CudaLibrary]) -> list[CudaLibrary]:
    """The libraries whose fat binary holds their kernels: those the lint judges."""
    return [lib for lib in libraries if not kernels_elsewhere(lib)]


def not_judged(libraries: Iterable[CudaLibrary]) -> list[CudaLibrary]:
    """The libraries whose fat binary is a stub, in the scan's order."""
    return [lib for lib in libraries if kernels_elsewhere(lib)]


def stub_detail(library: CudaLibrary) -> str:
    """``672 B of fat binary (SASS sm_75) in a 273.3 MiB library``."""
    return (
        f"{library.report.fatbin_bytes} B of fat binary ({carries(library, _names)}) in a "
        f"{library.size_bytes / MIB:.1f} MiB library"
    )


def carries(library: CudaLibrary, names: Callable[[Sequence[str]], str] = ", ".join) -> str:
    """``SASS sm_90a, sm_90, sm_80; PTX compute_90``: every target, newest first (``names``
    lays out each kind's list: all of it by default)."""
    sass, ptx = _targets(library.report)
    return "; ".join(
        f"{kind} {names(targets)}" for kind, targets in (("SASS", sass), ("PTX", ptx)) if targets
    )


def _targets(report: FatbinReport) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(SASS, PTX) target names, newest first."""
    targets = report.targets()
    return newest_first(t for t in targets if not t.ptx), newest_first(t for t in targets if t.ptx)


def stub_json(library: CudaLibrary) -> dict[str, Any]:
    """A library that is not judged, as ``sparkdiag native --json`` lists it."""
    sass, ptx = _targets(library.report)
    return {
        "library": library.path,
        "relative": library.relative,
        "package": library.package,
        "version": library.version,
        "reason": NOT_JUDGED,
        "fatbin_bytes": library.report.fatbin_bytes,
        "size_bytes": library.size_bytes,
        "sass": list(sass),
        "ptx": list(ptx),
    }


def lint(scan: LibraryScan, gpus: Iterable[Gpu]) -> list[LibraryVerdict]:
    """Every library of ``scan`` it judges (not those of :func:`not_judged`) judged for every
    GPU, GPU by GPU in the scan's order."""
    libraries = judged(scan.libraries)
    return [judge_library(lib, gpu) for gpu in gpus for lib in libraries]


def arch_list_report(arch_list: Sequence[str]) -> FatbinReport:
    """torch's ``get_arch_list()`` (``["sm_80", "sm_90a", "compute_90"]``) as a report, so the
    same rules judge it; entries that are not CUDA targets are left out."""
    sass: dict[str, int] = {}
    ptx: dict[str, int] = {}
    for name in arch_list:
        try:
            target = Target.parse(name)
        except ValueError:
            continue
        (ptx if target.ptx else sass)[target.name] = 1
    return FatbinReport(sass=sass, ptx=ptx)
