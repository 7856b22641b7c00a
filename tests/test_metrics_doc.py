"""docs/metrics.md lists every metric family the exporter can emit, and nothing it cannot.

What the exporter emits is read from what it renders, never from a list kept by hand:

- the golden scrapes (tests/golden/*.prom), the daemon end to end on fixtures; one of them,
  h200-x2-complete, answers every NVML query (tests/fixtures/nvml/h200-x2-complete.json), with
  --compat.dcgm, --process-metrics, a probe cycle on each of two GPUs and a recorded soak;
- the probe-state collectors (probe, hot probe, peers) rendered here from fixture cycles that a
  daemon reaches only after many probes: baselines learned over six healthy cycles per GPU, the
  int4 ratios' cool baselines, a hot probe of a hot GPU.

Every family the daemon's collectors yield, with or without a sample (the registry drops the
empty ones before it renders), must be among those, so a new metric that no fixture shows fails
here by name; its fix is a fixture that answers it (docs/architecture.md: How to add a metric).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from sparkdiag.baseline.keeper import StoreKeeper
from sparkdiag.baseline.store import BaselineStore
from sparkdiag.config import build_settings
from sparkdiag.exporter import registry as registry_module
from sparkdiag.exporter.hot import HotProbeCollector
from sparkdiag.exporter.peers import PeerCollector
from sparkdiag.exporter.probe import ProbeCollector
from sparkdiag.exporter.registry import build_registry, render
from sparkdiag.exporter.soak import soak_collector
from sparkdiag.probe.launchers import FixtureLauncher
from sparkdiag.scheduling.hot_probe import HotLimits, HotProbeScheduler
from sparkdiag.scheduling.probe_state import ProbeState
from sparkdiag.scheduling.scheduler import GpuLocks, ProbeScheduler
from sparkdiag.snapshot import Snapshot
from sparkdiag.soak.state import FILENAME as SOAK_STATE
from sparkdiag.telemetry.build import build_poller
from tests.support import FIXTURES, NVML, ROOT, ROOTFS, SYSFS
from tests.support.e2e import HEALTHY_JITTER, hot_document, probe_document, write_probe_fixture

DOC = ROOT / "docs" / "metrics.md"
GOLDEN = ROOT / "tests" / "golden"
COMPLETE = NVML / "h200-x2-complete.json"
SOAK = FIXTURES / "soak" / "h200-soak-state.json"

# A family name in a table row's first cell; ``..._x`` is the row's last full name and ``_x``.
NAME = re.compile(r"`((?:sparkdiag|DCGM_FI)_[A-Za-z0-9_]+|\.\.\._[a-z0-9_]+)`")
TYPE = re.compile(r"^# TYPE (\S+) \S+$", re.M)
SW_THERMAL_SLOWDOWN = 0x20  # clock event reason bit (nvml.h)


def documented(text: str) -> tuple[set[str], set[str]]:
    """(the families the tables say are exported, the dcgm-exporter fields they say are not)."""
    exported: set[str] = set()
    not_exported: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        names: list[str] = []
        base = ""
        for token in NAME.findall(cells[0]):
            if token.startswith("..."):
                assert base, f"docs/metrics.md: {token} follows no name: {line[:80]}"
                token = base + token[3:]
            else:
                base = token
            names.append(token)
        target = not_exported if len(cells) > 2 and cells[2] == "not exported" else exported
        target.update(names)
    return exported, not_exported


def families(exposition: str) -> set[str]:
    """The family names of a text exposition, as its TYPE lines give them (``_total`` on
    counters)."""
    return set(TYPE.findall(exposition))


def golden() -> dict[str, set[str]]:
    return {p.stem: families(p.read_text(encoding="utf-8")) for p in sorted(GOLDEN.glob("*.prom"))}


def _poll_complete(state_dir: Path) -> Snapshot:
    """Two polls of the complete fixture, read as ``serve`` reads it (GPM and the other delta
    queries answer from the second poll on)."""
    flags = {
        "nvml_fixture": COMPLETE,
        "sysfs": SYSFS / "h200-vm",
        "rootfs": ROOTFS / "gpu-host",
        "process_metrics": True,
        "compat_dcgm": True,
        "state_dir": state_dir,
    }
    poller = build_poller(build_settings(None, flags, "serve"))
    try:
        poller.poll_once()
        return poller.poll_once()
    finally:
        poller.gpu.stop()


def _probe_state(snap: Snapshot, tmp: Path) -> tuple[ProbeState, StoreKeeper]:
    """The probe state after six healthy cycles on each GPU (baselines learned: efficiency,
    the int4 ratios' cool baselines, peers) and a hot probe of GPU 0 made hot."""
    uuids = [gpu.identity.uuid for gpu in snap.gpus]
    cycles = [probe_document(uuid, jitter) for jitter in HEALTHY_JITTER for uuid in uuids]
    periodic = FixtureLauncher(write_probe_fixture(tmp / "periodic.json", cycles))
    heat = {"max_memory_temperature_celsius": 91.0, "clock_event_reasons_seen": SW_THERMAL_SLOWDOWN}
    hot = write_probe_fixture(tmp / "hot.json", [hot_document(uuids[0], {"int4": 0.5}, heat)])
    store = BaselineStore(tmp / "baselines.sqlite")
    keeper = StoreKeeper(lambda: store)
    state = ProbeState()
    scheduler = ProbeScheduler(
        periodic, state, keeper, "native", lambda: snap, 300.0, when="always"
    )
    for _ in HEALTHY_JITTER:
        scheduler.run_cycle()
    first = snap.gpus[0]
    hot_gpu = replace(
        first,
        temperature_celsius={**first.temperature_celsius, "memory": 91.0},
        clock_event_reasons=SW_THERMAL_SLOWDOWN,
    )
    hot_snap = replace(snap, gpus=(hot_gpu, *snap.gpus[1:]))
    limits = HotLimits(memory_celsius=80.0, gpu_celsius=85.0, interval=120.0, min_interval=60.0)
    launcher = FixtureLauncher(hot, suite="hot")
    hot_probe = HotProbeScheduler(
        launcher, state, keeper, "native", lambda: hot_snap, limits, GpuLocks()
    )
    assert [r.result for r in hot_probe.run_once()] == ["ok"]
    return state, keeper


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], set[str]]:
    """(families rendered with a sample, families yielded at all) by the daemon's registry over
    the complete fixture, its probe state and the recorded soak, as ``serve`` builds it."""
    tmp = tmp_path_factory.mktemp("metrics")
    shutil.copyfile(SOAK, tmp / SOAK_STATE)
    snap = _poll_complete(tmp)
    state, keeper = _probe_state(snap, tmp)
    extra = [  # daemon._serve's, in its order
        ProbeCollector(state.view, keeper.health),
        HotProbeCollector(state.view),
        PeerCollector(state.view),
        soak_collector(tmp),
    ]
    registry = build_registry(lambda: snap, extra=extra, compat_dcgm=True)
    shown = families(render(registry).decode())
    with pytest.MonkeyPatch.context() as patch:  # every family, the empty ones too
        patch.setattr(registry_module._NonEmpty, "collect", lambda self: self.inner.collect())
        yielded = families(render(registry).decode())
    return shown, yielded


