"""End-to-end proof of the alerting chain: sparkdiag daemons on scripted fixtures, scraped by a
real Prometheus (/usr/bin/prometheus) that loads the shipped rules, and exactly the expected
alerts firing on exactly the expected nodes, checked through Prometheus' HTTP API.

Prometheus scrapes and evaluates every second. It loads a temporary copy of
``prometheus/sparkdiag-rules.yml`` in which only the ``for:`` durations are shortened (every one
becomes ``3s``; ``for: 10m`` cannot fire in CI); the expressions, ``[1h]`` ranges included, are
the shipped ones (:func:`tests.support.e2e.shortened_rules` checks that nothing else changed).

The fleet, its fixtures and the expected alerts per node are defined in tests/support/e2e.py:

==========================  ===============================================================
node                        expected firing alerts
==========================  ===============================================================
healthy-h200                none
lane-degraded (GB10)        SparkdiagPcieLinkDegraded for 0002:01:00.0/.1 and their root port
                            (a DGX Spark Founders Edition, built for x4, at x2)
gb10-slow-state             SparkdiagGpuSlowState (an ASUS Ascent GX10, whose x2 second
                            ConnectX-7 is its design and fires nothing),
                            SparkdiagSoftwareNotNative (vllm and flash-attn: no native code
                            for sm_121 in its rootfs dgx-spark-vllm)
gb10-memory-pressure        SparkdiagUnifiedMemoryPressure (stalls and available memory)
thermal-int4                SparkdiagThermalInt4Degradation (from the hot probe: int4 at half
                            its cool speed against bf16/fp16 while memory is at 91 °C),
                            SparkdiagGemmDegraded (int4), SparkdiagInt4SlowerThanFp16
                            (1x8192x8192), SparkdiagGpuMemoryTemperatureHigh,
                            SparkdiagGpuThermalThrottling, SparkdiagGpuSlowerThanPeers (int4
                            at half of the other H200s' at its compute shapes)
slower-than-peers           SparkdiagGpuSlowerThanPeers for GPU 2 alone (four H200s, GPU 2 at
                            0.9 of the others: 10 % below the nine probed H200s' median)
hot-ratio-holds             SparkdiagGpuMemoryTemperatureHigh, SparkdiagGpuThermalThrottling
                            (the same heat; the hot probe finds every dtype slowed alike, as
                            beside a competing process: the int4 ratio holds)
container-gap-native        none
container-gap-container     SparkdiagContainerNativeGap (bf16 and fp16, every shape)
lost-gpu                    SparkdiagGpuLost, SparkdiagXidError (XID 79); not
                            SparkdiagProbeStale nor SparkdiagGpuMissing (the same lost GPU:
                            one page for one cause)
nvlink-degraded             SparkdiagNvlinkDown (link 5 of GPU 0), SparkdiagNvlinkErrors
                            (replay errors on link 3 of GPU 1)
==========================  ===============================================================

The expected state is reached about 10 s after Prometheus starts (its first target discovery
takes up to 5 s); the test waits for it with a 90 s deadline and then requires it to hold for a
few evaluations (about 20 s for this module, daemons and Prometheus included). Every process is
stopped at the end of the session, also when a test or the start fails; their logs stay in the
session's tmp directory, and a convergence failure shows the tail of each.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.e2e import (
    FOR_IN_TEST,
    SLOWER_GPU,
    Alert,
    Fleet,
    rule_names,
    scenario_uuids,
    shared_fleet,
)

pytestmark = [pytest.mark.promtool, pytest.mark.prometheus]


@pytest.fixture(scope="module")
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    with shared_fleet(request, lambda: tmp_path_factory.mktemp("fleet")) as running:
        yield running


@pytest.fixture(scope="module")
def alerts(fleet: Fleet) -> list[Alert]:
    """The Sparkdiag alerts once the fleet has converged (exactly the expected ones firing)."""
    return fleet.converge()


def firing(alerts: list[Alert], name: str, instance: str | None = None) -> list[Alert]:
    return [
        a
        for a in alerts
        if a.state == "firing" and a.name == name and (instance is None or a.instance == instance)
    ]


def test_rules_load_as_shipped_and_evaluate_without_error(
    fleet: Fleet, alerts: list[Alert]
) -> None:
    groups = fleet.api("rules")["groups"]
    loaded = [rule for group in groups for rule in group["rules"]]
    assert sorted(r["name"] for r in loaded) == sorted(rule_names(fleet.rules))
    for rule in loaded:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
        if rule["type"] == "alerting":
            assert rule["duration"] == int(FOR_IN_TEST.rstrip("s")), rule["name"]


def test_exactly_the_expected_alerts_fire_on_exactly_the_expected_nodes(
    fleet: Fleet, alerts: list[Alert]
) -> None:
    fired = {(a.name, a.instance) for a in alerts if a.state == "firing"}
    for node in fleet.nodes:
        on_node = {name for name, instance in fired if instance == node.instance}
        assert on_node == node.expected, f"{node.instance} ({node.why})"
    assert fired == fleet.expected
    # and still so now, through the query API as well as the alerts API
    now = {
        (s["metric"]["alertname"], s["metric"]["instance"])
        for s in fleet.query('ALERTS{alertstate="firing", alertname=~"Sparkdiag.*"}')
    }
    assert now == fleet.expected


def test_annotations_render_without_template_errors(fleet: Fleet, alerts: list[Alert]) -> None:
    rendered = [a for a in fleet.api("alerts")["alerts"] if a["state"] == "firing"]
    assert rendered
    for alert in rendered:
        assert alert["labels"]["severity"] in ("warning", "critical"), alert["labels"]
        assert alert["labels"]["instance"] in alert["annotations"]["description"], alert
        for key in ("summary", "description"):
            text = alert["annotations"].get(key, "")
            assert text, (alert["labels"], key)
            for broken in ("<no value>", "error expanding template", "%!"):
                assert broken not in text, (alert["labels"], key, text)


def test_pcie_alert_names_the_connectx7_link_and_its_root_port(alerts: list[Alert]) -> None:
    pcie = firing(alerts, "SparkdiagPcieLinkDegraded")
    assert {(a.labels["device"], a.labels["class"], a.labels["problem"]) for a in pcie} == {
        ("0002:01:00.0", "network", "width"),  # the second ConnectX-7 at x2 of x4
        ("0002:01:00.1", "network", "width"),  # its second function
        ("0002:00:00.0", "bridge", "width"),  # its root port, trained at x2 as well
    }
    # the GX10 (gb10-slow-state) has the same x2 by design: exported, and no alert
    assert {a.instance for a in pcie} == {"lane-degraded"}


def test_gb10_slow_state_and_memory_pressure_alerts(fleet: Fleet, alerts: list[Alert]) -> None:
    (slow,) = firing(alerts, "SparkdiagGpuSlowState")
    assert slow.instance == "gb10-slow-state"
    assert slow.labels["uuid"] == "GPU-5b4c1f0e-6a2d-4e8b-9c31-0d2e7f6a9b10"
    (rendered,) = [
        a for a in fleet.api("alerts")["alerts"] if a["labels"]["alertname"] == slow.name
    ]
    assert "remove AC power" in rendered["annotations"]["description"]
    pressure = firing(alerts, "SparkdiagUnifiedMemoryPressure")
    assert {(a.instance, a.labels["signal"]) for a in pressure} == {
        ("gb10-memory-pressure", "stalls"),
        ("gb10-memory-pressure", "available"),
    }
    gx10 = fleet.query('sparkdiag_platform_info{instance="gb10-slow-state"}')
    assert [s["metric"]["product"] for s in gx10] == ["GX10"]
    design = fleet.query(
        'sparkdiag_pcie_link_expected_width{instance="gb10-slow-state", device="0002:01:00.0"}'
    )
    assert [float(s["value"][1]) for s in design] == [2.0]


def test_thermal_int4_alerts_name_int4_only(fleet: Fleet, alerts: list[Alert]) -> None:
    int4_shapes = {"4096x4096x4096", "4096x11008x4096", "1x8192x8192"}
    thermals = firing(alerts, "SparkdiagThermalInt4Degradation")
    assert len(thermals) == 1, thermals
    (thermal,) = thermals
    assert thermal.instance == "thermal-int4"  # never hot-ratio-holds, hot as well
    assert (thermal.labels["shape"], thermal.labels["context"]) == ("1x8192x8192", "native")
    # int4/bf16 and int4/fp16 of the hot probe over the ratios learned cool: half
    for sample in fleet.query('sparkdiag_hot_probe_int4_ratio_efficiency{instance="thermal-int4"}'):
        assert float(sample["value"][1]) == pytest.approx(0.5, abs=0.01), sample
    for sample in fleet.query(
        'sparkdiag_hot_probe_int4_ratio_efficiency{instance="hot-ratio-holds"}'
    ):
        assert float(sample["value"][1]) == pytest.approx(1.0, abs=0.01), sample
    degraded = firing(alerts, "SparkdiagGemmDegraded")
    assert {(a.labels["dtype"], a.labels["shape"]) for a in degraded} == {
        ("int4", shape) for shape in int4_shapes
    }
    slower = firing(alerts, "SparkdiagInt4SlowerThanFp16")
    assert [a.labels["shape"] for a in slower] == ["1x8192x8192"]  # decode shapes only
    for node in ("thermal-int4", "hot-ratio-holds"):
        (hot,) = [
            a for a in firing(alerts, "SparkdiagGpuMemoryTemperatureHigh") if a.instance == node
        ]
        assert hot.labels["sensor"] == "memory"
        (throttled,) = [
            a for a in firing(alerts, "SparkdiagGpuThermalThrottling") if a.instance == node
        ]
        assert throttled.labels["reason"] == "sw_thermal_slowdown"
    # the baseline was learned from the healthy cycles and frozen: int4 at half of it
    for sample in fleet.query(
        'sparkdiag_gemm_efficiency_ratio{instance="thermal-int4", dtype="int4"}'
    ):
        assert float(sample["value"][1]) == pytest.approx(0.5, abs=0.01), sample


def test_container_gap_is_caught_by_the_cross_context_rule(
    fleet: Fleet, alerts: list[Alert]
) -> None:
    gap = firing(alerts, "SparkdiagContainerNativeGap")
    assert {a.instance for a in gap} == {"container-gap-container"}
    assert {a.labels["dtype"] for a in gap} == {"bf16", "fp16"}
    assert len(gap) == 6  # three shapes each
    ratios = fleet.query("sparkdiag:gemm_tflops:container_over_native")
    assert ratios
    for sample in ratios:
        expected = 0.6 if sample["metric"]["dtype"] in ("bf16", "fp16") else 1.0
        assert float(sample["value"][1]) == pytest.approx(expected, rel=0.02), sample
    # Each context learned its own baseline, so the container's efficiency stays ~1 and
    # SparkdiagGemmDegraded does not fire there: only the cross-context rule sees the gap.
    efficiency = fleet.query('sparkdiag_gemm_efficiency_ratio{instance=~"container-gap-.*"}')
    assert {s["metric"]["context"] for s in efficiency} == {"native", "container"}
    assert all(float(s["value"][1]) > 0.98 for s in efficiency)


def test_lost_gpu(fleet: Fleet, alerts: list[Alert]) -> None:
    (lost,) = firing(alerts, "SparkdiagGpuLost")
    (xid,) = firing(alerts, "SparkdiagXidError")
    assert xid.labels["severity"] == "critical"  # 79: the catalog's RESTART_BM
    # one lost GPU is one page: GpuMissing (NVML still lists it, at 0) and ProbeStale (its
    # last success ages) stay quiet for it
    assert firing(alerts, "SparkdiagGpuMissing") == []
    assert firing(alerts, "SparkdiagProbeStale") == []
    assert lost.instance == xid.instance == "lost-gpu"
    assert lost.labels["uuid"] == xid.labels["uuid"]
    assert fleet.query('sparkdiag_gpu_xid_errors_total{instance="lost-gpu", xid="79"}')
    # NVML itself still answers: one lost GPU is not SparkdiagNvmlDown
    (up,) = fleet.query('sparkdiag_nvml_up{instance="lost-gpu"}')
    assert up["value"][1] == "1"


def test_nvlink_alerts_name_the_link(fleet: Fleet, alerts: list[Alert]) -> None:
    (down,) = firing(alerts, "SparkdiagNvlinkDown")
    (errors,) = firing(alerts, "SparkdiagNvlinkErrors")
    assert down.instance == errors.instance == "nvlink-degraded"
    assert (down.labels["gpu"], down.labels["link"]) == ("0", "5")
    assert (errors.labels["gpu"], errors.labels["link"]) == ("1", "3")
    up = fleet.query('sparkdiag_gpu_nvlink_up{instance="nvlink-degraded"} == 1')
    assert len(up) == 2 * 18 - 1
    # the per-process series carry the container and the pod, read from the node's /proc
    pods = fleet.query(
        'sparkdiag_gpu_process_memory_bytes{instance="nvlink-degraded", pod_uid!=""}'
    )
    assert [s["metric"]["process"] for s in pods] == ["pt_main_thread"]


def test_quiet_nodes_are_scraped_and_probed(fleet: Fleet, alerts: list[Alert]) -> None:
    for instance in ("healthy-h200", "container-gap-native"):
        assert not [a for a in alerts if a.instance == instance and a.state == "firing"]
        (up,) = fleet.query(f'up{{instance="{instance}"}}')
        assert up["value"][1] == "1"
        efficiency = fleet.query(f'sparkdiag_gemm_efficiency_ratio{{instance="{instance}"}}')
        assert efficiency and all(
            float(s["value"][1]) == pytest.approx(1.0, abs=0.01) for s in efficiency
        )


def test_every_target_is_up(fleet: Fleet, alerts: list[Alert]) -> None:
    targets = fleet.api("targets")["activeTargets"]
    assert sorted(t["labels"]["instance"] for t in targets) == sorted(fleet.targets)
    assert all(t["health"] == "up" for t in targets), [
        (t["labels"]["instance"], t["lastError"]) for t in targets if t["health"] != "up"
    ]


def test_recorded_series_carry_the_node(fleet: Fleet, alerts: list[Alert]) -> None:
    worst = {
        s["metric"]["instance"]: float(s["value"][1])
        for s in fleet.query("sparkdiag:gemm_efficiency_ratio:min_by_instance")
    }
    # every node with a baseline: not the GB10 nodes (probe off), nor the lost GPU, probed once
    # or twice before it fell off the bus (a baseline needs three healthy runs), nor the nodes
    # whose probe is off (nvlink-degraded, nvme-worn-hot)
    gb10 = {"lane-degraded", "gb10-slow-state", "gb10-memory-pressure"}
    off = {"lost-gpu", "nvlink-degraded", "nvme-worn-hot"}
    assert set(worst) == set(fleet.targets) - gb10 - off
    assert worst["thermal-int4"] == pytest.approx(0.5, abs=0.01)


def test_slower_than_peers_names_the_slow_gpu_and_int4_of_the_hot_one(
    fleet: Fleet, alerts: list[Alert]
) -> None:
    peers = firing(alerts, "SparkdiagGpuSlowerThanPeers")
    slow = {a.labels["uuid"] for a in peers if a.instance == "slower-than-peers"}
    assert slow == {scenario_uuids("slower-than-peers")[SLOWER_GPU]}
    # every compute-bound kernel of it (the cube and the LLM shape of six dtypes), no decode
    kernels = {(a.labels["dtype"], a.labels["shape"]) for a in peers if a.labels["uuid"] in slow}
    assert len(kernels) == 12 and ("bf16", "1x8192x8192") not in kernels
    hot = {(a.labels["dtype"], a.labels["shape"]) for a in peers if a.instance == "thermal-int4"}
    assert hot == {("int4", "4096x4096x4096"), ("int4", "4096x11008x4096")}
    # in the node: the slow GPU's baseline is held, its neighbours' learned
    held = fleet.query('sparkdiag_gemm_baseline_held{instance="slower-than-peers"} == 1')
    assert {s["metric"]["gpu"] for s in held} == {str(SLOWER_GPU)}
    ratio = fleet.query(
        'sparkdiag_gemm_node_peer_ratio{instance="slower-than-peers", dtype="bf16",'
        ' shape="8192x8192x8192"}'
    )
    by_gpu = {s["metric"]["gpu"]: float(s["value"][1]) for s in ratio}
    assert by_gpu.pop(str(SLOWER_GPU)) < 0.93 and min(by_gpu.values()) >= 0.99
