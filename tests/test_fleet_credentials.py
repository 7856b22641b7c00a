"""``sparkdiag fleet`` and its credentials (the review of 2026-12, each reproduced on 127.0.0.1):
a password in the ``--prometheus`` URL never shown, in any message or in ``--json``; basic auth
with a password and no user name sent (as Prometheus' own client sends it) and a refusal that
says what was sent; password, token and HTTP config files that others may read warned about;
a ``tls_config.server_name`` that is no host name a usage error, not a traceback; an
``HTTPS://`` URL in capitals asked over TLS."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from sparkdiag.peers.httpget import FetchError, get, shown_url, url_problem
from tests.support import invoke_cli, self_signed_cert
from tests.support.fleet import (
    GPU,
    H200,
    KERNEL,
    answer,
    peer_answers,
    query_of,
    raw_server,
    vector,
)


def fleet(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return invoke_cli("fleet", "--prometheus", url, "--prometheus-timeout", "5", *args)


def prometheus(head: bytes, sock: socket.socket) -> None:
    """A Prometheus whose one GPU is alone in its group: exit 0."""
    answers = peer_answers([({**GPU, **KERNEL, **H200}, 1.0)])
    body = answers.get(query_of(head), vector())
    sock.sendall(answer("200 OK", body, "Content-Type: application/json"))


def unauthorized(head: bytes, sock: socket.socket) -> None:
    sock.sendall(answer("401 Unauthorized", b"Unauthorized\n", 'WWW-Authenticate: Basic realm="p"'))


def secret_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


# -- 1. a password in the URL is never shown -----------------------------------------------------


@pytest.mark.parametrize(
    "userinfo",
    ["bob:Zx9/kQ2p@", "bob:9090/kQ2p@", "bob:Zx9?kQ2p@", "bob:Zx9#kQ2p@", "bob:Zx9@kQ2p@",
     "bob:Zx9kQ2p@"],
    ids=["slash", "slash-port-like", "question-mark", "hash", "at", "plain"],
)  # fmt: skip
def test_a_password_in_the_url_is_refused_and_never_shown(userinfo: str) -> None:
    """``http://bob:Zx9/kQ2p@127.0.0.1:PORT`` was shown whole in --json's "prometheus" and in
    urllib's words ("Port could not be cast to integer value as 'Zx9'"); with ``9090`` before
    the slash it was asked as host bob, port 9090. Any '@' after '//' is a user and password:
    refused (exit 2), no part of it shown, nothing sent anywhere."""
    with raw_server(prometheus) as server:
        result = fleet(f"http://{userinfo}127.0.0.1:{server.port}", "--json")
    assert result.returncode == 2, result.stderr
    said = result.stdout + result.stderr
    assert "Traceback" not in said
    for part in ("Zx9", "kQ2p", "bob"):
        assert part not in said, said
    assert json.loads(result.stdout)["prometheus"] == f"http://…@127.0.0.1:{server.port}"
    assert "taken for a user and password, which are not used" in json.loads(result.stdout)["error"]
    assert server.heads == []


def test_urllibs_words_are_never_the_message() -> None:
    """Its ValueError text quotes what it could not read: our own words instead."""
    assert url_problem("http://127.0.0.1:Zx9kQ2p") == (
        "not a URL (its port is not a number from 0 to 65535)"
    )
    assert "Zx9" not in (url_problem("http://[Zx9kQ2p") or "Zx9")
    assert url_problem("http://127.0.0.1:99999") == (
        "not a URL (its port is not a number from 0 to 65535)"
    )
    assert url_problem("https://127.0.0.1:9090/prometheus") is None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://bob:Zx9/kQ2p@127.0.0.1:9", "http://…@127.0.0.1:9"),
        ("http://bob:Zx9?kQ2p@127.0.0.1:9/x", "http://…@127.0.0.1:9/x"),
        ("http://bob:p@ss@127.0.0.1:9", "http://…@127.0.0.1:9"),
        ("bob:Zx9kQ2p@127.0.0.1:9", "…@127.0.0.1:9"),
        # an '@' of a path: no host made up from it (it showed http://admin/)
        ("http://prom:9090/@admin/", "http://…@admin/"),
        ("https://prometheus:9090/api", "https://prometheus:9090/api"),
    ],
)
def test_a_shown_url_drops_everything_to_the_last_at(url: str, shown: str) -> None:
    assert shown_url(url) == shown


# -- 3 is tests/test_fleet_connect.py; 4. a server name that is no host name ----------------------


@pytest.mark.parametrize(
    "name",
    ["prometheus..example", "a" * 64 + ".example", "a\\0b", "a\\nb", "x" * 254],
    ids=["empty-label", "label-of-64", "nul", "newline", "254-characters"],
)
def test_a_server_name_that_is_no_host_name_is_a_usage_error(tmp_path: Path, name: str) -> None:
    """Each was a traceback and exit 1 (UnicodeError from the IDNA codec, TypeError for the
    NUL, when the handshake began): now refused when the file is read, in one line."""
    config = secret_file(tmp_path / "http.yml", f'tls_config:\n  server_name: "{name}"\n')
    with raw_server(prometheus) as server:  # plain TCP: the handshake would fail after the name
        result = fleet(f"https://127.0.0.1:{server.port}", "--http.config.file", str(config))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "tls_config.server_name" in line and str(config) in line
    assert server.heads == []


def test_a_server_name_the_tls_layer_refuses_is_one_fetch_error() -> None:
    """The same names given to the client directly: a FetchError of kind tls, not a
    ValueError (only OSError was caught around wrap_socket)."""
    context = ssl.create_default_context()
    with raw_server(prometheus) as server:
        for name in ("prometheus..example", "a\0b"):
            with pytest.raises(FetchError) as caught:
                get(f"https://127.0.0.1:{server.port}/", {}, 5.0, context, 1 << 20, name)
            assert caught.value.kind == "tls"
            assert "cannot be the server name" in str(caught.value)


# -- 5. a password without a user name ------------------------------------------------------------


def test_a_password_without_a_user_name_is_sent_with_an_empty_one(tmp_path: Path) -> None:
    """Nothing was sent at all, silently; Prometheus' client (prometheus/common config,
    NewBasicAuthRoundTripper) sends basic auth with an empty user name."""
    password = secret_file(tmp_path / "password", "s3cret\n")
    config = secret_file(tmp_path / "http.yml", "basic_auth:\n  password_file: password\n")
    with raw_server(prometheus) as server:
        by_flag = fleet(server.url, "--prometheus-password-file", str(password))
        by_file = fleet(server.url, "--http.config.file", str(config))
    assert by_flag.returncode == 0, by_flag.stderr
    assert by_file.returncode == 0, by_file.stderr
    assert set(server.authorizations()) == {basic("", "s3cret")}
    assert len(server.authorizations()) == len(server.heads) > 0


def test_a_refusal_says_what_was_sent(tmp_path: Path) -> None:
    """The 401 advised "--prometheus-username and --prometheus-password-file" to a user who
    had given the password file: it says what was sent, and advises what is missing."""
    password = secret_file(tmp_path / "password", "s3cret\n")
    with raw_server(unauthorized) as server:
        no_user = fleet(server.url, "--prometheus-password-file", str(password))
        both = fleet(
            server.url, "--prometheus-username", "me", "--prometheus-password-file", str(password)
        )
        nothing = fleet(server.url)
    (line,) = no_user.stderr.strip().splitlines()
    assert no_user.returncode == 3
    assert "refused the query (HTTP 401 Unauthorized)" in line
    assert "basic auth sent (an empty user name, a password)" in line
    assert "give the user name with --prometheus-username" in line
    assert "--prometheus-password-file" not in line
    (line,) = both.stderr.strip().splitlines()
    assert "basic auth sent (user 'me', a password)" in line and "check the user name" in line
    assert "s3cret" not in line
    (line,) = nothing.stderr.strip().splitlines()
    assert "it wants credentials, and none were sent" in line


# -- 6. credentials in files others may read ------------------------------------------------------


def test_a_password_file_others_may_read_is_warned_about(tmp_path: Path) -> None:
    """A 0644 password file was used silently (link refuses such a secret file); fleet uses it
    and says so in one line, in link's words, with the fix."""
    password = secret_file(tmp_path / "password", "s3cret\n", 0o644)
    with raw_server(prometheus) as server:
        result = fleet(
            server.url, "--prometheus-username", "me", "--prometheus-password-file", str(password)
        )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"warning: {password} is mode 644: its group and other users can read it, and so learn "
        f"the password: chmod 600 {password}"
    ]
    assert server.authorizations()[0] == basic("me", "s3cret")


