"""What every collector shares: the snapshot provider, the GPU label helpers,
:func:`by_label`, and the two collector bases (of the latest snapshot, of the probe state)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol, TypeVar

from sparkdiag.exporter.families import CounterMetricFamily, GaugeMetricFamily, Metric
from sparkdiag.scheduling.probe_state import ProbeView
from sparkdiag.snapshot import GpuIdentity, Snapshot

SnapshotProvider = Callable[[], "Snapshot | None"]
GPU_LABELS = ["gpu", "uuid"]


def gpu_labels(identity: GpuIdentity) -> list[str]:
    """Label values that every GPU series carries: the NVML index as a string, and the uuid."""
    return [str(identity.index), identity.uuid]


Family = TypeVar("Family", GaugeMetricFamily, CounterMetricFamily)


def by_label(family: Family, values: Mapping[str, float]) -> Family:
    """``family`` (of one label) with a series a key of ``values``, in key order."""
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


class SnapshotCollector(Protocol):
    def collect(self) -> Iterator[Metric]: ...


class FromSnapshot:
    """A collector of the latest telemetry snapshot; nothing before the first poll.

    Subclasses build fresh metric families from one snapshot in :meth:`families`.
    """

    def __init__(self, snapshot: SnapshotProvider) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        if snap is not None:
            yield from self.families(snap)

    def families(self, snap: Snapshot) -> Iterator[Metric]:
        raise NotImplementedError


class FromProbeView:
    """A collector of the probe state (:class:`ProbeView`, read once per scrape).

    Subclasses build fresh metric families from that one view in :meth:`families`.
    """

    def __init__(self, view: Callable[[], ProbeView]) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        yield from self.families(self.view())

    def families(self, view: ProbeView) -> Iterator[Metric]:
        raise NotImplementedError
