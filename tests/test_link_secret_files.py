"""Who owns the link secret file, and who may write its directory (the review of 2026-12): the
mode was all that was checked. A secret file owned by another user than the one sparkdiag runs
as (or root) is refused, as ssh refuses such a key: its owner can chmod it open or write another
secret into it whenever they like. A directory that others may write is warned about, once. The
refusal of a file that others may read (0644) stays."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkdiag.errors import UsageError
from sparkdiag.link import auth
from tests.support import invoke_cli
from tests.test_link_units import SECRET

OTHER = 65534  # nobody


def secret(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SECRET.decode() + "\n")
    path.chmod(0o600)
    return path


def owned_by_another(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``path`` owned by a user other than this process's effective one (and not root)."""
    if os.geteuid() == 0:
        os.chown(path, OTHER, OTHER)
    else:  # not root: the file is ours, so this process is made to run as someone else
        me = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: me + 1)


def test_a_secret_file_another_user_owns_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = secret(tmp_path / "link.secret")
    owned_by_another(path, monkeypatch)
    with pytest.raises(UsageError) as caught:
        auth.read_secret(path)
    said = caught.value.message
    assert said.startswith(f"{path} is owned by ") and "that runs sparkdiag (or root)" in said
    assert "can read or replace the secret at any time" in said and "chown " in said
    assert caught.value.flag == "--link.secret-file" and caught.value.exit_code == 2


def test_link_test_refuses_it_in_one_line(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root (the unit test above covers it)")
    path = secret(tmp_path / "link.secret")
    os.chown(path, OTHER, OTHER)
    result = invoke_cli(
        "link", "test", "127.0.0.1:9", "--address-only", "--link.secret-file", str(path)
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"{path} is owned by " in line


def test_a_secret_file_root_owns_is_read_by_any_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("a file owned by root is made by root")
    path = secret(tmp_path / "link.secret")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert auth.read_secret(path) == SECRET


def test_a_secret_file_open_to_others_is_still_refused(tmp_path: Path) -> None:
    path = secret(tmp_path / "link.secret")
    path.chmod(0o644)
    with pytest.raises(UsageError, match="is mode 644: its group and other users can read"):
        auth.read_secret(path)


@pytest.mark.parametrize(
    ("mode", "who"),
    [(0o777, "its group and other users"), (0o770, "its group"), (0o1707, "other users")],
    ids=["0777", "0770", "1707-sticky"],
)
def test_a_directory_others_may_write_is_warned_about(tmp_path: Path, mode: int, who: str) -> None:
    directory = tmp_path / "shared"
    path = secret(directory / "link.secret")
    directory.chmod(mode)
    said: list[str] = []
    assert auth.read_secret(path, say=said.append) == SECRET
    (line,) = said
    assert line.startswith(
        f"warning: the directory {directory} of the link secret is mode {mode & 0o7777:03o}: "
        f"{who} can write it, and so put another file in the secret's place"
    ), line
    assert line.endswith(f"chmod go-w {directory}, or keep the secret elsewhere")
    assert ("sticky" in line) is bool(mode & 0o1000)


def test_a_private_directory_is_not_warned_about(tmp_path: Path) -> None:
    path = secret(tmp_path / "private" / "link.secret")
    path.parent.chmod(0o755)
    said: list[str] = []
    auth.read_secret(path, say=said.append)
    assert said == []


def test_a_running_server_warns_of_the_directory_once(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    path = secret(directory / "link.secret")
    directory.chmod(0o777)
    said: list[str] = []
    now = [0.0]
    live = auth.LiveSecret(path, said.append, clock=lambda: now[0])
    for step in range(1, 4):  # the file rewritten: read again, the directory still open
        path.write_text(SECRET.decode() + f"\n{step}\n")
        os.utime(path, ns=(step * 10**9, step * 10**9))
        now[0] += 2 * auth.RECHECK_SECONDS
        live.current()
    assert [line for line in said if "directory" in line] == [said[0]]
    assert said[0].startswith(f"warning: the directory {directory}")


def test_link_test_says_the_warning_on_standard_error(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    path = secret(directory / "link.secret")
    directory.chmod(0o777)
    result = invoke_cli(
        "link", "test", "127.0.0.1:9", "--address-only", "--connect-timeout", "2",
        "--link.secret-file", str(path),
    )  # fmt: skip
    assert result.returncode == 3, result.stderr  # nothing listens on port 9
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"warning: the directory {directory} of the link secret")
    assert "refused the connection" in lines[1]
