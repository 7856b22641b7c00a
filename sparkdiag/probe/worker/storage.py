"""The path from a drive into the GPU (``--storage-read FILE``): the storage probe's sequential
reads again, into pinned host memory, on into GPU memory, and by GPUDirect Storage.

``sparkdiag storage --gpu N`` runs it after the host phases, on the test file the measuring
program (storage/measure.py) has just written and hands over by descriptor (``FILE`` is then
``/proc/self/fd/N``: the file has no name, and goes when the last process holding it ends, the
worker killed or not). The worker only reads; any file of at least ``--storage-threads`` x
``--storage-block`` bytes will do. Three stages, each as the host probe reads (``--storage-threads``
threads, each its own contiguous share in ``--storage-block`` reads with ``O_DIRECT``, pass after
pass, at most :data:`STORAGE_MAX_PASSES` or its part of ``--storage-seconds``):

- ``pinned``: into page-locked host memory: buffers laid out as the host probe's (transparent
  huge pages where given) and registered with CUDA (``cudaHostRegister``), so that this stage
  differs from the host read only by the pinning;
- ``gpu``: the same, each block copied on into GPU memory as soon as it is read (two buffers per
  thread, a CUDA stream each: the next read overlaps the copy), the time ending when the last
  copy has landed: what a loader that reads into pinned memory delivers to the GPU;
- ``gds``: cuFile reads straight into GPU memory (kvikio, ``pip install 'sparkdiag[gds]'`` beside
  torch), one ``raw_read`` per block per thread. ``mode`` says whether it was GPUDirect Storage
  (``gds``) or a compatibility mode (``compat``: POSIX reads through a bounce buffer, then a copy:
  KvikIO's own when it is set so or finds no libcufile, cuFile's when the nvidia-fs kernel driver
  is not loaded or does not take the file), and why.

Each copying stage checks its data once: the first block as it arrived in GPU memory against the
same block read into host memory. Without a CUDA device every stage is unsupported and says why.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from sparkdiag.probe.worker.dtypes import DeviceInfo
from sparkdiag.probe.worker.nvml import Nvml
from sparkdiag.probe.worker.pages import huge_area, in_huge_pages, map_address

STORAGE_MAX_PASSES = 8  # as the host probe's read (storage/measure.py MAX_READ_PASSES)
NVFS_STATS = "/proc/driver/nvidia-fs/stats"  # the GDS kernel driver's counters, where loaded
STAGES = ("pinned", "gpu", "gds")


class StorageStageError(Exception):
    """A stage could not run; its message is the stage's reason."""


def storage_stage(path: str) -> dict[str, Any]:
    """A stage's entry in the document, every key present."""
    return {
        "path": path, "status": "unsupported", "reason": None, "bytes": 0, "seconds": None,
        "mode": None, "mode_reason": None, "checked": None, "kvikio": None,
    }  # fmt: skip


