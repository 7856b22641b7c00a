"""The Grafana dashboards (grafana/dashboards/*.json) are code: structural checks, and every
panel's every query run against the real Prometheus that scraped the sparkdiag fleet of
tests/test_e2e_prometheus.py (started once for both modules, see tests/support/e2e.py).

Grafana's variables are replaced by concrete values before a query is sent: ``$instance`` by the
node a panel is checked on (:data:`PANEL_NODE`, chosen so that every panel has data), ``$gpu`` by
``0`` (``.*`` on the fleet dashboard), ``$dtype`` by every dtype the node probes (a panel
repeated per dtype is checked once per dtype), and Grafana's interval variables by durations
that fit a Prometheus that scrapes every second and has run for a few seconds. Each query must
return a non-empty result: a renamed metric, a wrong label or a broken recording-rule name fails
the test instead of drawing an empty panel.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support import ROOT, promtool
from tests.support.e2e import Fleet, shared_fleet

GRAFANA = ROOT / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
NODE, FLEET = "sparkdiag-node.json", "sparkdiag-fleet.json"

PANEL_TYPES = {"timeseries", "stat", "table", "state-timeline"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana unit ids the dashboards may use (a typo would silently show raw numbers).
KNOWN_UNITS = {
    "none",
    "short",
    "percentunit",
    "celsius",
    "hertz",
    "watt",
    "tflops",
    "Bps",
    "s",
    "bool_on_off",
    "bytes",
}
CUSTOM_UNIT = re.compile(r"^(si|suffix|prefix):\S+$")
BUILTIN_VARIABLES = {
    # Grafana's own; the values suit a Prometheus that scrapes every second
    "__rate_interval": "5s",
    "__interval": "2s",
    "__range": "60s",
}
# The node each node-dashboard panel is checked on; the others use DEFAULT_NODE.
DEFAULT_NODE = "thermal-int4"  # hot, throttled, probed, with firing alerts
PANEL_NODE = {
    # the recording rule keeps the container side's labels; the panel matches on uuid, so it
    # must show the ratio on the native node's dashboard too
    "Container against native": "container-gap-native",
    "XID errors": "lost-gpu",  # XID 79 before the GPU fell off the bus
    "XID incidents by severity": "lost-gpu",
    # recovery action and fabric state: the NVLink pair's scenario answers both
    "Recovery action and NVLink fabric": "nvlink-degraded",
    "Busy against moving (the stall signature)": "nvlink-degraded",  # GPM
    # the width a known platform is built for: a DGX Spark (the H200 VM has no DMI)
    "Host PCIe links (sysfs)": "lane-degraded",
    "Platform": "gb10-slow-state",  # an ASUS Ascent GX10
    # a U.2 NVMe drive with its SMART log and a storage.json (tests/support/e2e.py)
    **dict.fromkeys(
        (
            "Storage throughput against its baseline",
            "4 KiB random read latency",
            "NVMe temperatures against their warning threshold",
            "NVMe time above its warning temperature",
            "NVMe health",
        ),
        "nvme-worn-hot",
    ),
    "SM clock over its applications clock": "gb10-slow-state",
    "Host memory (the GPU's, on unified memory)": "gb10-memory-pressure",
    "Memory pressure (PSI, 60 s)": "gb10-memory-pressure",
    "Swap-ins": "gb10-memory-pressure",
    # a GB10 with vLLM installed and the page cache holding half its memory (dgx-spark-vllm)
    "Memory a new allocation can get": "gb10-slow-state",
    "CUDA libraries without native code": "gb10-slow-state",
    # four H200s in one node, GPU 2 slower than the others (its baseline held out of learning)
    **dict.fromkeys(
        (
            "Against the other GPUs of this node",
            "Against its peers in the fleet (hour medians)",
            "Baselines held out of learning",
        ),
        "slower-than-peers",
    ),
    # GPM, PCIe throughput, NVLink, video engines and processes: the two-H200 NVLink node
    **dict.fromkeys(
        (
            "GPU activity (GPM)",
            "GPU PCIe throughput",
            "NVLink state",
            "NVLink traffic",
            "NVLink errors",
            "Video engines",
            "GPU memory by process",
            "SM utilization by process",
            "Processes by container and pod",
        ),
        "nvlink-degraded",
    ),
}


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DASHBOARDS / name).read_text(encoding="utf-8"))
    return doc


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in all_panels(dashboard) if p["type"] != "row"]


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def variable_query(variable: dict[str, Any]) -> str:
    query = variable["query"]
    return str(query["query"] if isinstance(query, dict) else query)


def _panel_params() -> list[Any]:
    params = []
    for name in (NODE, FLEET):
        try:
            dashboard = load(name)
        except (OSError, ValueError):
            continue  # test_dashboards_are_valid_json says why
        for panel in query_panels(dashboard):
            params.append(pytest.param(name, panel["id"], id=f"{name[:-5]}:{panel['title']}"))
    return params


# -- structure ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [NODE, FLEET])
def test_dashboards_are_valid_json(name: str) -> None:
    dashboard = load(name)
    assert dashboard["uid"] == name.removesuffix(".json")
    assert dashboard["title"] and dashboard["description"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard.get("id") is None  # provisioned: Grafana assigns the id
    assert "__inputs" not in dashboard  # no import-time ${DS_...}: the variable picks it
    assert "${DS_" not in json.dumps(dashboard)


@pytest.mark.parametrize("name", [NODE, FLEET])
def test_panel_ids_are_unique_and_panels_do_not_overlap(name: str) -> None:
    panels = list(all_panels(load(name)))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), ids
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
    for a, b in itertools.combinations(panels, 2):
        ga, gb = a["gridPos"], b["gridPos"]
        overlap = (
            ga["x"] < gb["x"] + gb["w"]
            and gb["x"] < ga["x"] + ga["w"]
            and ga["y"] < gb["y"] + gb["h"]
            and gb["y"] < ga["y"] + ga["h"]
        )
        assert not overlap, (a["title"], b["title"])


@pytest.mark.parametrize("name", [NODE, FLEET])
def test_every_panel_queries_prometheus_through_the_datasource_variable(name: str) -> None:
    panels = query_panels(load(name))
    assert panels
    for panel in panels:
        title = panel["title"]
        assert panel["type"] in PANEL_TYPES, title
        assert panel["datasource"] == DATASOURCE, title
        assert panel.get("description"), title
        assert panel["targets"], title
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), title
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), (title, target["refId"])
            assert target.get("datasource", DATASOURCE) == DATASOURCE, (title, target["refId"])
            assert "[[" not in target["expr"], "deprecated [[var]] syntax"


@pytest.mark.parametrize("name", [NODE, FLEET])
def test_every_panel_has_a_known_unit(name: str) -> None:
    for panel in query_panels(load(name)):
        config = panel["fieldConfig"]
        units = [config["defaults"].get("unit")] + [
            prop["value"]
            for override in config.get("overrides", [])
            for prop in override["properties"]
            if prop["id"] == "unit"
        ]
        for unit in units:
            assert unit in KNOWN_UNITS or CUSTOM_UNIT.match(str(unit)), (panel["title"], unit)


@pytest.mark.parametrize("name", [NODE, FLEET])
def test_variables(name: str) -> None:
    dashboard = load(name)
    found = variables(dashboard)
    assert {"datasource", "instance", "gpu"} <= set(found)
    assert found["datasource"]["type"] == "datasource"
    assert found["datasource"]["query"] == "prometheus"
    for var in found.values():
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, var["name"]
            assert re.fullmatch(r"label_values\(.+, \w+\)", variable_query(var)), var["name"]
    # every variable an expression uses is defined (or one of Grafana's own)
    defined = set(found) | set(BUILTIN_VARIABLES)
    for panel in query_panels(dashboard):
        for target in panel["targets"]:
            used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
            assert used <= defined, (panel["title"], used - defined)
        if "repeat" in panel:
            assert panel["repeat"] in found, panel["title"]


# What each dashboard must query (a metric, recording rule or alert selector in some panel).
NODE_SHOWS = (
    "sparkdiag_gpu_temperature_celsius",
    "sparkdiag_gpu_clock_hertz",
    "sparkdiag_gpu_clock_max_hertz",
    "sparkdiag_gpu_clock_event_active",
    "sparkdiag_gpu_power_watts",
    "sparkdiag_gpu_power_limit_watts",
    "sparkdiag_gpu_pcie_link_width",
    "sparkdiag_pcie_link_width",
    "sparkdiag_pcie_link_transfers_per_second",
    "sparkdiag_gemm_tflops",
    "sparkdiag_gemm_baseline_tflops",
    "sparkdiag_gemm_efficiency_ratio",
    "sparkdiag:gemm_tflops:container_over_native",
    "sparkdiag_gpu_xid_errors_total",
    "sparkdiag_gpu_ecc_errors_total",
    "sparkdiag_platform_info",
    "sparkdiag_gpu_clock_default_applications_hertz",
    "sparkdiag_pcie_link_expected_width",
    "sparkdiag_host_memory_bytes",
    "sparkdiag_host_memory_pressure_ratio",
    "sparkdiag_host_swap_in_pages_total",
    "sparkdiag_gpu_process_memory_bytes",
    "sparkdiag_gpu_process_sm_utilization_ratio",
    "sparkdiag_gpu_activity_ratio",
    "sparkdiag_gpu_nvlink_up",
    "sparkdiag_gpu_nvlink_errors_total",
    "sparkdiag_gpu_nvlink_data_bytes_total",
    "sparkdiag_gpu_pcie_throughput_bytes_per_second",
    "sparkdiag_gemm_node_peer_ratio",
    "sparkdiag:gemm_tflops:peer_ratio",
    "sparkdiag_gemm_baseline_held",
    "sparkdiag_gpu_pci_devices",
    "sparkdiag_gpu_recovery_action",
    "sparkdiag_gpu_fabric_state",
    "sparkdiag_gpu_xid_incidents_total",
)
FLEET_SHOWS = (
    "sparkdiag_nvml_up",
    "sparkdiag_gpu_up",
    "sparkdiag:gemm_efficiency_ratio:min_by_instance",
    'ALERTS{alertstate="firing", alertname=~"Sparkdiag.*"',
    "sparkdiag:gemm_tflops:peer_ratio",
    "sparkdiag:gemm_tflops:peer_score",
    "sparkdiag:gemm_tflops:peer_group_gpus",
)


@pytest.mark.parametrize(("name", "wanted"), [(NODE, NODE_SHOWS), (FLEET, FLEET_SHOWS)])
def test_dashboards_show_what_the_contract_asks_for(name: str, wanted: tuple[str, ...]) -> None:
    exprs = " ".join(t["expr"] for p in query_panels(load(name)) for t in p["targets"])
    assert [metric for metric in wanted if metric not in exprs] == []


def test_node_temperatures_mark_the_85_degree_line() -> None:
    (temperatures,) = [p for p in query_panels(load(NODE)) if p["title"] == "Temperatures"]
    defaults = temperatures["fieldConfig"]["defaults"]
    assert defaults["custom"]["thresholdsStyle"]["mode"] == "line"
    assert 85 in [step["value"] for step in defaults["thresholds"]["steps"]]


def test_recording_rules_used_by_the_dashboards_exist() -> None:
    rules = (ROOT / "prometheus" / "sparkdiag-rules.yml").read_text(encoding="utf-8")
    recorded = {
        r["record"] for g in yaml.safe_load(rules)["groups"] for r in g["rules"] if "record" in r
    }
    for name in (NODE, FLEET):
        for panel in query_panels(load(name)):
            for target in panel["targets"]:
                for used in re.findall(r"sparkdiag:[\w:]+", target["expr"]):
                    assert used in recorded, (name, panel["title"], used)


def test_provisioning_files() -> None:
    datasources = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text(encoding="utf-8")
    )
    assert datasources["apiVersion"] == 1
    assert [d["type"] for d in datasources["datasources"]] == ["prometheus"]
    dashboards = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "sparkdiag.yml").read_text(encoding="utf-8")
    )
    assert dashboards["apiVersion"] == 1
    (provider,) = dashboards["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]


# -- every query against the real Prometheus -----------------------------------------------------


@pytest.fixture(scope="module")
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    with shared_fleet(request, lambda: tmp_path_factory.mktemp("fleet")) as running:
        running.converge()  # hot probes, lost GPU, firing alerts: every panel has its data
        yield running


def substitute(expr: str, values: dict[str, str]) -> str:
    """``expr`` with ``$name``/``${name}`` replaced; fails on a variable without a value."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in values, f"no test value for ${name} in {expr}"
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def label_values(fleet: Fleet, query: str) -> list[str]:
    """Grafana's ``label_values(SELECTOR, LABEL)`` through Prometheus' label values API."""
    match = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
    assert match, query
    selector, label = match.groups()
    return list(fleet.api(f"label/{label}/values", **{"match[]": selector}))


