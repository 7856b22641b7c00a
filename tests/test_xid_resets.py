"""The kernel-log lines that say a GPU was set up again after an XID
(:func:`sparkdiag.sources.nvml.xid.kernel_gpu_resets`): each pattern on the line as the driver or
the kernel writes it (NVIDIA's open-gpu-kernel-modules, Linux drivers/pci), in kmsg and dmesg
form, and lines that look alike but say no such thing."""

from __future__ import annotations

import pytest

from sparkdiag.sources.nvml.xid import (
    bus_key,
    kernel_gpu_resets,
    kernel_xid_events,
    last_reset,
    parse_kernel_xids,
)

XID_48 = "NVRM: Xid (PCI:0000:18:00): 48, pid=4242, name=python3, DBE (double bit error) ECC error"
UUID = "NVRM: GPU at PCI:0000:18:00: GPU-979ad365-0b73-a0ac-74a2-3520b773d460"
LOADED = (
    "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
    "(dvs-builder@U22-I3-B17-02-5)  Tue Oct 14 02:41:09 UTC 2025"
)
LOADED_PROPRIETARY = "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 2023"


def test_bus_key_reads_kernel_and_nvml_addresses_alike() -> None:
    assert bus_key("0000:18:00") == bus_key("00000000:18:00.0") == bus_key("0000:18:00.0")
    assert bus_key("0000:18:00") == (0, 0x18, 0)
    assert bus_key("not an address") is None


@pytest.mark.parametrize(
    ("line", "how"),
    [
        (LOADED, "the NVIDIA driver was loaded again"),
        (f"[  905.311874] {LOADED_PROPRIETARY}", "the NVIDIA driver was loaded again"),
        (
            "nvidia 0000:18:00.0: enabling device (0000 -> 0003)",
            "the nvidia driver probed it again (enabling device)",
        ),
        (
            "[ 1203.5] nvidia 0000:18:00.0: enabling device (0000 -> 0002)",
            "the nvidia driver probed it again (enabling device)",
        ),
        ("nvidia 0000:18:00.0: ready 1023ms after FLR", "the PCI core reset it"),
        ("pci 0000:18:00.0: ready 2047ms after bus reset", "the PCI core reset it"),
        (UUID, "the driver initialised it again (its UUID logged anew)"),
        # as /dev/kmsg gives a device's message: its properties on the lines after it
        (
            "nvidia 0000:18:00.0: ready 1023ms after FLR\n SUBSYSTEM=pci\n"
            " DEVICE=+pci:0000:18:00.0",
            "the PCI core reset it",
        ),
    ],
)
def test_each_line_that_says_the_gpu_was_set_up_again(line: str, how: str) -> None:
    lines = (XID_48, line)
    (reset,) = kernel_gpu_resets(lines)
    assert (reset.line, reset.how) == (1, how)
    assert last_reset([reset], "0000:18:00") == reset
    assert reset.key in (None, (0, 0x18, 0))  # the driver's load stands for every GPU


@pytest.mark.parametrize(
    "line",
    [
        # what the review's fixture wrote: no driver writes it ('nvidia-smi -r' writes nothing
        # at the driver's default level)
        f"{UUID} reset",
        "nvidia 0000:18:00.0: not ready 65535ms after FLR; giving up",  # the reset failed
        "nvidia 0000:18:00.0: ready 1023ms after resume",  # no reset
        "NVRM: Trigger FLR!",  # NV_DBG_INFO: not printed by default, and names no GPU
        "snd_hda_intel 0000:18:00.1: enabling device (0000 -> 0002)",  # not the nvidia driver
        "NVRM: GPU Board Serial Number: 1650124009999",
    ],
)
def test_lines_that_say_no_reset(line: str) -> None:
    assert kernel_gpu_resets((XID_48, line)) == []


def test_the_uuid_line_before_the_first_xid_is_no_reset() -> None:
    """The driver logs the UUID once per life of its GPU object, just before that life's first
    XID: before any XID it says nothing; after one, that the GPU was initialised again."""
    assert kernel_gpu_resets((UUID, XID_48)) == []
    resets = kernel_gpu_resets((UUID, XID_48, UUID, XID_48))
    assert [(r.line, r.key) for r in resets] == [(2, (0, 0x18, 0))]


def test_a_reset_of_another_gpu_is_not_this_ones() -> None:
    other = "nvidia 0000:2a:00.0: enabling device (0000 -> 0003)"
    resets = kernel_gpu_resets((XID_48, other))
    assert len(resets) == 1 and last_reset(resets, "0000:18:00") is None
    assert last_reset(resets, "00000000:2A:00.0") == resets[0]


def test_xid_events_keep_their_place_in_the_log() -> None:
    lines = ("unrelated", f"[  12.5] {XID_48}", LOADED, XID_48)
    assert [(e.address, e.code, e.line) for e in kernel_xid_events(lines)] == [
        ("0000:18:00", 48, 1),
        ("0000:18:00", 48, 3),
    ]
    assert parse_kernel_xids(lines) == [("0000:18:00", 48), ("0000:18:00", 48)]
