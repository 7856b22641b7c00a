"""Every loader under the red team's inputs of issue 29: ``/dev/zero``, a FIFO, JSON or YAML nested
5000 deep, integers of 5000 digits, bytes that are not UTF-8. Each command says one line and
exits 2; before, ``--http.config.file`` and ``watch --replay`` read ``/dev/zero`` without bound,
a FIFO blocked the open forever, and deep documents and long integers were tracebacks. The one
module they all read through, :mod:`sparkdiag.safeload`, is fuzzed with any bytes."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkdiag import safeload, safeyaml
from tests.support import NVML, free_port, invoke_cli, run_cli, sparkdiag_cmd
from tests.support.fuzz import examples

# Each loader as a command line, given the file to load.
COMMANDS: dict[str, Callable[[str], list[str]]] = {
    "config": lambda f: ["config", "check", f],
    "web config": lambda f: ["serve", "--web.config.file", f, "--nvml-fixture",
                             str(NVML / "h200-idle.json"), "--no-probe.enabled",
                             "--listen", f"127.0.0.1:{free_port()}"],
    "http config": lambda f: ["fleet", "--prometheus", "http://127.0.0.1:9", "--http.config.file",
                              f, "--prometheus-timeout", "1"],
    "password file": lambda f: ["fleet", "--prometheus", "http://127.0.0.1:9",
                                "--prometheus-username", "u", "--prometheus-password-file", f],
    "nvml fixture": lambda f: ["dump", "--nvml-fixture", f],
    "recording": lambda f: ["watch", "--replay", f],
    "link secret": lambda f: ["link", "test", "127.0.0.1", "--link.secret-file", f],
}  # fmt: skip
JSON_LOADERS = ("nvml fixture", "recording")
YAML_LOADERS = ("web config", "http config")


def refused(name: str, path: Path | str, *needles: str) -> str:
    argv = COMMANDS[name](str(path))
    # the daemon in its own process, as it starts; the other commands in this one
    result = (run_cli if argv[0] == "serve" else invoke_cli)(*argv, timeout=30)
    assert result.returncode == 2, (name, result.stdout[-500:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    for needle in needles:
        assert needle in line, line
    assert len(line) < 600
    return line


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_dev_zero_is_refused_before_a_byte_is_read(name: str) -> None:
    refused(name, "/dev/zero", "not a regular file (a character device)")


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    yield path


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_fifo_is_refused_not_waited_on(name: str, fifo: Path) -> None:
    """Before: the open waited for a writer, forever (the run's 30 s timeout here)."""
    if name == "link secret":
        fifo.chmod(0o600)
    refused(name, fifo, "not a regular file (a FIFO)")


@pytest.mark.parametrize("name", [*JSON_LOADERS, *YAML_LOADERS, "config"])
def test_nesting_5000_deep_is_refused(name: str, tmp_path: Path) -> None:
    path = tmp_path / "deep"
    if name in JSON_LOADERS:
        path.write_text('{"format": ' + "[" * 5000 + "]" * 5000 + "}")
    elif name == "config":
        path.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    else:
        path.write_text("basic_auth: " + "[" * 5000 + "]" * 5000 + "\n")
    refused(name, path, "nested too deeply")


@pytest.mark.parametrize("name", [*JSON_LOADERS, *YAML_LOADERS])
def test_an_integer_of_5000_digits_is_refused(name: str, tmp_path: Path) -> None:
    path = tmp_path / "digits"
    digits = "7" * 5000
    if name in JSON_LOADERS:
        path.write_text('{"format": "sparkdiag-nvml-fixture/1", "n": ' + digits + "}")
    elif name == "web config":
        path.write_text("rate_limit:\n  burst: " + digits + "\n")
    else:
        path.write_text("tls_config:\n  server_name: " + digits + "\n")
    refused(name, path, "an integer of")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_bytes_that_are_not_utf8_are_named(name: str, tmp_path: Path) -> None:
    path = tmp_path / "latin1"
    path.write_bytes(b"caf\xe9 = 1\n")
    path.chmod(0o600)
    refused(name, path, "not UTF-8 text: byte 0xe9 at offset 3")


def test_a_large_recording_is_refused_by_size(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with path.open("wb") as stream:
        stream.truncate(65 << 20)
    refused("recording", path, "larger than 64 MiB")


# -- the shared module, fuzzed ---------------------------------------------------------------------

_documents = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=15,
)
_nasty = st.sampled_from(
    [
        b"[" * 3000,
        b"{" * 3000,
        b"- " * 3000,
        b"9" * 5000,
        b"NaN",
        b"1e999",
        b"&a [*a, *a]",
        b"\xff",
        b"\x00",
        b"'" * 100,
        b'"' * 101,
    ]
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(
        st.binary(max_size=300), _nasty, _documents.map(lambda d: json.dumps(d).encode())
    )
)
def test_any_bytes_parse_or_give_one_load_error(data: bytes) -> None:
    for parse in (safeload.parse_json, safeyaml.parse_yaml, safeload.parse_toml):
        try:
            parse(data)
        except safeload.LoadError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 400


def test_the_depth_scan_agrees_with_the_parser() -> None:
    assert safeload.nesting('{"a": [1, {"b": "[[[["}]}') == 3
    assert safeload.depth(safeload.parse_json('{"a": [1, {"b": "[[[["}]}')) == 3
    assert safeload.parse_json("[" * 64 + "]" * 64) is not None
    with pytest.raises(safeload.LoadError, match="nested too deeply"):
        safeload.parse_json("[" * 65 + "]" * 65)


def test_a_fifo_is_refused_by_the_module_at_once(fifo: Path) -> None:
    proc = subprocess.run(
        [
            *sparkdiag_cmd("--version")[:1],
            "-c",
            f"from sparkdiag import safeload; safeload.read_file(__import__('pathlib').Path("
            f"{str(fifo)!r}), 10)",
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert "not a regular file (a FIFO)" in proc.stderr
