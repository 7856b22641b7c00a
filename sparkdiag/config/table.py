"""Every option sparkdiag has, declared once: the flags, the TOML keys, ``sparkdiag config default``
and the :class:`~sparkdiag.config.Settings` fields are all generated from :data:`OPTIONS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from sparkdiag.config.option import DEFAULT_LISTEN, Option

# An option of ``sparkdiag fleet`` alone: the Prometheus it asks, and how.
_fleet = partial(Option, scopes=frozenset({"fleet"}))

OPTIONS: tuple[Option, ...] = (
    Option(
        "listen",
        "listen",
        "listen",
        DEFAULT_LISTEN,
        "HOST:PORT to serve /metrics, /healthz and / on; 0.0.0.0:PORT lets other hosts scrape.",
    ),
    Option(
        "poll-interval",
        "poll_interval",
        "float",
        1.0,
        "Seconds between telemetry polls; scrapes render the latest poll and never wait.",
        minimum=0.05,
        maximum=3600,
        unit="seconds",
    ),
    Option(
        "idle-poll-interval",
        "idle_poll_interval",
        "float",
        5.0,
        "Seconds between telemetry polls while no scrape is expected (nobody scrapes, or "
        "Prometheus' next scrape is not due yet); the two polls before an expected scrape, and "
        "every poll while scrapes come irregularly, are --poll-interval apart. The hot probe, "
        "the stall log and XID events follow the polls. At or below --poll-interval: every "
        "poll is --poll-interval apart.",
        minimum=0.05,
        maximum=3600,
        unit="seconds",
    ),
    Option(
        "pcie-interval",
        "pcie_interval",
        "float",
        10.0,
        "Seconds between reads of the host PCIe links in sysfs.",
        minimum=0,
        maximum=86400,
        unit="seconds",
    ),
    Option(
        "nvml-fixture",
        "nvml_fixture",
        "path",
        None,
        "Replay NVML answers from this fixture (recorded by record-fixture) instead of the driver.",
        scopes=frozenset(
            {
                "serve",
                "dump",
                "check",
                "probe",
                "record-fixture",
                "watch",
                "soak",
                "bench",
                "native",
            }
        ),
        command_help={
            "record-fixture": "(to normalise an old fixture file)",
            "soak": "(lists the GPUs to soak; the workers still need the real GPUs)",
            "bench": "(says whether there is a GPU to sweep; the sweep needs the real GPU)",
        },
        metavar="FILE",
    ),
    Option(
        "path.sysfs",
        "sysfs",
        "path",
        Path("/sys"),
        "sysfs mount point to read PCIe links from (a fake tree for tests).",
        scopes=frozenset({"serve", "dump", "check", "watch", "link", "storage", "nvme-log"}),
        command_help={
            "check": "check also reads the cpufreq governors under it.",
            "watch": "watch reads the job's cgroup pressure under DIR/fs/cgroup (cgroup v2), "
            "else the host's.",
            "link": "link reads the network interfaces, ConnectX-7 functions and RDMA devices "
            "under it.",
            "nvme-log": "nvme-log lists the NVMe controllers under it; the tools read them only "
            "where it is the machine's own /sys.",
        },
        metavar="DIR",
        existing_dir=True,
    ),
    Option(
        "path.rootfs",
        "rootfs",
        "path",
        Path("/"),
        "Root filesystem to detect the execution context (container or native) under.",
        scopes=frozenset(
            {"serve", "dump", "check", "probe", "watch", "link", "native", "storage", "nvme-log"}
        ),
        command_help={
            "nvme-log": "nvme-log opens the drives as ROOT/dev/nvmeN.",
            "native": "native scans the Pythons under it when it is not /.",
            "link": "link reads /proc/meminfo, /proc/cmdline, /etc/nccl.conf and the system's "
            "NCCL libraries under it.",
            "check": "check also reads the kernel log (ROOT/dev/kmsg; dmesg on the real root) "
            "and process names (ROOT/proc/PID/comm) under it.",
            "watch": "watch reads the job (its process tree, threads, I/O) and the host's "
            "memory pressure under ROOT/proc.",
        },
        metavar="DIR",
        existing_dir=True,
    ),
    Option(
        "log-level",
        "log_level",
        "choice",
        "info",
        "Logging verbosity on stderr.",
        choices=("debug", "info", "warning", "error"),
        scopes=frozenset({"serve", "dump", "check", "probe", "soak", "storage"}),
        # check is quiet by default: every problem a log line would mention is a row of its report.
        command_default={"check": "error"},
    ),
    Option(
        "state-dir",
        "state_dir",
        "path",
        None,
        "Directory for the baseline database; default $STATE_DIRECTORY under systemd, else "
        "$XDG_STATE_HOME/sparkdiag (~/.local/state/sparkdiag where it is not set).",
        scopes=frozenset(
            {"serve", "check", "probe", "baseline", "soak", "native", "storage", "watch"}
        ),
        command_help={
            "native": "native keeps its scan cache there, in cuda-libraries.json.",
            "watch": "watch reads what sparkdiag storage measured there (storage.json) to say "
            "how fast the store the job writes or reads is.",
            "check": "check only reads baselines.sqlite there: it never creates nor teaches one.",
            "soak": "soak keeps the latest verdict per GPU there, in soak.json.",
        },
        metavar="DIR",
    ),
    Option(
        "web.config.file",
        "web_config_file",
        "path",
        None,
        "Web configuration (TLS, basic auth with bcrypt hashes) in the exporter-toolkit "
        "format that Prometheus exporters share.",
    ),
    Option(
        "web.max-requests",
        "web_max_requests",
        "int",
        40,
        "Concurrent HTTP requests served; more get 503. 0 means no limit.",
        minimum=0,
        maximum=10000,
    ),
    Option(
        "probe.enabled",
        "probe_enabled",
        "bool",
        True,
        "Run the periodic GEMM and bandwidth probe (needs torch in --probe.python).",
    ),
    Option(
        "probe.interval",
        "probe_interval",
        "float",
        300.0,
        "Seconds between probe cycles (a random jitter of up to 10 % is added).",
        minimum=1,
        maximum=86400,
        unit="seconds",
    ),
    Option(
        "probe.when",
        "probe_when",
        "choice",
        "idle",
        "idle: skip a cycle while another process computes on the GPU; always: run anyway.",
        choices=("idle", "always"),
        scopes=frozenset({"serve", "probe", "compare", "soak"}),
        command_help={
            "compare": "(idle stops the comparison when another process uses it)",
            "soak": "(idle: a GPU another process computes on is not soaked)",
        },
    ),
    Option(
        "probe.busy-utilization",
        "probe_busy_utilization",
        "float",
        0.10,
        "GPU utilization (0..1) above which the GPU counts as busy.",
        minimum=0,
        maximum=1,
        scopes=frozenset({"serve", "probe", "check", "soak"}),
    ),
    Option(
        "probe.timeout",
        "probe_timeout",
        "float",
        60.0,
        "Seconds after which a probe worker is killed (with its process group). Each command "
        "has its own default, sized to its worker: serve and probe 60 (one cycle), check 25 (a "
        "suite of about a second of GPU time), compare 120 (a container start per cycle), soak "
        "120 (on top of the load), bench 1800 (one worker for the whole sweep).",
        minimum=1,
        maximum=3600,
        unit="seconds",
        scopes=frozenset({"serve", "probe", "check", "compare", "bench", "soak"}),
        # check's short suite takes about a second of GPU time; compare's cycles include a
        # container start; a bench sweep is one long worker run; a soak's worker gets its
        # --duration and --window on top.
        command_default={"check": 25.0, "compare": 120.0, "bench": 1800.0, "soak": 120.0},
        command_help={
            "compare": "(per cycle, container start included)",
            "bench": "(for the whole sweep)",
            "soak": "(on top of --duration and one --window: the setup and the way out)",
        },
        metavar="SECONDS",
    ),
    Option(
        "probe.python",
        "probe_python",
        "argv",
        None,
        "Interpreter that runs the probe worker, as an argument list; default this Python.",
        scopes=frozenset({"serve", "native", "storage"}),
    ),
    Option(
        "probe.container-command",
        "probe_container_command",
        "argv",
        None,
        "Also probe inside a container: the argument list that starts a Python reading a script "
        "on standard input, e.g. docker run -i --rm --gpus all IMAGE python3 - . Its results "
        'carry context="container" beside the native ones.',
        scopes=frozenset({"serve"}),
    ),
    Option(
        "probe.container-interval",
        "probe_container_interval",
        "float",
        1800.0,
        "Seconds between container probe cycles.",
        minimum=1,
        maximum=86400,
        unit="seconds",
    ),
    Option(
        "probe.fixture",
        "probe_fixture",
        "path",
        None,
        "Replay probe results recorded on a real GPU (worker JSON documents) instead of "
        "running the worker; for tests and demonstrations without a GPU.",
        scopes=frozenset({"serve", "probe", "check"}),
        metavar="FILE",
    ),
    Option(
        "probe.first-delay",
        "probe_first_delay",
        "float",
        30.0,
        "Seconds after start before the first probe cycle.",
        minimum=0,
        maximum=86400,
        unit="seconds",
    ),
    Option(
        "baseline.history-runs",
        "baseline_history_runs",
        "int",
        288,
        "Probe results kept per baseline (GPU, kernel, context, software) in the state "
        "directory's store: the newest this many (288: a day at the default probe interval), "
        "beside the first healthy runs a baseline was learned from and the latest run, which "
        "are always kept. Bounds the store's size; Prometheus keeps the figures' history.",
        minimum=1,
        maximum=100000,
    ),
    Option(
        "baseline.history-days",
        "baseline_history_days",
        "float",
        30.0,
        "Days a probe result is kept in the store at most (the latest run of each baseline "
        "and the runs it was learned from are kept longer).",
        minimum=0.01,
        maximum=36500,
        unit="days",
    ),
    Option(
        "probe.hot-enabled",
        "probe_hot_enabled",
        "bool",
        True,
        "Run the short hot probe (int4, bf16, fp16, fp8 at decode and LLM shapes, about 100 ms "
        "of GPU time) when the GPU runs hot, even while it is busy, so that 4-bit throughput is "
        "measured when memory is hot (the thermal-int4 alert needs it).",
    ),
    Option(
        "probe.hot-memory-celsius",
        "probe_hot_memory_celsius",
        "float",
        80.0,
        "Memory temperature at which the GPU counts as hot (HBM throttles above about 85 °C).",
        minimum=20,
        maximum=150,
        unit="°C",
    ),
    Option(
        "probe.hot-gpu-celsius",
        "probe_hot_gpu_celsius",
        "float",
        85.0,
        "GPU temperature at which the GPU counts as hot where memory has no sensor (GB10's "
        "LPDDR5X): GB10 was reported to slow down at 91-92 °C, the H200 at 89 °C.",
        minimum=20,
        maximum=150,
        unit="°C",
    ),
    Option(
        "probe.hot-interval",
        "probe_hot_interval",
        "float",
        120.0,
        "Seconds between hot probes while the GPU stays hot (one also runs when it becomes "
        "hot, and when a thermal clock event reason turns on).",
        minimum=1,
        maximum=86400,
        unit="seconds",
    ),
    Option(
        "probe.hot-min-interval",
        "probe_hot_min_interval",
        "float",
        60.0,
        "At most one hot probe per GPU within this many seconds, whatever triggers it.",
        minimum=1,
        maximum=86400,
        unit="seconds",
    ),
    Option(
        "web.read-timeout",
        "web_read_timeout",
        "float",
        10.0,
        "Seconds a client has for each step of a connection: the TLS handshake, sending a "
        "whole request, reading the answer; and how long an idle kept-alive connection stays "
        "open. Slower or silent clients are disconnected.",
        minimum=0.1,
        maximum=3600,
        unit="seconds",
    ),
    Option(
        "web.max-connections",
        "web_max_connections",
        "int",
        512,
        "Open HTTP connections kept. At the limit a new connection closes the longest-idle "
        "one; when none is idle it gets 503 (TLS: is closed). Keep it below the open-files "
        "limit.",
        minimum=1,
        maximum=100000,
    ),
    Option(
        "peer",
        "peer",
        "str",
        None,
        "Also measure the link to this host (HOST or HOST:PORT), which runs 'sparkdiag link "
        "serve': a short 'sparkdiag link test' (2 s per direction and path, at most 30 s).",
        scopes=frozenset({"check"}),
        metavar="HOST",
    ),
    Option(
        "link.secret-file",
        "link_secret_file",
        "path",
        None,
        "The link secret shared by the two machines of 'sparkdiag link' (default "
        "~/.config/sparkdiag/link.secret): 'link serve' makes it where none is; copy it to the "
        "measuring machine, mode 0600.",
        scopes=frozenset({"link", "check"}),
        metavar="FILE",
    ),
    Option(
        "process-metrics",
        "process_metrics",
        "bool",
        False,
        "Export per-process GPU memory and SM utilization, labelled with the process name, user, "
        "container id and pod uid read from /proc under --path.rootfs (in a container, run it "
        "with the host's PID namespace).",
        scopes=frozenset({"serve", "dump"}),
    ),
    Option(
        "process-metrics-top",
        "process_metrics_top",
        "int",
        10,
        "Per-process metrics for at most this many processes per GPU, those using the most GPU "
        "memory.",
        minimum=1,
        maximum=1000,
        scopes=frozenset({"serve", "dump"}),
    ),
    Option(
        "compat.dcgm",
        "compat_dcgm",
        "bool",
        False,
        "Also export dcgm-exporter's fields under its names, units and labels "
        "(DCGM_FI_DEV_GPU_TEMP, DCGM_FI_DEV_FB_USED, ...), beside the sparkdiag series, so that "
        "dashboards and alerts written for dcgm-exporter work unchanged (docs/metrics.md).",
        scopes=frozenset({"serve", "dump"}),
    ),
    Option(
        "storage.enabled",
        "storage_enabled",
        "bool",
        False,
        "Run the periodic storage probe. Off by default because it WRITES: every "
        "storage.interval it writes a test file of storage.size into storage.directory (with "
        "O_DIRECT, removed however it ends) and reads it back, skipped while a GPU is busy.",
    ),
    Option(
        "storage.directory",
        "storage_directory",
        "path",
        None,
        "Directory the periodic storage probe measures (the checkpoint or data set's); default "
        "the state directory.",
        metavar="DIR",
    ),
    Option(
        "storage.interval",
        "storage_interval",
        "float",
        21600.0,
        "Seconds between periodic storage probes (SparkdiagStorageSlow needs two in a row).",
        minimum=600,
        maximum=30 * 86400,
        unit="seconds",
    ),
    Option(
        "storage.size",
        "storage_size",
        "int",
        1 << 30,
        "Bytes the storage probe writes (its test file), then reads back; the filesystem keeps "
        "at least 5 % of its size plus 64 MiB free or the probe refuses. Defaults: 256 MiB for "
        "check (it runs before a benchmark), 1 GiB elsewhere.",
        minimum=16 << 20,
        maximum=64 << 30,
        unit="bytes",
        scopes=frozenset({"serve", "storage", "check"}),
        command_default={"check": 256 << 20},
        metavar="BYTES",
    ),
    Option(
        "storage.duration",
        "storage_duration",
        "float",
        20.0,
        "Seconds the storage probe may take at most (45 % writing, 35 % reading, 20 % random "
        "4 KiB reads); a phase also ends when its bytes are done. Defaults: check 8 (it runs "
        "before a benchmark), 20 elsewhere.",
        minimum=1,
        maximum=600,
        unit="seconds",
        scopes=frozenset({"serve", "storage", "check"}),
        command_default={"check": 8.0},
        metavar="SECONDS",
    ),
    Option(
        "storage.first-delay",
        "storage_first_delay",
        "float",
        120.0,
        "Seconds after start before the first periodic storage probe (the daemon and the "
        "machine settle first).",
        minimum=0,
        maximum=86400,
        unit="seconds",
    ),
    Option(
        "storage.gpu",
        "storage_gpu",
        "int",
        None,
        "Also read the storage probe's test file into this GPU (its index), after the host "
        "phases: through pinned host memory, and by GPUDirect Storage where kvikio is installed "
        "(the probe worker, with torch in --probe.python); 35 % of storage.duration more, plus "
        "the worker's start. Default: host memory only.",
        minimum=0,
        maximum=63,
        scopes=frozenset({"serve", "storage"}),
        metavar="N",
    ),
    Option(
        "storage.gds",
        "storage_gds",
        "bool",
        True,
        "With storage.gpu, also read by GPUDirect Storage (cuFile through kvikio, where "
        "installed: pip install 'sparkdiag[gds]'); a compatibility mode is reported as such.",
        scopes=frozenset({"serve", "storage"}),
    ),
    Option(
        "nvme.smart",
        "nvme_smart",
        "bool",
        True,
        "Read each NVMe drive's SMART/health log (critical warning, media errors, wear, "
        "thermal throttling) with smartctl or nvme-cli where installed; needs root. Temperatures "
        "come from sysfs either way.",
        scopes=frozenset({"serve", "dump", "check"}),
    ),
    Option(
        "nvme.fixture",
        "nvme_fixture",
        "path",
        None,
        "Read the NVMe health logs from recorded tool output in this directory "
        "(nvme0.smartctl.json or nvme0.nvme-cli.json) instead of running the tools.",
        scopes=frozenset({"serve", "dump", "check"}),
        metavar="DIR",
    ),
    Option(
        "nvme.log-dir",
        "nvme_log_dir",
        "path",
        None,
        "The directory of the NVMe SMART logs sparkdiag nvme-log writes as root (the systemd "
        "timer sparkdiag-nvme-log.timer: /run/sparkdiag-nvme); serve, dump and check read them "
        "there instead of running the tools, which need root, and export each file's age.",
        scopes=frozenset({"serve", "dump", "check", "nvme-log"}),
        command_default={"nvme-log": Path("/run/sparkdiag-nvme")},
        command_help={"nvme-log": "nvme-log writes them there (made 0755 when missing)."},
        metavar="DIR",
    ),
    Option(
        "nvme.log-max-age",
        "nvme_log_max_age",
        "float",
        900.0,
        "With --nvme.log-dir: a drive's file older than this is not read (its health series "
        "go; its age stays); the timer writes every 5 minutes.",
        scopes=frozenset({"serve", "dump", "check"}),
        minimum=1,
        maximum=7 * 86400,
        unit="seconds",
    ),
    # sparkdiag fleet: the Prometheus it asks, with promtool's TLS and basic-auth settings.
    _fleet(
        "prometheus",
        "prometheus_url",
        "str",
        "http://localhost:9090",
        "The Prometheus that scrapes the sparkdiag daemons (its HTTP API is all fleet uses).",
        metavar="URL",
    ),
    _fleet(
        "http.config.file",
        "http_config_file",
        "path",
        None,
        "Prometheus' HTTP client configuration, as promtool's --http.config.file reads it "
        "(basic_auth, authorization, tls_config); the prometheus-* settings win over it.",
        metavar="FILE",
    ),
    _fleet(
        "prometheus-ca-file",
        "prometheus_ca_file",
        "path",
        None,
        "CA certificate(s) to verify an https Prometheus with.",
        metavar="FILE",
    ),
    _fleet(
        "prometheus-cert-file",
        "prometheus_cert_file",
        "path",
        None,
        "Client certificate for TLS client authentication.",
        metavar="FILE",
    ),
    _fleet(
        "prometheus-key-file",
        "prometheus_key_file",
        "path",
        None,
        "Key of the client certificate.",
        metavar="FILE",
    ),
    _fleet(
        "prometheus-insecure-skip-verify",
        "prometheus_insecure_skip_verify",
        "bool",
        None,
        "Do not verify the Prometheus certificate (tests only); --no-... verifies it "
        "whatever --http.config.file says. Neither: as the file's tls_config says "
        "(verified where it says nothing).",
    ),
    _fleet(
        "prometheus-username",
        "prometheus_username",
        "str",
        None,
        "Basic-auth username.",
        metavar="NAME",
    ),
    _fleet(
        "prometheus-password-file",
        "prometheus_password_file",
        "path",
        None,
        "File holding the basic-auth password (never on the command line).",
        metavar="FILE",
    ),
    _fleet(
        "prometheus-timeout",
        "prometheus_timeout",
        "float",
        15.0,
        "Seconds each query may take.",
        metavar="SECONDS",
        minimum=0.1,
        maximum=600,
        unit="seconds",
    ),
)
OPTIONS_BY_KEY = {option.key: option for option in OPTIONS}
OPTIONS_BY_ATTR = {option.attr: option for option in OPTIONS}


# Every Settings field's default is the one declared in OPTIONS.
DEFAULTS: Mapping[str, Any] = {option.attr: option.default for option in OPTIONS}
