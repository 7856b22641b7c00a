"""Every output path is checked before the work starts (issue 21: ``soak --csv`` to a bad path
failed after the soak ran, ``watch --plot``/``--record`` after the job ended, ``soak --plot``
made any folder it was given): one helper, :func:`sparkdiag.commands.common.check_output_path`,
shared by soak, bench and watch. The soak's and bench's own cases are in their test files."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sparkdiag.cli import main
from sparkdiag.commands.common import check_output_folder, check_output_path
from sparkdiag.errors import Exit, UsageError


def test_a_writable_file_a_new_file_and_stdout_pass(tmp_path: Path) -> None:
    existing = tmp_path / "old.csv"
    existing.write_text("x")
    for path in (existing, tmp_path / "new.csv", "-", None):
        check_output_path(path, "--csv")
    assert existing.read_text() == "x"  # checked, not touched
    assert not (tmp_path / "new.csv").exists()


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("/nonexistent/dir/out.csv", "folder /nonexistent/dir does not exist (for out.csv)"),
        ("{tmp}", "{tmp} is a folder; give a file name"),
        ("{tmp}/file/out.csv", "{tmp}/file is not a folder (for out.csv)"),
    ],
)
def test_a_bad_file_is_a_usage_error_naming_the_flag(
    tmp_path: Path, path: str, needle: str
) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError) as caught:
        check_output_path(path.replace("{tmp}", str(tmp_path)), "--record")
    assert caught.value.exit_code == Exit.USAGE and caught.value.flag == "--record"
    assert caught.value.message == needle.replace("{tmp}", str(tmp_path))


def test_a_folder_is_created_one_level_deep_only(tmp_path: Path) -> None:
    check_output_folder(tmp_path, "--plot")
    check_output_folder(tmp_path / "plots", "--plot")  # its parent exists: created at the end
    with pytest.raises(UsageError, match="folder /nonexistent does not exist"):
        check_output_folder("/nonexistent/dir", "--plot")
    assert not (tmp_path / "plots").exists()


@pytest.mark.parametrize("flag", ["--plot", "--record"])
def test_watch_checks_plot_and_record_before_the_job_starts(tmp_path: Path, flag: str) -> None:
    pytest.importorskip("matplotlib")
    marker = tmp_path / "ran"
    result = CliRunner().invoke(
        main, ["watch", flag, "/nonexistent/dir/out", "--", "touch", str(marker)]
    )
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{flag}': folder /nonexistent/dir does not exist" in result.output
    assert not marker.exists(), "the job ran before the path was checked"
