"""Property-based tests: whatever the configuration file, the web config, the flags or the
listen address hold, the loaders give settings or one ConfigError / WebConfigError, never
another exception (a traceback for the user)."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sparkdiag.config import (
    ECHO,
    OPTIONS,
    ConfigError,
    Settings,
    build_settings,
    parse_listen,
)
from sparkdiag.web.webconfig import WebConfig, WebConfigError, load_web_config
from tests.support.fuzz import examples

FUZZ = settings(
    max_examples=examples(400),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
BOUND = ECHO + 400  # an error line: key, an echoed value of at most ECHO characters, the rule


def scratch(data: bytes, name: str) -> Path:
    directory = Path(tempfile.mkdtemp(prefix="fuzz-"))
    path = directory / name
    path.write_bytes(data)
    return path


# -- values of every kind that a TOML or YAML document or a flag can carry -----------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["0.9", "٣", "1e999", "nan", "-0", "+5", "1_000", "127.0.0.1:99999", ":0"]),
    st.sampled_from([10**400, -(10**400), 0.9, 2.0, 1e308]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
option_keys = [o.key for o in OPTIONS]
key_parts = st.one_of(
    st.sampled_from(sorted({k.partition(".")[0] for k in option_keys})),
    st.sampled_from([k.rpartition(".")[2] for k in option_keys]),
    st.text(max_size=12),
)


def toml_value(value: Any) -> str:
    """A TOML inline value (strings as JSON strings, which TOML basic strings accept)."""
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


documents = st.dictionaries(
    key_parts,
    st.one_of(values, st.dictionaries(key_parts, values, max_size=5)),
    max_size=6,
)


def toml_document(doc: dict[str, Any]) -> str:
    lines = [
        f"{json.dumps(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)
    ]
    for table, body in doc.items():
        if isinstance(body, dict):
            lines.append(f"[{json.dumps(table)}]")
            lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def settings_or_config_error(path: Path) -> None:
    try:
        result = build_settings(path, {})
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < BOUND + len(str(path)) + 300, message[:200]
        event("ConfigError")
    else:
        assert isinstance(result, Settings)
        event("settings")


@FUZZ
@given(st.binary(max_size=600))
def test_any_bytes_as_the_config_file(data: bytes) -> None:
    settings_or_config_error(scratch(data, "config.toml"))


@FUZZ
@given(documents)
def test_any_toml_document_as_the_config_file(doc: dict[str, Any]) -> None:
    settings_or_config_error(scratch(toml_document(doc).encode("utf-8", "surrogatepass"), "c.toml"))


@FUZZ
@given(st.dictionaries(st.sampled_from([o.attr for o in OPTIONS]), values, max_size=5))
def test_any_flag_values(flags: dict[str, Any]) -> None:
    try:
        result = build_settings(None, flags)
    except ConfigError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < BOUND + 300
        event("ConfigError")
    else:
        assert isinstance(result, Settings)
        event("settings")


@FUZZ
@given(st.one_of(st.text(max_size=60), st.from_regex(r"\[?[0-9a-z:.\]]{0,20}:[0-9٣²]{1,7}")))
def test_any_listen_value(value: str) -> None:
    try:
        host, port = parse_listen(value)
    except ConfigError as exc:
        assert len(str(exc)) < BOUND + 100
        event("ConfigError")
    else:
        event("address")
        assert 0 < port < 65536 and port_text_is_ascii(value)
        assert isinstance(host, str)


def port_text_is_ascii(value: str) -> bool:
    return value.rpartition(":")[2].isascii()


@FUZZ
@given(st.one_of(st.binary(max_size=600), st.text(max_size=300).map(str.encode)))
def test_any_bytes_as_the_web_config(data: bytes) -> None:
    web_config_or_error(scratch(data, "web.yml"))


web_documents = st.fixed_dictionaries(
    {},
    optional={
        "tls_server_config": st.one_of(
            values,
            st.dictionaries(
                st.sampled_from(
                    [
                        "cert_file",
                        "key_file",
                        "min_version",
                        "client_ca_file",
                        "client_auth_type",
                        "cipher_suites",
                    ]
                ),
                st.one_of(values, st.sampled_from(["TLS13", "RequireAndVerifyClientCert", "x"])),
            ),
        ),
        "basic_auth_users": st.one_of(
            values,
            st.dictionaries(
                st.one_of(st.text(max_size=10), st.integers()),
                st.one_of(
                    values,
                    st.from_regex(r"\$2[aby]\$[0-9]{2}\$[./A-Za-z0-9]{50,55}", fullmatch=True),
                ),
            ),
        ),
        "http_server_config": values,
    },
)
# Now and then a key that does not belong, of another type than str (YAML allows any).
web_documents_with_extras = st.builds(
    lambda doc, extra: {**doc, **extra},
    web_documents,
    st.one_of(
        st.just({}),
        st.just({}),
        st.just({}),
        st.dictionaries(st.one_of(st.integers(0, 3), st.just("other")), values, max_size=1),
    ),
)


@FUZZ
@given(web_documents_with_extras)
def test_any_yaml_document_as_the_web_config(doc: dict[str, Any]) -> None:
    web_config_or_error(scratch(yaml.safe_dump(doc).encode(), "web.yml"))


def web_config_or_error(path: Path) -> None:
    try:
        result = load_web_config(path)
    except WebConfigError as exc:
        assert "\n" not in str(exc), str(exc)[:200]
        assert len(str(exc)) < 2 * BOUND + len(str(path)) * 3 + 600, str(exc)[:200]
        event("WebConfigError: " + str(exc).partition(": ")[2][:24])
    else:
        assert isinstance(result, WebConfig)
        event("web config")
