"""TLS, basic auth (bcrypt) and the concurrent-request cap, against the real daemon."""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
from prometheus_client import CollectorRegistry

from sparkdiag.web.http import ExporterServer
from tests.support import NVML, SYSFS, basic_auth, running_daemon, self_signed_cert, serving

FIXTURE_ARGS = [
    "--nvml-fixture",
    str(NVML / "h200-idle.json"),
    "--path.sysfs",
    str(SYSFS / "h200-vm"),
]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    self_signed_cert(d)
    return d


def web_config(certs: Path, tls: bool = True, users: dict[str, str] | None = None) -> Path:
    lines = []
    if tls:
        lines += ["tls_server_config:", "  cert_file: tls.crt", "  key_file: tls.key"]
    if users:
        lines.append("basic_auth_users:")
        for user, password in users.items():
            hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
            lines.append(f"  {user}: {hashed.replace('$2b$', '$2y$')}")
    path = certs / f"web-{tls}-{bool(users)}.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


def https_get(base: str, certs: Path, auth: tuple[str, str] | None = None) -> int:
    context = ssl.create_default_context(cafile=str(certs / "tls.crt"))
    request = urllib.request.Request(base + "/metrics")
    if auth:
        request.add_header("Authorization", basic_auth(auth))
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as resp:
            body = resp.read()
            assert b"sparkdiag_gpu_up" in body
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_tls_and_basic_auth(certs: Path) -> None:
    config = web_config(certs, tls=True, users={"prometheus": "s3cret"})
    with running_daemon([*FIXTURE_ARGS, "--web.config.file", str(config)], scheme="https") as base:
        assert https_get(base, certs, ("prometheus", "s3cret")) == 200
        assert https_get(base, certs, ("prometheus", "wrong")) == 401
        assert https_get(base, certs, ("nobody", "s3cret")) == 401
        assert https_get(base, certs) == 401
        # the cached verification still rejects a wrong password after a right one
        assert https_get(base, certs, ("prometheus", "s3cret")) == 200
        assert https_get(base, certs, ("prometheus", "s3cret2")) == 401
        # plain HTTP against the TLS port gets a 400 that says so (as Go's servers answer)
        port = int(base.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 400 and b"https://" in response.read()
        conn.close()
        # an untrusting client refuses the self-signed certificate
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(base + "/metrics", timeout=5)


def test_basic_auth_without_tls(certs: Path) -> None:
    config = web_config(certs, tls=False, users={"alice": "pw"})
    with running_daemon(
        [*FIXTURE_ARGS, "--web.config.file", str(config)], auth=("alice", "pw")
    ) as base:
        req = urllib.request.Request(base + "/metrics")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=5)
        assert info.value.code == 401
        assert info.value.headers["WWW-Authenticate"].startswith('Basic realm="sparkdiag"')


def test_bad_web_config_exits_2(tmp_path: Path) -> None:
    from tests.test_cli import assert_clean_error, run_cli

    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n  bob: plaintext\n")
    result = run_cli("serve", *FIXTURE_ARGS, "--web.config.file", str(path))
    assert_clean_error(result, 2, "not a bcrypt hash")


def test_requests_beyond_the_cap_get_503() -> None:
    with serving(max_requests=1) as server:
        port = server.server_address[1]
        assert server.slots is not None
        assert server.slots.acquire(blocking=False)  # one request in flight
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 503
        conn.close()
        server.slots.release()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()


def test_ipv6_loopback_listen() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        server = ExporterServer(("::1", 0), CollectorRegistry(), lambda: (True, "ok"))
    except OSError:
        pytest.skip("IPv6 loopback unavailable here")
    server.server_close()