def values_for(dashboard: str, panel: dict[str, Any]) -> dict[str, str]:
    if dashboard == FLEET:
        return {"instance": ".*", "gpu": ".*", **BUILTIN_VARIABLES}
    node = PANEL_NODE.get(panel["title"], DEFAULT_NODE)
    return {"instance": node, "gpu": "0", **BUILTIN_VARIABLES}


@pytest.mark.prometheus
@pytest.mark.promtool
@pytest.mark.parametrize(("dashboard", "panel_id"), _panel_params())
def test_every_panel_query_returns_data(fleet: Fleet, dashboard: str, panel_id: int) -> None:
    doc = load(dashboard)
    (panel,) = [p for p in query_panels(doc) if p["id"] == panel_id]
    values = values_for(dashboard, panel)
    rounds = [values]
    if "repeat" in panel:  # one panel per value of the repeat variable: check every one
        var = variables(doc)[panel["repeat"]]
        found = label_values(fleet, substitute(variable_query(var), values))
        assert found, (panel["title"], var["name"])
        rounds = [{**values, var["name"]: value} for value in found]
    for round_values in rounds:
        for target in panel["targets"]:
            expr = substitute(target["expr"], round_values)
            result = fleet.query(expr)
            assert result, f"{panel['title']} ({target['refId']}): no data for {expr}"


