"""The worker's storage room (sparkdiag/probe/worker/storage.py): its reading threads, its host
buffers, each stage on a simulated GPU (this machine's CPU torch behind a CUDA that only records:
the copies are CPU copies, the data check real), how the GPUDirect stage names its mode, and the
mode run by the real worker on CPU torch, where every stage says why it cannot run."""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkdiag.probe.worker import storage as room
from sparkdiag.probe.worker.contract import parse_args
from sparkdiag.probe.worker.dtypes import DeviceInfo
from sparkdiag.probe.worker.pages import HUGE_PAGE
from tests.support import run_python
from tests.support.worker import WORKER, cpu_info, worker_document

MIB = 1 << 20
BLOCK = 1 << 20


def random_file(folder: Path, size: int = 8 * MIB) -> Path:
    path = folder / "data.bin"
    path.write_bytes(os.urandom(size))
    return path


# -- the reading threads ------------------------------------------------------------------------


def test_each_thread_reads_its_own_share_in_order_for_at_most_the_passes() -> None:
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    begun, ended = [], []

    def step(index: int, n: int, offset: int) -> None:
        assert n == len(seen[index])
        seen[index].append(offset)

    moved, seconds = room.storage_sequential(3, 4 * 4096, 4096, 60.0, step, begun.append,
                                             ended.append)  # fmt: skip
    assert sorted(begun) == sorted(ended) == [0, 1, 2]
    for index, offsets in seen.items():
        share = [index * 4 * 4096 + k * 4096 for k in range(4)]
        assert offsets == share * room.STORAGE_MAX_PASSES
    assert moved == 3 * 4 * 4096 * room.STORAGE_MAX_PASSES and seconds > 0


def test_the_reads_end_at_their_time() -> None:
    def step(index: int, n: int, offset: int) -> None:
        time.sleep(0.01)

    started = time.monotonic()
    moved, seconds = room.storage_sequential(2, 1000 * 4096, 4096, 0.2, step)
    assert time.monotonic() - started < 1.0 and 0.18 <= seconds < 1.0
    assert 0 < moved < 2 * 1000 * 4096


def test_a_failing_read_is_raised_after_every_thread_ended() -> None:
    def step(index: int, n: int, offset: int) -> None:
        if index == 1:
            raise OSError(5, "Input/output error")

    with pytest.raises(OSError, match="Input/output"):
        room.storage_sequential(3, 8 * 4096, 4096, 0.2, step)
    assert threading.active_count() < 20


def test_the_host_probe_and_the_worker_agree_on_passes() -> None:
    from sparkdiag.storage import measure

    assert room.STORAGE_MAX_PASSES == measure.MAX_READ_PASSES


# -- a simulated GPU -----------------------------------------------------------------------------


class Cudart:
    def __init__(self, fail: bool = False) -> None:
        self.fail, self.registered, self.unregistered = fail, {}, []  # type: ignore[var-annotated]

    def cudaHostRegister(self, address: int, size: int, flags: int) -> int:
        if self.fail:
            return 1
        self.registered[address] = size
        return 0

    def cudaHostUnregister(self, address: int) -> int:
        self.unregistered.append(address)
        return 0


class Cuda:
    """What the room asks of torch.cuda; copies run on the CPU at once."""

    def __init__(self, cudart: Cudart) -> None:
        self._cudart = cudart
        self.devices: list[int] = []
        self.synchronized = 0

        class Stream:
            def __init__(self, device: str) -> None:
                self.device = device

            def synchronize(self) -> None:
                pass

        class Event:
            def record(self, stream: Any = None) -> None:
                pass

            def synchronize(self) -> None:
                pass

        self.Stream, self.Event = Stream, Event

    def cudart(self) -> Cudart:
        return self._cudart

    @contextlib.contextmanager
    def stream(self, stream: Any) -> Iterator[None]:
        yield

    def set_device(self, index: int) -> None:
        self.devices.append(index)

    def synchronize(self) -> None:
        self.synchronized += 1


class SimulatedTorch:
    """CPU torch, but ``cuda`` is :class:`Cuda` and "device" memory is CPU memory."""

    def __init__(self, torch: Any, cuda: Cuda) -> None:
        self._torch, self.cuda = torch, cuda

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def empty(self, *size: int, dtype: Any = None, device: Any = None,
              pin_memory: bool = False) -> Any:  # fmt: skip
        return self._torch.empty(*size, dtype=dtype)


