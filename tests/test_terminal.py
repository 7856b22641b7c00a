"""Output that fits the terminal: sparkdiag/terminal.py's width and wrapping, every text renderer
at 80 and 100 columns (no line wider, except one holding a word longer than a line can give, a
path or a URL, kept whole; no word lost or cut against the same text laid out unbounded), and
watch's live status line (on a terminal only, erased before the report)."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sparkdiag import terminal
from sparkdiag.cli import main
from sparkdiag.soak.render import text as soak_text
from sparkdiag.soak.state import write_state
from sparkdiag.watch import plot as watch_plot
from sparkdiag.watch.diagnose import diagnose
from sparkdiag.watch.model import GpuTick, JobTick, Recording, StackFrame, Tick, load
from sparkdiag.watch.render import status
from tests.support import NVML, PROBE, ROOT, invoke_cli, sparkdiag_cmd
from tests.support.soak import fell, gpu_soak, gpu_state, heating, held, report

FIXTURES = ROOT / "tests" / "fixtures"
H200_UUID = "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"  # the h200-idle fixture's GPU
RECORDING = ROOT / "docs" / "device" / "2026-12-01" / "part-c" / "starved.recording.json"
UNBOUNDED = 10_000


# -- the module ----------------------------------------------------------------------------------


class FakeTty(io.StringIO):
    """A terminal as far as isatty() goes; its width comes from $COLUMNS."""

    def isatty(self) -> bool:
        return True


def test_width_is_100_when_not_a_terminal_whatever_columns_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "57")
    assert terminal.width(io.StringIO()) == 100
    assert terminal.width(FakeTty()) == 57
    monkeypatch.setenv("COLUMNS", "12")
    assert terminal.width(FakeTty()) == terminal.MIN_WIDTH


def test_width_reads_a_real_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    master, slave = pty.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 123, 0, 0))
        with os.fdopen(os.dup(slave), "w") as stream:
            assert terminal.width(stream) == 123
    finally:
        os.close(master)
        os.close(slave)


def test_wrap_breaks_between_words_with_a_hanging_indent() -> None:
    text = "the quick brown fox jumps over the lazy dog " * 4
    lines = terminal.wrap(text, 30, "  - ")
    assert lines[0].startswith("  - the quick") and all(len(line) <= 30 for line in lines)
    assert all(line.startswith("    ") for line in lines[1:])
    assert " ".join(" ".join(lines).split()).replace("- ", "", 1) == " ".join(text.split())


def test_wrap_keeps_a_long_path_whole_and_a_figure_with_its_unit() -> None:
    path = "/var/lib/sparkdiag/a/very/long/path/that/cannot/fit/baselines.sqlite"
    lines = terminal.wrap(f"no baselines yet: {path} does not exist", 40)
    assert path in lines and max(len(line) for line in lines if line != path) <= 40
    lines = terminal.wrap("memory max 52 °C and GPU 0 at 99 % busy, " * 3, 24)
    joined = "\n".join(lines)
    for kept in ("52 °C", "GPU 0", "99 %"):
        assert joined.count(kept) == 3


def test_a_table_too_wide_for_its_columns_lists_each_row() -> None:
    header = ("name", "value", "unit")
    rows = [("a", "1.0", "TFLOPS"), ("bb", "22.5", "TOPS")]
    assert terminal.table(header, rows, 40, right={1}) == [
        "name  value  unit",
        "a       1.0  TFLOPS",
        "bb     22.5  TOPS",
    ]
    # each header with its value, never apart
    assert terminal.table(header, rows, 14) == [
        "a: value 1.0,",
        "    unit TFLOPS",
        "bb:",
        "    value 22.5,",
        "    unit TOPS",
    ]


def test_status_line_rewrites_in_place_and_clears(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "50")
    tty = FakeTty()
    line = terminal.StatusLine(tty, every=0.2)
    line.show("watching 1 s, 2 samples · no GPU sampled", now=1.0)
    line.show("skipped: too soon after the last one", now=1.1)
    line.show("watching 2 s, 4 samples", now=1.3)
    line.show("watching 3 s, 6 samples · GPU 0 87 % busy, the job on it · job CPU 1.3 cores", 2.0)
    line.clear()
    written = tty.getvalue()
    assert "skipped" not in written and "\n" not in written
    shown = written.split("\r")
    assert shown[1] == "watching 1 s, 2 samples · no GPU sampled"
    # a shorter line pads out what is left of the longer one, then puts the cursor after it
    assert (
        shown[2] == "watching 2 s, 4 samples".ljust(len(shown[1])) and shown[3] == shown[2].strip()
    )
    assert shown[4] == "watching 3 s, 6 samples · GPU 0 87 % busy, the …"  # cut at a word, < 50
    assert shown[-2] == " " * len(shown[4]) and shown[-1] == ""  # erased, cursor at the start


def test_status_line_is_silent_off_a_terminal() -> None:
    piped = io.StringIO()
    line = terminal.StatusLine(piped)
    line.show("watching 1 s", now=1.0)
    line.clear()
    assert piped.getvalue() == ""


def test_status_text_says_where_the_job_runs() -> None:
    gpu = GpuTick(index=0, utilization=0.87, job_on_gpu=True)
    tick = Tick(
        t=12.2, dt=0.5, gpus=(gpu, GpuTick(index=1, utilization=0.0)), job=JobTick(cpu_cores=1.25)
    )
    assert status(tick, 24) == (
        "watching 12 s, 24 samples · GPU 0 87 % busy, the job on it · GPU 1 0 % busy, the job "
        "not on it · job CPU 1.2 cores"
    )
    assert status(Tick(t=0.5, dt=0.5), 1) == "watching 0 s, 1 sample · no GPU sampled"


# -- every renderer at 80 and 100 columns --------------------------------------------------------


def tokens(text: str) -> Counter[str]:
    """The words of ``text``, punctuation a list layout adds and the dashes it leaves out
    (an empty cell) left out."""
    return Counter(t.strip(",;:") for t in text.split() if t.strip(",;:") not in ("", "-"))


# a table listed row by row names its rows by their key cell, without that column's header, and
# leaves out the dashes of empty cells (fleet's alert column is all dashes while none fires)
LISTED_KEYS = Counter({"dtype": 1, "instance": 1, "alert": 1})


def assert_fits(text: str, width: int, wide: str) -> None:
    for line in text.splitlines():
        if len(line) > width:  # only a word longer than most of a line may overrun
            assert max(len(word) for word in line.split()) > width - 40, line
    missing = tokens(wide) - tokens(text) - LISTED_KEYS
    assert not missing, f"words lost or cut at {width} columns: {sorted(missing)[:10]}"


@pytest.fixture
def at_width(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], None]]:
    def set_width(columns: int) -> None:
        monkeypatch.setattr(terminal, "width", lambda stream=None: columns)

    yield set_width


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.stdout


def words(text: str) -> str:
    """The text's words joined by single spaces: what wrapping must never change."""
    return " ".join(text.split())


