"""sparkdiag.probe.container: a container left running by an abandoned cycle is killed.

A stand-in engine (an executable named podman that records its argv and writes the cidfile it
is given) shows what is called; tests/test_deploy_container.py shows it against real podman.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sparkdiag.probe.container import ContainerGuard, guards, run_guarded
from sparkdiag.probe.runner import ProbeCycle

ENGINE = """
import json, sys
from pathlib import Path
args = sys.argv[1:]
with open(RECORD, "a") as fh:
    fh.write(json.dumps(args) + "\\n")
for arg in args:
    if arg.startswith("--cidfile="):
        Path(arg.split("=", 1)[1]).write_text("c0ffee\\n")
"""


@pytest.fixture
def engine(tmp_path: Path) -> tuple[Path, Path]:
    record = tmp_path / "calls.jsonl"
    path = tmp_path / "bin" / "podman"
    path.parent.mkdir()
    path.write_text(f"#!{sys.executable}\nRECORD = {str(record)!r}\n{ENGINE}")
    path.chmod(0o755)
    return path, record


def calls(record: Path) -> list[list[str]]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def cycle(result: str) -> ProbeCycle:
    return ProbeCycle(result, None, None, "", 0, 0.0, 1)  # type: ignore[arg-type]


def test_cidfile_goes_after_run_and_global_options_are_kept() -> None:
    guard = ContainerGuard(["podman", "--runtime", "runc", "run", "-i", "--rm", "IMG", "python3"])
    try:
        assert guard.guarded
        assert guard.argv[:4] == ("podman", "--runtime", "runc", "run")
        assert guard.argv[4].startswith("--cidfile=") and guard.argv[5:] == (
            "-i", "--rm", "IMG", "python3",
        )  # fmt: skip
        assert guard.prefix == ("podman", "--runtime", "runc") and guard.remove
    finally:
        guard.close(abandoned=False)
    assert guards(["docker", "container", "run", "-i", "IMG", "python3"])


@pytest.mark.parametrize(
    "command",
    [
        ["apptainer", "exec", "--nv", "x.sif", "python3"],
        ["docker", "exec", "-i", "box", "python3"],
        ["docker", "run", "--cidfile=/tmp/mine", "-i", "IMG", "python3"],
        ["/usr/bin/python3"],
    ],
)
def test_other_commands_run_unchanged(command: list[str]) -> None:
    guard = ContainerGuard(command)
    assert not guard.guarded and guard.argv == tuple(command) and not guards(command)
    guard.close(abandoned=True)


def test_timeout_kills_and_removes_the_container(engine: tuple[Path, Path]) -> None:
    path, record = engine
    command = [str(path), "--runtime", "runc", "run", "-i", "--rm", "IMG", "python3"]

    def run(argv: object) -> ProbeCycle:
        import subprocess

        subprocess.run(list(argv), check=True)  # type: ignore[call-overload]
        return cycle("timeout")

    assert run_guarded(command, run).result == "timeout"
    started, kill, remove = calls(record)
    assert started[:3] == ["--runtime", "runc", "run"]
    cidfile = Path(started[3].split("=", 1)[1])
    assert kill == ["--runtime", "runc", "kill", "c0ffee"]
    assert remove == ["--runtime", "runc", "rm", "--force", "c0ffee"]
    assert not cidfile.parent.exists()  # the temporary directory is gone


def test_a_finished_cycle_leaves_the_engine_alone(engine: tuple[Path, Path]) -> None:
    path, record = engine
    command = [str(path), "run", "-i", "IMG", "python3"]

    def run(argv: object) -> ProbeCycle:
        import subprocess

        subprocess.run(list(argv), check=True)  # type: ignore[call-overload]
        return cycle("ok")

    assert run_guarded(command, run).result == "ok"
    assert [c[0] for c in calls(record)] == ["run"]


def test_an_exception_kills_the_container(engine: tuple[Path, Path]) -> None:
    path, record = engine
    command = [str(path), "run", "-i", "IMG", "python3"]

    def run(argv: object) -> ProbeCycle:
        import subprocess

        subprocess.run(list(argv), check=True)  # type: ignore[call-overload]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_guarded(command, run)
    assert [c[0] for c in calls(record)] == ["run", "kill"]  # no --rm: the container is kept


def test_a_further_ctrl_c_during_the_kill_does_not_leave_the_container(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second Ctrl-C while the engine's kill ran (it may take seconds) interrupted the kill
    and left the container on the GPU (found in a review): the kill is tried again, then the
    interruption is raised."""
    from sparkdiag.probe import container

    guard = container.ContainerGuard(["docker", "run", "--rm", "img", "python3", "-"])
    assert guard._dir is not None
    (guard._dir / "cid").write_text("abc123\n")
    calls: list[tuple[str, ...]] = []

    def run(argv: list[str], **_kwargs: object) -> None:
        calls.append(tuple(argv[1:]))
        if len(calls) == 1:
            raise KeyboardInterrupt  # the user's second Ctrl-C, during the first kill

    monkeypatch.setattr(container.subprocess, "run", run)
    with pytest.raises(KeyboardInterrupt):
        guard.close(abandoned=True)
    assert calls == [("kill", "abc123"), ("kill", "abc123"), ("rm", "--force", "abc123")]
    assert guard._dir is None  # cleaned up all the same
