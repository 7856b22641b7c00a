"""The storage probe's measuring program, run as a script in a subprocess by sparkdiag's Python.

It imports the standard library and one module of sparkdiag: the probe worker's ``pages`` room
(standard library only), whose huge-page buffers the worker's storage room reads into too.

``python measure.py DIR --size BYTES --block BYTES --threads N --seconds S`` writes a test file
in DIR and reads it back, then prints one JSON document on stdout (schema below); progress
lines go to stderr. What it does, in order:

1. refuses what would hurt, before it writes a byte: DIR missing, not a directory, a symlink
   (it names where it leads), a block or character device, a read-only filesystem, a
   filesystem without O_DIRECT, one where no file can be created in an existing directory
   (proc; the command refuses every pseudo-filesystem before it starts this program), one that
   would keep less than the margin free after the test file (``--min-free``; by default 5 % of
   its size plus 64 MiB);
2. opens the test file with ``O_TMPFILE`` (Linux 3.11+, ext4, xfs, btrfs, tmpfs): a file with
   no name, which the kernel frees when the last descriptor closes, so that no way out, not
   even SIGKILL, leaves anything behind. Where the filesystem has no ``O_TMPFILE`` it creates
   ``.sparkdiag-storage-PID-RANDOM.tmp`` with ``O_EXCL | O_NOFOLLOW`` (never through a symlink)
   and unlinks it at once, before writing; the document says which it used;
3. reserves the space (``posix_fallocate``, as fio does by default), so that a full filesystem
   fails here and not half way;
4. sequential write: ``--threads`` threads, each writing its own contiguous share of the file
   once, in ``--block`` blocks with ``os.pwrite`` from a page-aligned buffer of random bytes
   (``O_DIRECT`` needs aligned memory; random, so that a compressing controller cannot cheat),
   then one ``fdatasync`` timed apart, and ``posix_fadvise(DONTNEED)`` of the file (where a
   filesystem took ``O_DIRECT`` and cached anyway, what the read then finds in the page cache
   is less; the command tells such reads by the device's counters, storage/evaluate.py). Each
   buffer lies in transparent huge pages where the
   kernel gives them (``--pages huge``, the default), so that a block is one physically
   contiguous piece of memory: a 1 MiB block in 4 KiB pages may reach the device as up to 256
   segments, split into two requests past the queue's ``max_segments``, and on a virtio disk
   that halved the throughput of both this probe and fio by chance of where their buffers fell
   (docs/storage.md, "fio, the reference");
5. sequential read: the same threads read their shares with ``os.preadv`` into aligned buffers,
   again and again until the read's share of ``--seconds`` is spent (at most 8 passes);
6. random reads: one thread, 4 KiB at aligned random offsets of the written part (queue depth
   1, the latency an unbatched reader sees), for the rest of the time or ``--random-ops``;
7. with ``--gpu-worker ARGV`` (a JSON list: the probe worker's command line), the path into the
   GPU: the worker is started with the test file's descriptor and ``--storage-read
   /proc/self/fd/N``, reads the file back into pinned host memory, on into GPU memory, and by
   GPUDirect Storage (probe/worker/storage.py), and its document becomes ``gpu``. It runs in
   this process's group, so whatever kills the probe kills it, and the file, which has no
   name, goes when the last of the two closes it.

Each phase ends at its byte bound or its time bound, whichever comes first: the write gets
45 % of ``--seconds``, the read 35 %, the random reads 20 %. The same flags in fio:
``--ioengine=psync --direct=1 --bs=BLOCK --numjobs=THREADS --iodepth=1 --size=SHARE
--offset_increment=SHARE --fallocate=posix``.

Document (``schema`` ``sparkdiag-storage/1``): ``status`` ok / refused / error, ``reason``,
``directory``, ``tmpfile``, ``size``, ``block``, ``threads``, ``pages`` (``huge`` or ``small``:
what the buffers lay in), ``write`` and ``read`` (``bytes``, ``seconds``), ``flush_seconds``,
``random_read`` (``ops``, ``seconds``, ``block``, ``p50``, ``p99``, ``max``, ``sum`` of the reads'
latencies: seconds), ``bytes_written``, ``gpu`` (the worker's document, or ``status`` error and
``reason`` when it did not give one, or ``status`` skipped and ``reason`` when the write ran
out of time before the file was whole: nothing to read, which is the drive's slowness and no
failure of the path; absent without ``--gpu-worker``), ``notes``.
Exit status 0 ok, 2 refused, 3 error (the GPU path's failure is the ``gpu`` document's, not
the probe's).
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# The folder that holds the sparkdiag that started this program (storage/run.py), taken out of
# the environment that the GPU worker inherits, and off sys.path once the import below is done
ROOT_VARIABLE = "SPARKDIAG_STORAGE_ROOT"
_ROOT = os.environ.pop(ROOT_VARIABLE, "")
if _ROOT:
    sys.path.insert(1, _ROOT)  # after this program's own folder, before another sparkdiag's

# the one sparkdiag module it imports: standard library only, shared with the worker
from sparkdiag.probe.worker.pages import huge_area, in_huge_pages  # noqa: E402

if _ROOT:
    sys.path.remove(_ROOT)

if TYPE_CHECKING:
    import argparse

SCHEMA = "sparkdiag-storage/1"
PROGRESS_PREFIX = "sparkdiag-storage-progress "
MIB = 1 << 20
RANDOM_BLOCK = 4096
SHARES = {"write": 0.45, "read": 0.35, "random": 0.20}
MAX_READ_PASSES = 8
PROGRESS_EVERY = 1.0  # seconds between progress lines
GPU_STARTUP_SECONDS = 60.0  # the worker's own start before its reads: torch, CUDA, kvikio
_NOT_SUPPORTED = (errno.EOPNOTSUPP, errno.EISDIR, errno.ENOTSUP)


class Refused(Exception):
    """Nothing was written: the target would be hurt, or cannot be measured (exit 2)."""


class Failed(Exception):
    """The probe started and could not finish (exit 3); the test file is gone."""


SMALLEST_SIZE = 16 * MIB  # --storage.size's minimum (config's table; a test holds them equal)


def file_size(size: int, threads: int, block: int) -> int:
    """The test file's size for ``--size``: each thread writes a whole number of blocks, so
    ``size`` is rounded down to a multiple of threads x block (40,000,000 bytes with 8 threads
    of 1 MiB blocks: 32 MiB)."""
    return (size // threads) // block * block * threads


def _amount(value: int) -> str:
    """``1 MiB``, ``512 KiB`` (a free space under 1 MiB read ``0 MiB``)."""
    return f"{value / MIB:.0f} MiB" if value >= MIB else f"{value / 1024:.0f} KiB"


def default_margin(total: int) -> int:
    """Bytes a filesystem of ``total`` bytes keeps free after the test file: 5 % plus 64 MiB."""
    return total // 20 + 64 * MIB


def _check_directory(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise Refused(f"{path} does not exist") from None
    except OSError as exc:
        raise Refused(f"cannot look at {path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        raise Refused(
            f"{path} is a symlink to {target}: the probe writes only into the directory it is "
            f"given, not where a link leads; give {os.path.realpath(path)} itself"
        )
    if stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode):
        raise Refused(
            f"{path} is a device: sparkdiag never writes to a raw device; give a directory on a "
            "filesystem of that drive"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{path} is not a directory")


def _check_writable(dirfd: int, path: str) -> None:
    if os.fstatvfs(dirfd).f_flag & os.ST_RDONLY:
        raise Refused(f"{path} is on a read-only filesystem: nothing can be written there")


def _check_space(dirfd: int, path: str, size: int, min_free: int | None, rounded: str = "") -> None:
    """Refuses a test file of ``size`` that would leave less than the margin free, and says
    what would help: a smaller ``--storage.size``, more free space, or, where even the smallest
    test file could never fit (a 1 MiB tmpfs), that the filesystem is too small for the probe:
    "give a smaller --storage.size" was the advice there too (the hostile review)."""
    fs = os.fstatvfs(dirfd)
    total, free = fs.f_blocks * fs.f_frsize, fs.f_bavail * fs.f_frsize
    margin = default_margin(total) if min_free is None else min_free
    if free - size >= margin:
        return
    why = " (5 % of the filesystem plus 64 MiB)" if min_free is None else ""
    smallest = min(size, SMALLEST_SIZE)
    keeps = f"less than the {_amount(margin)} the probe keeps free{why}"
    if total - smallest < margin:
        raise Refused(
            f"{path} is on a filesystem too small for the probe: {_amount(total)} in all, "
            f"{_amount(free)} free, and even the smallest test file ({_amount(smallest)}, "
            f"--storage.size's minimum) would leave {keeps}; measure a directory on a larger "
            "filesystem"
        )
    if free - smallest < margin:
        raise Refused(
            f"{path} has {_amount(free)} free: even the smallest test file ({_amount(smallest)}, "
            f"--storage.size's minimum) would leave {keeps}; free space on it"
        )
    raise Refused(
        f"{path} has {_amount(free)} free: a {_amount(size)} test file{rounded} would leave less "
        f"than {_amount(margin)}{why}; free space or give a smaller --storage.size"
    )


def open_test_file(dirfd: int, path: str, notes: list[str]) -> tuple[int, bool]:
    """The test file, opened ``O_RDWR | O_DIRECT`` and already without a name: (fd, whether it
    is an ``O_TMPFILE``)."""
    flags = os.O_RDWR | os.O_DIRECT | os.O_CLOEXEC
    try:
        return os.open(".", flags | os.O_TMPFILE, 0o600, dir_fd=dirfd), True
    except OSError as exc:
        if exc.errno == errno.EINVAL and _tmpfile_without_direct(dirfd):
            raise Refused(_no_direct(path)) from None
        if exc.errno not in (*_NOT_SUPPORTED, errno.EINVAL):
            raise _open_error(exc, path) from None
    notes.append("no O_TMPFILE on this filesystem: a named file, unlinked before writing")
    name = f".sparkdiag-storage-{os.getpid()}-{os.urandom(6).hex()}.tmp"
    try:
        fd = os.open(name, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise Refused(_no_direct(path)) from None
        raise _open_error(exc, path) from None
    try:
        os.unlink(name, dir_fd=dirfd)
    except OSError as exc:
        os.close(fd)
        try:
            os.unlink(name, dir_fd=dirfd)
        except OSError:
            raise Refused(
                f"cannot remove the test file {os.path.join(path, name)} it just created "
                f"({exc.strerror}): remove it by hand; nothing was written to it"
            ) from None
        raise Refused(f"{path}: a file created there cannot be removed ({exc.strerror})") from None
    return fd, False


def _tmpfile_without_direct(dirfd: int) -> bool:
    try:
        os.close(os.open(".", os.O_RDWR | os.O_TMPFILE | os.O_CLOEXEC, 0o600, dir_fd=dirfd))
    except OSError:
        return False
    return True


def _no_direct(path: str) -> str:
    return (
        f"the filesystem of {path} does not take O_DIRECT: its figures would be the page "
        "cache's, not the drive's"
    )


def _open_error(exc: OSError, path: str) -> Exception:
    if exc.errno == errno.EROFS:
        return Refused(f"{path} is on a read-only filesystem: nothing can be written there")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return Refused(f"cannot create a file in {path}: {exc.strerror} (uid {os.getuid()})")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return Refused(f"{path}: no space left for a test file ({exc.strerror})")
    if exc.errno == errno.ENOENT and os.path.isdir(path):  # proc: no file can be made there
        return Refused(
            f"{path}: its filesystem lets no file be created ({exc.strerror}): give a directory "
            "on a drive's filesystem"
        )
    if exc.errno == errno.ENOENT:
        return Failed(f"{path} was removed before the probe could start")
    return Failed(f"cannot create a test file in {path}: {exc.strerror}")


class _Phase:
    """Counters one phase's threads add to (one slot each) and the progress it prints."""

    def __init__(self, name: str, threads: int, progress: bool) -> None:
        self.name, self.done, self.progress = name, [0] * threads, progress
        self.errors: list[OSError] = []
        self.started = time.monotonic()
        self._next = self.started  # a line as the phase starts, however short it turns out

    def tick(self) -> None:
        now = time.monotonic()
        if self.progress and now >= self._next:
            self._next = now + PROGRESS_EVERY
            say_progress(self.name, sum(self.done), now - self.started)


