"""Bad input to the configuration, the web config and the listen address: one clear line and
exit 2, never a traceback, never an unbounded read or echo."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkdiag.config import ECHO, OPTIONS_BY_KEY, ConfigError, build_settings, load_file
from sparkdiag.web.webconfig import WebConfigError, load_web_config
from tests.support import NVML, ROOT, assert_clean_error, invoke_cli, resolver_answers, run_cli

FIXTURE = ["--nvml-fixture", str(NVML / "h200-idle.json"), "--no-probe.enabled"]


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "listen", ["127.0.0.1:٣", "127.0.0.1:²", "127.0.0.1:１０９４２", "é:10942"]
)
def test_non_ascii_listen_values_are_refused(listen: str) -> None:
    result = run_cli("serve", *FIXTURE, "--listen", listen)
    assert_clean_error(result, 2, "is not HOST:PORT")


def test_a_listen_host_that_is_no_host_name_exits_2() -> None:
    result = run_cli("serve", *FIXTURE, "--listen", "a..b:10942")
    assert_clean_error(result, 2, "listen: host 'a..b' is not a host name")


def test_an_unresolvable_listen_host_exits_2() -> None:
    resolver_answers("sparkdiag-test.invalid")
    result = run_cli("serve", *FIXTURE, "--listen", "sparkdiag-test.invalid:10942")
    assert_clean_error(result, 2, "listen: host 'sparkdiag-test.invalid' does not resolve")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[web]\nmax-requests = 0.9\n", "web.max-requests: 0.9 is not an integer"),
        ('[web]\nmax-requests = "0.9"\n', "web.max-requests: '0.9' is not an integer"),
        ('[web]\nmax-requests = "٣"\n', "is not an integer"),
        ("[web]\nmax-requests = 1e5\n", "web.max-requests: 100000 is out of range"),
        ("[web]\nmax-connections = 0\n", "web.max-connections: 0 is out of range"),
        ("[web]\nread-timeout = 0\n", "web.read-timeout: 0 is out of range"),
        ("poll-interval = " + "9" * 400 + "\n", "poll-interval: 999999"),
        ("poll-interval = nan\n", "poll-interval: nan is not finite"),
        ("a = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        ("a = " + "{b=" * 3000 + "1" + "}" * 3000 + "\n", "nested too deeply"),
        ("[" + ".".join(["a"] * 3000) + "]\nx = 1\n", "nested too deeply"),
        ("poll-interval = 1" + "0" * 5000 + "\n", "not valid TOML"),
    ],
)
def test_bad_config_values(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_file(toml(tmp_path, text))
    assert message in str(info.value)
    assert len(str(info.value)) < 400 + len(str(tmp_path))


def test_integer_options_take_integral_numbers(tmp_path: Path) -> None:
    settings = build_settings(
        toml(tmp_path, "[web]\nmax-requests = 2.0\nmax-connections = 9\n"), {}
    )
    assert settings.web_max_requests == 2 and isinstance(settings.web_max_requests, int)
    assert settings.web_max_connections == 9
    option = OPTIONS_BY_KEY["web.max-requests"]
    assert option.convert(" 7 ", "") == 7
    for bad in (0.9, "0.9", "1_0", "--5", "0x10", True, [1], "٣"):
        with pytest.raises(ConfigError):
            option.convert(bad, "")


def test_integer_flag_rejects_fractions() -> None:
    result = run_cli("serve", *FIXTURE, "--web.max-requests", "0.9")
    assert_clean_error(result, 2, "web.max-requests")


def test_huge_bad_values_are_echoed_in_part(tmp_path: Path) -> None:
    huge = "x" * 100_000
    result = run_cli("serve", *FIXTURE, "--listen", huge)
    assert_clean_error(result, 2, "is not HOST:PORT", "'" + "x" * (ECHO - 1) + "…")
    assert len(result.stderr) < 1000
    with pytest.raises(ConfigError) as info:
        load_file(toml(tmp_path, f'[probe]\nwhen = "{huge}"\n'))
    assert len(str(info.value)) < 300 + len(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        load_file(toml(tmp_path, f'"{huge}" = 1\n'))
    assert len(str(info.value)) < 1000 + len(str(tmp_path))


def test_config_from_an_endless_file_is_refused() -> None:
    result = run_cli("serve", "--config", "/dev/zero", *FIXTURE, timeout=60)
    assert_clean_error(result, 2, "/dev/zero: not a regular file (a character device)")


def test_web_config_from_an_endless_file_is_refused() -> None:
    with pytest.raises(WebConfigError, match=r"not a regular file \(a character device\)"):
        load_web_config(Path("/dev/zero"))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xfe", "not UTF-8 text"),
        (b"[" * 5000, "nested too deeply"),
        (b"a: " + b"[" * 3000 + b"]" * 3000, "nested too deeply"),
        (b"1: a\nb: c\n", "unknown key(s) 1, b"),
        (
            b"tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS10\n",
            "min_version: TLS10 is not supported",
        ),
        (b"tls_server_config:\n  cert_file: [1]\n  key_file: b\n", "cert_file: [1] is not a path"),
        (b'tls_server_config:\n  cert_file: "a\\0b"\n  key_file: b\n', "is not a path"),
        (
            b"tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: [TLS13]\n",
            "min_version: unknown TLS version ['TLS13']",
        ),
        (b"basic_auth_users:\n  " + b"u" * 5000 + b": x\n", "(line 2, column 5003)"),
        # plain mistakes
        (
            b"tls_server_config:\n  key_file: x.key\n",
            "tls_server_config.cert_file: missing one of cert or cert_file",
        ),
        (b"tls_server_config:\n  cert_file: no.crt\n  key_file: no.key\n", "cannot load cert_file"),
        (b"basic_auth_users:\n  bob: plaintext\n", "basic_auth_users.bob: not a bcrypt hash"),
        (b"tls_config: {}\n", "unknown key(s) tls_config"),
        (b"basic_auth_users: [\n", "not valid YAML"),
    ],
)
def test_bad_web_configs(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "web.yml"
    path.write_bytes(data)
    with pytest.raises(WebConfigError) as info:
        load_web_config(path)
    assert message in str(info.value)
    assert len(str(info.value)) < 600 + len(str(path))


@pytest.mark.parametrize(
    "data",
    [
        b"basic_auth_users:\n  alice: 'S3cretPassw0rd\n",  # an unclosed quote
        b"basic_auth_users:\n  alice: S3cretPassw0rd: more\n",  # a colon in the value
        b"basic_auth_users:\n  alice: [S3cretPassw0rd\n",
    ],
)
def test_a_yaml_syntax_error_names_the_place_not_the_line(tmp_path: Path, data: bytes) -> None:
    """PyYAML's message quotes the offending line, and a web config's line may hold a password
    or a hash: the error (printed at start, logged at every reload) gives line and column only
    (the hostile-client review)."""
    path = tmp_path / "web.yml"
    path.write_bytes(data)
    with pytest.raises(WebConfigError) as info:
        load_web_config(path)
    said = str(info.value)
    assert "not valid YAML" in said and "(line 2, column " in said
    assert "S3cret" not in said


@pytest.mark.parametrize(
    "args",
    [
        ("watch", "--interval", "nan", "--", "true"),
        ("watch", "--duration", "nan", "--", "true"),
        ("soak", "--device", "cpu", "--small", "--window", "inf"),
        ("link", "test", "127.0.0.1", "--connect-timeout", "nan"),
        ("link", "test", "127.0.0.1", "--duration", "nan"),
        ("compare", "--budget-seconds", "nan", "--", "true"),
        ("baseline", "pin", "--all", "--tflops", "nan"),
        ("check", "--nvml-timeout", "nan"),
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_nan_and_infinity_are_usage_errors(args: tuple[str, ...]) -> None:
    """click's FloatRange lets NaN through every bound (watch --interval nan ticked at full
    speed; link test --connect-timeout nan was a traceback; soak --window nan exit 3: the
    bad-input review): every float flag is a FiniteRange."""
    result = invoke_cli(*args)
    assert_clean_error(result, 2, "is not a finite number")


def test_every_float_flag_of_every_command_is_a_finite_range() -> None:
    """check --nvml-timeout was a plain FloatRange, and --nvml-timeout nan a traceback from the
    deadline thread's join (a review): no command's float flag may be one."""
    import click

    from sparkdiag.cli import main
    from sparkdiag.flags import FiniteRange

    def commands(command: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
        yield path, command
        if isinstance(command, click.Group):  # the commands are imported when asked for
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                yield from commands(sub, f"{path} {name}".strip())

    seen = list(commands(main, ""))
    plain = [
        f"{path} {param.opts[0]}"
        for path, command in seen
        for param in command.params
        if isinstance(param.type, click.FloatRange) and not isinstance(param.type, FiniteRange)
    ]
    assert plain == []
    assert len(seen) > 20  # the walk reached the commands, not the group alone


@pytest.mark.parametrize("value", ["0", "-5", "1e308"])
def test_baseline_pin_takes_a_plausible_figure_only(value: str) -> None:
    """--tflops 0, -5 or 1e308 was a traceback (or, 1e308, a baseline every probe fell short
    of): a usage error before the store is opened."""
    result = invoke_cli("baseline", "pin", "--all", "--tflops", value)
    assert_clean_error(result, 2, "--tflops")


def test_check_peer_that_does_not_resolve_names_peer_not_link_test_s_argument() -> None:
    """It was a FAIL row 'Invalid value for PEER' (link test's argument) with the advice to
    start link serve on a machine whose name does not exist (the bad-input review)."""
    resolver_answers("no-such-host.invalid")
    result = run_cli("check", "--peer", "no-such-host.invalid", "--nvml-fixture",
                     str(NVML / "h200-idle.json"), timeout=60)  # fmt: skip
    assert_clean_error(result, 2, "Invalid value for '--peer': 'no-such-host.invalid'")
    assert "link serve" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("probe", "--device", "cpu", "--dtype", ",,,"), "no dtype named"),
        (("compare", "--container", ""), "give the container command after --container"),
    ],
)
def test_an_empty_value_is_not_taken_for_a_default(args: tuple[str, ...], said: str) -> None:
    """--dtype ,,, meant every dtype; --container '' ran the container side and failed with
    exit 3 (the bad-input review): both are usage errors."""
    assert_clean_error(invoke_cli(*args), 2, said)


def test_assets_with_an_empty_image_is_a_usage_error(tmp_path: Path) -> None:
    """--image '' silently wrote the default image into the manifests (the bad-input review)."""
    result = invoke_cli("assets", "--kubernetes", "--image", "", str(tmp_path / "out"))
    assert_clean_error(result, 2, "--image is empty")
    assert not (tmp_path / "out").exists()


def test_check_peer_with_a_missing_secret_is_a_row_not_a_stop(tmp_path: Path) -> None:
    """The --peer usage error above must not take the link secret's problems with it: a
    missing secret stays a FAIL row of a check that ran (the review of that fix)."""
    result = run_cli("check", "--peer", "127.0.0.1", "--link.secret-file", str(tmp_path / "none"),
                     "--nvml-fixture", str(NVML / "h200-idle.json"), "--probe.fixture",
                     str(ROOT / "tests/fixtures/probe/h200-default.json"), timeout=60)  # fmt: skip
    assert result.returncode == 3, result.stderr
    words = " ".join(result.stdout.split())
    assert "link-peer" in words and "--link.secret-file" in words


@pytest.mark.parametrize("text", ["1x1x\u00b2", "1x1x" + "1" * 5000, "1x1x1234567890"])
def test_a_shape_of_other_digits_or_too_many_is_a_usage_error(text: str) -> None:
    from sparkdiag.probe.worker.contract import UsageError, parse_shape

    with pytest.raises(UsageError):
        parse_shape(text)
    assert_clean_error(invoke_cli("probe", "--device", "cpu", "--shape", text), 2, "--shape")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("check", "--quick", "--storage", ""), "'--storage'"),
        (("check", "--quick", "--state-dir", ""), "'--state-dir'"),
        (("check", "--quick", "--nvml-fixture", ""), "'--nvml-fixture'"),
        (("dump", "--path.sysfs", ""), "'--path.sysfs'"),
        (("assets", ""), "'DIRECTORY'"),
        (("watch", "--plot", "", "--", "true"), "'--plot'"),
        (("watch", "--replay", ""), "'--replay'"),
        (("serve", "--config", ""), "'--config'"),
        (("config", "check", ""), "'FILE'"),
        (("record-fixture", ""), "'OUTPUT'"),
        (("soak", "--device", "cpu", "--json", ""), "'--json'"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, tuple) else a,
)
def test_an_empty_path_is_a_usage_error_naming_the_flag(
    args: tuple[str, ...], named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in a review: click.Path turns '' into '.', so an unset variable ('--storage
    "$DIR"') wrote a test file, assets or state into the current directory, and a file option
    said "Error: .: not a regular file (a directory)"."""
    from click.testing import CliRunner

    from sparkdiag.cli import main

    monkeypatch.chdir(tmp_path)  # where '' wrote before
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {named}" in result.stderr and "is empty" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_every_path_parameter_refuses_an_empty_value() -> None:
    """Every path flag and argument of every command goes through the one path type that
    refuses '' (found in a review), so a new one cannot forget it. storage's DIR is a plain
    string that the command refuses itself, with its own advice."""
    import click

    from sparkdiag.cli import main

    def walk(command: click.Command, path: tuple[str, ...]) -> list[tuple[str, click.Parameter]]:
        found = [(" ".join(path), p) for p in command.params if isinstance(p.type, click.Path)]
        for name, sub in getattr(command, "commands", {}).items():
            found += walk(sub, (*path, name))
        return found

    params = [
        (where, p) for where, p in walk(main, ()) if (where, p.name) != ("storage", "directory")
    ]
    assert len(params) > 30
    ctx = click.Context(main)
    for where, param in params:
        with pytest.raises(click.BadParameter, match="is empty"):
            param.type.convert("", param, ctx)
            pytest.fail(f"{where} {param.name} took ''")


def test_assets_into_a_path_under_a_file_says_so_in_one_line(tmp_path: Path) -> None:
    """It said "Error: [Errno 20] Not a directory: '.../x/prometheus'", Python's exception text
    (found in a review)."""
    (tmp_path / "afile").write_text("")
    done = invoke_cli("assets", str(tmp_path / "afile" / "x"))
    assert done.returncode == 3
    assert done.stderr == f"Error: cannot write {tmp_path}/afile/x/prometheus: Not a directory\n"


def test_check_peer_warns_of_a_secret_in_a_directory_others_may_write(tmp_path: Path) -> None:
    """link test warned of such a directory and check --peer did not (a review of the day's
    change): both say it on stderr."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    secret = shared / "link.secret"
    secret.write_text("ab" * 32 + "\n", encoding="utf-8")
    secret.chmod(0o600)
    result = run_cli("check", "--peer", "127.0.0.1:1", "--link.secret-file", str(secret),
                     "--nvml-fixture", str(NVML / "h200-idle.json"), "--probe.fixture",
                     str(ROOT / "tests/fixtures/probe/h200-default.json"), timeout=60)  # fmt: skip
    assert f"the directory {shared} of the link secret is mode 777" in result.stderr