def simulated(fail_register: bool = False) -> tuple[DeviceInfo, Cuda]:
    torch = cpu_info().torch
    cuda = Cuda(Cudart(fail_register))
    sim = SimulatedTorch(torch, cuda)
    return DeviceInfo(sim, "cuda:0", True, (9, 0), 132, 0, (2, 11), 1e9), cuda


def thp_enabled() -> bool:
    text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    return "[never]" not in text


def test_host_buffers_lie_in_huge_pages_and_are_registered_then_released() -> None:
    info, cuda = simulated()
    host = room.StorageHostBuffers(info.torch, 4, BLOCK)
    try:
        assert host.pages == ("huge" if thp_enabled() else "small")
        registered = cuda.cudart().registered
        assert len(registered) == 4 and set(registered.values()) == {BLOCK}
        assert all(address % HUGE_PAGE == 0 for address in registered)
        host.views[2][:3] = b"abc"  # what is read into a view is what the copy sends
        assert bytes(host.tensors[2][:3].tolist()) == b"abc"
    finally:
        host.close()
    assert sorted(cuda.cudart().unregistered) == sorted(registered)


def test_host_buffers_fall_back_to_torchs_pinned_memory() -> None:
    info, _cuda = simulated(fail_register=True)
    host = room.StorageHostBuffers(info.torch, 2, BLOCK)
    try:
        assert host.pages == "torch" and len(host.views) == len(host.tensors) == 2
        host.views[1][:2] = b"ok"
        assert bytes(host.tensors[1][:2].tolist()) == b"ok"
    finally:
        host.close()


def fake_kvikio(
    monkeypatch: pytest.MonkeyPatch, compat: bool = False, gds: bool = True, settable: bool = True
) -> types.ModuleType:
    """kvikio 26.10's surface the room uses, installed in ``sys.modules``; reads through an
    aligned bounce buffer, as kvikio's compatibility mode does. As in the real package,
    ``import kvikio`` leaves ``defaults`` and ``cufile_driver`` to be imported (on the H200,
    2026-12-04, ``kvikio.defaults`` was an AttributeError until then). ``settable=False``: an
    older kvikio without ``defaults.set``. Each read appends the ``auto_direct_io_read``
    setting it ran under to the module's ``direct_reads``."""
    torch = cpu_info().torch
    module = types.ModuleType("kvikio")
    module.__version__ = "26.10.0"  # type: ignore[attr-defined]
    defaults = types.ModuleType("kvikio.defaults")
    defaults.is_compat_mode_preferred = lambda: compat  # type: ignore[attr-defined]
    active: dict[str, Any] = {"auto_direct_io_read": False}
    direct_reads: list[bool] = []
    module.direct_reads = direct_reads  # type: ignore[attr-defined]

    module.active = active  # type: ignore[attr-defined]

    def setting(config: dict[str, Any]) -> contextlib.AbstractContextManager[None]:
        # as kvikio's ConfigContextManager: set at once, put back when the block ends
        before = dict(active)
        active.update(config)

        @contextlib.contextmanager
        def restoring() -> Iterator[None]:
            try:
                yield
            finally:
                active.clear()
                active.update(before)

        return restoring()

    if settable:
        defaults.set = setting  # type: ignore[attr-defined]
    driver = types.ModuleType("kvikio.cufile_driver")
    driver.get = lambda name: {"is_gds_available": gds}[name]  # type: ignore[attr-defined]
    modules = __import__("sys").modules
    for part in (module, defaults, driver):
        monkeypatch.setitem(modules, part.__name__, part)

    class CuFile:
        def __init__(self, path: str, flags: str) -> None:
            assert flags == "r"
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECT)

        def __enter__(self) -> CuFile:
            return self

        def __exit__(self, *exc: object) -> None:
            os.close(self.fd)

        def raw_read(self, buf: Any, size: int, file_offset: int = 0) -> int:
            direct_reads.append(active["auto_direct_io_read"])
            area = mmap.mmap(-1, size)
            got = os.preadv(self.fd, [area], file_offset)
            buf.copy_(torch.frombuffer(area, dtype=torch.uint8))
            area.close()
            return got

    module.CuFile = CuFile  # type: ignore[attr-defined]
    return module


