"""``sparkdiag fleet`` against a Prometheus that is not one, or not honest (issue 29): redirects
that would carry the credentials elsewhere, a server that answers one byte a second, malformed
HTTP, JSON nested deeper than any answer, numbers of 5000 digits, NaN and infinities, values that
are no Prometheus number, control sequences in labels and error text. Each gives one clear line
(and with ``--json`` a JSON document), never a traceback, never a GPU ranked healthy on bad
data; a fuzz sends whatever hypothesis makes of the answer and its framing."""

from __future__ import annotations

import json
import math
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkdiag.errors import SparkdiagError
from sparkdiag.peers.fleet import fleet_view
from sparkdiag.peers.httpget import redirect_allowed
from sparkdiag.peers.promapi import Connection, PrometheusClient, parse_answer
from tests.support import invoke_cli, self_signed_cert, sparkdiag_cmd
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
from tests.support.fuzz import examples
from tests.support.tty import OnTerminal

RATIO = "sparkdiag:gemm_tflops:peer_ratio"


def fleet(url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return invoke_cli("fleet", "--prometheus", url, *args, timeout=timeout)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    return line


def strict_json(text: str) -> Any:
    """``text`` as JSON, refusing NaN and the infinities as JSON itself does."""

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the JSON output")

    return json.loads(text, parse_constant=refuse)


def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "password"
    path.write_text("s3cret\n")
    path.chmod(0o600)  # one that others may read is warned about, a second line
    return path


def healthy(query: str) -> bytes:
    """A Prometheus whose one GPU is alone in its group."""
    answers = peer_answers([({**GPU, **KERNEL, **H200}, 1.0)])
    return answers.get(query, vector())


def prometheus(head: bytes, sock: socket.socket) -> None:
    sock.sendall(answer("200 OK", healthy(query_of(head)), "Content-Type: application/json"))


# -- credentials never leave with a redirect -------------------------------------------------------


def test_a_redirect_to_another_host_is_not_followed_and_gets_no_credentials(
    tmp_path: Path,
) -> None:
    with raw_server(prometheus) as elsewhere:
        where = f"http://localhost:{elsewhere.port}/api/v1/query"

        def redirect(head: bytes, sock: socket.socket) -> None:
            sock.sendall(answer("302 Found", b"", f"Location: {where}"))

        with raw_server(redirect) as first:
            result = fleet(
                first.url,
                "--prometheus-username",
                "me",
                "--prometheus-password-file",
                str(password_file(tmp_path)),
            )
    assert result.returncode == 3
    line = one_line(result)
    assert f"redirected (HTTP 302) to {where}, not followed" in line
    assert "to another host: the credentials must not go there" in line
    assert elsewhere.heads == []  # nothing at all went there
    assert first.authorizations() == [b"Basic bWU6czNjcmV0"]  # sent only where it was asked


def test_a_bearer_token_does_not_leave_with_a_redirect(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("tok\n")
    config = tmp_path / "http.yml"
    config.write_text("authorization:\n  credentials_file: token\n")
    for path in (tmp_path / "token", config):
        path.chmod(0o600)
    with raw_server(prometheus) as elsewhere:

        def redirect(head: bytes, sock: socket.socket) -> None:
            sock.sendall(
                answer(
                    "307 Temporary Redirect", b"", f"Location: http://localhost:{elsewhere.port}/x"
                )
            )

        with raw_server(redirect) as first:
            result = fleet(first.url, "--http.config.file", str(config))
    assert result.returncode == 3 and "not followed" in one_line(result)
    assert elsewhere.heads == [] and first.authorizations() == [b"Bearer tok"]


@pytest.fixture(scope="module")
def server_tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    directory = tmp_path_factory.mktemp("tls")
    self_signed_cert(directory, alt_names="IP:127.0.0.1")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    return context, directory / "tls.crt"


def test_https_never_downgrades_to_http(
    tmp_path: Path, server_tls: tuple[ssl.SSLContext, Path]
) -> None:
    context, ca = server_tls
    with raw_server(prometheus) as plain:

        def downgrade(head: bytes, sock: socket.socket) -> None:
            where = f"http://127.0.0.1:{plain.port}/api/v1/query"
            sock.sendall(answer("301 Moved Permanently", b"", f"Location: {where}"))

        with raw_server(downgrade, tls=context) as secure:
            result = fleet(
                secure.url,
                "--prometheus-ca-file",
                str(ca),
                "--prometheus-username",
                "me",
                "--prometheus-password-file",
                str(password_file(tmp_path)),
            )
    assert result.returncode == 3
    assert "from https to http: the credentials and the answer would travel unencrypted" in (
        one_line(result)
    )
    assert plain.heads == []


def test_a_certificate_for_another_host_is_said_as_such(tmp_path: Path) -> None:
    """A certificate for evil.example, its CA given, asked as 127.0.0.1: the line said only
    CERTIFICATE_VERIFY_FAILED and advised giving the CA (the hostile-client review)."""
    self_signed_cert(tmp_path, "other", subject="evil.example", alt_names="DNS:evil.example")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "other.crt", tmp_path / "other.key")
    with raw_server(prometheus, tls=context) as secure:
        result = fleet(secure.url, "--prometheus-ca-file", str(tmp_path / "other.crt"))
    line = one_line(result)
    assert result.returncode == 3 and "mismatch" in line, line
    assert "not for the host in the URL" in line and "give its CA" not in line


def test_a_redirect_within_the_same_server_is_followed_with_the_credentials(
    tmp_path: Path,
) -> None:
    def moved(head: bytes, sock: socket.socket) -> None:
        target = head.split(b" ", 2)[1].decode()
        if target.startswith("/prometheus/"):
            prometheus(head, sock)
        else:
            sock.sendall(answer("308 Permanent Redirect", b"", f"Location: /prometheus{target}"))

    with raw_server(moved) as server:
        result = fleet(
            server.url,
            "--json",
            "--prometheus-username",
            "me",
            "--prometheus-password-file",
            str(password_file(tmp_path)),
        )
    assert result.returncode == 0, result.stderr
    assert strict_json(result.stdout)["gpus"][0]["status"] == "too_small"
    assert set(server.authorizations()) == {b"Basic bWU6czNjcmV0"}


def test_the_redirect_rule() -> None:
    assert redirect_allowed("http://a:9090/x", "http://a:9090/y") is None
    assert redirect_allowed("http://a:9090/x", "https://A:9443/y") is None  # an upgrade
    assert redirect_allowed("https://a/x", "http://a/x") is not None
    assert redirect_allowed("http://a/x", "http://b/x") is not None
    assert redirect_allowed("http://a:9090/x", "http://a:9091/x") is not None
    assert redirect_allowed("http://a/x", "file:///etc/passwd") is not None


# -- one deadline for the whole query --------------------------------------------------------------


def test_a_server_sending_one_byte_a_second_is_cut_off_at_the_timeout() -> None:
    def drip(head: bytes, sock: socket.socket) -> None:
        data = answer("200 OK", healthy(query_of(head)))
        for byte in data:
            sock.sendall(bytes([byte]))
            time.sleep(1.0)

    with raw_server(drip) as server:
        started = time.monotonic()
        result = fleet(server.url, "--prometheus-timeout", "2", "--json")
        took = time.monotonic() - started
    assert result.returncode == 3
    assert "no complete answer within 2 s (the whole exchange)" in one_line(result)
    assert strict_json(result.stdout)["exit_status"] == 3
    # one query failed at its deadline; before, each read had its own 2 s and this ran on
    assert took < 15, took


# -- malformed HTTP and JSON: one line each --------------------------------------------------------

_DEEP = b'{"status": "success", "data": ' + b"[" * 5000 + b"]" * 5000 + b"}"
_DIGITS = (
    b'{"status": "success", "data": {"resultType": "vector", "result": []}, "n": '
    + (b"9" * 5000)
    + b"}"
)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"HTTP/1.1 abc\r\n\r\n", "answered malformed HTTP (illegal status line: 'HTTP/1.1 abc')"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "answered malformed HTTP (illegal chunk header",
        ),
        (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 200_000, "answered malformed HTTP"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
            "without sending complete message body",
        ),
        (answer("200 OK", _DEEP), "answered JSON that is not read: nested too deeply"),
        (answer("200 OK", _DIGITS), "answered JSON that is not read: an integer of 5000 digits"),
        (
            answer(
                "200 OK",
                b'{"status": "success", "data": {"resultType": "vector", '
                b'"result": [{"metric": {}, "value": [1, "1' + b"0" * 5000 + b'"]}]}}',
            ),
            "answered the value '1000",
        ),
    ],
)
def test_malformed_answers_are_one_line_and_valid_json(raw: bytes, needle: str) -> None:
    def respond(head: bytes, sock: socket.socket) -> None:
        sock.sendall(raw)

    with raw_server(respond) as server:
        text = fleet(server.url)
        document = fleet(server.url, "--json")
    assert text.returncode == 3 == document.returncode
    assert needle in one_line(text)
    failed = strict_json(document.stdout)
    assert failed["exit_status"] == 3 and needle in failed["error"]


