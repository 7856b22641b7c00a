"""The shipped unit under a real systemd: PID 1 of a podman container (``--systemd=always``).

The image (tests/fixtures/containerfiles/systemd.Containerfile) installs sparkdiag as
docs/deploy.md's "Running as a service" says: a venv in /opt/sparkdiag from the wheel, the unit
and the config from ``sparkdiag assets``, enabled. Each test changes /etc/sparkdiag/config.toml
or adds a drop-in, restarts the unit, watches what systemd reports, and puts the defaults back.

The tests share one container and run in file order (each leaves the unit running with the
shipped configuration).
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Iterator

import pytest

from tests.support import FIXTURES, NVML, PROBE, ROOT, SYSFS
from tests.support.engine import Images, container, podman, wait_for

pytestmark = [pytest.mark.systemd, pytest.mark.container]

UNIT = "sparkdiag"
DROPIN = "/etc/systemd/system/sparkdiag.service.d/test.conf"
CONFIG = "/etc/sparkdiag/config.toml"
TEST_FILES = "/opt/sparkdiag-test"
STATE = "/var/lib/private/sparkdiag"  # DynamicUser=yes keeps StateDirectory= here
SERVICE_FILES = (ROOT / "tests" / "fixtures" / "service").resolve()


def sh(name: str, script: str, timeout: float = 60, check: bool = True) -> str:
    """Run a shell script in the container as root; its stdout."""
    done = podman("exec", name, "sh", "-c", script, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{script!r} exited {done.returncode}: {done.stdout}{done.stderr}")
    return done.stdout


def show(name: str, *props: str) -> dict[str, str]:
    out = sh(name, f"systemctl show {UNIT} " + " ".join(f"-p {p}" for p in props))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal(name: str, since_cursor: str | None = None) -> str:
    after = f" --after-cursor={shlex.quote(since_cursor)}" if since_cursor else ""
    return sh(name, f"journalctl -u {UNIT} -o cat --no-pager{after}")


def cursor(name: str) -> str:
    """The unit's last journal entry: the journal's own last one may be another unit's, past
    which (the root timer's sparkdiag-nvme-log, 15 s after boot) the unit's next lines were
    not all listed (its watchdog timeout was missed, found when the timer came)."""
    out = sh(name, f"journalctl -u {UNIT} -n 1 -o json --no-pager")
    return str(json.loads(out.splitlines()[-1])["__CURSOR"])


def fetch(name: str, path: str) -> tuple[int, str]:
    """GET http://127.0.0.1:10942PATH from inside the container: (status, body)."""
    script = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        "    r = urllib.request.urlopen('http://127.0.0.1:10942' + sys.argv[1], timeout=5)\n"
        "    print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code)\n"
        "except OSError as e:\n"
        "    print(0); print(e)\n"
    )
    done = podman("exec", name, "python3", "-c", script, path, check=False)
    status, _, body = done.stdout.partition("\n")
    return int(status or 0), body


def metrics_with(name: str, needle: str, seconds: float = 20) -> str:
    """The first /metrics page that holds ``needle``, waited for; the journal if none did."""

    def exported() -> str | None:
        status, body = fetch(name, "/metrics")
        return body if status == 200 and needle in body else None

    body = wait_for(exported, seconds, every=0.5)
    assert body, journal(name)
    return body


def write(name: str, path: str, text: str) -> None:
    podman(
        "exec", "-i", name, "sh", "-c", f"mkdir -p $(dirname {path}) && cat > {path}", input=text
    )


def configure(name: str, config: str | None = None, dropin: str | None = None) -> None:
    """Set the config (None: the shipped one) and the test drop-in (None: none), restart."""
    if config is None:
        sh(name, f"cp {TEST_FILES}/config.toml.shipped {CONFIG}")
    else:
        write(name, CONFIG, config)
    if dropin is None:
        sh(name, f"rm -f {DROPIN}")
    else:
        write(name, DROPIN, "[Service]\n" + dropin)
    sh(name, f"systemctl daemon-reload && systemctl reset-failed {UNIT}")
    sh(name, f"systemctl restart {UNIT}", check=False)  # a config error fails the restart


