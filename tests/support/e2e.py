"""A small sparkdiag fleet scraped by a real Prometheus, shared by the end-to-end alert test
(tests/test_e2e_prometheus.py) and the dashboard test (tests/test_dashboards.py).

The fleet is defined here, in one place: which daemons run on which recorded fixtures, how their
probe documents are derived from the one recorded on the lent H200, and which alerts must fire
on which node. NVML scenarios live in tests/fixtures/scenarios/ (each is the idle recording plus
a documented ``set``/``script``); probe documents are written at test time by
:func:`probe_document` so that the derivation from ``tests/fixtures/probe/h200-default.json`` is
visible in the code.

Prometheus loads the shipped rules file with only its ``for:`` durations shortened
(:func:`shortened_rules`); every expression is the shipped one.

Both test modules start the fleet through :func:`shared_fleet`: when both run in one session,
Prometheus and the daemons start once, and they stop after the last module that uses them.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import (
    FIXTURES,
    NVML,
    ROOT,
    ROOTFS,
    SYSFS,
    free_port,
    http_get,
    sparkdiag_cmd,
    terminate,
)

SCENARIOS = FIXTURES / "scenarios"
PROBE_RECORDING = FIXTURES / "probe" / "h200-default.json"
RULES = ROOT / "prometheus" / "sparkdiag-rules.yml"

# Every `for:` of the shipped rules becomes this in the test's copy: `for: 10m` cannot fire in CI.
FOR_IN_TEST = "3s"
# Overall deadline for the fleet to reach the expected alert state.
CONVERGENCE_DEADLINE_S = 90.0
# Once the expected state is reached it must hold this long (several evaluations).
HOLD_S = 4.0

# Clock event reason bits (nvml.h).
SW_POWER_CAP = 0x4
SW_THERMAL_SLOWDOWN = 0x20

# The daemons' timing: fast enough for a test of a few seconds. The scenarios' fixtures script
# their GPUs by poll ("lost at poll 20"), so every poll comes at the poll interval, scraped or
# not (no spacing out of the polls before Prometheus' first scrape: docs/daemon-cost.md).
FAST = (
    "--poll-interval", "0.5",
    "--idle-poll-interval", "0.5",
    "--probe.interval", "1",
    "--probe.first-delay", "0",
    "--probe.hot-interval", "2",
    "--probe.hot-min-interval", "1",
)  # fmt: skip


def prometheus_binary() -> str:
    """Path of the Prometheus server; skip where it is missing, but fail in CI (CI=true)."""
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus is required in CI (apt-get install prometheus)")
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    return path


# -- probe documents ------------------------------------------------------------------------------

# Run-to-run variation of a healthy GPU (a fraction of a percent, as on the lent H200), applied
# to every result of a cycle; the baseline is the median of the first five healthy cycles.
HEALTHY_JITTER = (1.000, 0.996, 1.004, 0.998, 1.002, 0.999)


def probe_document(
    uuid: str,
    jitter: float = 1.0,
    scale: Mapping[str, float] | None = None,
    conditions: Mapping[str, Any] | None = None,
    contention: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The recorded H200 worker document for GPU ``uuid``: every throughput times ``jitter``,
    dtypes in ``scale`` times their factor as well (kernel times divided by the same factor),
    the delivered figure of each decode kernel whose dtype is in ``contention`` times its factor
    and its median iteration untouched (what time-slicing does to a kernel shorter than a slice),
    and ``conditions`` (temperatures, clock event reasons seen) updated."""
    doc: dict[str, Any] = json.loads(PROBE_RECORDING.read_text(encoding="utf-8"))
    doc["software"]["gpu_uuid"] = uuid
    for result in doc["results"]:
        if result["status"] != "ok":
            continue
        factor = jitter * (scale or {}).get(result["dtype"], 1.0)
        result["delivered"] *= factor
        result["peak"] *= factor
        result["median_ms"] /= factor
        result["min_ms"] /= factor
        if result["kind"] == "decode":
            result["delivered"] *= (contention or {}).get(result["dtype"], 1.0)
    doc["conditions"].update(conditions or {})
    doc["suite"] = "default"
    doc["ratios"] = decode_ratios(doc["results"])
    return doc


