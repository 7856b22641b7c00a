"""Kubernetes manifests (``sparkdiag assets --kubernetes``): valid against the Kubernetes
schemas (kubernetes-validate, offline), the custom resources' required fields as the
prometheus-operator's CRDs state them, the objects referring to each other correctly, the
rules and dashboards identical to the shipped files, and the committed kubernetes/ folder
identical to what the generator writes today (``SPARKDIAG_UPDATE_GOLDEN=1`` rewrites it)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkdiag.kubernetes import (
    KubernetesOptions,
    ManifestError,
    manifests,
    parse_labels,
    render,
    write_manifests,
)
from sparkdiag.safeyaml import parse_shipped
from tests.support import ROOT, promtool, sparkdiag_cmd

COMMITTED = ROOT / "kubernetes"
# The oldest and the newest Kubernetes minor versions whose schemas kubernetes-validate ships
# that a current cluster runs (1.29 is the oldest the GPU Operator's current release supports).
KUBERNETES_VERSIONS = ("1.29.0", "1.34.0")
CUSTOM = {"ServiceMonitor", "PrometheusRule"}
# prometheus-operator's CRDs (monitoring.coreos.com/v1, read from its
# example/prometheus-operator-crd/ in 2026): duration pattern and scrape schemes.
DURATION = re.compile(
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
    r"(([0-9]+)s)?(([0-9]+)ms)?)$"
)
RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
GROUP_KEYS = {
    "name",
    "rules",
    "interval",
    "labels",
    "limit",
    "partial_response_strategy",
    "query_offset",
}
SERVICE_MONITOR_SPEC_KEYS = {
    "selector",
    "endpoints",
    "namespaceSelector",
    "jobLabel",
    "targetLabels",
    "podTargetLabels",
    "sampleLimit",
    "targetLimit",
}
ENDPOINT_KEYS = {
    "port",
    "path",
    "interval",
    "scrapeTimeout",
    "scheme",
    "relabelings",
    "metricRelabelings",
    "honorLabels",
    "honorTimestamps",
}
RELABEL_ACTIONS = {
    "replace",
    "keep",
    "drop",
    "hashmod",
    "labelmap",
    "labeldrop",
    "labelkeep",
    "lowercase",
    "uppercase",
    "keepequal",
    "dropequal",
}


def objects(options: KubernetesOptions | None = None) -> dict[str, dict[str, Any]]:
    """kind (ConfigMap: ConfigMap/NAME) -> object, parsed back from the rendered YAML."""
    options = options or KubernetesOptions()
    found = {}
    for _name, obj in manifests(options):
        parsed = parse_shipped(render(obj, options))  # libyaml: 12 s of CPU less
        key = parsed["kind"]
        if key == "ConfigMap":
            key = f"ConfigMap/{parsed['metadata']['name']}"
        found[key] = parsed
    return found


def check_custom_resource(obj: dict[str, Any]) -> None:
    """The fields the prometheus-operator CRDs require, with their types and patterns."""
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert isinstance(obj.get("spec"), dict), "spec is required"
    spec = obj["spec"]
    meta = obj["metadata"]
    assert meta["name"] and meta["namespace"]
    if obj["kind"] == "ServiceMonitor":
        assert {"selector", "endpoints"} <= set(spec), "selector and endpoints are required"
        assert set(spec) <= SERVICE_MONITOR_SPEC_KEYS, set(spec) - SERVICE_MONITOR_SPEC_KEYS
        assert isinstance(spec["selector"].get("matchLabels"), dict)
        assert spec["endpoints"], "at least one endpoint"
        for endpoint in spec["endpoints"]:
            assert set(endpoint) <= ENDPOINT_KEYS, set(endpoint) - ENDPOINT_KEYS
            assert isinstance(endpoint["port"], str)
            for key in ("interval", "scrapeTimeout"):
                assert DURATION.match(endpoint[key]), endpoint[key]
            for relabel in endpoint.get("relabelings", []):
                assert relabel["action"] in RELABEL_ACTIONS
                assert all(isinstance(s, str) for s in relabel["sourceLabels"])
    elif obj["kind"] == "PrometheusRule":
        assert spec["groups"], "groups"
        for group in spec["groups"]:
            assert set(group) <= GROUP_KEYS and isinstance(group["name"], str) and group["name"]
            for rule in group["rules"]:
                assert set(rule) <= RULE_KEYS, set(rule) - RULE_KEYS
                assert isinstance(rule["expr"], str | int) and str(rule["expr"]).strip()
                assert ("alert" in rule) != ("record" in rule), rule
                for key in ("for", "keep_firing_for"):
                    if key in rule:
                        assert DURATION.match(rule[key]), rule[key]
                for key in ("labels", "annotations"):
                    assert all(isinstance(v, str) for v in rule.get(key, {}).values()), rule
    else:
        raise AssertionError(f"unexpected custom resource {obj['kind']}")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    "options",
    [
        KubernetesOptions(),
        KubernetesOptions(
            labels={"release": "kps"}, host_pid=True, runtime_class=None, namespace="monitoring"
        ),
    ],
    ids=["defaults", "options"],
)
def test_manifests_validate_offline(
    version: str, options: KubernetesOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("validation tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    kinds = []
    for name, obj in manifests(options):
        parsed = parse_shipped(render(obj, options))  # libyaml: 12 s of CPU less
        kinds.append(parsed["kind"])
        if parsed["kind"] in CUSTOM:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(parsed, version, strict=True)
            check_custom_resource(parsed)
        else:
            try:
                kubernetes_validate.validate(parsed, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{name}: {exc.caught}") from None
    assert sorted(set(kinds)) == [
        "ConfigMap",
        "DaemonSet",
        "Namespace",
        "PrometheusRule",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]


def test_a_broken_manifest_fails_validation() -> None:
    """The validator is not a rubber stamp: a misspelt field and a wrong type are refused."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    daemon_set = objects()["DaemonSet"]
    container = daemon_set["spec"]["template"]["spec"]["containers"][0]
    container["livenessProbe"]["httpGet"]["paht"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemon_set, KUBERNETES_VERSIONS[-1], strict=True)
    daemon_set = objects()["DaemonSet"]
    daemon_set["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemon_set, KUBERNETES_VERSIONS[-1], strict=True)
    rule = objects()["PrometheusRule"]
    rule["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    rule["spec"]["groups"][0]["rules"][0].pop("record")
    with pytest.raises(AssertionError):
        check_custom_resource(rule)


def test_the_c_emitter_writes_what_pyyaml_s_own_python_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """render uses libyaml's emitter for speed; it must not change a byte of any manifest."""
    if not hasattr(yaml, "CSafeDumper"):
        pytest.skip("this PyYAML was built without libyaml")
    import sparkdiag.kubernetes as kubernetes

    assert kubernetes._Dumper is not kubernetes._PythonDumper
    every = [
        KubernetesOptions(),
        KubernetesOptions(labels={"release": "kps"}, host_pid=True, runtime_class=None),
        # what libyaml writes in other bytes: a character above U+FFFF, a long escaped string
        KubernetesOptions(image="registry.example/sparkdiag:\U0001f600"),
        KubernetesOptions(image="registry.example/" + "x" * 100 + "\x01:1"),
    ]
    fast = [render(obj, options) for options in every for _, obj in manifests(options)]
    monkeypatch.setattr(kubernetes, "_Dumper", kubernetes._PythonDumper)
    slow = [render(obj, options) for options in every for _, obj in manifests(options)]
    assert len(fast) == len(every) * len(manifests(KubernetesOptions())) > len(every)
    assert fast == slow


def test_objects_refer_to_each_other() -> None:
    found = objects(KubernetesOptions(labels={"release": "kps"}, host_pid=True))
    daemon_set, service, monitor = found["DaemonSet"], found["Service"], found["ServiceMonitor"]
    pod = daemon_set["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    assert daemon_set["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= service_ports
    (container,) = pod["spec"]["containers"]
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(container_ports)
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["args"][:3] == ["serve", "--listen", f"0.0.0.0:{container_ports['metrics']}"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {
        m["mountPath"]: m
        for c in [container, *pod["spec"]["initContainers"]]
        for m in c["volumeMounts"]
    }
    assert {m["name"] for m in mounts.values()} <= set(volumes)
    assert mounts["/host/sys"]["readOnly"] is True and volumes["sys"]["hostPath"]["path"] == "/sys"
    assert container["args"][container["args"].index("--path.sysfs") + 1] == "/host/sys"
    state = container["args"][container["args"].index("--state-dir") + 1]
    assert mounts[state]["name"] == "state" and "hostPath" in volumes["state"]
    assert pod["spec"]["serviceAccountName"] == found["ServiceAccount"]["metadata"]["name"]
    assert pod["spec"]["hostPID"] is True
    # GPU nodes as the GPU Operator labels and taints them, no GPU taken from the jobs
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    # the image's user (Containerfile) is the pod's
    user = re.search(r"^USER (\d+):(\d+)$", (ROOT / "Containerfile").read_text(), re.M)
    assert user, "Containerfile has no numeric USER"
    security = pod["spec"]["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"]) == (int(user[1]), int(user[2]))
    assert security["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # the release label that kube-prometheus-stack selects on
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert found[kind]["metadata"]["labels"]["release"] == "kps"
    dashboards = [v for k, v in found.items() if k.startswith("ConfigMap/")]
    assert len(dashboards) == 2
    assert all(d["metadata"]["labels"]["grafana_dashboard"] == "1" for d in dashboards)


def test_options_change_what_they_say() -> None:
    plain = objects()["DaemonSet"]["spec"]["template"]["spec"]
    assert "hostPID" not in plain
    other = objects(KubernetesOptions(runtime_class=None, image="registry.example/sd:1"))
    spec = other["DaemonSet"]["spec"]["template"]["spec"]
    assert "runtimeClassName" not in spec
    assert {c["image"] for c in spec["containers"] + spec["initContainers"]} == {
        "registry.example/sd:1"
    }
    assert "release" not in other["ServiceMonitor"]["metadata"]["labels"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"namespace": "Bad_NS"}, "namespace 'Bad_NS' is not a Kubernetes name"),
        ({"labels": {"release": "a b"}}, "label value 'a b' is not a Kubernetes label value"),
        ({"labels": {"-x": "1"}}, "label key '-x' is not a Kubernetes label key"),
        ({"image": "has space"}, "image 'has space' is not an image reference"),
        # a trailing newline, which a regex's "$" lets through
        ({"namespace": "ns\n"}, "namespace 'ns\\n' is not a Kubernetes name"),
        ({"runtime_class": "nvidia\n"}, "runtime class 'nvidia\\n' is not a Kubernetes name"),
        ({"labels": {"release\n": "1"}}, "label key 'release\\n' is not a Kubernetes label key"),
        ({"labels": {"release": "1\n"}}, "label value '1\\n' is not a Kubernetes label value"),
    ],
)
def test_bad_options_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=re.escape(message)):
        KubernetesOptions(**kwargs)
    with pytest.raises(ManifestError, match="is not KEY=VALUE"):
        parse_labels(["release"])