def wait_active(name: str, seconds: float = 30) -> dict[str, str]:
    def active() -> dict[str, str] | None:
        state = show(name, "ActiveState", "SubState", "MainPID", "NRestarts", "StatusText")
        return state if state["ActiveState"] == "active" else None

    state = wait_for(active, seconds, every=0.3)
    assert state, f"{UNIT} not active: {show(name, 'ActiveState', 'Result')}\n{journal(name)}"
    return state


def processes(name: str) -> list[tuple[int, str, str]]:
    """(pid, user, command line) of every process in the container."""
    out = sh(name, "ps -eo pid=,user:20=,args=")
    found = []
    for line in out.splitlines():
        pid, user, args = line.split(None, 2)
        found.append((int(pid), user, args))
    return found


@pytest.fixture(scope="module")
def service(images: Images) -> Iterator[str]:
    image = images.systemd()
    with container(image, run_options=["--systemd=always"]) as name:
        booted = wait_for(
            lambda: (
                sh(name, "systemctl is-system-running", check=False).strip()
                in ("running", "degraded")
            ),
            60,
            every=0.5,
        )
        assert booted, sh(name, "systemctl --failed --no-pager", check=False)
        sh(name, f"mkdir -p {TEST_FILES} && cp {CONFIG} {TEST_FILES}/config.toml.shipped")
        for source in (
            NVML / "h200-idle.json",
            PROBE / "h200-default.json",
            SERVICE_FILES / "hung_worker.py",
            SERVICE_FILES / "try_writes.py",
        ):
            podman("cp", str(source), f"{name}:{TEST_FILES}/{source.name}")
        sh(name, f"chmod -R a+rX {TEST_FILES}")
        wait_active(name)
        yield name


def test_starts_active_with_ready_and_status_text(service: str) -> None:
    state = wait_active(service)
    # Type=notify: "active" means the daemon sent READY=1 (after its first poll); STATUS= is ours
    assert state["StatusText"] == "serving 127.0.0.1:10942; NVML down, 0 GPU(s)", state
    assert state["NRestarts"] == "0"
    times = show(service, "ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic")
    start = int(times["ExecMainStartTimestampMonotonic"])
    ready = int(times["ActiveEnterTimestampMonotonic"])
    assert ready > start
    print(f"start to READY: {(ready - start) / 1e6:.2f} s")
    log = journal(service)
    assert "NVML unavailable" in log and "serving http://127.0.0.1:10942/metrics" in log, log


def test_metrics_answer_and_context_is_podman(service: str) -> None:
    status, body = fetch(service, "/metrics")
    assert status == 200, body
    assert "sparkdiag_nvml_up 0.0" in body
    assert 'sparkdiag_context_info{context="container",runtime="podman"} 1.0' in body
    assert fetch(service, "/healthz")[0] == 200


def test_hardening_is_in_effect(service: str) -> None:
    """The daemon runs as a dynamic user without capabilities or new privileges, under a
    seccomp filter, and nothing of its unit can write outside its state directory (its own
    /tmp is private)."""
    configure(
        service,
        dropin=f"ExecStartPre=/opt/sparkdiag/bin/python {TEST_FILES}/try_writes.py\n",
    )
    state = wait_active(service)
    status = sh(service, f"cat /proc/{state['MainPID']}/status")
    fields = dict(re.findall(r"^(\w+):\s*(.*)$", status, re.M))
    uid = int(fields["Uid"].split()[0])
    assert 61184 <= uid <= 65519, f"not a dynamic user: uid {uid}"  # systemd's DynamicUser range
    assert int(fields["CapEff"], 16) == 0 and int(fields["CapBnd"], 16) == 0, fields
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2", fields

    report = json.loads(sh(service, f"cat {STATE}/writes.json"))
    writes = report["writes"]
    assert writes.pop("/var/lib/sparkdiag") == "ok", writes  # $STATE_DIRECTORY
    assert writes.pop("/tmp") == "ok" and writes.pop("/var/tmp") == "ok", writes  # private ones
    refused = {place: result for place, result in writes.items() if result == "ok"}
    assert not refused, f"the unit could write to {sorted(refused)}"
    assert set(writes.values()) <= {"EROFS", "EACCES", "EPERM", "ENOENT"}, writes
    # PrivateTmp: the unit's /tmp is not the system's
    assert sh(service, "ls /tmp/sparkdiag-write-test 2>/dev/null || true").strip() == ""
    configure(service)
    wait_active(service)