def decode_ratios(results: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """int4 over bf16 and fp16 at the decode shape from the median iteration (peak), as the
    worker computes them."""
    decode = {r["dtype"]: r for r in results if r["kind"] == "decode" and r["status"] == "ok"}
    return {
        f"int4/{other}": decode["int4"]["peak"] / decode[other]["peak"]
        for other in ("bf16", "fp16")
        if "int4" in decode and other in decode
    }


def hot_document(
    uuid: str,
    scale: Mapping[str, float],
    conditions: Mapping[str, Any],
    contention: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """A hot-suite document made from the recording: the decode and LLM kernels of int4, bf16,
    fp16 and fp8, each dtype's throughput times its factor in ``scale`` (``contention``: see
    :func:`probe_document`), with ``conditions``."""
    doc = probe_document(uuid, scale=scale, conditions=conditions, contention=contention)
    doc["suite"] = "hot"
    doc["results"] = [
        r
        for r in doc["results"]
        if r["dtype"] in ("int4", "bf16", "fp16", "fp8")
        and r["kind"] in ("decode", "llm")
        and not r.get("beta")
    ]
    doc["bandwidth"] = None
    doc["ratios"] = decode_ratios(doc["results"])
    return doc


def healthy_cycles(uuid: str, scale: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    return [probe_document(uuid, jitter, scale) for jitter in HEALTHY_JITTER]


def write_probe_fixture(path: Path, cycles: Sequence[Mapping[str, Any]]) -> Path:
    """A ``--probe.fixture`` file: the cycles are replayed in turn, the last one repeating."""
    doc = {"format": "sparkdiag-probe-fixture/1", "cycles": list(cycles)}
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return path


# -- the fleet ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """One sparkdiag daemon, scraped as target ``instance``."""

    instance: str
    args: tuple[str, ...]
    expected: frozenset[str]  # alert names that must fire on it, and no others
    why: str = ""


def _uuid(scenario: str) -> str:
    return scenario_uuids(scenario)[0]


def scenario_uuids(scenario: str) -> list[str]:
    doc = json.loads((SCENARIOS / f"{scenario}.json").read_text(encoding="utf-8"))
    return [str(device["set"]["uuid"]) for device in doc["devices"]]


# Every dtype the worker probes: a factor on all of them slows a GPU at every kernel.
ALL_DTYPES = ("bf16", "fp16", "tf32", "fp8", "int8", "int4", "nvfp4")
# The GPU of node slower-than-peers that delivers 0.9 of its three neighbours.
SLOWER_GPU = 2


def fleet_nodes(workdir: Path) -> list[Node]:
    """The nodes, with their probe fixtures and state directories written under ``workdir``."""

    def node(
        instance: str,
        nvml: Path,
        sysfs: str | Path,
        rootfs: str,
        probe: list[dict[str, Any]] | None,
        expected: set[str],
        why: str,
        extra: tuple[str, ...] = (),
    ) -> Node:
        state = workdir / instance / "state"
        state.mkdir(parents=True, exist_ok=True)
        args = [
            "--nvml-fixture", str(nvml),
            "--path.sysfs", str(sysfs if isinstance(sysfs, Path) else SYSFS / sysfs),
            "--path.rootfs", str(ROOTFS / rootfs),
            "--state-dir", str(state),
            *FAST,
            *extra,
        ]  # fmt: skip
        if probe is None:
            args.append("--no-probe.enabled")
        else:
            fixture = write_probe_fixture(workdir / instance / "probe.json", probe)
            args += ["--probe.fixture", str(fixture)]
        return Node(instance, tuple(args), frozenset(expected), why)

    # A DGX Spark Founders Edition whose second ConnectX-7 (both functions and their root port)
    # trained at x2: on this platform a fault (an ASUS Ascent GX10 is built that way).
    spark_x2 = workdir / "sysfs-spark-x2"
    shutil.copytree(SYSFS / "dgx-spark", spark_x2, symlinks=True)
    for address in ("0002:00:00.0", "0002:01:00.0", "0002:01:00.1"):
        width = spark_x2 / "bus" / "pci" / "devices" / address / "current_link_width"
        width.resolve().write_text("2\n")

    nvme_tree, nvme_health = _worn_hot_drive(workdir)

    healthy = _uuid("healthy-h200")
    thermal = _uuid("thermal-int4")
    shared = _uuid("container-gap")
    lost = _uuid("lost-gpu")

    # thermal-int4: five healthy cycles (the baseline is learned from them and frozen), then
    # every cycle runs hot: HBM at 91 °C, software thermal slowdown seen, int4 at half its
    # baseline at every shape. Hot cycles are unhealthy, so they never teach the baseline.
    hot = probe_document(
        thermal,
        scale={"int4": 0.5},
        conditions={
            "max_memory_temperature_celsius": 91.0,
            "max_gpu_temperature_celsius": 78.0,
            "clock_event_reasons_seen": SW_POWER_CAP | SW_THERMAL_SLOWDOWN,
        },
    )
    thermal_cycles = [*healthy_cycles(thermal)[:5], hot]
    # ... and the hot probe, which runs once the memory passes 80 °C, finds int4 at half its
    # cool speed against bf16 and fp16 (heat lowers int4 alone): the thermal-int4 alert.
    heat = {
        "max_memory_temperature_celsius": 91.0,
        "max_gpu_temperature_celsius": 78.0,
        "clock_event_reasons_seen": SW_POWER_CAP | SW_THERMAL_SLOWDOWN,
    }
    thermal_cycles.append(hot_document(thermal, {"int4": 0.5}, heat))
    # hot-ratio-holds: the same heat, and a competing process: the hot probe's decode kernels
    # lose delivered throughput unevenly, as the H200 measured beside a bf16 matmul loop
    # (docs/device/2026-12-01/part-b, first busy run: int4 0.41, bf16 0.63, fp16 0.97, fp8 1.00
    # of idle; int4/bf16 delivered 1.05 against 1.60 idle) while their median iterations held.
    # The int4 ratio, from the median, holds: no thermal-int4 alert; the periodic probe stays
    # healthy.
    holds = _uuid("hot-ratio-holds")
    holds_cycles = [
        *healthy_cycles(holds),
        hot_document(
            holds,
            {},
            heat,
            contention={"int4": 0.41, "bf16": 0.63, "fp16": 0.97, "fp8": 1.00},
        ),
    ]

    # slower-than-peers: four H200s in one node, GPU 2 delivering 0.9 of the others at every
    # kernel from its first cycle (each GPU replays the cycles that name its uuid). Among the
    # fleet's nine probed native H200s its hour median is 10 % below the group's median:
    # SparkdiagGpuSlowerThanPeers for that GPU alone. In its node it has peers, so its learning
    # baseline is held (far below them and below 0.85 of the bf16 MAMF): no GemmDegraded.
    slower = scenario_uuids("slower-than-peers")
    slower_cycles = [
        cycle
        for i, uuid in enumerate(slower)
        for cycle in healthy_cycles(
            uuid, dict.fromkeys(ALL_DTYPES, 0.9) if i == SLOWER_GPU else None
        )
    ]

    # container-gap: the container reaches 0.6 of native for bf16 and fp16 (every shape), the
    # same as native for the other dtypes. 0.6 of the recorded bf16 is still above half the
    # published H200 MAMF, so the container learns its own baseline from these runs and its
    # efficiency stays ~1: only the cross-context rule can see the gap.
    container_scale = {"bf16": 0.6, "fp16": 0.6}

    return [
        node(
            "healthy-h200",
            SCENARIOS / "healthy-h200.json",
            "h200-vm",
            "native",
            healthy_cycles(healthy),
            set(),
            "idle H200, every probe healthy",
        ),
        node(
            "lane-degraded",
            NVML / "gb10-idle.json",
            spark_x2,
            "dgx-spark",
            None,  # no probe document was recorded on a GB10: the probe is off on this node
            {"SparkdiagPcieLinkDegraded"},
            "DGX Spark Founders Edition: the second ConnectX-7 (0002:01:00.0/.1) and its root "
            "port (0002:00:00.0) train at x2 of the x4 the platform is built for",
        ),
        node(
            "gb10-slow-state",
            NVML / "gb10-slow-state.json",
            "asus-gx10",
            "dgx-spark-vllm",
            None,
            {"SparkdiagGpuSlowState", "SparkdiagSoftwareNotNative"},
            "ASUS Ascent GX10 in the USB-PD slow state from poll 2: busy at 650 of 2418 MHz with "
            "no clock event reason; its second ConnectX-7 at x2 is its design (no PCIe alert); "
            "vLLM and flash-attn installed without native code for sm_121 (dgx-spark-vllm)",
        ),
        node(
            "gb10-memory-pressure",
            NVML / "gb10-idle.json",
            "dgx-spark",
            "dgx-spark-pressure",
            None,
            {"SparkdiagUnifiedMemoryPressure"},
            "DGX Spark under sustained unified-memory pressure: PSI full 23 % over 60 s, "
            "4.8 % of memory available",
        ),
        node(
            "thermal-int4",
            SCENARIOS / "thermal-int4.json",
            "h200-vm",
            "native",
            thermal_cycles,
            {
                "SparkdiagThermalInt4Degradation",
                "SparkdiagGemmDegraded",  # int4 below 0.85; Alertmanager inhibits it (README)
                "SparkdiagInt4SlowerThanFp16",  # int4 decode at 0.5 falls below fp16 and bf16
                "SparkdiagGpuMemoryTemperatureHigh",
                "SparkdiagGpuThermalThrottling",
                "SparkdiagGpuSlowerThanPeers",  # int4 at half of the other H200s' (the fleet's)
            },
            "HBM ramps to 91 °C with sw thermal slowdown; int4 probes at 0.5 of baseline",
        ),
        node(
            "hot-ratio-holds",
            SCENARIOS / "hot-ratio-holds.json",
            "h200-vm",
            "native",
            holds_cycles,
            {"SparkdiagGpuMemoryTemperatureHigh", "SparkdiagGpuThermalThrottling"},
            "the same heat as thermal-int4 and a competing process: the hot probe's delivered "
            "decode figures fall unevenly (int4/bf16 delivered 0.66 of cool), their median "
            "iterations hold, so int4 against bf16/fp16 holds: hot, not thermally degraded",
        ),
        node(
            "slower-than-peers",
            SCENARIOS / "slower-than-peers.json",
            "h200-vm",
            "native",
            slower_cycles,
            {"SparkdiagGpuSlowerThanPeers"},
            f"four idle H200s, GPU {SLOWER_GPU} at 0.9 of the others at every kernel: slower "
            "than its peers in the node and in the fleet",
            extra=("--probe.interval", "2"),  # four GPUs a cycle: half the probe rate
        ),
        node(
            "container-gap-native",
            SCENARIOS / "container-gap.json",
            "h200-vm",
            "native",
            healthy_cycles(shared),
            set(),
            "native side of the shared GPU: healthy",
        ),
        node(
            "container-gap-container",
            SCENARIOS / "container-gap.json",
            "h200-vm",
            "docker",
            healthy_cycles(shared, container_scale),
            {"SparkdiagContainerNativeGap"},
            "the same GPU seen from a docker container: bf16 and fp16 at 0.6 of native",
        ),
        node(
            "lost-gpu",
            SCENARIOS / "lost-gpu.json",
            "h200-vm",
            "native",
            healthy_cycles(lost),
            {
                "SparkdiagGpuLost",
                "SparkdiagXidError",  # the XID 79 that preceded the loss
                # not SparkdiagProbeStale (a lost GPU is GpuLost's, not a stale probe) nor
                # SparkdiagGpuMissing (NVML still lists it, at 0: one page for one cause)
            },
            "XID 79 at poll 2, GPU lost at poll 3 (after one successful probe)",
        ),
        node(
            "nvlink-degraded",
            SCENARIOS / "nvlink-degraded.json",
            "h200-vm",
            "gpu-host",
            None,
            {"SparkdiagNvlinkDown", "SparkdiagNvlinkErrors"},
            "two H200s over NVLink (derived fixture): link 5 of GPU 0 down, replay errors "
            "climbing on link 3 of GPU 1; per-process metrics on (processes in gpu-host's /proc)",
            extra=("--process-metrics",),
        ),
        node(
            "nvme-worn-hot",
            SCENARIOS / "healthy-h200.json",
            nvme_tree,
            "native",
            None,
            {
                "SparkdiagNvmeCriticalWarning",
                "SparkdiagNvmeHot",
                "SparkdiagNvmeWearing",
                "SparkdiagStorageSlow",
            },
            "the public U.2 drive (tests/fixtures/nvme) made worn and hot: composite 81.85 °C of "
            "a 79.85 °C warning threshold, critical-warning bit 2 (temperature), 92 % of its "
            "endurance used; its last two storage probes wrote at 0.5 and 0.6 of the baseline",
            extra=("--nvme.fixture", str(nvme_health)),
        ),
    ]


def _worn_hot_drive(workdir: Path) -> tuple[Path, Path]:
    """The U.2 drive's sysfs tree and smartctl JSON, derived: hot (composite above its warning
    threshold), worn (92 % used) and warning (bit 2, temperature); and, in the node's state
    directory, a storage.json whose last two probes wrote at 0.5 and 0.6 of the baseline (the
    one recorded on the development VM, tests/fixtures/state/storage-vda, with write scaled)."""
    tree = workdir / "sysfs-nvme-worn-hot"
    shutil.copytree(SYSFS / "nvme-u2", tree, symlinks=True)
    (tree / "class" / "nvme" / "nvme0" / "hwmon1" / "temp1_input").resolve().write_text("81850\n")
    health = workdir / "nvme-worn-hot-health"
    health.mkdir()
    doc = json.loads((FIXTURES / "nvme" / "datacenter-u2" / "nvme0.smartctl.json").read_text())
    doc["nvme_smart_health_information_log"] |= {"critical_warning": 2, "percentage_used": 92}
    (health / "nvme0.smartctl.json").write_text(json.dumps(doc))
    state = json.loads((FIXTURES / "state" / "storage-vda" / "storage.json").read_text())
    for figure in state["mounts"][0]["figures"]:
        if figure["direction"] == "write":
            figure["bytes_per_second"] = 0.5 * figure["baseline"]
            figure["previous"] = 0.6 * figure["baseline"]
    (workdir / "nvme-worn-hot" / "state").mkdir(parents=True)
    (workdir / "nvme-worn-hot" / "state" / "storage.json").write_text(json.dumps(state))
    return tree, health


# -- rules and Prometheus -------------------------------------------------------------------------

_FOR = re.compile(r"^(?P<indent>[ ]+)for: \S+$", re.MULTILINE)


def shortened_rules(text: str, duration: str = FOR_IN_TEST) -> str:
    """The shipped rules with every ``for:`` set to ``duration``; nothing else changes (checked:
    the parsed rules are equal but for ``for``)."""
    short = _FOR.sub(lambda m: f"{m.group('indent')}for: {duration}", text)

    def without_for(doc: Any) -> Any:
        return [
            [{k: v for k, v in rule.items() if k != "for"} for rule in group["rules"]]
            for group in doc["groups"]
        ]

    original, changed = yaml.safe_load(text), yaml.safe_load(short)
    assert without_for(original) == without_for(changed), "only for: may change"
    alerts = [r for g in changed["groups"] for r in g["rules"] if "alert" in r]
    assert alerts and all(r.get("for") == duration for r in alerts), "every alert's for: changed"
    return short


def shortened_window(text: str, group: str, window: str, duration: str) -> str:
    """The rules with every ``[WINDOW]`` range of the rules of ``group`` set to ``[DURATION]``;
    nothing else changes (checked: the parsed rules are equal once the ranges are put back, and
    every such range of the group changed)."""
    doc = yaml.safe_load(text)
    (rules,) = [g["rules"] for g in doc["groups"] if g["name"] == group]
    assert any(f"[{window}]" in r["expr"] for r in rules), f"no [{window}] range in {group}"
    assert f"[{duration}]" not in text
    # replace inside the group's text only
    start = text.index(f"- name: {group}\n")
    end = text.find("\n  - name: ", start + 1)
    end = len(text) if end < 0 else end
    body = text[start:end].replace(f"[{window}]", f"[{duration}]")
    short = text[:start] + body + text[end:]
    changed = yaml.safe_load(short)
    restored = yaml.safe_load(short.replace(f"[{duration}]", f"[{window}]"))
    assert restored == doc, "only the ranges may change"
    (after,) = [g["rules"] for g in changed["groups"] if g["name"] == group]
    assert all(f"[{window}]" not in r["expr"] for r in after), "every range changed"
    return short


def rule_names(text: str) -> list[str]:
    doc = yaml.safe_load(text)
    return [r.get("alert") or r["record"] for g in doc["groups"] for r in g["rules"]]


def prometheus_config(rules: Path, targets: Mapping[str, str]) -> dict[str, Any]:
    """Scrape and evaluate every second; one static target per daemon, ``instance`` = node."""
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "sparkdiag",
                "static_configs": [
                    {"targets": [address], "labels": {"instance": instance}}
                    for instance, address in targets.items()
                ],
            }
        ],
    }


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        terminate(self.proc)


