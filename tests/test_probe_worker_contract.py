"""The worker's contract: its arguments, the suites' defaults, the kind-value lists."""

from __future__ import annotations

import pytest

from sparkdiag.probe.worker import contract


def test_parse_args() -> None:
    a = contract.parse_args(["--dtype", "bf16,int4", "--dtype", "int4", "--shape", "1x8192x8192"])
    assert a.dtype == ["bf16", "int4"]
    assert a.shape == [(1, 8192, 8192)]
    assert a.warmup == 10 and a.iters is None and a.probe_when == "idle"
    assert a.bandwidth is True and a.budget_seconds == 2.0
    assert contract.parse_args([]).dtype == list(contract.ALL_DTYPES)
    assert contract.parse_args(["--no-bandwidth"]).bandwidth is False
    with pytest.raises(contract.UsageError):
        contract.parse_args(["--dtype", "fp64"])
    with pytest.raises(contract.UsageError):
        contract.parse_args(["--probe-when", "sometimes"])


def test_parse_kind_values() -> None:
    defaults = {"compute": 4.0, "llm": 1.5, "decode": 0.5}
    assert contract.parse_kind_values(None, defaults, "--x") == defaults
    assert contract.parse_kind_values("2", defaults, "--x") == dict.fromkeys(defaults, 2.0)
    got = contract.parse_kind_values("compute=8, decode=1", defaults, "--x")
    assert got == {"compute": 8.0, "llm": 1.5, "decode": 1.0}
    for bad in ("gpu=1", "compute", "compute=x", "compute=-1", "nan"):
        with pytest.raises(contract.UsageError, match="--x"):
            contract.parse_kind_values(bad, defaults, "--x")
    args = contract.parse_args(["--kind-weights", "compute=6", "--warmup-ms", "decode=5"])
    assert args.kind_weights["compute"] == 6.0 and args.kind_weights["llm"] == 1.5
    assert args.warmup_ms["decode"] == 5.0 and args.warmup_ms["compute"] == 25.0
    for bad_args in (["--budget-fraction", "0"], ["--min-iters", "5", "--max-iters", "4"]):
        with pytest.raises(contract.UsageError):
            contract.parse_args(bad_args)


def test_suite_defaults() -> None:
    hot = contract.parse_args(["--suite", "hot"])
    assert hot.dtype == ["int4", "bf16", "fp16", "fp8", "nvfp4"]
    assert (hot.probe_when, hot.spinup_ms, hot.budget_seconds) == ("always", 0.0, 0.1)
    assert hot.bandwidth is False and hot.rounds == 3 and hot.min_iters == 1
    assert hot.warmup_ms["decode"] == 1.0
    forced = contract.parse_args(["--suite", "hot", "--probe-when", "idle", "--spinup-ms", "20"])
    assert forced.probe_when == "idle" and forced.spinup_ms == 20.0
    default = contract.parse_args([])
    assert default.suite == "default" and default.dtype == list(contract.ALL_DTYPES)
    assert (default.probe_when, default.spinup_ms, default.rounds) == ("idle", 150.0, 1)
    check = contract.parse_args(["--suite", "check"])
    # fp8 and nvfp4 for check's dtype-order row, which skipped on every real run without them
    assert check.dtype == ["bf16", "fp16", "fp8", "nvfp4", "int4"] and check.budget_seconds == 1.5
    with pytest.raises(contract.UsageError):
        contract.parse_args(["--suite", "warm"])
    with pytest.raises(contract.UsageError):
        contract.parse_args(["--rounds", "0"])
