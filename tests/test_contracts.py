"""The contracts defined once (docs/architecture.md): the worker's command line and document, the
settings every command takes, the busy rule, the baseline store, and stopping running workers."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkdiag.baseline.model import BaselineStoreError
from sparkdiag.baseline.store import open_store
from sparkdiag.config import OPTIONS
from sparkdiag.errors import UsageError
from sparkdiag.flags import settings_from
from sparkdiag.probe.document import (
    SCHEMA,
    DocumentError,
    find_document,
    parse_document,
    parse_progress,
)
from sparkdiag.probe.request import WorkerRequest
from sparkdiag.probe.runner import kill_running_workers, run_worker
from sparkdiag.probe.worker.contract import ALL_DTYPES, PROGRESS_PREFIX, SUITES, parse_args
from sparkdiag.snapshot import GpuIdentity, GpuSample
from sparkdiag.telemetry.busy import busy
from tests.support import PROBE, alive, wait_dead
from tests.support.fuzz import examples

FAKE = Path(__file__).parent / "support" / "probe_scripts" / "fake_worker.py"

# -- the worker's command line ----------------------------------------------------------------

requests = st.builds(
    WorkerRequest,
    device=st.sampled_from([None, "cpu", "cuda:0", "cuda:3"]),
    dtypes=st.lists(st.sampled_from(ALL_DTYPES), unique=True, max_size=4).map(tuple),
    shapes=st.lists(
        st.tuples(*(st.integers(1, 16384),) * 3).map(lambda t: "x".join(map(str, t))),
        max_size=3,
    ).map(tuple),
    small=st.booleans(),
    probe_when=st.sampled_from(["idle", "always"]),
    busy_utilization=st.none() | st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    budget_seconds=st.none() | st.sampled_from([0.1, 1.0, 2.0, 30.0]),
    iters=st.none() | st.integers(1, 300),
    warmup=st.none() | st.integers(0, 50),
    bandwidth=st.none() | st.booleans(),
    transfers=st.none() | st.booleans(),
    suite=st.sampled_from([None, "default", "hot", "check"]),
    soak_seconds=st.none() | st.floats(0.001, 86400),
    window_seconds=st.none() | st.floats(0.001, 3600),
    progress=st.booleans(),
    exclude_pids=st.lists(st.integers(1, 2**22), max_size=3).map(tuple),
)


@given(requests)
@settings(max_examples=examples(200), deadline=None)
def test_every_request_is_read_back_by_the_worker(request: WorkerRequest) -> None:
    args = parse_args(request.argv())
    assert args.device == request.device
    suite = request.suite or ("default" if request.soak_seconds is None else "hot")
    assert args.dtype == (list(request.dtypes) or list(SUITES[suite].dtypes))
    assert ["x".join(map(str, s)) for s in args.shape] == list(request.shapes)
    assert args.small is request.small
    assert args.probe_when == request.probe_when
    assert args.bandwidth is (
        SUITES[suite].bandwidth if request.bandwidth is None else request.bandwidth
    )
    assert args.progress is request.progress
    assert args.exclude_pid == list(request.exclude_pids)
    if request.busy_utilization is not None:
        assert args.busy_utilization == request.busy_utilization
    if request.budget_seconds is not None:
        assert args.budget_seconds == request.budget_seconds
    if request.iters is not None:
        assert args.iters == request.iters
    if request.warmup is not None:
        assert args.warmup == request.warmup
    assert args.transfers is (
        SUITES[suite].transfers if request.transfers is None else request.transfers
    )
    for name in ("soak_seconds", "window_seconds"):  # every float reads back exactly
        if getattr(request, name) is not None:
            assert getattr(args, name) == getattr(request, name)
    assert args.suite == suite


def test_every_request_field_is_a_worker_flag_and_every_click_flag_the_workers() -> None:
    """One declaration (worker.FLAGS): the request writes it, the worker parses it, and each
    worker flag a command shows is spelled, typed and bounded as the worker takes it."""
    from dataclasses import fields

    from click.testing import CliRunner

    from sparkdiag.cli import main
    from sparkdiag.probe.worker.contract import FLAGS, FLAGS_BY_NAME

    by_field = {flag.field: flag for flag in FLAGS}
    assert {f.name for f in fields(WorkerRequest)} <= set(by_field)
    exposed = {
        "probe": ("--dtype", "--small", "--shape", "--device"),
        "bench": ("--dtype", "--small", "--device", "--iters", "--warmup"),
        "soak": ("--dtype", "--small", "--device"),
        "compare": ("--dtype", "--shape", "--budget-seconds", "--iters"),
    }
    for command, names in exposed.items():
        shown = CliRunner().invoke(main, [command, "--help"]).output
        for name in names:
            assert name in shown, (command, name)
            assert FLAGS_BY_NAME[name].help.split(":")[0].split(",")[0] in shown, (command, name)
    refused = CliRunner().invoke(main, ["bench", "--iters", "0"])  # the worker's minimum
    assert refused.exit_code == 2 and "--iters" in refused.output


# -- the worker's document ---------------------------------------------------------------------


def test_recorded_document_parses_into_typed_fields() -> None:
    raw = json.loads((PROBE / "h200-default.json").read_text())
    doc = parse_document(raw)
    assert doc.software.gpu_name == "NVIDIA H200"
    assert doc.software.identity()[1].startswith("2.")
    bf16 = next(r for r in doc.results if r.label == "bf16 8192x8192x8192")
    assert bf16.kind == "compute" and bf16.delivered is not None and bf16.delivered > 500
    assert doc.bandwidth is not None and (doc.bandwidth.delivered or 0) > 1e12
    assert doc.conditions.temperatures().keys() <= {"gpu", "memory"}
    assert doc.raw is raw


def test_a_foreign_document_is_refused() -> None:
    with pytest.raises(DocumentError, match="schema"):
        parse_document({"schema": "sparkdiag-probe/0", "status": "ok"})
    with pytest.raises(DocumentError):
        parse_document([1, 2, 3])
    assert find_document(b"") is None
    assert find_document(b"hello\n{not json\n") is None


def test_banner_before_the_document_is_skipped() -> None:
    line = json.dumps({"schema": SCHEMA, "status": "ok", "results": []})
    found = find_document(f"== NGC banner ==\n{{ not this }}\n{line}\n".encode())
    assert found is not None and found.status == "ok"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=30,
)
keys = st.sampled_from(
    [
        "status",
        "reason",
        "software",
        "results",
        "bandwidth",
        "conditions",
        "busy",
        "gpu_busy_seconds",
        "finished_at",
        "dtype",
        "shape",
        "delivered",
        "peak",
        "beta",
        "other_pids",
        "transfers",
        "ratios",
        "soak",
        "windows",
    ]
)


@given(st.dictionaries(keys, json_values, max_size=10))
@settings(max_examples=examples(400), deadline=None)
def test_any_json_with_the_schema_parses_without_raising(body: dict[str, Any]) -> None:
    """Wrong-typed values become None or are dropped; nothing else is raised."""
    doc = parse_document({**body, "schema": SCHEMA})
    for r in doc.results:
        assert isinstance(r.dtype, str) and isinstance(r.beta, int)
        assert r.delivered is None or r.delivered > 0
    assert all(isinstance(p, int) for p in doc.busy.other_pids)
    parse_progress(PROGRESS_PREFIX + json.dumps(body))


@given(st.binary(max_size=300))
@settings(max_examples=examples(300), deadline=None)
def test_any_bytes_on_stdout_give_a_document_or_none(data: bytes) -> None:
    find_document(data)


def test_deeply_nested_json_is_no_document() -> None:
    assert find_document(b"[" * 100_000 + b"]" * 100_000) is None


# -- settings every command takes ----------------------------------------------------------------


def test_each_command_gets_its_own_defaults() -> None:
    assert settings_from("serve", {}).probe_timeout == 60.0
    check = settings_from("check", {})
    assert check.probe_timeout == 25.0 and check.log_level == "error"
    assert settings_from("bench", {}).probe_timeout == 1800.0
    given_flags: dict[str, Any] = {"probe_timeout": 30.0, "dtypes": ["bf16"]}
    assert settings_from("check", given_flags).probe_timeout == 30.0
    assert given_flags == {"dtypes": ["bf16"]}  # the setting flags were taken out


def test_every_command_default_and_help_names_a_command_that_takes_it() -> None:
    for option in OPTIONS:
        assert set(option.command_default) <= option.scopes, option.key
        assert set(option.command_help) <= option.scopes, option.key
        for command in option.command_default:
            option.convert(option.default_for(command), "")


def test_an_unclosed_quote_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"--probe\.python: .* cannot be split into arguments"):
        settings_from("serve", {"probe_python": "python3 'unclosed"})
    with pytest.raises(UsageError, match=r"probe\.timeout"):
        settings_from("compare", {"probe_timeout": 0.5})


# -- the busy rule ---------------------------------------------------------------------------------


def _gpu(pids: tuple[int, ...] | None, util: float | None) -> GpuSample:
    identity = GpuIdentity(0, "GPU-x", "NVIDIA H200", "0", "580", "9.0", "dedicated")
    return GpuSample(
        identity, True, compute_pids=pids, utilization_ratio={} if util is None else {"gpu": util}
    )


def test_busy_rule() -> None:
    assert busy(_gpu((), 0.05), frozenset(), 0.1) is None
    assert busy(_gpu(None, None), frozenset(), 0.1) is None  # nothing known: not busy
    assert busy(_gpu((7,), 0.99), frozenset({7}), 1.0) is None  # our own worker
    other = busy(_gpu((7, 8), 0.0), frozenset({7}), 0.1)
    assert other is not None and other.other_pids == (8,)
    assert other.describe(lambda p: f"pid {p} (python3)") == "pid 8 (python3)"
    hot = busy(_gpu((), 0.5), frozenset(), 0.1)
    assert hot is not None and hot.other_pids == () and hot.describe() == "utilization 50%"
    many = busy(_gpu((1, 2, 3, 4, 5), None), frozenset(), 0.1)
    assert many is not None and many.describe().endswith("and 2 more")


# -- the baseline store ----------------------------------------------------------------------------


def test_open_store_creates_only_when_asked(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with pytest.raises(BaselineStoreError, match="no baselines yet"):
        open_store(state, create=False)
    assert not state.exists()
    open_store(state, create=True).close()
    assert (state / "baselines.sqlite").is_file()
    open_store(state, create=False).close()
    (tmp_path / "file").write_text("")
    with pytest.raises(BaselineStoreError, match="not a directory"):
        open_store(tmp_path / "file", create=True)


# -- stopping running workers ----------------------------------------------------------------------


def test_kill_running_workers_ends_every_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    cycles: list[Any] = []
    thread = threading.Thread(
        target=lambda: cycles.append(
            run_worker([sys.executable, str(FAKE), "sleep", str(pidfile)], timeout=60)
        )
    )
    thread.start()
    end = time.monotonic() + 10
    while not pidfile.exists() and time.monotonic() < end:
        time.sleep(0.02)
    worker, grandchild = (int(x) for x in pidfile.read_text().split())
    assert alive(worker) and alive(grandchild)
    assert kill_running_workers() == 1
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert wait_dead([worker, grandchild]) == []
    (cycle,) = cycles
    assert cycle.result == "error" and "SIGKILL" in (cycle.reason or "")
    assert kill_running_workers() == 0