def _check(tmp_path: Path) -> list[str]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    write_state(state / "soak.json", [gpu_state("0", H200_UUID, kernels=[held(), fell()])])
    return [
        *("check", "--nvml-fixture", str(NVML / "h200-idle.json"), "--state-dir", str(state)),
        *("--probe.fixture", str(FIXTURES / "check" / "h200-probe.json")),
        *("--path.sysfs", str(FIXTURES / "sysfs" / "h200-vm")),
        *("--path.rootfs", str(FIXTURES / "rootfs" / "native")),
    ]


def _probe(tmp_path: Path) -> list[str]:
    return [
        *("probe", "--nvml-fixture", str(NVML / "h200-idle.json"), "--no-record"),
        *("--probe.fixture", str(PROBE / "h200-default.json"), "--state-dir", str(tmp_path)),
    ]


def _timeless(text: str) -> str:
    """``text`` with check's own duration (its summary's "in 0.1 s") as zeros of its width: two
    runs of it took 0.1 s and 0.0 s, and the first's "0.1" read as a word the second lost."""
    return re.sub(r"(?<= in )\d+\.\d(?= s\b)", lambda m: re.sub(r"\d", "0", m.group()), text)


COMMANDS: dict[str, Callable[[Path], list[str]]] = {
    "check": _check,
    "probe": _probe,
    "watch": lambda _: ["watch", "--replay", str(RECORDING)],
    "link lint": lambda _: ["link", "lint", "--path.sysfs", str(FIXTURES / "sysfs" / "dgx-spark")],
}


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_command_output_fits(
    name: str, width: int, tmp_path: Path, at_width: Callable[[int], None]
) -> None:
    args = COMMANDS[name](tmp_path)
    at_width(UNBOUNDED)
    wide = _timeless(cli(*args))
    at_width(width)
    narrow = _timeless(cli(*args))
    assert_fits(narrow, width, wide)
    assert max(len(line) for line in wide.splitlines()) > width  # there was something to fit


