"""The architecture lint: CUDA's binary compatibility rules, every verdict on the fat binary
fixtures (tests/fixtures/fatbin/), the scan of a Python environment with its cache, the dtype
order, the check rows, the collector and ``sparkdiag native``."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sparkdiag.baseline.evaluate import GemmFigure
from sparkdiag.check.model import GpuProbe
from sparkdiag.check.native_checks import check_dtype_order, check_native_code
from sparkdiag.exporter.native import NativeCollector
from sparkdiag.native import dtypes
from sparkdiag.native import watch as native_watch
from sparkdiag.native.compat import judge, loads, parse_capability
from sparkdiag.native.lint import (
    Gpu,
    arch_list_report,
    judge_library,
    kernels_elsewhere,
    lint,
    not_judged,
)
from sparkdiag.native.render import NativeReport, text
from sparkdiag.native.watch import LibraryWatch, environment
from sparkdiag.sources.software import pyenv
from sparkdiag.sources.software.cuda_libraries import CudaLibrary, LibraryScan, ScanCache, scan
from sparkdiag.sources.software.elf import FileReader, Section, read_sections
from sparkdiag.sources.software.fatbin import FatbinReport, Target, read_fatbin, replay
from tests.support import ROOT, ROOTFS, invoke_cli
from tests.support.check import NVML, SYSFS, context, only, poll
from tests.support.engine import wait_for

FATBIN = ROOT / "tests" / "fixtures" / "fatbin"
SPARK_ROOT = ROOTFS / "dgx-spark-vllm"
GB10 = Gpu("0", "GPU-gb10", "NVIDIA GB10", (12, 1))
H200 = Gpu("0", "GPU-h200", "NVIDIA H200", (9, 0))
RTX = Gpu("0", "GPU-rtx", "RTX PRO 6000", (12, 0))
B200 = Gpu("0", "GPU-b200", "B200", (10, 0))
B300 = Gpu("0", "GPU-b300", "B300", (10, 3))


def library(name: str) -> CudaLibrary:
    report = read_fatbin(FATBIN / f"{name}.so")
    assert report is not None
    return CudaLibrary(name, name + ".so", "pkg", "1.0", 1, report)


# -- the rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "capability", "expected"),
    [
        ("sm_80", (8, 6), True),  # a later minor of the same major
        ("sm_86", (8, 0), False),  # never an earlier one
        ("sm_80", (9, 0), False),  # never another major
        ("sm_120", (12, 1), True),  # GB10 runs plain sm_120
        ("sm_90a", (9, 0), True),
        ("sm_120a", (12, 1), False),  # arch-specific: its own arch only
        ("sm_121a", (12, 1), True),
        ("sm_100f", (10, 3), True),  # family: later members of the family
        ("sm_103f", (10, 0), False),
        ("sm_120f", (12, 1), True),
        ("sm_100f", (12, 0), False),
        ("compute_80", (12, 1), True),  # PTX: any later GPU
        ("compute_90", (8, 9), False),
        ("compute_90a", (10, 0), False),  # arch-specific PTX: its own arch only
        ("compute_120f", (12, 1), True),
        ("compute_120f", (13, 0), False),
    ],
)
def test_loads(target: str, capability: tuple[int, int], expected: bool) -> None:
    assert loads(Target.parse(target), capability) is expected


def test_parse_capability() -> None:
    assert parse_capability("12.1") == (12, 1)
    assert parse_capability("") is None and parse_capability("9") is None


@pytest.mark.parametrize(
    ("fixture", "gpu", "status", "mode", "target"),
    [
        ("sm121a", GB10, "pass", "native", "sm_121a"),
        ("sm121", GB10, "pass", "native", "sm_121"),
        ("sm120f", GB10, "pass", "native", "sm_120f"),  # the family covers 12.1
        ("sm120", GB10, "pass", "native", "sm_120"),  # nothing arch-specific built: pass
        ("sm120a", GB10, "fail", "none", ""),  # RTX PRO's arch-specific code: not GB10's
        ("sm120a", RTX, "pass", "native", "sm_120a"),
        ("ptx80", GB10, "warn", "ptx-jit", "compute_80"),  # vllm PR #40923's Marlin MoE
        ("ptx120f", GB10, "warn", "ptx-jit", "compute_120f"),
        ("ptx121a", GB10, "warn", "ptx-jit", "compute_121a"),
        ("ptx121a", RTX, "fail", "none", ""),
        ("vllm-moe-published", GB10, "warn", "native", "sm_120"),  # vllm#50925
        ("vllm-moe-published", H200, "pass", "native", "sm_90a"),
        ("vllm-moe-source", GB10, "pass", "native", "sm_121a"),
        ("vllm-moe-source", RTX, "warn", "ptx-jit", "compute_80"),
        ("sm90a", H200, "pass", "native", "sm_90a"),
        ("sm90", H200, "pass", "native", "sm_90"),
        ("sm80-ptx80", H200, "warn", "ptx-jit", "compute_80"),
        ("sm100a", B300, "fail", "none", ""),
        ("sm100a", B200, "pass", "native", "sm_100a"),
        ("flash-attn-like", GB10, "fail", "none", ""),  # Dao-AILab/flash-attention#1969
        ("torch-like", GB10, "pass", "native", "sm_120"),
        ("rdc-sm90", H200, "pass", "native", "sm_90"),
    ],
)
def test_every_verdict_on_the_fixtures(
    fixture: str, gpu: Gpu, status: str, mode: str, target: str
) -> None:
    verdict = judge_library(library(fixture), gpu)
    assert (verdict.status, verdict.verdict.mode, verdict.verdict.target) == (status, mode, target)
    if status != "pass":
        assert verdict.action  # says what to install instead


def test_the_vllm_published_warning_names_what_is_missing() -> None:
    verdict = judge_library(library("vllm-moe-published"), GB10)
    assert verdict.verdict.specific_elsewhere == ("sm_90a",)
    assert not verdict.verdict.exact and not verdict.verdict.specific
    assert "none for sm_121 itself" in verdict.reason
    assert "sm_121a or a family target" in verdict.reason


def test_advice_by_package() -> None:
    lib = library("ptx80")
    vllm = judge_library(replace(lib, package="vllm"), GB10).action
    assert 'TORCH_CUDA_ARCH_LIST="12.1a"' in vllm and "vllm-project/vllm#50925" in vllm
    cublas = judge_library(replace(lib, package="nvidia-cublas"), GB10).action
    assert cublas.startswith("where torch brought nvidia-cublas (pip show torch")
    assert "torch built for a newer CUDA" in cublas and "pip install -U nvidia-cublas" in cublas
    other = judge_library(replace(lib, package="mykernels"), H200).action
    assert 'TORCH_CUDA_ARCH_LIST="9.0a"' in other and "sm_90" in other
    assert "kernels-community#866" in other


def test_torch_arch_list_is_judged_by_the_same_rules() -> None:
    report = arch_list_report(["sm_80", "sm_90", "sm_100", "sm_120", "compute_120", "bogus"])
    assert judge(report, (12, 1)).target == "sm_120"
    assert judge(report, (9, 0)).mode == "native"
    assert judge(report, (8, 9)).target == "sm_80"
    assert judge(arch_list_report(["sm_80", "compute_80"]), (12, 1)).mode == "ptx-jit"


# -- the real libraries of the lent H200 (docs/device/2026-12-03/call-b/native/) --------------

H200_RUN = ROOT / "docs" / "device" / "2026-12-03" / "call-b" / "native"
TRACES = FATBIN / "traces"


def traced(name: str) -> CudaLibrary:
    """The library of ``traces/NAME.json.gz`` with its real path and size."""
    doc = json.loads(gzip.decompress((TRACES / f"{name}.json.gz").read_bytes()))
    report = replay(doc)
    assert report is not None
    return CudaLibrary(doc["library"], doc["library"], "pkg", "1.0", doc["size_bytes"], report)


def fixture_file(name: str) -> CudaLibrary:
    """A fixture library with its real size."""
    path = FATBIN / f"{name}.so"
    report = read_fatbin(path)
    assert report is not None
    return CudaLibrary(str(path), path.name, "pkg", "1.0", path.stat().st_size, report)


@pytest.mark.parametrize(
    ("trace", "on_h200", "on_gb10"),
    [
        ("torch-2.11.0-libtorch_cuda.so", "pass native sm_90a", "pass native sm_121a"),
        ("torch-2.11.0-libtorch_cuda_linalg.so", "pass native sm_90", "pass native sm_120"),
        (
            "nvidia-cudnn-cu13-9.19.0.56-libcudnn_adv.so.9",
            "pass native sm_90a",
            "pass native sm_121",
        ),
        (
            "nvidia-cudnn-cu13-9.19.0.56-libcudnn_cnn.so.9",
            "pass native sm_90a",
            "pass native sm_121",
        ),
        (
            "nvidia-cufile-1.15.1.6-libcufile.so.0",
            "warn ptx-jit compute_86",
            "warn ptx-jit compute_86",
        ),
    ],
)
def test_the_h200_libraries_verdicts(trace: str, on_h200: str, on_gb10: str) -> None:
    lib = traced(trace)
    assert not kernels_elsewhere(lib)
    for gpu, expected in ((H200, on_h200), (GB10, on_gb10)):
        v = judge_library(lib, gpu)
        assert f"{v.status} {v.verdict.mode} {v.verdict.target}" == expected


def test_a_stub_fat_binary_is_not_judged() -> None:
    # libcufft.so.12: 672 bytes of fat binary (one sm_75 cubin) in 286,542,352; its FFT
    # kernels are fat binaries in its .ldata. libcufftw.so.12: 1,984 bytes in 991,704.
    for name in ("nvidia-cufft-12.0.0.61-libcufft.so.12", "nvidia-cufft-12.0.0.61-libcufftw.so.12"):
        assert kernels_elsewhere(traced(name)), name
    assert kernels_elsewhere(fixture_file("cufft-like"))  # 920 bytes in 148,904
    assert kernels_elsewhere(fixture_file("cufftw-like"))  # 1,544 bytes in 267,888, no kernel
    # every library with real kernels is judged: the fixtures nvcc built (488 bytes of fat
    # binary and up, 8 % of the file and up) and libcufile's 47,320 bytes (1.5 %)
    stubs = ("cufft-like.so", "cufftw-like.so", "no-cuda.so")
    others = [p.stem for p in FATBIN.glob("*.so") if p.name not in stubs]
    assert len(others) == 18
    assert not any(kernels_elsewhere(fixture_file(name)) for name in others)
    assert not kernels_elsewhere(traced("nvidia-cufile-1.15.1.6-libcufile.so.0"))


def test_a_small_fat_binary_is_a_stub_only_where_its_kernels_are_found_elsewhere(
    tmp_path: Path,
) -> None:
    """A one-kernel extension built for the wrong GPU (sm90.so's 3,776 bytes of fat binary in
    a 0.6 MB library) read as a stub by size and share: not judged, and the lint passed it
    (found in a review). A small fat binary is a stub only where another section holds fat
    binaries (cufft-like.so's .ldata, as libcufft's); a header trace, not searched, keeps the
    size rule."""
    ext = tmp_path / "_C.so"
    ext.write_bytes((FATBIN / "sm90.so").read_bytes() + bytes(600_000))
    report = read_fatbin(ext)
    assert report is not None and report.fatbin_bytes == 3776 and report.elsewhere is False
    lib = CudaLibrary(str(ext), "myop/_C.so", "myop", "1.0", ext.stat().st_size, report)
    assert not kernels_elsewhere(lib)
    assert judge_library(lib, GB10).status == "fail"
    cufft = fixture_file("cufft-like")
    assert cufft.report.elsewhere is True and kernels_elsewhere(cufft)
    assert fixture_file("torch-like").report.elsewhere is None  # too large to be a stub
    trace = traced("nvidia-cufft-12.0.0.61-libcufft.so.12")
    assert trace.report.elsewhere is None and kernels_elsewhere(trace)


def _section(path: Path, name: str) -> Section:
    with path.open("rb") as fh:
        return next(s for s in read_sections(FileReader(fh)) if s.name == name)


def _move_section(path: Path, name: str, to: int, lead: int) -> None:
    """Moves section ``name`` of the ELF64 file at ``path`` to the file offset ``to`` (past the
    file's end) behind ``lead`` zero bytes, which the section's header then counts: its
    sh_offset is ``to`` and its sh_size grows by ``lead``. The rest of the file is unchanged."""
    raw = bytearray(path.read_bytes())
    (shoff,) = struct.unpack_from("<Q", raw, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", raw, 0x3A)
    (names_at,) = struct.unpack_from("<Q", raw, shoff + shstrndx * shentsize + 24)
    for i in range(shnum):
        header = shoff + i * shentsize
        (at_name,) = struct.unpack_from("<I", raw, header)
        if raw[names_at + at_name :].split(b"\0", 1)[0] == name.encode():
            offset, size = struct.unpack_from("<QQ", raw, header + 24)
            assert to >= len(raw)
            body = bytes(raw[offset : offset + size])
            raw.extend(bytes(to - len(raw) + lead) + body)
            struct.pack_into("<QQ", raw, header + 24, to, size + lead)
            path.write_bytes(bytes(raw))
            return
    raise AssertionError(f"{path} has no {name}")


def test_a_stubs_kernels_are_found_where_its_section_starts_off_an_8_byte_boundary(
    tmp_path: Path,
) -> None:
    """nvidia-cufft 12.0.0.61's libcufft.so.12 (286 MB): its .ldata starts at file offset
    0x81d874, 4 past an 8-byte boundary, and its 23,983 fat binary containers are 16-byte
    aligned in the file (read from the wheel here). The search counted alignment from the
    section's start, found none, and `check` failed the stub on the H200 (2026-12-03) and the
    H100 (2026-12-05). cufft-like.so with its .ldata laid out the same way: the section starts
    4 past a boundary and its container, 4 bytes in, is aligned in the file."""
    lib = tmp_path / "libcufft.so.12"
    shutil.copyfile(FATBIN / "cufft-like.so", lib)
    ldata = _section(lib, ".ldata")
    assert ldata.offset % 8 == 0  # objcopy's layout, which either count finds
    _move_section(lib, ".ldata", (lib.stat().st_size + 7) // 8 * 8 + 4, lead=4)
    moved = _section(lib, ".ldata")
    assert moved.offset % 8 == 4 and moved.size == ldata.size + 4
    report = read_fatbin(lib)
    assert report is not None and report.fatbin_bytes == 920 and report.elsewhere is True
    stub = CudaLibrary(str(lib), lib.name, "nvidia-cufft", "12.0.0.61", lib.stat().st_size, report)
    assert kernels_elsewhere(stub)


def test_a_small_fat_binary_without_a_kernel_is_a_stub(tmp_path: Path) -> None:
    """nvidia-cufft 12.0.0.61's libcufftw.so.12 (cuFFT's FFTW interface, 991,704 bytes) holds
    one uncompressed sm_75 cubin in 1,984 bytes of .nv_fatbin and no fat binary in another
    section: its FFTs are libcufft's. Judged by its cubin, check failed it on the H200 and the
    H100 ("nothing sm_90 loads"). The cubin has no kernel (no .text.NAME section: read from the
    wheel here), as the one nvcc writes for a unit with host code only (cufftw-like.so). A
    cubin with a kernel keeps a small fat binary judged: sm90.so's, the wrong GPU's build."""
    stub = read_fatbin(FATBIN / "cufftw-like.so")
    assert stub is not None and stub.sass == {"sm_75": 1} and stub.compression == {"none": 1}
    assert stub.kernels == 0 and stub.elsewhere is False
    assert kernels_elsewhere(fixture_file("cufftw-like"))
    for name in ("sm90.so", "sm90a.so", "rdc-sm90.so"):
        report = read_fatbin(FATBIN / name)
        assert report is not None and report.kernels == 1, name  # kernel.cu's one kernel
    # ... and the share still decides: the same stub as most of a small library is judged
    whole = CudaLibrary("x", "libx.so", "x", "1", stub.fatbin_bytes * 50, stub)
    assert not kernels_elsewhere(whole)
    # compressed cubins and PTX are not read for kernels: the .ldata search decides for them
    cufft = read_fatbin(FATBIN / "cufft-like.so")
    assert cufft is not None and cufft.compression == {"zstd": 1} and cufft.kernels is None
    ptx = read_fatbin(FATBIN / "ptx80.so")
    assert ptx is not None and ptx.kernels is None and ptx.elsewhere is False
    # a report cached before has no count: read as not counted
    assert FatbinReport.from_json(stub.as_json()) == stub
    legacy = {k: v for k, v in stub.as_json().items() if k != "kernels"}
    assert FatbinReport.from_json(legacy).kernels is None


@pytest.mark.parametrize("damage", ["no name table", "name table past the cubin"])
def test_a_cubin_whose_names_are_lost_is_not_read_as_one_without_kernels(
    tmp_path: Path, damage: str
) -> None:
    """sm90.so's cubin (one kernel) with its section name table lost: every section read as
    nameless, so as no kernel, and the library (its 3,776 bytes of fat binary under 1 % of it)
    passed as a stub, not judged (found in a review, by mutating the fixture). A cubin read so
    is not counted (None): the library is judged by its targets and fails on the GB10."""
    raw = bytearray((FATBIN / "sm90.so").read_bytes())
    cubin = raw.find(b"\x7fELF", 64)
    (shoff,) = struct.unpack_from("<Q", raw, cubin + 0x28)
    (names,) = struct.unpack_from("<H", raw, cubin + 0x3E)
    if damage == "no name table":
        struct.pack_into("<H", raw, cubin + 0x3E, 0)
    else:
        struct.pack_into("<Q", raw, cubin + shoff + names * 64 + 24, 0x100000)
    lib = tmp_path / "libdamaged.so"
    lib.write_bytes(bytes(raw) + bytes(400_000))
    report = read_fatbin(lib)
    assert report is not None and report.sass == {"sm_90": 1} and report.kernels is None
    damaged = CudaLibrary(str(lib), lib.name, "x", "1", lib.stat().st_size, report)
    assert not kernels_elsewhere(damaged)
    assert judge_library(damaged, GB10).status == "fail"


def test_a_stubs_kernels_are_found_aligned_from_their_sections_start_too(tmp_path: Path) -> None:
    """The search for a stub's kernels counts alignment in the file (libcufft's layout) and
    from the section's start (nvcc's in .nv_fatbin): cufft-like.so's .ldata moved to 4 past an
    8-byte boundary with its container at its start is found as before the file count."""
    lib = tmp_path / "libstub.so"
    shutil.copyfile(FATBIN / "cufft-like.so", lib)
    _move_section(lib, ".ldata", (lib.stat().st_size + 7) // 8 * 8 + 4, lead=0)
    assert _section(lib, ".ldata").offset % 8 == 4
    report = read_fatbin(lib)
    assert report is not None and report.elsewhere is True


def _h200_scan() -> tuple[CudaLibrary, ...]:
    doc = json.loads((H200_RUN / "scan.json").read_text())
    return tuple(
        CudaLibrary(
            lib["path"],
            lib["relative"],
            lib["package"],
            lib["version"],
            lib["size_bytes"],
            FatbinReport.from_json(lib),
        )
        for lib in doc["libraries"]
    )


def test_the_recorded_h200_lint_less_cuffts_false_alarm() -> None:
    libraries = _h200_scan()
    assert len(libraries) == 31
    assert [lib.relative for lib in not_judged(libraries)] == [
        "nvidia/cu13/lib/libcufft.so.12",
        "nvidia/cu13/lib/libcufftw.so.12",
    ]
    h200 = LibraryScan("/opt/torch/.venv/bin/python3", (), libraries, 846, 0, {}, 2.835)
    verdicts = lint(h200, (H200, GB10))
    assert len(verdicts) == 2 * 29
    recorded = json.loads((H200_RUN / "verdicts.json").read_text())
    then = {(v["library"], v["sm"]): (v["status"], v["mode"], v["target"]) for v in recorded}
    now = {
        (v.library.path, v.gpu.sm): (v.status, v.verdict.mode, v.verdict.target) for v in verdicts
    }
    assert {k: then[k] for k in now} == now  # every other verdict as the H200 gave it
    gone = {(path.rsplit("/", 1)[1], sm) for path, sm in set(then) - set(now)}
    assert gone == {
        (lib, sm) for lib in ("libcufft.so.12", "libcufftw.so.12") for sm in ("sm_90", "sm_121")
    }
    assert [
        k[0].rsplit("/", 1)[1] for k, v in now.items() if v[0] != "pass" and k[1] == "sm_90"
    ] == ["libcufile.so.0"]


def test_cufiles_advice_says_what_brings_sm_90_and_that_nothing_brings_sm_121() -> None:
    lib = replace(traced("nvidia-cufile-1.15.1.6-libcufile.so.0"), package="nvidia-cufile")
    hopper = judge_library(lib, H200).action
    assert hopper.startswith("install a torch built for CUDA 13.1 or later")
    assert "1.16.0.49" in hopper and "pin 1.15.1.6" in hopper
    spark = judge_library(lib, GB10).action
    assert spark.startswith("nothing to install: no nvidia-cufile carries SASS for sm_121")


# -- the environment and the scan -------------------------------------------------------------


def test_scan_of_the_spark_root_maps_libraries_to_packages(tmp_path: Path) -> None:
    env = environment(SPARK_ROOT, None)
    assert env.site_dirs == (SPARK_ROOT / "usr/local/lib/python3.12/dist-packages",)
    cache = ScanCache(tmp_path / "cache.json")
    found = scan(env, cache)
    assert found.files == 6  # libc10.so has no device code
    by_path = {lib.relative: lib for lib in found.libraries}
    assert sorted(by_path) == [
        "flash_attn_2_cuda.cpython-312-aarch64-linux-gnu.so",
        "nvidia/cu13/lib/libcublasLt.so.13",
        "torch/lib/libtorch_cuda.so",
        "vllm/_moe_C.abi3.so",
        "vllm/_moe_C_stable_libtorch.abi3.so",
    ]
    moe = by_path["vllm/_moe_C_stable_libtorch.abi3.so"]
    assert (moe.package, moe.version, moe.listed) == ("vllm", "0.11.1", True)
    assert moe.path == "/usr/local/lib/python3.12/dist-packages/vllm/_moe_C_stable_libtorch.abi3.so"
    assert by_path["flash_attn_2_cuda.cpython-312-aarch64-linux-gnu.so"].package == "flash-attn"
    assert found.cached == 0
    again = scan(env, ScanCache(tmp_path / "cache.json"))
    assert again.cached == 6 and again.libraries == found.libraries


def test_the_cache_rereads_a_changed_library_and_forgets_a_removed_one(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    shutil.copytree(SPARK_ROOT / "usr/local/lib/python3.12/dist-packages", site)
    env = pyenv.resolve(site)
    cache_file = tmp_path / "cache.json"
    scan(env, ScanCache(cache_file))
    (site / "vllm" / "_moe_C.abi3.so").write_bytes((FATBIN / "sm121a.so").read_bytes())
    (site / "torch" / "lib" / "libc10.so").unlink()
    second = scan(env, ScanCache(cache_file))
    assert second.cached == 4
    moe = next(lib for lib in second.libraries if lib.relative == "vllm/_moe_C.abi3.so")
    assert moe.report.sass == {"sm_121a": 1}
    doc = json.loads(cache_file.read_text())
    assert len(doc["libraries"]) == 5
    cache_file.write_text("not json")
    assert scan(env, ScanCache(cache_file)).cached == 0  # a broken cache costs a rescan


def test_a_library_no_record_lists_is_named_by_its_directory(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "mykernels").mkdir(parents=True)
    shutil.copy(FATBIN / "sm90.so", site / "mykernels" / "_ops.so")
    (site / "linker-script.so").write_text("INPUT(libc.so.6)\n")
    found = scan(pyenv.resolve(site))
    (lib,) = found.libraries
    assert (lib.package, lib.version, lib.listed) == ("mykernels", "", False)
    assert found.unreadable == {}  # a text file named .so is no library, not an error


def _without_hanging(call: Callable[[], object], fifos: list[Path]) -> object:
    """``call()`` in a thread; when it is still running after 20 s (blocked opening one of
    ``fifos``), the FIFOs are opened for writing to let it go, and the test fails."""
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(timeout=20.0)
    if worker.is_alive():
        for fifo in fifos:  # a writer releases the reader blocked in open()
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(timeout=5.0)
        pytest.fail(f"blocked on a FIFO among {[str(f) for f in fifos]}")
    return result[0]


def test_a_fifo_in_a_dist_info_is_skipped_never_read(tmp_path: Path) -> None:
    """Before: a package whose METADATA was a FIFO hung the scan forever inside
    importlib.metadata (the hostile review); one whose RECORD was a FIFO was already skipped."""
    site = tmp_path / "site-packages"
    shutil.copytree(SPARK_ROOT / "usr/local/lib/python3.12/dist-packages", site)
    vllm = site / "vllm-0.11.1.dist-info"
    (vllm / "METADATA").unlink()
    os.mkfifo(vllm / "METADATA")
    flash = site / "flash_attn-2.8.3.dist-info"
    (flash / "RECORD").unlink()
    os.mkfifo(flash / "RECORD")
    fifos = [vllm / "METADATA", flash / "RECORD"]
    found = _without_hanging(lambda: scan(pyenv.resolve(site)), fifos)
    assert isinstance(found, LibraryScan)
    by_path = {lib.relative: lib for lib in found.libraries}
    # named by their directories, as a library no RECORD lists is
    assert (by_path["vllm/_moe_C.abi3.so"].package, by_path["vllm/_moe_C.abi3.so"].listed) == (
        "vllm",
        False,
    )
    flash_lib = by_path["flash_attn_2_cuda.cpython-312-aarch64-linux-gnu.so"]
    assert flash_lib.listed is False
    assert by_path["torch/lib/libtorch_cuda.so"].version == "2.9.0+cu130"  # the others read
    names = [d.normalized for d in pyenv.distributions(site)]
    assert "vllm" not in names and "flash-attn" in names


def test_a_library_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """The scan walks regular files only; a library replaced by a FIFO after the walk was
    opened by read_fatbin and waited for a writer forever."""
    fifo = tmp_path / "libx.so"
    os.mkfifo(fifo)

    def read() -> object:
        try:
            return read_fatbin(fifo)
        except OSError as exc:
            return exc

    answer = _without_hanging(read, [fifo])
    assert isinstance(answer, OSError) and answer.strerror == "not a regular file"


def test_an_implausible_architecture_is_shown_as_damage(tmp_path: Path) -> None:
    """Before: an entry whose architecture field read 2**32 - 1 was listed as sm_4294967295."""
    data = bytearray((FATBIN / "flash-attn-like.so").read_bytes())
    with (FATBIN / "flash-attn-like.so").open("rb") as fh:
        section = {s.name: s for s in read_sections(FileReader(fh))}[".nv_fatbin"]
    struct.pack_into("<I", data, section.offset + 16 + 28, 2**32 - 1)  # first entry's arch
    site = tmp_path / "site-packages"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "_ops.so").write_bytes(bytes(data))
    found = scan(pyenv.resolve(site))
    report = NativeReport(found, (H200,), tuple(lint(found, (H200,))), None, "--no-torch")
    shown = " ".join(text(report, 100, show_all=True).split())
    assert "4294967295" in shown and "sm_4294967295" not in shown
    assert (
        f"damaged fat binary: {site}/kernels/_ops.so: .nv_fatbin: 1 entry names an "
        "architecture no GPU has (4294967295; plausible: 10 to 999)"
    ) in shown
    (lib,) = report.as_json()["scan"]["libraries"]
    assert len(lib["sass"]) == 1 and "4294967295" in lib["problems"][0]


def test_resolve_each_kind_of_environment(tmp_path: Path) -> None:
    assert pyenv.resolve(Path(sys.executable)).python == (sys.executable,)
    assert pyenv.resolve(SPARK_ROOT).root == SPARK_ROOT
    venv = tmp_path / "venv"
    (venv / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert pyenv.resolve(venv).site_dirs == (venv / "lib/python3.12/site-packages",)
    with pytest.raises(pyenv.NotAnEnvironment, match="does not exist"):
        pyenv.resolve(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(pyenv.NotAnEnvironment, match="not an interpreter"):
        pyenv.resolve(tmp_path / "empty")
    with pytest.raises(pyenv.NotAnEnvironment):
        pyenv.interpreter_paths(["/bin/false"])


def test_an_interpreter_is_asked_for_its_path() -> None:
    env = pyenv.for_python([sys.executable])
    assert env.site_dirs and all(d.is_dir() for d in env.site_dirs)


def test_torch_build_reads_an_answer_or_says_why(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text(
        '#!/bin/sh\necho \'{"version": "2.11.0+cu130", "cuda": "13.0", '
        '"arch_list": ["sm_90", "sm_120", "compute_120"]}\'\n'
    )
    fake.chmod(0o755)
    build = pyenv.torch_build([str(fake)])
    assert isinstance(build, pyenv.TorchBuild) and build.arch_list[-1] == "compute_120"
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named torch' >&2\nexit 1\n")
    broken.chmod(0o755)
    assert pyenv.torch_build([str(broken)]) == "ModuleNotFoundError: No module named torch"


def test_a_hung_interpreter_is_killed_with_what_it_started(tmp_path: Path) -> None:
    # a --python script that started a child and hung: the timeout killed the script, and the
    # child ran on after sparkdiag had exited
    pidfile = tmp_path / "child.pid"
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nsleep 300\n")
    script.chmod(0o755)
    answer, why = pyenv.run_json([str(script), "-c", "x"], timeout=1.0)
    assert answer is None and why is not None and "did not answer within 1 s" in why
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILLed: gone once its parent (init, here) reaps it
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()


def test_an_interpreter_that_floods_its_output_is_held_to_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pyenv, "OUTPUT_LIMIT", 4096)
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nhead -c 1000000 /dev/zero | tr '\\0' x\necho\necho '[1]'\n")
    script.chmod(0o755)
    assert pyenv.run_json([str(script)], timeout=30.0) == ([1], None)
    quiet = tmp_path / "quiet"
    quiet.write_text("#!/bin/sh\nexit 0\n")
    quiet.chmod(0o755)
    _, why = pyenv.run_json([str(quiet)], timeout=30.0)
    assert why is not None and "is it a Python interpreter?" in why


def test_python_given_by_a_bare_name_is_the_file_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 'native --python fakepy' in its directory: the file exists, and was then looked up in
    # PATH ('No such file or directory: fakepy')
    site = tmp_path / "site-packages"
    site.mkdir()
    script = tmp_path / "fakepy"
    script.write_text(f"#!/bin/sh\necho '[\"{site}\"]'\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    assert pyenv.resolve(Path("fakepy")).site_dirs == (site,)


# -- the dtype order ------------------------------------------------------------------------


def test_the_dtype_table_decides_which_pairs_are_judged() -> None:
    assert dtypes.runs_natively("fp8", (8, 9)) and not dtypes.runs_natively("fp8", (8, 6))
    assert dtypes.runs_natively("nvfp4", (12, 1)) and not dtypes.runs_natively("nvfp4", (9, 0))
    assert not dtypes.runs_natively("fp64", (9, 0))
    figures = [
        ("nvfp4", "8192x8192x8192", 150.0),
        ("fp8", "8192x8192x8192", 207.7),
        ("bf16", "8192x8192x8192", 99.8),
        ("nvfp4", "1x8192x8192", 0.5),
        ("fp8", "1x8192x8192", 0.9),
    ]
    gb10 = dtypes.orders(figures, (12, 1))
    assert [(o.dtype, o.wider, o.slower) for o in gb10] == [
        ("nvfp4", "fp8", True),
        ("fp8", "bf16", False),
    ]
    assert [o.dtype for o in dtypes.orders(figures, (9, 0))] == ["fp8"]  # no nvfp4 on Hopper


def _probe(gpu_sample: object, figures: list[tuple[str, float]]) -> GpuProbe:
    return GpuProbe(
        gpu_sample,  # type: ignore[arg-type]
        figures=tuple(
            GemmFigure(d, "8192x8192x8192", "compute", 0, "ok", None, v, v, None, None, True)
            for d, v in figures
        ),
    )


def test_dtype_order_row() -> None:
    snap = poll(NVML / "gb10-idle.json", sysfs=SYSFS / "dgx-spark")
    gpu = snap.gpus[0]
    slow = context(snap, probes={0: _probe(gpu, [("nvfp4", 150), ("fp8", 207.7), ("bf16", 99.8)])})
    r = only(check_dtype_order(slow))
    assert r.status == "warn" and r.finding.startswith("nvfp4 delivers 0.72x of fp8")
    assert "sm_121a" in r.action
    fine = context(snap, probes={0: _probe(gpu, [("nvfp4", 415), ("fp8", 207.7), ("bf16", 99.8)])})
    assert only(check_dtype_order(fine)).status == "pass"
    alone = context(snap, probes={0: _probe(gpu, [("bf16", 99.8)])})
    assert only(check_dtype_order(alone)).status == "skip"


def test_checks_probe_measures_what_the_dtype_order_row_compares() -> None:
    """The row compares the figures of check's own probe, whose suite held bf16, fp16 and int4
    only: on every real run (H200, H100) it skipped, "no pair of dtypes to compare", and the
    unit test above, fed figures by hand, could not see it. Every dtype of its pairs is planned
    at a compute shape by the worker's check suite (the GPU decides what runs)."""
    from sparkdiag.probe.worker.contract import SUITES

    check = SUITES["check"]
    assert "compute" in check.kinds
    assert {d for pair in dtypes.PAIRS for d in pair} <= set(check.dtypes)