def storage_args(path: Path, *extra: str) -> argparse.Namespace:
    return parse_args(["--storage-read", str(path), "--storage-threads", "2",
                       "--storage-seconds", "0.6", *extra])  # fmt: skip


def test_every_stage_reads_on_a_simulated_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kvikio: Any = fake_kvikio(monkeypatch, gds=False)
    info, cuda = simulated()
    path = random_file(tmp_path)
    doc: dict[str, Any] = {"status": "ok", "reason": None}
    room.run_storage_read(info, storage_args(path), None, doc)
    assert doc["status"] == "ok" and doc["suite"] == "storage", doc
    section = doc["storage"]
    assert section["size"] == 8 * MIB and section["threads"] == 2
    stages = {s["path"]: s for s in section["stages"]}
    assert list(stages) == ["pinned", "gpu", "gds"]
    for stage in stages.values():
        assert stage["status"] == "ok" and stage["bytes"] >= 8 * MIB and stage["seconds"] > 0
    assert stages["gpu"]["checked"] is True and stages["gds"]["checked"] is True
    assert stages["gds"]["mode"] == "compat" and "nvidia-fs" in stages["gds"]["mode_reason"]
    assert stages["gds"]["kvikio"] == "26.10.0"
    assert kvikio.direct_reads and all(kvikio.direct_reads)  # never from the page cache
    assert kvikio.active["auto_direct_io_read"] is False  # put back after the stage
    assert "page cache" not in stages["gds"]["mode_reason"]
    assert set(cuda.devices) == {0}  # every reading thread set its device
    assert cuda.cudart().registered and len(cuda.cudart().unregistered) == 4


def test_without_kvikio_the_gds_stage_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "kvikio", None)  # import fails
    info, _cuda = simulated()
    doc: dict[str, Any] = {"status": "ok", "reason": None}
    room.run_storage_read(info, storage_args(random_file(tmp_path)), None, doc)
    stages = {s["path"]: s for s in doc["storage"]["stages"]}
    assert stages["gpu"]["status"] == "ok" and doc["status"] == "ok"
    assert stages["gds"]["status"] == "unsupported"
    assert "pip install 'sparkdiag[gds]'" in stages["gds"]["reason"]
    doc = {"status": "ok", "reason": None}
    room.run_storage_read(info, storage_args(random_file(tmp_path), "--no-storage-gds"), None, doc)
    assert [s["path"] for s in doc["storage"]["stages"]] == ["pinned", "gpu"]