def test_a_scalar_answer_is_not_a_fleet() -> None:
    """Every query sparkdiag fleet asks is a vector expression; a server answering each with a
    scalar is not Prometheus as fleet needs it. Before: one GPU without a name, exit 0."""
    scalar = b'{"status": "success", "data": {"resultType": "scalar", "result": [1, "1"]}}'

    def respond(head: bytes, sock: socket.socket) -> None:
        sock.sendall(answer("200 OK", scalar))

    with raw_server(respond) as server:
        text = fleet(server.url)
        document = fleet(server.url, "--json")
    assert text.returncode == 3 == document.returncode, text.stdout
    assert "answered a scalar, not an instant vector" in one_line(text)
    assert "answered a scalar" in strict_json(document.stdout)["error"]


def test_more_than_100_headers_are_read() -> None:
    """http.client raised 'got more than 100 headers' (a traceback); h11 reads them."""

    def respond(head: bytes, sock: socket.socket) -> None:
        headers = [f"X-H{i}: {i}" for i in range(150)]
        sock.sendall(answer("200 OK", healthy(query_of(head)), *headers))

    with raw_server(respond) as server:
        result = fleet(server.url, "--json")
    assert result.returncode == 0, result.stderr
    assert strict_json(result.stdout)["gpus"][0]["uuid"] == GPU["uuid"]