# -- check, exporter, command ---------------------------------------------------------------


def _spark_context() -> object:
    snap = poll(NVML / "gb10-idle.json", sysfs=SYSFS / "dgx-spark", rootfs=SPARK_ROOT)
    return context(snap, libraries=scan(environment(SPARK_ROOT, None)))


def test_native_code_rows_on_the_spark_root() -> None:
    rows = check_native_code(_spark_context())  # type: ignore[arg-type]
    assert [(r.status, r.data["libraries"][0]["package"]) for r in rows] == [
        ("fail", "flash-attn"),
        ("warn", "vllm"),
    ]
    vllm = rows[1]
    assert vllm.gpu == "0" and "+1 more" in vllm.finding
    assert len(vllm.data["libraries"]) == 2
    assert "vllm-project/vllm#50925" in vllm.action


def test_native_code_passes_and_skips() -> None:
    snap = poll(NVML / "gb10-idle.json", sysfs=SYSFS / "dgx-spark")
    good = scan(pyenv.resolve(SPARK_ROOT / "usr/local/lib/python3.12/dist-packages"))
    kept = tuple(lib for lib in good.libraries if lib.package in ("torch", "nvidia-cublas"))
    r = only(check_native_code(context(snap, libraries=replace(good, libraries=kept))))
    assert (r.status, r.finding.startswith("all 2 libraries")) == ("pass", True)
    empty = replace(good, libraries=())
    assert only(check_native_code(context(snap, libraries=empty))).status == "skip"
    r = only(check_native_code(context(snap, libraries_note="the libraries could not be read")))
    assert (r.status, r.finding) == ("skip", "the libraries could not be read")