def test_wrong_data_in_gpu_memory_is_caught(tmp_path: Path) -> None:
    info, _cuda = simulated()
    path = random_file(tmp_path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        torch = info.torch
        assert room.storage_same(info, torch.zeros(BLOCK, dtype=torch.uint8), fd, BLOCK) is False
        right = torch.frombuffer(bytearray(path.read_bytes()[:BLOCK]), dtype=torch.uint8)
        assert room.storage_same(info, right, fd, BLOCK) is True
    finally:
        os.close(fd)


# -- which mode cuFile ran in --------------------------------------------------------------------


def test_the_mode_kvikio_and_cufile_report(monkeypatch: pytest.MonkeyPatch) -> None:
    mode, why = room.gds_mode(fake_kvikio(monkeypatch, compat=True))
    assert mode == "compat" and "KvikIO's compatibility mode" in why
    mode, why = room.gds_mode(fake_kvikio(monkeypatch, gds=False))
    assert mode == "compat" and "without the nvidia-fs kernel driver" in why
    package = fake_kvikio(monkeypatch, gds=True)
    assert not hasattr(package, "defaults")  # imported by the room, as the real one needs
    assert room.gds_mode(package)[0] == "gds"
    older = types.SimpleNamespace(  # older kvikio: compat_mode() and DriverProperties
        defaults=types.SimpleNamespace(compat_mode=lambda: False),
        cufile_driver=types.SimpleNamespace(
            DriverProperties=lambda: types.SimpleNamespace(is_gds_available=False)
        ),
    )
    assert room.gds_mode(older)[0] == "compat"
    broken = types.SimpleNamespace(defaults=types.SimpleNamespace())
    assert room.gds_mode(broken)[0] == "compat"  # what cannot be told is never called GDS


def test_nvidia_fs_counters_confirm_or_overrule_gds(tmp_path: Path) -> None:
    stats = tmp_path / "stats"
    stats.write_text(
        "NVFS statistics(ver: 4.0)\nReads\t\t\t\t: n=12 ok=12 err=0 readMiB=1024 "
        "io_state_err=0\nReads\t\t\t\t: Bandwidth(MiB/s)=1 Avg-Latency(usec)=1\n"
    )
    assert room.nvfs_read_mib(str(stats)) == 1024
    assert room.nvfs_read_mib(str(tmp_path / "none")) is None
    moved = 1 << 30
    assert room.gds_confirmed("gds", "w", 0, 1024, moved) == (
        "gds",
        "w (1024 MiB counted by nvidia-fs)",
    )
    mode, why = room.gds_confirmed("gds", "w", 0, 0, moved)
    assert mode == "compat" and "fell back to its compatibility mode" in why
    assert room.gds_confirmed("gds", "w", None, None, moved)[1].endswith("counts no I/O here)")
    assert room.gds_confirmed("compat", "w", 0, 1024, moved) == ("compat", "w")


def test_an_older_kvikio_in_compat_mode_says_its_reads_may_be_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kvikio: Any = fake_kvikio(monkeypatch, gds=False, settable=False)
    info, _cuda = simulated()
    doc: dict[str, Any] = {"status": "ok", "reason": None}
    room.run_storage_read(info, storage_args(random_file(tmp_path), "--storage-seconds", "0.3"),
                          None, doc)  # fmt: skip
    gds = doc["storage"]["stages"][2]
    assert gds["status"] == "ok" and gds["mode"] == "compat" and not any(kvikio.direct_reads)
    assert "may come from the page cache" in gds["mode_reason"]


def test_a_simulated_gds_read_counted_by_nvidia_fs_is_gds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_kvikio(monkeypatch, gds=True)
    counts = iter([100, 100 + 64])  # MiB before and after the reads
    monkeypatch.setattr(room, "nvfs_read_mib", lambda: next(counts))
    info, _cuda = simulated()
    doc: dict[str, Any] = {"status": "ok", "reason": None}
    room.run_storage_read(info, storage_args(random_file(tmp_path), "--storage-seconds", "0.3"),
                          None, doc)  # fmt: skip
    gds = doc["storage"]["stages"][2]
    if gds["bytes"] <= 128 * MIB:  # 64 MiB counted covers at least half of what was read
        assert gds["mode"] == "gds" and "64 MiB counted by nvidia-fs" in gds["mode_reason"]
    else:
        assert gds["mode"] == "compat"


# -- on CPU --------------------------------------------------------------------------------------


def test_on_cpu_every_stage_says_why_it_cannot_run(tmp_path: Path) -> None:
    doc: dict[str, Any] = {"status": "ok", "reason": None}
    room.run_storage_read(cpu_info(), storage_args(random_file(tmp_path)), None, doc)
    assert doc["status"] == "unsupported" and "no CUDA device" in doc["reason"]
    assert [s["status"] for s in doc["storage"]["stages"]] == ["unsupported"] * 3
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 4096)
    doc = {"status": "ok", "reason": None}
    room.run_storage_read(cpu_info(), storage_args(small), None, doc)
    assert "holds less than 2 x 1048576 bytes" in doc["reason"]


@pytest.mark.worker
def test_the_worker_runs_the_mode_and_prints_a_whole_document(tmp_path: Path) -> None:
    path = random_file(tmp_path, 4 * MIB)
    doc = worker_document(["--device", "cpu", "--storage-read", str(path),
                           "--storage-threads", "2", "--storage-seconds", "0.5"])  # fmt: skip
    assert doc["suite"] == "storage" and doc["status"] == "unsupported"
    assert doc["storage"]["file"] == str(path) and doc["storage"]["size"] == 4 * MIB
    assert [s["path"] for s in doc["storage"]["stages"]] == ["pinned", "gpu", "gds"]
    assert all("no CUDA device" in s["reason"] for s in doc["storage"]["stages"])
    assert doc["results"] == [] and doc["soak"] is None  # every key of the document, unused
    missing = worker_document(["--device", "cpu", "--storage-read", str(tmp_path / "none")])
    assert missing["status"] == "error" and "No such file" in missing["reason"]
    both = run_python(WORKER, "--device", "cpu", "--storage-read", str(path), "--soak-seconds", "1")
    assert both.returncode == 2
    assert "give --storage-read or --soak-seconds" in json.loads(both.stdout)["reason"]
