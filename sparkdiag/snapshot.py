"""Frozen dataclasses that carry one poll's readings from the sources to the exporter and check.

Units are base units throughout (celsius, hertz, watts, joules, bytes, seconds, ratios 0..1).
``None`` always means "not supported or not readable here", never zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuIdentity:
    """Static identity of one GPU, read once when NVML is initialised."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    driver_version: str
    cuda_capability: str  # "9.0"; "" when unknown
    memory_model: str  # "dedicated" or "unified"


@dataclass(frozen=True)
class ProcessIdentity:
    """Who a process is, read from ``/proc/PID`` (``ps -o comm=,user= -p PID``, and
    ``cat /proc/PID/cgroup`` for the container). "" where unknown."""

    name: str  # the kernel's command name (/proc/PID/comm)
    user: str  # user name of the real uid (from ROOT/etc/passwd), else the uid as a number
    container_id: str  # 64 hex digits of a docker, podman, containerd or cri-o container
    pod_uid: str  # a Kubernetes pod's uid, with dashes


@dataclass(frozen=True)
class GpuProcess:
    """One compute process on one GPU (``nvidia-smi --query-compute-apps`` and ``pmon``)."""

    pid: int  # as NVML reports it (the host's PID namespace)
    used_memory_bytes: float | None  # None where NVML does not say
    sm_utilization_ratio: float | None  # over the last sample window; None without a sample
    identity: ProcessIdentity | None  # None when /proc here does not show the pid


@dataclass(frozen=True)
class NvlinkSample:
    """One NVLink of one GPU (``nvidia-smi nvlink -s -e -gt d``)."""

    link: int
    up: bool
    # "replay", "recovery", "crc_flit", "crc_data": counts
    errors: Mapping[str, float] = field(default_factory=dict)
    data_bytes: Mapping[str, float] = field(default_factory=dict)  # "tx", "rx": since driver load


@dataclass(frozen=True)
class FabricState:
    """The GPU's NVLink fabric registration with the fabric manager (NVSwitch systems;
    ``nvidia-smi --query-gpu=fabric.state,fabric.status``)."""

    state: str  # "not_started", "in_progress", "completed"
    status: str  # the registration's NVML result: "SUCCESS", or an error name once completed
    health: str | None  # "healthy", "unhealthy", "limited_capacity"; None where not reported


@dataclass(frozen=True)
class GpuSample:
    """One poll of one GPU. ``up`` is False once NVML reports the device lost."""

    identity: GpuIdentity
    up: bool
    # sensor -> value ("gpu", "memory")
    temperature_celsius: Mapping[str, float] = field(default_factory=dict)
    # "shutdown", "slowdown", "memory_max", ...
    threshold_celsius: Mapping[str, float] = field(default_factory=dict)
    # "sm", "memory", "graphics", "video"
    clock_hertz: Mapping[str, float] = field(default_factory=dict)
    clock_max_hertz: Mapping[str, float] = field(default_factory=dict)
    # "graphics", "sm": the applications clock (what the GPU runs work at unless a limit holds
    # it lower) and its default; GB10: 2418 MHz of a 3003 MHz maximum
    clock_applications_hertz: Mapping[str, float] = field(default_factory=dict)
    clock_default_applications_hertz: Mapping[str, float] = field(default_factory=dict)
    clock_event_reasons: int | None = None  # raw NVML bitmask
    supported_clock_event_reasons: int | None = None
    # policy -> cumulative seconds
    violation_seconds: Mapping[str, float] = field(default_factory=dict)
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    # "gpu", "memory"
    utilization_ratio: Mapping[str, float] = field(default_factory=dict)
    # "total", "used", "free"; empty when unified
    memory_bytes: Mapping[str, float] = field(default_factory=dict)
    # "current", "max"
    pcie_generation: Mapping[str, float] = field(default_factory=dict)
    # "current", "max"
    pcie_width: Mapping[str, float] = field(default_factory=dict)
    pcie_replay_errors: float | None = None
    # "corrected", "uncorrected"
    ecc_errors: Mapping[str, float] = field(default_factory=dict)
    # "corrected", "uncorrected", "pending", "failure"
    remapped_rows: Mapping[str, float] = field(default_factory=dict)
    performance_state: int | None = None
    compute_pids: tuple[int, ...] | None = None  # None when the process list is unsupported
    persistence_mode: bool | None = None
    compute_mode: str | None = None  # "default", "exclusive_process", "prohibited"
    mig_mode: bool | None = None
    error: str | None = None  # why ``up`` is False
    # Activity (GPM), 0..1: "sm" (SMs busy), "tensor" (any tensor pipe), "dram" (bandwidth);
    # empty where the GPU has no GPM
    activity_ratio: Mapping[str, float] = field(default_factory=dict)
    sm_occupancy_ratio: float | None = None  # resident warps over the maximum (GPM)
    # "encoder", "decoder"
    video_utilization_ratio: Mapping[str, float] = field(default_factory=dict)
    # "tx", "rx": bytes per second, from GPM between two polls, else over NVML's 20 ms window
    pcie_throughput_bytes_per_second: Mapping[str, float] = field(default_factory=dict)
    nvlinks: tuple[NvlinkSample, ...] = ()  # the links NVML reports a state for
    # Per-process metrics (opt-in): None when off or when NVML gives no process list
    processes: tuple[GpuProcess, ...] | None = None
    processes_unseen: int | None = None  # compute processes /proc here does not show
    # What the driver says the GPU needs (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; nvidia-smi -q
    # "GPU Recovery Action"): "none", "gpu_reset", "node_reboot", "drain_p2p",
    # "drain_and_reset", "recover_imex_domain", "bus_reset", "system_reboot" or "unknown";
    # None where the driver does not report it
    recovery_action: str | None = None
    fabric: FabricState | None = None  # None where the GPU joins no NVLink fabric
    xid_events_supported: bool | None = None  # NVML delivers XID events for it (counted)