def test_the_collector_exports_one_series_per_library_and_gpu() -> None:
    snap = poll(NVML / "gb10-idle.json", sysfs=SYSFS / "dgx-spark", rootfs=SPARK_ROOT)
    watch = LibraryWatch(lambda: environment(SPARK_ROOT, None), None)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NativeCollector(lambda: snap, watch))
    assert registry.get_sample_value("sparkdiag_cuda_library_scan_timestamp_seconds") is None
    watch.scan_once()
    uuid = snap.gpus[0].identity.uuid

    def mode(library: str, mode: str, target: str, package: str = "vllm") -> float | None:
        labels = {
            "gpu": "0",
            "uuid": uuid,
            "package": package,
            "library": library,
            "mode": mode,
            "target": target,
        }
        return registry.get_sample_value("sparkdiag_cuda_library_info", labels)

    assert mode("vllm/_moe_C.abi3.so", "ptx-jit", "compute_80") == 1
    assert mode("vllm/_moe_C_stable_libtorch.abi3.so", "native", "sm_120") == 1
    assert mode("torch/lib/libtorch_cuda.so", "native", "sm_120", "torch") == 1
    flash = "flash_attn_2_cuda.cpython-312-aarch64-linux-gnu.so"
    assert mode(flash, "none", "", "flash-attn") == 1
    assert registry.get_sample_value("sparkdiag_cuda_library_scan_duration_seconds") is not None