def test_watchdog_restarts_a_frozen_daemon(service: str) -> None:
    configure(service, dropin="WatchdogSec=3s\n")
    first = wait_active(service)
    time.sleep(7)  # more than twice the watchdog period: fed by the poll loop, no restart
    fed = show(service, "ActiveState", "NRestarts", "MainPID")
    assert fed == {"ActiveState": "active", "NRestarts": "0", "MainPID": first["MainPID"]}, fed
    mark = cursor(service)
    frozen_at = time.monotonic()
    sh(service, f"kill -STOP {first['MainPID']}")

    def restarted() -> dict[str, str] | None:
        state = show(service, "ActiveState", "NRestarts", "MainPID")
        return state if state["NRestarts"] == "1" and state["ActiveState"] == "active" else None

    state = wait_for(restarted, 45, every=0.5)
    elapsed = time.monotonic() - frozen_at
    log = journal(service, mark)
    assert state, f"no restart after SIGSTOP: {show(service, 'ActiveState', 'NRestarts')}\n{log}"
    assert state["MainPID"] != first["MainPID"]
    assert "Watchdog timeout" in log, log
    print(f"SIGSTOP to active again: {elapsed:.1f} s (WatchdogSec=3s, RestartSec=5s)")
    configure(service)
    wait_active(service)


def test_configuration_error_stops_without_a_restart_loop(service: str) -> None:
    mark = cursor(service)
    configure(service, config='no-such-key = 1\nlisten = "127.0.0.1:10942"\n')

    def failed() -> dict[str, str] | None:
        state = show(service, "ActiveState", "Result", "ExecMainStatus", "NRestarts")
        return state if state["ActiveState"] == "failed" else None

    state = wait_for(failed, 20, every=0.3)
    assert state, show(service, "ActiveState", "SubState")
    assert state["Result"] == "exit-code" and state["ExecMainStatus"] == "2", state
    time.sleep(7)  # longer than RestartSec=5s: Restart=on-failure would have tried again
    later = show(service, "ActiveState", "NRestarts", "ExecMainStatus")
    assert later == {"ActiveState": "failed", "NRestarts": "0", "ExecMainStatus": "2"}, later
    log = journal(service, mark)
    assert "no-such-key" in log, log
    assert "Traceback" not in log, log
    assert log.count("Started sparkdiag") == 0, log
    configure(service)
    wait_active(service)


def _baseline_rows(service: str) -> list[dict[str, object]]:
    """The baseline store read from a copy (a reader must not leave files owned by root)."""
    out = sh(
        service,
        "rm -rf /root/copy && mkdir /root/copy && cp -a "
        f"{STATE}/baselines.sqlite* /root/copy/ 2>/dev/null; "
        "/opt/sparkdiag/bin/sparkdiag baseline show --state-dir /root/copy --json "
        "2>/dev/null || echo '[]'",
    )
    rows: list[dict[str, object]] = json.loads(out)
    return rows


