"""Who a GPU process is: container ids and pod uids from cgroup paths as each runtime writes
them, process identities under a fake root, and the readers ``sparkdiag watch`` uses for a
job's process tree, threads, I/O and the host's memory pressure."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkdiag.snapshot import ProcessIdentity
from sparkdiag.sources.host import cgroup, pressure, procfs
from tests.support import fake_stat

CID = "4c1d5e2f9a7b3c8d0e6f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d"
POD = "3f2e1d0c-b9a8-4f7e-8d6c-5b4a39281706"
POD_ = POD.replace("-", "_")
ROOTFS = Path(__file__).parent / "fixtures" / "rootfs" / "gpu-host"

CGROUPS = [
    # (what, /proc/PID/cgroup, container id, pod uid)
    ("docker, cgroup v2, systemd driver", f"0::/system.slice/docker-{CID}.scope\n", CID, ""),
    ("docker, cgroup v2, cgroupfs driver", f"0::/docker/{CID}\n", CID, ""),
    (
        "docker, cgroup v1 (one line per controller)",
        f"12:pids:/docker/{CID}\n11:memory:/docker/{CID}\n1:name=systemd:/docker/{CID}\n0::/\n",
        CID,
        "",
    ),
    (
        "rootless docker",
        f"0::/user.slice/user-1000.slice/user@1000.service/docker-{CID}.scope\n",
        CID,
        "",
    ),
    (
        "podman rootless, cgroup v2",
        f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container\n",
        CID,
        "",
    ),
    ("podman as root", f"0::/machine.slice/libpod-{CID}.scope/container\n", CID, ""),
    ("podman, cgroupfs manager", f"0::/libpod_parent/libpod-{CID}\n", CID, ""),
    (
        "podman's conmon is not the container",
        f"0::/machine.slice/libpod-conmon-{CID}.scope\n",
        "",
        "",
    ),
    ("containerd (nerdctl), cgroupfs", f"0::/default/{CID}\n", CID, ""),
    ("containerd (nerdctl), systemd", f"0::/system.slice/nerdctl-{CID}.scope\n", CID, ""),
    (
        "kubepods, cgroup v2, systemd driver, containerd, burstable",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_}.slice/"
        f"cri-containerd-{CID}.scope\n",
        CID,
        POD,
    ),
    (
        "kubepods, cgroup v2, systemd driver, cri-o, guaranteed",
        f"0::/kubepods.slice/kubepods-pod{POD_}.slice/crio-{CID}.scope\n",
        CID,
        POD,
    ),
    (
        "kubepods, cri-o's conmon: the pod, no container",
        f"0::/kubepods.slice/kubepods-pod{POD_}.slice/crio-conmon-{CID}.scope\n",
        "",
        POD,
    ),
    (
        "kubepods, cgroup v1, cgroupfs driver, besteffort",
        f"11:memory:/kubepods/besteffort/pod{POD}/{CID}\n10:cpu,cpuacct:/kubepods/besteffort/pod{POD}/{CID}\n",
        CID,
        POD,
    ),
    (
        "kubepods, cgroup v1, systemd driver, docker runtime",
        f"4:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_}.slice/"
        f"docker-{CID}.scope\n",
        CID,
        POD,
    ),
    ("kubepods, cgroup v2, cgroupfs", f"0::/kubepods/pod{POD}/{CID}\n", CID, POD),
    ("a login session", "0::/user.slice/user-1000.slice/session-4.scope\n", "", ""),
    ("a systemd service", "0::/system.slice/sparkdiag.service\n", "", ""),
    ("inside a container's own cgroup namespace", "0::/\n", "", ""),
    ("not a cgroup file", "garbage", "", ""),
]


@pytest.mark.parametrize(
    ("text", "container", "pod"), [c[1:] for c in CGROUPS], ids=[c[0] for c in CGROUPS]
)
def test_container_and_pod_from_cgroup(text: str, container: str, pod: str) -> None:
    assert cgroup.parse(text) == (container, pod)


def test_innermost_container_wins() -> None:
    outer, inner = "a" * 64, "b" * 64
    assert cgroup.container_id(f"/docker/{outer}/docker/{inner}") == inner


def test_short_hex_is_not_a_container_id() -> None:
    assert cgroup.container_id("/system.slice/docker-abc123.scope") == ""


# ---- identities under a fake root ---------------------------------------------------------------


def test_identities_from_the_fake_root() -> None:
    found = procfs.ProcessIdentities(ROOTFS)([4242, 5151, 6161, 7171])
    assert found[4242] == ProcessIdentity("python3", "alice", CID, "")
    assert found[5151].pod_uid == POD and found[5151].user == "root"
    assert found[6161] == ProcessIdentity("llama-server", "bob", "", "")
    assert 7171 not in found  # not under ROOT/proc: another PID namespace


def test_uid_without_a_passwd_entry_is_the_number(tmp_path: Path) -> None:
    base = tmp_path / "proc" / "77"
    base.mkdir(parents=True)
    (base / "comm").write_text("job\n")
    (base / "status").write_text("Name:\tjob\nUid:\t5000\t5001\t5001\t5001\n")
    identity = procfs.process_identity(tmp_path, 77, procfs.passwd_names(tmp_path))
    assert identity == ProcessIdentity("job", "5001", "", "")  # the effective uid, as ps shows


def test_identity_cache_follows_pid_reuse(tmp_path: Path) -> None:
    now = [0.0]
    reader = procfs.ProcessIdentities(tmp_path, clock=lambda: now[0])
    base = tmp_path / "proc" / "88"
    base.mkdir(parents=True)
    (base / "comm").write_text("first\n")
    assert reader([88])[88].name == "first"
    (base / "comm").write_text("renamed\n")
    assert reader([88])[88].name == "first"  # cached while the directory is the same
    now[0] += procfs.IDENTITY_SECONDS
    assert reader([88])[88].name == "renamed"  # read again after a minute
    for f in base.iterdir():
        f.unlink()
    base.rmdir()
    assert reader([88]) == {}  # the process ended
    time.sleep(0.01)
    base.mkdir()
    (base / "comm").write_text("reused\n")
    assert reader([88])[88].name == "reused"  # a new directory: a new process


# ---- a job's process tree, threads and I/O (on the real /proc) ----------------------------------


def test_process_tree_threads_and_io_of_a_real_job(tmp_path: Path) -> None:
    script = (
        "import subprocess, sys, threading, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "open(sys.argv[1], 'wb').write(b'x' * 100000)\n"
        "def spin():\n"
        "    end = time.time() + 30\n"
        "    while time.time() < end: pass\n"
        "threading.Thread(target=spin, name='spinner', daemon=True).start()\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(30)\n"
    )
    job = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "out")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert job.stdout is not None
        child = int(job.stdout.readline())
        root = Path("/")
        assert procfs.process_tree(root, job.pid) == [job.pid, child]
        time.sleep(0.5)
        threads = procfs.thread_times(root, job.pid)
        assert len(threads) >= 2 and job.pid in threads
        tid = max(threads, key=lambda t: threads[t].cpu)
        spinner = threads[tid]
        assert tid != job.pid and spinner.cpu > 0.1  # the spinning thread, not the main one
        assert spinner.runnable is None or spinner.runnable >= spinner.cpu
        io = procfs.process_io(root, job.pid)
        assert io is not None and io["wchar"] >= 100000
        assert procfs.cgroup_v2_path(root, job.pid) is not None or not os.path.exists(
            "/sys/fs/cgroup/cgroup.controllers"
        )
    finally:
        job.kill()
        job.wait()
    assert procfs.process_tree(Path("/"), job.pid) == []


def test_thread_names_with_spaces_and_parentheses(tmp_path: Path) -> None:
    task = tmp_path / "proc" / "5" / "task" / "6"
    task.mkdir(parents=True)
    fields = ["S"] + ["0"] * 10 + ["250", "50"] + ["0"] * 30
    (task / "stat").write_text("6 (pt (data) 1) " + " ".join(fields) + "\n")
    threads = procfs.thread_times(tmp_path, 5)
    assert threads == {6: procfs.ThreadTimes("pt (data) 1", 300 / procfs.CLOCK_TICKS, None)}
    (task / "schedstat").write_text("2500000000 500000000 1234\n")  # ns on a CPU, waiting
    assert procfs.thread_times(tmp_path, 5)[6] == procfs.ThreadTimes("pt (data) 1", 2.5, 3.0)


# ---- pressure ---------------------------------------------------------------------------------

PSI = (
    "some avg10=1.50 avg60=0.80 avg300=0.20 total=2500000\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=500000\n"
)


def test_host_pressure_meminfo_and_swap(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "pressure").mkdir(parents=True)
    (proc / "pressure" / "memory").write_text(PSI)
    (proc / "pressure" / "io").write_text("some avg10=0 avg60=0 avg300=0 total=7000000\n")
    (proc / "meminfo").write_text(
        "MemTotal:       131072000 kB\nMemFree:  1000 kB\nMemAvailable:    65536000 kB\n"
        "SwapTotal:       8388608 kB\nSwapFree:        8000000 kB\n"
    )
    (proc / "vmstat").write_text("nr_free_pages 10\npswpin 12\npswpout 34\n")
    sample = pressure.read_pressure(tmp_path, tmp_path / "sys", cgroup="/user.slice")
    assert sample.scope == "host"  # no cgroup PSI files: the host's
    assert sample.stall_seconds == {"memory_some": 2.5, "memory_full": 0.5, "io_some": 7.0}
    assert sample.memory_bytes["available"] == 65536000 * 1024.0
    assert sample.memory_bytes["swap_total"] == 8388608 * 1024.0
    assert sample.swapped_pages == {"in": 12.0, "out": 34.0}


def test_cgroup_pressure_wins_over_the_host(tmp_path: Path) -> None:
    cg = tmp_path / "sys" / "fs" / "cgroup" / "user.slice" / "job.scope"
    cg.mkdir(parents=True)
    (cg / "memory.pressure").write_text(PSI)
    sample = pressure.read_pressure(tmp_path, tmp_path / "sys", cgroup="/user.slice/job.scope")
    assert sample.scope == "cgroup"
    assert sample.stall_seconds["memory_some"] == 2.5


def test_no_pressure_files_is_empty_not_zero(tmp_path: Path) -> None:
    sample = pressure.read_pressure(tmp_path, tmp_path)
    assert sample.stall_seconds == {} and sample.memory_bytes == {}


def test_status_lines_are_read_by_their_whole_key() -> None:
    """One reader of /proc/PID/status lines serves the uid, the CPU list, py-spy's CapEff and
    the tests' SigCgt: a key is matched whole, the effective uid is the second of four."""
    text = "Name:\tpython\nUidx:\t9\nUid:\t1000\t1001\t1002\t1003\nCpus_allowed_list:\t0-3,8\n"
    assert procfs.status_field(text, "Uid") == "1000\t1001\t1002\t1003"
    assert procfs.status_field(text, "Ui") is None and procfs.status_field("", "Uid") is None
    assert procfs.effective_uid(text) == 1001
    assert procfs.effective_uid("Uid:\t1000\n") is None
    own = Path(f"/proc/{os.getpid()}/status").read_text(encoding="ascii")
    assert procfs.effective_uid(own) == os.geteuid()
    assert procfs.allowed_cpus(Path("/"), os.getpid()) == len(os.sched_getaffinity(0))