def test_a_probe_python_with_arguments_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    wrapper = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    watch = LibraryWatch(lambda: environment(Path("/"), wrapper), None)
    watch.scan_once()
    assert watch.latest is None and "is a command, not an interpreter" in (watch.error or "")
    assert not marker.exists()
    assert environment(Path("/"), [sys.executable]).python == (sys.executable,)


def test_a_watch_that_cannot_find_its_environment_says_why() -> None:
    def missing() -> pyenv.PythonEnvironment:
        raise pyenv.NotAnEnvironment("nowhere")

    watch = LibraryWatch(missing, None)
    watch.scan_once()
    assert watch.latest is None and watch.error == "nowhere"


def _native(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-m", "sparkdiag", "native", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_native_command_on_the_spark_root(tmp_path: Path) -> None:
    common = ("--path.rootfs", str(SPARK_ROOT), "--state-dir", str(tmp_path))
    done = _native("--nvml-fixture", str(NVML / "gb10-idle.json"), *common)
    assert done.returncode == 3, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 100 for line in lines)  # not a terminal: 100 columns
    assert "GPU 0 NVIDIA GB10 (sm_121): 3 native, 1 through PTX JIT, 1 cannot run" in lines
    assert any(line.startswith("  FAIL  flash-attn 2.8.3") for line in lines)
    assert "(2 native, not listed: --all lists them)" in done.stdout
    doc = json.loads(_native("--capability", "9.0", "--json", *common).stdout)
    assert doc["format"] == "sparkdiag-native/1" and doc["status"] == "fail"  # cuBLAS: sm_121
    assert {v["package"]: v["mode"] for v in doc["verdicts"]}["nvidia-cublas"] == "none"
    assert doc["scan"]["cached"] == 6  # the first run's cache