def test_rules_and_dashboards_are_the_shipped_files() -> None:
    found = objects()
    shipped = yaml.safe_load((ROOT / "prometheus" / "sparkdiag-rules.yml").read_text())
    assert found["PrometheusRule"]["spec"]["groups"] == shipped["groups"]
    for path in sorted((ROOT / "grafana" / "dashboards").glob("*.json")):
        config_map = found[f"ConfigMap/{path.stem}-dashboard"]
        assert config_map["data"] == {path.name: path.read_text()}
        assert len(json.dumps(config_map)) < 262144  # kubectl apply's annotation limit


def test_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    tool = promtool()
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": objects()["PrometheusRule"]["spec"]["groups"]}))
    done = subprocess.run([tool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_committed_manifests_match_the_generator(tmp_path: Path) -> None:
    write_manifests(tmp_path, KubernetesOptions())
    generated = {p.name: p.read_text() for p in sorted(tmp_path.iterdir())}
    if os.environ.get("SPARKDIAG_UPDATE_GOLDEN") == "1":
        COMMITTED.mkdir(exist_ok=True)
        for old in COMMITTED.glob("*.yaml"):
            old.unlink()
        for name, text in generated.items():
            (COMMITTED / name).write_text(text)
    committed = {p.name: p.read_text() for p in sorted(COMMITTED.glob("*.yaml"))}
    assert committed.keys() == generated.keys(), (
        "kubernetes/ differs from `sparkdiag assets --kubernetes`: rewrite it with "
        "SPARKDIAG_UPDATE_GOLDEN=1 python -m pytest tests/test_kubernetes.py"
    )
    for name, text in generated.items():
        assert committed[name] == text, (
            f"kubernetes/{name} drifted from the generator (rules, dashboards or code changed): "
            "rewrite it with SPARKDIAG_UPDATE_GOLDEN=1 python -m pytest tests/test_kubernetes.py"
        )


def test_assets_command_kubernetes_and_plain(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            sparkdiag_cmd("assets", *args), capture_output=True, text=True, cwd=ROOT
        )

    done = run(
        "--kubernetes",
        str(tmp_path / "k8s"),
        "--label",
        "release=kps",
        "--host-pid",
        "--namespace",
        "gpu-monitoring",
    )
    assert done.returncode == 0, done.stderr
    written = [Path(line).name for line in done.stdout.splitlines()]
    assert written[:3] == ["00-namespace.yaml", "01-serviceaccount.yaml", "10-daemonset.yaml"]
    monitor = yaml.safe_load((tmp_path / "k8s" / "30-servicemonitor.yaml").read_text())
    assert monitor["metadata"] == {
        "name": "sparkdiag",
        "namespace": "gpu-monitoring",
        "labels": {**monitor["metadata"]["labels"], "release": "kps"},
    }
    again = run("--kubernetes", str(tmp_path / "k8s"))
    assert again.returncode == 2 and "pass --force" in again.stderr
    plain = run(str(tmp_path / "plain"))
    assert plain.returncode == 0, plain.stderr
    assert (tmp_path / "plain" / "systemd" / "sparkdiag.service").is_file()
    for args, message in (
        (["--label", "release=kps"], "--label applies to Kubernetes manifests: add --kubernetes"),
        (["--kubernetes", "--label", "release"], "label 'release' is not KEY=VALUE"),
        (["--kubernetes", "--namespace", "NO"], "namespace 'NO' is not a Kubernetes name"),
    ):
        bad = run(*args, str(tmp_path / "bad"))
        assert bad.returncode == 2, bad.stderr
        assert message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_a_label_the_manifests_set_themselves_is_refused(tmp_path: Path) -> None:
    """--label app.kubernetes.io/name=gpu replaced the DaemonSet's selector label in its pod
    template (the API server refuses a selector that does not match it) and left the Service
    and ServiceMonitor matching nothing; exit 0 (found in a review)."""
    with pytest.raises(ManifestError, match="the DaemonSet's selector"):
        parse_labels(["app.kubernetes.io/name=gpu"])
    done = subprocess.run(
        sparkdiag_cmd("assets", "--kubernetes", str(tmp_path / "k8s"), "--label",
                      "app.kubernetes.io/name=gpu"),
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "choose another key" in done.stderr
    assert not (tmp_path / "k8s").exists()
    assert parse_labels(["release=kps"]) == {"release": "kps"}