def test_the_processes_of_a_cgroup_and_those_below_it(tmp_path: Path) -> None:
    base = tmp_path / "fs" / "cgroup" / "user.slice" / "job.scope"
    (base / "a" / "b").mkdir(parents=True)
    (base / "c").mkdir()
    (base / "cgroup.procs").write_text("100\n")
    (base / "a" / "cgroup.procs").write_text("")  # a cgroup with none of its own
    (base / "a" / "b" / "cgroup.procs").write_text("200\n201\n")
    (base / "c" / "cgroup.procs").write_text("300\n")
    assert pressure.cgroup_processes(tmp_path, "/user.slice/job.scope") == {100, 200, 201, 300}
    assert pressure.cgroup_processes(tmp_path, "/user.slice/job.scope/c") == {300}
    # a cgroup whose list cannot be read: not known, not empty
    assert pressure.cgroup_processes(tmp_path, "/user.slice/gone.scope") is None


def test_the_processes_of_a_cgroup_with_many_below_it_are_read_in_part(tmp_path: Path) -> None:
    base = tmp_path / "fs" / "cgroup" / "big"
    for n in range(pressure.MAX_CGROUPS + 10):
        (base / f"s{n}").mkdir(parents=True)
        (base / f"s{n}" / "cgroup.procs").write_text(f"{1000 + n}\n")
    (base / "cgroup.procs").write_text("1\n")
    found = pressure.cgroup_processes(tmp_path, "/big")
    assert found is not None and 1 in found
    assert len(found) == pressure.MAX_CGROUPS  # its own list and MAX_CGROUPS - 1 below it


