"""Whether the probe worker's CUDA libraries run natively on each GPU
(``sparkdiag_cuda_library_info``), from the latest scan of :class:`~sparkdiag.native.watch.
LibraryWatch`; the scan runs in its own thread, a scrape only judges what it found (a few
comparisons a library and GPU, kept per scan and compute capability). A library whose fat
binary is a stub has no series: its kernels are not there to judge
(:func:`sparkdiag.native.lint.kernels_elsewhere`)."""

from __future__ import annotations

from collections.abc import Iterator

from sparkdiag.exporter.base import GPU_LABELS, FromSnapshot, SnapshotProvider, gpu_labels
from sparkdiag.exporter.families import GaugeMetricFamily, Metric
from sparkdiag.native.compat import Verdict, judge, parse_capability
from sparkdiag.native.lint import judged
from sparkdiag.native.watch import LibraryWatch
from sparkdiag.snapshot import Snapshot
from sparkdiag.sources.software.cuda_libraries import CudaLibrary, LibraryScan

_Judged = dict[tuple[int, int], list[tuple[CudaLibrary, Verdict]]]


class NativeCollector(FromSnapshot):
    def __init__(self, snapshot: SnapshotProvider, watch: LibraryWatch) -> None:
        super().__init__(snapshot)
        self.watch = watch
        self._judged: tuple[LibraryScan, _Judged] | None = None

    def _verdicts(
        self, result: LibraryScan, capability: tuple[int, int]
    ) -> list[tuple[CudaLibrary, Verdict]]:
        if self._judged is None or self._judged[0] is not result:
            self._judged = (result, {})
        cache = self._judged[1]
        if capability not in cache:
            # one series for copies alike: the same library in two Pythons of a root (or in
            # two package directories) gave two identical series, which Prometheus refuses as
            # duplicates (found in a review)
            seen: set[tuple[str, str, str, str]] = set()
            cache[capability] = []
            for lib in judged(result.libraries):
                verdict = judge(lib.report, capability)
                key = (lib.package, lib.relative, verdict.mode, verdict.target)
                if key not in seen:
                    seen.add(key)
                    cache[capability].append((lib, verdict))
        return cache[capability]

    def families(self, snap: Snapshot) -> Iterator[Metric]:
        result, finished = self.watch.latest, self.watch.finished_at
        if result is None or finished is None:
            return
        info = GaugeMetricFamily(
            "sparkdiag_cuda_library_info",
            "A shared library with GPU code in the probe worker's Python environment and how "
            "this GPU runs it: mode native (a cubin loads), ptx-jit (only PTX the driver "
            "compiles) or none; target is the cubin or PTX it runs from. Libraries whose "
            "fat binary is a stub (their kernels are elsewhere) are left out. Value 1.",
            labels=[*GPU_LABELS, "package", "library", "mode", "target"],
        )
        for gpu in snap.gpus:
            capability = parse_capability(gpu.identity.cuda_capability)
            if not gpu.up or capability is None:
                continue
            labels = gpu_labels(gpu.identity)
            for lib, verdict in self._verdicts(result, capability):
                info.add_metric(
                    [*labels, lib.package, lib.relative, verdict.mode, verdict.target], 1
                )
        yield info
        yield GaugeMetricFamily(
            "sparkdiag_cuda_library_scan_timestamp_seconds",
            "When the last scan of the probe worker's CUDA libraries finished (Unix time).",
            value=finished,
        )
        yield GaugeMetricFamily(
            "sparkdiag_cuda_library_scan_duration_seconds",
            "How long that scan took (its cache in the state directory spares unchanged "
            "libraries).",
            value=result.seconds,
        )