def test_every_family_the_exporter_yields_has_a_sample_in_a_fixture(
    rendered: tuple[set[str], set[str]],
) -> None:
    shown, yielded = rendered
    seen = shown.union(*golden().values())
    unseen = sorted(yielded - seen)
    assert not unseen, (
        f"no golden scrape or collector fixture has a sample of {unseen}: answer the query in "
        "tests/fixtures/nvml/h200-x2-complete.json (with its why), regenerate the golden scrapes "
        "(SPARKDIAG_UPDATE_GOLDEN=1) and read the diff"
    )


def test_the_complete_scrape_shows_every_family_a_gpu_yields(
    rendered: tuple[set[str], set[str]],
) -> None:
    """The daemon, end to end on the complete fixture, renders every GPU family (NVML, GPM,
    NVLink, processes, health, dcgm-exporter's) and every probe family of a first cycle."""
    _, yielded = rendered
    complete = golden()["h200-x2-complete"]
    gpu = {name for name in yielded if name.startswith(("sparkdiag_gpu_", "DCGM_FI_"))}
    assert gpu and not sorted(gpu - complete), sorted(gpu - complete)
    first_cycle = {"sparkdiag_gemm_tflops", "sparkdiag_gemm_node_peer_ratio", "sparkdiag_soak_info"}
    assert first_cycle <= complete


def test_docs_list_every_family_emitted_and_nothing_else(
    rendered: tuple[set[str], set[str]],
) -> None:
    shown, _ = rendered
    emitted = shown.union(*golden().values())
    exported, _ = documented(DOC.read_text(encoding="utf-8"))
    missing, extra = sorted(emitted - exported), sorted(exported - emitted)
    assert not missing, f"emitted but not in docs/metrics.md: {missing}"
    assert not extra, f"in docs/metrics.md but never emitted: {extra}"


def test_the_dcgm_fields_the_docs_call_not_exported_are_not(
    rendered: tuple[set[str], set[str]],
) -> None:
    _, yielded = rendered
    _, not_exported = documented(DOC.read_text(encoding="utf-8"))
    assert "DCGM_FI_DEV_FB_RESERVED" in not_exported
    assert not not_exported & yielded, sorted(not_exported & yielded)


def test_the_docs_parser_reads_rows_shorthand_and_refusals() -> None:
    text = "\n".join(
        [
            "| metric | type |",
            "|---|---|",
            "| `sparkdiag_a_ratio` (contract) | gauge |",
            "| `sparkdiag_b_ratio`, `..._baseline`, `..._efficiency` | gauge |",
            "| `DCGM_FI_DEV_X`, `DCGM_FI_DEV_Y` | yes | `sparkdiag_a_ratio` | none |",
            "| `DCGM_FI_DEV_Z` | yes | not exported | not read |",
            "| `SparkdiagAlert` | fires |",
            "prose naming `sparkdiag_c_ratio` is not a row",
        ]
    )
    exported, not_exported = documented(text)
    assert exported == {
        "sparkdiag_a_ratio",
        "sparkdiag_b_ratio",
        "sparkdiag_b_ratio_baseline",
        "sparkdiag_b_ratio_efficiency",
        "DCGM_FI_DEV_X",
        "DCGM_FI_DEV_Y",
    }
    assert not_exported == {"DCGM_FI_DEV_Z"}