# -- values read strictly: NaN and Inf named as bad data -------------------------------------------


def _prom(answers: dict[str, bytes]) -> Callable[[bytes, socket.socket], None]:
    def respond(head: bytes, sock: socket.socket) -> None:
        sock.sendall(answer("200 OK", answers.get(query_of(head), vector())))

    return respond


def _raw_vector(*samples: tuple[dict[str, str], str]) -> bytes:
    result = [{"metric": m, "value": [1700000000.0, v]} for m, v in samples]
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}
    ).encode()


def _fleet_of_five(ratio_of_last: dict[str, str], size: str = "5") -> dict[str, bytes]:
    """Five H200s; the last one's ratio at each kernel as given (bf16 and fp16)."""
    kernels = {
        "bf16": {"dtype": "bf16", "shape": "8192x8192x8192"},
        "fp16": {"dtype": "fp16", "shape": "8192x8192x8192"},
    }
    rows: list[tuple[dict[str, str], str]] = []
    for i in range(5):
        gpu = {**GPU, "instance": f"n{i}:10942", "uuid": f"GPU-{i}", **H200}
        for name, kernel in kernels.items():
            rows.append(({**gpu, **kernel}, ratio_of_last[name] if i == 4 else "1"))
    groups = [({**H200, **k}, size) for k in kernels.values()]
    return {
        RATIO: _raw_vector(*rows),
        "sparkdiag:gemm_tflops:peer_score": _raw_vector(*[(m, "0") for m, _ in rows]),
        "sparkdiag:gemm_tflops:median_1h": _raw_vector(*[(m, "725") for m, _ in rows]),
        "sparkdiag:gemm_tflops:peer_median_1h": _raw_vector(*[(m, "725") for m, _ in groups]),
        "sparkdiag:gemm_tflops:peer_group_gpus": _raw_vector(*groups),
    }