@pytest.mark.prometheus  # the fleet: a real Prometheus scraping sparkdiag daemons
@pytest.mark.promtool
@pytest.mark.parametrize("name", [NODE, FLEET])
def test_variable_queries_return_values(fleet: Fleet, name: str) -> None:
    found = variables(load(name))
    nodes = set(fleet.targets)
    assert set(label_values(fleet, variable_query(found["instance"]))) == nodes
    instance = ".*" if found["instance"].get("includeAll") else DEFAULT_NODE
    values = {"instance": instance, "gpu": "0" if instance != ".*" else ".*"}
    for var in found.values():
        if var["type"] == "query":
            assert label_values(fleet, substitute(variable_query(var), values)), var["name"]
    if "dtype" in found:
        dtypes = label_values(fleet, substitute(variable_query(found["dtype"]), values))
        assert set(dtypes) == {"bf16", "fp16", "tf32", "fp8", "int8", "int4"}  # nvfp4: unsupported


# -- fleet panels on the nodes the e2e fleet does not hold, through promtool -------------------
#
# promtool's unit tests evaluate any PromQL over scripted series: the panel's targets (or-ed, as
# Grafana draws them together) against nodes that have no memory sensor (GB10), a GPU NVML does
# not list, or NVML down.


def _panel_query(dashboard: str, title: str) -> str:
    (panel,) = [p for p in query_panels(load(dashboard)) if p["title"].startswith(title)]
    values = {"instance": ".*", "gpu": ".*", **BUILTIN_VARIABLES}
    return " or ".join(f"({substitute(t['expr'], values)})" for t in panel["targets"])


