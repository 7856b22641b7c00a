"""Host memory, swap-ins and memory pressure from procfs (sources/host/meminfo.py): the parsers, the
fixture roots, and the real /proc."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkdiag.snapshot import MemoryPressure
from sparkdiag.sources.host.meminfo import (
    parse_meminfo,
    parse_pressure,
    parse_swap_in,
    read_host_memory,
)

ROOTFS = Path(__file__).parent / "fixtures" / "rootfs"
KIB = 1024.0


def test_meminfo_in_bytes_with_the_page_cache_as_free_counts_it() -> None:
    text = (
        "MemTotal:       127600748 kB\nMemFree:        118912404 kB\n"
        "MemAvailable:   123522867 kB\nBuffers:            5312 kB\n"
        "Cached:          3398120 kB\nSReclaimable:     421904 kB\nHugePages_Total:       0\n"
    )
    assert parse_meminfo(text) == {
        "total": 127600748 * KIB,
        "free": 118912404 * KIB,
        "available": 123522867 * KIB,
        "cached": (3398120 + 421904) * KIB,
    }


def test_meminfo_leaves_out_what_it_lacks() -> None:
    assert parse_meminfo("MemTotal: 1000 kB\ngarbage\nMemFree: many kB\n") == {"total": 1024e3}
    assert parse_meminfo("") == {}


def test_swap_in_pages() -> None:
    assert parse_swap_in("pgpgin 1\npswpin 1834471\npswpout 3\n") == 1834471.0
    assert parse_swap_in("pgpgin 1\n") is None
    assert parse_swap_in("pswpin lots\n") is None


def test_pressure_in_ratios_and_seconds() -> None:
    text = (
        "some avg10=71.32 avg60=61.08 avg300=40.17 total=913442118\n"
        "full avg10=29.44 avg60=23.06 avg300=14.52 total=402118226\n"
    )
    assert parse_pressure(text) == MemoryPressure(
        averages={
            "some": {"10s": 0.7132, "60s": 0.6108, "300s": 0.4017},
            "full": {"10s": 0.2944, "60s": 0.2306, "300s": 0.1452},
        },
        stalled_seconds={"some": 913.442118, "full": 402.118226},
    )


def test_pressure_of_an_old_kernel_with_some_only() -> None:
    # CPU pressure has no "full" line before 5.13; memory always had both, but be lenient
    parsed = parse_pressure("some avg10=0.00 avg60=0.50 avg300=0.00 total=12\n")
    assert parsed is not None
    assert parsed.averages == {"some": {"10s": 0.0, "60s": 0.005, "300s": 0.0}}
    assert parsed.stalled_seconds == {"some": 12e-6}


@pytest.mark.parametrize("text", ["", "nonsense\n", "some avg10=x\n"])
def test_pressure_without_anything_parsable_is_none(text: str) -> None:
    assert parse_pressure(text) is None


def test_idle_spark_root() -> None:
    host = read_host_memory(ROOTFS / "dgx-spark")
    assert host.memory_bytes["total"] == 127600748 * KIB
    assert host.memory_bytes["available"] == 123522867 * KIB
    assert host.swap_in_pages == 0.0
    assert host.pressure is not None
    assert host.pressure.averages["full"]["60s"] == 0.0


def test_spark_under_pressure_root() -> None:
    host = read_host_memory(ROOTFS / "dgx-spark-pressure")
    assert host.memory_bytes["available"] / host.memory_bytes["total"] == pytest.approx(0.048, 0.01)
    assert host.swap_in_pages == 1834471.0
    assert host.pressure is not None
    assert host.pressure.averages["full"]["60s"] == 0.2306


def test_root_without_proc_files_reads_nothing(tmp_path: Path) -> None:
    host = read_host_memory(tmp_path)
    assert (host.memory_bytes, host.swap_in_pages, host.pressure) == ({}, None, None)


def test_missing_root_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_host_memory(tmp_path / "nowhere")


def test_real_proc_reads_without_raising() -> None:
    host = read_host_memory(Path("/"))
    if not Path("/proc/meminfo").exists():
        pytest.skip("no /proc/meminfo here")
    assert host.memory_bytes["total"] > 0
    assert 0 <= host.memory_bytes["available"] <= host.memory_bytes["total"]
