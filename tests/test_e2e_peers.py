"""A GPU slower than its peers across a fleet, end to end: nine sparkdiag daemons on fixtures (one
H200 each, every one with its own uuid), one of them replaying the recorded H200 document 10 %
slower at every kernel; two real Prometheus servers load the shipped rules.

* Prometheus A scrapes all nine: ``SparkdiagGpuSlowerThanPeers`` fires for the slow GPU alone (at
  its twelve compute-bound kernels), and ``sparkdiag fleet`` lists it first, as the one outlier,
  from the recorded series and from the same expressions sent as queries.
* Prometheus B scrapes the eight healthy ones, behind TLS and basic auth: no alert, no outlier,
  exit status 0 (with the flags and with promtool's ``--http.config.file``); a wrong password, a
  missing CA and an unreachable server are one clear line each and exit status 3.

Prometheus loads a copy of the rules in which every ``for:`` is 3 s and the peers group's hour
window 20 s (:func:`tests.support.e2e.shortened_rules`, :func:`~tests.support.e2e.shortened_window`
check that nothing else changed). Daemons probe every 2 s (fixture replay), Prometheus scrapes
and evaluates every second.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from sparkdiag.peers.fleet import fleet_view
from sparkdiag.peers.promapi import Connection, PrometheusClient, PrometheusError
from tests.support import NVML, ROOTFS, SYSFS, free_port, run_cli, self_signed_cert, sparkdiag_cmd
from tests.support.e2e import (
    ALL_DTYPES,
    FAST,
    HEALTHY_JITTER,
    RULES,
    Process,
    _spawn,
    _wait_ready,
    probe_document,
    prometheus_binary,
    prometheus_config,
    shortened_rules,
    shortened_window,
    write_probe_fixture,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.promtool]

NODES = 9
SLOW = 6  # the node whose GPU replays 0.9 of the recording
WINDOW = "20s"
PASSWORD = "peers-e2e-secret"
DEADLINE_S = 90.0
HOLD_S = 5.0


def uuid(node: int) -> str:
    return f"GPU-979ad365-0b73-a0ac-74a2-3520b773e{node:03d}"


@dataclass
class PeerFleet:
    a: str  # Prometheus scraping all nine
    b: str  # Prometheus scraping the eight healthy ones, https with basic auth
    ca: Path
    password_file: Path
    rules: str
    workdir: Path
    processes: list[Process]

    def client_a(self) -> PrometheusClient:
        return PrometheusClient(Connection(self.a))

    def client_b(self) -> PrometheusClient:
        return PrometheusClient(
            Connection(self.b, ca_file=self.ca, username="sparkdiag", password=PASSWORD)
        )

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.tail()}" for p in self.processes)


def node_args(workdir: Path, node: int) -> list[str]:
    """A daemon on the idle H200 recording with its own uuid, replaying its own probe cycles:
    the healthy run-to-run jitter, shifted per node so that no two nodes read alike."""
    here = workdir / f"node-{node}"
    (here / "state").mkdir(parents=True)
    nvml = here / "nvml.json"
    nvml.write_text(
        json.dumps(
            {
                "format": "sparkdiag-nvml-fixture/1",
                "description": "test_e2e_peers: the idle H200 recording with its own uuid",
                "base": str(NVML / "h200-idle.json"),
                "devices": [{"from": 0, "set": {"uuid": uuid(node)}, "why": {"uuid": "peers"}}],
            }
        ),
        encoding="utf-8",
    )
    scale = dict.fromkeys(ALL_DTYPES, 0.9) if node == SLOW else None
    jitter = HEALTHY_JITTER[node % 6 :] + HEALTHY_JITTER[: node % 6]
    cycles = [probe_document(uuid(node), j, scale) for j in jitter]
    fixture = write_probe_fixture(here / "probe.json", cycles)
    return [
        "--nvml-fixture", str(nvml), "--path.sysfs", str(SYSFS / "h200-vm"),
        "--path.rootfs", str(ROOTFS / "native"), "--state-dir", str(here / "state"),
        *FAST, "--probe.interval", "2", "--no-probe.hot-enabled",
        "--probe.fixture", str(fixture),
    ]  # fmt: skip


def wait_answering(process: Process, client: PrometheusClient, deadline: float) -> None:
    while True:
        if process.proc.poll() is not None:
            raise AssertionError(f"{process.name} exited:\n{process.tail(30)}")
        with contextlib.suppress(PrometheusError):
            client.query("vector(1)")  # a vector: fleet refuses a scalar answer
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{process.name} does not answer:\n{process.tail(30)}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerFleet]:
    binary = prometheus_binary()
    workdir = tmp_path_factory.mktemp("peers")
    with contextlib.ExitStack() as stack:
        daemons = []
        for node in range(NODES):
            port = free_port()
            cmd = sparkdiag_cmd("serve", "--listen", f"127.0.0.1:{port}", *node_args(workdir, node))
            process = _spawn(stack, f"node-{node}", cmd, workdir / f"node-{node}" / "daemon.log")
            daemons.append((process, f"127.0.0.1:{port}"))
        deadline = time.monotonic() + 30
        for process, address in daemons:
            _wait_ready(process, f"http://{address}/healthz", deadline)

        rules_text = shortened_window(
            shortened_rules(RULES.read_text(encoding="utf-8")), "sparkdiag-peers", "1h", WINDOW
        )
        rules = workdir / "sparkdiag-rules.yml"
        rules.write_text(rules_text, encoding="utf-8")
        self_signed_cert(workdir)
        (workdir / "password").write_text(PASSWORD + "\n", encoding="utf-8")
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        web = workdir / "web.yml"
        web.write_text(
            json.dumps(
                {
                    "tls_server_config": {
                        "cert_file": str(workdir / "tls.crt"),
                        "key_file": str(workdir / "tls.key"),
                    },
                    "basic_auth_users": {"sparkdiag": hashed},
                }
            ),
            encoding="utf-8",
        )
        servers = {}
        for name, wanted, extra in (
            ("a", range(NODES), []),
            ("b", [n for n in range(NODES) if n != SLOW], [f"--web.config.file={web}"]),
        ):
            targets = {f"node-{n}:10942": daemons[n][1] for n in wanted}
            config = workdir / f"prometheus-{name}.yml"
            config.write_text(json.dumps(prometheus_config(rules, targets)), encoding="utf-8")
            port = free_port()
            process = _spawn(
                stack,
                f"prometheus-{name}",
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / name}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                    *extra,
                ],
                workdir / f"prometheus-{name}.log",
            )
            servers[name] = (process, port)
        fleet = PeerFleet(
            a=f"http://127.0.0.1:{servers['a'][1]}",
            b=f"https://127.0.0.1:{servers['b'][1]}",
            ca=workdir / "tls.crt",
            password_file=workdir / "password",
            rules=rules_text,
            workdir=workdir,
            processes=[p for p, _ in daemons] + [p for p, _ in servers.values()],
        )
        deadline = time.monotonic() + 30
        wait_answering(servers["a"][0], fleet.client_a(), deadline)
        wait_answering(servers["b"][0], fleet.client_b(), deadline)
        yield fleet


def slower_than_peers(client: PrometheusClient) -> list[dict[str, str]]:
    alerts = client.query('ALERTS{alertname="SparkdiagGpuSlowerThanPeers"}')
    return [dict(a.labels) for a in alerts]


def converge(fleet: PeerFleet, client: PrometheusClient, ready: Any, name: str) -> None:
    """Wait until ``ready()`` holds and keeps holding for HOLD_S."""
    deadline = time.monotonic() + DEADLINE_S
    since: float | None = None
    while True:
        now = time.monotonic()
        if ready():
            since = since or now
            if now - since >= HOLD_S:
                return
        else:
            since = None
        if now > deadline:
            raise AssertionError(f"{name} did not converge:\n{fleet.logs()}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def converged_a(peers: PeerFleet) -> list[dict[str, str]]:
    client = peers.client_a()

    def ready() -> bool:
        firing = [a for a in slower_than_peers(client) if a["alertstate"] == "firing"]
        groups = client.query(
            'sparkdiag:gemm_tflops:peer_group_gpus{dtype="bf16", shape="8192x8192x8192"}'
        )
        return len(firing) == 12 and [g.value for g in groups] == [float(NODES)]

    converge(peers, client, ready, "Prometheus A")
    return slower_than_peers(client)


@pytest.fixture(scope="module")
def converged_b(peers: PeerFleet, converged_a: list[dict[str, str]]) -> None:
    """B has the same scrapes and rules: once A fires, B has had as long (A first, so that the
    for: of B's rules has long passed too)."""
    client = peers.client_b()

    def ready() -> bool:
        groups = client.query(
            'sparkdiag:gemm_tflops:peer_group_gpus{dtype="bf16", shape="8192x8192x8192"}'
        )
        return [g.value for g in groups] == [float(NODES - 1)]

    converge(peers, client, ready, "Prometheus B")


def test_the_alert_fires_for_the_slow_gpu_alone(converged_a: list[dict[str, str]]) -> None:
    firing = [a for a in converged_a if a["alertstate"] == "firing"]
    assert {(a["instance"], a["uuid"], a["gpu"], a["context"]) for a in firing} == {
        (f"node-{SLOW}:10942", uuid(SLOW), "0", "native")
    }
    kernels = {(a["dtype"], a["shape"]) for a in firing}
    assert len(kernels) == 12  # the compute cube and the LLM shape of six dtypes
    assert not {s for _, s in kernels} & {"1x8192x8192", "32x8192x8192"}  # no decode shape
    assert {k for a in firing for k in a} == {
        "__name__",
        "alertname",
        "alertstate",
        "severity",
        "instance",
        "job",
        "gpu",
        "uuid",
        "dtype",
        "shape",
        "context",
    }
    assert not [a for a in converged_a if a["uuid"] != uuid(SLOW)]  # not even pending


def test_fleet_lists_the_slow_gpu_first_as_the_one_outlier(
    peers: PeerFleet, converged_a: list[dict[str, str]]
) -> None:
    result = run_cli("fleet", "--prometheus", peers.a, "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["source"] == "recorded"
    first = report["gpus"][0]
    assert (first["instance"], first["uuid"], first["status"]) == (
        f"node-{SLOW}:10942",
        uuid(SLOW),
        "outlier",
    )
    assert first["ratio"] == pytest.approx(0.9, abs=0.01)
    assert first["score"] < -3 and first["alert"] == "firing"
    assert first["kernels_below_7_percent"] == 12
    assert [o["uuid"] for o in report["outliers"]] == [uuid(SLOW)]
    assert {g["status"] for g in report["gpus"][1:]} == {"ok"} and len(report["gpus"]) == NODES
    (group,) = report["groups"]
    assert (group["model"], group["gpus"], group["judged"]) == ("NVIDIA H200", NODES, True)
    assert f"drain node-{SLOW}:10942" in report["actions"][0]

    text = run_cli("fleet", "--prometheus", peers.a)
    assert text.returncode == 1
    lines = text.stdout.split("GPUs, slowest first")[1].splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["ratio"])
    # the first row under the header, then its uuid on the line under it
    assert "OUTLIER" in lines[head + 1] and uuid(SLOW) in lines[head + 2], text.stdout
    assert f"node-{SLOW}:10942 GPU 0 ({uuid(SLOW)}): 10.0% below its 9 peers" in text.stdout


def test_fleet_computes_the_same_without_the_recording_rules(
    peers: PeerFleet, converged_a: list[dict[str, str]]
) -> None:
    recorded = fleet_view(peers.client_a())
    computed = fleet_view(peers.client_a(), computed=True, rules=peers.rules)
    assert computed.source == "computed"
    assert (
        [g.uuid for g in computed.outliers] == [g.uuid for g in recorded.outliers] == [uuid(SLOW)]
    )
    assert computed.gpus[0].ratio == pytest.approx(recorded.gpus[0].ratio, abs=0.01)
    assert len(computed.gpus) == len(recorded.gpus) == NODES


def test_all_healthy_no_alert_no_outlier_behind_tls_and_basic_auth(
    peers: PeerFleet, converged_b: None
) -> None:
    assert slower_than_peers(peers.client_b()) == []
    auth = (
        "--prometheus", peers.b, "--prometheus-ca-file", str(peers.ca),
        "--prometheus-username", "sparkdiag",
        "--prometheus-password-file", str(peers.password_file),
    )  # fmt: skip
    result = run_cli("fleet", *auth, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["outliers"] == [] and len(report["gpus"]) == NODES - 1
    assert {g["status"] for g in report["gpus"]} == {"ok"}
    assert min(g["ratio"] for g in report["gpus"]) > 0.99
    assert "nothing to do" in report["actions"][0]

    # the same through promtool's --http.config.file (paths relative to the file)
    http = peers.workdir / "http.yml"
    http.write_text(
        "basic_auth:\n  username: sparkdiag\n  password_file: password\n"
        "tls_config:\n  ca_file: tls.crt\n",
        encoding="utf-8",
    )
    result = run_cli("fleet", "--prometheus", peers.b, "--http.config.file", str(http), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["outliers"] == []


def test_clear_errors_for_a_refused_an_unverified_and_an_unreachable_prometheus(
    peers: PeerFleet,
) -> None:
    wrong = peers.workdir / "wrong"
    wrong.write_text("not-it\n", encoding="utf-8")
    wrong.chmod(0o600)  # a file others may read is warned about, a second line on stderr
    refused = run_cli(
        "fleet",
        "--prometheus",
        peers.b,
        "--prometheus-ca-file",
        str(peers.ca),
        "--prometheus-username",
        "sparkdiag",
        "--prometheus-password-file",
        str(wrong),
    )
    assert refused.returncode == 3 and refused.stdout == ""
    (line,) = refused.stderr.splitlines()
    assert f"Prometheus at {peers.b} refused the query (HTTP 401" in line
    unverified = run_cli("fleet", "--prometheus", peers.b)
    assert unverified.returncode == 3
    assert "CERTIFICATE_VERIFY_FAILED" in unverified.stderr
    assert "--prometheus-ca-file" in unverified.stderr
    port = free_port()
    gone = run_cli("fleet", "--prometheus", f"http://127.0.0.1:{port}")
    assert gone.returncode == 3
    assert gone.stderr.strip().startswith(
        f"Error: cannot reach Prometheus at http://127.0.0.1:{port}"
    )
