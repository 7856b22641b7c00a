"""Helpers for the ``sparkdiag check`` tests (no tests here): derived NVML fixtures written to a
temporary directory, snapshots polled from them, contexts and probe documents."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sparkdiag.baseline.evaluate import GemmFigure, evaluate
from sparkdiag.baseline.store import BaselineStore
from sparkdiag.check.catalog import CHECKS, Check
from sparkdiag.check.model import CheckContext, CheckResult, GpuProbe, KernelLog, TorchInfo
from sparkdiag.config import Settings
from sparkdiag.probe.document import parse_document
from sparkdiag.probe.runner import ProbeCycle, classify
from sparkdiag.snapshot import GpuSample, HostSample, Snapshot
from sparkdiag.telemetry.build import build_poller as make_poller

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NVML = FIXTURES / "nvml"
SYSFS = FIXTURES / "sysfs"
ROOTFS = FIXTURES / "rootfs"
PROBE_FIXTURE = FIXTURES / "check" / "h200-probe.json"
GOOD_TORCH = TorchInfo("2.11.0+cu130", "13.0", "/usr/bin/python3")
CHECK: dict[str, Check] = dict(CHECKS)
"""Each check under the name ``sparkdiag check`` reports it by: the tests run what the command
runs under that name."""


def nvml_fixture(
    tmp_path: Path,
    base: str = "h200-idle.json",
    set: Mapping[str, Any] | None = None,
    name: str = "derived.json",
    **top: Any,
) -> Path:
    """A fixture derived from a recorded one: GPU 0 with ``set`` answers over it."""
    doc: dict[str, Any] = {
        "format": "sparkdiag-nvml-fixture/1",
        "description": "derived for a check test",
        "base": str(NVML / base),
        **top,
    }
    if set:
        doc["devices"] = [{"from": 0, "set": dict(set), "why": {k: "test" for k in set}}]
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def empty_sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sysfs-empty"
    (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
    return root


def settings(
    fixture: Path, sysfs: Path | None = None, rootfs: Path = ROOTFS / "native", **changes: Any
) -> Settings:
    """The daemon's settings on an NVML fixture, the H200 VM's sysfs and a native root unless
    told otherwise."""
    return Settings(
        nvml_fixture=fixture, sysfs=sysfs or SYSFS / "h200-vm", rootfs=rootfs, **changes
    )


def poll(
    fixture: Path,
    sysfs: Path | None = None,
    rootfs: Path = ROOTFS / "native",
    polls: int = 1,
    host: HostSample | None = None,
) -> Snapshot:
    """One snapshot (the last of ``polls``) through the daemon's own wiring."""
    poller = make_poller(settings(fixture, sysfs, rootfs))
    try:
        snap = poller.poll_once()
        for _ in range(polls - 1):
            snap = poller.poll_once()
    finally:
        poller.gpu.stop()
    if host is not None:
        snap = replace(snap, host=host)
    return snap


def derived(tmp_path: Path, base: str = "h200-idle.json", /, **set: Any) -> Snapshot:
    """Snapshot of a fixture derived from ``base`` with GPU 0's answers overridden by ``set``."""
    return poll(nvml_fixture(tmp_path, base, set))


def context(snapshot: Snapshot, **changes: Any) -> CheckContext:
    """A context with neutral host readings (good torch, empty kernel log, performance CPUs)."""
    values: dict[str, Any] = {
        "snapshot": snapshot,
        "torch": GOOD_TORCH,
        "kernel_log": KernelLog((), "test"),
        "governors": {"cpu0": "performance", "cpu1": "performance"},
    }
    values.update(changes)
    return CheckContext(**values)


def only(results: Sequence[CheckResult], gpu: str | None = None) -> CheckResult:
    """The single result (of one GPU when given)."""
    picked = [r for r in results if gpu is None or r.gpu == gpu]
    assert len(picked) == 1, picked
    return picked[0]


# -- probe documents -------------------------------------------------------------------------


def probe_doc() -> dict[str, Any]:
    """A fresh copy of the H200 worker document of tests/fixtures/check/h200-probe.json."""
    fixture = json.loads(PROBE_FIXTURE.read_text(encoding="utf-8"))
    return copy.deepcopy(fixture["cycles"][0])


def result(doc: dict[str, Any], dtype: str, kind: str, beta: int = 0) -> dict[str, Any]:
    for item in doc["results"]:
        if item["dtype"] == dtype and item["kind"] == kind and item["beta"] == beta:
            return item  # type: ignore[no-any-return]
    raise KeyError((dtype, kind, beta))


def cycle_of(doc: dict[str, Any] | None, result: str | None = None, reason: str = "") -> ProbeCycle:
    """A cycle as run_worker would classify it (``result`` forces timeout and the like)."""
    parsed = None if doc is None else parse_document(doc)
    if result is None:
        assert parsed is not None
        got, why = classify(0, parsed, b"{}", "")
        return ProbeCycle(got, why, parsed, "", 0, 7.4, 4242)
    return ProbeCycle(result, reason, parsed, "", None, 25.0, 4242)  # type: ignore[arg-type]


def never_launch(gpu: GpuSample, on_start: Callable[[int], None]) -> ProbeCycle:
    """The probe launcher of a run that must not probe: it fails the test if called."""
    raise AssertionError(f"the worker must not run (GPU {gpu.identity.index})")


def probed(
    snapshot: Snapshot,
    doc: dict[str, Any] | None = None,
    cycle: ProbeCycle | None = None,
    load: Sequence[GpuSample] = (),
    store: BaselineStore | None = None,
    **changes: Any,
) -> CheckContext:
    """A context whose GPU 0 was probed with ``doc`` (evaluated as the check does)."""
    gpu = snapshot.gpus[0]
    cycle = cycle or cycle_of(doc if doc is not None else probe_doc())
    figures: tuple[GemmFigure, ...] = ()
    if cycle.document and cycle.result in ("ok", "error"):
        figures = tuple(
            evaluate(
                cycle.document, gpu.identity.uuid, gpu.identity.name, "native", store, record=False
            )
        )
    probe = GpuProbe(gpu, cycle=cycle, figures=figures, load=tuple(load))
    return context(snapshot, probes={gpu.identity.index: probe}, **changes)


def copy_tree(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, symlinks=True)
    return target
