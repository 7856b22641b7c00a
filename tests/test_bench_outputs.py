"""bench's outputs and exit status around a sweep, with a stand-in for the worker (its real runs
are in tests/test_probe_commands.py): a path no one can create is refused before the sweep, a
write that fails after it keeps the printed results, ``-`` is standard output, and a dtype that
measured nothing exits 1 as bench --help says."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from sparkdiag.cli import main
from sparkdiag.commands import bench as bench_module
from sparkdiag.probe.document import KernelResult, Progress, parse_document
from sparkdiag.probe.runner import ProbeCycle
from sparkdiag.probe.worker.contract import SCHEMA

CPU = ("bench", "--device", "cpu", "--small")


def kernel(dtype: str, shape: str, ok: bool = True) -> dict[str, Any]:
    if ok:
        return {"dtype": dtype, "shape": shape, "kind": "compute", "status": "ok",
                "delivered": 0.1, "peak": 0.12, "iters": 3}  # fmt: skip
    return {"dtype": dtype, "shape": shape, "kind": "compute", "status": "unsupported",
            "reason": f"{dtype} probe runs on CUDA GPUs only, not on cpu"}  # fmt: skip


def worker(
    monkeypatch: pytest.MonkeyPatch,
    results: list[dict[str, Any]],
    meanwhile: Callable[[], None] = lambda: None,
) -> list[object]:
    """bench's worker replaced by one that returns ``results`` (after ``meanwhile``); the
    list it returns holds a request per run."""
    runs: list[object] = []

    def run_worker(*, request: object, **_kwargs: object) -> ProbeCycle:
        runs.append(request)
        meanwhile()
        software = {"device": "cpu", "torch": "2.13.0+cpu"}
        raw = {"schema": SCHEMA, "status": "ok", "software": software, "results": results}
        return ProbeCycle("ok", None, parse_document(raw), "", 0, 0.1, 4242)

    monkeypatch.setattr(bench_module, "run_worker", run_worker)
    monkeypatch.setattr(bench_module, "require_torch", lambda _command: None)
    return runs


def bench(*args: str) -> Result:
    return CliRunner().invoke(main, [*CPU, *args])


SWEEP = [kernel("bf16", f"{m}x{m}x{m}") for m in (128, 256, 384, 512)]


@pytest.mark.parametrize("flag", ["--csv", "--json"])
def test_a_file_no_one_can_create_is_refused_before_the_sweep(
    monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    """os.access says yes to root for /proc/x.csv: bench swept, then lost it all to a
    FileNotFoundError traceback (exit 1). The file is now created before the sweep."""
    runs = worker(monkeypatch, SWEEP)
    result = bench(flag, "/proc/sparkdiag-test.out")
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: Invalid value for '{flag}': cannot create /proc/sparkdiag-test.out: "
        "No such file or directory\n"
    )
    assert runs == []


def test_the_check_leaves_an_existing_file_as_it_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    worker(monkeypatch, SWEEP)
    old = tmp_path / "old.csv"
    old.write_text("kept until the sweep ends\n")

    def meanwhile() -> None:
        assert old.read_text() == "kept until the sweep ends\n"
        assert not (tmp_path / "new.json").exists()  # created by the check, and removed

    worker(monkeypatch, SWEEP, meanwhile)
    result = bench("--csv", str(old), "--json", str(tmp_path / "new.json"))
    assert result.exit_code == 0, result.output
    assert old.read_text().startswith("dtype,shape,status")
    assert json.loads((tmp_path / "new.json").read_text())["schema"] == SCHEMA


def test_a_write_that_fails_after_the_sweep_keeps_the_results(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What the check cannot foresee (the folder removed during the sweep): the results are
    printed, then one line says what was not written; exit 1, as bench --help says."""
    out = tmp_path / "out"
    out.mkdir()
    worker(monkeypatch, SWEEP, meanwhile=out.rmdir)
    result = bench("--csv", str(out / "b.csv"), "--json", str(tmp_path / "b.json"))
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert "swept 4 kernels" in result.stdout and "bf16: best" in result.stdout
    assert result.stderr.splitlines()[-1] == (
        f"sparkdiag bench: cannot write {out}/b.csv: No such file or directory"
    )
    assert json.loads((tmp_path / "b.json").read_text())["schema"] == SCHEMA  # the other one