def test_a_nan_ratio_does_not_hide_a_slow_kernel() -> None:
    """Before: NaN at bf16 and 0.80 at fp16 was reported ok, exit 0."""
    with raw_server(_prom(_fleet_of_five({"bf16": "NaN", "fp16": "0.80"}))) as server:
        result = fleet(server.url, "--json")
    assert result.returncode == 1, result.stderr
    report = strict_json(result.stdout)
    row = report["gpus"][0]
    assert (row["uuid"], row["status"], row["ratio"]) == ("GPU-4", "outlier", 0.8)
    assert row["worst_kernel"]["dtype"] == "fp16"
    assert row["bad_data"] == ["bf16 8192x8192x8192: NaN"]
    assert any("bad data, not ranked as healthy" in a for a in report["actions"])


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_a_gpu_whose_ratios_are_all_bad_data_is_named_never_ok(value: str) -> None:
    with raw_server(_prom(_fleet_of_five({"bf16": value, "fp16": value}))) as server:
        result = fleet(server.url, "--json")
        text = fleet(server.url)
    assert result.returncode == 1 == text.returncode, result.stderr
    report = strict_json(result.stdout)
    (bad,) = report["bad_data"]
    assert (bad["uuid"], bad["status"], bad["ratio"]) == ("GPU-4", "bad_data", None)
    assert report["gpus"][0]["uuid"] == "GPU-4"  # ranked first, not among the healthy
    words = " ".join(text.stdout.split())
    assert "BAD DATA" in words and "1 with bad data" in words


@pytest.mark.parametrize("size", ["NaN", "+Inf", "2.5", "-1", "0", "1e300"])
def test_a_group_size_that_is_no_count_is_bad_data_not_a_traceback(size: str) -> None:
    """Not judged, and so never exit 0: a NaN size hid a GPU at half its peers with its alert
    firing, and fleet exited 0 (the hostile-client review)."""
    with raw_server(_prom(_fleet_of_five({"bf16": "0.5", "fp16": "1"}, size=size))) as server:
        result = fleet(server.url, "--json")
    assert "Traceback" not in result.stderr
    assert result.returncode == 1, result.stderr
    report = strict_json(result.stdout)
    assert len(report["bad_groups"]) == 2 and report["outliers"] == []  # not judged
    assert all(not g["judged"] for g in report["groups"])


@pytest.mark.parametrize("value", ["0", "-0.5"])
def test_a_ratio_of_zero_or_below_is_bad_data(value: str) -> None:
    with raw_server(_prom(_fleet_of_five({"bf16": value, "fp16": "1"}))) as server:
        result = fleet(server.url, "--json")
    assert result.returncode == 1, result.stderr
    (row,) = [g for g in strict_json(result.stdout)["gpus"] if g["uuid"] == "GPU-4"]
    assert row["status"] == "bad_data" and row["bad_data"] == [f"bf16 8192x8192x8192: {value}"]


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://[::1", "http://" + "a" * 64 + ".x",
     "http://127.0.0.1:9/a b", "http://127.0.0.1:9/\u00e9", "http://me:s3cret@127.0.0.1:9"],
)  # fmt: skip
def test_a_prometheus_url_that_cannot_be_asked_is_a_usage_error(url: str) -> None:
    """Each was a traceback and exit 1 (read as "an outlier"); a password in the URL was shown in
    every line and in --json, and never sent (the hostile-client review)."""
    result = fleet(url, "--json")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "s3cret" not in result.stdout + result.stderr
    assert strict_json(result.stdout)["exit_status"] == 2


@pytest.mark.parametrize(
    "location",
    ["http://127.0.0.1:99999/", "http://[::1/", "/x y", "/x?a=\u00e9", "/ok\x1b]0;X\x07",
     "https://127.0.0.1/ok"],
)  # fmt: skip
def test_a_redirect_that_cannot_be_followed_is_one_line(location: str) -> None:
    def redirect(head: bytes, sock: socket.socket) -> None:
        sock.sendall(answer("302 Found", b"", f"Location: {location}"))

    with raw_server(redirect) as first:
        result = fleet(first.url, "--json")
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
    assert "not followed" in strict_json(result.stdout)["error"]


@pytest.mark.parametrize(
    "value", [12, True, None, "1_000", " 12", "12 ", "infinity", "nan", "0x10", "1e999", "--1"]
)
def test_values_that_are_no_prometheus_number_are_refused(value: Any) -> None:
    sample = {"metric": {**GPU, **KERNEL, **H200}, "value": [1700000000.0, value]}
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [sample]}})
    body_bytes = body.encode()
    with raw_server(_prom({RATIO: body_bytes})) as server:
        result = fleet(server.url)
    assert result.returncode == 3
    line = one_line(result)
    assert 'not [timestamp, "value"]' in line or "not a number" in line or "out of range" in line


