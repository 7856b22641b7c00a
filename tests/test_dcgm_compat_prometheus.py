"""dcgm-exporter's own dashboard against sparkdiag: daemons with ``--compat.dcgm`` on the H200
and GB10 fixtures, scraped by a real Prometheus, and every query of that dashboard (kept as test
data with its source in tests/fixtures/dcgm/dcgm-exporter-dashboard.json) run through its HTTP
API with Grafana's variables filled in as Grafana would.

Nodes (each scraped as its ``instance``):

- ``h200``: the lent H200 under a bf16 load (recorded), every field it answers;
- ``gb10``: a DGX Spark under a full load from poll 2 on (the GB10 fixture), unified memory;
- ``h200-x2``: two H200s over NVLink (derived fixture) with per-process metrics, one GPU used by
  a Kubernetes pod: ``gpu="1"``, ``device="nvidia1"`` and ``pod_uid``.

Every panel query returns series on every node, except the tensor-core panel on the GB10: the
GB10 fixture has no GPM (no public report shows it there), and sparkdiag never exports 0 for a
reading the GPU does not give. The compat values agree with the sparkdiag series of the same
scrape: temperature, power and SM clock exactly, the others exactly after DCGM's unit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import FIXTURES, NVML, ROOTFS, SYSFS
from tests.support.e2e import Fleet, Node, start_fleet

pytestmark = [pytest.mark.prometheus, pytest.mark.promtool]

DASHBOARD = json.loads((FIXTURES / "dcgm" / "dcgm-exporter-dashboard.json").read_text("utf-8"))
NODE_NAME = "ci-node-7"  # what the daemons find in $NODE_NAME: their Hostname label
MIB = 2**20
# Panels that must come back empty on a node, and why.
EMPTY = {("gb10", "Tensor Core Utilization"): "no GPM in the GB10 fixture: left out, never 0"}
DEADLINE_S = 60.0


def _node(workdir: Path, instance: str, nvml: Path, sysfs: str, rootfs: str, *extra: str) -> Node:
    state = workdir / instance / "state"
    state.mkdir(parents=True)
    args = (
        "--nvml-fixture", str(nvml),
        "--path.sysfs", str(SYSFS / sysfs),
        "--path.rootfs", str(ROOTFS / rootfs),
        "--state-dir", str(state),
        "--poll-interval", "0.5",
        "--no-probe.enabled",
        "--compat.dcgm",
        *extra,
    )  # fmt: skip
    return Node(instance, args, frozenset())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("dcgm-fleet")
    nodes = [
        _node(workdir, "h200", NVML / "h200-load.json", "h200-vm", "lent-vm"),
        _node(workdir, "gb10", NVML / "gb10-load.json", "dgx-spark", "dgx-spark"),
        _node(
            workdir,
            "h200-x2",
            FIXTURES / "scenarios" / "nvlink-degraded.json",
            "h200-vm",
            "gpu-host",
            "--process-metrics",
        ),
    ]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NODE_NAME", NODE_NAME)  # read by each daemon as it starts
        with start_fleet(workdir, nodes) as running:
            _wait_for_data(running)
            yield running


def _wait_for_data(fleet: Fleet) -> None:
    """Until every node has been scraped with its compat series, the GB10 past its idle poll
    (GPU_UTIL 100 from poll 2) and the per-process labels in."""
    deadline = time.monotonic() + DEADLINE_S
    ready = [
        "count by (instance) (DCGM_FI_DEV_GPU_TEMP)",
        'DCGM_FI_DEV_GPU_UTIL{instance="gb10"} == 100',
        'DCGM_FI_DEV_GPU_TEMP{instance="h200-x2", pod_uid!=""}',
    ]
    while True:
        found = [fleet.query(q) for q in ready]
        if len(found[0]) == 3 and all(found):
            return
        if time.monotonic() > deadline:
            why = f"no compat data in {DEADLINE_S:.0f} s: {found}"
            raise AssertionError(f"{why}\n{fleet.diagnostics()}")
        time.sleep(0.5)


def _label_values(fleet: Fleet, query: str, **where: str) -> list[str]:
    """Grafana's ``label_values(METRIC, LABEL)`` through the label values API."""
    metric, label = query.removeprefix("label_values(").removesuffix(")").split(", ")
    selector = metric + ("{" + ",".join(f'{k}="{v}"' for k, v in where.items()) + "}")
    return sorted(fleet.api(f"label/{label}/values", **{"match[]": selector}))


