"""sparkdiag's metric families and value formatting (sparkdiag/exporter/families.py) against
client_python's: the same samples, the same bytes, in text and in OpenMetrics."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client import core as client
from prometheus_client.openmetrics.exposition import generate_latest as client_openmetrics
from prometheus_client.utils import floatToGoString

from sparkdiag.config import Settings
from sparkdiag.exporter import families
from sparkdiag.exporter.registry import build_registry, render_openmetrics
from sparkdiag.telemetry.build import build_poller
from tests.support import NVML, ROOTFS, SYSFS

EDGES = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    999999.0,
    1e6,
    1234567.0,
    1234567.5,
    1e15,
    1e16,
    1.5e16,
    1e21,
    2.5276071936e10,
    1e-7,
    -1e7,
    7.0e-310,
    math.inf,
    -math.inf,
    math.nan,
    10**20,
    3,
]


@pytest.mark.parametrize("value", EDGES)
def test_values_are_written_as_client_python_writes_them(value: float) -> None:
    assert families.go_float(value) == floatToGoString(value)


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70))
def test_any_value_is_written_as_client_python_writes_it(value: float) -> None:
    assert families.go_float(value) == floatToGoString(value)


def test_families_hold_the_samples_client_python_would() -> None:
    ours = [
        families.GaugeMetricFamily("a_ratio", "doc", value=0.5),
        families.GaugeMetricFamily("b_bytes", "doc", labels=["gpu", "uuid"]),
        families.CounterMetricFamily("c_total", "doc", labels=["x"]),
        families.CounterMetricFamily("d", "doc", value=3, created=10.0),
    ]
    theirs = [
        client.GaugeMetricFamily("a_ratio", "doc", value=0.5),
        client.GaugeMetricFamily("b_bytes", "doc", labels=["gpu", "uuid"]),
        client.CounterMetricFamily("c_total", "doc", labels=["x"]),
        client.CounterMetricFamily("d", "doc", value=3, created=10.0),
    ]
    for fam in (ours[1], theirs[1]):
        fam.add_metric(["0", "GPU-x"], 1.5e11)
    for fam in (ours[2], theirs[2]):
        fam.add_metric(["y"], 7)
    for mine, client_family in zip(ours, theirs, strict=True):
        assert (mine.name, mine.type, mine.documentation, mine.unit) == (
            client_family.name,
            client_family.type,
            client_family.documentation,
            client_family.unit,
        )
        assert [tuple(s) for s in mine.samples] == [tuple(s) for s in client_family.samples]
    with pytest.raises(ValueError):
        families.GaugeMetricFamily("e", "doc", value=1.0, labels=["x"])


@pytest.mark.parametrize("fixture", ["h200-x8.json", "gb10-idle.json"])
def test_openmetrics_is_what_client_python_writes_for_the_same_collectors(fixture: str) -> None:
    settings = Settings(
        nvml_fixture=NVML / fixture,
        sysfs=SYSFS / "h200-x8",
        rootfs=ROOTFS / "gpu-host",
        process_metrics=True,
    )
    poller = build_poller(settings)
    poller.poll_once()
    registry = build_registry(lambda: poller.latest, compat_dcgm=True)
    theirs = CollectorRegistry(auto_describe=False)
    theirs.register(registry)  # type: ignore[arg-type]
    body = render_openmetrics(registry)
    assert body == client_openmetrics(theirs)
    assert body.endswith(b"# EOF\n") and b"DCGM_FI_DEV_GPU_TEMP" in body
    value = registry.get_sample_value("sparkdiag_nvml_up")
    assert value == theirs.get_sample_value("sparkdiag_nvml_up") == 1.0