def test_an_answer_of_more_series_than_a_fleet_has_is_refused() -> None:
    """580,000 series under the 64 MiB cap, six times, held 2.7 GiB for 80 s (the hostile-client
    review): more than MAX_SAMPLES is refused as the answer is read."""
    from sparkdiag.peers.promapi import MAX_SAMPLES, PrometheusError

    one = {"metric": {"uuid": "GPU-0"}, "value": [1700000000.0, "1"]}
    body = {"status": "success", "data": {"resultType": "vector", "result": [one] * MAX_SAMPLES}}
    assert len(parse_answer("P", json.dumps(body).encode())) == MAX_SAMPLES
    body["data"]["result"].append(one)  # type: ignore[index]
    with pytest.raises(PrometheusError, match=f"answered {MAX_SAMPLES + 1} series"):
        parse_answer("P", json.dumps(body).encode())
    # counted in the bytes, before a parse builds them all (1.49 million took 641 MiB)
    from sparkdiag import safeload

    real = safeload.parse_json
    try:
        safeload.parse_json = lambda *a, **k: pytest.fail("parsed before it was counted")
        with pytest.raises(PrometheusError, match="series, more than"):
            parse_answer("P", json.dumps(body).encode())
    finally:
        safeload.parse_json = real


def test_an_answer_of_more_structure_than_a_fleet_has_is_refused_before_the_parse() -> None:
    """A well-formed success answer that builds millions of objects: 20 million empty lists in
    57 MiB held 1.8 GiB, one series of 4 million labels 2.4 GiB (the security review of
    2026-12-05). Counted in the bytes before the parse; a series of more labels than any
    sparkdiag series has is refused too."""
    from sparkdiag import safeload
    from sparkdiag.peers.promapi import MAX_LABELS, MAX_TOKENS, PrometheusError

    lists = b",".join([b"[]"] * (MAX_TOKENS // 2 + 1))
    junk = b'{"status":"success","data":{"resultType":"vector","result":[],"x":[' + lists + b"]}}"
    # one series of MAX_TOKENS + 1 labels, written as bytes (a dict of them and json.dumps took
    # 3 s of CPU)
    labels = b",".join(b'"l%d":""' % i for i in range(MAX_TOKENS + 1))
    many = (
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{'
        + labels
        + b'},"value":[1700000000.0,"1"]}]}}'
    )
    real = safeload.parse_json
    try:
        safeload.parse_json = lambda *a, **k: pytest.fail("parsed before it was counted")
        for body in (junk, many):
            with pytest.raises(PrometheusError, match="lists, objects and items, more than"):
                parse_answer("P", body)
    finally:
        safeload.parse_json = real
    labels = {f"l{i}": "" for i in range(MAX_LABELS + 1)}
    one = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [1700000000.0, "1"]}]}})  # fmt: skip
    with pytest.raises(PrometheusError, match=f"a series of {MAX_LABELS + 1} labels"):
        parse_answer("P", one.encode())


def test_prometheus_numbers_are_read() -> None:
    for text, number in (
        ("1", 1.0),
        ("-0.5", -0.5),
        ("1e+27", 1e27),
        (".5", 0.5),
        ("NaN", math.nan),
        ("+Inf", math.inf),
        ("-Inf", -math.inf),
    ):
        (sample,) = parse_answer("P", _raw_vector(({}, text)))
        assert sample.value == number or (math.isnan(number) and math.isnan(sample.value))


# -- control sequences from outside never reach the terminal raw -----------------------------------


def test_escape_sequences_in_labels_and_error_text_are_shown_escaped() -> None:
    title = "\x1b]0;owned\x07"
    labels = {**GPU, "instance": f"n0{title}:10942", **KERNEL, **H200}
    answers = peer_answers([(labels, 0.5)])
    with raw_server(_prom(answers)) as server:
        result = fleet(server.url)
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "n0\\x1b]0;owned\\x07:10942" in result.stdout

    error = json.dumps({"status": "error", "error": f"bad{title}\x1b[2J\u202eevil"}).encode()
    with raw_server(lambda head, sock: sock.sendall(answer("400 Bad Request", error))) as server:
        result = fleet(server.url)
    assert result.returncode == 3
    line = one_line(result)
    assert "\x1b" not in result.stderr and "\u202e" not in result.stderr
    assert "bad\\x1b]0;owned\\x07\\x1b[2J\\u202eevil" in line


