"""Configuration: every flag is a TOML key; bad values are errors naming key, value and range."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from sparkdiag.commands.serve import serve_settings
from sparkdiag.config import (
    OPTIONS,
    OPTIONS_BY_ATTR,
    ConfigError,
    Settings,
    build_settings,
    default_config_text,
    load_file,
)
from sparkdiag.flags import settings_from
from sparkdiag.sources.nvml.fixture import FixtureError
from tests.support import NVML, invoke_cli, run_cli


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_file_values_and_tables(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'listen = "0.0.0.0:9999"\npoll-interval = 2\n[path]\nsysfs = "/fake/sys"\n'
        '[probe]\ninterval = 600\nwhen = "always"\npython = ["python3", "-X", "utf8"]\n',
    )
    settings = build_settings(path, {})
    assert settings.listen == "0.0.0.0:9999"
    assert settings.poll_interval == 2.0
    assert settings.sysfs == Path("/fake/sys")
    assert settings.probe_interval == 600.0
    assert settings.probe_when == "always"
    assert settings.probe_python == ("python3", "-X", "utf8")


def test_flags_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "poll-interval = 2.0\npcie-interval = 30\n")
    settings = build_settings(path, {"poll_interval": 0.5})
    assert (settings.poll_interval, settings.pcie_interval) == (0.5, 30.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("poll-interval = 0", "poll-interval: 0 is out of range; allowed: 0.05 to 3600 seconds"),
        ('poll-interval = "fast"', "poll-interval: 'fast' is not a number"),
        ("pol-interval = 1", "pol-interval: unknown key; did you mean poll-interval"),
        ("zzz = 1", "zzz: unknown key; every key is listed by 'sparkdiag config default'"),
        ('[probe]\nwhen = "sometimes"', "probe.when: 'sometimes' is not allowed; allowed: one of"),
        ('[probe]\npython = "python3 \'x"', 'probe.python: "python3 \'x" cannot be split'),
        ('[probe]\ninterval = "5 minutes"', "probe.interval: '5 minutes' is not a number"),
        ("[probe]\nenabled = 1", "probe.enabled: 1 is not a boolean"),
        ('listen = "localhost"', "listen: 'localhost' is not HOST:PORT"),
        ("poll-interval = ", "not valid TOML"),
        # TOML's dates and times as the file writes them (repr said datetime.date(1979, 5, 27))
        ("poll-interval = 1979-05-27", "poll-interval: 1979-05-27 (a TOML date) is not a number"),
        ("poll-interval = 07:32:00", "poll-interval: 07:32:00 (a TOML time) is not a number"),
        # a table where a key's value goes: named as that key's bad value, not an unknown key
        ("[probe]\nenabled = {x = 1}", "probe.enabled: a table {'x': 1} is not a boolean"),
    ],
)
def test_bad_values_name_key_value_and_allowed(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_file(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read configuration .*absent\.toml"):
        load_file(tmp_path / "absent.toml")


def test_default_config_lists_every_key_and_round_trips(tmp_path: Path) -> None:
    text = default_config_text()

    def leaves(table: dict[str, object]) -> list[object]:
        return [x for v in table.values() for x in (leaves(v) if isinstance(v, dict) else [v])]

    assert leaves(tomllib.loads(text)) == []  # every key commented out, only table headers
    assert load_file(write(tmp_path, text)) == {}
    for option in OPTIONS:
        name = option.key.rpartition(".")[2]
        assert f"# {name} = " in text, option.key
    # Uncommented, the defaults load back to the default settings.
    uncommented = re.sub(r"^# (\S+ = .*?)(\s+# not set)?$", r"\1", text, flags=re.M)
    uncommented = "\n".join(
        line for line in uncommented.splitlines() if '= ""' not in line
    )  # unset optional paths stay unset
    assert build_settings(write(tmp_path, uncommented), {}) == Settings()


def test_serve_with_a_bad_config_exits_2_without_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "[probe]\ninterval = 0.5\n")
    result = run_cli("serve", "--config", str(path))
    assert result.returncode == 2
    assert "probe.interval: 0.5 is out of range; allowed: 1 to 86400 seconds" in result.stderr
    assert "Traceback" not in result.stderr


def test_config_default_and_check_commands(tmp_path: Path) -> None:
    result = invoke_cli("config", "default")
    assert result.returncode == 0 and result.stdout == default_config_text()
    good = write(tmp_path, 'listen = "127.0.0.1:10000"\n')
    ok = invoke_cli("config", "check", str(good))
    assert ok.returncode == 0 and "ok (listen 127.0.0.1:10000" in ok.stdout
    bad = write(tmp_path, "listen = 5\n")
    result = invoke_cli("config", "check", str(bad))
    assert result.returncode == 2 and "listen: 5 is not a string" in result.stderr


@pytest.mark.parametrize("name", ["missing.toml", "."])
def test_config_check_of_what_is_not_a_file_is_one_line(tmp_path: Path, name: str) -> None:
    """A directory was click's three-line usage error where a missing file was one line."""
    result = invoke_cli("config", "check", str(tmp_path / name))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: ")
    assert "Usage:" not in result.stderr and "Traceback" not in result.stderr


