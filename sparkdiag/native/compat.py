"""Which of a library's targets a GPU can load, by CUDA's binary compatibility rules.

The rules (NVIDIA, Blackwell Compatibility Guide, "Application Compatibility"; CUDA Programming
Guide, "Feature Availability": architecture-specific and family-specific feature sets; NVIDIA
technical blog "NVIDIA Blackwell and NVIDIA CUDA 12.9 Introduce Family-Specific Architecture
Features", 2025):

- a cubin for ``sm_XY`` runs on a GPU of compute capability X.Z with Z >= Y (same major, a
  later or equal minor): sm_80 runs on 8.6, sm_120 on 12.1, sm_80 never on 9.0;
- an architecture-specific cubin ``sm_XYa`` runs on X.Y only (sm_90a on H100/H200 and nothing
  else; sm_120a not on GB10, which is 12.1): it is where the arch-specific tensor-core
  instructions live (wgmma on sm_90a; tcgen05 on sm_100a; block-scaled FP4 MMA on
  sm_120a/sm_121a);
- a family cubin ``sm_XYf`` (CUDA 12.9+) runs on the family's later members: X.Z with Z >= Y
  (sm_100f on 10.0 and 10.3; sm_120f on 12.0 and 12.1);
- PTX for ``compute_XY`` is compiled by the driver for any GPU of capability >= X.Y, any major
  (slow the first time, cached after in ~/.nv/ComputeCache; the kernel is as good as what the
  old PTX can say: no instruction newer than X.Y); ``compute_XYa`` only for X.Y, and
  ``compute_XYf`` for the family's later members.

A GPU runs a library natively when one of its cubins loads; through PTX JIT when only PTX does;
otherwise not at all ("no kernel image is available for execution on the device").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from sparkdiag.sources.software.fatbin import FatbinReport, Target

Mode = Literal["native", "ptx-jit", "none"]
MODES: tuple[Mode, ...] = ("native", "ptx-jit", "none")
_VARIANT_RANK = {"": 0, "f": 1, "a": 2}


def parse_capability(text: str) -> tuple[int, int] | None:
    """``"12.1"`` -> (12, 1); None for "" or anything else (NVML did not say). The minor is
    one digit, as every compute capability's (sm_121 is 12.1): "12.10" read as sm_1210, and
    "².1" passed isdigit() and failed int() with a traceback (found in a review)."""
    match = _CAPABILITY.fullmatch(text.strip())
    if match is None:
        return None
    return int(match[1]), int(match[2])


_CAPABILITY = re.compile("([0-9]{1,3})[.]([0-9])")


def sm_name(capability: tuple[int, int]) -> str:
    """(12, 1) -> ``sm_121``."""
    return f"sm_{capability[0]}{capability[1]}"


def loads(target: Target, capability: tuple[int, int]) -> bool:
    """Whether a GPU of ``capability`` can load ``target`` (the module's rules)."""
    own = target.capability
    if target.variant == "a":
        return own == capability
    if target.ptx and not target.variant:
        return own <= capability
    return own[0] == capability[0] and own[1] <= capability[1]


def _rank(target: Target) -> tuple[int, int]:
    """Preference among targets that load: the nearest architecture, then a (arch-specific)
    over f (family) over plain."""
    return target.arch, _VARIANT_RANK[target.variant]


@dataclass(frozen=True)
class Verdict:
    """How one GPU runs one library.

    mode: native (a cubin loads), ptx-jit (only PTX does) or none
    target: the target it runs from (``sm_120``, ``compute_80``), "" when none
    exact: a cubin for this very architecture (any variant) is there
    specific: an arch-specific or family cubin loads here (the tensor-core paths of libraries
        that build them: wgmma, tcgen05, block-scaled FP4)
    specific_elsewhere: the library's arch-specific and family cubins that do not load here
        (they show it builds such paths, and none for this GPU)
    sass: every cubin target, newest first; ptx: every PTX target, newest first
    """

    mode: Mode
    target: str
    exact: bool
    specific: bool
    specific_elsewhere: tuple[str, ...]
    sass: tuple[str, ...]
    ptx: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "target": self.target,
            "exact": self.exact,
            "arch_specific_here": self.specific,
            "arch_specific_elsewhere": list(self.specific_elsewhere),
            "sass": list(self.sass),
            "ptx": list(self.ptx),
        }


def newest_first(targets: Iterable[Target]) -> tuple[str, ...]:
    return tuple(t.name for t in sorted(targets, key=_rank, reverse=True))


def judge(report: FatbinReport, capability: tuple[int, int]) -> Verdict:
    """The :class:`Verdict` for a GPU of ``capability`` running the library of ``report``."""
    targets = report.targets()
    sass = [t for t in targets if not t.ptx]
    ptx = [t for t in targets if t.ptx]
    running = [t for t in sass if loads(t, capability)]
    jit = [t for t in ptx if loads(t, capability)]
    if running:
        mode: Mode = "native"
        target = max(running, key=_rank).name
    elif jit:
        mode, target = "ptx-jit", max(jit, key=_rank).name
    else:
        mode, target = "none", ""
    specific = [t for t in sass if t.variant]
    return Verdict(
        mode=mode,
        target=target,
        exact=any(t.capability == capability for t in sass),
        specific=any(loads(t, capability) for t in specific),
        specific_elsewhere=newest_first(t for t in specific if not loads(t, capability)),
        sass=newest_first(sass),
        ptx=newest_first(ptx),
    )


def arch_list_entry(capability: tuple[int, int]) -> str:
    """What to put in ``TORCH_CUDA_ARCH_LIST`` for this GPU: ``12.1a`` (arch-specific, so the
    tensor-core paths that need it are built: CUDA 12.0+ for 9.0a, 13.0+ for 12.1a), ``8.6``
    below Hopper, which has no arch-specific targets."""
    major, minor = capability
    return f"{major}.{minor}a" if major >= 9 else f"{major}.{minor}"
