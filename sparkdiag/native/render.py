"""``sparkdiag native`` as text (within the terminal's width) and as JSON."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkdiag import terminal
from sparkdiag.native.compat import Mode, judge
from sparkdiag.native.lint import (
    NOT_JUDGED,
    Gpu,
    LibraryVerdict,
    arch_list_report,
    carries,
    judged,
    not_judged,
    stub_detail,
    stub_json,
)
from sparkdiag.sources.software.cuda_libraries import CudaLibrary, LibraryScan, scan_json
from sparkdiag.sources.software.pyenv import TorchBuild

FORMAT = "sparkdiag-native/1"
# No GPU to judge for (no --capability, and none here with a known compute capability): a build
# machine, a CI runner or a newcomer's laptop. The libraries are listed with their targets; the
# status says nothing was judged, and the line says how to judge.
NO_GPU = (
    "not judged: no GPU here with a known compute capability, and no --capability. To judge "
    "for the GPU the software is for: --capability 9.0 (H100, H200), --capability 12.1 (DGX "
    "Spark, GB10); repeatable"
)
# An environment with no package directory (an interpreter whose sys.path holds none, a venv
# without lib/python3*/site-packages): no library was looked at, so nothing was judged. Before,
# it said "0 package directories ... no library" and passed (the hostile review).
NO_PACKAGES = (
    "not judged: {env} has no package directory (a site-packages, a dist-packages or a "
    "directory holding *.dist-info), so no library was looked at. Name the environment the "
    "software is installed in with --python (an interpreter, a venv, a site-packages or an "
    "unpacked root)"
)
SHADOWED_SHOWN = 4  # the names of shadowed libraries a line gives before "(+N)"
MODE_WORDS: dict[Mode, str] = {
    "native": "native",
    "ptx-jit": "through PTX JIT",
    "none": "cannot run",
}


@dataclass(frozen=True)
class NativeReport:
    """What ``sparkdiag native`` found: the scan, the GPUs judged for, each library's verdict
    on each, and torch's arch list (or why it was not read). The libraries whose fat binary is
    a stub have no verdict (:attr:`not_judged`)."""

    scan: LibraryScan
    gpus: tuple[Gpu, ...]
    verdicts: tuple[LibraryVerdict, ...]
    torch: TorchBuild | None
    torch_note: str

    @property
    def not_judged(self) -> list[CudaLibrary]:
        return not_judged(self.scan.libraries)

    @property
    def status(self) -> str:
        """fail, warn or pass: the worst verdict (pass when there is none), warn at least where
        a library or directory could not be read (it exited 0 and said every library ran
        natively: found in a review); not-judged when there was no GPU to judge for or no
        package directory to look in."""
        if not self.gpus or not self.scan.site_dirs:
            return "not-judged"
        seen = {v.status for v in self.verdicts}
        if self.scan.unreadable:  # what could not be read was not judged: no "all native"
            seen.add("warn")
        return "fail" if "fail" in seen else "warn" if "warn" in seen else "pass"

    @property
    def note(self) -> str:
        """Why nothing was judged ("" when something was)."""
        if not self.scan.site_dirs:
            return NO_PACKAGES.format(env=self.scan.environment)
        return "" if self.gpus else NO_GPU

    def torch_verdicts(self) -> list[tuple[Gpu, str, str]]:
        """(GPU, mode, target) of torch's arch list on each GPU."""
        if self.torch is None or not self.torch.arch_list:
            return []
        report = arch_list_report(self.torch.arch_list)
        out: list[tuple[Gpu, str, str]] = []
        for gpu in self.gpus:
            verdict = judge(report, gpu.capability)
            out.append((gpu, verdict.mode, verdict.target))
        return out

    def as_json(self) -> dict[str, Any]:
        torch: dict[str, Any] | None = None
        if self.torch is not None:
            torch = {
                "version": self.torch.version,
                "cuda": self.torch.cuda,
                "arch_list": list(self.torch.arch_list),
                "on": [
                    {"gpu": gpu.index, "mode": mode, "target": target}
                    for gpu, mode, target in self.torch_verdicts()
                ],
            }
        return {
            "format": FORMAT,
            "status": self.status,
            "gpus": [
                {"gpu": g.index, "uuid": g.uuid, "name": g.name, "sm": g.sm} for g in self.gpus
            ],
            "verdicts": [v.as_json() for v in self.verdicts],
            "not_judged": [stub_json(lib) for lib in self.not_judged],
            "torch": torch,
            "torch_note": self.torch_note,
            "note": self.note,
            "scan": scan_json(self.scan),
        }


