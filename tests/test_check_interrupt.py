"""``sparkdiag check --json`` interrupted (Ctrl-C, SIGTERM) or ended by an error still prints its
``sparkdiag-check/1`` document: ``"interrupted": true`` and the signal (or the ``"error"``), no
check listed (they run once everything is gathered), its ``exit_code`` the process's. Before, a
SIGINT during the stall check's sampling exited 130 with nothing on standard output, and a
script reading the document had nothing to read (found in a review). The signals stay the
command group's (issue 34): check installs no handler, it writes on the way out and the group
ends the process as before."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest
from click.testing import CliRunner, Result

from sparkdiag.check.gather import Sources
from sparkdiag.check.model import KernelLog
from sparkdiag.check.report import SCHEMA
from sparkdiag.cli import main
from sparkdiag.lifecycle import Interrupted
from tests.support import ROOT, signal_when
from tests.support.check import GOOD_TORCH, NVML, ROOTFS, SYSFS, never_launch

STALLED = NVML / "h200-stalled.json"  # a busy GPU: the stall check samples it for 3 s


def _args(tmp_path: Path, fixture: Path = STALLED) -> list[str]:
    return [
        "--quick",
        "--nvml-fixture",
        str(fixture),
        "--path.sysfs",
        str(SYSFS / "h200-vm"),
        "--path.rootfs",
        str(ROOTFS / "native"),
        "--state-dir",
        str(tmp_path / "state"),
        "--no-nvme.smart",
    ]


def _sources(sleep: Any) -> Sources:
    """What check would read from the machine, with ``sleep`` between the stall samples."""
    return Sources(
        launcher=never_launch, torch=GOOD_TORCH, kernel_log=KernelLog((), "test"), sleep=sleep
    )


def _invoke(args: list[str], sleep: Any) -> Result:
    return CliRunner().invoke(main, ["check", *args], obj=_sources(sleep))


def _raises(exc: BaseException) -> Any:
    def sleep(_seconds: float) -> NoReturn:
        raise exc

    return sleep


@pytest.mark.parametrize(
    ("exc", "name"),
    [
        (KeyboardInterrupt(), "SIGINT"),
        (Interrupted("SIGINT"), "SIGINT"),
        (Interrupted("SIGTERM"), "SIGTERM"),
    ],
    ids=["KeyboardInterrupt", "SIGINT", "SIGTERM"],
)
def test_an_interrupted_run_prints_its_document(
    tmp_path: Path, exc: BaseException, name: str
) -> None:
    """Ctrl-C or SIGTERM during the stall check's sampling (as the lifecycle's handler raises
    it there): 130, one line on stderr, and the document on stdout."""
    result = _invoke([*_args(tmp_path), "--json"], _raises(exc))
    assert result.exit_code == 130
    assert result.stderr == "Error: interrupted\n"
    doc = json.loads(result.stdout)
    assert doc["schema"] == SCHEMA
    assert doc["interrupted"] is True and doc["signal"] == name
    assert doc["exit_code"] == 130
    assert doc["checks"] == [] and doc["status"] == "skip" and doc["judged"] is False
    assert doc["quick"] is True and doc["duration_seconds"] >= 0
    assert "error" not in doc


def test_an_interrupted_table_prints_nothing(tmp_path: Path) -> None:
    """Without --json nothing changes: the table is not printed half-made."""
    result = _invoke(_args(tmp_path), _raises(KeyboardInterrupt()))
    assert (result.exit_code, result.stdout, result.stderr) == (130, "", "Error: interrupted\n")


def test_a_run_that_finishes_is_not_marked(tmp_path: Path) -> None:
    result = _invoke([*_args(tmp_path), "--json"], lambda _seconds: None)
    doc = json.loads(result.stdout)
    assert "interrupted" not in doc and "error" not in doc
    assert doc["checks"] and doc["exit_code"] == result.exit_code


def test_an_error_prints_the_document_with_it(tmp_path: Path) -> None:
    """A fixture that cannot be read (a usage error, 2): the document says so."""
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    result = _invoke([*_args(tmp_path, bad), "--json"], lambda _seconds: None)
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ")
    doc = json.loads(result.stdout)
    assert doc["schema"] == SCHEMA and doc["exit_code"] == 2 and doc["checks"] == []
    assert doc["error"] == result.stderr.removeprefix("Error: ").strip()
    assert "interrupted" not in doc


def test_a_bug_prints_the_document_and_its_traceback_follows(tmp_path: Path) -> None:
    result = _invoke([*_args(tmp_path), "--json"], _raises(RuntimeError("a bug")))
    assert isinstance(result.exception, RuntimeError)
    doc = json.loads(result.stdout)
    assert doc["error"] == "RuntimeError: a bug" and doc["exit_code"] == 1


_SAYS_WHEN_SAMPLING = """
import sys
from sparkdiag.check import gather

real = gather.sample_busy_gpus

def sampling(*args, **kwargs):
    print("sampling", file=sys.stderr, flush=True)
    return real(*args, **kwargs)

gather.sample_busy_gpus = sampling
from sparkdiag.cli import main
main(["check", *sys.argv[1:]])
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_stall_sampling_leaves_the_document(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """The review's case, in a process of its own: the signal during the 3 s of sampling."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SAYS_WHEN_SAMPLING, *_args(tmp_path), "--json"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    said: list[str] = []

    def sampling() -> bool:
        said.append(proc.stderr.readline())  # type: ignore[union-attr]
        return said[-1] == "sampling\n"

    out, err = signal_when(proc, sampling, sig)
    assert (proc.returncode, err) == (130, "Error: interrupted\n")
    doc = json.loads(out)
    assert doc["interrupted"] is True and doc["signal"] == sig.name and doc["exit_code"] == 130