def _spawn(stack: contextlib.ExitStack, name: str, cmd: Sequence[str], log: Path) -> Process:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    process = Process(name, proc, log)
    stack.callback(process.stop)
    return process


def _wait_ready(process: Process, url: str, deadline: float) -> None:
    while True:
        if process.proc.poll() is not None:
            raise AssertionError(
                f"{process.name} exited {process.proc.returncode}:\n{process.tail(30)}"
            )
        with contextlib.suppress(OSError):
            status, _, _ = http_get(url, timeout=1)
            if status == 200:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"{process.name} not ready at {url}:\n{process.tail(30)}")
        time.sleep(0.05)


@dataclass(frozen=True)
class Alert:
    name: str
    instance: str
    labels: Mapping[str, str]
    state: str


@dataclass
class Fleet:
    nodes: list[Node]
    prometheus: str  # base URL
    targets: dict[str, str]  # instance -> daemon base URL
    processes: list[Process]
    rules: str  # the rules text Prometheus loaded
    _converged: list[Alert] | None = field(default=None, repr=False)

    @property
    def expected(self) -> set[tuple[str, str]]:
        return {(name, n.instance) for n in self.nodes for name in n.expected}

    def api(self, path: str, **params: str) -> Any:
        """``data`` of a GET of Prometheus' ``/api/v1/PATH``; fails on an error answer."""
        query = urllib.parse.urlencode(params)
        url = f"{self.prometheus}/api/v1/{path}" + (f"?{query}" if query else "")
        status, _, body = http_get(url, timeout=10)
        answer = json.loads(body)
        assert status == 200 and answer.get("status") == "success", (url, status, answer)
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Result of an instant query (a vector or a scalar as a one-element list)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def alerts(self) -> list[Alert]:
        return [
            Alert(
                a["labels"]["alertname"], a["labels"].get("instance", ""), a["labels"], a["state"]
            )
            for a in self.api("alerts")["alerts"]
            if a["labels"]["alertname"].startswith("Sparkdiag")
        ]

    def firing(self) -> set[tuple[str, str]]:
        return {(a.name, a.instance) for a in self.alerts() if a.state == "firing"}

    def diagnostics(self) -> str:
        parts = [f"== {p.name}\n{p.tail()}" for p in self.processes]
        return "\n".join(parts)

    def converge(self) -> list[Alert]:
        """Wait until exactly the expected alerts fire and keep firing for ``HOLD_S``; return the
        alerts then. Fails at the deadline with what fires, what is missing and the logs."""
        if self._converged is not None:
            return self._converged
        deadline = time.monotonic() + CONVERGENCE_DEADLINE_S
        expected = self.expected
        stable_since: float | None = None
        alerts = self.alerts()
        while True:
            firing = {(a.name, a.instance) for a in alerts if a.state == "firing"}
            now = time.monotonic()
            if firing == expected:
                stable_since = stable_since or now
                if now - stable_since >= HOLD_S:
                    self._converged = alerts
                    return alerts
            else:
                stable_since = None
            if now > deadline:
                pending = sorted({(a.name, a.instance) for a in alerts if a.state == "pending"})
                raise AssertionError(
                    "the fleet did not converge to the expected alerts within "
                    f"{CONVERGENCE_DEADLINE_S:.0f} s\n"
                    f"missing: {sorted(expected - firing)}\n"
                    f"unexpected: {sorted(firing - expected)}\n"
                    f"pending: {pending}\n{self.diagnostics()}"
                )
            time.sleep(0.5)
            alerts = self.alerts()


