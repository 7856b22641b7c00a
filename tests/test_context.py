"""Execution context detection against fake roots (tests/fixtures/rootfs/NAME)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkdiag.snapshot import ExecutionContext
from sparkdiag.sources.host.context import detect_context

ROOTS = Path(__file__).parent / "fixtures" / "rootfs"
K8S_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
RUNTIMES = {"docker", "podman", "kubernetes", "lxc", "other", "none"}


def _tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


OVERLAY_ROOT = (
    "1101 1036 0:68 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w\n"
    "1102 1101 0:71 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
)
EXT4_ROOT = "29 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
DOCKER_CGROUP = "0::/docker/" + "ab" * 32 + "\n"


@pytest.mark.parametrize(
    ("name", "environ", "context", "runtime"),
    [
        ("native", {}, "native", "none"),
        ("dgx-spark", {}, "native", "none"),  # native's files plus procfs memory readings
        ("dgx-spark-pressure", {}, "native", "none"),
        ("dgx-spark-nccl", {}, "native", "none"),  # dgx-spark's, misconfigured for NCCL
        ("dgx-spark-vllm", {}, "native", "none"),  # page cache, vLLM holding the GPU, libraries
        ("dgx-spark-gdr", {}, "native", "none"),  # GPUDirect RDMA forced on a GB10
        ("gpu-host", {}, "native", "none"),  # native's root plus GPU processes under proc/
        ("lent-vm", {}, "native", "none"),
        ("docker", {}, "container", "docker"),
        ("podman", {}, "container", "podman"),
        ("kubernetes", K8S_ENV, "container", "kubernetes"),
        ("kubernetes", {}, "container", "kubernetes"),  # kubepods cgroup + overlay root
        ("lxc", {}, "container", "lxc"),
        ("nspawn", {}, "container", "other"),
        ("toolbox", {}, "container", "podman"),
    ],
)
def test_fixture_roots(name: str, environ: dict[str, str], context: str, runtime: str) -> None:
    result = detect_context(ROOTS / name, environ)
    assert (result.context, result.runtime) == (context, runtime)
    assert result.evidence
    assert all(isinstance(line, str) and line for line in result.evidence)


# Roots that hold only a kernel log (dev/kmsg) for check's xid row: test_silent_failures and
# test_check_rows cover them; they model no execution context.
KMSG_ROOTS = {
    "xid-critical",
    "xid-warning",
    "xid-info",
    "xid-reset",
    "xid-reset-recurred",
    "xid-reinit",
}


def test_every_fixture_root_is_covered() -> None:
    names = {path.name for path in ROOTS.iterdir() if path.is_dir()}
    for name in KMSG_ROOTS:
        files = [p.relative_to(ROOTS / name) for p in (ROOTS / name).rglob("*") if p.is_file()]
        assert [str(f) for f in files] == ["dev/kmsg"], name
    assert names - KMSG_ROOTS == {
        "native",
        "dgx-spark",
        "dgx-spark-pressure",
        "dgx-spark-nccl",
        "dgx-spark-vllm",
        "dgx-spark-gdr",
        "gpu-host",
        "lent-vm",
        "docker",
        "podman",
        "kubernetes",
        "lxc",
        "nspawn",
        "toolbox",
    }


def test_native_evidence() -> None:
    assert detect_context(ROOTS / "native", {}) == ExecutionContext(
        context="native", runtime="none", evidence=("no container signals found",)
    )


def test_lent_vm_dockerenv_alone_is_native() -> None:
    # CONTEXT.md: the lent H200 VM has /.dockerenv but is not a container.
    assert (ROOTS / "lent-vm" / ".dockerenv").exists()
    # Recorded there on 2026-11-29 (docs/device/2026-11-29-h200-vm-evidence.txt): /.dockerenv and
    # /run/systemd/container naming docker, both left in the disk image; /run on the ext4 root.
    assert detect_context(ROOTS / "lent-vm", {}) == ExecutionContext(
        context="native",
        runtime="none",
        evidence=(
            "only one weak signal: /.dockerenv exists; /run/systemd/container names docker, "
            "but /run is not a tmpfs (image leftover)",
        ),
    )


def test_docker_evidence_names_each_signal() -> None:
    result = detect_context(ROOTS / "docker", {})
    assert result.evidence == (
        "/.dockerenv exists",
        "/proc/1/cgroup mentions docker",
        "/proc/self/cgroup mentions docker",
        "/proc/self/mountinfo shows an overlay root filesystem",
    )


def test_kubernetes_evidence_includes_the_variable() -> None:
    result = detect_context(ROOTS / "kubernetes", K8S_ENV)
    assert "/proc/1/cgroup mentions kubepods" in result.evidence
    assert "KUBERNETES_SERVICE_HOST is set in this process's environment" in result.evidence


def test_explicit_declarations_are_reported() -> None:
    assert detect_context(ROOTS / "podman", {}).evidence[0] == "container=podman in /proc/1/environ"
    assert detect_context(ROOTS / "lxc", {}).evidence == ("container=lxc in /proc/1/environ",)
    assert detect_context(ROOTS / "nspawn", {}).evidence == (
        "/run/systemd/container names systemd-nspawn",
    )
    toolbox = detect_context(ROOTS / "toolbox", {}).evidence
    assert toolbox[0] == "/run/host/container-manager names podman"
    assert "container=oci in /proc/1/environ" in toolbox


# ---- precedence of the explicit declarations ----------------------------------------------


def test_explicit_precedence_order(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "run/host/container-manager": "podman\n",
            "run/systemd/container": "systemd-nspawn\n",
            "proc/1/environ": b"HOME=/\0container=docker\0",
        },
    )
    env = {"container": "lxc"}
    assert detect_context(root, env).runtime == "podman"  # 1. /run/host/container-manager
    (root / "run/host/container-manager").unlink()
    assert detect_context(root, env).runtime == "lxc"  # 2. this process's $container
    assert detect_context(root, {}).runtime == "other"  # 3. /run/systemd/container
    (root / "run/systemd/container").unlink()
    assert detect_context(root, {}).runtime == "docker"  # 4. $container of PID 1
    (root / "proc/1/environ").write_bytes(b"HOME=/\0")
    assert detect_context(root, {}) == ExecutionContext(
        "native", "none", ("no container signals found",)
    )


def test_explicit_declaration_alone_is_proof(tmp_path: Path) -> None:
    run_tmpfs = EXT4_ROOT + "27 29 0:24 / /run rw,nosuid,nodev - tmpfs tmpfs rw,mode=755\n"
    root = _tree(tmp_path, {"run/systemd/container": "docker\n", "proc/self/mountinfo": run_tmpfs})
    assert detect_context(root, {}) == ExecutionContext(
        "container", "docker", ("/run/systemd/container names docker",)
    )


def test_systemd_file_on_a_persistent_run_is_an_image_leftover(tmp_path: Path) -> None:
    # The lent H200 VM: /run lives on the ext4 root, and the image left /run/systemd/container
    # naming docker behind. systemd writes that file into a tmpfs /run at boot, so on a
    # persistent /run it is one weak marker, not a declaration.
    root = _tree(tmp_path, {"run/systemd/container": "docker\n", "proc/self/mountinfo": EXT4_ROOT})
    result = detect_context(root, {})
    assert (result.context, result.runtime) == ("native", "none")
    assert "image leftover" in result.evidence[0]


def test_explicit_declaration_beats_weak_signals(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            ".dockerenv": "",
            "proc/1/cgroup": DOCKER_CGROUP,
            "proc/self/mountinfo": OVERLAY_ROOT,
            "proc/1/environ": b"container=lxc\0",
        },
    )
    result = detect_context(root, {})
    assert (result.context, result.runtime) == ("container", "lxc")
    assert result.evidence[0] == "container=lxc in /proc/1/environ"
    assert "/.dockerenv exists" in result.evidence


@pytest.mark.parametrize(
    ("name", "runtime"),
    [
        ("docker", "docker"),
        ("podman", "podman"),
        ("lxc", "lxc"),
        ("lxc-libvirt", "lxc"),
        ("LXC", "lxc"),
        ("systemd-nspawn", "other"),
        ("wsl", "other"),
        ("containerd", "other"),
        ("proot", "other"),
        ("flatpak", "other"),
        ("oci", "other"),  # no marker file to name it
    ],
)
def test_manager_names_map_to_metric_runtimes(tmp_path: Path, name: str, runtime: str) -> None:
    root = _tree(tmp_path, {"run/host/container-manager": f"{name}\n"})
    assert detect_context(root, {}) == ExecutionContext(
        "container", runtime, (f"/run/host/container-manager names {name}",)
    )


def test_oci_is_named_by_marker_files(tmp_path: Path) -> None:
    # systemd: "oci" is not a manager; the marker files say which one it is.
    root = _tree(tmp_path, {"run/.containerenv": "", "proc/1/environ": b"container=oci\0"})
    assert detect_context(root, {}).runtime == "podman"
    (root / "run/.containerenv").unlink()
    (root / ".dockerenv").write_text("")
    assert detect_context(root, {}).runtime == "docker"


def test_kubernetes_wins_over_docker_and_containerd(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"proc/1/environ": b"container=docker\0"})
    assert detect_context(root, {}).runtime == "docker"
    assert detect_context(root, K8S_ENV).runtime == "kubernetes"
    (root / "proc/1/environ").write_bytes(b"container=containerd\0")
    (root / "proc/1/cgroup").write_text("0::/kubepods.slice/kubepods-besteffort.slice/x\n")
    assert detect_context(root, {}).runtime == "kubernetes"
    (root / "proc/1/environ").write_bytes(b"container=lxc\0")
    assert detect_context(root, {}).runtime == "lxc"  # a named non-CRI manager stays


def test_empty_declarations_are_ignored(tmp_path: Path) -> None:
    files: dict[str, str | bytes] = {
        "run/host/container-manager": "\n",
        "run/systemd/container": "",
        "proc/1/environ": b"container=\0",
    }
    root = _tree(tmp_path, files)
    assert detect_context(root, {"container": ""}).context == "native"


# ---- weak signals -------------------------------------------------------------------------


def test_kubernetes_service_host_alone_is_native() -> None:
    result = detect_context(ROOTS / "native", K8S_ENV)
    assert result == ExecutionContext(
        "native",
        "none",
        ("only one weak signal: KUBERNETES_SERVICE_HOST is set in this process's environment",),
    )


def test_two_weak_signals_make_a_container() -> None:
    # The lent VM's /.dockerenv plus a Kubernetes variable: two independent kinds.
    result = detect_context(ROOTS / "lent-vm", K8S_ENV)
    assert (result.context, result.runtime) == ("container", "kubernetes")
    assert "/.dockerenv exists" in result.evidence


def test_one_kind_seen_twice_is_still_one_signal(tmp_path: Path) -> None:
    files: dict[str, str | bytes] = {
        "proc/1/cgroup": DOCKER_CGROUP,
        "proc/self/cgroup": DOCKER_CGROUP,
        "proc/self/mountinfo": EXT4_ROOT,
    }
    root = _tree(tmp_path, files)
    both = "/proc/1/cgroup mentions docker; /proc/self/cgroup mentions docker"
    assert detect_context(root, {}) == ExecutionContext(
        "native", "none", (f"only one weak signal: {both}",)
    )
    marker_root = _tree(tmp_path / "markers", {".dockerenv": "", "run/.containerenv": ""})
    assert detect_context(marker_root, {}).context == "native"


@pytest.mark.parametrize(
    ("cgroup", "runtime"),
    [
        (DOCKER_CGROUP, "docker"),
        ("0::/system.slice/docker-" + "cd" * 32 + ".scope\n", "docker"),
        ("0::/machine.slice/libpod-" + "ef" * 32 + ".scope/container\n", "podman"),
        ("0::/lxc.payload.spark/system.slice/sparkdiag.service\n", "lxc"),
        ("0::/system.slice/containerd.service/cri-containerd-" + "12" * 32 + ".scope\n", "other"),
        ("11:memory:/kubepods/burstable/pod1234/" + "34" * 32 + "\n0::/\n", "kubernetes"),
    ],
)
def test_cgroup_plus_overlay_names_runtime(tmp_path: Path, cgroup: str, runtime: str) -> None:
    root = _tree(tmp_path, {"proc/self/cgroup": cgroup, "proc/self/mountinfo": OVERLAY_ROOT})
    result = detect_context(root, {})
    assert (result.context, result.runtime) == ("container", runtime)


def test_host_daemon_units_are_not_container_paths(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "proc/self/cgroup": "0::/system.slice/docker.service\n",
            "proc/1/cgroup": "0::/system.slice/containerd.service\n",
            "proc/self/mountinfo": OVERLAY_ROOT,  # a live-CD style overlay root
        },
    )
    overlay = "/proc/self/mountinfo shows an overlay root filesystem"
    assert detect_context(root, {}) == ExecutionContext(
        "native", "none", (f"only one weak signal: {overlay}",)
    )


def test_last_root_mount_wins(tmp_path: Path) -> None:
    mountinfo = EXT4_ROOT + OVERLAY_ROOT
    root = _tree(tmp_path, {"proc/self/mountinfo": mountinfo, ".dockerenv": ""})
    assert detect_context(root, {}).context == "container"
    root2 = _tree(
        tmp_path / "b", {"proc/self/mountinfo": OVERLAY_ROOT + EXT4_ROOT, ".dockerenv": ""}
    )
    assert detect_context(root2, {}).context == "native"


# ---- robustness ---------------------------------------------------------------------------


def test_unreadable_files_never_raise(tmp_path: Path) -> None:
    for relative in (
        "proc/1/environ",
        "proc/1/cgroup",
        "proc/self/cgroup",
        "proc/self/mountinfo",
        "run/host/container-manager",
        "run/systemd/container",
    ):
        (tmp_path / relative).mkdir(parents=True)  # reading a directory raises IsADirectoryError
    result = detect_context(tmp_path, {})
    assert (result.context, result.runtime) == ("native", "none")
    assert result.evidence[0] == "no container signals found"
    assert any(line.startswith("could not read /proc/1/environ") for line in result.evidence)


def test_garbage_content_never_raises(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "proc/1/environ": b"\xff\xfe\0=\0container\0==\0",
            "proc/1/cgroup": b"\xff\n::\n:::\nno colons\n",
            "proc/self/mountinfo": b"\x00 - \n1 2 3\n - \n",
            "run/host/container-manager": b"\xffpodman\x07\n",
        },
    )
    result = detect_context(root, {})
    assert (result.context, result.runtime) == ("container", "other")


def test_missing_root_is_native(tmp_path: Path) -> None:
    assert detect_context(tmp_path / "absent", {}) == ExecutionContext(
        "native", "none", ("no container signals found",)
    )


def test_environ_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("container", "podman")
    assert detect_context(ROOTS / "native").runtime == "podman"
    monkeypatch.delenv("container")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert detect_context(ROOTS / "native").runtime == "none"


def test_real_root_runs() -> None:
    result = detect_context()
    assert result.context in {"native", "container"}
    assert result.runtime in RUNTIMES
    assert (result.runtime == "none") == (result.context == "native")
    assert result.evidence
