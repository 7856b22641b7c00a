"""Every output path is checked before the work starts (issue 21: ``soak --csv`` to a bad path
failed after the soak ran, ``watch --plot``/``--record`` after the job ended, ``soak --plot``
made any folder it was given): one helper, :func:`sparkdiag.commands.common.check_output_path`,
shared by soak, bench and watch. The soak's and bench's own cases are in their test files."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sparkdiag.cli import main
from sparkdiag.commands.common import check_output_folder, check_output_path
from sparkdiag.errors import Exit, UsageError


def test_a_writable_file_a_new_file_and_stdout_pass(tmp_path: Path) -> None:
    existing = tmp_path / "old.csv"
    existing.write_text("x")
    os.utime(existing, (1e9, 1e9))
    for path in (existing, tmp_path / "new.csv", "-", None):
        check_output_path(path, "--csv")
    assert existing.read_text() == "x" and existing.stat().st_mtime == 1e9  # opened, not written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.csv"]  # new.csv made and removed


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


def test_watch_record_to_standard_output_is_refused_not_a_file_named_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-`` means standard output for --json and --csv; --record's recording cannot go there
    (standard output holds the diagnosis), and it used to write a file named ``-``."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    result = CliRunner().invoke(main, ["watch", "--record", "-", "--", "touch", str(marker)])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--record': the recording goes to a file" in result.output
    assert not marker.exists() and not (tmp_path / "-").exists()


def test_a_dangling_link_is_checked_where_it_points(tmp_path: Path) -> None:
    """Writing through a dangling link creates what it points at: a link into a missing folder
    is refused before the work, one into a folder that exists passes and leaves nothing."""
    gone = tmp_path / "gone.json"
    gone.symlink_to("/nonexistent/dir/out.json")
    with pytest.raises(UsageError, match="folder /nonexistent/dir does not exist"):
        check_output_path(gone, "--record")
    fine = tmp_path / "fine.json"
    fine.symlink_to(tmp_path / "target.json")
    check_output_path(fine, "--record")
    assert fine.is_symlink() and not (tmp_path / "target.json").exists()


# -- the check does what the write will do: os.access says yes to root for almost anything -------


def test_a_file_no_one_can_create_is_refused_for_root_too() -> None:
    """/proc takes no new file, but os.access(W_OK) said yes to root: bench swept, then its
    write raised FileNotFoundError."""
    with pytest.raises(UsageError) as caught:
        check_output_path("/proc/sparkdiag-test.csv", "--csv")
    assert caught.value.flag == "--csv"
    assert caught.value.message == (
        "cannot create /proc/sparkdiag-test.csv: No such file or directory"
    )
    with pytest.raises(UsageError, match="cannot write in folder /proc: No such file"):
        check_output_folder("/proc", "--plot")


def test_a_pipe_or_a_device_is_not_opened(tmp_path: Path) -> None:
    """Opening a pipe with no reader waits for one: a pipe or a device is only asked."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    check_output_path(fifo, "--json")  # returns at once
    check_output_path("/dev/null", "--csv")


def test_a_missing_chain_is_checked_at_its_first_existing_folder(tmp_path: Path) -> None:
    check_output_folder(tmp_path / "a" / "b", "--state-dir", parents=True)
    assert list(tmp_path.iterdir()) == []  # the test file made there is gone
    with pytest.raises(UsageError, match=r"folder /nonexistent/a does not exist \(to create b in"):
        check_output_folder("/nonexistent/a/b", "--state-dir")  # one level only without parents
    with pytest.raises(UsageError, match=r"cannot write in folder /proc \(to create a/b in\)"):
        check_output_folder("/proc/a/b", "--state-dir", parents=True)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A folder on a read-only bind mount of itself (as root, where mount works), holding
    old.csv."""
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "old.csv").write_text("x")
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a read-only bind mount needs root")
    made = subprocess.run(["mount", "-o", "bind,ro", str(folder), str(folder)],
                          capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"mount: {made.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_file_system_says_so(read_only: Path) -> None:
    for path, verb in ((read_only / "new.csv", "create"), (read_only / "old.csv", "write")):
        with pytest.raises(UsageError) as caught:
            check_output_path(path, "--csv")
        assert caught.value.message == f"cannot {verb} {path}: Read-only file system"
    with pytest.raises(UsageError, match="Read-only file system"):
        check_output_folder(read_only, "--plot")
    assert (read_only / "old.csv").read_text() == "x"


def test_a_path_that_cannot_be_looked_at_is_a_usage_error_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parent folder that cannot be entered makes Path.exists and Path.is_dir raise (a
    review ran soak, bench and storage as root without CAP_DAC_OVERRIDE: tracebacks, and the
    daemon's storage thread died). Simulated here: stat of anything under ``locked`` fails."""
    from sparkdiag.errors import UsageError
    from sparkdiag.storage import session

    locked = tmp_path / "locked"
    real_stat = Path.stat

    def stat(self: Path, *args: object, **kwargs: object) -> object:
        if str(self).startswith(str(locked) + "/"):
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "stat", stat)
    with pytest.raises(UsageError, match=r"cannot look at .*Permission denied"):
        check_output_path(locked / "x.csv", "--csv")
    with pytest.raises(UsageError, match=r"cannot look at .*Permission denied"):
        check_output_folder(locked / "state", "--state-dir", parents=True)
    assert session._is_dir(locked / "data") is False  # the program refuses it and says why
    assert session._is_dir(tmp_path) is True
