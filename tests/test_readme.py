"""The README as a newcomer reads and runs it (issue 21).

Fast: the README stays short, its contents and links resolve, every command has its row with an
example, every example's flags exist, the exit-status table is ``errors.Exit``, and the fixture
examples run. Slow (a fresh ``git clone`` of the committed tree in a temporary folder): the quick
start (a venv, ``pip install -e .``, ``serve`` answering a scrape), the install from a checkout
and from a wheel with what the systemd service needs, and the CPU smoke runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import click
import psutil
import pytest

from sparkdiag.cli import main as cli_group
from sparkdiag.errors import Exit
from tests.support import (
    ROOT,
    free_port,
    gpu_here,
    http_get,
    sparkdiag_cmd,
    subcommands,
    terminate,
)

README = ROOT / "README.md"
TEXT = README.read_text()
# the smoke runs a healthy machine passes in well under a minute each (issue 21)
SMOKE_SECONDS = 60.0


def sections() -> dict[str, str]:
    """``## Heading`` -> its text, up to the next ``## ``."""
    parts = re.split(r"^## (.+)$", TEXT, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def code_lines(text: str) -> list[str]:
    """The README's commands: indented code lines, continuation backslashes joined, comments cut."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        if not raw.startswith("    ") or not raw.strip():
            continue
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        lines.append(re.sub(r"\s+#.*$", "", line))
    return lines


def sparkdiag_invocations() -> list[list[str]]:
    """Every ``sparkdiag ...`` the README shows, in code and in the command table's examples."""
    found = []
    examples = re.findall(r"`(sparkdiag [^`]+)`", TEXT)
    for line in code_lines(TEXT) + examples:
        for part in line.split("&&"):
            words = shlex.split(part)
            for i, word in enumerate(words):
                if word == "sparkdiag" or word.endswith("/bin/sparkdiag"):
                    found.append(words[i + 1 :])
                    break
    return found


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


# -- fast: what the README says --------------------------------------------------------------


def test_the_readme_reads_in_five_minutes() -> None:
    assert len(TEXT.splitlines()) <= 200
    toc = sections()["Contents"]
    linked = re.findall(r"\]\(#([^)]+)\)", toc)
    headings = [h for h in sections() if h != "Contents"]
    assert linked == [anchor(h) for h in headings]


def test_every_link_of_the_readme_exists() -> None:
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", TEXT)
    assert targets
    for target in targets:
        assert (ROOT / target).exists(), target
    # the lab measurements live under docs/, not here (issue 21 item 10)
    for note in ("-34.9", "median +6.6", "0.40-0.60", "4.3 KiB", "kube-prometheus-stack"):
        assert note not in TEXT, note


def test_every_link_of_the_docs_pages_exists() -> None:
    """What moved out of the README to docs/ links to what it needs from there."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (page.parent / target).exists(), (page.name, target)


def test_every_command_has_a_row_with_an_example() -> None:
    rows = re.findall(r"^\| `([a-z-]+)` \| (.+) \| `(sparkdiag [^`]+)` \|$", TEXT, flags=re.M)
    assert sorted(name for name, _, _ in rows) == sorted(subcommands(cli_group))
    for name, _, example in rows:
        assert example.split()[1] == name


def command_for(words: list[str]) -> tuple[click.Command, list[str]]:
    """The click command a README invocation names, and its remaining words."""
    cmd: click.Command = cli_group
    while isinstance(cmd, click.Group) and words and words[0] in subcommands(cmd):
        cmd, words = subcommands(cmd)[words[0]], words[1:]
    return cmd, words


def test_every_example_uses_flags_that_exist() -> None:
    invocations = [w for w in sparkdiag_invocations() if w and not w[0].isupper()]
    assert len(invocations) >= 20
    for words in invocations:
        cmd, rest = command_for(words)
        known = {opt for param in cmd.params for opt in param.opts + param.secondary_opts}
        known |= {"-h", "--help"}
        if isinstance(cmd, click.Group):  # a group takes no arguments, only --help
            assert all(w in known for w in rest), words
        for word in rest:
            if word in ("--", "--container"):  # the watched job or the container command follows
                assert word == "--" or word in known, words
                break
            if word.startswith("--"):
                assert word.split("=")[0] in known, (words, word)


def test_the_exit_table_is_errors_exit() -> None:
    table = sections()["Exit status"]
    statuses = [int(s) for s in re.findall(r"^\| (\d+) \|", table, flags=re.M)]
    assert statuses == sorted(e.value for e in Exit)


def test_the_test_command_is_what_ci_runs() -> None:
    assert "    ./scripts/test\n" in sections()["Quick start"]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == "./scripts/test"
    assert 'pytest -n auto --dist worksteal -m "not slow"' in TEXT


def test_what_torch_a_machine_without_a_gpu_downloads_is_said() -> None:
    """Issue 32: scripts/test called torch==2.13.0 "the CPU build"; from PyPI on Linux x86-64 it
    is the CUDA build with several GB of nvidia-* wheels. The CPU-only index PyTorch documents is
    given, opt-in, and the plain pinned install (what CI's local wheel answers) stays as it was."""
    cpu_index = "https://download.pytorch.org/whl/cpu"
    script = (ROOT / "scripts" / "test").read_text()
    assert "the CPU build; an unpinned" not in script
    assert f"SPARKDIAG_TORCH_INDEX={cpu_index} ./scripts/test" in script
    assert '"${torch_index[@]}" torch==2.13.0' in script and "torch_index=()" in script
    quick, install = sections()["Quick start"], sections()["Install"]
    assert f"SPARKDIAG_TORCH_INDEX={cpu_index} ./scripts/test" in quick
    assert "CUDA build" in quick and "several GB" in quick
    assert f"--index-url {cpu_index} torch" in install


def test_the_scripts_test_default_is_the_plain_pinned_install(tmp_path: Path) -> None:
    """Without SPARKDIAG_TORCH_INDEX the pip line is exactly the old one; with it, the index."""
    import shutil

    fake = tmp_path / "repo"
    (fake / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "test", fake / "scripts" / "test")
    pip = fake / ".venv" / "bin" / "pip"
    pip.parent.mkdir(parents=True)
    log = tmp_path / "pip.log"
    pip.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexit 1\n')  # stop at the first install
    pip.chmod(0o755)
    venv = tmp_path / "bin"
    venv.mkdir()
    (venv / "python3").write_text("#!/bin/sh\nexit 0\n")  # "python3 -m venv .venv": nothing
    (venv / "python3").chmod(0o755)
    env = {"PATH": f"{venv}:/usr/bin:/bin"}
    for extra, expected in (
        ({}, "install --quiet --disable-pip-version-check torch==2.13.0"),
        (
            {"SPARKDIAG_TORCH_INDEX": "https://example.invalid/cpu"},
            "install --quiet --disable-pip-version-check --index-url https://example.invalid/cpu "
            "torch==2.13.0",
        ),
    ):
        log.write_text("")
        subprocess.run(
            ["bash", str(fake / "scripts" / "test")],
            env={**env, **extra},
            capture_output=True,
            check=False,
        )
        assert log.read_text().splitlines() == [expected]


def test_the_fixture_examples_run(tmp_path: Path) -> None:
    lines = [ln for ln in code_lines(sections()["Settings and fixtures"]) if "fixture" in ln]
    assert len(lines) == 2
    outputs = []
    for line in lines:
        words = shlex.split(line)[1:]
        env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
        done = subprocess.run(
            sparkdiag_cmd(*words), capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
        )
        assert done.returncode == 0, (line, done.stderr)
        assert "Traceback" not in done.stderr
        outputs.append(done.stdout)
    assert "sparkdiag_nvml_up 1" in outputs[0]
    assert "MAMF 794.5" in outputs[1]  # the H200's reference, named as docs/probe.md names it


# -- slow: from a fresh clone ----------------------------------------------------------------


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone of the committed tree (what CI and a newcomer get)."""
    where = tmp_path_factory.mktemp("clone") / "sparkdiag"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(where)], check=True, timeout=120)
    return where


def fresh_env() -> dict[str, str]:
    """The environment of a newcomer's shell: no PYTHONPATH pointing at this checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def shell(command: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=fresh_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    return done


@pytest.fixture(scope="module")
def quick_started(clone: Path) -> Iterator[Path]:
    """The quick start's setup as the README writes it, its ``serve`` left for the test."""
    (line,) = [ln for ln in code_lines(sections()["Quick start"]) if ln.endswith("sparkdiag serve")]
    setup, serve = line.rsplit(" && ", 1)
    assert serve == ".venv/bin/sparkdiag serve"
    shell(setup, clone)
    yield clone


@pytest.mark.slow
def test_the_quick_start_serves_from_a_fresh_clone(quick_started: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [".venv/bin/sparkdiag", "serve", "--listen", f"127.0.0.1:{port}"],
        cwd=quick_started,
        env=fresh_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        body = b""
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, _, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        text = body.decode()
        assert "sparkdiag_nvml_up" in text, text[:500]
    finally:
        terminate(proc)  # SIGTERM, as Ctrl-C or systemd stops it
    _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    if "sparkdiag_nvml_up 0" in text:  # no GPU here: it says what it skipped
        assert "GPU telemetry skipped" in err and "GEMM probes skipped" in err


@pytest.mark.slow
def test_the_install_from_a_checkout_and_a_wheel(quick_started: Path, tmp_path: Path) -> None:
    """``pip wheel`` as the README writes it, the wheel in a new venv, the service's assets from
    it, and the checkout installed as a copy (the service's install), all from the clone."""
    install = sections()["Install"]
    (line,) = [ln for ln in code_lines(install) if ln.startswith("pip wheel")]
    build, use = line.split(" && ")
    wheel_name = use.split("'")[1].removeprefix("dist/").removesuffix("[probe]")
    shell(".venv/bin/" + build, quick_started)
    wheel = quick_started / "dist" / wheel_name
    assert wheel.exists(), sorted(p.name for p in (quick_started / "dist").iterdir())
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(meta).decode()
    assert "Provides-Extra: probe" in metadata
    assert re.search(r"^Requires-Dist: torch.*extra == .probe.", metadata, flags=re.M)

    venv = tmp_path / "opt-sparkdiag"
    shell(f"python3 -m venv {venv} && {venv}/bin/pip install --quiet {wheel}", quick_started)
    assets = tmp_path / "assets"
    shell(f"{venv}/bin/sparkdiag assets {assets}", quick_started)
    unit = (assets / "systemd" / "sparkdiag.service").read_text()
    assert (
        "ExecStart=/opt/sparkdiag/bin/sparkdiag serve --config /etc/sparkdiag/config.toml" in unit
    )
    assert "ProtectHome=yes" in unit  # why the README installs a copy there, not -e
    shell(f"{venv}/bin/sparkdiag config check {assets / 'config.toml'}", quick_started)
    for wanted in ("systemd/sparkdiag.service", "config.toml"):
        assert f"/tmp/sparkdiag-assets/{wanted}" in install
    # the service's line installs the checkout itself, as a copy
    assert "sudo /opt/sparkdiag/bin/pip install '.[probe]'" in install
    shell(f"{venv}/bin/pip install --quiet --no-deps --force-reinstall .", quick_started)
    where = shell(f"{venv}/bin/python -c 'import sparkdiag; print(sparkdiag.__file__)'", tmp_path)
    assert where.stdout.startswith(str(venv))


@pytest.mark.worker
@pytest.mark.parametrize("index", range(4))
def test_the_cpu_smoke_runs_pass_from_a_fresh_clone(
    clone: Path, tmp_path: Path, index: int
) -> None:
    """Each smoke run of the quick start passes on a healthy machine in well under a minute.
    Run with this interpreter (it has the CPU torch) on the clone's code."""
    lines = [ln for ln in code_lines(sections()["Quick start"]) if ln.startswith(".venv/bin/")]
    assert len(lines) == 4
    words = shlex.split(lines[index])[1:]
    if "--expect-gpus 0" in lines[index] and gpu_here():
        pytest.skip("the preflight of a machine without a GPU; beside one it judges that GPU")
    env = {**os.environ, "PYTHONPATH": str(clone), "XDG_STATE_HOME": str(tmp_path)}
    env.pop("STATE_DIRECTORY", None)
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkdiag", *words],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=SMOKE_SECONDS * 2)
    except subprocess.TimeoutExpired:
        # its worker runs in a session of its own: reap it too, whatever the command does
        workers = psutil.Process(proc.pid).children(recursive=True)
        terminate(proc)  # SIGTERM, then SIGKILL after 10 s
        out, err = proc.communicate()
        left = [w.pid for w in workers if w.is_running()]
        for worker in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()
        pytest.fail(
            f"{lines[index]} still ran after {SMOKE_SECONDS * 2:.0f} s "
            f"(workers left running after it stopped: {left}): {err[-2000:]}"
        )
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    took = time.monotonic() - start
    assert done.returncode == 0, (lines[index], done.stdout[-3000:], done.stderr[-3000:])
    assert "Traceback" not in done.stderr
    assert took < SMOKE_SECONDS, (lines[index], took)
    assert not (tmp_path / "sparkdiag" / "soak.json").exists()  # --no-record: nothing kept