def test_the_text_fits_80_columns() -> None:
    found = scan(environment(SPARK_ROOT, None))
    build = pyenv.TorchBuild("2.9.0+cu130", "13.0", ("sm_80", "sm_90", "sm_120", "compute_120"))
    report = NativeReport(found, (GB10, H200), tuple(lint(found, (GB10, H200))), build, "")
    shown = text(report, 80, show_all=True)
    assert max(len(line) for line in shown.splitlines()) <= 80
    assert "  on GPU 0 (sm_121): native from sm_120" in shown
    assert "PASS  torch 2.9.0+cu130: torch/lib/libtorch_cuda.so" in shown
    assert report.status == "fail"
    assert report.as_json()["torch"]["on"][0] == {"gpu": "0", "mode": "native", "target": "sm_120"}


def test_without_a_gpu_it_lists_the_libraries_and_says_how_to_judge(tmp_path: Path) -> None:
    """Before: 'sparkdiag native' on a machine without a GPU (docs/native.md's first example)
    was a usage error, exit 2: "no GPU with a known compute capability: give --capability
    X.Y", which its help's exit statuses did not cover."""
    common = ("--path.rootfs", str(SPARK_ROOT), "--state-dir", str(tmp_path))
    done = _native("--nvml-fixture", str(NVML / "no-nvml.json"), *common)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 100 for line in lines)
    assert (
        "not judged: no GPU here with a known compute capability, and no --capability. To judge "
        "for the GPU the software is for: --capability 9.0 (H100, H200), --capability 12.1 (DGX "
        "Spark, GB10); repeatable"
    ) in " ".join(done.stdout.split())
    assert "  flash-attn 2.8.3: flash_attn_2_cuda.cpython-312-aarch64-linux-gnu.so" in lines
    assert "        SASS sm_90, sm_80" in lines
    assert "  vllm 0.11.1: vllm/_moe_C.abi3.so" in lines and "        PTX compute_80" in lines
    assert "PASS" not in done.stdout and "FAIL" not in done.stdout
    assert not any(line.startswith("Error:") for line in done.stderr.splitlines())
    doc = json.loads(
        _native("--nvml-fixture", str(NVML / "no-nvml.json"), "--json", *common).stdout
    )
    assert doc["status"] == "not-judged" and doc["gpus"] == [] and doc["verdicts"] == []
    assert "--capability 12.1 (DGX Spark, GB10)" in doc["note"]
    assert len(doc["scan"]["libraries"]) == 5
    judged = json.loads(_native("--capability", "12.1", "--json", *common).stdout)
    assert judged["note"] == "" and judged["status"] == "fail"
    shown = " ".join(invoke_cli("native", "--help").stdout.split())
    assert "or nothing was judged: no GPU here and no --capability" in shown