def say_progress(phase: str, done: int, seconds: float) -> None:
    """One progress line on standard error: the phase, the bytes it has done, its seconds."""
    line = {"phase": phase, "bytes": done, "seconds": seconds}
    sys.stderr.write(PROGRESS_PREFIX + json.dumps(line) + "\n")
    sys.stderr.flush()


def _threads(count: int, body: Callable[[int], None], phase: _Phase) -> float:
    """Run ``body(i)`` in ``count`` threads from one start; seconds until the last ends."""
    start = threading.Barrier(count + 1)

    def run(index: int) -> None:
        start.wait()
        try:
            body(index)
        except OSError as exc:
            phase.errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for worker in workers:
        worker.start()
    phase.tick()
    start.wait()
    began = time.perf_counter()
    phase.started = time.monotonic()
    while alive := [w for w in workers if w.is_alive()]:
        alive[0].join(timeout=0.1)
        phase.tick()
    return time.perf_counter() - began


def _raise_first(phase: _Phase, path: str) -> None:
    if not phase.errors:
        return
    exc = phase.errors[0]
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise Failed(f"{path}: the filesystem filled up during the {phase.name} ({exc.strerror})")
    if exc.errno == errno.EROFS:
        raise Failed(f"{path}: the filesystem turned read-only during the {phase.name}")
    raise Failed(f"{path}: {phase.name} failed: {exc.strerror or exc}")


