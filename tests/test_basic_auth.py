"""Basic auth cannot be knocked over: every credential gets 401 or 200 (503 only when bcrypt is
saturated), hashes are checked whole at load, bcrypt runs once per credential and in a bounded
pool, so wrong passwords cannot take scrapes' slots."""

from __future__ import annotations

import base64
import contextlib
import http.client
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkdiag.web import http as exporter_http
from sparkdiag.web.basicauth import (
    MAX_PASSWORD_BYTES,
    BasicAuth,
    Credential,
    hash_problem,
    parse_basic,
)
from sparkdiag.web.http import ExporterServer
from sparkdiag.web.webconfig import WebConfig, WebConfigError, load_web_config
from tests.support import assert_clean_error, run_cli, serving
from tests.support.fuzz import examples

PASSWORD = "s3cret"
# a fixed salt (cost 4): the malformed cases below are test ids, the same in every process
# (pytest-xdist's workers must collect the same tests)
HASH = bcrypt.hashpw(PASSWORD.encode(), b"$2b$04$DnS8FElJFWDI/MjogrefsO")


def header(user: str, password: str | bytes, scheme: str = "Basic") -> str:
    raw = password if isinstance(password, bytes) else password.encode()
    return f"{scheme} " + base64.b64encode(user.encode() + b":" + raw).decode()


@contextlib.contextmanager
def auth_server(**kwargs: Any) -> Iterator[ExporterServer]:
    with serving(web=WebConfig(users={"prometheus": HASH}), **kwargs) as server:
        yield server


def status(server: ExporterServer, authorization: str | None) -> int:
    """The answer to one GET /metrics; a dropped connection raises."""
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": authorization or ""})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_every_credential_gets_401_or_200() -> None:
    with auth_server() as server:
        assert status(server, header("prometheus", PASSWORD)) == 200
        assert status(server, header("prometheus", PASSWORD, scheme="basic")) == 200
        assert status(server, header("prometheus", PASSWORD, scheme="BASIC")) == 200
        assert status(server, "  Basic   " + header("prometheus", PASSWORD)[6:] + " ") == 200
        for bad in (
            header("prometheus", "x" * (MAX_PASSWORD_BYTES + 1)),  # bcrypt 5 would raise
            header("prometheus", PASSWORD + "x" * 80),  # the right 72 bytes and more
            header("prometheus", "x" * 5000),
            header("prometheus", b"\xff\xfe\x00"),
            header("nobody", PASSWORD),
            header("prometheus", ""),
            header("", ""),
            "Basic",
            "Basic %%%",
            "Basic " + base64.b64encode(b"no colon").decode(),
            "Basic " + base64.b64encode(b"\xff\xfe:pw").decode(),  # user not UTF-8
            "Bearer abc",
            "",
            None,
        ):
            assert status(server, bad) == 401, (bad or "")[:60]
        # A header too long for the request head is refused as such, not dropped.
        assert status(server, header("prometheus", "x" * 10_000)) == 431


def test_a_password_over_72_bytes_is_refused_without_bcrypt() -> None:
    auth = BasicAuth({"prometheus": HASH})
    assert auth.decide(header("prometheus", "y" * 73)) is False
    assert auth.bcrypt_runs == 0


def test_bcrypt_runs_once_per_credential() -> None:
    auth = BasicAuth({"prometheus": HASH})
    for _ in range(3):
        assert auth.authorized(header("prometheus", PASSWORD))
        assert not auth.authorized(header("prometheus", "wrong"))
        assert not auth.authorized(header("nobody", "wrong"))
    assert auth.bcrypt_runs == 3  # one each; the repeats are answered from memory
    assert not auth.authorized(header("prometheus", PASSWORD + "!"))  # not a prefix match
    assert auth.bcrypt_runs == 4


def test_unknown_users_cost_bcrypt_like_known_ones() -> None:
    auth = BasicAuth({"prometheus": HASH})
    answer = auth.decide(header("nobody", PASSWORD))
    assert isinstance(answer, Credential)  # not answered at once: timing tells nothing
    assert auth.verify(answer) is False
    assert auth.bcrypt_runs == 1