def run_storage_read(
    info: DeviceInfo, args: argparse.Namespace, nvml: Nvml | None, doc: dict[str, Any]
) -> None:
    """Read ``args.storage_read`` along each path into the GPU; fills ``doc["storage"]`` and
    the document's status."""
    del nvml  # the mode needs no NVML: the busy check before it has used it
    doc["suite"] = "storage"
    section: dict[str, Any] = {
        "file": args.storage_read, "size": 0, "block": args.storage_block,
        "threads": args.storage_threads, "seconds": args.storage_seconds, "pages": None,
        "stages": [storage_stage(p) for p in STAGES if p != "gds" or args.storage_gds],
    }  # fmt: skip
    doc["storage"] = section
    try:
        fd = os.open(args.storage_read, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError as exc:
        doc["status"] = "error"
        doc["reason"] = f"cannot open {args.storage_read} with O_DIRECT: {exc.strerror}"
        return
    try:
        _read_file(info, args, fd, section)
    finally:
        os.close(fd)
    doc["status"], doc["reason"] = storage_status(section["stages"])


def storage_status(stages: list[dict[str, Any]]) -> tuple[str, str | None]:
    """ok when a stage measured and none failed; error naming the failed ones; unsupported."""
    failed = [s for s in stages if s["status"] == "error"]
    if failed:
        return "error", "; ".join(f"{s['path']}: {s['reason']}" for s in failed)
    if any(s["status"] == "ok" for s in stages):
        return "ok", None
    reasons = {s["reason"] for s in stages if s["reason"]}
    return "unsupported", "; ".join(sorted(reasons)) or "nothing to read"


def _read_file(
    info: DeviceInfo, args: argparse.Namespace, fd: int, section: dict[str, Any]
) -> None:
    threads, block = args.storage_threads, args.storage_block
    size = os.fstat(fd).st_size
    if args.storage_size is not None:
        size = min(size, args.storage_size)
    share = size // threads // block * block
    stages = section["stages"]
    if share == 0:
        for stage in stages:
            stage["reason"] = f"the file holds less than {threads} x {block} bytes"
        return
    section["size"] = share * threads
    if not info.is_cuda:
        for stage in stages:
            stage["reason"] = (
                "no CUDA device: pinned host memory, the copy into GPU memory and cuFile need one"
            )
        return
    seconds = args.storage_seconds / len(stages)
    try:
        host = StorageHostBuffers(info.torch, 2 * threads, block)
    except Exception as exc:
        for stage in stages:
            stage.update(status="error", reason=f"host buffers: {type(exc).__name__}: {exc}")
        return
    section["pages"] = host.pages
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "pinned": lambda: storage_pinned(fd, share, threads, block, seconds, host),
        "gpu": lambda: storage_to_gpu(info, fd, share, threads, block, seconds, host),
        "gds": lambda: storage_gds(info, args.storage_read, fd, share, threads, block, seconds),
    }
    try:
        for stage in stages:
            _run_stage(stage, runs[stage["path"]])
    finally:
        host.close()


def _run_stage(stage: dict[str, Any], run: Callable[[], dict[str, Any]]) -> None:
    try:
        stage.update(status="ok", **run())
    except StorageStageError as exc:
        stage.update(status="unsupported", reason=str(exc))
    except OSError as exc:
        stage.update(status="error", reason=f"read failed: {exc.strerror or exc}")
    except Exception as exc:  # torch, CUDA or kvikio: the stage fails, the others still run
        stage.update(status="error", reason=f"{type(exc).__name__}: {str(exc)[:300]}")


# --------------------------------------------------------------------------
# host memory


class StorageHostBuffers:
    """``count`` page-aligned host buffers of ``size`` bytes in transparent huge pages where the
    kernel gives them (as the host probe's: one physically contiguous piece per block), each
    registered with CUDA as page-locked; ``views`` to read into, ``tensors`` to copy from.
    Where registering fails, torch's own pinned memory (``pages`` then says ``torch``)."""

    def __init__(self, torch: Any, count: int, size: int) -> None:
        self._torch = torch
        self._areas: list[mmap.mmap] = []
        self._starts: list[int] = []
        self._registered: list[int] = []
        self.views: list[memoryview] = []
        self.tensors: list[Any] = []
        for _ in range(count):
            area, skip = huge_area(size)
            self._areas.append(area)
            self._starts.append(map_address(area) + skip)
            view = memoryview(area)[skip : skip + size]
            view[:] = bytes(size)  # faulted in now, not while timed
            self.views.append(view)
        self.pages = "huge" if in_huge_pages(self._areas, size) else "small"
        try:
            cudart = torch.cuda.cudart()
            for address, view in zip(self._starts, self.views, strict=True):
                if _cuda_code(cudart.cudaHostRegister(address, len(view), 0)) != 0:
                    raise StorageStageError("cudaHostRegister failed")
                self._registered.append(address)
                self.tensors.append(torch.frombuffer(view, dtype=torch.uint8))
        except Exception:
            self._unregister()
            self.tensors = [torch.empty(size, dtype=torch.uint8, pin_memory=True)
                            for _ in range(count)]  # fmt: skip
            self.views = [
                memoryview((ctypes.c_char * size).from_address(t.data_ptr())).cast("B")
                for t in self.tensors
            ]
            self.pages = "torch"

    def _unregister(self) -> None:
        cudart = self._torch.cuda.cudart()
        for address in self._registered:
            cudart.cudaHostUnregister(address)
        self._registered = []

    def close(self) -> None:
        if self._registered:
            self._torch.cuda.synchronize()
            self._unregister()
        self.tensors = []
        # one still exported (a tensor someone holds) is left to the garbage collector
        for view in self.views:
            with contextlib.suppress(BufferError):
                view.release()
        for area in self._areas:
            with contextlib.suppress(BufferError):
                area.close()
        self.views, self._areas = [], []