class Buffers:
    """Page-aligned I/O buffers (``O_DIRECT`` needs aligned memory), each in transparent huge
    pages where ``pages`` is ``huge`` and the kernel gives them: one physically contiguous piece
    per block, whatever else the machine's memory holds. ``pages`` says what they got."""

    def __init__(self, count: int, size: int, pages: str, notes: list[str]) -> None:
        self._areas: list[mmap.mmap] = []
        self.views: list[memoryview] = []
        huge = pages == "huge" and hasattr(mmap, "MADV_HUGEPAGE")
        for _ in range(count):
            if huge:
                area, skip = huge_area(size)
            else:
                area, skip = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), 0
            self._areas.append(area)
            self.views.append(memoryview(area)[skip : skip + size])
        for view in self.views:
            view[:] = os.urandom(size)  # faulted in here, before anything is timed
        self.pages = "small"
        if huge and in_huge_pages(self._areas, size):
            self.pages = "huge"
        elif huge:
            notes.append(
                "no transparent huge pages for the buffers (/sys/kernel/mm/transparent_hugepage/"
                "enabled): 4 KiB pages, which may split each block into more device segments "
                "than a huge page would (docs/storage.md)"
            )

    def close(self) -> None:
        for view in self.views:
            view.release()
        for area in self._areas:
            area.close()


