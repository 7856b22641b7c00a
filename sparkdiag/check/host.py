"""Host readings that only ``sparkdiag check`` needs: cpufreq governors, the kernel log, the
installed torch (without importing it) and process names.

Each reader takes the configurable root (``--path.sysfs``, ``--path.rootfs``) so fixtures can
stand in for the machine, and never raises for a missing or unreadable file: it returns None or
a reason instead.
"""

from __future__ import annotations

import errno
import importlib.metadata
import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

from sparkdiag.check.model import KernelLog, TorchInfo

KMSG_MAX_RECORDS = 200_000
KMSG_MAX_SECONDS = 2.0
DMESG_TIMEOUT = 3.0

_CPU_DIR = re.compile(r"^cpu(\d+)$")
_TORCH_CUDA = re.compile(r"""^cuda\s*(?::[^=]*)?=\s*(?:['"]([^'"]*)['"]|None)\s*$""", re.M)


def read_governors(sysfs: Path) -> tuple[dict[str, str] | None, str]:
    """cpu -> cpufreq governor (``cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor``).

    Returns (None, reason) when no CPU has a cpufreq governor (a VM without cpufreq, or
    frequency scaling owned by the firmware).
    """
    base = sysfs / "devices" / "system" / "cpu"
    try:
        names = sorted(
            (n for n in os.listdir(base) if _CPU_DIR.match(n)),
            key=lambda n: int(n[3:]),
        )
    except OSError as exc:
        return None, f"no CPU list under {base} ({exc.strerror or exc})"
    governors: dict[str, str] = {}
    for name in names:
        try:
            text = (base / name / "cpufreq" / "scaling_governor").read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            governors[name] = text.strip()
    if not governors:
        return None, f"no cpufreq governor under {base} (a VM, or the firmware owns scaling)"
    return governors, ""


def process_names(rootfs: Path, pids: list[int]) -> dict[int, str]:
    """pid -> command name (``cat /proc/PID/comm``) for the pids that are visible here."""
    names: dict[int, str] = {}
    for pid in pids:
        try:
            text = (rootfs / "proc" / str(pid) / "comm").read_text(
                encoding="utf-8", errors="replace"
            )
        except OSError:
            continue
        if text.strip():
            names[pid] = text.strip()
    return names


def torch_info(python: str = sys.executable) -> TorchInfo:
    """The torch installed for this interpreter, found without importing it.

    ``importlib.metadata.version("torch")`` gives the version; the CUDA it was built for is read
    from the text of ``torch/version.py`` (``cuda: Optional[str] = '13.0'``), so the check never
    pays the seconds an ``import torch`` costs.
    """
    try:
        version: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return TorchInfo(None, None, python)
    cuda: str | None = None
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        try:
            text = (Path(location) / "version.py").read_text(encoding="utf-8")
        except OSError:
            continue
        match = _TORCH_CUDA.search(text)
        if match is not None:
            cuda = match.group(1) or None
            break
    return TorchInfo(version, cuda, python)


def read_kernel_log(rootfs: Path) -> KernelLog:
    """The kernel log since boot (as far as the ring buffer reaches).

    On the real root: ``/dev/kmsg`` read without blocking, else the output of ``dmesg``; both
    need ``kernel.dmesg_restrict=0`` or root. Under a fake root, ``ROOT/dev/kmsg`` is read as a
    plain file of kmsg records or dmesg lines.
    """
    kmsg = rootfs / "dev" / "kmsg"
    if rootfs.resolve() != Path("/"):
        try:
            text = kmsg.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return KernelLog(None, str(kmsg), f"cannot read {kmsg}: {exc.strerror or exc}")
        return KernelLog(tuple(_message(line) for line in text.splitlines()), str(kmsg))
    lines, why = _read_kmsg(kmsg)
    if lines is not None:
        return KernelLog(lines, str(kmsg))
    dmesg_lines, dmesg_why = _read_dmesg()
    if dmesg_lines is not None:
        return KernelLog(dmesg_lines, "dmesg")
    return KernelLog(None, str(kmsg), f"{why}; dmesg: {dmesg_why}")


def _message(record: str) -> str:
    """The text of a kmsg record ("6,1234,5678,-;NVRM: ..."); other lines unchanged."""
    head, sep, text = record.partition(";")
    if sep and re.match(r"^\d+,\d+,\d+", head):
        return text.rstrip("\n")
    return record.rstrip("\n")


def _read_kmsg(path: Path) -> tuple[tuple[str, ...] | None, str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        hint = " (kernel.dmesg_restrict=1? run as root)" if exc.errno in (1, 13) else ""
        return None, f"cannot open {path}: {exc.strerror or exc}{hint}"
    lines: list[str] = []
    deadline = time.monotonic() + KMSG_MAX_SECONDS
    try:
        if not stat.S_ISCHR(os.fstat(fd).st_mode):
            return None, f"{path} is not the kernel's character device"
        while len(lines) < KMSG_MAX_RECORDS and time.monotonic() < deadline:
            try:
                record = os.read(fd, 16384)
            except BlockingIOError:
                break  # the end of the buffer
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # a record was overwritten while we read: skip to the next
                if exc.errno == errno.EINVAL:
                    continue  # a record larger than the buffer
                return None, f"cannot read {path}: {exc.strerror or exc}"
            if not record:
                break
            lines.append(_message(record.decode("utf-8", "replace")))
    finally:
        os.close(fd)
    return tuple(lines), ""


def _read_dmesg() -> tuple[tuple[str, ...] | None, str]:
    command = shutil.which("dmesg")
    if command is None:
        return None, "not installed"
    try:
        done = subprocess.run(
            [command], capture_output=True, timeout=DMESG_TIMEOUT, check=False, text=True
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if done.returncode != 0:
        err = done.stderr.strip().splitlines()
        return None, err[-1] if err else f"exit status {done.returncode}"
    return tuple(done.stdout.splitlines()), ""
