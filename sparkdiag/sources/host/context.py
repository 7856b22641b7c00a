"""Where this process runs: natively or in a container, and under which runtime.

The order follows systemd's ``detect_container()`` (``systemd-detect-virt --container``):

1. explicit declarations, each proof on its own, first one wins:
   ``/run/host/container-manager``, the ``container`` variable of this process,
   ``/run/systemd/container``, the ``container`` variable of PID 1 (``/proc/1/environ``).
   (systemd reads its own variable only when it is PID 1; sparkdiag also trusts it when the
   launcher or image set it for this process, as flatpak and some images do);
2. weak signals: ``/run/.containerenv`` (podman), ``/.dockerenv`` (docker), container paths in
   ``/proc/{1,self}/cgroup``, an overlay root filesystem in ``/proc/self/mountinfo``, and
   ``KUBERNETES_SERVICE_HOST``.

Unlike systemd, one weak signal is not enough: the lent H200 VM has ``/.dockerenv`` without
being a container (and PID 1 is not systemd there). That VM also carries
``/run/systemd/container`` naming docker, left in its disk image: systemd writes that file at
boot into ``/run``, a tmpfs, so the file is a declaration only when ``/run`` is a tmpfs mount
(or the mount table cannot be read); on a ``/run`` that lives on the root filesystem it is
stale image content and counts as one weak marker. At least two independent kinds of weak
signal (marker file, cgroup path, overlay root, Kubernetes variable) are needed.

Every path is read relative to ``root`` so a fake tree (``tests/fixtures/rootfs/NAME``) can be
used; nothing here raises for a missing or unreadable file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkdiag.snapshot import ExecutionContext
from sparkdiag.sources.files import MIB, read_limited, read_text_limited

_MANAGER_FILE = "run/host/container-manager"
_SYSTEMD_FILE = "run/systemd/container"
_PID1_ENVIRON = "proc/1/environ"
_CGROUP_FILES = ("proc/1/cgroup", "proc/self/cgroup")
_MOUNTINFO = "proc/self/mountinfo"
_MARKERS = (("run/.containerenv", "podman"), (".dockerenv", "docker"))

_K8S_VARIABLE = "KUBERNETES_SERVICE_HOST"
# Substrings of a cgroup path component -> runtime hint, most specific first.
# "kubepods" (any CRI), "libpod-<id>.scope" (podman), "docker-<id>.scope" or "/docker/<id>",
# "lxc.payload.<name>" or "/lxc/<name>", "cri-containerd-<id>.scope" or "/containerd/...".
_CGROUP_TOKENS = (
    ("kubepods", "kubernetes"),
    ("libpod", "podman"),
    ("docker", "docker"),
    ("lxc", "lxc"),
    ("containerd", "other"),
)
_LAYERED_ROOT_FS = frozenset({"overlay", "fuse-overlayfs", "aufs"})

_NAMED_RUNTIMES = {
    "docker": "docker",
    "podman": "podman",
    "kubernetes": "kubernetes",
    "lxc": "lxc",
    "lxc-libvirt": "lxc",
}
# Explicit names that Kubernetes runs through; a Kubernetes signal names the runtime instead.
_K8S_OVERRIDABLE = frozenset({"docker", "containerd", "oci", "cri-o", "crio", "container-other"})


@dataclass(frozen=True)
class _Weak:
    kind: str  # "marker", "cgroup", "rootfs", "kubernetes": one independent signal per kind
    hint: str  # runtime this signal points at ("other" when it does not say)
    evidence: str


def _show(relative: str) -> str:
    return "/" + relative


def _read_bytes(root: Path, relative: str, notes: list[str]) -> bytes | None:
    """File content, or ``None`` when absent; unreadable files add a note to the evidence."""
    try:
        return read_limited(root / relative, MIB)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        notes.append(f"could not read {_show(relative)} ({exc.strerror or type(exc).__name__})")
        return None


def _first_line(root: Path, relative: str, notes: list[str]) -> str:
    """First line, stripped (systemd's ``read_one_line_file``); ``""`` when absent or empty."""
    data = _read_bytes(root, relative, notes)
    if not data:
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines()
    return _clean(lines[0]) if lines else ""


def _clean(value: str, limit: int = 64) -> str:
    """A value safe to put in an evidence line: printable, bounded."""
    printable = "".join(ch for ch in value.strip() if ch.isprintable())
    return printable[:limit]


def _exists(root: Path, relative: str, notes: list[str]) -> bool:
    try:
        return (root / relative).exists()
    except OSError as exc:
        notes.append(f"could not check {_show(relative)} ({exc.strerror or type(exc).__name__})")
        return False


def _pid1_environ(root: Path, notes: list[str]) -> dict[str, str]:
    data = _read_bytes(root, _PID1_ENVIRON, notes)
    if data is None:
        return {}
    environ: dict[str, str] = {}
    for entry in data.split(b"\0"):
        key, sep, value = entry.decode("utf-8", errors="replace").partition("=")
        if sep and key:
            environ[key] = value
    return environ


def _cgroup_hints(text: str) -> list[tuple[str, str]]:
    """(token, runtime) for each container token in the cgroup paths of ``/proc/PID/cgroup``.

    Lines are ``hierarchy:controllers:path``. Host daemons' own units (``docker.service``,
    ``containerd.service``) are not containers and are ignored.
    """
    found: list[tuple[str, str]] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for component in parts[2].split("/"):
            if not component or component.endswith(".service"):
                continue
            for token, runtime in _CGROUP_TOKENS:
                if token in component and (token, runtime) not in found:
                    found.append((token, runtime))
                    break
    return found


def _mount_fstype(mountinfo: str, mountpoint: str = "/") -> str:
    """Filesystem type of the mount at ``mountpoint`` (the last listed wins: it shadows others).
    ``""`` when nothing is mounted there.

    Line format (proc(5)): ``ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SRC
    SUPEROPTS``.
    """
    fstype = ""
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if sep and len(fields) >= 5 and fields[4] == mountpoint:
            tail_fields = tail.split()
            fstype = tail_fields[0] if tail_fields else ""
    return fstype


def _weak_signals(
    root: Path, environ: Mapping[str, str], pid1: Mapping[str, str], notes: list[str]
) -> list[_Weak]:
    weak: list[_Weak] = []
    for relative, runtime in _MARKERS:
        if _exists(root, relative, notes):
            weak.append(_Weak("marker", runtime, f"{_show(relative)} exists"))
    for relative in _CGROUP_FILES:
        data = _read_bytes(root, relative, notes)
        if data is None:
            continue
        for token, runtime in _cgroup_hints(data.decode("utf-8", errors="replace")):
            weak.append(_Weak("cgroup", runtime, f"{_show(relative)} mentions {token}"))
    mountinfo = _read_bytes(root, _MOUNTINFO, notes)
    if mountinfo is not None:
        fstype = _mount_fstype(mountinfo.decode("utf-8", errors="replace"))
        if fstype in _LAYERED_ROOT_FS:
            evidence = f"{_show(_MOUNTINFO)} shows an {fstype} root filesystem"
            weak.append(_Weak("rootfs", "other", evidence))
    if environ.get(_K8S_VARIABLE):
        evidence = f"{_K8S_VARIABLE} is set in this process's environment"
        weak.append(_Weak("kubernetes", "kubernetes", evidence))
    if pid1.get(_K8S_VARIABLE):
        evidence = f"{_K8S_VARIABLE} is set in {_show(_PID1_ENVIRON)}"
        weak.append(_Weak("kubernetes", "kubernetes", evidence))
    return weak


def _weak_runtime(weak: list[_Weak]) -> str:
    hints = {signal.hint for signal in weak}
    for runtime in ("kubernetes", "podman", "docker", "lxc"):
        if runtime in hints:
            return runtime
    return "other"


def _named_runtime(name: str, weak: list[_Weak]) -> str:
    """METRICS.md runtime for a declared manager name (systemd's ``translate_name``)."""
    lowered = name.lower()
    kubernetes = any(signal.hint == "kubernetes" for signal in weak)
    if kubernetes and lowered in _K8S_OVERRIDABLE:
        return "kubernetes"
    if lowered == "oci":
        # Not a manager: some images hard-code container=oci. Name it from the marker files.
        markers = {signal.hint for signal in weak if signal.kind == "marker"}
        for runtime in ("podman", "docker"):
            if runtime in markers:
                return runtime
        return "other"
    return _NAMED_RUNTIMES.get(lowered, "other")


def _explicit_declarations(
    root: Path, environ: Mapping[str, str], pid1: Mapping[str, str], notes: list[str]
) -> list[tuple[str, str]]:
    """(manager name, evidence) for each explicit declaration, in systemd's order of trust."""
    found: list[tuple[str, str]] = []
    manager = _first_line(root, _MANAGER_FILE, notes)
    if manager:
        found.append((manager, f"{_show(_MANAGER_FILE)} names {manager}"))
    own = _clean(environ.get("container", ""))
    if own:
        found.append((own, f"container={own} in this process's environment"))
    declared = _first_line(root, _SYSTEMD_FILE, notes)
    if declared and _run_is_runtime_dir(root):
        found.append((declared, f"{_show(_SYSTEMD_FILE)} names {declared}"))
    pid1_container = _clean(pid1.get("container", ""))
    if pid1_container:
        found.append((pid1_container, f"container={pid1_container} in {_show(_PID1_ENVIRON)}"))
    return found


def _run_is_runtime_dir(root: Path) -> bool:
    """True when ``/run`` is a tmpfs, or when the mount table cannot be read to tell."""
    try:
        mountinfo = read_text_limited(root / _MOUNTINFO, 4 * MIB)
    except OSError:
        return True
    return _mount_fstype(mountinfo, "/run") == "tmpfs"


def _stale_systemd_file(root: Path, notes: list[str]) -> list[_Weak]:
    declared = _first_line(root, _SYSTEMD_FILE, notes)
    if not declared or _run_is_runtime_dir(root):
        return []
    evidence = f"{_show(_SYSTEMD_FILE)} names {declared}, but /run is not a tmpfs (image leftover)"
    return [_Weak("marker", _NAMED_RUNTIMES.get(declared.lower(), "other"), evidence)]


def detect_context(
    root: Path = Path("/"), environ: Mapping[str, str] | None = None
) -> ExecutionContext:
    """Decide whether this process runs natively or in a container, and under which runtime.

    Unit: none (``context`` is ``native``/``container``; ``runtime`` is ``docker``, ``podman``,
    ``kubernetes``, ``lxc``, ``other`` or ``none``, as in ``sparkdiag_context_info``).
    Compare with ``systemd-detect-virt --container``, which trusts ``/.dockerenv`` alone.
    ``evidence`` lists every signal seen, also for a native verdict.

    ``environ`` is this process's environment (default ``os.environ``); every file is read
    relative to ``root``. Never raises for missing or unreadable files.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    notes: list[str] = []

    pid1 = _pid1_environ(root, notes)
    explicit = _explicit_declarations(root, env, pid1, notes)
    weak = _weak_signals(root, env, pid1, notes) + _stale_systemd_file(root, notes)
    weak_evidence = [signal.evidence for signal in weak]

    if explicit:
        runtime = _named_runtime(explicit[0][0], weak)
        declared = [text for _, text in explicit]
        evidence = tuple(declared + weak_evidence + notes)
        return ExecutionContext(context="container", runtime=runtime, evidence=evidence)

    kinds = {signal.kind for signal in weak}
    if len(kinds) >= 2:
        runtime = _weak_runtime(weak)
        evidence = tuple(weak_evidence + notes)
        return ExecutionContext(context="container", runtime=runtime, evidence=evidence)
    if weak:
        summary = "only one weak signal: " + "; ".join(weak_evidence)
        return ExecutionContext(context="native", runtime="none", evidence=(summary, *notes))
    nothing = "no container signals found"
    return ExecutionContext(context="native", runtime="none", evidence=(nothing, *notes))