def measure(args: argparse.Namespace, notes: list[str]) -> dict[str, Any]:
    path = os.path.abspath(args.directory)
    _check_directory(path)
    try:
        dirfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise Refused(f"cannot open {path}: {exc.strerror}") from None
    threads, block = args.threads, args.block
    size = file_size(args.size, threads, block)
    share = size // threads
    if share == 0:
        raise Refused(f"--size must be at least --threads x --block ({threads * block} bytes)")
    rounded = ""
    if size != args.size:  # said: the report's sizes are the file's, not the one asked for
        how = f"a multiple of {threads} threads x {_amount(block)} blocks"
        rounded = f" ({args.size} bytes asked for, rounded down to {how})"
        notes.append(
            f"the test file is {_amount(size)} ({size} bytes), not the {args.size} bytes asked "
            f"for: rounded down to {how}, each thread writing whole blocks"
        )
    try:
        _check_writable(dirfd, path)
        fd, tmpfile = open_test_file(dirfd, path, notes)  # no data yet: O_DIRECT, permissions
    except BaseException:
        os.close(dirfd)
        raise
    try:
        _check_space(dirfd, path, size, args.min_free, rounded)
    except BaseException:
        os.close(fd)
        os.close(dirfd)
        raise
    try:
        return _measure_file(args, path, dirfd, fd, tmpfile, share, notes)
    finally:
        os.close(fd)
        os.close(dirfd)


def _gone(dirfd: int, path: str) -> None:
    if os.fstat(dirfd).st_nlink == 0:
        raise Failed(f"{path} was removed while the probe ran; its test file went with it")


def _measure_file(
    args: argparse.Namespace, path: str, dirfd: int, fd: int, tmpfile: bool, share: int,
    notes: list[str],
) -> dict[str, Any]:  # fmt: skip
    size = share * args.threads
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise Failed(
                f"{path}: no room for a {size / MIB:.0f} MiB test file ({exc.strerror})"
            ) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise Failed(f"{path}: cannot reserve the test file: {exc.strerror}") from None
        notes.append("the filesystem cannot reserve space ahead (no fallocate)")
    pool = Buffers(args.threads, args.block, args.pages, notes)
    try:
        return _phases(args, path, dirfd, fd, tmpfile, share, pool, notes)
    finally:
        pool.close()


