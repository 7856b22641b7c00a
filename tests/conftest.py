"""Shared test helpers: where the recorded fixtures live, and a started GPU source over one."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# The tests start some 450 Python processes (the command line, the daemon, the probe worker),
# each of which imports sparkdiag. With PYTHONDONTWRITEBYTECODE set, as on the development
# machine, every one of them compiled its modules from source again, and pytest rewrote every
# test module's asserts again on each worker: the fast subset took 5:44 on two workers there,
# 4:50 with the caches. They go where Python puts them by default (__pycache__, git ignores it).
if sys.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE"):
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from sparkdiag.sources.nvml.fixture import FORMAT, FixtureBackend
from sparkdiag.sources.nvml.gpu import GpuSource
from tests.support import fuzz
from tests.support.engine import Images, require_engine

FIXTURES = Path(__file__).parent / "fixtures"
NVML_FIXTURES = FIXTURES / "nvml"


@pytest.fixture(autouse=True, scope="session")
def _private_state_directory(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Daemons and commands started by the tests keep their baselines in a temporary state
    directory (children inherit the environment), never in the user's ~/.local/state."""
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))
    os.environ.pop("STATE_DIRECTORY", None)


@pytest.fixture
def nvml_fixture() -> Callable[[str], Path]:
    """``nvml_fixture("h200-idle")`` -> the path of ``tests/fixtures/nvml/h200-idle.json``."""

    def path(name: str) -> Path:
        found = NVML_FIXTURES / f"{name}.json"
        assert found.is_file(), f"no NVML fixture {found}"
        return found

    return path


@pytest.fixture
def started_source(nvml_fixture: Callable[[str], Path]) -> Callable[[str], GpuSource]:
    """``started_source("h200-idle")`` -> a :class:`GpuSource` over that fixture, started."""

    def start(name: str) -> GpuSource:
        source = GpuSource(FixtureBackend(nvml_fixture(name)))
        assert source.start() is True
        return source

    return start


@pytest.fixture
def write_fixture(tmp_path: Path) -> Callable[..., Path]:
    """``write_fixture(doc, name="derived.json")`` writes an NVML fixture into ``tmp_path``.

    ``format`` is filled in unless the document sets it; ``base`` is written as given (the
    loader resolves it against the fixture file's directory, i.e. ``tmp_path``).
    """

    def write(doc: Any, name: str = "derived.json") -> Path:
        if isinstance(doc, dict):
            doc = {"format": FORMAT, **doc}
        path = tmp_path / name
        path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
        return path

    return write


@pytest.fixture
def derive_fixture(
    write_fixture: Callable[..., Path], nvml_fixture: Callable[[str], Path]
) -> Callable[..., Path]:
    """``derive_fixture("h200-idle", devices=[...], script=[...])`` writes (as
    :func:`write_fixture` does) a fixture whose ``base`` is that recorded NVML fixture, with the
    other top-level keys given."""

    def write(base: str, **fields: Any) -> Path:
        return write_fixture({"base": str(nvml_fixture(base)), **fields})

    return write


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> Images:
    """The container images of this run (podman), each built on first use and then shared;
    skips (fails in CI) without podman, mmdebstrap or root."""
    require_engine()
    return Images(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="session")
def torch() -> Any:
    """torch, imported in the worker that runs a test asking for it, not by every worker's
    collection (tests.support.skip_unless_installed says why); skips where it is missing."""
    return pytest.importorskip("torch")


# The slow kinds: each is a marker, and every test of one of them is also `slow`, so that
# `pytest -m "not slow"` runs the rest in a few minutes (README, "Tests"). A test that
# uses one of these fixtures runs the real probe worker (CPU torch) in a subprocess.
SLOW_KINDS = ("container", "systemd", "prometheus", "worker", "network", "storage")
WORKER_FIXTURES = frozenset({"cpu_run", "cpu_doc", "hot_doc", "torch_venv"})


def pytest_configure(config: pytest.Config) -> None:
    """A run that leaves the slow kinds out tries a quarter of each fuzz test's examples
    (tests/support/fuzz.py); the full run, CI's, tries them all.

    SIGINT and SIGQUIT ignored on entry (a run started with ``&`` by a shell without job
    control: bash ignores both for it), and SIGHUP (a run under nohup), are taken back to their
    defaults: every process a test starts inherits an ignored signal through exec, and the tests
    of how watch stops its job (tests/test_watch_job.py) then saw SIGTERM's 143 where SIGINT's
    130 was due, or a ``trap`` the shell may not set; under nohup, sparkdiag honours the ignored
    SIGHUP on purpose, and the tests of a closed terminal timed out. What watch does with a job
    that ignores SIGINT, and a command under nohup, are tested as such."""
    fuzz.quick = "not slow" in (config.getoption("markexpr") or "")
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGQUIT, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if WORKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.worker)
        if any(item.get_closest_marker(kind) for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.slow)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` starts two workers a CPU, not one: most of a test's time here is spent
    waiting for a process it started (the CLI, a daemon, promtool), so a second worker a CPU
    keeps the CPUs busy (on 2 cores the fast subset took 4:49 with 2 workers, 3:49 with 4).
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` and ``-n logical`` keep pytest-xdist's own meaning (None:
    its hook answers)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or config.option.numprocesses != "auto":
        return None
    return 2 * len(os.sched_getaffinity(0))