@dataclass(frozen=True)
class XidCounts:
    """XID events counted by the poller since the daemon started, per GPU index."""

    counts: Mapping[tuple[int, int], int] = field(default_factory=dict)  # (gpu, xid) -> n
    last_timestamp: Mapping[int, float] = field(default_factory=dict)  # gpu -> unix seconds
    last_code: Mapping[int, int] = field(default_factory=dict)  # gpu -> XID of the last event
    # (gpu, tier) -> incidents: XIDs of one tier less than 3 minutes apart are one incident
    incidents: Mapping[tuple[int, str], int] = field(default_factory=dict)
    # (gpu, tier) -> unix seconds of the last XID of that tier
    incident_last: Mapping[tuple[int, str], float] = field(default_factory=dict)


@dataclass(frozen=True)
class PcieLink:
    """One PCI device's link as read from sysfs.

    ``cat /sys/bus/pci/devices/ADDR/{current,max}_link_{speed,width}``.
    """

    address: str  # "0000:01:00.0"
    device_class: str  # "network", "nvme", "display", "bridge", "other"
    driver: str  # "" when no driver is bound
    current_speed_tps: float | None  # transfers per second: 32 GT/s -> 32e9
    max_speed_tps: float | None
    current_width: int | None  # lanes
    max_width: int | None


@dataclass(frozen=True)
class NvmeHealth:
    """An NVMe drive's SMART / health log (log page 02h) as ``smartctl --json -a /dev/nvme0`` or
    ``nvme smart-log -o json /dev/nvme0`` reports it, in base units. None: not reported.

    critical_warning: the bitmask (0 healthy; bit 0 spare below threshold, 1 temperature,
        2 reliability degraded, 3 read-only, 4 volatile backup failed, 5 PMR unreliable)
    percentage_used_ratio: endurance used, 0..1 and beyond (the log's percent / 100)
    available_spare_ratio, available_spare_threshold_ratio: 0..1
    warning_temperature_seconds, critical_temperature_seconds: lifetime time at or above the
        warning (WCTEMP) and critical (CCTEMP) composite temperatures (the log counts minutes)
    thermal_transitions, thermal_seconds: "1", "2" -> the drive's own thermal management
        (TMT1 light, TMT2 heavy throttling): times entered and seconds spent
    source: "smartctl", "nvme-cli" or "fixture"
    """

    critical_warning: int | None = None
    media_errors: float | None = None
    error_log_entries: float | None = None
    percentage_used_ratio: float | None = None
    available_spare_ratio: float | None = None
    available_spare_threshold_ratio: float | None = None
    unsafe_shutdowns: float | None = None
    power_on_seconds: float | None = None
    written_bytes: float | None = None
    warning_temperature_seconds: float | None = None
    critical_temperature_seconds: float | None = None
    thermal_transitions: Mapping[str, float] = field(default_factory=dict)
    thermal_seconds: Mapping[str, float] = field(default_factory=dict)
    source: str = ""


