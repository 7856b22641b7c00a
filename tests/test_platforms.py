"""Platform identity: DMI strings from sysfs (sources/host/dmi.py) and the table of known machines
(platforms.py) that host links are judged against."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkdiag.platforms import PLATFORMS, describe, identify
from sparkdiag.snapshot import PlatformIdentity
from sparkdiag.sources.host.dmi import read_platform

SYSFS = Path(__file__).parent / "fixtures" / "sysfs"


def test_founders_edition_dmi_from_the_spark_tree() -> None:
    dmi = read_platform(SYSFS / "dgx-spark")
    assert dmi == PlatformIdentity("NVIDIA", "NVIDIA_DGX_Spark", "P4242")
    platform = identify(dmi)
    assert platform is not None and platform.key == "dgx-spark"
    assert describe(dmi) == "NVIDIA DGX Spark Founders Edition"


def test_ascent_gx10_dmi_without_a_board_name() -> None:
    dmi = read_platform(SYSFS / "asus-gx10")
    assert dmi == PlatformIdentity("ASUSTeK COMPUTER INC.", "GX10", "")
    platform = identify(dmi)
    assert platform is not None and platform.key == "asus-ascent-gx10"
    design = platform.design("0002:01:00.1")
    assert design is not None and design.width == 2 and "board design" in design.note
    assert platform.design("0004:01:00.0") is None  # the table says nothing about the NVMe


@pytest.mark.parametrize(
    ("vendor", "product", "key"),
    [
        ("NVIDIA", "NVIDIA_DGX_Spark", "dgx-spark"),
        ("NVIDIA", "NVIDIA DGX Spark", "dgx-spark"),  # the modalias drops spaces: either spelling
        ("NVIDIA", "DGX Spark", "dgx-spark"),  # early units (canonical/secboot#560)
        ("ASUSTeK COMPUTER INC.", "GX10", "asus-ascent-gx10"),
        ("ASUSTeK COMPUTER INC.", "ASUS Ascent GX10", "asus-ascent-gx10"),
        ("Dell Inc.", "Dell Pro Max with GB10 FCM1253", None),  # a GB10, wiring not known here
        ("NVIDIA", "DGX H100", None),
        ("ASUSTeK COMPUTER INC.", "ROG STRIX B650", None),
        ("", "", None),
    ],
)
def test_identify(vendor: str, product: str, key: str | None) -> None:
    platform = identify(PlatformIdentity(vendor, product, ""))
    assert (platform.key if platform else None) == key


def test_describe_an_unknown_machine_by_its_dmi() -> None:
    dell = PlatformIdentity("Dell Inc.", "Dell Pro Max with GB10 FCM1253", "038RY7")
    assert (
        describe(dell)
        == "Dell Inc. Dell Pro Max with GB10 FCM1253 (not in sparkdiag's platform table)"
    )
    assert describe(None) == "an unidentified machine (no DMI)"


def test_every_platform_designs_the_four_connectx7_functions_and_their_ports() -> None:
    for platform in PLATFORMS:
        for address in (
            "0000:00:00.0",
            "0000:01:00.0",
            "0000:01:00.1",
            "0002:00:00.0",
            "0002:01:00.0",
            "0002:01:00.1",
        ):
            design = platform.design(address)
            assert design is not None, (platform.key, address)
            assert design.speed_tps == 32e9
        assert platform.source


def test_no_dmi_directory_or_empty_strings(tmp_path: Path) -> None:
    assert read_platform(tmp_path) is None
    ids = tmp_path / "class" / "dmi" / "id"
    ids.mkdir(parents=True)
    assert read_platform(tmp_path) is None  # nothing readable
    (ids / "sys_vendor").write_bytes(b"Vendor \xff\n")
    assert read_platform(tmp_path) == PlatformIdentity("Vendor \ufffd", "", "")


def test_real_sysfs_reads_without_raising() -> None:
    dmi = read_platform(Path("/sys"))
    assert dmi is None or isinstance(dmi, PlatformIdentity)
