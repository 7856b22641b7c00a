"""sparkdiag probe, bench and baseline from the command line, on CPU torch and fixtures."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from sparkdiag.baseline.model import BaselineKey
from sparkdiag.baseline.store import BaselineStore
from sparkdiag.cli import main
from sparkdiag.probe.worker.contract import SCHEMA
from sparkdiag.sources.software import packages
from tests.support import NVML, PROBE, ROOT, invoke_cli, scaled_cycle, sparkdiag_cmd


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The command in this process (what it says and its status)."""
    return invoke_cli(*args, timeout=timeout)


def run_process(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The command in a process of its own: the real worker's runs, as they ran before."""
    return subprocess.run(
        sparkdiag_cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def test_probe_replays_a_recorded_cycle_and_learns_a_baseline(tmp_path: Path) -> None:
    args = [
        "probe",
        "--nvml-fixture",
        str(NVML / "h200-idle.json"),
        "--probe.fixture",
        str(PROBE / "h200-default.json"),
        "--record",  # a replayed cycle teaches only when asked to
        "--state-dir",
        str(tmp_path),
    ]
    for _ in range(3):  # three healthy runs teach the baseline
        result = run(*args, "--json")
        assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    (gpu,) = doc["gpus"]
    assert gpu["uuid"] == "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"
    bf16 = next(
        f for f in gpu["figures"] if (f["dtype"], f["kind"], f["beta"]) == ("bf16", "compute", 0)
    )
    # as recorded on the H200 (docs/device/2026-12-01/part-f/probe-default.json): the batch
    # delivered a little more than the median iteration (peak), both kept
    assert bf16["delivered_tflops"] == pytest.approx(725.47, abs=0.01)
    assert bf16["peak_tflops"] == pytest.approx(722.64, abs=0.01)
    assert bf16["baseline_tflops"] == pytest.approx(725.47, abs=0.01)
    assert bf16["efficiency"] == pytest.approx(1.0)
    assert bf16["reference"]["kind"] == "mamf" and bf16["reference"]["tflops"] == 794.5
    # the run may teach the baseline: no heat or power reason, above the MAMF floor (schema /1
    # named it "healthy", which read as the kernel's health)
    assert doc["schema"] == "sparkdiag-probe-report/2"
    assert bf16["counts_toward_baseline"] is True and "healthy" not in bf16
    nvfp4 = [f for f in gpu["figures"] if f["dtype"] == "nvfp4"]
    assert nvfp4 and all(f["status"] == "unsupported" and f["reason"] for f in nvfp4)
    # the table: one row per kernel, the decode comparison and the conditions
    table = run(*args, "--no-record")
    assert table.returncode == 0, table.stderr
    assert "GPU 0 NVIDIA H200 GPU-979ad365-0b73-a0ac-74a2-3520b773d460: ok" in table.stdout
    # the median iterations' ratio first (what the hot probe and its alert compare): the
    # recording's peaks 5.79 / 3.68, delivered 6.62 / 3.98 (graph replays: no events in them)
    assert (
        "int4 / bf16 at decode shape 1x8192x8192: 1.58x from the median iterations "
        "(1.66x delivered)" in table.stdout
    )
    assert "during the probe: GPU max 52 °C, memory max 52 °C" in table.stdout
    with BaselineStore(tmp_path / "baselines.sqlite") as store:
        assert len(store.list()) >= 19  # every measured kernel, beta=1 apart


@pytest.mark.worker
def test_probe_runs_the_real_worker_on_cpu(tmp_path: Path) -> None:
    result = run_process(
        "probe",
        "--small",
        "--dtype",
        "bf16",
        "--json",
        "--state-dir",
        str(tmp_path),
        "--nvml-fixture",
        str(NVML / "no-nvml.json"),
    )
    assert result.returncode == 0, result.stderr
    (gpu,) = json.loads(result.stdout)["gpus"]
    assert gpu["result"] == "ok" and gpu["uuid"] is None  # no NVML: no baseline either
    assert {f["shape"] for f in gpu["figures"]} == {"256x256x256", "256x688x256", "1x256x256"}
    assert all(f["delivered_tflops"] > 0 for f in gpu["figures"])


@pytest.mark.worker
def test_probe_device_cpu_runs_the_worker_on_the_cpu_beside_a_gpu(tmp_path: Path) -> None:
    """Issue 21: probe had no --device (bench, soak and compare do); with it the worker runs on
    that device even where NVML lists a GPU, and no baseline is taught from it."""
    pytest.importorskip("torch")
    started = time.monotonic()
    result = run_process(
        "probe",
        "--device",
        "cpu",
        "--small",
        "--json",
        "--state-dir",
        str(tmp_path),
        "--nvml-fixture",
        str(NVML / "h200-idle.json"),
    )
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert took < 60, f"probe --device cpu --small took {took:.1f} s"
    (run_,) = json.loads(result.stdout)["gpus"]
    assert run_["gpu"] is None and run_["result"] == "ok"
    assert run_["worker"]["software"]["device"] == "cpu"
    assert all(f["baseline_tflops"] is None for f in run_["figures"])
    assert not (tmp_path / "baselines.sqlite").exists()


def test_probe_without_torch_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21: without torch probe printed "torch None, CUDA None" and no hint."""
    monkeypatch.setattr(packages, "installed_version", lambda _name: None)
    result = CliRunner().invoke(main, ["probe", "--device", "cpu", "--small"])
    assert result.exit_code == 3, result.output
    assert "torch is not installed for" in result.output
    assert "-m pip install torch" in result.output and "torch None" not in result.output


def test_probe_usage_errors() -> None:
    bad = run("probe", "--shape", "8192x8192", "--nvml-fixture", str(NVML / "h200-idle.json"))
    assert bad.returncode == 2 and "expected MxNxK" in bad.stderr
    missing = run("probe", "--gpu", "5", "--nvml-fixture", str(NVML / "h200-idle.json"))
    assert missing.returncode == 2 and "no GPU with index 5" in missing.stderr
    both = run("probe", "--device", "cpu", "--gpu", "0")
    assert both.returncode == 2 and "give --device or --gpu, not both" in both.stderr
    bad = run("probe", "--device", "gpu")
    assert bad.returncode == 2 and "expected cpu, cuda or cuda:N" in bad.stderr


@pytest.mark.worker
def test_bench_sweeps_with_csv_and_json(tmp_path: Path) -> None:
    out_csv, out_json = tmp_path / "b.csv", tmp_path / "b.json"
    result = run_process(
        "bench",
        "--device",
        "cpu",
        "--m",
        "64:192:64",
        "--iters",
        "3",
        "--warmup",
        "2",
        "--csv",
        str(out_csv),
        "--json",
        str(out_json),
    )
    assert result.returncode == 0, result.stderr
    assert "bf16: best" in result.stdout and "over 3 shapes" in result.stdout
    rows = list(csv.DictReader(out_csv.open()))
    assert [r["shape"] for r in rows] == ["64x64x64", "128x128x128", "192x192x192"]
    assert all(r["status"] == "ok" and float(r["delivered_tflops"]) > 0 for r in rows)
    assert json.loads(out_json.read_text())["schema"] == SCHEMA


@pytest.mark.worker
@pytest.mark.parametrize("small", [["--small"], []], ids=["small", "cpu"])
def test_bench_small_sweeps_small_cubes_and_its_count_reaches_its_total(
    tmp_path: Path, small: list[str]
) -> None:
    """Issue 21: ``bench --device cpu --small`` swept 16 cubes up to 16384³ (5 of 32 after
    197 s), and its bar counted a beta=1 pass that never runs with explicit shapes. A CPU
    sweeps the small cubes with or without --small."""
    pytest.importorskip("torch")
    out_csv = tmp_path / "b.csv"
    started = time.monotonic()
    result = run_process("bench", "--device", "cpu", *small, "--csv", str(out_csv))
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert took < 60, f"bench --small took {took:.1f} s"
    rows = list(csv.DictReader(out_csv.open()))
    shapes = ["128x128x128", "256x256x256", "384x384x384", "512x512x512"]
    assert [r["shape"] for r in rows] == shapes
    counts = re.findall(r"bench \[(\d+)/(\d+)\]", result.stderr)
    assert counts == [(str(i), "4") for i in range(1, 5)], result.stderr
    assert "swept 4 kernels" in result.stdout and "over 4 shapes" in result.stdout


@pytest.mark.worker
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_bench_ctrl_c_keeps_what_was_measured(tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C and SIGTERM alike (SIGTERM ended bench at once, its kernels lost, before issue
    34), the partial JSON naming the one received."""
    pytest.importorskip("torch")
    out_csv, out_json = tmp_path / "b.csv", tmp_path / "b.json"
    proc = subprocess.Popen(
        sparkdiag_cmd(
            "bench",
            "--device",
            "cpu",
            "--m",
            "64,96,128,8192",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--csv",
            str(out_csv),
            "--json",
            str(out_json),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # wait for the third kernel; the 8192 cube takes far longer
        seen.append(line)
        if "bench [3/4]" in line:
            break
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(seen) + err
    assert "interrupted after 3 of 4 kernels" in err
    rows = list(csv.DictReader(out_csv.open()))
    assert [r["shape"] for r in rows] == ["64x64x64", "96x96x96", "128x128x128"]
    body = json.loads(out_json.read_text())
    assert body["schema"] == "sparkdiag-bench-partial/1" and body["done"] == 3
    assert body["interrupted"] == sig.name
    assert [r["shape"] for r in body["results"]] == [r["shape"] for r in rows]
    assert "bf16: best" in out and "over 3 shapes" in out


@pytest.mark.parametrize("flag", ["--csv", "--json"])
def test_bench_checks_its_output_paths_before_the_sweep(flag: str) -> None:
    result = run("bench", "--device", "cpu", "--small", flag, "/nonexistent/dir/b.out")
    assert result.returncode == 2, result.stderr
    assert f"'{flag}': folder /nonexistent/dir does not exist" in result.stderr
    assert "bench [" not in result.stderr and "Traceback" not in result.stderr


def test_bench_rejects_a_bad_range() -> None:
    result = run("bench", "--m", "100:10:5")
    assert result.returncode == 2 and "START:STOP:STEP" in result.stderr


def key(dtype: str = "bf16") -> BaselineKey:
    return BaselineKey("GPU-abc", dtype, "8192x8192x8192", "native", "580", "2.11", "13.0")


def test_baseline_show_pin_reset(tmp_path: Path) -> None:
    with BaselineStore(tmp_path / "baselines.sqlite") as store:
        for value in (700.0, 710.0, 690.0):
            store.record_run(key(), value, healthy=True)
            store.record_run(key("fp8"), value * 2, healthy=True)
    state = ["--state-dir", str(tmp_path)]
    shown = run("baseline", "show", *state, "--json")
    assert shown.returncode == 0
    rows = {r["dtype"]: r for r in json.loads(shown.stdout)}
    assert rows["bf16"]["tflops"] == 700.0 and rows["bf16"]["source"] == "learned"
    ambiguous = run("baseline", "pin", *state, "--uuid", "GPU-abc")
    assert ambiguous.returncode == 2 and "2 baselines match" in ambiguous.stderr
    pinned = run("baseline", "pin", *state, "--dtype", "bf16", "--tflops", "720", "--note", "ok")
    assert pinned.returncode == 0 and "pinned bf16 8192x8192x8192 native at 720.0" in pinned.stdout
    with BaselineStore(tmp_path / "baselines.sqlite") as store:
        b = store.get(key())
        assert b is not None and (b.tflops, b.source, b.note) == (720.0, "pinned", "ok")
    refused = run("baseline", "reset", *state)
    assert refused.returncode == 2 and "--all" in refused.stderr
    reset = run("baseline", "reset", *state, "--dtype", "fp8")
    assert reset.returncode == 0 and "removed 1 baseline(s)" in reset.stdout
    with BaselineStore(tmp_path / "baselines.sqlite") as store:
        assert [b.key.dtype for b in store.list()] == ["bf16"]


def test_baseline_show_without_a_store(tmp_path: Path) -> None:
    """Issue 21: on a fresh machine show exited 1 with "Error:", but 0 on an empty store; now
    both exit 0 and nothing is created. pin and reset still need a store."""
    none = tmp_path / "none"
    result = run("baseline", "show", "--state-dir", str(none))
    assert result.returncode == 0 and "Error" not in result.stderr, result.stderr
    assert result.stdout == (
        f"no baselines yet ({none}/baselines.sqlite does not exist): 'sparkdiag probe' or the "
        "daemon learns them\n"
    )
    as_json = run("baseline", "show", "--json", "--state-dir", str(none))
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == []
    assert not none.exists()
    pin = run("baseline", "pin", "--state-dir", str(none))
    assert pin.returncode == 3 and "no baselines yet" in pin.stderr


def test_a_figure_counts_toward_the_baseline_only_without_a_heat_or_power_reason() -> None:
    from sparkdiag.baseline.evaluate import evaluate
    from sparkdiag.probe.document import parse_document

    def figure(reasons: int) -> bool:
        doc = parse_document(
            {
                "schema": SCHEMA,
                "status": "ok",
                "results": [
                    {
                        "dtype": "bf16",
                        "shape": "1x8192x8192",
                        "kind": "decode",
                        "beta": 0,
                        "status": "ok",
                        "delivered": 3.0,
                        "peak": 3.0,
                    }
                ],
                "conditions": {"clock_event_reasons_seen": reasons, "samples": 3},
            }
        )
        (f,) = evaluate(doc, "GPU-x", "", "native", None)
        return f.counts_toward_baseline

    assert figure(0x1) is True  # gpu_idle
    assert figure(0x40) is False  # hw_thermal_slowdown


# -- issue 32: a verdict per GPU, one missing-torch line, CPU runs worded for a CPU -------------


def _learned(tmp_path: Path) -> list[str]:
    """The recorded H200 cycle, taught three times: its baselines are its own figures."""
    args = ["probe", "--nvml-fixture", str(NVML / "h200-idle.json"), "--state-dir", str(tmp_path)]
    for _ in range(3):
        recorded = ["--probe.fixture", str(PROBE / "h200-default.json"), "--record", "--json"]
        taught = CliRunner().invoke(main, [*args, *recorded])
        assert taught.exit_code == 0, taught.output
    return args


def _scaled(tmp_path: Path, factor: float, pids: list[int], **software: object) -> str:
    return str(scaled_cycle(tmp_path / f"scaled-{factor}.json", factor, pids, **software))


def test_a_replayed_cycle_s_pids_are_not_named_from_this_machine(tmp_path: Path) -> None:
    """The pids of a document replayed with --probe.fixture are the recording machine's: one
    that a process here happens to have is not given that process's name (CI named the
    recording's pid 4242 after a kernel thread of its own)."""
    here = os.getpid()  # a pid that surely exists here, with a name
    args = _learned(tmp_path / "state")
    slow = CliRunner().invoke(main, [*args, "--no-record", "--probe.fixture",
                                     _scaled(tmp_path, 0.48, [here])])  # fmt: skip
    said = " ".join(slow.output.split())
    assert said.endswith(f"at 0.48; while pid {here} used the GPU"), said


def test_probe_beside_another_process_is_slower_and_says_who(tmp_path: Path) -> None:
    """The one-shot probe never judged: beside a real ViT job every figure read 0.45-0.51 of its
    baseline and it said ok, exit 0."""
    args = _learned(tmp_path / "state")
    beside = _scaled(tmp_path, 0.48, [4242])
    recorded = str(PROBE / "h200-default.json")
    idle = CliRunner().invoke(main, [*args, "--no-record", "--probe.fixture", recorded])
    slow = CliRunner().invoke(main, [*args, "--no-record", "--probe.fixture", beside])
    assert idle.exit_code == 0, idle.output
    assert "verdict: as fast as its baseline, within the probe's 10 % noise band" in idle.output
    assert slow.exit_code == 1, slow.output
    said = " ".join(slow.output.split())
    assert (
        "verdict: slower than its baseline: 19 of 19 kernels below 0.90 of it, past the "
        "probe's 10 % noise band; the lowest" in said
    )
    assert said.endswith("at 0.48; while pid 4242 used the GPU")
    # the table itself is unchanged: the same rows and columns, other figures
    table = [line.split()[:4] for line in slow.output.splitlines() if line.startswith("  bf16 ")]
    assert table == [
        line.split()[:4] for line in idle.output.splitlines() if line.startswith("  bf16 ")
    ]
    as_json = CliRunner().invoke(main, [*args, "--no-record", "--json", "--probe.fixture", beside])
    doc = json.loads(as_json.output)
    verdict = doc["gpus"][0]["verdict"]
    assert (verdict["status"], verdict["noise_band"], verdict["judged"]) == ("slower", 0.1, 19)
    assert verdict["beside"] == "pid 4242" and verdict["lowest_efficiency"] == pytest.approx(0.48)


def test_probe_without_a_baseline_is_not_judged(tmp_path: Path) -> None:
    args = [
        "probe",
        "--nvml-fixture",
        str(NVML / "h200-idle.json"),
        "--no-record",
        "--state-dir",
        str(tmp_path),
        "--probe.fixture",
        str(PROBE / "h200-default.json"),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "verdict: not judged: no baseline stored for these kernels yet" in said
    assert not (tmp_path / "baselines.sqlite").exists()  # --no-record creates nothing


def test_a_run_beside_another_process_says_it_teaches_no_baseline(tmp_path: Path) -> None:
    """Beside another compute process a run teaches no baseline (found in a review), and the
    verdict still said "the probe learns one from its runs": three runs said it and learned
    nothing."""
    beside = _scaled(tmp_path, 0.62, [4242])
    args = ["probe", "--nvml-fixture", str(NVML / "h200-idle.json"), "--state-dir",
            str(tmp_path / "state"), "--probe.fixture", beside]  # fmt: skip
    for _ in range(3):
        done = CliRunner().invoke(main, args)
        assert done.exit_code == 0, done.output
        said = " ".join(done.output.split())
        assert (
            "verdict: not judged: no baseline stored for these kernels yet, and this run "
            "teaches none: another process used the GPU" in said
        )
    learned = CliRunner().invoke(main, ["baseline", "show", "--state-dir", str(tmp_path / "state")])
    assert "no baselines yet" in learned.output


def test_the_noise_band_edges() -> None:
    from sparkdiag.baseline.evaluate import GemmFigure
    from sparkdiag.baseline.model import Baseline
    from sparkdiag.baseline.verdict import NOISE_BAND, SLOWER_BELOW, judge

    key = BaselineKey("GPU-1", "bf16", "8192x8192x8192", "native", "d", "t", "c", "delivered")

    def figure(eff: float) -> GemmFigure:
        base = Baseline(key, 700.0, "learned", 5, 0.0, 0.0)
        return GemmFigure(
            "bf16", "8192x8192x8192", "compute", 0, "ok", None, 700.0 * eff, 700.0, base, None, True
        )

    assert (NOISE_BAND, SLOWER_BELOW) == (0.10, 0.90)
    assert judge([figure(0.95), figure(0.901)], "").status == "as fast"
    slower = judge([figure(0.95), figure(0.89)], "")
    assert slower.status == "slower" and len(slower.slower) == 1
    assert slower.lowest is not None and slower.lowest.efficiency == pytest.approx(0.89)
    none = judge([], "no baseline yet")
    assert (none.status, none.why_not) == ("not judged", "no baseline yet")


def test_a_cpu_run_is_worded_for_a_cpu(tmp_path: Path) -> None:
    """No "default device", no "GPU-busy time", no "None" versions, no baseline it cannot keep."""
    cpu = _scaled(
        tmp_path, 1.0, [], device="cpu", gpu_name=None, cuda=None, cublas=None, driver=None
    )
    result = CliRunner().invoke(main, ["probe", "--device", "cpu", "--probe.fixture", cpu])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.startswith("CPU (torch device cpu): ok\n")
    assert "default device" not in out and "GPU-busy" not in out and "None" not in out
    assert "  CPU-busy time of the cycle: " in out
    assert "no baseline stored" not in out and "(--record)" not in out
    said = " ".join(out.split())
    assert (
        "verdict: not judged: a run on a torch device (--device, or without NVML) has no GPU "
        "identity" in said
    )
    # the recording's bf16 batch delivered a little more than its median iteration: said why
    assert "peak below delivered (" in said and "the batch's mean iteration" in said


def test_bench_summary_calls_the_best_a_mamf_on_a_gpu_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sparkdiag.commands.bench import _summary
    from sparkdiag.probe.document import KernelResult

    results = [KernelResult("bf16", "128x128x128", "compute", 0, "ok", None, 0.19, peak=0.2)]
    _summary(["bf16"], results, "cpu")
    _summary(["bf16"], results, "cuda")
    cpu, gpu = capsys.readouterr().out.splitlines()[:2]
    assert "(the best on the CPU)" in cpu and "MAMF" not in cpu
    assert "(this GPU's MAMF)" in gpu


@pytest.mark.parametrize("command", ["probe", "bench", "soak"])
def test_missing_torch_is_said_one_way(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """probe said a clear line (exit 3); bench "sweep failed: worker exited 1: cannot import
    torch"; soak first "soaking cpu for 10 s ...", then the import error."""
    monkeypatch.setattr(packages, "installed_version", lambda _name: None)
    result = CliRunner().invoke(main, [command, "--device", "cpu", "--small"])
    assert result.exit_code == 3, result.output
    assert result.output.startswith("Error: torch is not installed for ")
    assert f"and sparkdiag {command} needs it: install it into the Python" in result.output
    assert "--index-url https://download.pytorch.org/whl/cpu" in result.output
    assert result.output.count("\n") == 1  # nothing before it, nothing after
    assert "soaking" not in result.output and "sweep failed" not in result.output


def test_bench_without_a_gpu_refuses_as_soak_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench with no flags on a machine without a GPU swept 1024³ to 16384³ bf16 on the CPU:
    9 of 16 kernels after 10 minutes."""
    from sparkdiag.commands import bench as bench_module

    def never(**_kwargs: object) -> None:
        raise AssertionError("no worker without a GPU")

    monkeypatch.setattr(bench_module, "run_worker", never)
    no_nvml = str(NVML / "no-nvml.json")
    for command in ("bench", "soak"):
        result = CliRunner().invoke(main, [command, "--nvml-fixture", no_nvml])
        assert result.exit_code == 1, result.output
        verb = command
        assert result.output.startswith(f"Error: no GPU to {verb}: nvmlInit failed")
        assert "--device cpu --small" in result.output


# -- nothing measured, and a shape a dtype cannot run ----------------------------------------------


def _nothing_supported(tmp_path: Path) -> str:
    """The recorded H200 cycle with every kernel unsupported and its memory copy still
    measured: what the worker says of ``--dtype fp8`` on a CPU (its status "ok")."""
    doc = json.loads((PROBE / "h200-default.json").read_text())
    for result in doc["results"]:
        result.update(status="unsupported", reason="fp8 needs compute capability 8.9+",
                      delivered=None, peak=None)  # fmt: skip
    assert doc["status"] == "ok" and doc["bandwidth"]["status"] == "ok"
    path = tmp_path / "nothing.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_nothing_measured_is_exit_1_as_the_help_says(tmp_path: Path, as_json: bool) -> None:
    """``probe --device cpu --small --dtype fp8`` showed every row unsupported and exited 0;
    probe --help says 1 for "nothing supported"."""
    args = ["probe", "--device", "cpu", "--probe.fixture", _nothing_supported(tmp_path)]
    result = CliRunner().invoke(main, [*args, *(["--json"] if as_json else [])])
    assert result.exit_code == 1, result.output
    if as_json:
        (run_,) = json.loads(result.output)["gpus"]
        assert run_["result"] == "unsupported"
        assert run_["reason"] == "no requested kernel is supported here"
    else:
        assert result.output.startswith(
            "torch device cuda:0: unsupported (no requested kernel is supported here)\n"
        )
        assert "fp8 needs compute capability 8.9+" in result.output


def test_a_shape_a_named_dtype_cannot_run_is_refused_before_the_worker() -> None:
    """``probe --shape 64x64x64`` exited 3 with "error (1 kernel(s) failed)" and a ValueError
    from int4's kernel: int4 needs K divisible by its group size (the worker contract's
    ``shape_problem``, which the worker reads too)."""
    result = run("probe", "--device", "cpu", "--small", "--dtype", "bf16,int4",
                 "--shape", "64x64x64", "--shape", "64x64x128")  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "Error: Invalid value for '--shape': int4 needs K divisible by 128 (its group size), "
        "not 64 (64x64x64); give another K, or leave int4 out\n"
    )


def test_shape_problem_is_the_contracts_one_rule() -> None:
    from sparkdiag.probe.worker.contract import DTYPES, shape_problem

    assert shape_problem("int4", 64, 64) == "int4 needs K divisible by 128 (its group size), not 64"
    assert shape_problem("int4", 64, 256) is None
    assert all(shape_problem(d, 7, 7) is None for d in DTYPES if d not in ("int4", "int8", "fp8"))
    # torch's CUDA kernels' own rules (a --shape that broke them failed the cycle: a review)
    assert shape_problem("int8", 8192, 4100) == "int8 needs K divisible by 8, not 4100"
    assert shape_problem("fp8", 4104, 8192) == "fp8 needs N divisible by 16, not 4104"
    assert shape_problem("fp8", 11008, 4096) is None and shape_problem("int8", 8, 8) is None


@pytest.mark.worker
def test_a_shape_int4_cannot_run_is_unsupported_for_the_suites_dtypes(tmp_path: Path) -> None:
    """Without --dtype (or with all) no dtype was named: the worker reports int4 unsupported at
    that shape, as it does a dtype the device cannot run, and the others are measured."""
    pytest.importorskip("torch")
    result = run_process("probe", "--device", "cpu", "--small", "--shape", "64x64x64", "--json",
                         "--state-dir", str(tmp_path))  # fmt: skip
    assert result.returncode == 0, result.stderr
    (run_,) = json.loads(result.stdout)["gpus"]
    assert run_["result"] == "ok"
    by_dtype = {f["dtype"]: f for f in run_["figures"]}
    assert by_dtype["int4"]["status"] == "unsupported"
    assert by_dtype["int4"]["reason"] == "int4 needs K divisible by 128 (its group size), not 64"
    assert by_dtype["bf16"]["status"] == "ok"


def test_a_replayed_cycle_teaches_the_store_only_when_asked(tmp_path: Path) -> None:
    """'probe --probe.fixture' recorded the replayed figures into the user's baseline store by
    default, under a real GPU's identity where NVML was real (found in a review)."""
    state = tmp_path / "state"
    args = ["probe", "--nvml-fixture", str(NVML / "h200-idle.json"), "--state-dir", str(state),
            "--probe.fixture", str(PROBE / "h200-default.json")]  # fmt: skip
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0, done.output
    assert not (state / "baselines.sqlite").exists()
    done = CliRunner().invoke(main, [*args, "--record"])
    assert done.exit_code == 0 and (state / "baselines.sqlite").exists()
    help_text = " ".join(CliRunner().invoke(main, ["probe", "--help"]).output.split())
    assert "with --probe.fixture, no-record" in help_text


def test_a_beta_1_run_is_not_set_against_the_mamf() -> None:
    """A beta=1 run (C += A @ B) got a reference efficiency against the beta=0 MAMF (0.85 on
    the recorded H200), where the reference floor takes beta=0 only (found in a review)."""
    from sparkdiag.baseline.evaluate import GemmFigure
    from sparkdiag.baseline.reference import lookup

    mamf = lookup("NVIDIA H200", "bf16")
    assert mamf is not None and mamf.kind == "mamf"

    def figure(beta: int) -> GemmFigure:
        return GemmFigure(
            "bf16", "8192x8192x8192", "compute", beta, "ok", None, 678.0, 690.0, None, mamf, True
        )

    assert figure(0).reference_efficiency == pytest.approx(678.0 / mamf.tflops)
    assert figure(1).reference_efficiency is None
