"""Builds the registry a scrape renders: every collector, fed by one snapshot provider."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from sparkdiag import terminal
from sparkdiag.exporter.base import SnapshotCollector, SnapshotProvider
from sparkdiag.exporter.dcgm import DcgmCollector
from sparkdiag.exporter.families import Metric, Registry, go_float
from sparkdiag.exporter.gpu import GpuCollector
from sparkdiag.exporter.gpu_activity import GpuActivityCollector
from sparkdiag.exporter.gpu_health import GpuHealthCollector
from sparkdiag.exporter.gpu_process import GpuProcessCollector
from sparkdiag.exporter.memory import GpuMemoryCollector
from sparkdiag.exporter.nvme import NvmeCollector
from sparkdiag.exporter.pcie import PcieCollector
from sparkdiag.exporter.system import SystemCollector
from sparkdiag.sources.host.hostname import node_name


class _NonEmpty:
    """Drops families without samples, so an unsupported field leaves no empty HELP/TYPE."""

    def __init__(self, inner: SnapshotCollector) -> None:
        self.inner = inner

    def collect(self) -> Iterator[Metric]:
        return (fam for fam in self.inner.collect() if fam.samples)


class Collectable(Protocol):
    """What a scrape renders: sparkdiag's :class:`Registry`, or a client_python registry."""

    def collect(self) -> Iterable[Any]: ...


def build_registry(
    snapshot: SnapshotProvider,
    extra: Iterable[SnapshotCollector] = (),
    compat_dcgm: bool = False,
) -> Registry:
    """A fresh registry (nothing registers at import time) holding sparkdiag's collectors, and
    with ``compat_dcgm`` dcgm-exporter's series after them (``--compat.dcgm``)."""
    registry = Registry()
    compat = (DcgmCollector(snapshot, node_name()),) if compat_dcgm else ()
    for collector in (
        SystemCollector(snapshot),
        GpuCollector(snapshot),
        GpuActivityCollector(snapshot),
        GpuHealthCollector(snapshot),
        GpuProcessCollector(snapshot),
        GpuMemoryCollector(snapshot),
        PcieCollector(snapshot),
        NvmeCollector(snapshot),
        *extra,
        *compat,
    ):
        registry.register(_NonEmpty(collector))
    return registry


_TYPES = {"counter": "counter", "gauge": "gauge", "summary": "summary", "unknown": "untyped"}


def _escape_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def render(registry: Collectable) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of ``registry``.

    Byte-for-byte what ``prometheus_client.generate_latest`` writes for sparkdiag's gauge and
    counter families (a test holds the two equal), at about a third of its cost: sparkdiag's
    metric and label names are fixed and valid, so the per-sample name validation and escaping
    that the generic encoder does is skipped; label values are still escaped.
    """
    out: list[str] = []
    label_cache: dict[tuple[tuple[str, str], ...], str] = {}
    for family in registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        mtype = _TYPES.get(family.type)
        if mtype is None:
            raise ValueError(f"render() does not encode {family.type} metrics ({family.name})")
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n")
        for sample in family.samples:
            if sample.timestamp is not None or sample.name.endswith("_created"):
                raise ValueError(f"render() does not encode timestamps or _created ({name})")
            if sample.labels:
                key = tuple(sorted(sample.labels.items()))
                labels = label_cache.get(key)
                if labels is None:
                    labels = "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in key) + "}"
                    label_cache[key] = labels
                out.append(f"{sample.name}{labels} {go_float(sample.value)}\n")
            else:
                out.append(f"{sample.name} {go_float(sample.value)}\n")
    text = "".join(out)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a label from a file name that is not UTF-8 (os.fsdecode)
        return _SURROGATE.sub(lambda m: _byte_text(m).replace("\\", "\\\\"), text).encode()


# A lone surrogate: a byte of a file name that is not UTF-8, as os.fsdecode gives it. It failed
# every scrape with a UnicodeEncodeError, for as long as the library was installed (found in a
# review): the byte is written as the text ``\\xe9``, escaped as any backslash is
_SURROGATE = re.compile("[\ud800-\udfff]")


def _byte_text(match: re.Match[str]) -> str:
    return terminal.byte_text(ord(match.group(0))) or "\ufffd"


def printable(value: str) -> str:
    """``value`` with each byte of a file name that is not UTF-8 as the text ``\\xe9``."""
    return _SURROGATE.sub(_byte_text, value)


def render_openmetrics(registry: Collectable) -> bytes:
    """The OpenMetrics 1.0.0 exposition of ``registry``, by client_python's encoder (imported
    here, at the first scrape that asks for it: Prometheus takes the text format)."""
    from prometheus_client.metrics_core import Metric as ClientMetric
    from prometheus_client.openmetrics.exposition import generate_latest

    class Converted:
        def collect(self) -> Iterator[ClientMetric]:
            for family in registry.collect():
                metric = ClientMetric(family.name, family.documentation, family.type, family.unit)
                for sample in family.samples:
                    # ASCII first: the regex on every label cost 40 % of a large render
                    labels = {
                        k: v if v.isascii() else printable(v) for k, v in sample.labels.items()
                    }
                    metric.add_sample(sample.name, labels, sample.value, sample.timestamp)
                yield metric

    return bytes(generate_latest(Converted()))  # type: ignore[no-untyped-call]