def _fill(expr: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        expr = expr.replace(f"${name}", value)
    assert "$" not in expr, expr
    return expr


def _variables() -> dict[str, str]:
    return {v["name"]: v["query"] for v in DASHBOARD["variables"] if v["type"] == "query"}


def test_the_test_data_is_the_dashboard_it_says() -> None:
    source = DASHBOARD["source"]
    assert source["repository"] == "NVIDIA/dcgm-exporter"
    assert source["grafana_com_id"] == 12239
    assert len(DASHBOARD["panels"]) == 8
    assert set(_variables()) == {"instance", "gpu"}


def test_variable_queries_list_every_node_and_gpu(fleet: Fleet) -> None:
    queries = _variables()
    assert _label_values(fleet, queries["instance"]) == ["gb10", "h200", "h200-x2"]
    assert _label_values(fleet, queries["gpu"]) == ["0", "1"]


def _selections(fleet: Fleet) -> Iterator[tuple[str, str, str]]:
    """(node, $instance, $gpu) as a user picks them: one node and one of its GPUs, one node and
    All of its GPUs, and All of both (Grafana's All without allValue is the values' regex)."""
    queries = _variables()
    nodes = _label_values(fleet, queries["instance"])
    for node in nodes:
        gpus = _label_values(fleet, queries["gpu"], instance=node)
        for gpu in gpus:
            yield node, node, gpu
        yield node, node, "(" + "|".join(gpus) + ")"
    yield (
        "all",
        "(" + "|".join(nodes) + ")",
        "(" + "|".join(_label_values(fleet, queries["gpu"])) + ")",
    )


def test_every_dashboard_query_returns_series(fleet: Fleet) -> None:
    empty_seen = set()
    checked = 0
    for node, instance, gpu in _selections(fleet):
        for panel in DASHBOARD["panels"]:
            expr = _fill(panel["expr"], {"instance": instance, "gpu": gpu})
            result = fleet.query(expr)
            checked += 1
            if (node, panel["title"]) in EMPTY:
                assert result == [], (panel["title"], node, result)
                empty_seen.add((node, panel["title"]))
            else:
                assert result, f"{panel['title']} on {node}: no series for {expr}"
    assert empty_seen == set(EMPTY)
    assert checked == 8 * (2 + 2 + 3 + 1)


def _vector(fleet: Fleet, expr: str, at: float | None = None) -> dict[tuple[str, str, str], float]:
    """{(instance, gpu, uuid): value} of ``expr`` evaluated at ``at`` (default now); DCGM's
    ``UUID`` and sparkdiag's ``uuid`` alike."""
    out = {}
    params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    data = fleet.api("query", **params)
    assert data["resultType"] == "vector", data
    for series in data["result"]:
        labels = series["metric"]
        key = (
            labels["instance"],
            labels.get("gpu", ""),
            labels.get("UUID", labels.get("uuid", "")),
        )
        assert key not in out, (expr, key)
        out[key] = float(series["value"][1])
    return out


def _same(value: float) -> float:
    return value


DEDICATED = 'and on(instance, gpu) sparkdiag_gpu_info{memory_model="dedicated"}'
# DCGM field, the sparkdiag series it comes from, the documented conversion (docs/metrics.md)
AGREEMENT: list[tuple[str, str, Callable[[float], float]]] = [
    ("DCGM_FI_DEV_GPU_TEMP", 'sparkdiag_gpu_temperature_celsius{sensor="gpu"}', _same),
    ("DCGM_FI_DEV_MEMORY_TEMP", 'sparkdiag_gpu_temperature_celsius{sensor="memory"}', _same),
    ("DCGM_FI_DEV_POWER_USAGE", "sparkdiag_gpu_power_watts", _same),
    ("DCGM_FI_DEV_SM_CLOCK", 'sparkdiag_gpu_clock_hertz{clock="sm"}', lambda hz: hz / 1e6),
    ("DCGM_FI_DEV_MEM_CLOCK", 'sparkdiag_gpu_clock_hertz{clock="memory"}', lambda hz: hz / 1e6),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "sparkdiag_gpu_energy_joules_total",
        lambda j: round(j * 1000),
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "sparkdiag_gpu_pcie_replay_errors_total", _same),
    (
        "DCGM_FI_DEV_GPU_UTIL",
        'sparkdiag_gpu_utilization_ratio{engine="gpu"}',
        lambda r: round(r * 100, 6),
    ),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        f'sparkdiag_gpu_utilization_ratio{{engine="memory"}} {DEDICATED}',
        lambda r: round(r * 100, 6),
    ),
    # on unified memory these come from the host's memory: test_gb10_framebuffer_is_host_memory
    (
        f"DCGM_FI_DEV_FB_USED {DEDICATED}",
        'sparkdiag_gpu_memory_bytes{state="used"}',
        lambda b: b // MIB,
    ),
    (
        f"DCGM_FI_DEV_FB_FREE {DEDICATED}",
        'sparkdiag_gpu_memory_bytes{state="free"}',
        lambda b: b // MIB,
    ),
    (
        "DCGM_FI_DEV_POWER_VIOLATION",
        'sparkdiag_gpu_violation_seconds_total{policy="power"}',
        lambda s: round(s * 1e9),
    ),
    ("DCGM_FI_PROF_SM_ACTIVE", 'sparkdiag_gpu_activity_ratio{engine="sm"}', _same),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 'sparkdiag_gpu_activity_ratio{engine="tensor"}', _same),
    ("DCGM_FI_PROF_DRAM_ACTIVE", 'sparkdiag_gpu_activity_ratio{engine="dram"}', _same),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "sparkdiag_gpu_sm_occupancy_ratio", _same),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        'sparkdiag_gpu_pcie_throughput_bytes_per_second{direction="tx"}',
        _same,
    ),
    (
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        'sum by (instance, gpu, uuid) (sparkdiag_gpu_nvlink_errors_total{type="replay"})',
        _same,
    ),
]