@pytest.mark.parametrize("result", ["error", "timeout"])
def test_a_worker_that_dies_mid_sweep_keeps_the_kernels_it_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, result: str
) -> None:
    """The worker killed (or timed out) after three of four kernels, with no document: the
    three its progress lines reported are written and printed, and the last line says after
    how many it stopped and why; exit 3. They were lost: a CSV of its header alone, no JSON,
    nothing printed but 'sweep failed'."""
    monkeypatch.setattr(bench_module, "require_torch", lambda _command: None)

    def run_worker(*, on_progress: Callable[[Progress], None], **_kw: object) -> ProbeCycle:
        for done, item in enumerate(SWEEP[:3], start=1):
            measured = KernelResult.parse({**item, "beta": 0})
            on_progress(Progress(done, len(SWEEP), measured))
        reason = "worker killed by SIGKILL" if result == "error" else "did not finish"
        return ProbeCycle(result, reason, None, "", -9, 1.0, 4242)  # type: ignore[arg-type]

    monkeypatch.setattr(bench_module, "run_worker", run_worker)
    csv_path, json_path = tmp_path / "b.csv", tmp_path / "b.json"
    out = bench("--csv", str(csv_path), "--json", str(json_path))
    assert out.exit_code == 3, out.output
    assert "Traceback" not in out.output
    assert len(csv_path.read_text().splitlines()) == 4  # the header and three kernels
    body = json.loads(json_path.read_text())
    assert body["schema"] == bench_module.PARTIAL_SCHEMA
    assert (body["done"], body["total"], len(body["results"])) == (3, 4, 3)
    assert "swept 3 of 4 kernels" in out.stdout and "bf16: best" in out.stdout
    last = out.stderr.splitlines()[-1]
    assert last.startswith("warning: the sweep stopped after 3 of 4 kernels: "), last


@pytest.mark.parametrize("flag", ["--json", "--csv"])
def test_dash_is_standard_output(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flag: str
) -> None:
    """``--json -`` made a file named ``-``; it is standard output, instead of the text."""
    worker(monkeypatch, SWEEP)
    monkeypatch.chdir(tmp_path)
    result = bench(flag, "-")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "-").exists()
    if flag == "--json":
        assert json.loads(result.stdout)["schema"] == SCHEMA
    else:
        lines = result.stdout.splitlines()
        assert lines[0].startswith("dtype,shape,status") and len(lines) == 5
    assert "swept" not in result.stdout


def test_dash_for_both_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    runs = worker(monkeypatch, SWEEP)
    monkeypatch.chdir(tmp_path)
    result = bench("--csv", "-", "--json", "-")
    assert result.exit_code == 2 and "not to both" in result.output and runs == []


