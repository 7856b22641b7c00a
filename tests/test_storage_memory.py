"""A test file on a tmpfs is held to the memory there is: /proc/meminfo's MemAvailable, and what
this process's memory cgroup may still charge (cgroup v1 and v2, read from trees made in the
test), so that a probe in a memory-limited container is refused in one line, not OOM-killed
(exit 137, nothing said). The last test does it for real, in a cgroup v1 memory group."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from sparkdiag.errors import Exit
from sparkdiag.sources.host.mounts import Mount
from sparkdiag.storage.run import ProbeRequest, StorageProbeError
from sparkdiag.storage.session import Where, _beyond_memory, cgroup_headroom, probe_directory
from sparkdiag.storage.target import StorageTarget
from tests.support import ROOT, sparkdiag_cmd
from tests.support.loopfs import in_cgroup

MIB, GIB = 1 << 20, 1 << 30
V1_UNLIMITED = "9223372036854771712\n"
TMPFS = StorageTarget("/dev/shm/d", Mount("/dev/shm", "tmpfs", "tmpfs", 0, 25, False), None)


def machine(root: Path, cgroup: str, available_gib: float = 24.0) -> tuple[Path, Path]:
    """ROOT/proc/{meminfo,self/cgroup} and an empty cgroup mount: (rootfs, cgroupfs)."""
    (root / "proc" / "self").mkdir(parents=True)
    kib = int(available_gib * (1 << 20))
    (root / "proc" / "meminfo").write_text(f"MemTotal: {2 * kib} kB\nMemAvailable: {kib} kB\n")
    (root / "proc" / "self" / "cgroup").write_text(cgroup)
    cgroupfs = root / "cgroup"
    cgroupfs.mkdir()
    return root, cgroupfs


def group(directory: Path, **files: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("_", ".", 1)).write_text(text)
    return directory


def test_cgroup_v2_limit_less_usage_refuses_and_is_named(tmp_path: Path) -> None:
    rootfs, cgroupfs = machine(tmp_path, "0::/user.slice/job.scope\n")
    group(cgroupfs / "user.slice", memory_max="max\n", memory_current=f"{5 * GIB}\n")
    job = group(cgroupfs / "user.slice" / "job.scope", memory_max=f"{768 * MIB}\n",
                memory_current=f"{64 * MIB}\n")  # fmt: skip
    limit = cgroup_headroom(rootfs, cgroupfs)
    assert limit is not None and limit.headroom == 704 * MIB and limit.limit == 768 * MIB
    assert str(limit) == f"{job}/memory.max is 768 MiB"
    why = _beyond_memory(TMPFS, GIB, rootfs, cgroupfs)
    assert why == (
        "/dev/shm/d is on tmpfs, held in memory: a 1.0 GiB test file would leave less than 1 GiB "
        f"of the 704 MiB this process's memory cgroup may still use ({job}/memory.max is "
        "768 MiB); not even the smallest (16 MiB, --storage.size's minimum) would fit: measure "
        "it where more memory is available"
    )


def test_the_tightest_level_above_counts_and_inactive_cache_is_not_used(tmp_path: Path) -> None:
    """A container's limit is often on a parent of the process's own group; the page cache it
    has not touched lately is freed by reclaim before a tmpfs page fails to charge."""
    rootfs, cgroupfs = machine(tmp_path, "0::/pod/ctr\n")
    pod = group(cgroupfs / "pod", memory_max=f"{4 * GIB}\n", memory_current=f"{3 * GIB}\n",
                memory_stat=f"anon 1\ninactive_file {2 * GIB}\nactive_file 5\n")  # fmt: skip
    group(cgroupfs / "pod" / "ctr", memory_max=f"{8 * GIB}\n", memory_current=f"{1 * GIB}\n")
    limit = cgroup_headroom(rootfs, cgroupfs)
    assert limit is not None and limit.path == pod / "memory.max"
    assert limit.headroom == 4 * GIB - (3 * GIB - 2 * GIB)  # 3 GiB: the cache not counted
    assert _beyond_memory(TMPFS, GIB, rootfs, cgroupfs) is None  # 1 GiB + 1 GiB fits in 3
    why = _beyond_memory(TMPFS, 3 * GIB, rootfs, cgroupfs)
    assert why is not None and "of the 3.0 GiB this process's memory cgroup may still use" in why
    assert why.endswith("; give a smaller --storage.size")


def test_cgroup_v1_memory_controller_in_a_hybrid_layout(tmp_path: Path) -> None:
    cgroup = "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n"
    rootfs, cgroupfs = machine(tmp_path, cgroup)
    group(cgroupfs / "memory", memory_limit_in_bytes=V1_UNLIMITED, memory_usage_in_bytes="9\n")
    group(cgroupfs / "memory" / "process_api", memory_limit_in_bytes=V1_UNLIMITED,
          memory_usage_in_bytes="9\n")  # fmt: skip
    abc = group(cgroupfs / "memory" / "process_api" / "abc",
                memory_limit_in_bytes=f"{2 * GIB}\n", memory_usage_in_bytes=f"{GIB}\n",
                memory_stat=f"inactive_file 7\ntotal_inactive_file {512 * MIB}\n")  # fmt: skip
    group(cgroupfs / "unified")  # v2 beside it, without the memory controller
    limit = cgroup_headroom(rootfs, cgroupfs)
    assert limit is not None and limit.path == abc / "memory.limit_in_bytes"
    assert limit.headroom == 2 * GIB - (GIB - 512 * MIB)
    why = _beyond_memory(TMPFS, GIB, rootfs, cgroupfs)
    assert why is not None and f"({abc}/memory.limit_in_bytes is 2.0 GiB)" in why


def test_no_limit_leaves_memavailable_the_rule(tmp_path: Path) -> None:
    rootfs, cgroupfs = machine(tmp_path, "0::/a\n", available_gib=3.5)
    group(cgroupfs / "a", memory_max="max\n", memory_current="123\n")
    assert cgroup_headroom(rootfs, cgroupfs) is None
    assert _beyond_memory(TMPFS, 2 * GIB, rootfs, cgroupfs) is None
    why = _beyond_memory(TMPFS, 3 * GIB, rootfs, cgroupfs)
    assert why is not None and "of the 3.5 GiB of memory available (whatever its size" in why
    # a path the mount does not have (a container without its own cgroup namespace): the
    # mount's root is the container's group
    rootfs2, cgroupfs2 = machine(tmp_path / "ns", "0::/system.slice/docker-1.scope\n")
    group(cgroupfs2, memory_max=f"{GIB}\n", memory_current="0\n")
    outside = cgroup_headroom(rootfs2, cgroupfs2)
    assert outside is not None and outside.path == cgroupfs2 / "memory.max"
    # nothing readable: no cgroup rule
    assert cgroup_headroom(tmp_path / "none", tmp_path / "none") is None


def test_the_probe_is_refused_before_it_starts(tmp_path: Path) -> None:
    """Through probe_directory, as the command runs it: a refusal (exit 2), nothing written."""
    shm = Path("/dev/shm")
    mountinfo = Path("/proc/self/mountinfo").read_text()
    if " /dev/shm " not in mountinfo or not shm.is_dir():
        pytest.skip("no tmpfs at /dev/shm")
    rootfs, cgroupfs = machine(tmp_path, "0::/job\n")
    (rootfs / "proc" / "self" / "mountinfo").write_text(mountinfo)
    group(cgroupfs / "job", memory_max=f"{1536 * MIB}\n", memory_current="0\n")
    with pytest.raises(StorageProbeError) as raised:
        probe_directory(
            ProbeRequest(shm, size=GIB, seconds=2), Where(rootfs=rootfs, cgroupfs=cgroupfs)
        )
    assert raised.value.exit_code == Exit.USAGE
    assert "of the 1.5 GiB this process's memory cgroup may still use" in raised.value.message


@pytest.mark.storage
def test_a_tmpfs_probe_in_a_memory_limited_cgroup_is_refused_not_killed(tmp_path: Path) -> None:
    """For real: a cgroup v1 memory group of 768 MiB, 'sparkdiag storage /dev/shm/DIR' with a
    1 GiB test file. Before, the kernel's OOM killer ended it: exit 137, nothing on stdout."""
    memory = Path("/sys/fs/cgroup/memory")
    if os.geteuid() != 0 or not (memory / "memory.limit_in_bytes").exists():
        pytest.skip("needs root and the cgroup v1 memory controller at /sys/fs/cgroup/memory")
    if " /dev/shm " not in Path("/proc/self/mountinfo").read_text():
        pytest.skip("no tmpfs at /dev/shm")
    limited = memory / f"sparkdiag-test-{os.getpid()}"
    target = Path("/dev/shm") / f"sparkdiag-test-{os.getpid()}"
    limited.mkdir()
    target.mkdir()
    try:
        (limited / "memory.limit_in_bytes").write_text(str(768 * MIB))
        argv = sparkdiag_cmd("storage", str(target), "--no-record", "--storage.size", "1G",
                             "--storage.duration", "4", "--state-dir", str(tmp_path))  # fmt: skip
        done = subprocess.run(
            in_cgroup(limited, argv), capture_output=True, text=True, timeout=120, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
        )  # fmt: skip
        assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
        assert done.stderr.startswith(f"Error: refused: {target} is on tmpfs, held in memory")
        assert f"({limited}/memory.limit_in_bytes is 768 MiB)" in done.stderr
        assert list(target.iterdir()) == []
    finally:
        target.rmdir()
        with contextlib.suppress(OSError):
            limited.rmdir()