def _promtool_expr_test(
    tmp_path: Any, series: dict[str, str], expr: str, expected: dict[str, float]
) -> None:
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": labels, "value": value} for labels, value in expected.items()
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "panel-test.yml"
    path.write_text(json.dumps(test), encoding="utf-8")  # JSON is YAML
    result = subprocess.run(
        [promtool(), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.promtool
def test_fleet_hottest_gpu_panel_has_a_line_for_a_gb10(tmp_path: Any) -> None:
    """A GB10 has no memory sensor: the panel once drew only memory temperatures, so a fleet of
    Sparks showed an empty panel. Now its hottest GPU temperature stands in."""
    t = "sparkdiag_gpu_temperature_celsius"
    series = {
        f'{t}{{instance="h200",job="sparkdiag",gpu="0",uuid="GPU-a",sensor="memory"}}': "70x10",
        f'{t}{{instance="h200",job="sparkdiag",gpu="0",uuid="GPU-a",sensor="gpu"}}': "60x10",
        f'{t}{{instance="gb10",job="sparkdiag",gpu="0",uuid="GPU-b",sensor="gpu"}}': "55x10",
    }
    expected = {'{instance="h200"}': 70, '{instance="gb10"}': 55}
    _promtool_expr_test(tmp_path, series, _panel_query(FLEET, "Hottest GPU"), expected)


@pytest.mark.promtool
def test_fleet_gpus_up_panel_is_red_for_a_missing_gpu_and_for_nvml_down(tmp_path: Any) -> None:
    """The panel once read only sparkdiag_gpu_up: a node with a GPU NVML does not list showed
    "all up", a node with NVML down no row at all."""
    up, pci, nvml = "sparkdiag_gpu_up", "sparkdiag_gpu_pci_devices", "sparkdiag_nvml_up"
    series = {
        # healthy: two on the bus, two up
        f'{pci}{{instance="ok",job="sparkdiag"}}': "2x10",
        f'{up}{{instance="ok",job="sparkdiag",gpu="0",uuid="GPU-1"}}': "1x10",
        f'{up}{{instance="ok",job="sparkdiag",gpu="1",uuid="GPU-2"}}': "1x10",
        # a GPU lost while sparkdiag ran (listed at 0)
        f'{pci}{{instance="lost",job="sparkdiag"}}': "1x10",
        f'{up}{{instance="lost",job="sparkdiag",gpu="0",uuid="GPU-3"}}': "0x10",
        # two on the bus, NVML lists one
        f'{pci}{{instance="missing",job="sparkdiag"}}': "2x10",
        f'{up}{{instance="missing",job="sparkdiag",gpu="0",uuid="GPU-4"}}': "1x10",
        # NVML down: no GPU series at all
        f'{pci}{{instance="nvml-down",job="sparkdiag"}}': "1x10",
        f'{nvml}{{instance="nvml-down",job="sparkdiag"}}': "0x10",
        # a container without the list of its GPUs: sparkdiag_gpu_up alone
        f'{up}{{instance="container",job="sparkdiag",gpu="0",uuid="GPU-5"}}': "1x10",
    }
    expected = {
        '{instance="ok"}': 1,
        '{instance="lost"}': 0,
        '{instance="missing"}': 0,
        '{instance="nvml-down"}': 0,
        '{instance="container"}': 1,
    }
    _promtool_expr_test(tmp_path, series, _panel_query(FLEET, "GPUs up per node"), expected)


def _target_query(
    dashboard: str, title: str, ref_id: str, kind: str | None = None, **values: str
) -> str:
    """One target of one panel (of type ``kind`` where two share a title), its variables given
    (``__rate_interval`` as a test's series are spaced: the builtin 5 s suits a Prometheus that
    scrapes every second)."""
    (panel,) = [
        p
        for p in query_panels(load(dashboard))
        if p["title"] == title and kind in (None, p["type"])
    ]
    (target,) = [t for t in panel["targets"] if t["refId"] == ref_id]
    given = {"instance": ".*", "gpu": ".*", **BUILTIN_VARIABLES, **values}
    return str(substitute(target["expr"], given))


@pytest.mark.promtool
def test_fleet_targets_down_and_nodes_count_sparkdiag_targets_only(tmp_path: Any) -> None:
    """With All selected, `up{instance=~".*"}` read every job Prometheus scrapes: a node
    exporter that was down made "Targets down" 1 and the Nodes table listed Prometheus itself
    and the node exporter (a review, reproduced with promtool). Only targets that reported
    sparkdiag_build_info count, a sparkdiag that went down among them."""
    info = 'sparkdiag_build_info{version="1",job="sparkdiag"'
    series = {
        'up{instance="a:10942",job="sparkdiag"}': "1x10",
        f'{info},instance="a:10942"}}': "1x10",
        'up{instance="b:10942",job="sparkdiag"}': "1 1 0 0 0 0 0 0 0 0",  # down since 2m
        f'{info},instance="b:10942"}}': "1 1",
        'up{instance="a:9100",job="node"}': "0x10",  # another job's target, down
        'up{instance="localhost:9090",job="prometheus"}': "1x10",
    }
    _promtool_expr_test(tmp_path, series, _target_query(FLEET, "Targets down", "A"), {"{}": 1})
    expected = {
        '{instance="a:10942"}': 1,
        '{instance="b:10942"}': 0,
    }
    _promtool_expr_test(tmp_path, series, _target_query(FLEET, "Nodes", "A", "table"), expected)


@pytest.mark.promtool
def test_node_nvme_throttle_panel_is_seconds_a_minute_at_any_zoom(tmp_path: Any) -> None:
    """increase(...[$__rate_interval]) gave seconds per rate interval: a drive throttling the
    whole time read 600 at a 10-minute interval (a 7-day range) where the panel says "seconds
    a minute"; it reads 60 at any interval now."""
    c = "sparkdiag_nvme_thermal_throttle_seconds_total"
    series = {f'{c}{{instance="n",job="sparkdiag",device="nvme0",level="warning"}}': "0+60x20"}
    expected = {'{instance="n",job="sparkdiag",device="nvme0",level="warning"}': 60}
    for interval in ("2m", "4m"):
        expr = _target_query(
            NODE, "NVMe time above its warning temperature", "A",
            instance="n", __rate_interval=interval,
        )  # fmt: skip
        _promtool_expr_test(tmp_path, series, expr, expected)


@pytest.mark.promtool
def test_fleet_peer_table_scores_the_kernel_whose_ratio_it_shows(tmp_path: Any) -> None:
    """The table's ratio is the GPU's worst kernel's; its score was the lowest of any kernel,
    so bf16's 0.95 stood beside fp8's score of -4 (coloured drain). Now the score is bf16's."""
    labels = 'instance="n",job="sparkdiag",gpu="0",uuid="GPU-a",name="H200",torch="2",cuda="12",'
    labels += 'driver="570",context="native"'
    ratio, score = "sparkdiag:gemm_tflops:peer_ratio", "sparkdiag:gemm_tflops:peer_score"
    series = {
        f'{ratio}{{{labels},dtype="bf16",shape="8192"}}': "0.95x10",
        f'{score}{{{labels},dtype="bf16",shape="8192"}}': "-1x10",
        f'{ratio}{{{labels},dtype="fp8",shape="8192"}}': "0.99x10",
        f'{score}{{{labels},dtype="fp8",shape="8192"}}': "-4x10",
    }
    expr = _target_query(FLEET, "GPUs ranked by their ratio to their peers", "B")
    _promtool_expr_test(tmp_path, series, expr, {f"{{{labels}}}": -1})