def test_one_file_for_both_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The last write kept one document and the other was lost without a word (the bad-input
    review); a link to the other file is the same file."""
    runs = worker(monkeypatch, SWEEP)
    (tmp_path / "link.csv").symlink_to(tmp_path / "b.out")
    for other in ("b.out", "link.csv"):
        result = bench("--csv", str(tmp_path / other), "--json", str(tmp_path / "b.out"))
        assert result.exit_code == 2 and "one would overwrite the other" in result.output
    assert runs == [] and not (tmp_path / "b.out").exists()
    result = bench("--csv", "/dev/null", "--json", "/dev/null")  # discarding both is allowed
    assert result.exit_code == 0, result.output


def test_the_help_says_dash_is_standard_output() -> None:
    shown = " ".join(CliRunner().invoke(main, ["bench", "--help"]).output.split())
    assert "--csv - or --json - prints that document on standard output" in shown
    assert "a dtype measured nothing" in shown


@pytest.mark.parametrize(
    ("dtypes", "status"),
    [("fp8", 1), ("bf16,fp8", 1), ("bf16", 0)],
)
def test_a_dtype_that_measured_nothing_exits_1(
    monkeypatch: pytest.MonkeyPatch, dtypes: str, status: int
) -> None:
    """``bench --dtype fp8`` on a CPU printed ``fp8: no result`` and exited 0."""
    results = [kernel(d, f"{m}x{m}x{m}", ok=d == "bf16") for d in dtypes.split(",")
               for m in (128, 256)]  # fmt: skip
    worker(monkeypatch, results)
    result = bench("--dtype", dtypes, "--m", "128,256")
    assert result.exit_code == status, result.output
    if "fp8" in dtypes:
        assert "fp8: no result (fp8 probe runs on CUDA GPUs only" in result.stdout
        measured = 2 if "bf16" in dtypes else 0
        assert f"swept {len(results)} kernels ({measured} measured)" in result.stdout


def test_an_int4_shape_it_cannot_run_is_refused_before_the_sweep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = worker(monkeypatch, SWEEP)
    result = bench("--dtype", "bf16,int4", "--m", "64,128")
    assert result.exit_code == 2, result.output
    assert result.output == (
        "Error: Invalid value for '--m': int4 needs K divisible by 128 (its group size), not 64 "
        "(64x64x64); give another K, or leave int4 out\n"
    )
    result = bench("--dtype", "int4", "--m", "128", "--k", "128,200,300")
    assert result.exit_code == 2 and "'--k': int4 needs K divisible by 128" in result.output
    assert "not 200 (128x128x200 and 1 more)" in result.output
    assert runs == []


def test_a_shape_int4_cannot_run_is_a_usage_error_before_the_gpu_is_looked_for() -> None:
    """``bench --dtype int4 --m 64`` on a machine without a GPU said "no GPU to bench" (exit 1)
    where probe gives the usage error first (a review): the shape is refused before torch and
    the GPU are looked for, whatever the machine."""
    from tests.support import NVML, invoke_cli

    no_gpu = str(NVML / "no-nvml.json")
    done = invoke_cli("bench", "--dtype", "int4", "--m", "64", "--nvml-fixture", no_gpu)
    assert done.returncode == 2, done.stderr
    assert "int4 needs K divisible by 128" in done.stderr and "--m" in done.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--m", "1:100000000:1"), "is 100000000 sizes; at most 5000 kernels run"),
        (("--k", "99999999999999999999"), "a size is at most 1048576"),
        (("--m", "128:512:128", "--n", "1:100:1", "--k", "1:100:1"), "40000 kernels is too"),
    ],
)
def test_a_sweep_too_large_is_refused_before_it_is_listed(
    monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], said: str
) -> None:
    """--m 1:100000000:1 built a list of a hundred million sizes, and their shapes, before its
    cap said no (10 s of allocation); a K of 20 digits reached the worker as an overflow (the
    bad-input review). Each is a usage error at once."""
    runs = worker(monkeypatch, SWEEP)
    started = time.monotonic()
    result = bench(*args)
    assert result.exit_code == 2 and said in result.output, result.output
    assert runs == [] and time.monotonic() - started < 5


def test_a_shape_larger_than_any_gpu_is_a_usage_error() -> None:
    from sparkdiag.probe.worker.contract import UsageError, parse_shape

    assert parse_shape("65536x65536x65536") == (65536, 65536, 65536)
    for text in ("1x99999999999x128", "200000x200000x200000"):
        with pytest.raises(UsageError):
            parse_shape(text)


def test_the_csv_says_its_unit_and_a_document_on_stdout_still_says_why_exit_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """int8 figures went into columns named *_tflops with nothing saying TOPS; with --json - a
    dtype that measured nothing exited 1 with nothing on standard error (found in a review)."""
    results = [kernel("int8", "128x128x128"), kernel("bf16", "128x128x128"),
               {**kernel("fp8", "128x128x128", ok=False), "reason": None}]  # fmt: skip
    worker(monkeypatch, results)
    csv_path = tmp_path / "b.csv"
    done = CliRunner().invoke(
        main, [*CPU, "--dtype", "int8,bf16,fp8", "--csv", str(csv_path), "--json", "-"]
    )
    assert done.exit_code == 1
    header, *rows = csv_path.read_text().splitlines()
    assert header.endswith(",reason,unit")
    assert [row.rsplit(",", 1)[1] for row in rows] == ["TOPS", "TFLOPS", "TFLOPS"]
    assert done.stderr.splitlines()[-1] == "fp8: no result (unsupported)"  # not "None"
