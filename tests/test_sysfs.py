"""Host PCIe links from sysfs: parsing, the fake DGX Spark and H200 trees, and the real /sys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkdiag.snapshot import PcieLink
from sparkdiag.sources.host import sysfs, udev
from sparkdiag.sources.host.sysfs import PcieSource, classify, parse_link_speed, read_link

FIXTURES = Path(__file__).parent / "fixtures" / "sysfs"
SPARK = FIXTURES / "dgx-spark"
GX10 = FIXTURES / "asus-gx10"
H200_VM = FIXTURES / "h200-vm"
GT = 1e9


def _link(
    address: str, cls: str, driver: str, speed: float, width: int, max_speed: float, max_width: int
) -> PcieLink:
    """A link in the table's order: speed and width, then their maxima (PcieLink's own order is
    current and max speed, then current and max width)."""
    return PcieLink(address, cls, driver, speed, max_speed, width, max_width)


# The DGX Spark Founders Edition as tests/fixtures/sysfs/dgx-spark/README.txt lists it (every
# value's source is there): ConnectX-7 as four functions at Gen5 x4 behind two 10de:22ce root
# ports, the NVMe in domain 0004, the Realtek 10GbE and the MT7925 Wi-Fi behind Gen4 x1 root
# ports, the GPU behind 10de:22d1. The empty Gen4 x1 root port 0006:00:00.0 is left out.
SPARK_LINKS = (
    _link("0000:00:00.0", "bridge", "pcieport", 32e9, 4, 32e9, 4),
    _link("0000:01:00.0", "network", "mlx5_core", 32e9, 4, 32e9, 4),
    _link("0000:01:00.1", "network", "mlx5_core", 32e9, 4, 32e9, 4),
    _link("0002:00:00.0", "bridge", "pcieport", 32e9, 4, 32e9, 4),
    _link("0002:01:00.0", "network", "mlx5_core", 32e9, 4, 32e9, 4),
    _link("0002:01:00.1", "network", "mlx5_core", 32e9, 4, 32e9, 4),
    _link("0004:00:00.0", "bridge", "pcieport", 32e9, 4, 32e9, 4),
    _link("0004:01:00.0", "nvme", "nvme", 32e9, 4, 32e9, 4),
    _link("0007:00:00.0", "bridge", "pcieport", 16e9, 1, 16e9, 1),
    _link("0007:01:00.0", "network", "r8127", 16e9, 1, 16e9, 1),
    _link("0009:00:00.0", "bridge", "pcieport", 8e9, 1, 16e9, 1),
    _link("0009:01:00.0", "network", "mt7925e", 8e9, 1, 8e9, 1),
    _link("000f:00:00.0", "bridge", "pcieport", 32e9, 4, 32e9, 4),
    _link("000f:01:00.0", "display", "nvidia", 32e9, 4, 32e9, 4),
)
# The ASUS Ascent GX10: the same devices, its second ConnectX-7 root port wired x2 by design.
_X2 = {"0002:00:00.0", "0002:01:00.0", "0002:01:00.1"}
GX10_LINKS = tuple(
    PcieLink(
        link.address,
        link.device_class,
        link.driver,
        link.current_speed_tps,
        link.max_speed_tps,
        2 if link.address in _X2 else link.current_width,
        link.max_width,
    )
    for link in SPARK_LINKS
)


def _make_device(root: Path, address: str, files: dict[str, str]) -> Path:
    device = root / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True)
    for name, text in files.items():
        (device / name).write_text(text)
    return device


# ---- parse_link_speed -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("32.0 GT/s PCIe", 32e9),
        ("32.0 GT/s PCIe\n", 32e9),
        ("16.0 GT/s PCIe", 16e9),
        ("8.0 GT/s PCIe", 8e9),
        ("5.0 GT/s PCIe", 5e9),
        ("2.5 GT/s PCIe", 2.5e9),
        ("2.5 GT/s", 2.5e9),  # kernels before 4.19 print no " PCIe"
        ("5 GT/s", 5e9),
        ("64.0 GT/s PCIe", 64e9),
        ("  8.0 GT/s PCIe  ", 8e9),
    ],
)
def test_parse_link_speed_values(text: str, expected: float) -> None:
    assert parse_link_speed(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Unknown",
        "Unknown speed",
        "",
        "   ",
        "garbage",
        "GT/s",
        "fast GT/s",
        "0 GT/s",
        "-8.0 GT/s",
        "32.0 MT/s",
        "32.0GT/sPCIe",
        "x32.0 GT/s",
        "\x00\xff",
    ],
)
def test_parse_link_speed_rejects(text: str) -> None:
    assert parse_link_speed(text) is None


def test_parse_link_speed_without_space() -> None:
    # "\b" after GT/s: "32GT/s" (lspci's spelling) is accepted, "32.0GT/sPCIe" is not.
    assert parse_link_speed("32GT/s") == 32e9


# ---- classify -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("0x020000", "network"),  # Ethernet
        ("0x020700", "network"),  # InfiniBand
        ("0x028000", "network"),  # other network controller (Wi-Fi)
        ("0x010802", "nvme"),
        ("0x010800", "nvme"),
        ("0x010601", "other"),  # SATA AHCI is mass storage but not NVMe
        ("0x030000", "display"),  # VGA
        ("0x030200", "display"),  # 3D controller (H100/H200, GB10)
        ("0x038000", "display"),
        ("0x060400", "bridge"),  # PCI-to-PCI bridge / root port
        ("0x060000", "bridge"),  # host bridge
        ("0x088000", "other"),
        ("0x0c0330", "other"),  # USB xHCI
        ("0x120000", "other"),  # processing accelerator
        ("0x020000\n", "network"),
        ("020000", "network"),
        ("", "other"),
        ("garbage", "other"),
        ("0x1000000", "other"),
        ("-0x020000", "other"),
    ],
)
def test_classify(code: str, expected: str) -> None:
    assert classify(code) == expected


# ---- the fake DGX Spark -------------------------------------------------------------------


def test_spark_tree_reads_every_link_exactly() -> None:
    assert PcieSource(SPARK).read() == SPARK_LINKS


def test_gx10_tree_is_the_spark_with_its_second_connectx7_at_x2() -> None:
    assert PcieSource(GX10).read() == GX10_LINKS
    links = {link.address: link for link in PcieSource(GX10).read()}
    for address in ("0002:01:00.0", "0002:01:00.1"):
        cx7 = links[address]
        assert (cx7.device_class, cx7.driver) == ("network", "mlx5_core")
        assert (cx7.current_width, cx7.max_width) == (2, 4)
        assert cx7.current_speed_tps == cx7.max_speed_tps == 32 * GT
    assert (links["0000:01:00.0"].current_width, links["0000:01:00.0"].max_width) == (4, 4)


def test_spark_reports_every_device_and_id_of_the_public_lspci() -> None:
    devices = SPARK / "bus" / "pci" / "devices"

    def ids(address: str) -> tuple[str, str, str]:
        return tuple(  # type: ignore[return-value]
            (devices / address / name).read_text().strip() for name in ("vendor", "device", "class")
        )

    for address in ("0000:01:00.0", "0000:01:00.1", "0002:01:00.0", "0002:01:00.1"):
        assert ids(address) == ("0x15b3", "0x1021", "0x020000")  # ConnectX-7
    for address in ("0000:00:00.0", "0002:00:00.0", "0004:00:00.0"):
        assert ids(address)[:2] == ("0x10de", "0x22ce")  # GB10 Gen5 x4 root ports
    for address in ("0006:00:00.0", "0007:00:00.0", "0009:00:00.0"):
        assert ids(address)[:2] == ("0x10de", "0x22d0")  # GB10 Gen4 x1 root ports
    assert ids("000f:00:00.0")[:2] == ("0x10de", "0x22d1")
    assert ids("0004:01:00.0") == ("0x144d", "0xa810", "0x010802")  # Samsung PM9E1
    assert ids("0007:01:00.0") == ("0x10ec", "0x8127", "0x020000")  # Realtek, r8127
    assert ids("0009:01:00.0") == ("0x14c3", "0x7925", "0x028000")  # MT7925 Wi-Fi, mt7925e
    assert ids("000f:01:00.0") == ("0x10de", "0x2e12", "0x030000")  # the GPU, VGA class
    assert sorted(os.listdir(devices)) == sorted(
        [link.address for link in SPARK_LINKS] + ["0006:00:00.0"]
    )


def test_spark_wifi_is_a_network_link() -> None:
    wifi = read_link(SPARK / "bus" / "pci" / "devices" / "0009:01:00.0")
    assert wifi == _link("0009:01:00.0", "network", "mt7925e", 8e9, 1, 8e9, 1)


def test_spark_skips_the_empty_root_port() -> None:
    devices = SPARK / "bus" / "pci" / "devices"
    assert (devices / "0006:00:00.0" / "current_link_width").read_text() == "0\n"
    assert read_link(devices / "0006:00:00.0") is None  # Gen4 x1 root port with nothing behind
    addresses = [link.address for link in PcieSource(SPARK).read()]
    assert "0006:00:00.0" not in addresses
    assert len(os.listdir(devices)) == len(addresses) + 1


def test_device_without_pcie_capability_is_skipped(tmp_path: Path) -> None:
    device = _make_device(tmp_path, "0001:00:00.0", {"class": "0x088000\n", "vendor": "0x10de\n"})
    assert read_link(device) is None  # conventional PCI function: no link files at all


def test_spark_tree_uses_relative_symlinks_like_sysfs() -> None:
    entry = SPARK / "bus" / "pci" / "devices" / "0004:01:00.0"
    assert entry.is_symlink()
    assert os.readlink(entry) == "../../../devices/pci0004:00/0004:00:00.0/0004:01:00.0"
    driver = entry / "driver"
    assert os.readlink(driver) == "../../../../bus/pci/drivers/nvme"
    assert driver.resolve() == (SPARK / "bus" / "pci" / "drivers" / "nvme").resolve()
    for name in ("nvidia", "mlx5_core", "nvme", "r8127", "mt7925e", "pcieport"):
        assert (SPARK / "bus" / "pci" / "drivers" / name).is_dir()


def test_read_link_address_is_directory_name_through_symlink_or_real_path() -> None:
    via_bus = read_link(SPARK / "bus" / "pci" / "devices" / "0000:01:00.0")
    via_devices = read_link(SPARK / "devices" / "pci0000:00" / "0000:00:00.0" / "0000:01:00.0")
    assert via_bus == via_devices
    assert via_bus is not None
    assert via_bus.address == "0000:01:00.0"


def test_h200_vm_tree() -> None:
    assert PcieSource(H200_VM).read() == (
        _link("0000:00:06.0", "display", "nvidia", 32e9, 16, 32e9, 16),
    )


# ---- odd devices and damaged files --------------------------------------------------------


def test_unreadable_and_garbled_files_give_none_for_that_field_only(tmp_path: Path) -> None:
    device = _make_device(
        tmp_path,
        "0000:03:00.0",
        {
            "current_link_speed": "16.0 GT/s PCIe\n",
            "max_link_speed": "very fast\n",  # garbled
            "max_link_width": "x8\n",  # garbled
            "class": "0x010802\n",
        },
    )
    (device / "current_link_width").mkdir()  # reading it raises IsADirectoryError
    assert read_link(device) == PcieLink(
        address="0000:03:00.0",
        device_class="nvme",
        driver="",
        current_speed_tps=16e9,
        max_speed_tps=None,
        current_width=None,
        max_width=None,
    )


def test_non_ascii_bytes_and_missing_class(tmp_path: Path) -> None:
    device = _make_device(tmp_path, "0000:04:00.0", {"max_link_width": "4\n"})
    (device / "current_link_speed").write_bytes(b"\xff\xfe GT/s\n")
    (device / "current_link_width").write_bytes(b"\xd9\xa4\n")  # Arabic-Indic digit four
    link = read_link(device)
    assert link == PcieLink("0000:04:00.0", "other", "", None, None, None, 4)


def test_driver_symlink_basename_even_when_dangling(tmp_path: Path) -> None:
    device = _make_device(tmp_path, "0000:05:00.0", {"current_link_width": "1\n"})
    os.symlink("../../../bus/pci/drivers/vfio-pci", device / "driver")
    link = read_link(device)
    assert link is not None
    assert link.driver == "vfio-pci"


def test_endpoint_with_width_zero_is_kept(tmp_path: Path) -> None:
    files = {
        "current_link_speed": "Unknown\n",
        "max_link_speed": "32.0 GT/s PCIe\n",
        "current_link_width": "0\n",
        "max_link_width": "4\n",
        "class": "0x020000\n",
    }
    endpoint = _make_device(tmp_path, "0000:06:00.0", files)
    assert read_link(endpoint) == PcieLink("0000:06:00.0", "network", "", None, 32e9, 0, 4)
    bridge = _make_device(tmp_path, "0000:07:00.0", {**files, "class": "0x060400\n"})
    assert read_link(bridge) is None


def test_device_directory_that_vanished(tmp_path: Path) -> None:
    assert read_link(tmp_path / "0000:08:00.0") is None


def test_sorted_by_address(tmp_path: Path) -> None:
    for address in ("000f:01:00.0", "0000:0a:00.0", "0000:01:00.0", "0002:00:00.0"):
        _make_device(tmp_path, address, {"current_link_width": "1\n", "class": "0x020000\n"})
    addresses = [link.address for link in PcieSource(tmp_path).read()]
    assert addresses == ["0000:01:00.0", "0000:0a:00.0", "0002:00:00.0", "000f:01:00.0"]


def test_root_without_pci_bus_is_empty(tmp_path: Path) -> None:
    assert PcieSource(tmp_path).read() == ()


def test_missing_root_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        PcieSource(tmp_path / "no-such-sysfs").read()


# ---- the real /sys and pyudev -------------------------------------------------------------


def test_real_sys_reads_without_raising() -> None:
    links = PcieSource(Path("/sys")).read()
    assert isinstance(links, tuple)
    assert all(isinstance(link, PcieLink) for link in links)
    assert [link.address for link in links] == sorted(link.address for link in links)


def test_real_sys_uses_udev_list(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = [SPARK / "bus" / "pci" / "devices" / "0002:01:00.0"]
    monkeypatch.setattr(udev, "list_pci_device_paths", lambda: fake)
    assert PcieSource(Path("/sys")).read() == (SPARK_LINKS[4],)


def test_real_sys_falls_back_to_listing_when_udev_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> list[Path]:
        raise ImportError("libudev.so.1: cannot open shared object file")

    expected = PcieSource(Path("/sys")).read()
    monkeypatch.setattr(udev, "list_pci_device_paths", broken)
    assert PcieSource(Path("/sys")).read() == expected


def test_fixture_root_does_not_use_udev(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden() -> list[Path]:
        raise AssertionError("udev must not be asked about a fixture root")

    monkeypatch.setattr(udev, "list_pci_device_paths", forbidden)
    assert PcieSource(SPARK).read() == SPARK_LINKS


def test_udev_lists_the_same_devices_as_sysfs() -> None:
    try:
        paths = udev.list_pci_device_paths()
    except (ImportError, OSError) as exc:
        pytest.skip(f"libudev not usable here: {exc}")
    bus = Path("/sys/bus/pci/devices")
    listed = set(os.listdir(bus)) if bus.is_dir() else set()
    assert {path.name for path in paths} == listed
    assert all(isinstance(path, Path) for path in paths)


def test_module_keeps_library_imports_out() -> None:
    source = Path(sysfs.__file__).read_text()
    assert "import pyudev" not in source
    assert "psutil" not in source


@pytest.mark.parametrize("text", ["99999999999999999999999", "64", "33", "-4", "0x10"])
def test_width_beyond_pcie_is_no_reading(tmp_path: Path, text: str) -> None:
    """PCIe's widest link is x32: a wider "width" (a garbled file) is no reading; it was read
    as is, exported as 1e+23 lanes, and check passed the link as "x99999999999999999999 (max)"."""
    device = _make_device(
        tmp_path,
        "0000:08:00.0",
        {"current_link_width": f"{text}\n", "max_link_width": "16\n", "class": "0x020000\n"},
    )
    link = read_link(device)
    assert link is not None
    assert (link.current_width, link.max_width) == (None, 16)


def test_widths_up_to_x32_are_read(tmp_path: Path) -> None:
    device = _make_device(
        tmp_path, "0000:09:00.0", {"current_link_width": "32\n", "max_link_width": "032\n"}
    )
    link = read_link(device)
    assert link is not None
    assert (link.current_width, link.max_width) == (32, 32)