def text(report: NativeReport, width: int, show_all: bool = False) -> str:
    """The report for people: the scan, torch's arch list, then per GPU a count by mode and a
    block for each library that is not native (every library with ``show_all``). Without a GPU
    to judge for: how to judge, then every library with GPU code and its targets. Without a
    package directory: that nothing was looked at."""
    scan = report.scan
    lines = terminal.wrap(
        f"{scan.environment}: {len(scan.site_dirs)} package directories, {scan.files} shared "
        f"libraries, {len(scan.libraries)} with GPU code ({scan.files - scan.cached} read, "
        f"{scan.cached} from the cache, {scan.seconds:.1f} s)",
        width,
    )
    if report.torch is not None:
        arch = " ".join(report.torch.arch_list) or "no CUDA architectures (a CPU build)"
        lines += terminal.wrap(f"torch {report.torch.version} built for {arch}", width)
        for gpu, mode, target in report.torch_verdicts():
            how = f" from {target}" if target else ""
            on = f"GPU {gpu.index} ({gpu.sm})" if gpu.index else gpu.sm  # --capability: no GPU
            lines += terminal.wrap(f"  on {on}: {mode}{how}", width)
    elif report.torch_note:
        lines += terminal.wrap(f"torch's arch list not read: {report.torch_note}", width)
    for path, why in sorted(scan.unreadable.items()):
        lines += terminal.wrap(f"not readable: {path}: {why}", width)
    by_first: dict[str, list[str]] = {}
    for path, first in sorted(scan.shadowed.items()):
        by_first.setdefault(first, []).append(path.rsplit("/", 1)[-1])
    for first, names in by_first.items():
        more = f" (+{len(names) - SHADOWED_SHOWN})" if len(names) > SHADOWED_SHOWN else ""
        lines += terminal.wrap(
            f"not judged: {len(names)} shadowed, Python imports their packages from {first} "
            f"first: {', '.join(names[:SHADOWED_SHOWN])}{more}",
            width,
        )
    for lib in scan.libraries:  # judged on the targets read before or around the damage
        for problem in lib.report.problems:
            lines += terminal.wrap(f"damaged fat binary: {lib.path}: {problem}", width)
    stubs = report.not_judged
    if stubs:
        lines += ["", *terminal.wrap(NOT_JUDGED, width)]
    for lib in stubs:
        lines += terminal.wrap(f"{_owner(lib)}: {lib.relative}", width, "  ", "        ")
        lines += terminal.wrap(stub_detail(lib), width, "        ")
    if not scan.site_dirs:
        return "\n".join([*lines, "", *terminal.wrap(report.note, width)]) + "\n"
    if not report.gpus:
        lines += ["", *terminal.wrap(NO_GPU, width)]
        for lib in judged(scan.libraries):
            lines += terminal.wrap(f"{_owner(lib)}: {lib.relative}", width, "  ", "        ")
            lines += terminal.wrap(carries(lib), width, "        ")
    for gpu in report.gpus:
        mine = [v for v in report.verdicts if v.gpu == gpu]
        counts = Counter(v.verdict.mode for v in mine)
        summary = ", ".join(f"{counts[m]} {MODE_WORDS[m]}" for m in MODE_WORDS if counts[m])
        lines.append("")
        which = f"GPU {gpu.index} {gpu.name}" if gpu.index else gpu.name
        lines += terminal.wrap(f"{which} ({gpu.sm}): {summary or 'no library'}", width)
        shown = mine if show_all else [v for v in mine if v.status != "pass"]
        lines += _blocks(shown, width)
        hidden = len(mine) - len(shown)
        if hidden:
            lines.append(f"  ({hidden} native, not listed: --all lists them)")
    return "\n".join(lines) + "\n"


def _blocks(verdicts: Sequence[LibraryVerdict], width: int) -> list[str]:
    lines: list[str] = []
    for v in sorted(
        verdicts,
        key=lambda v: (
            {"fail": 0, "warn": 1, "pass": 2}[v.status],
            v.library.package,
            v.library.relative,
        ),
    ):
        lines += terminal.wrap(
            f"{v.status.upper():<4}  {_owner(v.library)}: {v.library.relative}",
            width,
            "  ",
            "        ",
        )
        if v.status == "pass":
            continue
        lines += terminal.wrap(v.reason, width, "        ")
        lines += terminal.wrap(v.action, width, "        → ", "          ")
    return lines


def _owner(library: CudaLibrary) -> str:
    return " ".join(p for p in (library.package, library.version) if p)
