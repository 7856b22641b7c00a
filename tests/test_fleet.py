"""``sparkdiag fleet`` against a stand-in Prometheus API (answers chosen per query): the cases a
real fleet rarely shows on demand (no sparkdiag series, daemons without probe figures, a lone
GPU, garbage answers), and the rules' expressions expanded for a Prometheus without the rules.
The real thing, nine daemons and two Prometheus servers, is tests/test_e2e_peers.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sparkdiag.peers.fleet import RULE_GROUP, expanded, shipped_rules
from tests.support import ROOT, invoke_cli
from tests.support.fleet import GPU, H200, KERNEL, peer_answers, stand_in, vector


def fleet(url: str, *args: str) -> tuple[int, str, str]:
    result = invoke_cli("fleet", "--prometheus", url, *args)
    return result.returncode, result.stdout, result.stderr


def one_line(stderr: str) -> str:
    (line,) = stderr.strip().splitlines()
    return line


def test_no_sparkdiag_series_is_a_clear_error() -> None:
    with stand_in(lambda q: (200, vector())) as url:
        code, out, err = fleet(url)
    assert code == 3 and out == ""
    assert one_line(err) == (
        f"Error: Prometheus at {url} has no sparkdiag series: add the sparkdiag daemons to its "
        "scrape configuration (port 10942) and wait for a scrape"
    )


def test_daemons_without_probe_figures_say_why() -> None:
    def answer(query: str) -> tuple[int, bytes]:
        return 200, vector(({}, 3.0)) if query == "count(sparkdiag_build_info)" else vector()

    with stand_in(answer) as url:
        code, _, err = fleet(url)
    assert code == 3
    assert "scrapes 3 sparkdiag daemon(s) but none exports a probe figure" in one_line(err)


def test_one_gpu_is_too_small_a_group_and_no_outlier() -> None:
    """What the lent H200 shows: one GPU, its group of one, nothing judged."""
    labels = {**GPU, **KERNEL, **H200}
    answers = {
        "sparkdiag:gemm_tflops:peer_ratio": vector((labels, 1.0)),
        "sparkdiag:gemm_tflops:peer_score": vector((labels, 0.0)),
        "sparkdiag:gemm_tflops:median_1h": vector((labels, 725.0)),
        "sparkdiag:gemm_tflops:peer_median_1h": vector(({**H200, **KERNEL}, 725.0)),
        "sparkdiag:gemm_tflops:peer_group_gpus": vector(({**H200, **KERNEL}, 1.0)),
    }
    with stand_in(lambda q: (200, answers.get(q, vector()))) as url:
        code, out, err = fleet(url, "--json")
        text_code, text, _ = fleet(url)
    assert code == 0 == text_code, err
    report = json.loads(out)
    assert report["outliers"] == []
    assert [g["status"] for g in report["gpus"]] == ["too_small"]
    assert report["groups"][0]["gpus"] == 1 and report["groups"][0]["judged"] is False
    assert "1 group(s) too small to judge (fewer than 4 GPUs" in report["actions"][0]
    assert "not judged" in text and "Outliers:\n  none" in text


def test_an_outlier_and_a_warning_rank_first_and_exit_one() -> None:
    uuids = [f"GPU-{i}" for i in range(5)]
    ratios = [1.01, 0.99, 1.0, 0.95, 0.9]
    rows = [
        ({**GPU, "instance": f"n{i}:10942", "uuid": u, **KERNEL, **H200}, r)
        for i, (u, r) in enumerate(zip(uuids, ratios, strict=True))
    ]
    answers = peer_answers(rows)
    with stand_in(lambda q: (200, answers.get(q, vector()))) as url:
        code, out, _ = fleet(url, "--json")
    report = json.loads(out)
    assert code == 1
    assert [(g["uuid"], g["status"]) for g in report["gpus"][:3]] == [
        ("GPU-4", "outlier"),
        ("GPU-3", "warn"),
        ("GPU-1", "ok"),
    ]
    assert [o["uuid"] for o in report["outliers"]] == ["GPU-4"]
    assert report["actions"][0].startswith("n4:10942 GPU 0 (GPU-4) delivers 90.0% of its 5 peers")
    assert report["actions"][1].startswith("n3:10942 GPU 0 (GPU-3) is 5.0% below its peers")


def test_the_text_report_fits_the_narrowest_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in a review: the heading "Peer groups (model, probe software, context):" was not
    wrapped, 45 columns on a 40-column terminal (terminal.MIN_WIDTH)."""
    from sparkdiag import terminal

    monkeypatch.setattr(terminal, "width", lambda stream=None: terminal.MIN_WIDTH)
    rows = [
        ({**GPU, "instance": f"n{i}:10942", "uuid": f"GPU-{i}", **KERNEL, **H200}, r)
        for i, r in enumerate([1.01, 0.99, 1.0, 0.95, 0.9])
    ]
    answers = peer_answers(rows)
    with stand_in(lambda q: (200, answers.get(q, vector()))) as url:
        code, out, err = fleet(url)
    assert code == 1, err
    lines = out.splitlines()
    assert "Peer groups (model, probe software," in lines
    # wider only where one word is longer than the line
    assert all(len(line) <= terminal.MIN_WIDTH or len(line.split()) == 1 for line in lines), out


