"""The command line: bad input gets a clear error and a non-zero exit, never a traceback."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sparkdiag.cli import main
from tests.support import (
    NVML,
    ROOT,
    SYSFS,
    assert_clean_error,
    free_port,
    invoke_cli,
    machine_args,
    run_cli,
    sparkdiag_cmd,
    terminate,
)


@pytest.mark.parametrize("command", ["dump", "serve"])
def test_missing_fixture(command: str, tmp_path: Path) -> None:
    # serve in its own process (the daemon's start), dump in this one
    run = run_cli if command == "serve" else invoke_cli
    result = run(command, "--nvml-fixture", str(tmp_path / "absent.json"))
    assert_clean_error(result, 2, "--nvml-fixture", "cannot read NVML fixture", "absent.json")


def test_malformed_fixture(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "sparkdiag-nvml-fixture/1",\n "devices": [,]}')
    result = invoke_cli("dump", "--nvml-fixture", str(bad))
    assert_clean_error(result, 2, "not valid JSON", "line 2")


def test_fixture_with_unknown_key(tmp_path: Path) -> None:
    bad = tmp_path / "typo.json"
    bad.write_text(
        json.dumps(
            {
                "format": "sparkdiag-nvml-fixture/1",
                "base": str(NVML / "h200-idle.json"),
                "script": [{"poll": 2, "gpu": 0, "set": {"temprature/0": 90}}],
            }
        )
    )
    result = invoke_cli("dump", "--nvml-fixture", str(bad))
    assert_clean_error(result, 2, "unknown answer key(s) temprature/0")


def test_unreadable_fixture_directory(tmp_path: Path) -> None:
    result = invoke_cli("dump", "--nvml-fixture", str(tmp_path))
    assert_clean_error(result, 2, "--nvml-fixture")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["serve", "--poll-interval", "fast"], "'fast' is not a valid float"),
        (["serve", "--poll-interval", "0"], "poll-interval: 0.0 is out of range"),
        (["serve", "--listen", "localhost"], "is not HOST:PORT"),
        (["serve", "--listen", "127.0.0.1:70000"], "port 70000 is out of range"),
        (["dump", "--log-level", "loud"], "'loud' is not one of"),
        (["dump", "--no-such-flag"], "No such option"),
    ],
)
def test_bad_flag_values(args: list[str], needle: str) -> None:
    assert_clean_error(invoke_cli(*args), 2, needle)


def test_port_in_use() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli(
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--nvml-fixture",
            str(NVML / "h200-idle.json"),
            "--path.sysfs",
            str(SYSFS / "h200-vm"),
        )
    assert_clean_error(result, 1, "already in use", f"127.0.0.1:{port}")


NO_NVML = str(NVML / "no-nvml.json")
WITHOUT_NVML = "NVML unavailable (nvmlInit failed: NVML_ERROR_LIBRARY_NOT_FOUND (fixture "


@pytest.mark.parametrize("links", [True, False], ids=["pcie-links", "no-pci-link"])
def test_dump_without_gpu_says_what_it_exports_in_one_line(links: bool, tmp_path: Path) -> None:
    """Without NVML and without a PCI link, dump and serve said "exporting host PCIe links" and
    then "no PCI link found ...: host PCIe links skipped": one line now, true to the poll."""
    sysfs = SYSFS / "dgx-spark" if links else tmp_path  # an empty tree: no PCI link
    result = invoke_cli("dump", "--nvml-fixture", NO_NVML, *machine_args(sysfs))
    assert result.returncode == 0, result.stderr
    assert "sparkdiag_nvml_up 0.0" in result.stdout
    assert ("sparkdiag_pcie_link_width{" in result.stdout) is links
    said = [line for line in result.stderr.splitlines() if "NVML" in line or "PCI" in line]
    assert len(said) == 1, result.stderr
    if links:
        instead = "exporting host PCIe links, the execution context and host memory"
    else:
        instead = f"no PCI link found under {tmp_path} either: exporting the execution context"
    assert WITHOUT_NVML in said[0] and f"GPU telemetry skipped; {instead}" in said[0], said[0]
    assert said[0].endswith(", with sparkdiag_nvml_up 0")


def test_serve_without_gpu_or_pci_link_says_it_once(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    port = free_port()
    args = ("--listen", f"127.0.0.1:{port}", "--nvml-fixture", NO_NVML, "--path.sysfs",
            str(sysfs), "--no-probe.enabled", "--state-dir", str(tmp_path / "state"))  # fmt: skip
    proc = subprocess.Popen(
        sparkdiag_cmd("serve", *args), stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    lines = []
    watchdog = threading.Timer(60, proc.kill)  # a serve that stalls ends the read, not the run
    watchdog.start()
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # up to the line that says it serves (or its end)
            lines.append(line)
            if "serving http" in line:
                break
    finally:
        watchdog.cancel()
        terminate(proc)
        proc.communicate()
    assert any("serving http" in line for line in lines), lines
    said = [line for line in lines if "NVML" in line or "PCI" in line]
    assert len(said) == 1 and WITHOUT_NVML in said[0], lines
    assert f"no PCI link found under {sysfs} either" in said[0] and "PCIe links," not in said[0]


def test_other_commands_say_only_that_nvml_is_unavailable() -> None:
    """native polled through the daemon's poller, whose line promised what serve exports
    (--no-torch: torch's import in a child, 2.5 s of CPU here, says nothing of NVML)."""
    result = invoke_cli("native", "--nvml-fixture", NO_NVML, "--no-torch")
    said = [line for line in result.stderr.splitlines() if "NVML" in line]
    assert len(said) == 1 and said[0].startswith(WITHOUT_NVML), result.stderr
    assert said[0].endswith("no-nvml.json))"), said[0]  # nothing about what is exported


def test_record_fixture_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "again.json"
    result = invoke_cli(
        "record-fixture",
        str(out),
        "--nvml-fixture",
        str(NVML / "h200-idle.json"),
        "--description",
        "re-recorded",
    )
    assert result.returncode == 0, result.stderr
    assert "recorded 1 GPU (driver 580.159.04)" in result.stdout
    doc = json.loads(out.read_text())
    original = json.loads((NVML / "h200-idle.json").read_text())
    (again,) = doc["devices"]
    (recorded,) = original["devices"]
    # the recording answers the whole catalogue of its day (activity block and NVLink errors
    # included): re-recorded, every answer comes back as it was, errors by name; the queries
    # declared since (recovery action, fabric) read as unsupported
    later = {"recovery_action", "fabric_info"}
    assert {k: v for k, v in again["answers"].items() if k not in later} == recorded["answers"]
    assert all(again["answers"][k] == {"error": "NOT_SUPPORTED"} for k in later)
    assert again["answers"]["nvlink_state/0"] == {"error": "NOT_SUPPORTED"}
    assert again["answers"]["pcie_throughput/0"] == 1587
    assert doc["description"] == "re-recorded"
    assert doc["devices"][0]["answers"]["default_applications_clock/1"] == 1980


def test_record_fixture_of_an_older_recording_adds_the_newer_queries(tmp_path: Path) -> None:
    """The 2026-11-29 recording predates the activity queries: re-recorded, every answer it has
    is kept and the queries added to the catalogue since read as unsupported."""
    out = tmp_path / "again.json"
    old = NVML / "h200-idle-2026-11-29.json"
    result = invoke_cli("record-fixture", str(out), "--nvml-fixture", str(old))
    assert result.returncode == 0, result.stderr
    (again,) = json.loads(out.read_text())["devices"]
    (recorded,) = json.loads(old.read_text())["devices"]
    assert {k: again["answers"][k] for k in recorded["answers"]} == recorded["answers"]
    added = set(again["answers"]) - set(recorded["answers"])
    assert "gpm" in added and "nvlink_state/0" in added and "pcie_throughput/0" in added
    assert all(again["answers"][k] == {"error": "NOT_SUPPORTED"} for k in added)


def test_record_fixture_without_nvml(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    result = invoke_cli("record-fixture", str(out), "--nvml-fixture", str(NVML / "no-nvml.json"))
    assert_clean_error(result, 3, "cannot record: NVML is unavailable")
    assert not out.exists()


def test_record_fixture_replaces_only_a_file_and_writes_standard_output_for_dash(
    tmp_path: Path,
) -> None:
    """The bad-input review: a device given as OUTPUT was replaced by a file (/dev/full became
    JSON), a link by a file, ``-`` written as a file named -, and a missing folder made. Now a
    device or a pipe is refused, a missing folder too (exit 2, before NVML is asked), a link is
    written where it points, and ``-`` is standard output."""
    idle = ("--nvml-fixture", str(NVML / "h200-idle.json"))
    os.mkfifo(tmp_path / "fifo")
    for output, said in (
        (tmp_path / "fifo", "is not a regular file"),
        (Path("/dev/null"), "is not a regular file"),
        (tmp_path / "none" / "x.json", "does not exist (for x.json)"),
    ):
        result = invoke_cli("record-fixture", str(output), *idle)
        assert_clean_error(result, 2, said)
    assert not (tmp_path / "none").exists() and Path("/dev/null").is_char_device()
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "target.json")
    assert invoke_cli("record-fixture", str(link), *idle).returncode == 0
    assert link.is_symlink() and json.loads((tmp_path / "target.json").read_text())["devices"]
    result = invoke_cli("record-fixture", "-", *idle)
    assert result.returncode == 0 and json.loads(result.stdout)["devices"]
    assert "recorded 1 GPU" in result.stderr and not Path("-").exists()


def test_help_explains_every_command() -> None:
    runner = CliRunner()
    top = runner.invoke(main, ["--help"])
    assert top.exit_code == 0
    for command in ("serve", "dump", "record-fixture"):
        assert command in top.output
        sub = runner.invoke(main, [command, "--help"])
        assert sub.exit_code == 0, sub.output
    serve_help = runner.invoke(main, ["serve", "--help"]).output
    assert "127.0.0.1:10942" in serve_help
    assert "--path.sysfs" in serve_help


def test_a_sparkdiag_error_is_one_line_and_its_exit_status() -> None:
    """Raised anywhere below a command, translated once by the group (sparkdiag.cli)."""
    import click
    from click.testing import CliRunner

    from sparkdiag.cli import main
    from sparkdiag.errors import Exit, SparkdiagError, UsageError

    @click.command("raise-for-test")
    @click.argument("kind")
    def raiser(kind: str) -> None:
        if kind == "usage":
            raise UsageError("no such file: x.json", flag="--nvml-fixture")
        raise SparkdiagError("the worker timed out after 5 s")

    main.add_command(raiser)
    try:
        runner = CliRunner()
        usage = runner.invoke(main, ["raise-for-test", "usage"])
        failed = runner.invoke(main, ["raise-for-test", "failed"])
    finally:
        main.commands.pop("raise-for-test")
    assert usage.exit_code == Exit.USAGE == 2
    assert usage.output == "Error: Invalid value for '--nvml-fixture': no such file: x.json\n"
    assert failed.exit_code == Exit.FAILED == 3
    assert failed.output == "Error: the worker timed out after 5 s\n"


def test_ctrl_c_that_no_command_handles_exits_130() -> None:
    import click

    from sparkdiag.errors import Exit

    @click.command("interrupt-for-test")
    def interrupted() -> None:
        raise KeyboardInterrupt

    main.add_command(interrupted)
    try:
        result = CliRunner().invoke(main, ["interrupt-for-test"])
    finally:
        main.commands.pop("interrupt-for-test")
    assert result.exit_code == Exit.INTERRUPTED == 130
    assert result.output == "Error: interrupted\n"


def test_gpu_flag_spellings() -> None:
    from sparkdiag.flags import parse_gpus

    assert parse_gpus(()) is None and parse_gpus(["all"]) is None and parse_gpus(["ALL"]) is None
    assert parse_gpus(["0"]) == (0,)
    assert parse_gpus(["2,0"]) == (2, 0)
    assert parse_gpus(["0", "1", "0"]) == (0, 1)  # repeated, once each
    assert parse_gpus(["0, 1,"]) == (0, 1)
    for bad in (["-1"], ["a"], ["all", "1"], ["١"]):
        with pytest.raises(ValueError):
            parse_gpus(bad)


# -- issue 32: the newcomer's second hour ------------------------------------------------------


def _every_command() -> list[list[str]]:
    """Every command's words (``["link", "lint"]`` for a group's subcommands)."""
    import click

    from tests.support import subcommands

    found: list[list[str]] = []
    for name, command in subcommands(main).items():
        found.append([name])
        if isinstance(command, click.Group):
            found += [[name, sub] for sub in command.list_commands(click.Context(command))]
    return found


def test_a_mistyped_command_asks_did_you_mean() -> None:
    """The group imports commands when asked (cli.COMMANDS), so click's own suggestion, made from
    the commands loaded so far, had none to offer."""
    runner = CliRunner()
    typo = runner.invoke(main, ["chek"])
    assert typo.exit_code == 2 and "No such command 'chek'. Did you mean 'check'?" in typo.output
    far = runner.invoke(main, ["zzz"])
    assert far.exit_code == 2 and "No such command 'zzz'." in far.output
    assert "Did you mean" not in far.output
    sub = runner.invoke(main, ["baseline", "shwo"])
    assert sub.exit_code == 2 and "Did you mean 'show'?" in sub.output
    assert runner.invoke(main, ["check", "--help"]).exit_code == 0  # a real name still works


@pytest.mark.parametrize("columns", [80, 120])
def test_every_help_fits_the_terminal(columns: int) -> None:
    """compare, link and fleet help was 81-91 columns wide at 80 (their unwrapped blocks)."""
    runner = CliRunner()
    for words in [[], *_every_command()]:
        result = runner.invoke(main, [*words, "--help"], env={"COLUMNS": str(columns)})
        assert result.exit_code == 0, (words, result.output)
        wide = [line for line in result.output.splitlines() if len(line) > columns]
        assert not wide, (words, wide)


def test_helps_name_installs_that_exist_and_carry_no_changelog() -> None:
    """sparkdiag is not on PyPI (README): 'pip install sparkdiag[plot]' cannot work."""
    from sparkdiag.plotting import INSTALL_HINT

    runner = CliRunner()
    for words in _every_command():
        shown = " ".join(runner.invoke(main, [*words, "--help"]).output.split())
        assert "sparkdiag[plot]" not in shown, words
        assert "(Changed:" not in shown and "used to exit" not in shown, words
    watch = " ".join(runner.invoke(main, ["watch", "--help"]).output.split())
    assert f"needs matplotlib: {INSTALL_HINT}" in watch


def test_serve_says_ctrl_c_exits_0() -> None:
    """A decision (issue 32): serve's stop, Ctrl-C or SIGTERM, is its normal end: 0, as
    tests/test_lifecycle.py measures; the README's exit table says so beside 130."""
    from tests.test_readme import sections

    shown = " ".join(CliRunner().invoke(main, ["serve", "--help"]).output.split())
    assert "0 after a clean stop, by SIGTERM, Ctrl-C (SIGINT) or SIGQUIT alike" in shown
    table = sections()["Exit status"]
    row_130 = next(line for line in table.splitlines() if line.startswith("| 130 |"))
    assert "not `serve`, which exits 0" in row_130
    row_0 = next(line for line in table.splitlines() if line.startswith("| 0 |"))
    assert "for `serve`, stopped by Ctrl-C or SIGTERM" in row_0


def _directory_cases() -> list[tuple[str, list[str]]]:
    from sparkdiag.config import OPTIONS

    # a group's settings are its subcommands'; watch needs a job or a recording to get to them
    words = {"link": ["link", "lint"], "watch": ["watch", "--replay", "x.json"]}
    return [
        (f"--{option.key}", words.get(command, [command]))
        for option in OPTIONS
        if option.existing_dir
        for command in sorted(option.scopes)
    ]


def test_no_error_message_is_written_with_a_newline() -> None:
    """An error is one line (README: "one line on stderr naming what is wrong"): cli.py shows
    every control character in one as an escape, so that untrusted text in it cannot act on a
    terminal, and compare's example after a newline came out as "for example:\\x0a  ...". A
    message literal holding a newline, in any raise of the package, fails here."""
    found = []
    for path in sorted((ROOT / "sparkdiag").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                texts = [n.value for n in ast.walk(node.exc.args[0]) if isinstance(n, ast.Constant)]
                if any(isinstance(t, str) and "\n" in t for t in texts):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


@pytest.mark.parametrize(("flag", "words"), _directory_cases())
def test_a_directory_that_is_not_one_is_exit_2_for_every_command(
    flag: str, words: list[str], tmp_path: Path
) -> None:
    """dump and check read nothing from a mistyped --path.sysfs and exited 0 with skips, where
    link lint exited 2: every command that takes the flag checks it, once (flags.py)."""
    cases = ((tmp_path / "typo", "does not exist"), (Path(__file__), "is not a directory"))
    for given, why in cases:
        result = CliRunner().invoke(main, [*words, flag, str(given)])
        assert result.exit_code == 2, (words, result.output)
        said = f"Error: Invalid value for {flag!r}: {given} {why}; give a directory\n"
        assert result.output == said


def test_a_directory_in_the_configuration_file_is_checked_too(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[path]\nsysfs = "{tmp_path / "typo"}"\n')
    result = CliRunner().invoke(main, ["config", "check", str(config)])
    # named as the user wrote it, the file and the key: there is no --path.sysfs to look for
    said = f"Error: {config}: path.sysfs: {tmp_path / 'typo'} does not exist; give a directory\n"
    assert result.exit_code == 2 and result.output == said
    ok = CliRunner().invoke(main, ["dump", "--path.sysfs", str(tmp_path), "--nvml-fixture",
                                   str(NVML / "no-nvml.json")])  # fmt: skip
    assert ok.exit_code == 0, ok.output  # an existing directory, even an empty one, is fine


def test_an_error_wraps_on_a_terminal_and_is_one_line_in_a_pipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The missing-torch line was 280 columns, broken mid-word by the terminal itself."""
    import io

    from sparkdiag.cli import _Failed

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    message = "torch is not installed for /usr/bin/python3, and sparkdiag probe needs it: " * 3
    monkeypatch.setenv("COLUMNS", "80")
    tty, pipe = Tty(), io.StringIO()
    _Failed(message.strip(), 3).show(tty)
    _Failed(message.strip(), 3).show(pipe)
    assert pipe.getvalue() == f"Error: {message.strip()}\n"
    shown = tty.getvalue().splitlines()
    assert len(shown) > 1 and all(len(line) <= 80 for line in shown)
    assert " ".join(tty.getvalue().split()) == " ".join(pipe.getvalue().split())


def test_config_check_refuses_a_state_dir_that_is_a_file(tmp_path: Path) -> None:
    """config check said "ok" of a state-dir naming a regular file; serve then started, warned
    and learned no baseline, retrying at every cycle."""
    afile = tmp_path / "state"
    afile.write_text("")
    config = tmp_path / "config.toml"
    config.write_text(f'state-dir = "{afile}"\n')
    result = CliRunner().invoke(main, ["config", "check", str(config)])
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: {config}: state-dir: state directory {afile} is a file, not a directory: give "
        "--state-dir a directory (a missing one is created, mode 0700) or move the file aside "
        "(serve would learn no baselines)\n"
    )
    config.write_text(f'state-dir = "{tmp_path / "made-when-needed"}"\n')
    assert CliRunner().invoke(main, ["config", "check", str(config)]).exit_code == 0


def test_a_directory_flag_that_is_a_dangling_link_says_so(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    result = CliRunner().invoke(main, ["dump", "--path.sysfs", str(loop)])
    assert result.exit_code == 2
    assert result.output == (
        f"Error: Invalid value for '--path.sysfs': {loop} is a symbolic link to nothing (or a "
        "loop); give a directory\n"
    )


@pytest.mark.parametrize(
    ("command", "default"),
    [
        ("probe", "each GPU in turn; without NVML, torch's default device (cuda:0, or cpu "
                  "without CUDA)"),
        ("bench", "cuda, CUDA's first device"),
        ("compare", "the device the native side chose (cuda:0, or cpu without CUDA), given to "
                    "the container too"),
        ("soak", "every GPU at once, a worker each"),
    ],
)  # fmt: skip
def test_device_help_states_each_command_s_own_default(command: str, default: str) -> None:
    """Found in a review: every command said "[default: each GPU in turn, or cuda:0]", the
    probe's, where bench uses cuda, compare the device native chose, probe without NVML
    torch's default device, and soak every GPU at once."""
    found = main.get_command(click.Context(main), command)
    assert found is not None
    (device,) = [p for p in found.params if p.name == "device"]
    assert isinstance(device, click.Option) and device.help is not None
    assert device.help.endswith(f"[default: {default}]"), device.help


@pytest.mark.parametrize("level", ["DEBUG", "Warning"])
def test_log_level_takes_any_case(level: str, tmp_path: Path) -> None:
    """Found in a review: 'check --log-level DEBUG' was refused (click's choice matched case);
    the flag and the configuration file take any case, as the level's name is the same."""
    from sparkdiag.config import OPTIONS_BY_KEY

    args = ["--nvml-fixture", str(NVML / "h200-idle.json"), *machine_args(SYSFS / "h200-vm"),
            "--state-dir", str(tmp_path / "state"), "--quick", "--json",
            "--log-level", level]  # fmt: skip
    result = invoke_cli("check", *args)
    assert result.returncode in (0, 1, 3), result.stderr
    assert json.loads(result.stdout)["quick"] is True
    assert OPTIONS_BY_KEY["log-level"].convert(level, "config.toml: ") == level.lower()
    assert OPTIONS_BY_KEY["probe.when"].convert("IDLE", "config.toml: ") == "idle"


@pytest.mark.parametrize("value", ["", " ", ","])
def test_an_empty_gpu_flag_is_a_usage_error_not_every_gpu(value: str) -> None:
    """Found in a review: 'probe --gpu ""' (an unset variable) silently meant every GPU; only
    no --gpu at all, or --gpu all, means that."""
    from sparkdiag.flags import parse_gpus

    with pytest.raises(ValueError, match="empty"):
        parse_gpus([value])
    with pytest.raises(ValueError, match="empty"):
        parse_gpus(["0", value])
    assert parse_gpus(()) is None and parse_gpus(["all"]) is None
    result = invoke_cli("probe", "--nvml-fixture", str(NVML / "h200-idle.json"), "--gpu", value)
    assert_clean_error(result, 2, "Invalid value for '--gpu'", "empty")
