"""Kubernetes manifests for sparkdiag, built as data (dicts) and written as YAML.

One object per file, numbered in the order ``kubectl apply -f DIR`` should create them:
Namespace, ServiceAccount, DaemonSet, Service, ServiceMonitor and PrometheusRule (the
prometheus-operator's ``monitoring.coreos.com/v1`` resources, as kube-prometheus-stack installs
them), and one ConfigMap per Grafana dashboard, labelled ``grafana_dashboard: "1"`` for
Grafana's dashboard sidecar. The PrometheusRule's groups are the shipped rules file
(``prometheus/sparkdiag-rules.yml``) read at generation time, and the dashboards are the shipped
JSON files, so neither can drift from the files that the tests run against Prometheus.

The DaemonSet follows the NVIDIA GPU Operator's conventions: it runs on nodes labelled
``nvidia.com/gpu.present=true`` (set by the operator's GPU feature discovery), tolerates the
``nvidia.com/gpu`` taint, and sees the node's GPUs through the NVIDIA container runtime
(``runtimeClassName: nvidia``, ``NVIDIA_VISIBLE_DEVICES=all``) without requesting any
``nvidia.com/gpu`` resource, as dcgm-exporter does: a monitor must not take a GPU from the jobs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from sparkdiag import __version__
from sparkdiag.config import DEFAULT_PORT
from sparkdiag.errors import UsageError
from sparkdiag.safeyaml import parse_shipped

APP = "sparkdiag"
PORT = DEFAULT_PORT
# The image's user (Containerfile: USER 10942:10942): numeric, so runAsNonRoot can check it.
USER_ID = 10942
STATE_PATH = "/var/lib/sparkdiag"
GPU_NODE_LABEL = "nvidia.com/gpu.present"
GPU_TAINT = "nvidia.com/gpu"
DEFAULT_NAMESPACE = "sparkdiag"
DEFAULT_IMAGE = f"localhost/sparkdiag:{__version__}-probe"
DEFAULT_RUNTIME_CLASS = "nvidia"
SCRAPE_INTERVAL = "15s"  # the dashboards' provisioning assumes 15 s (grafana/provisioning)

# RFC 1123 label (namespace names), and Kubernetes label keys and values; matched whole
# (fullmatch: the "$" of a match let a trailing newline through, a review found).
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")


class ManifestError(UsageError, ValueError):
    """An option that would make invalid manifests; the message says which and why."""


@dataclass(frozen=True)
class KubernetesOptions:
    """What a user chooses; everything else is fixed by the image and the GPU Operator."""

    namespace: str = DEFAULT_NAMESPACE
    image: str = DEFAULT_IMAGE
    # Added to every object; kube-prometheus-stack selects ServiceMonitors and PrometheusRules
    # by its release label (release=<helm release name>).
    labels: Mapping[str, str] = field(default_factory=dict)
    host_pid: bool = False
    runtime_class: str | None = DEFAULT_RUNTIME_CLASS

    def __post_init__(self) -> None:
        if not _DNS_LABEL.fullmatch(self.namespace):
            raise ManifestError(
                f"namespace {self.namespace!r} is not a Kubernetes name "
                "(lower-case letters, digits and '-', at most 63)"
            )
        if not self.image or any(c.isspace() for c in self.image):
            raise ManifestError(f"image {self.image!r} is not an image reference")
        for key, value in self.labels.items():
            if not _LABEL_KEY.fullmatch(key) or len(key.rpartition("/")[2]) > 63:
                raise ManifestError(f"label key {key!r} is not a Kubernetes label key")
            if not _LABEL_VALUE.fullmatch(value):
                raise ManifestError(
                    f"label value {value!r} is not a Kubernetes label value "
                    "(at most 63 letters, digits, '-', '_', '.')"
                )
        if self.runtime_class is not None and not _DNS_LABEL.fullmatch(self.runtime_class):
            raise ManifestError(f"runtime class {self.runtime_class!r} is not a Kubernetes name")


def parse_labels(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["release=kps", ...]`` -> ``{"release": "kps"}``; ManifestError for a malformed one."""
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ManifestError(f"label {item!r} is not KEY=VALUE")
        if key in _selector() or key in _OURS:
            # it replaced the DaemonSet's selector label in its pod template, which the API
            # server refuses, and the Service and ServiceMonitor matched nothing (found in a
            # review)
            raise ManifestError(
                f"label {item!r}: {key} is one the manifests set themselves (the DaemonSet's "
                "selector, or what names the objects); choose another key"
            )
        labels[key] = value
    return labels