def _cuda_code(value: Any) -> int:
    return int(getattr(value, "value", value))


# --------------------------------------------------------------------------
# the reads


def storage_sequential(
    threads: int,
    share: int,
    block: int,
    seconds: float,
    step: Callable[[int, int, int], None],
    begin: Callable[[int], None] | None = None,
    end: Callable[[int], None] | None = None,
) -> tuple[int, float]:
    """``threads`` threads from one start; thread ``i`` calls ``step(i, n, offset)`` for its
    ``n``-th block, at the offsets of its share ``[i * share, (i + 1) * share)`` in turn, pass
    after pass, until ``seconds`` or :data:`STORAGE_MAX_PASSES` passes; ``begin(i)`` before the
    start, ``end(i)`` after its last block (timed: a copy still in flight counts). Bytes and
    seconds; the first error of a thread is raised."""
    errors: list[BaseException] = []
    done = [0] * threads
    start = threading.Barrier(threads + 1)

    def run(index: int) -> None:
        try:
            if begin is not None:
                begin(index)
        except BaseException as exc:
            errors.append(exc)
        start.wait()
        if errors:
            return
        try:
            deadline = time.monotonic() + seconds
            offsets = range(index * share, (index + 1) * share, block)
            n = 0
            for _ in range(STORAGE_MAX_PASSES):
                for offset in offsets:
                    step(index, n, offset)
                    n += 1
                    done[index] += block
                    if time.monotonic() >= deadline:
                        break
                else:
                    continue
                break
            if end is not None:
                end(index)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return sum(done), elapsed


def _read_exactly(fd: int, view: memoryview, offset: int) -> None:
    got = os.preadv(fd, [view], offset)
    if got != len(view):
        raise OSError(f"short read: {got} of {len(view)} bytes at {offset}")


def storage_pinned(
    fd: int, share: int, threads: int, block: int, seconds: float, host: StorageHostBuffers
) -> dict[str, Any]:
    """The reads into page-locked host memory, one buffer per thread."""

    def step(index: int, n: int, offset: int) -> None:
        _read_exactly(fd, host.views[index], offset)

    moved, elapsed = storage_sequential(threads, share, block, seconds, step)
    return {"bytes": moved, "seconds": elapsed}


class StorageCopies:
    """Each thread's two host buffers, copied into its own GPU block on its own stream: a read
    into a buffer waits for that buffer's last copy (its event), not for the other one."""

    def __init__(self, info: DeviceInfo, threads: int, block: int, host: StorageHostBuffers):
        torch = info.torch
        self.torch, self.host, self.index = torch, host, torch.device(info.device).index or 0
        self.streams = [torch.cuda.Stream(info.device) for _ in range(threads)]
        self.events = [[torch.cuda.Event(), torch.cuda.Event()] for _ in range(threads)]
        self.blocks = [torch.empty(block, dtype=torch.uint8, device=info.device)
                       for _ in range(threads)]  # fmt: skip

    def begin(self, index: int) -> None:
        self.torch.cuda.set_device(self.index)  # the current device is per thread

    def buffer(self, index: int, n: int) -> int:
        return 2 * index + n % 2

    def wait(self, index: int, n: int) -> None:
        self.events[index][n % 2].synchronize()

    def copy(self, index: int, n: int) -> None:
        stream = self.streams[index]
        with self.torch.cuda.stream(stream):
            self.blocks[index].copy_(self.host.tensors[self.buffer(index, n)], non_blocking=True)
            self.events[index][n % 2].record(stream)

    def end(self, index: int) -> None:
        self.streams[index].synchronize()