@dataclass(frozen=True)
class NvmeController:
    """One NVMe controller (``/sys/class/nvme/nvme0``), its temperatures and its health log.

    temperature_celsius: sensor -> value ("composite", "1", "2", ...) from hwmon, else the log
    threshold_celsius: "warning" (WCTEMP), "critical" (CCTEMP)
    health: None where no SMART log was read (``health_note`` says why)
    health_read_at: when the log (even one too old to use) was read from the drive, time.time();
        None for a fixture's
    """

    name: str  # "nvme0"
    model: str  # "" where unreadable
    firmware: str
    pci_address: str  # "" for a controller on another transport
    transport: str  # "pcie", "tcp", "rdma", "fc", "loop"; "" unknown
    temperature_celsius: Mapping[str, float] = field(default_factory=dict)
    threshold_celsius: Mapping[str, float] = field(default_factory=dict)
    health: NvmeHealth | None = None
    health_note: str | None = None
    health_read_at: float | None = None


@dataclass(frozen=True)
class ExecutionContext:
    """Where this process runs: ``context`` is native/container, ``runtime`` who runs it."""

    context: str  # "native" or "container"
    runtime: str  # "docker", "podman", "kubernetes", "lxc", "other", "none"
    evidence: tuple[str, ...] = ()  # human-readable signals that led to the verdict


@dataclass(frozen=True)
class PlatformIdentity:
    """The machine as DMI names it (``cat /sys/class/dmi/id/{sys_vendor,product_name,board_name}``);
    ``""`` where a string is not readable."""

    vendor: str  # "NVIDIA", "ASUSTeK COMPUTER INC."
    product: str  # "NVIDIA_DGX_Spark", "GX10"
    board: str  # "P4242"


@dataclass(frozen=True)
class MemoryPressure:
    """Memory pressure stall information (``cat /proc/pressure/memory``).

    ``some``: at least one task was stalled waiting for memory; ``full``: every non-idle task was.
    """

    # "some"/"full" -> window ("10s", "60s", "300s") -> share of wall time stalled, 0..1
    averages: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # "some"/"full" -> stall time since boot, seconds
    stalled_seconds: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class HostSample:
    """Host memory from procfs (``free -b``), swap-ins and memory pressure.

    On a unified-memory GPU (GB10) this memory is the GPU's memory too.
    """

    # "total", "available", "free", "cached"

    memory_bytes: Mapping[str, float] = field(default_factory=dict)
    swap_in_pages: float | None = None  # pswpin of /proc/vmstat: pages swapped in since boot
    pressure: MemoryPressure | None = None  # None where the kernel has no PSI
    # What a new allocation can get now: MemFree plus the page cache's clean, unmapped file
    # pages (sources/host/meminfo.py: obtainable); None where /proc/meminfo lacks a field it needs
    obtainable_bytes: float | None = None
    # The page cache: "total" (Cached + Buffers), "reclaimable" (clean, unmapped file pages),
    # "dirty" (Dirty + Writeback), "mapped", "shmem" (tmpfs, shared memory), "unevictable"
    page_cache_bytes: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CollectorStatus:
    success: bool
    duration_seconds: float
    error: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything one poll saw. Replaced whole by the poller, never mutated."""

    timestamp: float
    poll: int
    nvml_up: bool
    driver_version: str
    gpus: tuple[GpuSample, ...]
    xid: XidCounts
    pcie_links: tuple[PcieLink, ...]
    context: ExecutionContext | None
    host: HostSample | None
    collectors: Mapping[str, CollectorStatus]
    excluded_pids: frozenset[int] = frozenset()  # sparkdiag's own probe workers
    platform: PlatformIdentity | None = None  # DMI identity, read once at start; None without DMI
    # PCI addresses of the NVIDIA GPU functions sysfs lists (vendor 0x10de, class 0x0300 or
    # 0x0302), whatever NVML says; None where sysfs was not read
    gpu_pci_devices: tuple[str, ...] | None = None
    # NVMe controllers (sysfs and, where installed, smartctl or nvme-cli); None where not read
    nvme: tuple[NvmeController, ...] | None = None