def test_baselines_in_state_directory_survive_a_restart(service: str) -> None:
    fixtures = (
        f'nvml-fixture = "{TEST_FILES}/h200-idle.json"\n'
        "[probe]\n"
        f'fixture = "{TEST_FILES}/h200-default.json"\n'
        "first-delay = 0\n"
    )
    configure(service, config=fixtures + "interval = 1\n")
    wait_active(service)
    learned = wait_for(
        lambda: [r for r in _baseline_rows(service) if r["dtype"] == "bf16"], 40, every=1
    )
    assert learned, journal(service)
    before = {(r["dtype"], r["shape"]): r["created_at"] for r in learned}

    # One cycle only after the restart: a store that did not survive would have no baseline
    configure(service, config=fixtures + "interval = 3600\n")
    wait_active(service)

    body = metrics_with(service, "sparkdiag_gemm_baseline_tflops{")
    runs = re.search(r'sparkdiag_probe_runs_total\{[^}]*result="ok"[^}]*\} (\S+)', body)
    assert runs and float(runs.group(1)) == 1.0, "expected exactly one cycle since the restart"
    assert re.search(r'sparkdiag_gemm_baseline_tflops\{[^}]*dtype="bf16"', body)
    after = {(r["dtype"], r["shape"]): r["created_at"] for r in _baseline_rows(service)}
    assert all(after.get(key) == created for key, created in before.items()), (before, after)
    owner = sh(service, f"stat -c %U {STATE}/baselines.sqlite").strip()
    assert owner != "root"
    configure(service)
    wait_active(service)


# A stand-in smartctl: this container has no drive of its own to read (its /sys is the host's,
# which may list some); every device answers with a recorded U.2 drive's log.
FAKE_SMARTCTL = f"""#!/bin/sh
cat {TEST_FILES}/nvme0.smartctl.json
"""


def test_the_root_timer_writes_smart_logs_the_daemon_reads(service: str) -> None:
    """A drive's SMART log needs root, which the daemon's dynamic user lacks: the timer enabled
    with the daemon runs sparkdiag-nvme-log.service as root, which writes /run/sparkdiag-nvme
    and keeps it after it ends (a oneshot's runtime directory goes otherwise); the daemon reads
    a drive's file there through its sandbox and exports its health and age."""
    helper = "sparkdiag-nvme-log"
    assert sh(service, f"systemctl is-enabled {helper}.timer").strip() == "enabled"
    assert sh(service, f"systemctl is-active {helper}.timer").strip() == "active"
    podman(
        "cp",
        str(FIXTURES / "nvme" / "datacenter-u2" / "nvme0.smartctl.json"),
        f"{service}:{TEST_FILES}/nvme0.smartctl.json",
    )
    podman("cp", str(SYSFS / "nvme-u2"), f"{service}:{TEST_FILES}/sysfs-u2")
    # without a tool (as booted) the helper is skipped, not failed
    sh(service, f"systemctl start {helper}.service")
    skipped = sh(service, f"systemctl show {helper}.service -p ConditionResult -p Result")
    assert "ConditionResult=no" in skipped and "Result=success" in skipped, skipped
    write(service, "/usr/sbin/smartctl", FAKE_SMARTCTL)
    sh(service, f"chmod -R a+rX {TEST_FILES} && chmod 0755 /usr/sbin/smartctl")
    sh(service, f"systemctl start {helper}.service", check=False)
    out = sh(service, f"systemctl show {helper}.service -p Result -p ExecMainStatus")
    state = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    said = sh(service, f"journalctl -u {helper} -o cat --no-pager")
    assert state == {"Result": "success", "ExecMainStatus": "0"}, (state, said)
    assert "smartctl log in /run/sparkdiag-nvme/" in said or "no NVMe drive under" in said, said
    assert sh(service, "stat -c %a /run/sparkdiag-nvme").strip() == "755"
    for name in sh(service, "ls /run/sparkdiag-nvme").split():  # the host's drives, if any
        assert sh(service, f"stat -c %a:%U /run/sparkdiag-nvme/{name}").strip() == "644:root"

    # the daemon, on a sysfs with one drive, reads that drive's file as the helper leaves it
    sh(
        service,
        f"install -m 0644 {TEST_FILES}/nvme0.smartctl.json /run/sparkdiag-nvme/nvme0.smartctl.json",
    )
    configure(service, config=f'[path]\nsysfs = "{TEST_FILES}/sysfs-u2"\n')
    wait_active(service)

    body = metrics_with(service, "sparkdiag_nvme_critical_warning{")
    assert 'sparkdiag_nvme_critical_warning{device="nvme0"} 0.0' in body
    age = re.search(r'sparkdiag_nvme_smart_log_age_seconds\{device="nvme0"\} (\S+)', body)
    assert age and 0 <= float(age.group(1)) < 120, body
    configure(service)
    wait_active(service)