def test_the_ancestors_of_a_process(tmp_path: Path) -> None:
    fake_stat(tmp_path, 40, 30)
    fake_stat(tmp_path, 30, 20)
    fake_stat(tmp_path, 20, 1)
    assert procfs.ancestors(tmp_path, 40) == [30, 20, 1]  # pid 1 ends it (its parent is 0)
    fake_stat(tmp_path, 50, 60)  # a parent that cannot be read ends the chain after it
    assert procfs.ancestors(tmp_path, 50) == [60]
    fake_stat(tmp_path, 70, 71)
    fake_stat(tmp_path, 71, 70)  # a loop (a fake tree) ends
    assert procfs.ancestors(tmp_path, 70) == [71]
    assert procfs.ancestors(tmp_path, 99) == []
    assert procfs.ancestors(Path("/"), os.getpid())[0] == os.getppid()


def test_a_process_s_state_and_cpu_ticks(tmp_path: Path) -> None:
    fake_stat(tmp_path, 30, 1, "D", ticks=12)
    assert procfs.process_activity(tmp_path, 30) == ("D", 12)
    fake_stat(tmp_path, 31, 1)  # a line that ends before the times
    assert procfs.process_activity(tmp_path, 31) is None
    assert procfs.process_activity(tmp_path, 99) is None  # gone
    state, ticks = procfs.process_activity(Path("/"), os.getpid()) or ("?", -1)
    assert state == "R" and ticks >= 0  # this process, reading its own stat, runs