def test_a_flood_of_wrong_passwords_cannot_starve_scrapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """bcrypt is held busy; wrong passwords queue up to AUTH_QUEUE, the next get 503 at once,
    and a scrape with the remembered right password is served meanwhile."""
    monkeypatch.setattr(exporter_http, "AUTH_QUEUE", 3)
    gate = threading.Event()
    entered = threading.Semaphore(0)
    real_verify = BasicAuth.verify

    def slow_verify(self: BasicAuth, credential: Credential) -> bool:
        if credential.password != PASSWORD.encode():
            entered.release()
            gate.wait(10)
        return real_verify(self, credential)

    monkeypatch.setattr(BasicAuth, "verify", slow_verify)
    with auth_server(max_requests=2) as server:
        assert status(server, header("prometheus", PASSWORD)) == 200  # remembered from now on
        answers: list[int] = []
        flood = [
            threading.Thread(target=lambda i=i: answers.append(status(server, header("p", f"{i}"))))
            for i in range(3)
        ]
        for thread in flood:
            thread.start()
        for _ in range(exporter_http.AUTH_WORKERS):
            assert entered.acquire(timeout=10)  # bcrypt's workers are all held
        threading.Event().wait(0.2)  # the third waits in the queue
        assert status(server, header("q", "one more")) == 503  # the queue is full: at once
        assert status(server, header("prometheus", PASSWORD)) == 200  # scrapes go on
        gate.set()
        for thread in flood:
            thread.join(10)
        assert sorted(answers) == [401, 401, 401]


@pytest.mark.parametrize(
    ("hashed", "problem"),
    [
        ("$2y$10$abc", "malformed"),
        ("$2y$10$" + "a" * 60, "malformed"),
        ("$2y$99$" + HASH.decode()[7:], "cost 99 is out of range"),
        ("$2y$03$" + HASH.decode()[7:], "cost 03 is out of range"),
        ("$2y$10$" + "!" + HASH.decode()[8:], "malformed"),
        (HASH.decode()[:28] + "P" + HASH.decode()[29:], "malformed"),  # salt not canonical
        (HASH.decode()[:-1] + "b", "malformed"),  # hash not canonical
        ("$2x$" + HASH.decode()[4:], "expected $2a$, $2b$ or $2y$"),
        ("plaintext", "expected $2a$, $2b$ or $2y$"),
        (12345, "not a string"),
    ],
)
def test_malformed_hashes_are_refused_at_load(tmp_path: Path, hashed: object, problem: str) -> None:
    assert problem in (hash_problem(hashed) or "")
    path = tmp_path / "web.yml"
    value = hashed if isinstance(hashed, int) else f"'{hashed}'"
    path.write_text(f"basic_auth_users:\n  alice: {value}\n")
    with pytest.raises(WebConfigError, match=r"basic_auth_users\.alice: not a bcrypt hash"):
        load_web_config(path)


def test_a_malformed_hash_is_a_startup_error_naming_the_user(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n  alice: '$2y$10$tooshort'\n")
    result = run_cli("serve", "--web.config.file", str(path), "--no-probe.enabled")
    assert_clean_error(result, 2, "basic_auth_users.alice: not a bcrypt hash", "malformed")


def test_user_names_with_a_colon_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  'a:b': '{HASH.decode()}'\n")
    with pytest.raises(WebConfigError, match="cannot contain ':'"):
        load_web_config(path)


def test_accepted_hash_formats() -> None:
    for prefix in ("$2a$", "$2b$", "$2y$"):
        hashed = prefix + HASH.decode()[4:]
        assert hash_problem(hashed) is None
        assert BasicAuth({"u": hashed.encode()}).authorized(header("u", PASSWORD))


# -- properties --------------------------------------------------------------------------------

_B64 = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


_CANONICAL = st.builds(
    lambda prefix, salt, last_salt, body, last: f"$2{prefix}$04${salt}{last_salt}{body}{last}",
    st.sampled_from("aby"),
    st.text(_B64, min_size=21, max_size=21),
    st.sampled_from(".Oeu"),
    st.text(_B64, min_size=30, max_size=30),
    st.sampled_from(_B64[::4]),
)
_ANY_53 = st.from_regex(rf"\$2[abyx]\$0[3-5]\$[{_B64}!é]{{50,56}}", fullmatch=True)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_CANONICAL, st.binary(max_size=MAX_PASSWORD_BYTES))
def test_property_every_well_formed_hash_loads_and_checks(hashed: str, pw: bytes) -> None:
    assert hash_problem(hashed) is None
    assert bcrypt.checkpw(pw, hashed.encode()) in (True, False)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ANY_53, st.binary(max_size=MAX_PASSWORD_BYTES))
def test_property_any_hash_that_loads_never_makes_bcrypt_raise(hashed: str, pw: bytes) -> None:
    """For any near-hash string: either hash_problem names a problem, or checkpw answers."""
    if hash_problem(hashed) is None:
        assert bcrypt.checkpw(pw, hashed.encode()) in (True, False)


@settings(max_examples=examples(500), deadline=None)
@given(
    st.one_of(
        st.none(),
        st.text(max_size=300),
        st.binary(max_size=200).map(lambda raw: "Basic " + base64.b64encode(raw).decode()),
    )
)
def test_property_any_header_is_answered(value: str | None) -> None:
    auth = BasicAuth({"prometheus": HASH})
    answer = auth.decide(value)
    if isinstance(answer, Credential):
        assert len(answer.password) <= MAX_PASSWORD_BYTES
        assert auth.verify(answer) in (True, False)
    else:
        assert answer in (True, False)
    parse_basic(value)
