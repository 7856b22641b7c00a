"""What opening the baseline store says when it cannot (:mod:`sparkdiag.baseline.opening`): a file
that is not a database, or a damaged one, is said to be that, with what to do; the missing
``-shm`` and the directory one may not write are said only where they are so.

``echo garbage > $STATE/sparkdiag/baselines.sqlite`` gave, as root in a writable directory: "file
is not a database (directory ... is not writable for uid 0, and baselines.sqlite-shm is absent
...)" (found in a review)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkdiag.baseline import opening
from sparkdiag.baseline.model import BaselineStoreError
from sparkdiag.baseline.store import BaselineStore, open_store
from tests.support import NVML, ROOT, ROOTFS, sparkdiag_cmd

DAMAGED = "(the file is damaged or is not a baseline store: move it aside"


def garbage(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "baselines.sqlite"
    path.write_text("garbage\n")
    return path


def wal_store(directory: Path) -> Path:
    """A baseline store as the daemon leaves it closed: WAL mode, no -wal nor -shm beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    store = BaselineStore(directory / "baselines.sqlite")
    store.close()
    assert sorted(p.name for p in directory.iterdir()) == ["baselines.sqlite"]
    return directory / "baselines.sqlite"


@pytest.mark.parametrize("readonly", [True, False])
def test_a_file_that_is_not_a_database_is_said_to_be_one(tmp_path: Path, readonly: bool) -> None:
    path = garbage(tmp_path / "sparkdiag")
    with pytest.raises(BaselineStoreError) as info:
        BaselineStore(path, readonly=readonly)
    said = str(info.value)
    assert f"baseline store {path}: file is not a database {DAMAGED}" in said, said
    assert "not writable" not in said and "-shm is absent" not in said


def test_a_damaged_database_is_said_to_be_one(tmp_path: Path) -> None:
    """Opened for writing (the daemon, probe, baseline pin) it fails at open, CORRUPT; a reader
    finds it at the quick check, which said so already."""
    path = wal_store(tmp_path)
    data = bytearray(path.read_bytes())
    data[100:400] = b"\xff" * 300  # the first page's b-tree header: the schema is unreadable
    path.write_bytes(bytes(data))
    with pytest.raises(BaselineStoreError) as info:
        BaselineStore(path)
    said = str(info.value)
    assert f"{path}: database disk image is malformed {DAMAGED}" in said, said
    assert "not writable" not in said
    with pytest.raises(BaselineStoreError, match=r"is damaged .*: move it aside"):
        open_store(tmp_path, create=False)


def test_check_says_the_store_is_damaged_not_that_the_directory_is_not_writable(
    tmp_path: Path,
) -> None:
    """The review's command: the baseline-store row, as check shows it."""
    state = tmp_path / "state"
    garbage(state)
    done = subprocess.run(
        sparkdiag_cmd(
            "check", "--quick", "--json", "--nvml-fixture", str(NVML / "h200-idle.json"),
            "--path.rootfs", str(ROOTFS / "native"), "--state-dir", str(state),
        ),
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    rows = {row["name"]: row for row in json.loads(done.stdout)["checks"]}
    row = rows["baseline-store"]
    assert row["status"] == "warn"
    assert "file is not a database " + DAMAGED in row["finding"], row
    assert "not writable" not in row["finding"] and "-shm" not in row["finding"]


def _error(code: int) -> sqlite3.Error:
    exc = sqlite3.OperationalError("as SQLite says it")
    exc.sqlite_errorcode = code
    return exc


READONLY_DIRECTORY = sqlite3.SQLITE_READONLY | 6 << 8  # SQLITE_READONLY_DIRECTORY


@pytest.mark.parametrize(
    ("code", "writable", "shm", "explained"),
    [
        (READONLY_DIRECTORY, False, False, True),
        (sqlite3.SQLITE_CANTOPEN, False, False, True),
        (READONLY_DIRECTORY, True, False, False),  # the directory is writable: not that
        (READONLY_DIRECTORY, False, True, False),  # the -shm is there: not that
        (sqlite3.SQLITE_NOTADB, False, False, False),  # the file itself
        (sqlite3.SQLITE_CORRUPT, False, False, False),
        (sqlite3.SQLITE_IOERR, False, False, False),
    ],
)
def test_the_missing_shm_is_said_only_for_an_open_failure_in_a_directory_not_writable(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    code: int,
    writable: bool,
    shm: bool,
    explained: bool,
) -> None:
    path = wal_store(tmp_path)
    if shm:
        (tmp_path / "baselines.sqlite-shm").write_bytes(b"")
    monkeypatch.setattr(os, "access", lambda *_: writable)
    why = opening._why_not_read(path, _error(code))
    if explained:
        assert why.startswith(f" (directory {tmp_path} is not writable for uid {os.getuid()}")
        assert "baselines.sqlite-shm is absent" in why
    else:
        assert why == ""


@pytest.fixture
def request_cleanup() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


AS_NOBODY = r"""
import sys
from pathlib import Path
from sparkdiag.baseline.store import BaselineStoreError, open_store
try:
    open_store(Path(sys.argv[1]), create=False).close()
    print("opened")
except BaselineStoreError as exc:
    print(exc)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
def test_as_a_user_who_may_not_write_the_directory(request_cleanup: list[Path]) -> None:
    """The explanation where it is true (uid 65534 in root's 0755 directory), and not for a
    garbage file there. (pytest's tmp_path lies in root's 0700 directory: not there.)"""
    stores = Path(tempfile.mkdtemp(prefix="sparkdiag-opening-"))
    request_cleanup.append(stores)
    wal_store(stores / "wal")
    garbage(stores / "garbage")
    for directory in (stores, stores / "wal", stores / "garbage"):
        directory.chmod(0o755)
    # uid 65534 imports a copy of sparkdiag beside the stores: the checkout may lie under a
    # directory only root may read (`mktemp -d` makes them 0700), where its import failed
    source = stores / "src"
    shutil.copytree(ROOT / "sparkdiag", source / "sparkdiag",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(source)}

    def as_nobody(directory: Path) -> str:
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             sys.executable, "-c", AS_NOBODY, str(directory)],
            capture_output=True, text=True, cwd=stores, env=env, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return " ".join(done.stdout.split())

    said = as_nobody(stores / "wal")
    assert f"directory {stores / 'wal'} is not writable for uid 65534" in said, said
    assert "baselines.sqlite-shm is absent" in said
    said = as_nobody(stores / "garbage")
    assert f"file is not a database {DAMAGED}" in said and "not writable" not in said, said
    # root, who may write there, reads the same store
    open_store(stores / "wal", create=False).close()
