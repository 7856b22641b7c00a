"""The exit status of every command, from the one table (sparkdiag.errors.Exit), through the
command group as a user runs it: a usage error is 2 with one line naming what is wrong, the work
that cannot be done 3, "look at it" 1, and each command's own meanings (README, --help)."""

from __future__ import annotations

import ast
import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sparkdiag.baseline.storage_store import StorageKey
from sparkdiag.baseline.store import open_store
from sparkdiag.check.gather import Sources
from sparkdiag.check.model import KernelLog
from sparkdiag.cli import main
from sparkdiag.errors import Exit
from sparkdiag.probe.worker.contract import SCHEMA
from sparkdiag.storage.target import locate
from tests.support import NVML, PROBE, ROOT, ROOTFS, SYSFS, free_port, scaled_cycle, subcommands
from tests.support.check import GOOD_TORCH, never_launch, nvml_fixture

IDLE = str(NVML / "h200-idle.json")
NO_NVML = str(NVML / "no-nvml.json")
RECORDING = ROOT / "docs" / "device" / "2026-12-01" / "part-c" / "healthy.recording.json"
QUIET = Sources(launcher=never_launch, torch=GOOD_TORCH, kernel_log=KernelLog((), "test"))

Args = Callable[[Path], list[str]]


def _check(tmp: Path, fixture: str = IDLE, rootfs: str = "native") -> list[str]:
    sysfs = tmp / "sysfs"
    shutil.copytree(SYSFS / "h200-vm", sysfs, symlinks=True)
    for n in range(2):  # the CPUs on the performance governor, so that nothing warns
        governor = sysfs / "devices" / "system" / "cpu" / f"cpu{n}" / "cpufreq"
        governor.mkdir(parents=True)
        (governor / "scaling_governor").write_text("performance\n")
    return ["check", "--quick", "--nvml-fixture", fixture, "--path.sysfs", str(sysfs),
            "--path.rootfs", str(ROOTFS / rootfs), "--state-dir", str(tmp / "state")]  # fmt: skip


def _check_no_gpu(tmp: Path) -> list[str]:
    """A machine without a GPU: no NVML, no NVIDIA function on the PCI bus."""
    sysfs = tmp / "sysfs"
    (sysfs / "bus" / "pci" / "devices").mkdir(parents=True)
    return ["check", "--quick", "--nvml-fixture", NO_NVML, "--path.sysfs", str(sysfs),
            "--state-dir", str(tmp / "state")]  # fmt: skip


def _probe_fixture(tmp: Path, status: str) -> str:
    path = tmp / f"{status}.json"
    doc = {"schema": SCHEMA, "status": status, "reason": f"a {status} cycle", "results": []}
    path.write_text(json.dumps(doc))
    return str(path)


def _unsupported(tmp: Path) -> str:
    """The recorded H200 cycle with every kernel unsupported, its memory copy measured."""
    doc = json.loads((PROBE / "h200-default.json").read_text())
    for result in doc["results"]:
        result.update(status="unsupported", reason="not here", delivered=None, peak=None)
    path = tmp / "unsupported.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _probe(tmp: Path, fixture: str) -> list[str]:
    return ["probe", "--nvml-fixture", IDLE, "--probe.fixture", fixture, "--record",
            "--state-dir", str(tmp / "state")]  # fmt: skip


def _probe_slower(tmp: Path) -> list[str]:
    """The recorded H200 cycle taught as the baseline, then the same cycle at 0.48 of it with
    pid 4242 on the GPU: what the probe read beside a ViT training job (CONTEXT.md)."""
    recorded = str(PROBE / "h200-default.json")
    for _ in range(3):
        assert CliRunner().invoke(main, _probe(tmp, recorded)).exit_code == 0
    beside = scaled_cycle(tmp / "beside.json", 0.48, [4242])
    return [*_probe(tmp, str(beside)), "--no-record"]


def _config(tmp: Path, text: str) -> list[str]:
    path = tmp / "config.toml"
    path.write_text(text)
    return ["config", "check", str(path)]