def _selector() -> dict[str, str]:
    return {"app.kubernetes.io/name": APP}


_OURS = ("app.kubernetes.io/component", "app.kubernetes.io/version", "app.kubernetes.io/managed-by")


def _labels(options: KubernetesOptions, component: str) -> dict[str, str]:
    return {
        **_selector(),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/version": __version__,
        "app.kubernetes.io/managed-by": "sparkdiag-assets",
        **options.labels,
    }


def _meta(options: KubernetesOptions, name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": options.namespace, "labels": _labels(options, component)}


def _object(api_version: str, kind: str, metadata: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A Kubernetes object: its apiVersion, kind and metadata, then ``fields`` (spec, data, ...)
    in the order given (the order the manifests are written in)."""
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, **fields}


def namespace(options: KubernetesOptions) -> dict[str, Any]:
    """hostPath volumes (/sys, the state) and hostPID need the "privileged" Pod Security level."""
    labels = {
        "pod-security.kubernetes.io/enforce": "privileged",
        **options.labels,
    }
    return _object("v1", "Namespace", {"name": options.namespace, "labels": labels})


def service_account(options: KubernetesOptions) -> dict[str, Any]:
    # sparkdiag never talks to the API server
    return _object(
        "v1", "ServiceAccount", _meta(options, APP, "exporter"), automountServiceAccountToken=False
    )


def daemon_set(options: KubernetesOptions) -> dict[str, Any]:
    drop_all = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    health = {"httpGet": {"path": "/healthz", "port": "metrics"}, "timeoutSeconds": 5}
    pod_spec: dict[str, Any] = {
        "serviceAccountName": APP,
        "automountServiceAccountToken": False,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": GPU_NODE_LABEL, "operator": "In", "values": ["true"]}
                            ]
                        }
                    ]
                }
            }
        },
        "tolerations": [{"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": USER_ID,
            "runAsGroup": USER_ID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # The state directory is a hostPath (baselines are learned per GPU and must outlive
        # the pod); the kubelet creates it owned by root, so it is handed to the image's user.
        "initContainers": [
            {
                "name": "state-owner",
                "image": options.image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["chown", f"{USER_ID}:{USER_ID}", STATE_PATH],
                "securityContext": {
                    "runAsNonRoot": False,
                    "runAsUser": 0,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
                },
                "volumeMounts": [{"name": "state", "mountPath": STATE_PATH}],
                "resources": {
                    "requests": {"cpu": "10m", "memory": "16Mi"},
                    "limits": {"memory": "64Mi"},
                },
            }
        ],
        "containers": [
            {
                "name": APP,
                "image": options.image,
                "imagePullPolicy": "IfNotPresent",
                "args": [
                    "serve",
                    "--listen",
                    f"0.0.0.0:{PORT}",
                    "--path.sysfs",
                    "/host/sys",
                    "--state-dir",
                    STATE_PATH,
                ],
                "env": [
                    # The NVIDIA container runtime hands every GPU of the node to the pod
                    # without a resource request; compute for the probe, utility for NVML.
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                    {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
                    {
                        "name": "NODE_NAME",
                        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                    },
                ],
                "ports": [{"name": "metrics", "containerPort": PORT, "protocol": "TCP"}],
                "livenessProbe": {
                    **health,
                    "periodSeconds": 30,
                    "failureThreshold": 3,
                    "initialDelaySeconds": 10,
                },
                "readinessProbe": {**health, "periodSeconds": 10, "failureThreshold": 2},
                # The daemon takes about 60 MiB; the probe worker (torch with a CUDA context,
                # a few seconds every 5 minutes) takes most of the limit. No CPU limit: CFS
                # throttling would slow the probe's kernel launches and read as a regression.
                "resources": {
                    "requests": {"cpu": "100m", "memory": "256Mi"},
                    "limits": {"memory": "4Gi"},
                },
                "securityContext": {**drop_all, "readOnlyRootFilesystem": True},
                "volumeMounts": [
                    {"name": "sys", "mountPath": "/host/sys", "readOnly": True},
                    {"name": "state", "mountPath": STATE_PATH},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            }
        ],
        "volumes": [
            {"name": "sys", "hostPath": {"path": "/sys", "type": "Directory"}},
            {
                "name": "state",
                "hostPath": {"path": STATE_PATH, "type": "DirectoryOrCreate"},
            },
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        ],
    }
    if options.runtime_class is not None:
        pod_spec = {"runtimeClassName": options.runtime_class, **pod_spec}
    if options.host_pid:
        # NVML names GPU processes by host PID: with the host's PID namespace the daemon can
        # tell its own probe worker from another job's process.
        pod_spec = {"hostPID": True, **pod_spec}
    spec = {
        "selector": {"matchLabels": _selector()},
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        "template": {"metadata": {"labels": _labels(options, "exporter")}, "spec": pod_spec},
    }
    return _object("apps/v1", "DaemonSet", _meta(options, APP, "exporter"), spec=spec)


def service(options: KubernetesOptions) -> dict[str, Any]:
    """Headless: Prometheus scrapes each pod (one per node), nothing is load-balanced."""
    spec = {
        "clusterIP": "None",
        "selector": _selector(),
        "ports": [{"name": "metrics", "port": PORT, "targetPort": "metrics", "protocol": "TCP"}],
    }
    return _object("v1", "Service", _meta(options, APP, "exporter"), spec=spec)


def service_monitor(options: KubernetesOptions) -> dict[str, Any]:
    """``instance`` becomes the node name (the dashboards' and alerts' node identity, stable
    across pod restarts); ``pod`` keeps the pod."""
    spec = {
        "selector": {"matchLabels": _selector()},
        "namespaceSelector": {"matchNames": [options.namespace]},
        "endpoints": [
            {
                "port": "metrics",
                "path": "/metrics",
                "interval": SCRAPE_INTERVAL,
                "scrapeTimeout": "10s",
                "relabelings": [
                    {
                        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                        "targetLabel": "instance",
                        "action": "replace",
                    },
                    {
                        "sourceLabels": ["__meta_kubernetes_pod_name"],
                        "targetLabel": "pod",
                        "action": "replace",
                    },
                ],
            }
        ],
    }
    return _object(
        "monitoring.coreos.com/v1", "ServiceMonitor", _meta(options, APP, "exporter"), spec=spec
    )


def _data(relative: str) -> str:
    return (files("sparkdiag") / "data").joinpath(*relative.split("/")).read_text("utf-8")


def shipped_rule_groups() -> list[dict[str, Any]]:
    """The groups of the shipped rules file, as Prometheus reads them."""
    groups = parse_shipped(_data("prometheus/sparkdiag-rules.yml"))["groups"]
    assert isinstance(groups, list)
    return groups


def prometheus_rule(options: KubernetesOptions) -> dict[str, Any]:
    return _object(
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        _meta(options, APP, "alerting"),
        spec={"groups": shipped_rule_groups()},
    )


def dashboard_names() -> list[str]:
    folder = files("sparkdiag") / "data" / "grafana" / "dashboards"
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))


def dashboard_config_map(options: KubernetesOptions, filename: str) -> dict[str, Any]:
    text = _data(f"grafana/dashboards/{filename}")
    json.loads(text)  # a broken dashboard must not be shipped
    meta = _meta(options, f"{Path(filename).stem}-dashboard", "dashboard")
    meta["labels"] = {**meta["labels"], "grafana_dashboard": "1"}
    # Read by the sidecar when it is told to (kube-prometheus-stack:
    # grafana.sidecar.dashboards.folderAnnotation=grafana_folder).
    meta["annotations"] = {"grafana_folder": APP}
    return _object("v1", "ConfigMap", meta, data={filename: text})


def manifests(options: KubernetesOptions) -> list[tuple[str, dict[str, Any]]]:
    """(file name, object) in apply order."""
    found = [
        ("00-namespace.yaml", namespace(options)),
        ("01-serviceaccount.yaml", service_account(options)),
        ("10-daemonset.yaml", daemon_set(options)),
        ("20-service.yaml", service(options)),
        ("30-servicemonitor.yaml", service_monitor(options)),
        ("40-prometheusrule.yaml", prometheus_rule(options)),
    ]
    for number, name in enumerate(dashboard_names()):
        found.append(
            (f"{50 + number}-dashboard-{Path(name).stem}.yaml", dashboard_config_map(options, name))
        )
    return found


class _Manifest:
    """Block style, keys in the order built, multi-line strings as literal blocks, and every
    value written out (no YAML anchors for objects used twice): what both emitters share."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


class _PythonDumper(_Manifest, yaml.SafeDumper):
    """PyYAML's own emitter, in Python."""


# The same through libyaml's C emitter where PyYAML was built with it: the eight manifests
# come out the same to the byte (tests/test_kubernetes.py), in 0.014 s against 0.61 s in
# PyYAML's own Python, most of it spent choosing a style for the rules and the two dashboards
# (literal blocks of 52, 54 and 160 kB).
_Dumper: type[Any] = _PythonDumper
if hasattr(yaml, "CSafeDumper"):

    class _CDumper(_Manifest, yaml.CSafeDumper):
        """libyaml's emitter."""

    _Dumper = _CDumper


def _str(dumper: yaml.representer.SafeRepresenter, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_EMITTERS: set[type[Any]] = {_PythonDumper, _Dumper}  # one class where libyaml is absent
for _emitter in _EMITTERS:
    _emitter.add_representer(str, _str)


def _dumper(options: KubernetesOptions) -> Any:
    """libyaml's emitter where what the user gave is printable ASCII; PyYAML's own where it is
    not: libyaml escapes a character above U+FFFF in --image (PyYAML writes it as it is) and
    writes a long escaped string on one line (PyYAML folds it), the same YAML in other bytes
    (a review)."""
    given = [options.namespace, options.image, options.runtime_class or ""]
    given += [*options.labels.keys(), *options.labels.values()]
    return (
        _Dumper if all(text.isascii() and text.isprintable() for text in given) else _PythonDumper
    )


def render(obj: Mapping[str, Any], options: KubernetesOptions) -> str:
    header = (
        f"# Generated by `sparkdiag assets --kubernetes` (sparkdiag {__version__}); "
        "regenerate rather than edit.\n"
        f"# namespace={options.namespace} image={options.image} "
        f"host-pid={'yes' if options.host_pid else 'no'} "
        f"runtime-class={options.runtime_class or '-'}"
        + "".join(f" label={k}={v}" for k, v in options.labels.items())
        + "\n"
    )
    body = yaml.dump(
        dict(obj), Dumper=_dumper(options), sort_keys=False, width=100, allow_unicode=True
    )
    return header + body


def write_manifests(target: Path, options: KubernetesOptions, force: bool = False) -> list[Path]:
    """Write every manifest under ``target``; refuses to overwrite unless ``force``."""
    plan = [(target / name, render(obj, options)) for name, obj in manifests(options)]
    existing = [path for path, _ in plan if path.exists()]
    if existing and not force:
        shown = ", ".join(str(p) for p in existing[:3]) + (" ..." if len(existing) > 3 else "")
        raise FileExistsError(f"would overwrite {shown} (pass --force)")
    target.mkdir(parents=True, exist_ok=True)
    for path, text in plan:
        path.write_text(text, encoding="utf-8")
    return [path for path, _ in plan]
