"""Host PCIe links read from sysfs: ``sparkdiag_pcie_link_*``, and on a known platform the width
each link is built for (:mod:`sparkdiag.platforms`)."""

from __future__ import annotations

from collections.abc import Iterator

from sparkdiag.exporter.base import FromSnapshot
from sparkdiag.exporter.families import GaugeMetricFamily, Metric
from sparkdiag.platforms import identify
from sparkdiag.snapshot import Snapshot

LABELS = ["device", "class", "driver", "state"]


class PcieCollector(FromSnapshot):
    def families(self, snap: Snapshot) -> Iterator[Metric]:
        if not snap.pcie_links:
            return
        speed = GaugeMetricFamily(
            "sparkdiag_pcie_link_transfers_per_second",
            "PCIe link speed in transfers per second (32 GT/s = 32e9), current and maximum.",
            labels=LABELS,
        )
        width = GaugeMetricFamily(
            "sparkdiag_pcie_link_width",
            "PCIe link width in lanes, current and maximum.",
            labels=LABELS,
        )
        expected = GaugeMetricFamily(
            "sparkdiag_pcie_link_expected_width",
            "Lanes this platform's board is built to train the link at (present only where "
            "sparkdiag knows the platform); a link at this width or wider is as designed.",
            labels=LABELS[:3],
        )
        platform = identify(snap.platform)
        for link in snap.pcie_links:
            base = [link.address, link.device_class, link.driver]
            design = platform.design(link.address) if platform is not None else None
            if design is not None:
                expected.add_metric(base, design.width)
            for state, value in (("current", link.current_speed_tps), ("max", link.max_speed_tps)):
                if value is not None:
                    speed.add_metric([*base, state], value)
            for state, lanes in (("current", link.current_width), ("max", link.max_width)):
                if lanes is not None:
                    width.add_metric([*base, state], lanes)
        yield speed
        yield width
        yield expected