def _secret(tmp: Path) -> list[str]:
    """A link secret made as 'link serve' makes it (mode 0600)."""
    path = tmp / "link.secret"
    path.write_text("0123456789abcdef" * 4 + "\n")
    path.chmod(0o600)
    return ["--link.secret-file", str(path)]


def _assets_twice(tmp: Path) -> list[str]:
    assert CliRunner().invoke(main, ["assets", str(tmp / "out")]).exit_code == 0
    return ["assets", str(tmp / "out")]


def _site(tmp: Path, library: str) -> list[str]:
    """``native`` on a package directory holding one fixture library, judged for GB10."""
    site = tmp / "site-packages" / "kernels"
    site.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "fixtures" / "fatbin" / f"{library}.so", site / "_ops.so")
    return ["native", "--python", str(site.parent), "--capability", "12.1",
            "--state-dir", str(tmp)]  # fmt: skip


def _store(tmp: Path) -> list[str]:
    state = tmp / "state"
    assert CliRunner().invoke(main, _probe(tmp, str(PROBE / "h200-default.json"))).exit_code == 0
    return ["--state-dir", str(state)]


STORAGE_SMALL = ("--storage.size", "16M", "--storage.duration", "2")


def _slow_storage(tmp: Path) -> list[str]:
    """Baselines pinned far above any disk: the probe's figures are slow against them."""
    data = tmp / "data"
    data.mkdir()
    found = locate(data)
    with open_store(tmp / "s", create=True) as store:
        for direction in ("read", "write"):
            key = StorageKey(
                "", found.mountpoint, found.device, direction, "host", "o_direct:1048576x8"
            )
            store.pin_storage(key, 1e15)
    return ["storage", str(data), *STORAGE_SMALL, "--state-dir", str(tmp / "s")]