@pytest.mark.parametrize(
    ("field", "source", "convert"), AGREEMENT, ids=[a[0].split()[0] for a in AGREEMENT]
)
def test_values_agree_with_their_sparkdiag_series(
    fleet: Fleet, field: str, source: str, convert: Callable[[float], float]
) -> None:
    # Both evaluated at one instant: each target's series then come from one scrape (Prometheus
    # commits a scrape's samples together), even where a fixture's values move between polls.
    at = time.time()
    dcgm = _vector(fleet, field, at)
    ours = _vector(fleet, source, at)
    assert ours, f"{source}: no series on any node"
    assert set(dcgm) == set(ours), (field, sorted(set(dcgm) ^ set(ours)))
    for key, value in ours.items():
        assert dcgm[key] == convert(value), (field, key, dcgm[key], value)


def test_the_sm_clock_panel_draws_the_sparkdiag_clock_exactly(fleet: Fleet) -> None:
    (panel,) = [p for p in DASHBOARD["panels"] if p["title"] == "GPU SM Clocks"]
    assert panel["unit"] == "hertz"
    at = time.time()
    drawn = _vector(fleet, _fill(panel["expr"], {"instance": ".*", "gpu": ".*"}), at)
    ours = _vector(fleet, 'sparkdiag_gpu_clock_hertz{clock="sm"}', at)
    assert drawn == ours
    assert drawn[("h200", "0", "GPU-979ad365-0b73-a0ac-74a2-3520b773d460")] == 1455e6