def test_check_keeps_the_soak_warning_and_its_action_whole(
    tmp_path: Path, at_width: Callable[[int], None]
) -> None:
    at_width(80)
    said = words(cli(*_check(tmp_path)))
    assert "int4 1x8192x8192 fell to 0.84 of cold at 87 °C memory" in said
    assert "→ these kernels lose throughput as the GPU heats up: check cooling" in said


def test_probe_notes_are_whole_and_the_table_has_units(
    tmp_path: Path, at_width: Callable[[int], None]
) -> None:
    at_width(80)
    out = cli(*_probe(tmp_path))
    assert "[2] nvfp4 needs compute capability 10.0+ (Blackwell), device has 9.0" in words(out)
    header = next(line for line in out.splitlines() if line.lstrip().startswith("dtype"))
    assert header.split()[:4] == ["dtype", "shape", "kind", "unit"]
    rows = [line.split() for line in out.splitlines() if line.startswith("  int8 ")]
    assert rows and all(row[3] == "TOPS" for row in rows)
    assert all(len(line) <= 80 for line in out.splitlines())


def test_probe_with_baselines_still_fits(tmp_path: Path, at_width: Callable[[int], None]) -> None:
    args = [a if a != "--no-record" else "--record" for a in _probe(tmp_path)]
    for _ in range(3):  # three healthy runs teach the baselines: two more columns
        cli(*args)
    at_width(UNBOUNDED)
    wide = cli(*args)
    assert "baseline" in wide.splitlines()[2]
    for width in (80, 100):
        at_width(width)
        assert_fits(cli(*args), width, wide)
    show = ["baseline", "show", "--state-dir", str(tmp_path)]  # the baselines just learned
    at_width(UNBOUNDED)
    wide = cli(*show)
    assert " TOPS learned " in wide and " TFLOPS learned " in wide  # with their unit
    for width in (80, 100):
        at_width(width)
        assert_fits(cli(*show), width, wide)


@pytest.mark.parametrize("width", [80, 100])
def test_soak_text_fits(width: int) -> None:
    soaked = gpu_soak(
        heating([6.4, 6.0, 4.0], [4.0, 4.0, 3.9], [55.0, 80.0, 91.0]),
        stopped="threshold",
        reason="memory at 91 °C, within 4 °C of its slowdown threshold",
    )
    wide = soak_text(report(soaked), UNBOUNDED)
    assert_fits(soak_text(report(soaked), width), width, wide)


@pytest.mark.parametrize("width", [80, 100])
def test_fleet_fits(width: int, at_width: Callable[[int], None]) -> None:
    from tests.support.fleet import GPU, H200, KERNEL, peer_answers, stand_in, vector

    labels = {**GPU, **KERNEL, **H200}
    rows = [
        (
            {
                **labels,
                "instance": f"node-{i}.cluster.example:10942",
                "uuid": f"{H200_UUID[:-1]}{i}",
            },
            ratio,
        )
        for i, ratio in enumerate([1.01, 0.99, 1.0, 0.9])
    ]
    answers = peer_answers(rows)
    with stand_in(lambda q: (200, answers.get(q, vector()))) as url:
        at_width(UNBOUNDED)
        wide = cli("fleet", "--prometheus", url)
        at_width(width)
        narrow = cli("fleet", "--prometheus", url)
    assert_fits(narrow, width, wide)