def test_a_token_and_an_http_config_others_may_read_are_warned_about(tmp_path: Path) -> None:
    token = secret_file(tmp_path / "token", "tok\n", 0o640)
    config = secret_file(
        tmp_path / "http.yml", "authorization:\n  credentials_file: token\n", 0o604
    )
    with raw_server(prometheus) as server:
        result = fleet(server.url, "--http.config.file", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"warning: {config} is mode 604: other users can read it, and so learn the credentials "
        f"or settings in it: chmod 600 {config}",
        f"warning: {token} is mode 640: its group can read it, and so learn the token: "
        f"chmod 600 {token}",
    ]


def test_files_of_mode_600_are_not_warned_about(tmp_path: Path) -> None:
    secret_file(tmp_path / "password", "s3cret\n")
    config = secret_file(
        tmp_path / "http.yml", "basic_auth:\n  username: me\n  password_file: password\n"
    )
    with raw_server(prometheus) as server:
        result = fleet(server.url, "--http.config.file", str(config))
    assert result.returncode == 0 and result.stderr == "", result.stderr


# -- 7. HTTPS in capitals -------------------------------------------------------------------------


def test_an_https_url_in_capitals_is_asked_over_tls(tmp_path: Path) -> None:
    """``HTTPS://`` failed with "https without a TLS context": the scheme was compared as
    typed, where urlsplit reads it in lower case."""
    self_signed_cert(tmp_path, alt_names="IP:127.0.0.1")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    with raw_server(prometheus, tls=context) as server:
        result = fleet(
            f"HTTPS://127.0.0.1:{server.port}", "--prometheus-ca-file", str(tmp_path / "tls.crt")
        )
    assert result.returncode == 0, result.stderr
    assert len(server.heads) > 0