CASES: list[tuple[str, Args, int, str]] = [
    # serve: 0 a clean stop (tests/test_lifecycle.py), 1 cannot start (port in use:
    # tests/test_cli.py runs it as a process), 2 configuration or usage error
    ("serve usage", lambda t: ["serve", "--poll-interval", "0"], Exit.USAGE, "poll-interval"),
    ("serve config", lambda t: ["serve", "--config", str(t / "none.toml")], Exit.USAGE,
     "cannot read configuration"),
    ("dump ok", lambda t: ["dump", "--nvml-fixture", IDLE, "--path.sysfs", str(SYSFS / "h200-vm")],
     Exit.OK, ""),
    ("dump bad fixture", lambda t: ["dump", "--nvml-fixture", str(t / "none.json")], Exit.USAGE,
     "Invalid value for '--nvml-fixture'"),
    ("record-fixture ok", lambda t: ["record-fixture", str(t / "x.json"), "--nvml-fixture", IDLE],
     Exit.OK, ""),
    ("record-fixture no nvml",
     lambda t: ["record-fixture", str(t / "x.json"), "--nvml-fixture", NO_NVML], Exit.FAILED,
     "cannot record: NVML is unavailable"),
    ("config ok", lambda t: _config(t, "poll-interval = 2.0\n"), Exit.OK, ""),
    ("config bad key", lambda t: _config(t, "poll-intervall = 2.0\n"), Exit.USAGE,
     "unknown key"),
    ("check pass", lambda t: _check(t), Exit.OK, ""),
    ("check warn", lambda t: _check(t, rootfs="docker"), Exit.ATTENTION, ""),
    ("check fail", lambda t: _check(t, str(nvml_fixture(t, set={"memory_temperature": 91.0}))),
     Exit.FAILED, ""),
    ("check usage", lambda t: ["check", "--probe.fixture", str(t / "none.json")], Exit.USAGE,
     "Invalid value for '--probe.fixture'"),
    ("probe ok", lambda t: _probe(t, str(PROBE / "h200-default.json")), Exit.OK, ""),
    ("probe busy", lambda t: _probe(t, _probe_fixture(t, "skipped_busy")), Exit.ATTENTION, ""),
    ("probe error", lambda t: _probe(t, _probe_fixture(t, "error")), Exit.FAILED, ""),
    ("probe usage", lambda t: ["probe", "--nvml-fixture", IDLE, "--gpu", "3"], Exit.USAGE,
     "no GPU with index 3 (NVML sees: 0)"),
    # every kernel unsupported, the memory copy measured: "nothing supported" (it was 0)
    ("probe nothing supported", lambda t: _probe(t, _unsupported(t)), Exit.ATTENTION,
     "unsupported (no requested kernel is"),
    ("bench usage", lambda t: ["bench", "--m", "0"], Exit.USAGE, "START:STOP:STEP"),
    # os.access says yes to root for /proc: bench swept, then lost it all to a traceback
    ("bench unwritable output", lambda t: ["bench", "--device", "cpu", "--small", "--csv",
     "/proc/sparkdiag-test.csv"], Exit.USAGE, "cannot create /proc/sparkdiag-test.csv"),
    # issue 32: bench refuses without a GPU as soak does (it swept GPU shapes on the CPU)
    ("bench no gpu", lambda t: ["bench", "--nvml-fixture", NO_NVML], Exit.ATTENTION,
     "no GPU to bench"),
    ("probe slower", lambda t: _probe_slower(t), Exit.ATTENTION, "while pid 4242 used the GPU"),
    ("check no gpu", lambda t: _check_no_gpu(t), Exit.ATTENTION, "nothing judged"),
    ("dump bad sysfs", lambda t: ["dump", "--path.sysfs", str(t / "none")], Exit.USAGE,
     "Invalid value for '--path.sysfs'"),
    ("check bad rootfs", lambda t: ["check", "--path.rootfs", str(t / "none")], Exit.USAGE,
     "Invalid value for '--path.rootfs'"),
    ("compare usage", lambda t: ["compare", "--max-gap", "2"], Exit.USAGE, "[0, 1)"),
    ("baseline show", lambda t: ["baseline", "show", *_store(t)], Exit.OK, ""),
    ("baseline show no store", lambda t: ["baseline", "show", "--state-dir", str(t)],
     Exit.OK, "no baselines yet"),  # a fresh machine: as an empty store (issue 21)
    ("baseline pin no store", lambda t: ["baseline", "pin", "--state-dir", str(t)],
     Exit.FAILED, "no baselines yet"),
    ("baseline pin no match", lambda t: ["baseline", "pin", *_store(t)], Exit.USAGE,
     "no baseline matches"),  # one probe teaches none (three do: test_probe_commands.py)
    ("baseline reset usage", lambda t: ["baseline", "reset", "--state-dir", str(t)], Exit.USAGE,
     "--all to reset everything"),
    ("assets ok", lambda t: ["assets", str(t / "out")], Exit.OK, ""),
    ("assets exists", _assets_twice, Exit.USAGE, "(pass --force)"),
    ("assets bad label", lambda t: ["assets", "--kubernetes", "--label", "x", str(t)],
     Exit.USAGE, "is not KEY=VALUE"),
    ("watch replay", lambda t: ["watch", "--replay", str(RECORDING)], Exit.OK, ""),
    ("watch usage", lambda t: ["watch"], Exit.USAGE, "give exactly one of"),
    ("watch bad recording", lambda t: ["watch", "--replay", str(t / "none.json")], Exit.USAGE,
     "Invalid value for '--replay'"),
    ("watch passes the job's own", lambda t: ["watch", "--nvml-fixture", IDLE, "--interval",
     "0.05", "--", "sh", "-c", "exit 7"], 7, ""),
    ("soak usage", lambda t: ["soak", "--gpu", "x"], Exit.USAGE, "is not a GPU index"),
    # the state directory is checked before the load, not after it (exit 1)
    ("soak unwritable state", lambda t: ["soak", "--device", "cpu", "--small", "--duration", "1",
     "--state-dir", "/proc/sparkdiag-test"], Exit.USAGE, "Invalid value for '--state-dir'"),
    ("soak no gpu", lambda t: ["soak", "--nvml-fixture", NO_NVML], Exit.ATTENTION,
     "no GPU to soak"),
    ("fleet bad timeout", lambda t: ["fleet", "--prometheus-timeout", "0"], Exit.USAGE,
     "--prometheus-timeout"),
    ("link bad duration", lambda t: ["link", "test", "127.0.0.1", "--duration", "0"],
     Exit.USAGE, "--duration"),
    ("link refused", lambda t: ["link", "test", "127.0.0.1", "--port", "9", "--address-only",
     "--connect-timeout", "2", *_secret(t)], Exit.FAILED, "127.0.0.1"),
    ("link no secret", lambda t: ["link", "test", "127.0.0.1", "--link.secret-file",
     str(t / "none")], Exit.USAGE, "no link secret at"),
    ("native ok", lambda t: _site(t, "sm121a"), Exit.OK, "1 native"),
    ("native ptx-jit", lambda t: _site(t, "ptx80"), Exit.ATTENTION, "through PTX JIT"),
    ("native none", lambda t: _site(t, "flash-attn-like"), Exit.FAILED, "cannot run"),
    ("native usage", lambda t: ["native", "--capability", "twelve"], Exit.USAGE,
     "expected MAJOR.MINOR"),
    ("fleet unreachable", lambda t: ["fleet", "--prometheus", "http://127.0.0.1:9",
     "--prometheus-timeout", "2"], Exit.FAILED, "127.0.0.1:9"),
    ("storage ok", lambda t: ["storage", str(t), *STORAGE_SMALL, "--state-dir", str(t / "s")],
     Exit.OK, "cost: wrote 16 MiB"),
    ("storage slow", lambda t: _slow_storage(t), Exit.ATTENTION, "SLOW: read and write"),
    ("storage refused", lambda t: ["storage", "/dev/null", *STORAGE_SMALL], Exit.USAGE,
     "never writes to a raw device"),
    ("storage bad size", lambda t: ["storage", str(t), "--storage.size", "1M"], Exit.USAGE,
     "16 MiB to 64 GiB"),
    ("nvme-log not this machine", lambda t: ["nvme-log", "--path.sysfs", str(t),
     "--nvme.log-dir", str(t / "logs")], Exit.FAILED, "is not /sys: the tools read /dev"),
    ("nvme-log usage", lambda t: ["nvme-log", "--path.sysfs", str(t / "none")], Exit.USAGE,
     "Invalid value for '--path.sysfs'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "status", "needle"),
    [pytest.param(args, status, needle, id=name) for name, args, status, needle in CASES],
)
def test_exit_status(tmp_path: Path, args: Args, status: int, needle: str) -> None:
    result = CliRunner().invoke(main, args(tmp_path), obj=QUIET)
    assert result.exit_code == status, result.output
    assert needle in result.output
    assert "Traceback" not in result.output
    if status == Exit.USAGE and "Usage:" not in result.output:  # raised below click's parsing
        assert result.output.startswith("Error: ") and result.output.count("\n") == 1


def test_every_command_is_covered() -> None:
    """A new command gets its rows here: every registered command appears in CASES."""
    named = {name.split()[0] for name, *_ in CASES}
    assert named == set(subcommands(main))


def _every_command(group: click.Group, words: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The words that run every command and subcommand (``("baseline", "show")``), groups too."""
    found = []
    for name, command in subcommands(group).items():
        found.append((*words, name))
        if isinstance(command, click.Group):
            found += _every_command(command, (*words, name))
    return found


def test_every_help_states_its_exit_statuses() -> None:
    """Every command and subcommand, walked from the group, so that a new one cannot miss it
    (baseline show/pin/reset and config check/default had none: README says every --help has
    them)."""
    runner = CliRunner()
    commands = _every_command(main)
    assert ("baseline", "show") in commands and ("link", "lint") in commands
    missing = [
        " ".join(words)
        for words in commands
        if "Exit status" not in runner.invoke(main, [*words, "--help"]).output
    ]
    assert missing == []


# -- issue 34: one way to end a command, one owner of SIGINT and SIGTERM --------------------------

_ENDS = ("sys.exit", "ctx.exit", "SystemExit", "signal.signal")


def _calls(path: Path) -> list[str]:
    """``sys.exit(...)``, ``ctx.exit(...)``, ``signal.signal(...)`` calls and ``SystemExit``
    names in a module, as ``file:line name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        name = ast.unparse(node.func) if isinstance(node, ast.Call) else None
        if isinstance(node, ast.Name) and node.id == "SystemExit":
            name = "SystemExit"
        if name in _ENDS:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def test_commands_return_their_status_and_only_the_lifecycle_installs_handlers() -> None:
    """Commands return an Exit (or raise a SparkdiagError): the group (cli.py) alone makes it
    the process's status (and entry.py, around it, a standard output that cannot be written),
    and lifecycle.py alone installs signal handlers. The programs
    sparkdiag runs as processes of their own (the worker, the container relay, the storage
    probe, the daemon's library scan) end as programs do."""
    package = ROOT / "sparkdiag"
    allowed = {
        "cli.py",
        "entry.py",  # around the group: a standard output that cannot be written ends there
        "lifecycle.py",
        "probe/relay.py",
        "storage/measure.py",
        "native/scan_child.py",
    }
    found = [
        call
        for path in sorted(package.rglob("*.py"))
        if not path.is_relative_to(package / "probe" / "worker")
        and str(path.relative_to(package)) not in allowed
        for call in _calls(path)
    ]
    assert found == []


@click.command("status-for-test")
@click.argument("status", type=int, required=False)
def _returns(status: int | None) -> int | None:
    return status


@pytest.mark.parametrize(("returned", "code"), [(None, 0), (0, 0), (1, 1), (3, 3), (143, 143)])
def test_the_group_turns_a_returned_status_into_the_exit_status(
    returned: int | None, code: int
) -> None:
    main.add_command(_returns)
    try:
        args = [] if returned is None else [str(returned)]
        result = CliRunner().invoke(main, ["status-for-test", *args])
    finally:
        main.commands.pop("status-for-test")
    assert result.exit_code == code and result.output == ""


_SLEEPER = """
import sys, time
from sparkdiag.cli import main
from sparkdiag.lifecycle import LIFECYCLE

@main.command("sleep-for-test")
def sleeper():
    if sys.argv[1] == "stops-itself":
        stop = LIFECYCLE.stop_on_signal()
        print("ready", flush=True)
        stop.wait(60)
        print(" ".join(LIFECYCLE.received), flush=True)
        return 5
    print("ready", flush=True)
    time.sleep(60)

main(["sleep-for-test"])
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_interrupts_a_command_or_is_its_to_handle(sig: signal.Signals) -> None:
    """SIGINT and SIGTERM alike: a command interrupted exits 130 with one line; a command that
    stops by itself (soak, watch, link serve) gets the signal as its stop event, by name, and
    returns its own status."""
    for mode in ("interrupted", "stops-itself"):
        proc = subprocess.Popen(
            [sys.executable, "-c", _SLEEPER, mode],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        if mode == "interrupted":
            assert (proc.returncode, out, err) == (130, "", "Error: interrupted\n")
        else:
            assert (proc.returncode, out, err) == (5, f"{sig.name}\n", "")


_HOLD = """
import sys
from pathlib import Path
from sparkdiag.link.auth import read_secret
from sparkdiag.link.session import open_control
control = open_control("127.0.0.1", int(sys.argv[1]), 5.0, read_secret(Path(sys.argv[2])))
print("held", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_link_serve_stops_with_0_between_sessions_and_130_during_one(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """link serve's help: 0 stopped between sessions, 130 stopped during a session; Ctrl-C and
    SIGTERM alike, within the 0.2 s of its accept loop."""
    secret = _secret(tmp_path)
    for during in (False, True):
        port = str(free_port())
        listen = ["--listen", f"127.0.0.1:{port}", *secret]
        server = subprocess.Popen(
            [sys.executable, "-m", "sparkdiag", "link", "serve", *listen],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        holder = None
        try:
            assert server.stderr is not None
            assert "listening on" in server.stderr.readline()
            if during:
                holder = subprocess.Popen(
                    [sys.executable, "-c", _HOLD, port, secret[1]],
                    cwd=ROOT,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            server.send_signal(sig)
            assert server.wait(timeout=10) == (130 if during else 0)
        finally:
            for proc in (server, holder):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
            if holder is not None:
                holder.communicate()
            server.communicate()
