"""The fleet view of ``sparkdiag fleet``: every GPU a Prometheus scrapes, ranked by its ratio to its
peers, its peer groups, the outliers and what to do, from Prometheus' own series.

The figures are the ``sparkdiag-peers`` recording rules (prometheus/sparkdiag-rules.yml): each
GPU's hour median at each compute shape over its group's median, and the robust score. Where that
Prometheus does not load sparkdiag's rules, the same expressions are sent as queries, read from
the rules file shipped in the package, so that both ways compute the same thing. A GPU is judged
by its worst compute-bound kernel, as the alert is (one alert per kernel): at least 7 % below in
a group of 4 GPUs or more is an outlier (``SparkdiagGpuSlowerThanPeers`` fires after 30 minutes of
it), 3.5 % a warning; a GPU in a smaller group is listed, not judged.

Prometheus can hold NaN or an infinity (a ratio over a median of 0, a probe that wrote one): such
a value is bad data, named as such with the GPU and the kernel, never ranked as healthy. A GPU
whose every ratio is bad data has the status ``bad_data``; one with finite ratios is judged by
them and keeps its bad kernels listed (``bad_data`` rather than ``ok`` when they are all fine).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any, Protocol

from sparkdiag.peers.promapi import PrometheusError, Sample
from sparkdiag.peers.ranking import FAIL_BELOW, MIN_FLEET_GROUP, WARN_BELOW
from sparkdiag.safeyaml import parse_shipped

RULE_GROUP = "sparkdiag-peers"
PREFIX = "sparkdiag:gemm_tflops:"
RATIO, SCORE, MEDIAN = PREFIX + "peer_ratio", PREFIX + "peer_score", PREFIX + "median_1h"
GROUP_MEDIAN, GROUP_GPUS = PREFIX + "peer_median_1h", PREFIX + "peer_group_gpus"
ALERT = "SparkdiagGpuSlowerThanPeers"
GROUP_LABELS = ("name", "torch", "cuda", "driver", "context")
_RECORD = re.compile(r"sparkdiag:gemm_tflops:[a-z0-9_]+")
_BARE_GROUP = re.compile(r"\b(group_left|group_right)(\s+)(?=sparkdiag:gemm_tflops:)")


class Querier(Protocol):
    base: str

    def query(self, expr: str) -> list[Sample]: ...


def shipped_rules() -> str:
    """The rules file shipped in the package (sparkdiag/data links to prometheus/)."""
    node = files("sparkdiag") / "data" / "prometheus" / "sparkdiag-rules.yml"
    return node.read_text(encoding="utf-8")


def expanded(rules: str) -> dict[str, str]:
    """Each recording rule of the peers group as one expression, the records it reads replaced
    by their own expressions, so that a Prometheus without the rules can evaluate it."""
    (group,) = [g for g in parse_shipped(rules)["groups"] if g["name"] == RULE_GROUP]
    # ``group_left NAME`` becomes ``group_left () (EXPR)``: a parenthesis right after
    # group_left would be read as its label list
    records = {
        r["record"]: _BARE_GROUP.sub(r"\1 ()\2", str(r["expr"]).strip())
        for r in group["rules"]
        if "record" in r
    }
    done: dict[str, str] = {}

    def expand(name: str) -> str:
        if name not in done:
            done[name] = _RECORD.sub(
                lambda m: f"({expand(m.group(0))})" if m.group(0) in records else m.group(0),
                records[name],
            )
        return done[name]

    return {name: expand(name) for name in records}


GroupKey = tuple[str, str, str, str, str]  # name, torch, cuda, driver, context
Kernel = tuple[str, str]  # dtype, shape


@dataclass(frozen=True)
class Group:
    model: str
    torch: str
    cuda: str
    driver: str
    context: str
    gpus: int  # GPUs at its most widely measured kernel
    kernels: Mapping[Kernel, tuple[int, float | None]]  # (dtype, shape) -> (GPUs, median TFLOPS)

    @property
    def judged(self) -> bool:
        return self.gpus >= MIN_FLEET_GROUP

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "torch": self.torch,
            "cuda": self.cuda,
            "driver": self.driver,
            "context": self.context,
            "gpus": self.gpus,
            "judged": self.judged,
            "kernels": [
                {"dtype": d, "shape": s, "gpus": n, "median_tflops": m}
                for (d, s), (n, m) in sorted(self.kernels.items())
            ],
        }


@dataclass(frozen=True)
class GpuRow:
    """One GPU: its worst compute-bound kernel against its group."""

    instance: str
    gpu: str
    uuid: str
    group: GroupKey
    dtype: str
    shape: str
    ratio: float | None  # None: every ratio Prometheus holds for it is NaN or infinite
    score: float | None
    tflops: float | None
    group_median: float | None
    group_gpus: int
    kernels_below: int  # kernels at least 7 % below, in groups that are judged
    kernels: int
    alert: str  # firing, pending or ""
    bad: tuple[str, ...] = ()  # "dtype shape: NaN" for each ratio that is no finite number

    @property
    def status(self) -> str:
        """outlier, warn, ok, too_small (a group of fewer than 4 GPUs is not judged), or
        bad_data (a ratio that is NaN or infinite, and nothing worse)."""
        if self.ratio is None:
            return "bad_data"
        if self.group_gpus >= MIN_FLEET_GROUP and self.ratio <= FAIL_BELOW:
            return "outlier"
        if self.group_gpus >= MIN_FLEET_GROUP and self.ratio <= WARN_BELOW:
            return "warn"
        if self.bad:
            return "bad_data"
        return "too_small" if self.group_gpus < MIN_FLEET_GROUP else "ok"

    def as_json(self) -> dict[str, Any]:
        name, torch, cuda, driver, context = self.group
        return {
            "instance": self.instance,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "model": name,
            "torch": torch,
            "cuda": cuda,
            "driver": driver,
            "context": context,
            "status": self.status,
            "ratio": self.ratio,
            "score": self.score,
            "worst_kernel": {"dtype": self.dtype, "shape": self.shape},
            "tflops": self.tflops,
            "group_median_tflops": self.group_median,
            "group_gpus": self.group_gpus,
            "kernels_below_7_percent": self.kernels_below,
            "kernels": self.kernels,
            "alert": self.alert or None,
            "bad_data": list(self.bad),
        }


@dataclass(frozen=True)
class FleetView:
    prometheus: str
    source: str  # recorded (the rules' series) or computed (the rules' expressions, sent)
    groups: tuple[Group, ...]
    gpus: tuple[GpuRow, ...]  # ranked, slowest first (bad data first of all)
    actions: tuple[str, ...] = field(default=())
    bad_groups: tuple[str, ...] = ()  # groups whose size or median is no finite number

    @property
    def outliers(self) -> tuple[GpuRow, ...]:
        return tuple(g for g in self.gpus if g.status == "outlier")

    @property
    def warnings(self) -> tuple[GpuRow, ...]:
        return tuple(g for g in self.gpus if g.status == "warn")

    @property
    def bad_data(self) -> tuple[GpuRow, ...]:
        return tuple(g for g in self.gpus if g.status == "bad_data")

    def as_json(self) -> dict[str, Any]:
        return {
            "prometheus": self.prometheus,
            "source": self.source,
            "thresholds": {
                "outlier_below": FAIL_BELOW,
                "warn_below": WARN_BELOW,
                "min_group_gpus": MIN_FLEET_GROUP,
            },
            "groups": [g.as_json() for g in self.groups],
            "gpus": [g.as_json() for g in self.gpus],
            "outliers": [g.as_json() for g in self.outliers],
            "bad_data": [g.as_json() for g in self.bad_data],
            "bad_groups": list(self.bad_groups),
            "actions": list(self.actions),
        }


def _group(labels: Mapping[str, str]) -> GroupKey:
    name, torch, cuda, driver, context = (labels.get(k, "") for k in GROUP_LABELS)
    return (name, torch, cuda, driver, context)


def _gpu(labels: Mapping[str, str]) -> tuple[str, str, str]:
    return (labels.get("instance", ""), labels.get("gpu", ""), labels.get("uuid", ""))


def _kernel(labels: Mapping[str, str]) -> Kernel:
    return (labels.get("dtype", ""), labels.get("shape", ""))


def fleet_view(client: Querier, computed: bool = False, rules: str | None = None) -> FleetView:
    """Ask ``client``; ``computed`` sends the rules' expressions even where the recorded series
    exist (tests compare the two). PrometheusError when there is nothing to rank."""
    source = "computed" if computed else "recorded"
    queries = {n: n for n in (RATIO, SCORE, MEDIAN, GROUP_MEDIAN, GROUP_GPUS)}
    answers = {} if computed else {RATIO: client.query(RATIO)}
    if not answers.get(RATIO):
        if not computed:
            _explain_absence(client)
        source = "computed"
        queries = expanded(rules if rules is not None else shipped_rules())
    for name in (RATIO, SCORE, MEDIAN, GROUP_MEDIAN, GROUP_GPUS):
        if name not in answers:
            answers[name] = client.query(queries[name])
    if not answers[RATIO]:
        raise PrometheusError(
            f"Prometheus at {client.base} has probe figures but no GPU joins its "
            "sparkdiag_gpu_info and sparkdiag_probe_software_info: daemons older than the "
            "peer comparison export no software info; upgrade them"
        )
    alerts = client.query(f'ALERTS{{alertname="{ALERT}"}}')
    return build_view(client.base, source, answers, alerts)


def _explain_absence(client: Querier) -> None:
    """No recorded ratio: fine when the daemons' figures are there (compute them); else say why."""
    daemons = _count(client.query("count(sparkdiag_build_info)"))
    if not daemons:
        raise PrometheusError(
            f"Prometheus at {client.base} has no sparkdiag series: add the sparkdiag daemons to "
            "its scrape configuration (port 10942) and wait for a scrape"
        )
    if not _count(client.query("count(sparkdiag_gemm_tflops)")):
        raise PrometheusError(
            f"Prometheus at {client.base} scrapes {daemons} sparkdiag daemon(s) "
            "but none exports a probe figure (sparkdiag_gemm_tflops): the probe is off "
            "(--no-probe.enabled), has no torch, or has not run yet"
        )