def _store_row(service: str, *flags: str) -> dict[str, str]:
    fixture = f"--nvml-fixture {TEST_FILES}/h200-idle.json"
    command = f"/opt/sparkdiag/bin/sparkdiag check --quick --json {fixture} {' '.join(flags)}"
    out = sh(service, command, timeout=120, check=False)
    rows = json.loads(out)["checks"]
    return next(r for r in rows if r["name"] == "baseline-store")


def test_check_run_by_hand_names_the_services_state_directory(service: str) -> None:
    """check run as a user reads ~/.local/state/sparkdiag, not the baselines the service keeps
    in /var/lib/sparkdiag (DynamicUser's link into /var/lib/private): its baseline-store row
    says where they are and how to read them, and, given that directory as root, reads them
    without the hint. Runs after the baselines test, so the service has learned some."""
    assert sh(service, "readlink /var/lib/sparkdiag").strip() == "private/sparkdiag"
    own = _store_row(service)
    assert own["status"] == "skip", own
    assert "/root/.local/state/sparkdiag" in own["finding"], own
    assert "the sparkdiag service keeps its baselines in /var/lib/sparkdiag" in own["action"]
    assert "--state-dir /var/lib/sparkdiag" in own["action"], own
    shared = _store_row(service, "--state-dir", "/var/lib/sparkdiag")
    assert shared["status"] == "pass", shared
    assert "service keeps" not in (shared.get("action") or ""), shared


def _hung_worker_running(service: str) -> list[tuple[int, str, str]]:
    return [
        p for p in processes(service) if "hung_worker.py" in p[2] or "hung-worker-child" in p[2]
    ]


@pytest.mark.parametrize("kill_mode", ["control-group", "mixed"])
def test_stop_within_timeout_leaves_no_worker(service: str, kill_mode: str) -> None:
    """``systemctl stop`` while a probe worker (a stand-in that hangs, with a child) runs.

    control-group (the shipped unit's default): systemd signals every process of the unit.
    mixed: systemd sends SIGTERM to the daemon alone and kills what is left only after the
    daemon exited, naming each such process in the journal: so the daemon itself must end its
    worker's process group."""
    config = (
        f'nvml-fixture = "{TEST_FILES}/h200-idle.json"\n'
        "[probe]\n"
        f'python = ["/opt/sparkdiag/bin/python", "{TEST_FILES}/hung_worker.py"]\n'
        "first-delay = 0\n"
        "timeout = 600\n"
    )
    configure(service, config=config, dropin=f"KillMode={kill_mode}\n")
    wait_active(service)
    workers = wait_for(lambda: len(_hung_worker_running(service)) >= 2 or None, 20)
    assert workers, f"the stand-in worker never started\n{journal(service)}"
    timeout = show(service, "TimeoutStopUSec")["TimeoutStopUSec"]
    mark = cursor(service)
    started = time.monotonic()
    sh(service, f"systemctl stop {UNIT}", timeout=120)
    elapsed = time.monotonic() - started
    state = show(service, "ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
    log = journal(service, mark)
    print(f"KillMode={kill_mode}: systemctl stop took {elapsed:.2f} s (TimeoutStopSec={timeout})")
    left = _hung_worker_running(service)
    assert not left, f"worker processes left after stop: {left}"
    assert state["ActiveState"] == "inactive" and state["Result"] == "success", (state, log)
    assert elapsed < 30, f"stop took {elapsed:.1f} s, TimeoutStopSec is {timeout}"
    assert "Killing process" not in log, log  # systemd had nothing left to kill
    assert "timed out" not in log, log
    configure(service)
    wait_active(service)
