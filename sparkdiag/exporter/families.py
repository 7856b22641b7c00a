"""The metric families the collectors build at each scrape, and the registry that gathers them.

The same shapes as client_python's custom-collector classes (``GaugeMetricFamily``,
``CounterMetricFamily``, ``Metric`` with ``name``, ``documentation``, ``type``, ``unit`` and
``samples`` of ``Sample(name, labels, value, timestamp, exemplar, native_histogram)``), so that
a ``prometheus_client.CollectorRegistry`` in the tests, and client_python's encoders, read them
as their own. They are sparkdiag's because ``import prometheus_client`` of any part of it runs the
package's ``__init__``, which imports its HTTP servers, WSGI, e-mail, urllib and compression
modules: about 4 MiB of the daemon's RSS for code it never runs (docs/daemon-cost.md).
prometheus_client is imported only when a scrape asks for OpenMetrics
(:func:`sparkdiag.exporter.registry.render_openmetrics`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol


class Sample(NamedTuple):
    """One series' value; ``timestamp``, ``exemplar`` and ``native_histogram`` stay None here."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None
    exemplar: Any = None
    native_histogram: Any = None


class Metric:
    """One metric family: ``type`` is ``gauge``, ``counter`` or ``unknown`` (untyped)."""

    def __init__(self, name: str, documentation: str, typ: str, unit: str = "") -> None:
        if unit and not name.endswith("_" + unit):
            name += "_" + unit
        self.name = name
        self.documentation = documentation
        self.type = "unknown" if typ == "untyped" else typ
        self.unit = unit
        self.samples: list[Sample] = []

    def add_sample(
        self, name: str, labels: dict[str, str], value: float, timestamp: float | None = None
    ) -> None:
        self.samples.append(Sample(name, labels, value, timestamp))

    def __repr__(self) -> str:
        return f"Metric({self.name!r}, {self.type}, {len(self.samples)} sample(s))"


class _Family(Metric):
    """A family whose series are told apart by the label names given at construction."""

    def __init__(
        self,
        name: str,
        documentation: str,
        typ: str,
        value: float | None,
        labels: Sequence[str] | None,
        unit: str,
    ) -> None:
        super().__init__(name, documentation, typ, unit)
        if labels is not None and value is not None:
            raise ValueError("give a family either a value or label names, not both")
        self._labelnames = tuple(labels or ())


class GaugeMetricFamily(_Family):
    def __init__(
        self,
        name: str,
        documentation: str,
        value: float | None = None,
        labels: Sequence[str] | None = None,
        unit: str = "",
    ) -> None:
        super().__init__(name, documentation, "gauge", value, labels, unit)
        if value is not None:
            self.add_metric([], value)

    def add_metric(
        self, labels: Sequence[str], value: float, timestamp: float | None = None
    ) -> None:
        named = dict(zip(self._labelnames, labels))  # noqa: B905 (a scrape's hot path)
        self.samples.append(Sample(self.name, named, value, timestamp))


class CounterMetricFamily(_Family):
    """A counter: the family is named without ``_total``, its samples with it."""

    def __init__(
        self,
        name: str,
        documentation: str,
        value: float | None = None,
        labels: Sequence[str] | None = None,
        created: float | None = None,
        unit: str = "",
    ) -> None:
        super().__init__(name.removesuffix("_total"), documentation, "counter", value, labels, unit)
        if value is not None:
            self.add_metric([], value, created)

    def add_metric(
        self,
        labels: Sequence[str],
        value: float,
        created: float | None = None,
        timestamp: float | None = None,
    ) -> None:
        named = dict(zip(self._labelnames, labels))  # noqa: B905 (a scrape's hot path)
        self.samples.append(Sample(self.name + "_total", named, value, timestamp))
        if created is not None:
            self.samples.append(Sample(self.name + "_created", dict(named), created, timestamp))


class Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


class Registry:
    """The collectors a scrape renders, in the order registered; nothing registers itself."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        self._collectors.append(collector)

    def collect(self) -> Iterator[Metric]:
        for collector in list(self._collectors):
            yield from collector.collect()

    def get_sample_value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The value of the series ``name`` with exactly ``labels``, or None (for tests, as
        ``CollectorRegistry.get_sample_value``)."""
        wanted = dict(labels or {})
        for family in self.collect():
            for sample in family.samples:
                if sample.name == name and sample.labels == wanted:
                    return sample.value
        return None


def go_float(value: float) -> str:
    """A sample value as the Prometheus text format writes it, byte for byte as client_python's
    encoder (0.20 and later) does: ``+Inf``, ``-Inf``, ``NaN``; Python's shortest repr, except
    that a positive value of seven or more integer digits (repr ``1234567.0``) is written with
    an exponent of at least two digits, as Go does (``1.234567e+06``, ``2.5276071936e+10``)."""
    number = float(value)
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    if math.isnan(number):
        return "NaN"
    text = repr(number)
    whole, dot, fraction = text.partition(".")
    if number <= 0 or not dot or len(whole) < 7:
        return text
    digits = (whole + fraction).rstrip("0")
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{mantissa}e+{len(whole) - 1:02d}"