def storage_to_gpu(
    info: DeviceInfo, fd: int, share: int, threads: int, block: int, seconds: float,
    host: StorageHostBuffers,
) -> dict[str, Any]:  # fmt: skip
    """Each block read into pinned memory and copied on into GPU memory at once."""
    copies = StorageCopies(info, threads, block, host)

    def step(index: int, n: int, offset: int) -> None:
        copies.wait(index, n)
        _read_exactly(fd, host.views[copies.buffer(index, n)], offset)
        copies.copy(index, n)

    moved, elapsed = storage_sequential(
        threads, share, block, seconds, step, copies.begin, copies.end
    )
    _read_exactly(fd, host.views[0], 0)  # the check: block 0 through the same path
    copies.copy(0, 0)
    copies.end(0)
    return {"bytes": moved, "seconds": elapsed,
            "checked": storage_same(info, copies.blocks[0], fd, block)}  # fmt: skip


def storage_same(info: DeviceInfo, on_gpu: Any, fd: int, block: int) -> bool:
    """Whether ``on_gpu`` holds the file's first block (read again into host memory)."""
    torch = info.torch
    area = mmap.mmap(-1, block, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        view = memoryview(area)
        _read_exactly(fd, view, 0)
        expected = torch.frombuffer(view, dtype=torch.uint8)
        same = bool(torch.equal(on_gpu.cpu(), expected))
        del expected
        view.release()
        return same
    finally:
        area.close()


# --------------------------------------------------------------------------
# GPUDirect Storage


def storage_gds(
    info: DeviceInfo, path: str, fd: int, share: int, threads: int, block: int, seconds: float
) -> dict[str, Any]:
    """cuFile reads into GPU memory through kvikio (cuFile brings its own bounce buffers where
    it needs them), with the mode they ran in."""
    try:
        import kvikio
    except ImportError as exc:
        raise StorageStageError(
            f"kvikio is not installed beside torch ({exc}): pip install 'sparkdiag[gds]'"
        ) from None
    torch = info.torch
    index = torch.device(info.device).index or 0
    blocks = [torch.empty(block, dtype=torch.uint8, device=info.device) for _ in range(threads)]
    before = nvfs_read_mib()
    with kvikio_direct_reads(kvikio, fd) as direct, kvikio.CuFile(path, "r") as handle:
        mode, why = gds_mode(kvikio)
        if mode == "compat" and not direct:
            why += (" (this kvikio cannot be asked for O_DIRECT reads: a pass after the first "
                    "may come from the page cache)")  # fmt: skip

        def step(thread: int, n: int, offset: int) -> None:
            got = handle.raw_read(blocks[thread], block, offset)
            if got != block:
                raise OSError(f"short read: {got} of {block} bytes at {offset}")

        moved, elapsed = storage_sequential(
            threads, share, block, seconds, step, lambda _i: torch.cuda.set_device(index)
        )
        handle.raw_read(blocks[0], block, 0)
    torch.cuda.synchronize()
    mode, why = gds_confirmed(mode, why, before, nvfs_read_mib(), moved)
    return {"bytes": moved, "seconds": elapsed, "mode": mode, "mode_reason": why,
            "kvikio": str(getattr(kvikio, "__version__", "")) or None,
            "checked": storage_same(info, blocks[0], fd, block)}  # fmt: skip


@contextlib.contextmanager
def kvikio_direct_reads(kvikio: Any, fd: int) -> Iterator[bool]:
    """KvikIO's compatibility mode reads through the page cache unless ``auto_direct_io_read``
    is on (kvikio 26.10; on the H200, 2026-12-04, the stage read a 1 GiB file at 5.06 GB/s in
    compat mode, the disk 3.17 GB/s with O_DIRECT: the passes after the first were the cache).
    The file's cached pages are dropped first; True where kvikio took the setting."""
    with contextlib.suppress(OSError, AttributeError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    try:
        setting = kvikio_part(kvikio, "defaults").set({"auto_direct_io_read": True})
    except Exception:  # an older kvikio: no such key, or no set()
        setting = None
    if setting is None:
        yield False
        return
    with setting:
        yield True


def gds_mode(kvikio: Any) -> tuple[str, str]:
    """``gds`` or ``compat``, and why, as kvikio and the cuFile driver say before reading.

    Two compatibility modes read with POSIX calls instead of DMA into GPU memory: KvikIO's own
    (``KVIKIO_COMPAT_MODE=ON``, or AUTO without libcufile: ``kvikio.defaults
    .is_compat_mode_preferred()``; older kvikio: ``kvikio.defaults.compat_mode()``) and
    cuFile's, which it falls into without the nvidia-fs kernel driver (``is_gds_available``:
    the driver's version reads 0.0)."""
    try:
        defaults = kvikio_part(kvikio, "defaults")
        preferred = getattr(defaults, "is_compat_mode_preferred", None)
        compat = bool(preferred() if preferred is not None else defaults.compat_mode())
    except Exception as exc:
        return "compat", f"kvikio did not say its mode ({type(exc).__name__}): taken as POSIX"
    if compat:
        return "compat", (
            "KvikIO's compatibility mode (KVIKIO_COMPAT_MODE, or no libcufile): POSIX reads "
            "into a bounce buffer, then a copy; not GPUDirect Storage"
        )
    try:
        driver = kvikio_part(kvikio, "cufile_driver")
        getter = getattr(driver, "get", None)
        if getter is not None:
            available = bool(getter("is_gds_available"))
        else:
            available = bool(driver.DriverProperties().is_gds_available)
    except Exception as exc:
        return "compat", f"the cuFile driver did not answer ({type(exc).__name__}): taken as POSIX"
    if not available:
        return "compat", (
            "cuFile without the nvidia-fs kernel driver runs in its own compatibility mode: POSIX "
            "reads through bounce buffers, then copies; not GPUDirect Storage"
        )
    return "gds", "cuFile with the nvidia-fs kernel driver"


def kvikio_part(kvikio: Any, name: str) -> Any:
    """A submodule of kvikio: ``import kvikio`` does not import ``defaults`` or
    ``cufile_driver`` (26.10: ``kvikio.defaults`` is an AttributeError until imported)."""
    part = getattr(kvikio, name, None)
    if part is None:
        part = importlib.import_module(f"{kvikio.__name__}.{name}")
    return part


def nvfs_read_mib(path: str = NVFS_STATS) -> int | None:
    """MiB the nvidia-fs driver has read (``Reads : n=... readMiB=...``), None where it is not
    loaded or counts no I/O."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("Reads") and "readMiB=" in line:
                    return int(line.split("readMiB=")[1].split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None


def gds_confirmed(
    mode: str, why: str, before: int | None, after: int | None, moved: int
) -> tuple[str, str]:
    """The mode as the reads turned out: nvidia-fs counting less than half of what was read
    means cuFile fell back to its compatibility mode for this file."""
    if mode != "gds":
        return mode, why
    if before is None or after is None:
        return mode, why + " (unconfirmed: nvidia-fs counts no I/O here)"
    counted = after - before
    if counted * (1 << 20) < moved // 2:
        return "compat", (
            f"nvidia-fs counted {counted} MiB of the {moved >> 20} MiB read: cuFile fell back to "
            "its compatibility mode for this file (a filesystem or device GDS does not take)"
        )
    return mode, why + f" ({counted} MiB counted by nvidia-fs)"