def _phases(
    args: argparse.Namespace, path: str, dirfd: int, fd: int, tmpfile: bool, share: int,
    pool: Buffers, notes: list[str],
) -> dict[str, Any]:  # fmt: skip
    threads, block, budget = args.threads, args.block, args.seconds
    size = share * threads
    buffers = pool.views
    written = [0] * threads

    def write(index: int) -> None:
        start, deadline = index * share, time.monotonic() + budget * SHARES["write"]
        for offset in range(start, start + share, block):
            os.pwrite(fd, buffers[index], offset)
            written[index] = phase.done[index] = offset + block - start
            if time.monotonic() >= deadline:
                break

    phase = _Phase("write", threads, args.progress)
    write_seconds = _threads(threads, write, phase)
    _raise_first(phase, path)
    if args.progress:  # the write-back of what the page cache still holds may take a while
        say_progress("flush", sum(written), 0.0)
    flush_started = time.perf_counter()
    os.fdatasync(fd)
    flush_seconds = time.perf_counter() - flush_started
    _drop_cached(fd, size)
    _gone(dirfd, path)

    def read(index: int) -> None:
        start, deadline = index * share, time.monotonic() + budget * SHARES["read"]
        view = [buffers[index]]
        for _ in range(MAX_READ_PASSES):
            for offset in range(start, start + written[index], block):
                os.preadv(fd, view, offset)
                phase.done[index] += block
                if time.monotonic() >= deadline:
                    return

    phase = _Phase("read", threads, args.progress)
    read_seconds = _threads(threads, read, phase)
    _raise_first(phase, path)
    read_bytes = sum(phase.done)
    _gone(dirfd, path)
    random_read = _random_reads(
        fd, share, written, budget * SHARES["random"], args.random_ops, args.progress
    )
    _gone(dirfd, path)
    gpu = None if args.gpu_worker is None else gpu_path(args, fd, sum(written) == size)
    return {
        "directory": path,
        "tmpfile": tmpfile,
        "size": size,
        "block": block,
        "threads": threads,
        "pages": pool.pages,
        "write": {"bytes": sum(written), "seconds": write_seconds},
        "flush_seconds": flush_seconds,
        "read": {"bytes": read_bytes, "seconds": read_seconds},
        "random_read": random_read,
        "bytes_written": sum(written),
        **({} if gpu is None else {"gpu": gpu}),
    }


def _drop_cached(fd: int, size: int) -> None:
    """Drop what the page cache holds of the file, written and synced: none where ``O_DIRECT``
    was honoured; where a filesystem cached anyway (ext4 ``data=journal``) the reads find less
    of it there. Dirty or journalled pages stay; nothing fails for it."""
    with contextlib.suppress(OSError, AttributeError):
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED)


def gpu_path(args: argparse.Namespace, fd: int, whole: bool) -> dict[str, Any]:
    """The probe worker's reads of the test file into the GPU (its document), or why not: a
    write that ran out of time leaves no whole file, and the path is ``skipped`` (the drive's
    slowness, which the figures show, not the path's failure: it exited 3 before)."""
    if not whole:
        return {"status": "skipped", "reason": "the write phase ran out of time before the file "
                "was whole: nothing for the GPU path to read"}  # fmt: skip
    try:
        command = [str(part) for part in json.loads(args.gpu_worker)]
    except (ValueError, TypeError):
        return {"status": "error", "reason": "--gpu-worker is not a JSON list"}
    command += ["--storage-read", f"/proc/self/fd/{fd}"]
    if args.progress:
        say_progress("gpu", 0, 0.0)
    try:
        done = subprocess.run(
            command, pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            timeout=args.gpu_timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"status": "error", "reason": f"the GPU path did not finish within "
                f"{args.gpu_timeout:g} s and was killed"}  # fmt: skip
    except OSError as exc:
        return {"status": "error", "reason": f"cannot start the probe worker: {exc.strerror}"}
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        doc = json.loads(lines[-1])
    except (ValueError, IndexError):
        return {"status": "error", "reason": f"the probe worker printed no document (exit "
                f"status {done.returncode})"}  # fmt: skip
    return doc if isinstance(doc, dict) else {"status": "error", "reason": "not a document"}


