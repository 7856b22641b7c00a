"""The command line: bad input gets a clear error and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from sparkdiag.cli import main
from tests.support import NVML, SYSFS, assert_clean_error, machine_args, run_cli


@pytest.mark.parametrize("command", ["dump", "serve"])
def test_missing_fixture(command: str, tmp_path: Path) -> None:
    result = run_cli(command, "--nvml-fixture", str(tmp_path / "absent.json"))
    assert_clean_error(result, 2, "--nvml-fixture", "cannot read NVML fixture", "absent.json")


def test_malformed_fixture(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "sparkdiag-nvml-fixture/1",\n "devices": [,]}')
    result = run_cli("dump", "--nvml-fixture", str(bad))
    assert_clean_error(result, 2, "is not valid JSON", "line 2")


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
    result = run_cli("dump", "--nvml-fixture", str(bad))
    assert_clean_error(result, 2, "unknown answer key(s) temprature/0")


def test_unreadable_fixture_directory(tmp_path: Path) -> None:
    result = run_cli("dump", "--nvml-fixture", str(tmp_path))
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
    assert_clean_error(run_cli(*args), 2, needle)


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


def test_dump_without_gpu_says_what_it_skipped() -> None:
    result = run_cli(
        "dump",
        "--nvml-fixture",
        str(NVML / "no-nvml.json"),
        *machine_args("dgx-spark"),
    )
    assert result.returncode == 0, result.stderr
    assert "sparkdiag_nvml_up 0.0" in result.stdout
    assert "sparkdiag_pcie_link_width{" in result.stdout
    skipped = [line for line in result.stderr.splitlines() if "GPU telemetry skipped" in line]
    assert len(skipped) == 1, result.stderr
    assert "LIBRARY_NOT_FOUND" in skipped[0]


def test_record_fixture_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "again.json"
    result = run_cli(
        "record-fixture", str(out), "--nvml-fixture", str(NVML / "h200-idle.json"),
        "--description", "re-recorded",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "recorded 1 GPU (driver 580.159.04)" in result.stdout
    doc = json.loads(out.read_text())
    original = json.loads((NVML / "h200-idle.json").read_text())
    (again,) = doc["devices"]
    (recorded,) = original["devices"]
    # the recording answers the whole catalogue of its day (activity block and NVLink errors
    # included): re-recorded, every answer comes back as it was, errors by name; the queries
    # declared since (recovery action, fabric) read as unsupported
    later = {"recovery_action", "fabric_info", "pcie_bytes/0", "pcie_bytes/1"}
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
    result = run_cli("record-fixture", str(out), "--nvml-fixture", str(old))
    assert result.returncode == 0, result.stderr
    (again,) = json.loads(out.read_text())["devices"]
    (recorded,) = json.loads(old.read_text())["devices"]
    assert {k: again["answers"][k] for k in recorded["answers"]} == recorded["answers"]
    added = set(again["answers"]) - set(recorded["answers"])
    assert "gpm" in added and "nvlink_state/0" in added and "pcie_throughput/0" in added
    assert all(again["answers"][k] == {"error": "NOT_SUPPORTED"} for k in added)


def test_record_fixture_without_nvml(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    result = run_cli("record-fixture", str(out), "--nvml-fixture", str(NVML / "no-nvml.json"))
    assert_clean_error(result, 3, "cannot record: NVML is unavailable")
    assert not out.exists()


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
