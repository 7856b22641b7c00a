"""The fleet rules (prometheus/sparkdiag-rules.yml, group sparkdiag-peers) use the thresholds of
sparkdiag/peers/ranking.py, which the check, the daemon and ``sparkdiag fleet`` use: the rules
cannot import them, so this test holds the two equal. The rules' behaviour is tested by promtool
(prometheus/tests/peers.yml, run by tests/test_prometheus_rules.py)."""

from __future__ import annotations

from typing import Any

import yaml

from sparkdiag.peers import ranking as compare
from tests.support import ROOT

RULES = ROOT / "prometheus" / "sparkdiag-rules.yml"


def peer_rules() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    (group,) = [g for g in doc["groups"] if g["name"] == "sparkdiag-peers"]
    return {r.get("alert") or r["record"]: r for r in group["rules"]}


def flat(expr: str) -> str:
    return " ".join(expr.split())


def test_the_alert_uses_seven_percent_a_group_of_four_and_thirty_minutes() -> None:
    alert = peer_rules()["SparkdiagGpuSlowerThanPeers"]
    expr = flat(alert["expr"])
    assert f"sparkdiag:gemm_tflops:peer_ratio <= {compare.FAIL_BELOW}" in expr
    assert f"sparkdiag:gemm_tflops:peer_group_gpus >= {compare.MIN_FLEET_GROUP}" in expr
    assert alert["for"] == "30m" and alert["labels"]["severity"] == "warning"
    # the contract's labels: instance, gpu, uuid, dtype, shape, context (and job); the group's
    # own labels are dropped
    assert expr.startswith("max without (name, torch, cuda, driver) (")


def test_the_hour_median_leaves_decode_shapes_out_and_groups_by_model_and_software() -> None:
    rules = peer_rules()
    median = flat(rules["sparkdiag:gemm_tflops:median_1h"]["expr"])
    assert median.startswith(
        f'quantile_over_time(0.5, sparkdiag_gemm_tflops{{shape!~"{compare.DECODE_SHAPE_RE}"}}[1h])'
    )
    assert "group_left (name) max by (instance, job, uuid, name) (sparkdiag_gpu_info)" in median
    assert (
        "group_left (torch, cuda, driver)" in median and "sparkdiag_probe_software_info" in median
    )
    group = "by (name, torch, cuda, driver, context, dtype, shape)"
    assert group in flat(rules["sparkdiag:gemm_tflops:peer_median_1h"]["expr"])


def test_the_score_uses_the_mad_scale_and_floor() -> None:
    score = flat(peer_rules()["sparkdiag:gemm_tflops:peer_score"]["expr"])
    assert f"{compare.MAD_SCALE} * (" in score
    assert score.count(f"{compare.MAD_FLOOR} * sparkdiag:gemm_tflops:peer_median_1h") == 2
