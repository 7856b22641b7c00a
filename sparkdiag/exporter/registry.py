"""Builds the registry a scrape renders: every collector, fed by one snapshot provider."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest

from sparkdiag.exporter.base import SnapshotCollector, SnapshotProvider
from sparkdiag.exporter.gpu import GpuCollector
from sparkdiag.exporter.pcie import PcieCollector
from sparkdiag.exporter.system import SystemCollector


class _NonEmpty:
    """Drops families without samples, so an unsupported field leaves no empty HELP/TYPE."""

    def __init__(self, inner: SnapshotCollector) -> None:
        self.inner = inner

    def collect(self) -> Iterator[Metric]:
        return (fam for fam in self.inner.collect() if fam.samples)


def build_registry(
    snapshot: SnapshotProvider, extra: Iterable[SnapshotCollector] = ()
) -> CollectorRegistry:
    """A fresh registry (nothing registers at import time) holding sparkdiag's collectors."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in (
        SystemCollector(snapshot),
        GpuCollector(snapshot),
        PcieCollector(snapshot),
        *extra,
    ):
        registry.register(_NonEmpty(collector))  # type: ignore[arg-type]
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition of ``registry``."""
    return generate_latest(registry)