@pytest.mark.parametrize("printed", ['["/"]', "[]"])
def test_an_interpreter_with_no_package_directory_is_not_judged(
    tmp_path: Path, printed: str
) -> None:
    """Before: an interpreter whose sys.path held no package directory said "0 package
    directories ... no library" and exited 0, a pass for what was never looked at."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\necho '{printed}'\n")
    script.chmod(0o755)
    common = ("--python", str(script), "--capability", "12.1", "--no-torch")
    done = _native(*common, "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 1, done.stdout + done.stderr
    shown = " ".join(done.stdout.split())
    assert f"not judged: {script} has no package directory" in shown
    assert "so no library was looked at" in shown and "--python" in shown
    assert "no library" not in done.stdout.replace("so no library", "")
    doc = json.loads(_native(*common, "--json", "--no-cache").stdout)
    assert doc["status"] == "not-judged" and "has no package directory" in doc["note"]
    help_text = " ".join(invoke_cli("native", "--help").stdout.split())
    assert "or the environment has no package directory" in help_text


def test_native_command_bad_input() -> None:
    done = _native("--capability", "twelve")
    assert done.returncode == 2 and "expected MAJOR.MINOR" in done.stderr
    assert "Traceback" not in done.stderr
    done = _native("--capability", "9.0", "--python", "/nonexistent")
    assert done.returncode == 2 and "does not exist" in done.stderr


def _site_with_a_stub(tmp_path: Path) -> Path:
    """A site-packages with a cuFFT-shaped library and a torch-shaped one (sm_90a)."""
    site = tmp_path / "site-packages"
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    shutil.copy(FATBIN / "cufft-like.so", site / "nvidia/cu13/lib/libcufft.so.12")
    (site / "torch" / "lib").mkdir(parents=True)
    shutil.copy(FATBIN / "sm90a.so", site / "torch/lib/libtorch_cuda.so")
    return site


def test_a_stub_is_listed_as_not_judged_and_left_out_of_verdicts(tmp_path: Path) -> None:
    site = _site_with_a_stub(tmp_path)
    common = ("--python", str(site), "--capability", "9.0", "--state-dir", str(tmp_path))
    done = _native(*common, "--no-torch")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = lines.index("not judged: its kernels are not in its fat binary")
    assert lines[at + 1 : at + 3] == [
        "  nvidia: nvidia/cu13/lib/libcufft.so.12",
        "        920 B of fat binary (SASS sm_75) in a 0.1 MiB library",
    ]
    assert "compute capability 9.0 (sm_90): 1 native" in lines
    doc = json.loads(_native(*common, "--json").stdout)
    assert doc["status"] == "pass"
    assert [v["library"] for v in doc["verdicts"]] == [str(site / "torch/lib/libtorch_cuda.so")]
    (stub,) = doc["not_judged"]
    assert stub["relative"] == "nvidia/cu13/lib/libcufft.so.12"
    assert (stub["fatbin_bytes"], stub["size_bytes"], stub["sass"]) == (920, 148904, ["sm_75"])
    assert stub["reason"] == "not judged: its kernels are not in its fat binary"
    found = scan(pyenv.resolve(site))
    shown = text(NativeReport(found, (H200,), tuple(lint(found, (H200,))), None, ""), 80)
    # the environment's own path is never folded (it is copied from there; a pytest-xdist
    # worker's tmp_path is 88 characters): the rest fits
    laid_out = shown.replace(str(tmp_path), "TMP")
    assert max(len(line) for line in laid_out.splitlines()) <= 80, shown


def test_a_stub_is_no_check_finding_and_no_series(tmp_path: Path) -> None:
    site = _site_with_a_stub(tmp_path)
    found = scan(pyenv.resolve(site))
    snap = poll(NVML / "h200-idle.json")
    r = only(check_native_code(context(snap, libraries=found)))
    assert r.status == "pass" and r.finding.startswith("all 1 libraries with GPU code")
    assert r.finding.endswith(
        "not judged, their kernels are not in their fat binaries: libcufft.so.12"
    )
    assert [s["relative"] for s in r.data["not_judged"]] == ["nvidia/cu13/lib/libcufft.so.12"]
    stubs_only = replace(found, libraries=tuple(not_judged(found.libraries)))
    r = only(check_native_code(context(snap, libraries=stubs_only)))
    assert r.status == "skip" and "whose kernels are in its fat binary" in r.finding
    watch = LibraryWatch(lambda: pyenv.resolve(site), None)
    watch.scan_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NativeCollector(lambda: snap, watch))
    series = [
        s.labels["library"]
        for metric in registry.collect()
        for s in metric.samples
        if s.name == "sparkdiag_cuda_library_info"
    ]
    assert series and set(series) == {"torch/lib/libtorch_cuda.so"}


def test_a_stop_kills_the_scan_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon stopping during a cold scan: the scan's process is killed at once and the
    loop ends (it used to wait for the whole scan: the daemon's stop took the thread's 5 s
    join, and the scan's process outlived the daemon)."""
    pidfile = tmp_path / "scan.pid"
    script = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    monkeypatch.setattr(native_watch, "SCAN_CHILD", ("-c", script))
    libraries = LibraryWatch(lambda: environment(SPARK_ROOT, None), tmp_path)
    stop = threading.Event()
    thread = threading.Thread(target=libraries.run, args=(stop,), daemon=True)
    thread.start()
    written = wait_for(lambda: pidfile.exists() and pidfile.read_text(), 30, every=0.02)
    assert written, "the scan's process never started"
    child = int(written)
    stopped = time.monotonic()
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive() and time.monotonic() - stopped < 2
    assert not Path(f"/proc/{child}").exists()  # killed and reaped
    assert libraries.latest is None and libraries.error is None
    assert "scan failed" not in caplog.text