@contextlib.contextmanager
def start_fleet(workdir: Path, nodes: list[Node] | None = None) -> Iterator[Fleet]:
    """Start every node's daemon (``nodes``, else :func:`fleet_nodes`) and a Prometheus that
    scrapes them; stop all of them on exit, also when starting fails half-way."""
    prometheus = prometheus_binary()
    nodes = fleet_nodes(workdir) if nodes is None else nodes
    with contextlib.ExitStack() as stack:
        deadline = time.monotonic() + 30
        daemons: list[tuple[Process, str]] = []
        for node in nodes:
            port = free_port()
            cmd = sparkdiag_cmd("serve", "--listen", f"127.0.0.1:{port}", *node.args)
            process = _spawn(stack, node.instance, cmd, workdir / node.instance / "daemon.log")
            daemons.append((process, f"127.0.0.1:{port}"))
        for process, address in daemons:
            _wait_ready(process, f"http://{address}/healthz", deadline)

        rules_text = shortened_rules(RULES.read_text(encoding="utf-8"))
        rules = workdir / "sparkdiag-rules.yml"
        rules.write_text(rules_text, encoding="utf-8")
        config = workdir / "prometheus.yml"
        targets = {p.name: address for p, address in daemons}
        # JSON is YAML: no YAML writer needed.
        config.write_text(json.dumps(prometheus_config(rules, targets), indent=1), "utf-8")
        port = free_port()
        prom = _spawn(
            stack,
            "prometheus",
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            workdir / "prometheus.log",
        )
        base = f"http://127.0.0.1:{port}"
        _wait_ready(prom, f"{base}/-/ready", time.monotonic() + 30)
        yield Fleet(
            nodes=nodes,
            prometheus=base,
            targets={name: f"http://{address}" for name, address in targets.items()},
            processes=[p for p, _ in daemons] + [prom],
            rules=rules_text,
        )