def test_gb10_framebuffer_is_host_memory(fleet: Fleet) -> None:
    at = time.time()
    data = fleet.api("query", query='sparkdiag_host_memory_bytes{instance="gb10"}', time=str(at))
    host = {s["metric"]["state"]: float(s["value"][1]) for s in data["result"]}
    (used,) = _vector(fleet, 'DCGM_FI_DEV_FB_USED{instance="gb10"}', at).values()
    (free,) = _vector(fleet, 'DCGM_FI_DEV_FB_FREE{instance="gb10"}', at).values()
    assert free == host["available"] // MIB
    assert used == (host["total"] - host["available"]) // MIB
    assert not fleet.query('sparkdiag_gpu_memory_bytes{instance="gb10"}')


def test_gb10_exports_only_what_it_supports(fleet: Fleet) -> None:
    names = {s["metric"]["__name__"] for s in fleet.query('{__name__=~"DCGM_.+", instance="gb10"}')}
    assert names == {
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        *(
            f"DCGM_FI_DEV_{p}_VIOLATION"
            for p in ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTIL", "RELIABILITY")
        ),
    }


def _labels(fleet: Fleet, selector: str) -> list[dict[str, Any]]:
    return sorted(
        (s["metric"] for s in fleet.query(selector)), key=lambda m: (m["instance"], m["gpu"])
    )


def test_series_carry_dcgm_exporters_labels(fleet: Fleet) -> None:
    found = _labels(fleet, "DCGM_FI_DEV_GPU_TEMP")
    common = {"job": "sparkdiag", "Hostname": NODE_NAME, "__name__": "DCGM_FI_DEV_GPU_TEMP"}
    assert found == [
        {
            **common,
            "instance": "gb10",
            "gpu": "0",
            "UUID": "GPU-5b4c1f0e-6a2d-4e8b-9c31-0d2e7f6a9b10",
            "pci_bus_id": "0000000F:01:00.0",
            "device": "nvidia0",
            "modelName": "NVIDIA GB10",
            "DCGM_FI_DRIVER_VERSION": "580.126.09",
        },
        {
            **common,
            "instance": "h200",
            "gpu": "0",
            "UUID": "GPU-979ad365-0b73-a0ac-74a2-3520b773d460",
            "pci_bus_id": "00000000:00:06.0",
            "device": "nvidia0",
            "modelName": "NVIDIA H200",
            "DCGM_FI_DRIVER_VERSION": "580.159.04",
        },
        {
            **common,
            "instance": "h200-x2",
            "gpu": "0",
            "UUID": found[2]["UUID"],
            "pci_bus_id": found[2]["pci_bus_id"],
            "device": "nvidia0",
            "modelName": "NVIDIA H200",
            "DCGM_FI_DRIVER_VERSION": "580.159.04",
            # GPU 0's processes: docker, the pod's pt_main_thread, one /proc does not show
            "pod_uid": "3f2e1d0c-b9a8-4f7e-8d6c-5b4a39281706",
        },
        {
            **common,
            "instance": "h200-x2",
            "gpu": "1",  # a docker and a native process: no pod
            "UUID": found[3]["UUID"],
            "pci_bus_id": found[3]["pci_bus_id"],
            "device": "nvidia1",
            "modelName": "NVIDIA H200",
            "DCGM_FI_DRIVER_VERSION": "580.159.04",
        },
    ]
    spark = _vector(fleet, 'sparkdiag_gpu_temperature_celsius{sensor="gpu",instance="h200-x2"}')
    assert {uuid for _, _, uuid in spark} == {found[2]["UUID"], found[3]["UUID"]}
