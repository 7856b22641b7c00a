"""``sparkdiag assets``: write the shipped ops files, or Kubernetes manifests, into a folder."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import click

from sparkdiag.errors import SparkdiagError, UsageError
from sparkdiag.flags import path_type
from sparkdiag.kubernetes import (
    DEFAULT_IMAGE,
    DEFAULT_NAMESPACE,
    DEFAULT_RUNTIME_CLASS,
    KubernetesOptions,
    parse_labels,
    write_manifests,
)

_KUBERNETES_ONLY = ("namespace", "image", "label", "host_pid", "runtime_class")


@contextlib.contextmanager
def _writing() -> Iterator[None]:
    """A file that exists without --force is a usage error (exit 2); one that cannot be written
    fails the command (exit 3)."""
    try:
        yield
    except FileExistsError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # "[Errno 20] Not a directory: '...'": Python's words, not ours
        raise SparkdiagError(f"cannot write {exc.filename}: {exc.strerror or exc}") from None


@click.command("assets")
@click.argument("directory", type=path_type(file_okay=False))
@click.option("--force", is_flag=True, help="Overwrite files that already exist.")
@click.option(
    "--kubernetes",
    is_flag=True,
    help="Write Kubernetes manifests instead: DaemonSet, Service, ServiceMonitor, "
    "PrometheusRule and Grafana dashboard ConfigMaps (apply with kubectl apply -f DIRECTORY).",
)
@click.option(
    "--namespace",
    default=None,
    metavar="NAME",
    help=f"Namespace of the manifests [default: {DEFAULT_NAMESPACE}].",
)
@click.option(
    "--image",
    default=None,
    metavar="IMAGE",
    help=f"sparkdiag image built from the Containerfile and pushed where the nodes pull from "
    f"[default: {DEFAULT_IMAGE}].",
)
@click.option(
    "--label",
    multiple=True,
    metavar="KEY=VALUE",
    help="Extra label on every object, repeatable; kube-prometheus-stack selects "
    "ServiceMonitors and PrometheusRules by release=<its Helm release>.",
)
@click.option(
    "--host-pid",
    is_flag=True,
    default=None,
    help="Run in the host's PID namespace, so that GPU processes (host PIDs in NVML) are "
    "told apart from the probe worker.",
)
@click.option(
    "--runtime-class",
    default=None,
    metavar="NAME",
    help=f"RuntimeClass that hands the node's GPUs to the pod; '' for the node's default "
    f"runtime [default: {DEFAULT_RUNTIME_CLASS}, as the GPU Operator installs it].",
)
def assets(
    directory: Path,
    force: bool,
    kubernetes: bool,
    namespace: str | None,
    image: str | None,
    label: tuple[str, ...],
    host_pid: bool | None,
    runtime_class: str | None,
) -> None:
    """Write the shipped Prometheus rules, Grafana dashboards and provisioning files, the
    systemd unit and a commented default config.toml into DIRECTORY (for pip installs); with
    --kubernetes, the Kubernetes manifests instead.

    Exit status: 0 written; 2 a usage error (a file that exists without --force, a bad
    --label, --image, --namespace or --runtime-class); 3 a file cannot be written.
    """
    given = {
        "namespace": namespace,
        "image": image,
        "label": label or None,
        "host_pid": host_pid,
        "runtime_class": runtime_class,
    }
    for name in ("namespace", "image"):  # "" is no name: it silently meant the default
        if given[name] is not None and not str(given[name]).strip():
            raise UsageError(f"--{name} is empty: give a value, or leave the flag out")
    if not kubernetes:
        extra = [name for name in _KUBERNETES_ONLY if given[name] is not None]
        if extra:
            flag = "--" + extra[0].replace("_", "-")
            raise UsageError(f"{flag} applies to Kubernetes manifests: add --kubernetes")
        from sparkdiag.assets import write_assets

        with _writing():
            written = write_assets(directory, force)
    else:
        options = KubernetesOptions(  # ManifestError: a usage error
            namespace=namespace or DEFAULT_NAMESPACE,
            image=image or DEFAULT_IMAGE,
            labels=parse_labels(label),
            host_pid=bool(host_pid),
            runtime_class=DEFAULT_RUNTIME_CLASS if runtime_class is None else runtime_class or None,
        )
        with _writing():
            written = write_manifests(directory, options, force)
    for path in written:
        click.echo(path)