_shared: dict[str, Any] = {"fleet": None, "stack": None, "users": 0}


def _stop_shared() -> None:
    stack = _shared["stack"]
    _shared.update(fleet=None, stack=None)
    if stack is not None:
        stack.close()


# A safety net: whatever happens to the fixtures, no daemon or Prometheus outlives pytest.
atexit.register(_stop_shared)


def needed_later(request: pytest.FixtureRequest, fixture: str = "fleet") -> bool:
    """Whether a test after the requesting module's tests uses ``fixture`` too."""
    items = request.session.items
    mine = [n for n, item in enumerate(items) if getattr(item, "module", None) is request.module]
    last = max(mine, default=len(items))
    return any(fixture in getattr(item, "fixturenames", ()) for item in items[last + 1 :])


@contextlib.contextmanager
def shared_fleet(request: pytest.FixtureRequest, make_dir: Callable[[], Path]) -> Iterator[Fleet]:
    """The fleet, started by the first module that needs it and stopped after the last one.

    Each test module holds it through a module-scoped fixture. When a module is done and a later
    module of this session still uses the fleet, it keeps running (so with both modules selected
    it starts once); otherwise it stops there, not at the end of the session, so that the tests
    that follow do not share the machine with it."""
    if _shared["fleet"] is None:
        stack = contextlib.ExitStack()
        try:
            _shared["fleet"] = stack.enter_context(start_fleet(make_dir()))
        except BaseException:
            stack.close()
            raise
        _shared["stack"] = stack
    _shared["users"] += 1
    try:
        yield _shared["fleet"]
    finally:
        _shared["users"] -= 1
        if _shared["users"] == 0 and not needed_later(request):
            _stop_shared()
