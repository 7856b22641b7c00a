"""Process facts read from procfs, under a configurable root (``--path.rootfs``).

Every path is ``ROOT/proc/PID/...``, so a fake tree can stand in for the machine; nothing here
raises for a process that has gone or a file that cannot be read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sparkdiag.snapshot import ProcessIdentity
from sparkdiag.sources.files import KIB, read_text_limited
from sparkdiag.sources.host import cgroup


def process_names(rootfs: Path, pids: Iterable[int]) -> dict[int, str]:
    """pid -> command name, for the pids whose ``ROOT/proc/PID/comm`` is readable here.

    Unit: none (the kernel's command name, at most 15 characters). Same reading as
    ``cat /proc/PID/comm`` (or ``ps -o comm= -p PID``). Pids that have exited, that this
    process may not see (another PID namespace), or whose name is empty are left out.
    """
    names: dict[int, str] = {}
    for pid in pids:
        try:
            text = read_text_limited(rootfs / "proc" / str(pid) / "comm", 4 * KIB)
        except OSError:
            continue
        if text.strip():
            names[pid] = text.strip()
    return names


# -- process identity (per-process GPU metrics) -----------------------------------------------

IDENTITY_SECONDS = 60.0  # a cached identity is read again after this long (a process may exec)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def passwd_names(rootfs: Path) -> dict[int, str]:
    """uid -> user name from ``ROOT/etc/passwd`` (``getent passwd``); {} when unreadable.

    Read from the root given, not through the C library, so that a sparkdiag in a container with
    the host's root mounted names the host's users."""
    names: dict[int, str] = {}
    for line in (_read(rootfs / "etc" / "passwd") or "").splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[2].isdigit():
            names.setdefault(int(parts[2]), parts[0])
    return names


def status_field(status: str, key: str) -> str | None:
    """The value of line ``key`` in the text of ``/proc/PID/status`` (``Uid``, ``CapEff``,
    ``SigCgt``, ``Cpus_allowed_list`` ...), stripped; None where there is no such line."""
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return value.strip()
    return None


def effective_uid(status: str) -> int | None:
    """The effective uid from the text of ``/proc/PID/status`` (the second of its ``Uid:``
    line's real, effective, saved and filesystem uids)."""
    uids = (status_field(status, "Uid") or "").split()
    return int(uids[1]) if len(uids) >= 2 and uids[1].isdigit() else None


def process_identity(rootfs: Path, pid: int, users: dict[int, str]) -> ProcessIdentity | None:
    """Name, user, container id and pod uid of ``pid``; None when ``ROOT/proc/PID`` is not
    there (the process has gone, or lives in a PID namespace this one cannot see).

    Same reading as ``ps -o comm=,user= -p PID`` and ``cat /proc/PID/cgroup``; each part that
    cannot be read is "" (a process of another user hides nothing of these three files)."""
    base = rootfs / "proc" / str(pid)
    comm = _read(base / "comm")
    status = _read(base / "status")
    if comm is None and status is None:
        return None
    uid = effective_uid(status or "")
    user = "" if uid is None else users.get(uid, str(uid))
    container, pod = cgroup.parse(_read(base / "cgroup") or "")
    return ProcessIdentity(
        name=(comm or "").strip(), user=user, container_id=container, pod_uid=pod
    )


class ProcessIdentities:
    """Identities of GPU processes, cached: a GPU process is asked about on every poll, and its
    name, user and cgroup rarely change. An entry is kept for ``IDENTITY_SECONDS`` while the
    ``ROOT/proc/PID`` directory it was read from stays the same (a reused pid gets a new one)."""

    def __init__(self, rootfs: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.rootfs = rootfs
        self.clock = clock
        self._cache: dict[int, tuple[float, int, ProcessIdentity]] = {}
        self._users: dict[int, str] | None = None
        self._users_at = 0.0

    def _user_names(self, now: float) -> dict[int, str]:
        if self._users is None or now - self._users_at >= IDENTITY_SECONDS:
            self._users = passwd_names(self.rootfs)
            self._users_at = now
        return self._users

    def __call__(self, pids: Iterable[int]) -> dict[int, ProcessIdentity]:
        """pid -> identity for the pids visible under ``ROOT/proc``; the others are left out."""
        now = self.clock()
        found: dict[int, ProcessIdentity] = {}
        for pid in pids:
            try:
                stamp = os.stat(self.rootfs / "proc" / str(pid)).st_ctime_ns
            except OSError:
                self._cache.pop(pid, None)
                continue
            cached = self._cache.get(pid)
            if cached is not None and cached[1] == stamp and now - cached[0] < IDENTITY_SECONDS:
                found[pid] = cached[2]
                continue
            identity = process_identity(self.rootfs, pid, self._user_names(now))
            if identity is None:
                self._cache.pop(pid, None)
                continue
            self._cache[pid] = (now, stamp, identity)
            found[pid] = identity
        return found


# -- a job's process tree, threads and I/O (sparkdiag watch) ----------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def children(rootfs: Path, pid: int) -> list[int]:
    """Direct children of ``pid`` (``ROOT/proc/PID/task/*/children``; ``pgrep -P PID``)."""
    kids: list[int] = []
    try:
        tasks = list((rootfs / "proc" / str(pid) / "task").iterdir())
    except OSError:
        return kids
    for task in tasks:
        text = _read(task / "children")
        if text:
            kids.extend(int(p) for p in text.split() if p.isdigit())
    return kids


def process_tree(rootfs: Path, root: int) -> list[int]:
    """``root`` and all its descendants that exist now, root first (``pstree -p PID``)."""
    if not (rootfs / "proc" / str(root)).is_dir():
        return []
    seen = [root]
    queue = [root]
    while queue:
        for kid in children(rootfs, queue.pop()):
            if kid not in seen:
                seen.append(kid)
                queue.append(kid)
    return seen


def ancestors(rootfs: Path, pid: int) -> list[int]:
    """The parent of ``pid``, its parent and so on (``ps -o ppid``, repeated), up to pid 1 (a
    container's first process: the shell of ``docker run -it``, tini) or to one whose own
    parent cannot be read."""
    found: list[int] = []
    seen = {pid}
    while len(found) < 64:
        fields = process_stat(rootfs, pid)
        if fields is None or len(fields) < 2 or not fields[1].isdigit():
            break
        pid = int(fields[1])
        if pid < 1 or pid in seen:  # a loop (a fake tree) ends too
            break
        found.append(pid)
        seen.add(pid)
        if pid == 1:
            break
    return found


def _stat_fields(text: str) -> tuple[str, list[str]] | None:
    """(comm, fields after it) of a ``/proc/.../stat`` line; comm may hold spaces and ')'."""
    head, sep, rest = text.rpartition(")")
    if not sep or "(" not in head:
        return None
    return head.split("(", 1)[1], rest.split()


PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread


def process_stat(rootfs: Path, pid: int) -> list[str] | None:
    """The fields of ``ROOT/proc/PID/stat`` after the command name, the state first (field N of
    proc(5) is index N - 3); None when it cannot be read (gone, or another namespace's)."""
    parsed = _stat_fields(_read(rootfs / "proc" / str(pid) / "stat") or "")
    return None if parsed is None else parsed[1]


def process_activity(rootfs: Path, pid: int) -> tuple[str, int] | None:
    """``pid``'s state (``R``, ``S``, ``D`` ...) and the clock ticks its threads have run, user
    and system (``ps -o stat,time``: ``/proc/PID/stat`` fields 3, 14 and 15); None where they
    cannot be read."""
    fields = process_stat(rootfs, pid)
    if fields is None or len(fields) < 13 or not (fields[11] + fields[12]).isdigit():
        return None
    return fields[0], int(fields[11]) + int(fields[12])


def start_time(rootfs: Path, pid: int) -> str | None:
    """When ``pid`` started (``/proc/PID/stat``'s field 22, in clock ticks since boot), which
    tells a process from a later one given the same pid; None when it is gone or a zombie."""
    fields = process_stat(rootfs, pid)
    if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def is_kernel_thread(rootfs: Path, pid: int) -> bool:
    """``pid`` is a kernel thread there (``PF_KTHREAD`` in its flags, proc(5) field 9)."""
    fields = process_stat(rootfs, pid)
    try:
        return fields is not None and bool(int(fields[6]) & PF_KTHREAD)
    except (IndexError, ValueError):
        return False


@dataclass(frozen=True)
class ThreadTimes:
    """One thread's times since it started, in seconds.

    cpu: on a CPU, user + system (``ps -L -o tid,comm,time -p PID``; ``ROOT/proc/PID/task/TID/
      schedstat`` first field, in ns, else ``stat`` utime + stime in clock ticks)
    runnable: on a CPU or waiting in a run queue for one (schedstat's first two fields): a
      thread that never sleeps has one second of it per second, however busy the machine is;
      None where the kernel has no schedstat
    """

    name: str
    cpu: float
    runnable: float | None


def thread_times(rootfs: Path, pid: int) -> dict[int, ThreadTimes]:
    """tid -> :class:`ThreadTimes` for every thread of ``pid`` that can be read now."""
    out: dict[int, ThreadTimes] = {}
    try:
        tasks = list((rootfs / "proc" / str(pid) / "task").iterdir())
    except OSError:
        return out
    for task in tasks:
        if not task.name.isdigit():
            continue
        parsed = _stat_fields(_read(task / "stat") or "")
        if parsed is None or len(parsed[1]) < 13:
            continue
        name, fields = parsed
        # fields[0] is the state (stat field 3): utime and stime are stat fields 14 and 15
        cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        runnable = None
        sched = (_read(task / "schedstat") or "").split()
        if len(sched) >= 2 and sched[0].isdigit() and sched[1].isdigit():
            cpu = int(sched[0]) / 1e9
            runnable = (int(sched[0]) + int(sched[1])) / 1e9
        out[int(task.name)] = ThreadTimes(name, cpu, runnable)
    return out


def process_io(rootfs: Path, pid: int) -> dict[str, float] | None:
    """Bytes a process read and wrote since it started (``cat /proc/PID/io``): ``rchar`` and
    ``wchar`` (every read and write call, page cache included) and ``read_bytes`` and
    ``write_bytes`` (what reached or will reach the storage). None when not readable (another
    user's process, without CAP_SYS_PTRACE)."""
    text = _read(rootfs / "proc" / str(pid) / "io")
    if not text:
        return None
    values: dict[str, float] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("rchar", "wchar", "read_bytes", "write_bytes") and value.strip().isdigit():
            values[key] = float(value)
    return values or None


def cgroup_v2_path(rootfs: Path, pid: int) -> str | None:
    """The cgroup v2 path of ``pid`` (``0::/...`` in ``/proc/PID/cgroup``); None without one."""
    for line in (_read(rootfs / "proc" / str(pid) / "cgroup") or "").splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def driver_gpus(rootfs: Path) -> frozenset[str] | None:
    """PCI addresses (``0000:18:00.0``, lower case) of the GPUs the nvidia driver lists in
    ``ROOT/proc/driver/nvidia/gpus``; None where that directory is not readable.

    Same reading as ``ls /proc/driver/nvidia/gpus``. In a container the NVIDIA container
    toolkit mounts only the GPUs the container is given there, while sysfs still lists the
    host's: this is what a container's sysfs count is compared against.
    """
    try:
        return frozenset(e.name.lower() for e in (rootfs / "proc/driver/nvidia/gpus").iterdir())
    except OSError:
        return None


def allowed_cpus(rootfs: Path, pid: int) -> int | None:
    """How many CPUs ``pid`` may run on (``Cpus_allowed_list`` in ``/proc/PID/status``, as
    ``taskset -cp PID`` shows it); None when unreadable. A cgroup CPU quota is not counted."""
    value = status_field(_read(rootfs / "proc" / str(pid) / "status") or "", "Cpus_allowed_list")
    if value is None:
        return None
    count = 0
    for part in value.split(","):
        low, _, high = part.partition("-")
        if not low.strip().isdigit() or (high and not high.strip().isdigit()):
            return None
        count += int(high or low) - int(low) + 1
    return count or None


# -- processes holding the GPU, from /proc (where NVML reports no per-process memory) ---------

NVIDIA_DEVICE = "/dev/nvidia"  # /dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-caps/...


@dataclass(frozen=True)
class DeviceHolder:
    """A process with an NVIDIA device file open.

    devices: the device files it holds open (``/dev/nvidia0``, ``/dev/nvidia-uvm`` ...)
    rss_bytes: its resident memory (``Rss`` of ``/proc/PID/smaps_rollup``, else ``VmRSS`` of
        ``status``); on a unified-memory GPU (GB10) this is memory the GPU cannot have
    mapped_bytes: the size of its mappings of NVIDIA device files (``/proc/PID/maps``): address
        space, not necessarily resident
    None where the file is not readable (another user's process without CAP_SYS_PTRACE).
    """

    pid: int
    name: str
    devices: tuple[str, ...]
    rss_bytes: float | None
    mapped_bytes: float | None


def _open_devices(base: Path) -> tuple[str, ...] | None:
    try:
        fds = list((base / "fd").iterdir())
    except OSError:
        return None
    held = set()
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(NVIDIA_DEVICE):
            held.add(target)
    return tuple(sorted(held))


def _rss(base: Path) -> float | None:
    for name, key in (("smaps_rollup", "Rss:"), ("status", "VmRSS:")):
        for line in (_read(base / name) or "").splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == key and fields[1].isdigit():
                return float(fields[1]) * 1024
    return None


def _device_mappings(base: Path) -> float | None:
    text = _read(base / "maps")
    if text is None:
        return None
    total = 0
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(NVIDIA_DEVICE):
            low, _, high = fields[0].partition("-")
            try:
                total += int(high, 16) - int(low, 16)
            except ValueError:
                continue
    return float(total)


def device_holders(rootfs: Path) -> list[DeviceHolder]:
    """Every process under ``ROOT/proc`` with an NVIDIA device file open, largest RSS first.

    Same reading as ``fuser -v /dev/nvidia*`` (or ``lsof /dev/nvidia*``) with ``ps -o rss``
    and ``grep nvidia /proc/PID/maps``. Costs a readlink per open file of every process: run it
    for a check, not on every poll.
    """
    found = []
    try:
        pids = [int(p.name) for p in (rootfs / "proc").iterdir() if p.name.isdigit()]
    except OSError:
        return []
    for pid in sorted(pids):
        base = rootfs / "proc" / str(pid)
        devices = _open_devices(base)
        if not devices:
            continue
        name = (_read(base / "comm") or "").strip()
        found.append(DeviceHolder(pid, name, devices, _rss(base), _device_mappings(base)))
    return sorted(found, key=lambda h: -(h.rss_bytes or 0.0))


OPEN_FILES_MAX = 256  # descriptors looked at per process (a loader may hold thousands)
_NOT_DATA = ("/dev/", "/proc/", "/sys/", "/run/", "/memfd:")


@dataclass(frozen=True)
class OpenFile:
    """A regular file a process holds open: its path as the process sees it (`` (deleted)``
    removed) and whether it was opened for writing (``O_WRONLY`` or ``O_RDWR``)."""

    path: str
    writing: bool


def open_files(rootfs: Path, pid: int) -> list[OpenFile]:
    """The data files ``pid`` holds open (``ls -l /proc/PID/fd`` and the flags of
    ``/proc/PID/fdinfo/N``): not its standard input, output and error (a log it is redirected
    to), devices, pipes, sockets or ``/proc``, ``/sys``, ``/run``. At most ``OPEN_FILES_MAX``
    descriptors are looked at; [] where they cannot be read."""
    base = rootfs / "proc" / str(pid)
    try:
        fds = sorted((n for n in os.listdir(base / "fd") if n.isdigit() and int(n) > 2), key=int)
    except OSError:
        return []
    found = []
    for fd in fds[:OPEN_FILES_MAX]:
        try:
            target = os.readlink(base / "fd" / fd)
        except OSError:
            continue
        if not target.startswith("/") or target.startswith(_NOT_DATA):
            continue
        flags = 0
        for line in (_read(base / "fdinfo" / fd) or "").splitlines():
            if line.startswith("flags:"):
                try:
                    flags = int(line.split()[1], 8)
                except (IndexError, ValueError):
                    flags = 0
        found.append(
            OpenFile(target.removesuffix(" (deleted)"), bool(flags & (os.O_WRONLY | os.O_RDWR)))
        )
    return found


def environment(rootfs: Path, pid: int, names: Iterable[str]) -> dict[str, str]:
    """The variables ``names`` of ``pid``'s environment as it started (``/proc/PID/environ``:
    the owner's or root's to read); {} where it cannot be read."""
    try:
        raw = (rootfs / "proc" / str(pid) / "environ").read_bytes()[: 1 << 20]
    except OSError:
        return {}
    wanted = set(names)
    found = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep and key in wanted:
            found[key] = value
    return found