# A file naming what serve cannot open: each was "ok" (exit 0) for config check, then exit 2 for
# serve (exit 0, saying nothing, for the probe fixture without a GPU), and serve named a flag the
# user never gave (--nvml-fixture) rather than the file and key.
MISSING = "/nonexistent/sparkdiag-test"
SERVE_REFUSES = [
    ("nvml-fixture", f'nvml-fixture = "{MISSING}.json"', "cannot read NVML fixture"),
    ("web.config.file", f'[web.config]\nfile = "{MISSING}.yml"', "cannot read web config"),
    ("probe.fixture", f'[probe]\nfixture = "{MISSING}.json"', f"cannot read {MISSING}.json"),
    ("nvme.fixture", f'[nvme]\nfixture = "{MISSING}"', f"directory {MISSING} does not exist"),
    ("path.sysfs", f'[path]\nsysfs = "{MISSING}"', f"{MISSING} does not exist"),
    ("path.rootfs", f'[path]\nrootfs = "{MISSING}"', f"{MISSING} does not exist"),
    ("probe.container-command", '[probe]\ncontainer-command = "-"', "command is empty"),
    ("listen", 'listen = "a..b:10942"', "host 'a..b' is not a host name"),
]


@pytest.mark.parametrize(
    ("key", "text", "why"), [pytest.param(*case, id=case[0]) for case in SERVE_REFUSES]
)
def test_config_check_refuses_what_serve_refuses_naming_the_file_and_key(
    tmp_path: Path, key: str, text: str, why: str
) -> None:
    path = write(tmp_path, text + "\n")
    checked = invoke_cli("config", "check", str(path))
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert checked.stderr.startswith(f"Error: {path}: {key}: "), checked.stderr
    assert why in checked.stderr and checked.stderr.count("\n") == 1, checked.stderr
    assert "Invalid value for" not in checked.stderr  # no flag named: none was given
    try:  # serve, on this machine without a GPU, says the same line and starts nothing
        served = run_cli("serve", "--config", str(path), timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve started with {text!r}, which config check refused")
    assert (served.returncode, served.stderr) == (2, checked.stderr)


def test_a_flag_over_the_file_is_named_as_the_flag(tmp_path: Path) -> None:
    path = write(tmp_path, f'nvml-fixture = "{MISSING}.json"\n')
    given = {"nvml_fixture": str(MISSING) + "-flag.json"}
    with pytest.raises(FixtureError) as info:
        serve_settings(path, dict(given))
    assert info.value.flag == "--nvml-fixture" and f"{MISSING}-flag.json" in info.value.message
    good = {"nvml_fixture": str(NVML / "h200-idle.json")}  # a good flag: the file's value unused
    assert serve_settings(path, dict(good)).nvml_fixture == NVML / "h200-idle.json"
    assert serve_settings(write(tmp_path, ""), {}).nvml_fixture is None


def test_each_line_of_the_default_config_uncommented_alone_loads(tmp_path: Path) -> None:
    """A user uncomments one line of ``config default`` to change it: each line must load as is
    (an unset key written ``""`` means not set), to the option's default."""
    table = ""
    lines = default_config_text().splitlines()
    tried = 0
    for line in lines:
        if line.startswith("["):
            table = line
        elif line.startswith("# ") and " = " in line and not line.startswith("# sparkdiag"):
            body = line[2:]
            if " Allowed: " in body:  # a help line that happens to hold " = "
                continue
            path = write(tmp_path, f"{table}\n{body}\n")
            values = load_file(path)
            ((attr, value),) = values.items()
            option = OPTIONS_BY_ATTR[attr]
            expected = (
                option.default if option.default is None else option.convert(option.default, "")
            )
            assert value == expected, body
            tried += 1
    assert tried == len(OPTIONS)


def test_durations_with_units_in_the_file_and_flags(tmp_path: Path) -> None:
    path = write(tmp_path, '[probe]\ninterval = "5m"\ntimeout = "1m30s"\n')
    settings = build_settings(path, {"poll_interval": "2s"})
    assert (settings.probe_interval, settings.probe_timeout) == (300.0, 90.0)
    assert settings.poll_interval == 2.0


def test_an_argument_list_as_one_string_reads_the_same_in_the_file_and_as_a_flag(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, '[probe]\npython = "python3 -X utf8"\n')
    from_file = build_settings(path, {})
    listed = write(tmp_path, '[probe]\npython = ["python3", "-X", "utf8"]\n')
    from_list = build_settings(listed, {})
    from_flag = settings_from("serve", {"probe_python": "python3 -X utf8"})
    assert from_file.probe_python == from_list.probe_python == from_flag.probe_python
    assert from_file.probe_python == ("python3", "-X", "utf8")


def test_the_default_config_fits_80_columns() -> None:
    """Issue 32: its comments ran to 300 characters on one line."""
    for line in default_config_text().splitlines():
        assert len(line) <= 80, line


def test_an_option_with_several_defaults_says_why_in_its_help() -> None:
    """probe.timeout has a default per command (60, 25, 120, 1800): its help names each."""
    for option in OPTIONS:
        for command, value in option.command_default.items():
            if option.kind == "float":
                assert f"{command} {value:g}" in option.help, (option.key, command)


def test_a_key_given_twice_is_named_with_what_to_do(tmp_path: Path) -> None:
    """tomllib's "Cannot overwrite a value (at line 2, column 18)" named neither the key nor the
    fix: the line is quoted and the duplicate named as such."""
    path = tmp_path / "c.toml"
    path.write_text("poll-interval = 2\npoll-interval = 3\n")
    with pytest.raises(ConfigError) as caught:
        load_file(path)
    assert str(caught.value) == (
        f"{path}: not valid TOML: Cannot overwrite a value (line 2, column 18: "
        "'poll-interval = 3'): a key or table is given twice; keep one"
    )
    # the line quoted is tomllib's line: a comment holding U+2028 (a line break to
    # str.splitlines, not to TOML) quoted the line before it
    path.write_text('# note\u2028more\nlog-level = "info"\nlog-level = "debug"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"line 3, column 20: 'log-level = \"debug\"'"):
        load_file(path)


def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    """A file saved as "UTF-8 with BOM" was refused as "Invalid statement (at line 1, column
    1)"; the mark is no content."""
    path = tmp_path / "c.toml"
    path.write_bytes("\ufeffpoll-interval = 2\n".encode())
    assert load_file(path) == {"poll_interval": 2.0}


def test_config_default_says_which_commands_read_each_key_from_the_file() -> None:
    """'peer = "spark-2"' passed config check and the daemon did nothing with it; then config
    default said "Read by check, not by serve", yet check takes no --config: a peer in the file
    was read by nothing. Each key serve does not read says who reads it from this file: fleet
    (with --config), or no command (a flag of check and link only)."""
    from sparkdiag.config import CONFIG_FILE_COMMANDS, OPTIONS, default_config_text

    text = " ".join(line.lstrip("# ") for line in default_config_text().splitlines())
    assert "Read by check" not in text and "Read by check, link" not in text
    assert "read by 'serve --config FILE'; 'fleet --config FILE' reads the keys" in text
    for option in OPTIONS:
        readers = option.scopes & CONFIG_FILE_COMMANDS
        if "serve" in readers:
            continue
        if readers == {"fleet"}:
            said = "Read from this file by fleet (with --config), not by serve."
        else:
            assert not readers, option.key
            said = "Not read from this file by any command: a flag of"
        assert f"Allowed: {option.allowed()}. {said}" in text, option.key
    assert "Not read from this file by any command: a flag of check (--peer)." in text
    assert (
        "Not read from this file by any command: a flag of check and link (--link.secret-file)."
        in text
    )
    assert text.count("Read from this file by fleet (with --config)") == 9


def test_the_commands_that_read_a_configuration_file_are_those_with_config() -> None:
    """CONFIG_FILE_COMMANDS, which config default and config check go by, is what the CLI gives
    --config to (settings_options(..., config_file=True))."""
    import click

    from sparkdiag.cli import main
    from sparkdiag.config import CONFIG_FILE_COMMANDS

    def commands(group: click.Group, path: str = "") -> list[tuple[str, click.Command]]:
        found = []
        context = click.Context(group)
        for name in group.list_commands(context):  # the CLI loads its commands lazily
            command = group.get_command(context, name)
            assert command is not None, name
            if isinstance(command, click.Group):
                found += commands(command, f"{path}{name} ")
            else:
                found.append((f"{path}{name}", command))
        return found

    with_config = {
        name
        for name, command in commands(main)
        if any("--config" in p.opts for p in command.params)
    }
    assert with_config == CONFIG_FILE_COMMANDS


@pytest.mark.parametrize(
    ("text", "key", "inside"),
    [
        ("probe = 3\n", "probe", "(enabled, interval, when ...;"),
        ('path = "/sys"\n', "path", "(sysfs, rootfs;"),
        ("[web]\nconfig = 1\n", "web.config", "(file;"),
    ],
)
def test_a_value_given_to_a_table_is_named_a_table(
    tmp_path: Path, text: str, key: str, inside: str
) -> None:
    """'probe = 3' said "probe: unknown key; did you mean probe.when?": probe is a table."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_file(path)
    said = str(info.value)
    assert said.startswith(f"{path}: {key}: a table ([{key}]), not a value: set its keys under")
    assert inside in said and "did you mean" not in said and "unknown key" not in said
    checked = invoke_cli("config", "check", str(path))
    assert checked.returncode == 2 and f"{key}: a table ([{key}])" in checked.stderr


@pytest.mark.parametrize(
    ("text", "key", "flag"),
    [
        ('peer = "spark-2"\n', "peer", "a flag of check (--peer) only"),
        (
            '[link]\nsecret-file = "/etc/sparkdiag/link.secret"\n',
            "link.secret-file",
            "a flag of check and link (--link.secret-file) only",
        ),
    ],
)
def test_config_check_warns_of_a_key_no_command_reads_from_a_file(
    tmp_path: Path, text: str, key: str, flag: str
) -> None:
    """A peer in config.toml was read by nothing (check and link take no --config), and config
    check said ok. It still exits 0 (its --help: 0 when every key and value is allowed), with a
    warning naming the key and the flag to give instead."""
    path = write(tmp_path, text)
    said: list[str] = []
    load_file(path, say=said.append)
    assert said == [
        f"warning: {path}: {key}: no command reads this key from a configuration file: it is "
        f"{flag}; give it there, and remove it here"
    ]
    checked = invoke_cli("config", "check", str(path))
    assert checked.returncode == 0 and f"{path}: ok (listen" in checked.stdout
    assert checked.stderr == said[0] + "\n"


def test_a_key_fleet_reads_from_the_file_is_not_warned_of(tmp_path: Path) -> None:
    path = write(tmp_path, 'prometheus = "http://prom:9090"\npoll-interval = 2\n')
    said: list[str] = []
    assert load_file(path, say=said.append) == {
        "prometheus_url": "http://prom:9090",
        "poll_interval": 2.0,
    }
    assert said == []
    checked = invoke_cli("config", "check", str(path))
    assert (checked.returncode, checked.stderr) == (0, "")
