"""Where sparkdiag keeps its state, and creating that directory."""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkdiag.statedir import StateDirError, ensure_state_directory, state_directory


def test_systemd_state_directory_wins() -> None:
    env = {
        "STATE_DIRECTORY": "/var/lib/sparkdiag",
        "XDG_STATE_HOME": "/home/u/.state",
        "HOME": "/home/u",
    }
    assert state_directory(env) == Path("/var/lib/sparkdiag")


def test_systemd_may_pass_several_directories() -> None:
    env = {"STATE_DIRECTORY": "/var/lib/sparkdiag:/var/lib/other", "HOME": "/home/u"}
    assert state_directory(env) == Path("/var/lib/sparkdiag")


def test_empty_state_directory_falls_through() -> None:
    assert state_directory({"STATE_DIRECTORY": "", "HOME": "/home/u"}) == Path(
        "/home/u/.local/state/sparkdiag"
    )


def test_xdg_state_home() -> None:
    env = {"XDG_STATE_HOME": "/home/u/.state", "HOME": "/home/u"}
    assert state_directory(env) == Path("/home/u/.state/sparkdiag")


def test_relative_xdg_state_home_is_ignored() -> None:
    env = {"XDG_STATE_HOME": "relative/state", "HOME": "/home/u"}
    assert state_directory(env) == Path("/home/u/.local/state/sparkdiag")


def test_home_default() -> None:
    assert state_directory({"HOME": "/home/u"}) == Path("/home/u/.local/state/sparkdiag")


def test_without_home_the_password_database_is_used() -> None:
    home = pwd.getpwuid(os.getuid()).pw_dir
    assert state_directory({}) == Path(home) / ".local" / "state" / "sparkdiag"


def test_process_environment_by_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    assert state_directory() == tmp_path
    monkeypatch.delenv("STATE_DIRECTORY")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_directory() == tmp_path / "xdg" / "sparkdiag"


def test_state_directory_does_not_create(tmp_path: Path) -> None:
    path = state_directory({"HOME": str(tmp_path)})
    assert not path.exists()


@pytest.fixture(params=[0o022, 0o077, 0o277])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def test_ensure_creates_with_mode_0700(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "home" / ".local" / "state" / "sparkdiag"
    assert ensure_state_directory(path) == path
    assert path.is_dir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_ensure_leaves_an_existing_directory_alone(tmp_path: Path) -> None:
    path = tmp_path / "state"
    path.mkdir()
    path.chmod(0o750)
    (path / "baselines.sqlite3").write_text("kept")
    assert ensure_state_directory(path) == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o750
    assert (path / "baselines.sqlite3").read_text() == "kept"


def test_ensure_refuses_a_file(tmp_path: Path) -> None:
    path = tmp_path / "state"
    path.write_text("not a directory")
    with pytest.raises(StateDirError, match="not a directory") as info:
        ensure_state_directory(path)
    assert str(path) in str(info.value)


def test_ensure_reports_path_and_os_reason(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    path = tmp_path / "file" / "sparkdiag"
    with pytest.raises(StateDirError) as info:
        ensure_state_directory(path)
    message = str(info.value)
    assert str(path) in message
    assert "Not a directory" in message or "File exists" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root bypasses file permissions")
def test_ensure_reports_permission_denied(tmp_path: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        with pytest.raises(StateDirError, match="Permission denied") as info:
            ensure_state_directory(parent / "sparkdiag")
        assert str(parent / "sparkdiag") in str(info.value)
        with pytest.raises(StateDirError, match="not writable"):
            ensure_state_directory(parent)
    finally:
        parent.chmod(0o700)


# -- the systemd service's directory, where a command run as you reads another ------------------


def test_the_service_directory_is_named_where_it_is_not_the_one_read(tmp_path: Path) -> None:
    """Under the unit (StateDirectory=sparkdiag, DynamicUser=) the daemon keeps its baselines
    in /var/lib/sparkdiag, a link into /var/lib/private, which only root may enter; check and
    soak run as you read ~/.local/state/sparkdiag. The link is seen without entering it."""
    from sparkdiag.statedir import service_state

    rootfs = tmp_path / "root"
    mine = tmp_path / "home" / ".local" / "state" / "sparkdiag"
    assert service_state(rootfs, mine) is None  # no service here
    private = rootfs / "var" / "lib" / "private" / "sparkdiag"
    private.mkdir(parents=True)
    (rootfs / "var" / "lib" / "sparkdiag").symlink_to("private/sparkdiag")
    private.parent.chmod(0o700)
    assert service_state(rootfs, mine) == rootfs / "var" / "lib" / "sparkdiag"
    # the service's own run (STATE_DIRECTORY) reads it: nothing to say
    assert service_state(rootfs, rootfs / "var" / "lib" / "sparkdiag") is None
    assert service_state(rootfs, private) is None


def test_check_says_where_the_service_keeps_its_baselines(tmp_path: Path) -> None:
    from sparkdiag.baseline.keeper import inspect_store
    from sparkdiag.check.store_checks import check_baseline_store
    from tests.support.check import NVML, context, poll

    snap = poll(NVML / "h200-idle.json")
    store = inspect_store(tmp_path / "mine")
    (row,) = check_baseline_store(context(snap, baseline_store=store))
    assert row.status == "skip" and "to learn baselines" in row.action
    service = Path("/var/lib/sparkdiag")
    (row,) = check_baseline_store(context(snap, baseline_store=store, service_state=service))
    assert row.status == "skip" and row.action == (
        "the sparkdiag service keeps its baselines in /var/lib/sparkdiag (systemd's "
        "StateDirectory), not in the directory read here: run this as root with --state-dir "
        "/var/lib/sparkdiag to read the service's"
    )


def test_soak_says_where_the_service_would_export_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A soak kept in your directory never showed in the service's metrics, silently."""
    from sparkdiag.commands import soak

    kept = tmp_path / "mine" / "soak.json"
    monkeypatch.setattr(soak, "service_state", lambda rootfs, used: None)
    soak._say_where_the_service_reads(kept)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(soak, "service_state", lambda rootfs, used: Path("/var/lib/sparkdiag"))
    monkeypatch.setenv("COLUMNS", "200")
    soak._say_where_the_service_reads(kept)
    said = " ".join(capsys.readouterr().err.split())
    assert said == (
        f"kept in {kept}; the sparkdiag service exports the soak in /var/lib/sparkdiag "
        "(systemd's StateDirectory), not this one: run the soak as root with --state-dir "
        "/var/lib/sparkdiag for its metrics to show it"
    )
