"""The latest soak per GPU (``sparkdiag soak``), from ``soak.json`` in the state directory.

The file is read again only when it changed (its size, inode or modification time), so a scrape
costs one ``stat``. Only GPUs are exported: a ``--device cpu`` test soak (``gpu="cpu"``, kept in the
file for ``check``) measured a CPU's noise, not a GPU's heat, and ``dump`` (which reads no soak) and
the daemon agree that a machine without a GPU exports no ``sparkdiag_soak_*`` series. Nothing is
exported before the first soak; a file that cannot be read is logged once per change and exports
nothing (``sparkdiag check`` reports it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from sparkdiag.exporter.base import GPU_LABELS as GPU
from sparkdiag.exporter.families import GaugeMetricFamily, Metric
from sparkdiag.exporter.filecache import FileCache
from sparkdiag.soak.state import SoakState, read_state, state_path
from sparkdiag.statedir import StateDirError

log = logging.getLogger(__name__)

KERNEL = [*GPU, "dtype", "shape"]


class SoakCollector:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file = FileCache(path, read_state, "soak verdicts")

    def state(self) -> SoakState | None:
        """The file's content, read again when it changed; None when absent or unreadable."""
        return self._file.get()

    def collect(self) -> Iterator[Metric]:
        state = self.state()
        if state is None:
            return

        def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        last = gauge(
            "sparkdiag_soak_last_timestamp_seconds",
            "Unix time the latest soak of this GPU ended.",
            GPU,
        )
        duration = gauge(
            "sparkdiag_soak_duration_seconds",
            "Seconds of sustained load of the latest soak, until it stopped.",
            GPU,
        )
        info = gauge(
            "sparkdiag_soak_info",
            "Always 1: why the latest soak stopped (completed, threshold, hw_thermal_slowdown, "
            "hw_slowdown, interrupted, error) and the temperature its verdicts use (memory; gpu "
            "where the GPU has no memory sensor; empty when none was read).",
            [*GPU, "stopped", "sensor"],
        )
        hottest_temp = gauge(
            "sparkdiag_soak_max_celsius",
            "Hottest temperature a measurement window of the latest soak ran at, on its sensor.",
            [*GPU, "sensor"],
        )
        cold = gauge(
            "sparkdiag_soak_cold_tflops",
            "Delivered throughput in the cold window before the soak's load (TFLOPS; TOPS for "
            "int8).",
            KERNEL,
        )
        hottest = gauge(
            "sparkdiag_soak_hottest_tflops",
            "Delivered throughput in the soak's hottest window that measured the kernel.",
            KERNEL,
        )
        hottest_ratio = gauge(
            "sparkdiag_soak_hottest_ratio",
            "sparkdiag_soak_hottest_tflops over sparkdiag_soak_cold_tflops.",
            KERNEL,
        )
        lowest_ratio = gauge(
            "sparkdiag_soak_lowest_ratio",
            "Lowest delivered throughput of any window under load, over the cold one.",
            KERNEL,
        )
        degraded = gauge(
            "sparkdiag_soak_degraded",
            "1 when the kernel fell below 0.9 of its cold throughput in a window under load.",
            KERNEL,
        )
        failed = gauge(
            "sparkdiag_soak_failed",
            "1 when a window of the latest soak found the kernel's result wrong, or the kernel "
            "failed (sparkdiag check's soak row fails); 0 for a kernel it judged.",
            KERNEL,
        )
        fell = gauge(
            "sparkdiag_soak_fell_celsius",
            "Temperature of the first window in which the kernel fell below 0.9 of cold (present "
            "only when it fell and a temperature was read).",
            [*KERNEL, "sensor"],
        )
        for g in state.gpus:
            if g.is_cpu:
                continue  # a smoke test of the command, not a GPU (see the module docstring)
            labels = [g.gpu, g.uuid]
            sensor = g.sensor or ""
            last.add_metric(labels, g.finished_at)
            if g.elapsed_seconds is not None:
                duration.add_metric(labels, g.elapsed_seconds)
            info.add_metric([*labels, g.stopped, sensor], 1.0)
            if g.max_celsius is not None:
                hottest_temp.add_metric([*labels, sensor], g.max_celsius)
            for k in g.judged:
                kl = [*labels, k.dtype, k.shape]
                for family, value in (
                    (cold, k.cold),
                    (hottest, k.hottest),
                    (hottest_ratio, k.hottest_fraction),
                    (lowest_ratio, k.lowest_fraction),
                ):
                    if value is not None:
                        family.add_metric(kl, value)
                degraded.add_metric(kl, 1.0 if k.status == "fell" else 0.0)
                failed.add_metric(kl, 0.0)
                if k.status == "fell" and k.fell_celsius is not None:
                    fell.add_metric([*kl, sensor], k.fell_celsius)
            for k in g.failed:  # wrong under load, or failed: no throughput verdict
                failed.add_metric([*labels, k.dtype, k.shape], 1.0)
        yield from (
            last,
            duration,
            info,
            hottest_temp,
            cold,
            hottest,
            hottest_ratio,
            lowest_ratio,
            degraded,
            failed,
            fell,
        )


def soak_collector(state_dir: Path | None) -> SoakCollector:
    """The collector for ``soak.json`` in ``state_dir`` (default: the state directory); without
    a state directory it exports nothing."""
    try:
        return SoakCollector(state_path(state_dir))
    except StateDirError as exc:
        log.warning("soak verdicts not exported: %s", exc)
        return SoakCollector(None)
