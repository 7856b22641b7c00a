"""One source per default: every default below is a setting's (config.OPTIONS); each row fails
when the code's default drifts from the setting's, or when a literal creeps back in its place.
The worker cannot import sparkdiag (it is sent alone over stdin), so its copies are held equal
here too."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from sparkdiag import kubernetes
from sparkdiag.check.model import CheckContext
from sparkdiag.check.probe_run import worker_launcher
from sparkdiag.config import OPTIONS_BY_KEY, parse_listen
from sparkdiag.probe import runner
from sparkdiag.probe.worker import contract
from sparkdiag.scheduling.hot_probe import HotLimits
from sparkdiag.scheduling.scheduler import ProbeScheduler
from sparkdiag.telemetry.poller import Poller


def _parameter(fn: Callable[..., Any], name: str) -> Any:
    return inspect.signature(fn).parameters[name].default


def _field(cls: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


CASES: list[tuple[str, Callable[[], Any], str]] = [
    ("HotLimits.memory_celsius", lambda: HotLimits().memory_celsius, "probe.hot-memory-celsius"),
    ("HotLimits.gpu_celsius", lambda: HotLimits().gpu_celsius, "probe.hot-gpu-celsius"),
    ("HotLimits.interval", lambda: HotLimits().interval, "probe.hot-interval"),
    ("HotLimits.min_interval", lambda: HotLimits().min_interval, "probe.hot-min-interval"),
    ("HotLimits.busy_utilization", lambda: HotLimits().busy_utilization,
     "probe.busy-utilization"),
    ("ProbeScheduler when", lambda: _parameter(ProbeScheduler, "when"), "probe.when"),
    ("ProbeScheduler busy_utilization", lambda: _parameter(ProbeScheduler, "busy_utilization"),
     "probe.busy-utilization"),
    ("ProbeScheduler cool_below", lambda: _parameter(ProbeScheduler, "cool_below"),
     "probe.hot-memory-celsius"),
    ("Poller interval", lambda: _parameter(Poller, "interval"), "poll-interval"),
    ("Poller pcie_interval", lambda: _parameter(Poller, "pcie_interval"), "pcie-interval"),
    ("CheckContext.busy_utilization", lambda: _field(CheckContext, "busy_utilization"),
     "probe.busy-utilization"),
    ("check worker_launcher busy_utilization",
     lambda: _parameter(worker_launcher, "busy_utilization"), "probe.busy-utilization"),
    ("runner.DEFAULT_TIMEOUT", lambda: runner.DEFAULT_TIMEOUT, "probe.timeout"),
    ("worker --busy-utilization", lambda: contract.FLAGS_BY_NAME["--busy-utilization"].default,
     "probe.busy-utilization"),
    ("worker default suite's probe-when", lambda: contract.SUITES["default"].probe_when,
     "probe.when"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("default", "key"), [pytest.param(get, key, id=name) for name, get, key in CASES]
)
def test_default_is_the_settings(default: Callable[[], Any], key: str) -> None:
    assert default() == OPTIONS_BY_KEY[key].default


def test_the_manifests_port_is_the_listen_default() -> None:
    assert parse_listen(OPTIONS_BY_KEY["listen"].default)[1] == kubernetes.PORT


def test_the_worker_reads_its_busy_default_back_unchanged() -> None:
    """What a request without --busy-utilization gets is the daemon's threshold."""
    assert (
        contract.parse_args([]).busy_utilization == OPTIONS_BY_KEY["probe.busy-utilization"].default
    )
