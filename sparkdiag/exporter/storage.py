"""The latest storage probe per mount point (``sparkdiag storage``, ``check --storage``, the
daemon's periodic probe), from ``storage.json`` in the state directory: ``sparkdiag_storage_*``.

Read again only when the file changed. Nothing is exported before the first probe. Only the
paths the last probe measured have series: ``host`` always, ``gpu`` and ``gds`` when it was asked
for the path into a GPU (``storage.gpu``); a cuFile read in a compatibility mode is not kept, so
``path="gds"`` is GPUDirect Storage only (storage/state.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from sparkdiag.exporter.families import GaugeMetricFamily, Metric
from sparkdiag.exporter.filecache import FileCache
from sparkdiag.statedir import StateDirError
from sparkdiag.storage.state import KeptProbe, read_state, state_path

log = logging.getLogger(__name__)

FIGURE = ["mountpoint", "device", "direction", "path"]


class StorageCollector:
    def __init__(self, path: Path | None) -> None:
        self._file = FileCache(path, read_state, "storage probe results")

    def probes(self) -> tuple[KeptProbe, ...]:
        return self._file.get() or ()

    def collect(self) -> Iterator[Metric]:
        probes = self.probes()
        if not probes:
            return
        now = GaugeMetricFamily(
            "sparkdiag_storage_throughput_bytes_per_second",
            "Sequential throughput of the last storage probe of the directory's filesystem "
            "(O_DIRECT, 1 MiB blocks): host = the drive to or from host memory, gpu = read on "
            "through pinned host memory into GPU memory, gds = read by GPUDirect Storage.",
            labels=FIGURE,
        )
        previous = GaugeMetricFamily(
            "sparkdiag_storage_previous_throughput_bytes_per_second",
            "The same figure at the probe before the last (SparkdiagStorageSlow needs both).",
            labels=FIGURE,
        )
        baseline = GaugeMetricFamily(
            "sparkdiag_storage_baseline_bytes_per_second",
            "The healthy figure learned on this machine (the median of the first healthy "
            "probes: set at 3, frozen at 5) or pinned; absent while it is learned.",
            labels=FIGURE,
        )
        latency = Metric(
            "sparkdiag_storage_read_latency_seconds",
            "4 KiB random reads (O_DIRECT, one at a time) of the last probe: quantiles, how "
            "many were timed and their latencies added up.",
            "summary",
        )
        written = GaugeMetricFamily(
            "sparkdiag_storage_probe_written_bytes",
            "Bytes the last probe wrote (its cost to the drive's endurance).",
            labels=["mountpoint"],
        )
        when = GaugeMetricFamily(
            "sparkdiag_storage_probe_timestamp_seconds",
            "Unix time the last storage probe of the mount point finished.",
            labels=["mountpoint"],
        )
        for probe in probes:
            for figure in probe.figures:
                labels = [probe.mountpoint, probe.device, figure.direction, figure.path]
                now.add_metric(labels, figure.bytes_per_second)
                if figure.previous is not None:
                    previous.add_metric(labels, figure.previous)
                if figure.baseline is not None:
                    baseline.add_metric(labels, figure.baseline)
            where = {"mountpoint": probe.mountpoint, "device": probe.device}
            for quantile, seconds in sorted(probe.latency.items()):
                latency.add_sample(latency.name, {**where, "quantile": quantile}, seconds)
            if probe.latency and probe.latency_count is not None and probe.latency_sum is not None:
                latency.add_sample(latency.name + "_count", where, probe.latency_count)
                latency.add_sample(latency.name + "_sum", where, probe.latency_sum)
            if probe.bytes_written is not None:
                written.add_metric([probe.mountpoint], probe.bytes_written)
            when.add_metric([probe.mountpoint], probe.finished_at)
        yield from (now, previous, baseline, latency, written, when)


def storage_collector(state_dir: Path | None) -> StorageCollector:
    """The collector for ``storage.json`` in ``state_dir`` (default: the state directory)."""
    try:
        return StorageCollector(state_path(state_dir))
    except StateDirError as exc:
        log.warning("storage probe results not exported: %s", exc)
        return StorageCollector(None)