def _count(samples: list[Sample]) -> int:
    """The count a ``count(...)`` query answered; 0 for none, NaN or an infinity."""
    if not samples or not math.isfinite(samples[0].value) or samples[0].value < 0:
        return 0
    return int(samples[0].value)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _shown(value: float) -> str:
    if math.isfinite(value):
        return f"{value:.6g}"
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


MAX_GROUP = 1_000_000  # GPUs in one peer group: more is no count Prometheus could have


def _size(value: float) -> int | None:
    """A group's GPU count: a whole number from 1 to MAX_GROUP, else None (bad data)."""
    if not math.isfinite(value) or not 1 <= value <= MAX_GROUP or value != int(value):
        return None
    return int(value)


def build_view(
    base: str, source: str, answers: Mapping[str, list[Sample]], alerts: list[Sample]
) -> FleetView:
    """The view from the answers of the five queries and ALERTS."""
    by_gpu_kernel: dict[str, dict[tuple[tuple[str, str, str], Kernel], float | None]] = {}
    for name in (RATIO, SCORE, MEDIAN):
        by_gpu_kernel[name] = {
            (_gpu(s.labels), _kernel(s.labels)): _finite(s.value) for s in answers[name]
        }
    sizes: dict[tuple[GroupKey, Kernel], int] = {}
    bad_groups: list[str] = []
    for s in answers[GROUP_GPUS]:
        where = (_group(s.labels), _kernel(s.labels))
        size = _size(s.value)
        if size is None:
            bad_groups.append(f"{' '.join(where[0][:1] + where[1])}: group size {s.value:.6g}")
        sizes[where] = size or 0
    medians = {
        (_group(s.labels), _kernel(s.labels)): _finite(s.value) for s in answers[GROUP_MEDIAN]
    }
    kernels_of: dict[tuple[str, str, str], list[tuple[Kernel, float, GroupKey]]] = defaultdict(list)
    bad_of: dict[tuple[str, str, str], list[tuple[Kernel, str]]] = defaultdict(list)
    group_of: dict[tuple[str, str, str], GroupKey] = {}
    for sample in answers[RATIO]:
        gpu, kernel, group = _gpu(sample.labels), _kernel(sample.labels), _group(sample.labels)
        group_of.setdefault(gpu, group)
        if math.isfinite(sample.value) and sample.value > 0:
            kernels_of[gpu].append((kernel, sample.value, group))
        else:  # a figure over its group's median is never 0 or below: bad data too
            bad_of[gpu].append((kernel, _shown(sample.value)))
    state: dict[tuple[str, str], str] = {}
    for alert in alerts:
        key = (alert.labels.get("instance", ""), alert.labels.get("uuid", ""))
        if alert.labels.get("alertstate") == "firing" or key not in state:
            state[key] = alert.labels.get("alertstate", "")

    rows = []
    for gpu, group in group_of.items():
        kernels = kernels_of.get(gpu, [])
        bad_kernels = sorted(bad_of.get(gpu, []))
        bad = tuple(f"{d} {s}: {value}" for (d, s), value in bad_kernels)
        judged = [k for k in kernels if sizes.get((k[2], k[0]), 0) >= MIN_FLEET_GROUP]
        if kernels:
            (dtype, shape), ratio, group = min(judged or kernels, key=lambda k: (k[1], k[0]))
        else:
            (dtype, shape), ratio = bad_kernels[0][0], None
        rows.append(
            GpuRow(
                instance=gpu[0],
                gpu=gpu[1],
                uuid=gpu[2],
                group=group,
                dtype=dtype,
                shape=shape,
                ratio=ratio,
                score=by_gpu_kernel[SCORE].get((gpu, (dtype, shape))),
                tflops=by_gpu_kernel[MEDIAN].get((gpu, (dtype, shape))),
                group_median=medians.get((group, (dtype, shape))),
                group_gpus=sizes.get((group, (dtype, shape)), 0),
                kernels_below=sum(1 for k in judged if k[1] <= FAIL_BELOW),
                kernels=len(kernels) + len(bad),
                alert=state.get((gpu[0], gpu[2]), ""),
                bad=bad,
            )
        )
    rows.sort(key=lambda r: (-math.inf if r.ratio is None else r.ratio, r.instance, r.gpu, r.uuid))

    grouped: dict[GroupKey, dict[Kernel, tuple[int, float | None]]] = defaultdict(dict)
    for (group, kernel), count in sizes.items():
        grouped[group][kernel] = (count, medians.get((group, kernel)))
    groups = tuple(
        Group(*key, gpus=max(n for n, _ in kernels.values()), kernels=kernels)
        for key, kernels in sorted(grouped.items())
    )
    view = FleetView(base, source, groups, tuple(rows), bad_groups=tuple(bad_groups))
    return FleetView(base, source, groups, tuple(rows), actions(view), tuple(bad_groups))