def _random_reads(
    fd: int, share: int, written: list[int], seconds: float, max_ops: int, progress: bool
) -> dict[str, Any] | None:
    """4 KiB reads at random aligned offsets of what was written, one at a time; with
    ``progress`` a line (phase ``random``, the bytes read) every ``PROGRESS_EVERY`` seconds."""
    extents = [(i * share, n // RANDOM_BLOCK) for i, n in enumerate(written) if n >= RANDOM_BLOCK]
    if not extents or max_ops <= 0:
        return None
    buf = mmap.mmap(-1, RANDOM_BLOCK)
    view = [buf]
    import random  # the program's own: the daemon imports SCHEMA from this module

    rng = random.Random(0x5D)
    latencies: list[int] = []
    began = time.perf_counter()
    first = time.monotonic()
    deadline, next_line = first + seconds, first
    try:
        while len(latencies) < max_ops:
            if not len(latencies) % 64:  # the clock once every 64 reads
                now = time.monotonic()
                if now >= deadline:
                    break
                if progress and now >= next_line:
                    next_line = now + PROGRESS_EVERY
                    say_progress("random", len(latencies) * RANDOM_BLOCK, now - first)
            start, blocks = extents[rng.randrange(len(extents))]
            offset = start + rng.randrange(blocks) * RANDOM_BLOCK
            t0 = time.perf_counter_ns()
            os.preadv(fd, view, offset)
            latencies.append(time.perf_counter_ns() - t0)
    finally:
        buf.close()
    elapsed = time.perf_counter() - began
    latencies.sort()

    def quantile(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] / 1e9

    return {
        "ops": len(latencies), "seconds": elapsed, "block": RANDOM_BLOCK,
        "p50": quantile(0.5), "p99": quantile(0.99), "max": latencies[-1] / 1e9,
        "sum": sum(latencies) / 1e9,
    }  # fmt: skip


def _positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            import argparse

            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return convert


def parse_args(argv: list[str]) -> argparse.Namespace:
    import argparse  # the program's own; sparkdiag's daemon imports only SCHEMA from here

    parser = argparse.ArgumentParser(prog="sparkdiag-storage-measure")
    parser.add_argument("directory")
    parser.add_argument("--size", type=_positive(int), default=1 << 30, help="bytes")
    parser.add_argument("--block", type=_positive(int), default=MIB, help="bytes, 4 KiB multiple")
    parser.add_argument("--threads", type=_positive(int), default=8)
    parser.add_argument("--seconds", type=_positive(float), default=20.0)
    parser.add_argument("--random-ops", type=int, default=20000)
    parser.add_argument("--min-free", type=int, default=None, help="bytes to leave free")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument(
        "--pages",
        choices=("huge", "small"),
        default="huge",
        help="what the buffers lie in (huge: transparent huge pages if given)",
    )
    parser.add_argument(
        "--gpu-worker",
        default=None,
        help="JSON list: the probe worker's command for the path into the GPU",
    )
    parser.add_argument(
        "--gpu-timeout", type=_positive(float), default=120.0, help="seconds the worker may take"
    )
    args = parser.parse_args(argv)
    if args.block % RANDOM_BLOCK:
        parser.error("--block must be a multiple of 4096 (O_DIRECT)")
    return args


ORPHAN_POLL = 0.25  # seconds between looks at the parent


def stop_when_orphaned(parent: int, poll: float = ORPHAN_POLL) -> threading.Thread:
    """A thread that ends the program, and the GPU worker in its process group, when its
    parent is gone (this process is handed to init or a subreaper). The command ends the
    program at Ctrl-C and SIGTERM; killed itself (SIGKILL, or SIGHUP when the terminal
    closed, which does not reach this program in a session of its own), it left the program
    writing and reading for the rest of its time, up to a minute (the hostile review)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        if os.getpgrp() == os.getpid():  # its own group (run.py): the worker goes with it
            os.killpg(os.getpid(), signal.SIGKILL)
        os._exit(3)

    thread = threading.Thread(target=watch, name="orphan-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    stop_when_orphaned(os.getppid())
    notes: list[str] = []
    started = time.time()
    doc: dict[str, Any] = {"schema": SCHEMA, "status": "ok", "reason": None}
    try:
        doc.update(measure(args, notes))
        code = 0
    except Refused as exc:
        doc.update(status="refused", reason=str(exc))
        code = 2
    except Failed as exc:
        doc.update(status="error", reason=str(exc))
        code = 3
    except OSError as exc:
        doc.update(status="error", reason=f"{args.directory}: {exc.strerror or exc}")
        code = 3
    doc.update(notes=notes, started_at=started, finished_at=time.time())
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