@pytest.mark.parametrize(
    ("status", "body", "needle"),
    [
        (200, b"<html>not prometheus</html>", "did not answer JSON: is the URL Prometheus'?"),
        (
            400,
            json.dumps({"status": "error", "error": "parse error"}).encode(),
            "answered HTTP 400 Bad Request: parse error",
        ),
        (401, b"Unauthorized", "refused the query (HTTP 401 Unauthorized): it wants credentials"),
        (
            200,
            json.dumps(
                {"status": "success", "data": {"resultType": "matrix", "result": []}}
            ).encode(),
            "answered a matrix, not an instant vector",
        ),
    ],
)
def test_answers_that_are_no_answer_are_one_line_and_exit_three(
    status: int, body: bytes, needle: str
) -> None:
    with stand_in(lambda q: (status, body)) as url:
        code, out, err = fleet(url)
    assert code == 3 and out == ""
    assert needle in one_line(err)


def test_a_bad_http_config_file_is_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "http.yml"
    config.write_text("basic_auth:\n  user: me\n", encoding="utf-8")
    code, _, err = fleet("http://127.0.0.1:9", "--http.config.file", str(config))
    assert code == 2
    assert "basic_auth: unknown key 'user' (known: password, password_file, username)" in err
    code, _, err = fleet("http://127.0.0.1:9", "--prometheus-cert-file", str(config))
    assert code == 2 and "needs both its cert file and its key file" in err


def test_the_rules_expand_into_queries_that_need_no_recorded_series() -> None:
    queries = expanded(shipped_rules())
    assert shipped_rules() == (ROOT / "prometheus" / "sparkdiag-rules.yml").read_text("utf-8")
    assert set(queries) == {
        "sparkdiag:gemm_tflops:median_1h",
        "sparkdiag:gemm_tflops:peer_median_1h",
        "sparkdiag:gemm_tflops:peer_group_gpus",
        "sparkdiag:gemm_tflops:peer_ratio",
        "sparkdiag:gemm_tflops:peer_mad_1h",
        "sparkdiag:gemm_tflops:peer_score",
    }
    for name, expr in queries.items():
        assert "sparkdiag:gemm_tflops:" not in expr, (name, RULE_GROUP)
        assert "sparkdiag_gemm_tflops" in expr and "sparkdiag_probe_software_info" in expr
    assert re.search(r"group_left \(\)\s+\(", queries["sparkdiag:gemm_tflops:peer_ratio"])


@pytest.mark.parametrize(
    ("flag", "toml", "verified"),
    [
        ((), "", False),  # neither: the file's tls_config decides (skip, here)
        (("--no-prometheus-insecure-skip-verify",), "", True),
        ((), "prometheus-insecure-skip-verify = false\n", True),
        (("--prometheus-insecure-skip-verify",), "", False),
    ],
)
def test_verifying_the_certificate_on_the_command_line_wins_over_the_http_config(
    tmp_path: Path, flag: tuple[str, ...], toml: str, verified: bool
) -> None:
    """--no-prometheus-insecure-skip-verify (or false in --config) verifies the certificate
    whatever --http.config.file says: it was read as "not given" (False or None became None),
    so a file's insecure_skip_verify: true sent basic-auth credentials to any certificate."""
    from sparkdiag.flags import settings_from
    from sparkdiag.peers.promapi import connection

    http = tmp_path / "http.yml"
    http.write_text("tls_config:\n  insecure_skip_verify: true\n")
    config = tmp_path / "config.toml"
    config.write_text(toml)
    given = {"prometheus_url": "https://127.0.0.1:9"}
    if flag:
        given["prometheus_insecure_skip_verify"] = flag[0] == "--prometheus-insecure-skip-verify"
    settings = settings_from("fleet", given, config)
    conn = connection(
        settings.prometheus_url,
        5.0,
        http_config=http,
        insecure_skip_verify=settings.prometheus_insecure_skip_verify,
    )
    assert conn.insecure_skip_verify is not verified