def actions(view: FleetView) -> tuple[str, ...]:
    out = []
    for row in view.gpus:
        if row.bad:
            out.append(
                f"{row.instance} GPU {row.gpu} ({row.uuid}): Prometheus holds no finite ratio "
                f"to its peers at {', '.join(row.bad)}: bad data, not ranked as healthy; read "
                "its sparkdiag_gemm_tflops series and its daemon's log (a probe figure of 0 or "
                "a group median of 0 gives NaN or an infinity; a ratio of 0 or below is no "
                "figure a GPU can have)"
            )
    if view.bad_groups:
        out.append(
            f"bad data for {len(view.bad_groups)} peer group(s) ({'; '.join(view.bad_groups)}): "
            "not judged; check the sparkdiag-peers recording rules there"
        )
    for row in view.outliers:
        out.append(
            f"{row.instance} GPU {row.gpu} ({row.uuid}) delivers {row.ratio or 0:.1%} of its "
            f"{row.group_gpus} peers' {row.dtype} at {row.shape}: drain {row.instance} (a node "
            "is judged by its slowest GPU), run `sparkdiag check` there (its peers row names the "
            "GPU; sm-clock, power-under-load, temperature and clock-reasons say why), reset or "
            "reseat the GPU, and RMA it if it stays 7 % slower"
        )
    for row in view.warnings:
        out.append(
            f"{row.instance} GPU {row.gpu} ({row.uuid}) is {1 - (row.ratio or 0):.1%} below its "
            f"peers at {row.dtype} {row.shape}: watch it; rerun `sparkdiag check` there when it "
            "is idle"
        )
    small = [g for g in view.groups if not g.judged]
    if small:
        shown = "; ".join(
            f"{g.model} {g.context} torch {g.torch or '?'}: {g.gpus} GPU(s)" for g in small
        )
        out.append(
            f"{len(small)} group(s) too small to judge (fewer than {MIN_FLEET_GROUP} GPUs of one "
            f"model, probe software and context; {shown}): no GPU there is called an outlier; "
            "compare the GPUs inside a node with `sparkdiag check`"
        )
    if not view.outliers and not view.warnings and not view.bad_data:
        judged = sum(1 for g in view.groups if g.judged)
        out.append(
            f"no GPU is 3.5 % or more below its peers in the {judged} group(s) large enough to "
            "judge: nothing to do"
            if judged
            else "no group is large enough to judge: nothing is called an outlier"
        )
    return tuple(out)
