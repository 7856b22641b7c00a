"""The fat binary reader against cuobjdump, on libraries nvcc built (tests/fixtures/fatbin/).

Each fixture's ``NAME.cuobjdump.txt`` is cuobjdump 13.4's ``--list-elf --list-ptx`` listing of
``NAME.so`` as ``build.sh`` recorded it; where a cuobjdump is installed (CUOBJDUMP, PATH,
/usr/local/cuda/bin) the listing is also taken live.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from sparkdiag.sources.software import fatbin
from sparkdiag.sources.software.elf import FileReader, NotElf, read_sections, walk_libraries
from sparkdiag.sources.software.fatbin import Target, as_cuobjdump, cuobjdump_listing, read_fatbin

FIXTURES = Path(__file__).parent / "fixtures" / "fatbin"
LIBRARIES = sorted(p for p in FIXTURES.glob("*.so") if p.name != "no-cuda.so")


def _cuobjdump() -> str | None:
    for candidate in (
        os.environ.get("CUOBJDUMP"),
        shutil.which("cuobjdump"),
        "/usr/local/cuda/bin/cuobjdump",
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.mark.parametrize("library", LIBRARIES, ids=lambda p: p.name)
def test_listing_agrees_with_recorded_cuobjdump(library: Path) -> None:
    report = read_fatbin(library)
    assert report is not None and report.problems == ()
    recorded = (FIXTURES / (library.name[:-3] + ".cuobjdump.txt")).read_text()
    sass, ptx = cuobjdump_listing(recorded)
    assert sass or ptx  # the recording lists something
    assert as_cuobjdump(report) == (sass, ptx)


@pytest.mark.skipif(_cuobjdump() is None, reason="no cuobjdump installed")
@pytest.mark.parametrize("library", LIBRARIES, ids=lambda p: p.name)
def test_listing_agrees_with_live_cuobjdump(library: Path) -> None:
    binary = _cuobjdump()
    assert binary is not None
    run = fatbin.run_cuobjdump(binary, library)
    assert run.error is None
    report = read_fatbin(library)
    assert report is not None
    assert as_cuobjdump(report) == cuobjdump_listing(run.text)


def test_variants_and_kinds_are_told_apart() -> None:
    def targets(name: str) -> list[str]:
        report = read_fatbin(FIXTURES / f"{name}.so")
        assert report is not None
        return [t.name for t in report.targets()]

    assert targets("sm90a") == ["sm_90a"]
    assert targets("sm90") == ["sm_90"]
    assert targets("sm121a") == ["sm_121a"]
    assert targets("sm120f") == ["sm_120f"]  # cuobjdump 13.4 lists it as sm_120
    assert targets("ptx120f") == ["compute_120f"]
    assert targets("ptx121a") == ["compute_121a"]
    assert targets("sm80-ptx80") == ["sm_80", "compute_80"]
    assert "sm_120" in (FIXTURES / "sm120f.cuobjdump.txt").read_text()


def test_compression_is_read_from_the_entry_flags() -> None:
    plain = read_fatbin(FIXTURES / "sm80-ptx80.so")
    packed = read_fatbin(FIXTURES / "sm80-ptx80-zstd.so")
    assert plain is not None and packed is not None
    assert plain.compression == {"none": 2}
    assert packed.compression == {"zstd": 2}
    assert packed.fatbin_bytes < plain.fatbin_bytes
    assert plain.ptx_isa == {"compute_80": "9.0"}  # CUDA 13.0 writes PTX ISA 9.0


def test_two_translation_units_are_two_containers() -> None:
    report = read_fatbin(FIXTURES / "vllm-moe-published.so")
    assert report is not None
    assert report.containers == 2
    assert report.sass["sm_120"] == 2 and report.ptx == {"compute_80": 2}
    assert "sm_121" not in report.sass and "sm_121a" not in report.sass


def test_relocatable_code_is_counted_apart() -> None:
    # cuobjdump lists only the device-linked cubin; the -rdc input (with its PTX) is not loaded
    report = read_fatbin(FIXTURES / "rdc-sm90.so")
    assert report is not None
    assert report.sass == {"sm_90": 1} and report.ptx == {}
    assert report.relocatable == {"sm_90": 1, "compute_90": 1}


def test_a_library_without_device_code() -> None:
    assert read_fatbin(FIXTURES / "no-cuda.so") is None


def test_not_an_elf_file(tmp_path: Path) -> None:
    text = tmp_path / "libtext.so"
    text.write_text("INPUT(libc.so.6)\n")  # a linker script named like a library
    with pytest.raises(NotElf):
        read_fatbin(text)


def test_a_truncated_library_is_not_elf(tmp_path: Path) -> None:
    cut = tmp_path / "cut.so"
    cut.write_bytes((FIXTURES / "sm90.so").read_bytes()[:3000])
    with pytest.raises(NotElf):
        read_fatbin(cut)


def test_a_damaged_container_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    data = bytearray((FIXTURES / "vllm-moe-published.so").read_bytes())
    with (FIXTURES / "vllm-moe-published.so").open("rb") as fh:
        section = {s.name: s for s in read_sections(FileReader(fh))}[".nv_fatbin"]
    struct.pack_into("<Q", data, section.offset + 8, 1 << 40)  # first container's size
    damaged = tmp_path / "damaged.so"
    damaged.write_bytes(bytes(data))
    report = read_fatbin(damaged)
    assert report is not None
    assert report.sass == {} and report.problems
    assert "runs past the section" in report.problems[0]


@pytest.mark.parametrize("arch", [2**32 - 1, 0, 1000])
def test_an_implausible_architecture_is_damage_not_a_target(tmp_path: Path, arch: int) -> None:
    """Before: an entry whose architecture field read 2**32 - 1 was listed as a target,
    sm_4294967295 (the hostile review)."""
    data = bytearray((FIXTURES / "sm90.so").read_bytes())
    with (FIXTURES / "sm90.so").open("rb") as fh:
        section = {s.name: s for s in read_sections(FileReader(fh))}[".nv_fatbin"]
    first_entry = section.offset + 16  # after the first container's header
    assert struct.unpack_from("<I", data, first_entry + 28)[0] == 90
    struct.pack_into("<I", data, first_entry + 28, arch)
    damaged = tmp_path / "damaged.so"
    damaged.write_bytes(bytes(data))
    report = read_fatbin(damaged)
    assert report is not None
    assert not any(name.endswith(f"_{arch}") for name in (*report.sass, *report.ptx))
    (problem,) = report.problems
    assert problem == (
        f".nv_fatbin: 1 entry names an architecture no GPU has ({arch}; plausible: 10 to "
        "999): damaged, not counted as targets"
    )


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, offset: int, size: int) -> bytes:
        return self.data[offset : offset + size]


def test_padding_between_containers_is_skipped() -> None:
    with (FIXTURES / "vllm-moe-published.so").open("rb") as fh:
        reader = FileReader(fh)
        section = {s.name: s for s in read_sections(reader)}[".nv_fatbin"]
        raw = reader.read(section.offset, section.size)
    size = struct.unpack_from("<HQ", raw, 6)
    first_end = 16 + size[1]
    padded = raw[:first_end] + bytes(5000) + raw[first_end:]  # more than one search chunk
    walk = fatbin._Walk()
    walk.section(_Bytes(padded), 0, len(padded), ".nv_fatbin")
    assert walk.containers == 2 and walk.problems == []
    assert walk.sass["sm_90a"] == 2


def test_reads_headers_only() -> None:
    library = FIXTURES / "vllm-moe-published.so"
    with library.open("rb") as fh:
        reader = FileReader(fh)
        fatbin.walk(reader)
    # ELF header, section table, names; per container one header; per entry one header
    assert reader.reads <= 3 + 2 + 18 + 2
    assert reader.bytes < library.stat().st_size


def test_a_trace_replays_to_the_same_report(tmp_path: Path) -> None:
    library = FIXTURES / "vllm-moe-source.so"
    doc = fatbin.trace_document(library)
    again = fatbin.replay(json.loads(json.dumps(doc)))
    assert again is not None and doc["report"] == again.as_json()
    assert len(json.dumps(doc["reads"])) < library.stat().st_size * 2
    with pytest.raises(ValueError):
        fatbin.replay({"format": "other"})


def test_target_names() -> None:
    assert Target.parse("sm_121a") == Target(121, "a", False)
    assert Target.parse("compute_80").name == "compute_80"
    assert Target.parse("sm_120f").capability == (12, 0)
    assert Target.parse("sm_100").capability == (10, 0)
    for bad in ("sm_", "sm_x", "gfx90a", "compute"):
        with pytest.raises(ValueError):
            Target.parse(bad)
    assert sorted([Target.parse("compute_80"), Target.parse("sm_90")])[0].name == "compute_80"


def test_walk_libraries_finds_files_not_links(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libx.so.12.1").write_bytes(b"x")
    (tmp_path / "lib" / "libx.so.12").symlink_to("libx.so.12.1")
    (tmp_path / "mod.cpython-312-x86_64-linux-gnu.so").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("x")
    found = sorted(p.name for p in walk_libraries(tmp_path))
    assert found == ["libx.so.12.1", "mod.cpython-312-x86_64-linux-gnu.so"]


def test_cuobjdump_listing_parses_info_lines() -> None:
    text = (
        "ELF file    1: x.1.sm_90a.cubin\nPTX file    1: x.1.sm_80.ptx\n"
        "cuobjdump info    : No PTX file found\n"
    )
    sass, ptx = cuobjdump_listing(text)
    assert sass == {"sm_90a": 1} and ptx == {"compute_80": 1}


TRACES = sorted((FIXTURES / "traces").glob("*.json.gz"))
BITSANDBYTES = [t for t in TRACES if t.name.startswith("bitsandbytes-")]
H200_SCAN = FIXTURES.parents[2] / "docs/device/2026-12-03/call-b/native/scan.json"


def _replay(trace: Path) -> tuple[dict[str, Any], fatbin.FatbinReport]:
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    report = fatbin.replay(doc)
    assert report is not None
    return doc, report


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_traces_of_real_libraries_replay_and_agree_with_cuobjdump(trace: Path) -> None:
    doc, report = _replay(trace)
    assert report.as_json() == doc["report"] and report.problems == ()
    listing = (FIXTURES / "traces" / trace.name.replace(".json.gz", ".cuobjdump.txt")).read_text()
    sass, ptx = cuobjdump_listing(listing)
    if "fatal" in listing:  # cuobjdump 13.4 stops after the first cubin of this one
        assert sum(sass.values()) == 1 and sass <= as_cuobjdump(report)[0]
        assert len(report.sass) == 7
    else:
        assert as_cuobjdump(report) == (sass, ptx)


def test_bitsandbytes_builds_relocatable_code() -> None:
    assert len(BITSANDBYTES) == 4
    assert all(_replay(trace)[1].relocatable for trace in BITSANDBYTES)


def test_the_traces_read_as_the_h200_read_its_libraries() -> None:
    # torch's and cuDNN's traces were recorded on the H200; cuFFT's and cuFile's here, from
    # the same wheels (nvidia-cufft 12.0.0.61, nvidia-cufile 1.15.1.6) as it had installed
    recorded = {lib["relative"]: lib for lib in json.loads(H200_SCAN.read_text())["libraries"]}
    seen = []
    for trace in TRACES:
        doc, report = _replay(trace)
        if doc["library"] not in recorded:
            continue
        on_h200 = recorded[doc["library"]]
        assert doc["size_bytes"] == on_h200["size_bytes"]
        assert report.as_json() == {k: on_h200[k] for k in report.as_json()}
        seen.append(doc["library"])
    assert sorted(seen) == [
        "nvidia/cu13/lib/libcufft.so.12",
        "nvidia/cu13/lib/libcufftw.so.12",
        "nvidia/cu13/lib/libcufile.so.0",
        "nvidia/cudnn/lib/libcudnn_adv.so.9",
        "nvidia/cudnn/lib/libcudnn_cnn.so.9",
        "torch/lib/libtorch_cuda.so",
        "torch/lib/libtorch_cuda_linalg.so",
    ]


def test_the_real_libraries_compression() -> None:
    # the device-linked cubins are stored plain up to CUDA 12.8 and zstd-compressed by 13.2
    kinds = {}
    for trace in BITSANDBYTES:
        report = fatbin.replay(json.loads(gzip.decompress(trace.read_bytes())))
        assert report is not None
        kinds[trace.name.split("_cuda")[1][:3]] = set(report.compression)
    assert kinds == {"118": {"none"}, "121": {"none"}, "128": {"none"}, "132": {"zstd"}}


class _Counted(_Bytes):
    """Bytes that refuse to be read more than ``limit`` times: a walk that loops fails."""

    def __init__(self, data: bytes, limit: int = 100) -> None:
        super().__init__(data)
        self.reads, self.limit = 0, limit

    def read(self, offset: int, size: int) -> bytes:
        self.reads += 1
        assert self.reads <= self.limit, "the walk does not end"
        return super().read(offset, size)


@pytest.mark.parametrize("tail", [9, 10, 11])
def test_a_section_of_padding_ends_the_search(tail: int) -> None:
    # the gap search stepped (len - 3) // 8 * 8 bytes: 0 for a last chunk of 9 or 10 bytes,
    # so a .nv_fatbin of zeros 4088 + 10 bytes long read the same 10 bytes for ever
    data = bytes(fatbin.GAP_CHUNK - 8 + tail)
    walk = fatbin._Walk()
    walk.section(_Counted(data), 0, len(data), ".nv_fatbin")
    assert walk.containers == 0 and walk.problems == []


def _elf(shoff: int, section: tuple[int, int]) -> bytes:
    """A 64-bit ELF file of a header and a table of three sections: none, .nv_fatbin at
    ``section`` (offset, size), and the names."""
    names = b"\0.nv_fatbin\0.shstrtab\0"
    table_at = 64 + len(names)
    null = struct.pack("<IIQQQQIIQQ", *([0] * 10))
    fat = struct.pack("<IIQQQQIIQQ", 1, 1, 0, 0, *section, 0, 0, 8, 0)
    strtab = struct.pack("<IIQQQQIIQQ", 12, 3, 0, 0, 64, len(names), 0, 0, 1, 0)
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    header = struct.pack(
        "<16sHHIQQQIHHHHHH", ident, 3, 62, 1, 0, 0,
        table_at if shoff < 0 else shoff, 0, 64, 0, 0, 64, 3, 2,
    )  # fmt: skip
    return header + names + null + fat + strtab


@pytest.mark.parametrize(
    ("shoff", "section"),
    [
        (2**64 - 1, (64, 16)),  # the section table at an offset seek cannot take
        (-1, (2**64 - 16, 64)),  # .nv_fatbin there
        (-1, (2**63 + 5, 1 << 40)),
        (-1, (10**15, 1 << 40)),  # past the largest file ext4 holds: EINVAL from seek
    ],
)
def test_offsets_past_the_end_are_damage_not_a_crash(
    tmp_path: Path, shoff: int, section: tuple[int, int]
) -> None:
    library = tmp_path / "libhostile.so"
    library.write_bytes(_elf(shoff, section))
    try:
        report = read_fatbin(library)  # was ValueError or OSError (EINVAL): a traceback
    except NotElf as exc:
        assert "past the end" in str(exc)
        return
    assert report is not None and report.sass == {}
    assert report.problems and "cut short" in report.problems[0]