def test_an_interpreter_that_leaves_a_process_holding_its_output_is_read_at_once(
    tmp_path: Path,
) -> None:
    """A --python script that started a process in a session of its own, which held standard
    output open, cost 10 s (two readers joined 5 s each) and its JSON was lost: the readers
    asked for 64 KiB at a time and kept nothing until the end of the stream (the review)."""
    import time

    from sparkdiag.sources.software.pyenv import run_json

    script = tmp_path / "python"
    script.write_text(
        "#!/usr/bin/env python3\n"
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    open({str(tmp_path / 'child.pid')!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(30)\n"
        "    os._exit(0)\n"
        "print('[\"/\"]', flush=True)\n"
    )
    script.chmod(0o755)
    started = time.monotonic()
    try:
        assert run_json([str(script)], 30) == (["/"], None)
        assert time.monotonic() - started < 5
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
            os.kill(int((tmp_path / "child.pid").read_text()), 9)


def _info_series(watch: LibraryWatch, snap: object) -> list[dict[str, str]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NativeCollector(lambda: snap, watch))  # type: ignore[arg-type, return-value]
    return [
        s.labels
        for metric in registry.collect()
        for s in metric.samples
        if s.name == "sparkdiag_cuda_library_info"
    ]


def test_a_file_name_that_is_not_utf8_is_shown_and_scraped(tmp_path: Path) -> None:
    """A library whose name is not UTF-8 (a byte 0xe9) failed every scrape with a
    UnicodeEncodeError until it was removed, and stopped `native` with a traceback on a UTF-8
    terminal (found in a review): the byte is shown as \\xe9 in both."""
    from sparkdiag.exporter.registry import render, render_openmetrics

    site = tmp_path / "site-packages"
    (site / "pkg").mkdir(parents=True)
    shutil.copy(FATBIN / "sm90.so", os.fsencode(site / "pkg") + b"/_k\xe9.so")
    watch = LibraryWatch(lambda: pyenv.resolve(site), None)
    watch.scan_once()
    snap = poll(NVML / "h200-idle.json")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NativeCollector(lambda: snap, watch))
    scraped = render(registry).decode("utf-8")
    assert 'library="pkg/_k\\\\xe9.so"' in scraped  # the text \xe9, its backslash escaped
    assert 'library="pkg/_k\\\\xe9.so"' in render_openmetrics(registry).decode("utf-8")
    found = scan(pyenv.resolve(site))
    shown = text(NativeReport(found, (GB10,), tuple(lint(found, (GB10,))), None, ""), 200)
    shown.encode("utf-8")  # raised UnicodeEncodeError
    assert "_k\\xe9.so" in shown


def test_copies_alike_are_one_series_and_a_shadowed_copy_is_not_judged(tmp_path: Path) -> None:
    """The same torch in two package directories gave two identical series (Prometheus refuses
    the duplicate), and in one interpreter's sys.path the copy it never imports could fail the
    lint (found in a review)."""
    new, old = tmp_path / "new" / "site-packages", tmp_path / "old" / "site-packages"
    for site, fixture in ((new, "sm90a.so"), (old, "sm80-ptx80.so")):
        (site / "torch" / "lib").mkdir(parents=True)
        (site / "torch" / "__init__.py").write_text("")
        shutil.copy(FATBIN / fixture, site / "torch/lib/libtorch_cuda.so")
    (old / "nvidia" / "cudnn" / "lib").mkdir(parents=True)  # a namespace package: not hidden
    shutil.copy(FATBIN / "sm90.so", old / "nvidia/cudnn/lib/libcudnn.so.9")
    python = pyenv.PythonEnvironment("python3", (new, old), ("python3",))
    found = scan(python)
    assert [lib.path for lib in found.libraries] == [
        str(old / "nvidia/cudnn/lib/libcudnn.so.9"),
        str(new / "torch/lib/libtorch_cuda.so"),
    ]
    assert found.shadowed == {str(old / "torch/lib/libtorch_cuda.so"): str(new)}
    shown = text(NativeReport(found, (H200,), tuple(lint(found, (H200,))), None, ""), 300)
    assert f"not judged: 1 shadowed, Python imports their packages from {new} first" in shown
    # a root's Pythons are several interpreters: nothing hides, copies alike are one series
    same = tmp_path / "root" / "a" / "site-packages", tmp_path / "root" / "b" / "site-packages"
    for site in same:
        (site / "torch" / "lib").mkdir(parents=True)
        shutil.copy(FATBIN / "sm90a.so", site / "torch/lib/libtorch_cuda.so")
    watch = LibraryWatch(lambda: pyenv.PythonEnvironment("root", same, None), None)
    watch.scan_once()
    series = _info_series(watch, poll(NVML / "h200-idle.json"))
    assert [s["library"] for s in series] == ["torch/lib/libtorch_cuda.so"]


def test_a_capability_is_major_dot_one_digit(tmp_path: Path) -> None:
    """'².1' passed isdigit() and failed int() with a traceback (exit 1); '12.10' was judged as
    sm_1210 (found in a review)."""
    assert parse_capability("12.1") == (12, 1) and parse_capability(" 9.0 ") == (9, 0)
    for bad in ("².1", "12.10", "12", "1\u0662.1", "", "12.1a"):
        assert parse_capability(bad) is None, bad
    site = _site_with_a_stub(tmp_path)
    for bad in ("².1", "12.10"):
        done = _native("--python", str(site), "--capability", bad, "--state-dir", str(tmp_path))
        assert done.returncode == 2 and "expected MAJOR.MINOR" in done.stderr, done.stderr


def test_advice_names_the_gpu_it_is_for() -> None:
    """The flash-attn line said "no build for sm_121" for a GPU of 10.0, and the vLLM line
    spoke of GB10 on every GPU (found in a review): what the reports say of GB10 is said on
    GB10 only."""
    from sparkdiag.native.advice import advice

    on_b200 = advice("flash-attn", (10, 0))
    assert "sm_100" in on_b200 and "sm_121" not in on_b200 and "#1969" not in on_b200
    assert "#1969" in advice("flash-attn", (12, 1))
    assert "GB10" not in advice("vllm", (9, 0)) and "#50925" in advice("vllm", (12, 1))


def test_what_could_not_be_read_is_a_warning_not_all_native(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library that could not be read, or a directory that could not be listed, was not
    judged, and the lint still exited 0 saying every library ran natively (found in a
    review)."""
    from sparkdiag.sources.software import cuda_libraries, elf

    site = _site_with_a_stub(tmp_path)
    (site / "hidden" / "deep").mkdir(parents=True)
    shutil.copy(FATBIN / "sm90.so", site / "hidden/locked.so")
    real_read, real_scandir = cuda_libraries.read_fatbin, os.scandir

    def read(path: Path) -> FatbinReport | None:
        if path.name == "locked.so":
            raise PermissionError(13, "Permission denied")
        return real_read(path)

    def scandir(path: str | Path) -> object:
        if str(path).endswith("deep"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(cuda_libraries, "read_fatbin", read)
    monkeypatch.setattr(elf.os, "scandir", scandir)
    found = scan(pyenv.resolve(site))
    assert found.unreadable == {
        str(site / "hidden/locked.so"): "Permission denied",
        str(site / "hidden/deep"): "cannot list it: Permission denied",
    }
    report = NativeReport(found, (H200,), tuple(lint(found, (H200,))), None, "")
    assert report.status == "warn"  # was pass: exit 0, "1 native"
    r = only(check_native_code(context(poll(NVML / "h200-idle.json"), libraries=found)))
    assert r.status == "warn" and "2 not readable (sparkdiag native names them)" in r.finding
    assert r.finding.startswith("all 1 libraries with GPU code read in")


def test_a_directory_a_pth_file_adds_is_scanned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An editable install's source tree, put on sys.path by a .pth file, was never scanned: it
    holds no *.dist-info and is not named site-packages (found in a review). $PYTHONPATH's
    directories are not walked (a home directory would be walked whole)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    src = tmp_path / "src"
    (src / "myext").mkdir(parents=True)
    (src / "myext" / "__init__.py").write_text("")
    shutil.copy(FATBIN / "sm90.so", src / "myext/_C.so")
    # the project's own environment and build tree: not what this interpreter imports
    (src / ".venv" / "lib" / "torch").mkdir(parents=True)
    shutil.copy(FATBIN / "sm90a.so", src / ".venv/lib/torch/libtorch_cuda.so")
    (src / "build" / "myext").mkdir(parents=True)
    shutil.copy(FATBIN / "sm90.so", src / "build/myext/_C.so")
    (site / "__editable__.myext.pth").write_text(f"{src}\n")
    (site / "myext.egg-link").write_text(f"{src}\n")  # no import of myext: hides nothing
    home = tmp_path / "home"
    (home / "junk").mkdir(parents=True)
    shutil.copy(FATBIN / "sm90.so", home / "junk/_x.so")
    monkeypatch.setenv("PYTHONPATH", str(home))
    env = pyenv.for_python([str(venv / "bin" / "python")])
    assert env.site_dirs == (site, src)
    found = scan(env)
    assert [(lib.relative, lib.package) for lib in found.libraries] == [("myext/_C.so", "myext")]


def test_a_plain_cubin_of_the_gpu_beside_an_arch_specific_build_of_its_major_warns() -> None:
    """TORCH_CUDA_ARCH_LIST="9.0a;10.0a;12.0a;12.1" passed on GB10 while the same build with
    12.0 warned: both lack sm_121a, so the kernels built only for "a" targets fall back
    (found in a review). Arch-specific builds of other majors only, beside a plain cubin of
    this GPU (CuPy's cub on the H200: sm_100f, sm_120f and sm_90), stay a pass."""

    def lib(*sass: str) -> CudaLibrary:
        report = FatbinReport(sass=dict.fromkeys(sass, 1), containers=1, fatbin_bytes=1 << 20)
        return CudaLibrary("/x/_C.so", "x/_C.so", "x", "1", 1 << 21, report)

    built = lib("sm_121", "sm_120a", "sm_100a", "sm_90a")
    v = judge_library(built, GB10)
    assert (v.status, v.verdict.target) == ("warn", "sm_121")
    assert v.reason.startswith("runs sm_121 SASS; its arch-specific builds (")
    assert judge_library(lib("sm_120", "sm_120a", "sm_100a"), GB10).status == "warn"  # as before
    assert judge_library(lib("sm_121a", "sm_121", "sm_120a"), GB10).status == "pass"
    assert judge_library(lib("sm_100f", "sm_120f", "sm_90", "sm_80"), H200).status == "pass"


def test_the_daemons_stop_kills_a_sys_path_question_under_way(tmp_path: Path) -> None:
    """A --probe.python slow to answer its sys.path question was left running under init when
    the daemon stopped, which waited 5 s for the scan's thread (found in a review): the stop's
    kill takes it too."""
    from sparkdiag.scheduling.wiring import stop_workers

    slow = tmp_path / "python"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    answered: list[object] = []
    asking = threading.Thread(target=lambda: answered.append(pyenv.run_json([str(slow)], 60)))
    started = time.monotonic()
    asking.start()
    wait_for(lambda: bool(pyenv._LIVE), 5)
    assert stop_workers() >= 1
    asking.join(timeout=10)
    assert not asking.is_alive() and time.monotonic() - started < 5
    assert answered[0][0] is None and not pyenv._LIVE  # type: ignore[index]
