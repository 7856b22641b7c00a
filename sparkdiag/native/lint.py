"""The architecture lint: each library with GPU code judged for each GPU, with what to do.

A pure function of a :class:`~sparkdiag.sources.cuda_libraries.LibraryScan` and the GPUs'
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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sparkdiag.native.advice import advice
from sparkdiag.native.compat import Verdict, judge, sm_name
from sparkdiag.sources.cuda_libraries import CudaLibrary, LibraryScan
from sparkdiag.sources.fatbin import FatbinReport, Target

Status = Literal["pass", "warn", "fail"]
SHOWN = 4  # targets named in a one-line finding before "..."


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
            library, gpu, verdict, "fail",
            f"nothing {gpu.sm} loads ({carries}): its kernels fail with 'no kernel "
            "image is available for execution on the device'",
            todo,
        )  # fmt: skip
    if verdict.mode == "ptx-jit":
        return LibraryVerdict(
            library, gpu, verdict, "warn",
            f"no SASS {gpu.sm} loads, only PTX {verdict.target}, which the driver "
            f"compiles at the first start ({carries}); the kernels use nothing newer than "
            f"{verdict.target}",
            todo,
        )  # fmt: skip
    if not verdict.exact and verdict.specific_elsewhere and not verdict.specific:
        return LibraryVerdict(
            library, gpu, verdict, "warn",
            f"runs {verdict.target} SASS, none for {gpu.sm} itself; its "
            f"arch-specific builds ({_names(verdict.specific_elsewhere)}) are for other GPUs "
            f"and none ({gpu.sm}a or a family target) loads here, so the tensor-core paths "
            "built only that way fall back",
            todo,
        )  # fmt: skip
    how = "" if verdict.exact else " (an earlier minor of the same major runs here)"
    return LibraryVerdict(library, gpu, verdict, "pass", f"native, {verdict.target}{how}", "")


def lint(scan: LibraryScan, gpus: Iterable[Gpu]) -> list[LibraryVerdict]:
    """Every library of ``scan`` judged for every GPU, GPU by GPU in the scan's order."""
    return [judge_library(lib, gpu) for gpu in gpus for lib in scan.libraries]


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
