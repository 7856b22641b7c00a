"""sparkdiag's text encoder must write exactly what prometheus_client's generate_latest writes."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest

from sparkdiag.config import Settings
from sparkdiag.exporter.registry import build_registry, render
from sparkdiag.telemetry.build import build_poller as make_poller
from tests.support import NVML, ROOTFS, SYSFS


@pytest.mark.parametrize("fixture", ["h200-x8.json", "gb10-idle.json", "no-nvml.json"])
def test_render_equals_generate_latest(fixture: str) -> None:
    settings = Settings(
        nvml_fixture=NVML / fixture, sysfs=SYSFS / "dgx-spark", rootfs=ROOTFS / "docker"
    )
    poller = make_poller(settings)
    poller.poll_once()
    registry = build_registry(lambda: poller.latest)
    assert render(registry) == generate_latest(registry)


class _Odd:
    def collect(self):  # type: ignore[no-untyped-def]
        g = GaugeMetricFamily("x_ratio", "help with \\ and\nnewline", labels=["a", "b"])
        g.add_metric(['quote " back \\ nl \n', "z"], 1e21)
        g.add_metric(["plain", ""], float("nan"))
        yield g
        c = CounterMetricFamily("y_events", "counter", labels=["k"])
        c.add_metric(["v"], 3)
        yield c
        yield GaugeMetricFamily("z_plain", "no labels", value=-0.5)


def test_render_escapes_like_generate_latest() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Odd())  # type: ignore[arg-type]
    assert render(registry) == generate_latest(registry)


def test_render_refuses_what_it_does_not_encode() -> None:
    class _Hist:
        def collect(self):  # type: ignore[no-untyped-def]
            yield HistogramMetricFamily("h_seconds", "h", buckets=[("+Inf", 1)], sum_value=1)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Hist())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not encode histogram"):
        render(registry)