# -- an encrypted key is refused, never prompted for -----------------------------------------------


@pytest.fixture(scope="module")
def encrypted_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("encrypted")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-days", "2", "-subj", "/CN=client",
         "-passout", "pass:secret", "-keyout", str(directory / "client.key"),
         "-out", str(directory / "client.crt")],
        check=True, capture_output=True,
    )  # fmt: skip
    return directory / "client.crt", directory / "client.key"


def test_an_encrypted_client_key_is_refused_not_prompted_for(
    encrypted_key: tuple[Path, Path],
) -> None:
    cert, key = encrypted_key
    argv = sparkdiag_cmd(
        "fleet",
        "--prometheus",
        "https://127.0.0.1:9",
        "--prometheus-cert-file",
        str(cert),
        "--prometheus-key-file",
        str(key),
    )
    run = OnTerminal(argv)
    try:
        assert run.wait(20) == 2, f"still running after 20 s: {run.output!r}"
    finally:
        run.stop()
    assert "PEM pass phrase" not in run.output
    # the line wraps at the terminal's width: compare its words
    said = " ".join(run.output.split())
    assert f"{key} is encrypted: sparkdiag does not ask for pass phrases" in said


# -- a fuzz of the answer and its framing ----------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1", "0.93", "1e+27", "1_000", "4"]),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
_label = st.text(max_size=6).filter(lambda s: "\x00" not in s)
_sample = st.fixed_dictionaries(
    {
        "metric": st.dictionaries(st.sampled_from(sorted({*GPU, *KERNEL, *H200})), _label),
        "value": st.one_of(
            st.tuples(
                st.floats(0, 2e9),
                st.sampled_from(["NaN", "+Inf", "-Inf", "1", "0.5", "4", "0", "2.5", "-1"]),
            ).map(list),
            _json,
        ),
    }
)
_document = st.one_of(
    _json,
    st.fixed_dictionaries(
        {
            "status": st.just("success"),
            "data": st.fixed_dictionaries(
                {
                    "resultType": st.sampled_from(["vector", "scalar", "matrix"]),
                    "result": st.lists(_sample, max_size=6),
                }
            ),
        }
    ),
)
_framing = st.sampled_from(["length", "chunked", "close", "short", "garbage"])


def _frame(body: bytes, framing: str, status: int) -> bytes:
    if framing == "chunked":
        head = f"HTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        return head + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    if framing == "close":
        return f"HTTP/1.1 {status} X\r\nConnection: close\r\n\r\n".encode() + body
    if framing == "short":
        return f"HTTP/1.1 {status} X\r\nContent-Length: {len(body) + 5}\r\n\r\n".encode() + body
    if framing == "garbage":
        return body[:40] + b"\r\n\r\n"
    return answer(f"{status} X", body)


class Hostile:
    """One stand-in for the whole fuzz, its answer chosen per example."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reply = b""

    def __call__(self, head: bytes, sock: socket.socket) -> None:
        with self.lock:
            reply = self.reply
        sock.sendall(reply)


@pytest.fixture(scope="module")
def hostile() -> Iterator[tuple[Hostile, str]]:
    stand_in = Hostile()
    with raw_server(stand_in) as server:
        yield stand_in, server.url


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    documents=st.lists(_document, min_size=1, max_size=3),
    framing=_framing,
    status=st.sampled_from([200, 200, 200, 302, 400, 401, 500, 503]),
)
def test_fuzz_fleet_against_a_hostile_prometheus(
    hostile: tuple[Hostile, str], documents: list[Any], framing: str, status: int
) -> None:
    """Whatever it answers, the view is built (and renders, and is valid JSON) or one
    PrometheusError line says why; never another exception. 80 examples, about 3 s."""
    from sparkdiag.commands.fleet import render

    stand_in, url = hostile
    client = PrometheusClient(Connection(url, timeout=2.0))
    for document in documents:
        with stand_in.lock:
            stand_in.reply = _frame(json.dumps(document).encode(), framing, status)
        try:
            view = fleet_view(client)
        except SparkdiagError as exc:
            assert "\n" not in exc.line() and len(exc.line()) < 1000
            continue
        json.dumps(view.as_json(), allow_nan=False)
        render(view, 80)
