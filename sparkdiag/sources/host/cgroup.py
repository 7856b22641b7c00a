"""Which container and which Kubernetes pod a process runs in, from its cgroup path.

Pure text parsing of ``/proc/PID/cgroup`` (read by :mod:`sparkdiag.sources.host.procfs`), for the
spellings the container runtimes use under cgroup v1 and v2, with the cgroupfs and the systemd
cgroup drivers::

    docker      /docker/<id>                            (cgroupfs, v1 and v2)
                /system.slice/docker-<id>.scope         (systemd driver)
    podman      /machine.slice/libpod-<id>.scope[/container]
                /user.slice/.../user@1000.service/user.slice/libpod-<id>.scope
                /libpod_parent/libpod-<id>              (cgroupfs)
    containerd  /system.slice/cri-containerd-<id>.scope, /<namespace>/<id> (nerdctl, cgroupfs),
                nerdctl-<id>.scope
    cri-o       crio-<id>.scope (but not crio-conmon-<id>.scope, its monitor)
    kubepods    /kubepods/burstable/pod<uid>/<id>                             (cgroupfs)
                /kubepods.slice/kubepods-besteffort.slice/
                    kubepods-besteffort-pod<uid with _>.slice/cri-containerd-<id>.scope (systemd)

A container id is 64 hexadecimal digits (the innermost one in the path wins); a pod uid is a
UUID, written with ``_`` instead of ``-`` in systemd slice names and returned with dashes.
"""

from __future__ import annotations

import re

_CONTAINER = re.compile(
    r"(?:^|/|(?<![a-z])(?:docker|libpod|cri-containerd|containerd|crio|nerdctl)-)"
    r"([0-9a-f]{64})(?:\.scope)?(?=/|$)"
)
_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?=/|$)"
)


def cgroup_paths(text: str) -> list[str]:
    """The paths of a ``/proc/PID/cgroup`` file: ``hierarchy:controllers:path`` per line, the
    cgroup v2 line (``0::``) first."""
    v2: list[str] = []
    v1: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        (v2 if parts[0] == "0" and parts[1] == "" else v1).append(parts[2].strip())
    return v2 + v1


def container_id(path: str) -> str:
    """The innermost container id (64 hex digits) in one cgroup path; "" when none."""
    found = _CONTAINER.findall(path)
    return found[-1] if found else ""


def pod_uid(path: str) -> str:
    """The Kubernetes pod uid in one cgroup path, with dashes; "" when none."""
    found = _POD.findall(path)
    return found[-1].replace("_", "-") if found else ""


def parse(text: str) -> tuple[str, str]:
    """(container id, pod uid) of a ``/proc/PID/cgroup`` file; "" for what it does not name."""
    container = pod = ""
    for path in cgroup_paths(text):
        container = container or container_id(path)
        pod = pod or pod_uid(path)
        if container and pod:
            break
    return container, pod