@pytest.mark.parametrize("width", [80, 100])
def test_compare_fits(width: int, at_width: Callable[[int], None]) -> None:
    from tests.test_compare import FAKE_SIDE

    side = str(FAKE_SIDE)
    args = [
        *("compare", "--rounds", "1", "--native-python", f"{sys.executable} {side} gpu"),
        *("--container", sys.executable, side, "banner", "tflops=560", "torch=2.9.0a0+50eac81"),
    ]
    at_width(UNBOUNDED)
    wide = cli(*args)
    at_width(width)
    assert_fits(cli(*args), width, wide)


# -- watch: the status line, and a job without a GPU --------------------------------------------


def _watch_on_a_tty(*args: str) -> tuple[str, str]:
    """``sparkdiag watch ARGS`` with its standard error on a terminal 100 wide: (stdout, what
    the terminal received)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.Popen(
        sparkdiag_cmd("watch", *args),
        stdout=subprocess.PIPE,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
        env=env,
        text=True,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other side closed
            break
        if not data:
            break
        chunks.append(data)
    out, _ = proc.communicate(timeout=60)
    os.close(master)
    return out, b"".join(chunks).decode()


JOB = [sys.executable, "-c", "import time; time.sleep(0.6)"]  # six ticks at 0.1 s


def test_watch_shows_a_status_line_on_a_terminal_and_clears_it() -> None:
    fixture = str(NVML / "watch-healthy.json")
    out, tty = _watch_on_a_tty("--interval", "0.1", "--nvml-fixture", fixture, "--", *JOB)
    assert "\rwatching " in tty and "GPU 0 " in tty and " busy, the job" in tty
    last = tty.rstrip("\r").rsplit("\r", 1)[-1]
    assert last.strip() == "" and len(last) > 20  # erased before the report
    assert "watching" not in out and "\r" not in out and out.startswith("sparkdiag watch: ")
    as_json, tty = _watch_on_a_tty(
        "--interval", "0.1", "--nvml-fixture", fixture, "--json", "--", *JOB
    )
    assert json.loads(as_json)["ticks"] > 0 and "\r" not in as_json


def test_watch_piped_shows_no_status_line() -> None:
    done = subprocess.run(
        sparkdiag_cmd(
            "watch", "--interval", "0.1", "--nvml-fixture", str(NVML / "no-nvml.json"), "--", *JOB
        ),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr + done.stdout and "watching" not in done.stderr


def test_watch_without_a_gpu_says_one_thing(tmp_path: Path) -> None:
    """A tiny Python job, no NVML: the line watch starts with, its report's first line and its
    diagnosis agree (only memory pressure and ranks' waits are judged), and the plot has no GPU
    panel."""
    pytest.importorskip("matplotlib")
    recording = tmp_path / "run.json"
    done = invoke_cli(
        "watch",
        "--interval",
        "0.1",
        "--nvml-fixture",
        str(NVML / "no-nvml.json"),
        "--record",
        str(recording),
        "--",
        sys.executable,
        "-c",
        # busy for 0.5 s, several ticks: a job gone before the first tick has no thread to
        # draw (sum(range(3_000_000)) ended within the first 0.1 s tick here, and was drawn
        # only while watch left it unreaped until that tick)
        "import time\nend = time.monotonic() + 0.5\nwhile time.monotonic() < end: pass",
    )
    assert done.returncode == 0, done.stderr
    said = words(done.stderr)
    assert "are not sampled, so only memory pressure and where ranks waited" in said
    assert "diagnosing from the job's CPU" not in said
    first, *_ = done.stdout.splitlines()
    report = words(done.stdout)
    assert report.split("; watched ")[1].split(" diagnosis:")[0].endswith("no GPU sampled")
    assert (
        "diagnosis: no GPU sampled: only memory pressure and ranks' waits were assessed" in report
    )
    assert "on no GPU" not in report and first.startswith("sparkdiag watch: ")

    (fig,) = _plotted(load(recording), tmp_path / "run.png")
    labels = [line.get_label() for ax in fig.axes for line in ax.get_lines()]
    assert "busiest thread of the job (running or runnable)" in labels
    assert not any("GPU" in label for label in labels), labels
    assert sorted(ax.get_ylabel() for ax in fig.axes) == ["MB/s", "PSI %", "cores"]


def test_watch_plot_with_a_gpu_names_the_gpu_processes_thread(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rec = load(RECORDING)
    (fig,) = _plotted(rec, tmp_path / "run.png")
    labels = [line.get_label() for ax in fig.axes for line in ax.get_lines()]
    assert "busiest thread of the GPU processes (running or runnable)" in labels
    assert "GPU %" in [ax.get_ylabel() for ax in fig.axes]


def _plotted(rec: Recording, path: Path) -> list[Any]:
    """The figures watch's plot drew (kept from plt.close), its PNG written to ``path``."""
    import matplotlib.pyplot as plt

    kept: list[Any] = []
    real_close = plt.close
    plt.close = kept.append  # type: ignore[assignment]
    try:
        watch_plot.plot(rec, diagnose(rec), path)
    finally:
        plt.close = real_close  # type: ignore[assignment]
    assert path.read_bytes()[:4] == b"\x89PNG"
    return kept


@pytest.mark.parametrize("width", [80, 100])
def test_link_test_report_fits(width: int) -> None:
    from sparkdiag.link.model import End, Latency, LinkReport, PathResult, Throughput
    from sparkdiag.link.render import report_text

    here = End("enp1s0f1np1", "192.168.100.10", 1500, 200000, 126.0, "x2 of x4", cx7=True)
    peer = End("enp1s0f1np1", "192.168.100.11", 9000, 200000, 252.0, cx7=True)
    path = PathResult(
        here,
        peer,
        "degraded",
        "73.4 Gb/s here to the peer, 0.58 of the 126 Gb/s this path can carry (the PCIe link "
        "behind enp1s0f1np1 trained at x2 of x4)",
        action="reseat the ConnectX-7 or the cable and run 'sparkdiag link lint' on both machines; "
        "see https://docs.nvidia.com/dgx/dgx-spark/networking-and-connectivity.html",
        cause="the PCIe link behind enp1s0f1np1 trained below its maximum (x2 of x4)",
        latency=Latency(38.0, 120.0, 30.0, 2000),
        throughput=(
            Throughput("tcp-sockets", "here-to-peer", 73.4, 5.0, streams=8),
            Throughput(
                "iperf3",
                "here-to-peer",
                None,
                5.0,
                error="iperf3 not installed here: apt install iperf3 (or give --no-tools)",
            ),
        ),
        notes=("MTU 1500 here against 9000 on the peer: TCP segments are cut to the smaller",),
    )
    report = LinkReport(
        "192.168.100.11",
        10949,
        (path,),
        12.3,
        "spark-b",
        "0.9.0",
        tools={"iperf3": "missing", "ib_write_bw": "missing"},
        notes=("the peer runs another sparkdiag version (0.9.0): both ends measured the same way",),
    )
    assert_fits(report_text(report, width), width, report_text(report, UNBOUNDED))
    assert max(len(line) for line in report_text(report, UNBOUNDED).splitlines()) > width


def test_watch_without_a_gpu_or_psi_says_nothing_was_assessed() -> None:
    from sparkdiag.watch.render import headline
    from sparkdiag.watch.render import text as watch_text

    ticks = tuple(Tick(t=0.5 * i, dt=0.5, job=JobTick(cpu_cores=1.0)) for i in range(1, 5))
    rec = Recording(
        started_at=1.7e9,
        interval=0.5,
        job="python train.py",
        gpus=(),
        ticks=ticks,
        ended_by="exit",
        exit_status=0,
        pressure_scope="host",
    )
    diagnosis = diagnose(rec)
    assert diagnosis.verdict == "no-gpu"
    said = "no GPU sampled and no memory pressure (PSI) read: nothing could be assessed"
    assert headline(diagnosis, rec) == said
    assert f"diagnosis: {said}" in watch_text(rec, diagnosis, 100)
    # with the job's stacks, where its ranks waited was judged (and nothing found)
    sampled = replace(rec, frames=(StackFrame("main", "/job/train.py", 3),), stacks=((0,),))
    assert headline(diagnose(sampled), sampled) == (
        "no GPU sampled, no memory pressure (PSI) read: no wait of ranks found either"
    )


def test_a_long_value_goes_under_its_row_or_last_when_listed() -> None:
    header, rows = ("ratio", "instance"), [("0.900", "node-3:10942"), ("1.010", "node-0:10942")]
    uuids = ["GPU-979ad365-0b73-a0ac-74a2-3520b773d463", "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"]
    assert terminal.table(header, rows, 60, right={0}, under=("uuid", uuids)) == [
        "ratio  instance",
        "0.900  node-3:10942",
        "    " + uuids[0],
        "1.010  node-0:10942",
        "    " + uuids[1],
    ]
    assert terminal.table(header, rows, 16, under=("uuid", uuids), key=1) == [
        "node-3:10942:",
        "    ratio 0.900,",
        f"    uuid {uuids[0]}",
        "node-0:10942:",
        "    ratio 1.010,",
        f"    uuid {uuids[1]}",
    ]


# -- progress lines: one mechanism (terminal.StatusLine), never wider than the terminal --------


def test_a_bar_says_how_far() -> None:
    assert terminal.bar(0, 10) == "[------------]   0%"
    assert terminal.bar(5, 10) == "[######------]  50%"
    assert terminal.bar(12, 10) == "[############] 100%"  # past the end: full, not more
    assert terminal.bar(1, 0) == "[------------]   0%"


def _shown(tty: FakeTty) -> list[str]:
    """Every state of a line rewritten in place (what a terminal shows, one after the other)."""
    return [part for part in tty.getvalue().split("\r") if part.strip()]


@pytest.mark.parametrize("columns", [40, 80, 120])
def test_soak_progress_is_one_line_within_the_terminal(
    monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    """Issue 32: soak's click progress bar was about 115 columns on a CPU (more on a GPU with
    temperatures), so every update at 80 columns left a cut line behind."""
    from sparkdiag.commands.soak import _Progress
    from sparkdiag.probe.request import WorkerRequest
    from sparkdiag.soak.model import Target
    from sparkdiag.soak.run import Job

    monkeypatch.setenv("COLUMNS", str(columns))
    windows = heating([6.4, 6.3, 4.0], [4.0, 4.0, 3.9], [55.0, 80.0, 91.0], [50.0, 75.0, 86.0])
    tty = FakeTty()
    job = Job(Target("GPU 0", 0, "GPU-0", "NVIDIA H200"), WorkerRequest(soak_seconds=600))
    with _Progress([job], 600.0, stream=tty) as progress:
        for w in windows:
            progress.window(0, w)
    shown = _shown(tty)
    assert "\n" not in tty.getvalue() and len(shown) == len(windows)
    assert all(len(line.rstrip()) < columns for line in shown), shown
    assert shown[0].startswith("soak [------------]   0% GPU 0 window")
    if columns >= 80:
        assert "GPU 0 window 0, 600 s left: 55 °C memory" in shown[0]
    if columns >= 120:
        assert shown[-1].rstrip().endswith("91 °C memory, 86 °C GPU, int4/bf16 1.03")
    assert tty.getvalue().endswith("\r")  # erased before the report


def test_soak_progress_off_a_terminal_is_one_wrapped_line_per_window(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sparkdiag.commands.soak import _Progress
    from sparkdiag.probe.request import WorkerRequest
    from sparkdiag.soak.model import Target
    from sparkdiag.soak.run import Job

    windows = heating([6.4, 4.0], [4.0, 3.9], [55.0, 91.0], [50.0, 86.0])
    job = Job(Target("GPU 0", 0, "GPU-0"), WorkerRequest(soak_seconds=10))
    with _Progress([job], 10.0, tty=False, stream=io.StringIO()) as progress:
        for w in windows:
            progress.window(0, w)
    err = capsys.readouterr().err
    assert "GPU 0 window 1 (5.0 s, 5 s left): 91 °C memory, 86 °C GPU" in words(err)
    assert all(len(line) <= terminal.DEFAULT_WIDTH for line in err.splitlines())


def _kernel(done: int, total: int, shape: str = "16384x16384x16384") -> Any:
    from sparkdiag.probe.document import KernelResult, Progress

    result = KernelResult("bf16", shape, "compute", 0, "ok", None, 0.193, peak=0.195)
    return Progress(done, total, result)


@pytest.mark.parametrize("columns", [40, 80])
def test_bench_and_probe_progress_are_one_line_within_the_terminal(
    monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    from sparkdiag.commands.bench import _Sweep
    from sparkdiag.commands.probe_table import KernelProgress

    monkeypatch.setenv("COLUMNS", str(columns))
    bench, probe = FakeTty(), FakeTty()
    with _Sweep(16, stream=bench) as sweep:
        for i in range(1, 17):
            sweep(_kernel(i, 16))
    progress = KernelProgress("GPU 0", stream=probe)
    for i in range(1, 5):
        progress(_kernel(i, 4))
    progress.close()
    for tty, head in ((bench, "bench ["), (probe, "GPU 0 [")):
        shown = _shown(tty)
        assert shown and all(line.startswith(head) for line in shown)
        assert all(len(line.rstrip()) < columns for line in shown), shown
        assert "\n" not in tty.getvalue() and tty.getvalue().endswith("\r")
    assert "16/16" in _shown(bench)[-1] or columns < 40
    assert len(sweep.results) == 16  # what Ctrl-C keeps


def test_the_kernel_lines_off_a_terminal_are_one_per_kernel(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sparkdiag.commands.bench import _Sweep

    with _Sweep(2, stream=io.StringIO()) as sweep:
        sweep(_kernel(1, 2, "128x128x128"))
        sweep(_kernel(2, 2, "256x256x256"))
    assert capsys.readouterr().err.splitlines() == [
        "bench [1/2] bf16 128x128x128: 0.195 TFLOPS",
        "bench [2/2] bf16 256x256x256: 0.195 TFLOPS",
    ]


@pytest.mark.worker
def test_every_command_fits_its_terminal_live_output_included() -> None:
    """scripts/term_widths.py renders every command (progress and status lines included) on a
    pseudo-terminal of 80 and 120 columns and fails on a line wider than its terminal."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "term_widths.py"), "80", "120"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    table = json.loads(done.stdout.splitlines()[-1])
    for name in ("soak (live)", "bench (CPU, live)", "probe (CPU, live)", "check (no GPU)"):
        assert name in table, name


def test_log_lines_wrap_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """serve's first log lines ran to 219 columns at 80 (the quick start's first screen)."""
    import logging

    from sparkdiag.commands.common import _TerminalFormatter

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(sys, "stderr", FakeTty())
    message = (
        "NVML unavailable (nvmlInit failed: NVML Shared Library Not Found): GPU telemetry "
        "skipped; exporting host PCIe links, execution context and host memory, with "
        "sparkdiag_nvml_up 0"
    )
    record = logging.LogRecord("sparkdiag", logging.WARNING, __file__, 1, message, None, None)
    shown = _TerminalFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert len(shown.splitlines()) == 3 and all(len(line) <= 80 for line in shown.splitlines())
    assert words(shown) == f"WARNING sparkdiag: {message}"
    assert shown.splitlines()[1].startswith("    ")


def test_safe_shows_the_bytes_of_a_name_that_is_not_utf8() -> None:
    """os.fsdecode gives a lone surrogate a byte; printed as it came it stopped a command with
    a UnicodeEncodeError on a UTF-8 terminal (found in a review)."""
    name = os.fsdecode(b"lib\xff_k\xe9.so")
    assert terminal.safe(name) == "lib\\xff_k\\xe9.so"
    assert terminal.safe("\ud800") == "\\ud800"  # not a byte of a name: its code point
    terminal.safe(name).encode("utf-8")
