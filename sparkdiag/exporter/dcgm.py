"""dcgm-exporter's series, from the same snapshot (opt-in: ``--compat.dcgm``).

Dashboards and alert rules written for NVIDIA's dcgm-exporter query its field names
(``DCGM_FI_DEV_GPU_TEMP``), units (MHz, W, °C, MiB, mJ, percent) and labels (``gpu``, ``UUID``,
``pci_bus_id``, ``device`` as ``nvidiaN``, ``modelName``, ``Hostname``, the driver version as
the label ``DCGM_FI_DRIVER_VERSION``). This collector exports those fields beside the sparkdiag
series, each converted from the sparkdiag reading it comes from: every value here is also in a
``sparkdiag_*`` series, in base units (docs/metrics.md has the mapping table).

The fields are those of dcgm-exporter's ``etc/default-counters.csv``, plus the ones that file
lists commented out which sparkdiag reads exactly (the throttle violation times, aggregate ECC,
NVLink error totals, SM activity and occupancy). As everywhere in sparkdiag, a field the GPU
does not support has no sample: on a GB10 there is no ``DCGM_FI_DEV_MEMORY_TEMP`` (DCGM reads 0
there), no memory clock, no memory-copy utilization (NVML's stays 0 under load there), and the
profiling fields only where the driver gives GPM. On unified memory (GB10), where NVML has no
framebuffer figures, ``DCGM_FI_DEV_FB_USED`` and ``FB_FREE`` are the host memory the GPU
allocates from: MemTotal - MemAvailable and MemAvailable of ``/proc/meminfo``.

dcgm-exporter types some fields as counters whose names do not end in ``_total``; the text
format's counter type would make them ``..._total``, so they are served untyped under
dcgm-exporter's exact names. ``rate()`` and ``increase()`` work on them as before.

Pod labels: dcgm-exporter adds ``pod``, ``namespace``, ``container`` and ``pod_uid`` from the
kubelet. sparkdiag knows a process's pod uid from its cgroup (``--process-metrics``), not the
pod's name: a GPU whose compute processes all run in one pod carries that ``pod_uid``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sparkdiag.exporter.base import FromSnapshot, SnapshotProvider
from sparkdiag.exporter.families import Metric
from sparkdiag.snapshot import GpuSample, Snapshot

MIB = 1 << 20

Read = Callable[[GpuSample, Snapshot], "float | None"]


@dataclass(frozen=True)
class DcgmField:
    name: str  # dcgm-exporter's metric name (the DCGM field)
    help: str
    read: Read  # the value in DCGM's unit, None where unsupported
    counter: bool = False  # a counter in dcgm-exporter (served untyped, see the module doc)


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _whole(value: float | None, factor: float) -> float | None:
    """``value * factor`` as the integer DCGM reports (mJ, ns): the source was an integer too."""
    return None if value is None else float(round(value * factor))


def _percent(ratio: float | None) -> float | None:
    """A 0..1 ratio in percent; rounded to 6 places so that NVML's whole percent comes back
    whole (0.29 * 100 is 28.999999999999996)."""
    return None if ratio is None else round(ratio * 100.0, 6)


def _mib(value: float | None) -> float | None:
    return None if value is None else float(int(value) // MIB)


def _framebuffer(state: str) -> Read:
    """``used`` or ``free`` framebuffer in MiB; on unified memory the host's (module doc)."""

    def read(g: GpuSample, snap: Snapshot) -> float | None:
        if g.identity.memory_model != "unified":
            return _mib(g.memory_bytes.get(state))
        host = snap.host.memory_bytes if snap.host is not None else {}
        total, available = host.get("total"), host.get("available")
        if state == "free":
            return _mib(available)
        return None if total is None or available is None else _mib(total - available)

    return read


def _dedicated(read: Read) -> Read:
    """``read`` on a GPU with its own memory; None on unified memory."""
    return lambda g, snap: None if g.identity.memory_model == "unified" else read(g, snap)


def _nvlink_errors(kind: str) -> Read:
    """One NVLink error counter summed over the GPU's links; None when no link reports it."""

    def read(g: GpuSample, _snap: Snapshot) -> float | None:
        counts = [link.errors[kind] for link in g.nvlinks if kind in link.errors]
        return float(sum(counts)) if counts else None

    return read


# sparkdiag's violation policy -> the DCGM field's middle part
VIOLATIONS = {
    "power": "POWER",
    "thermal": "THERMAL",
    "sync_boost": "SYNC_BOOST",
    "board_limit": "BOARD_LIMIT",
    "low_utilization": "LOW_UTIL",
    "reliability": "RELIABILITY",
}


def _violation(policy: str, name: str) -> DcgmField:
    return DcgmField(
        f"DCGM_FI_DEV_{name}_VIOLATION",
        f"Time clocks were held down by the {policy} policy, in ns "
        f'(sparkdiag_gpu_violation_seconds_total{{policy="{policy}"}} * 1e9).',
        lambda g, _s: _whole(g.violation_seconds.get(policy), 1e9),
        counter=True,
    )


FIELDS: tuple[DcgmField, ...] = (
    DcgmField(
        "DCGM_FI_DEV_SM_CLOCK",
        'SM clock in MHz (sparkdiag_gpu_clock_hertz{clock="sm"} / 1e6).',
        lambda g, _s: _scaled(g.clock_hertz.get("sm"), 1e-6),
    ),
    DcgmField(
        "DCGM_FI_DEV_MEM_CLOCK",
        'Memory clock in MHz (sparkdiag_gpu_clock_hertz{clock="memory"} / 1e6).',
        lambda g, _s: _scaled(g.clock_hertz.get("memory"), 1e-6),
    ),
    DcgmField(
        "DCGM_FI_DEV_MEMORY_TEMP",
        'Memory temperature in °C (sparkdiag_gpu_temperature_celsius{sensor="memory"}).',
        lambda g, _s: g.temperature_celsius.get("memory"),
    ),
    DcgmField(
        "DCGM_FI_DEV_GPU_TEMP",
        'GPU temperature in °C (sparkdiag_gpu_temperature_celsius{sensor="gpu"}).',
        lambda g, _s: g.temperature_celsius.get("gpu"),
    ),
    DcgmField(
        "DCGM_FI_DEV_POWER_USAGE",
        "Power draw in W (sparkdiag_gpu_power_watts).",
        lambda g, _s: g.power_watts,
    ),
    DcgmField(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Energy since the driver loaded, in mJ (sparkdiag_gpu_energy_joules_total * 1000).",
        lambda g, _s: _whole(g.energy_joules, 1e3),
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "PCIe replays (sparkdiag_gpu_pcie_replay_errors_total).",
        lambda g, _s: g.pcie_replay_errors,
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_GPU_UTIL",
        'GPU utilization in percent (sparkdiag_gpu_utilization_ratio{engine="gpu"} * 100).',
        lambda g, _s: _percent(g.utilization_ratio.get("gpu")),
    ),
    DcgmField(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory (copy) utilization in percent "
        '(sparkdiag_gpu_utilization_ratio{engine="memory"} * 100); none on unified memory.',
        _dedicated(lambda g, _s: _percent(g.utilization_ratio.get("memory"))),
    ),
    DcgmField(
        "DCGM_FI_DEV_ENC_UTIL",
        'Encoder utilization in percent (sparkdiag_gpu_video_utilization_ratio{engine="encoder"}'
        " * 100).",
        lambda g, _s: _percent(g.video_utilization_ratio.get("encoder")),
    ),
    DcgmField(
        "DCGM_FI_DEV_DEC_UTIL",
        'Decoder utilization in percent (sparkdiag_gpu_video_utilization_ratio{engine="decoder"}'
        " * 100).",
        lambda g, _s: _percent(g.video_utilization_ratio.get("decoder")),
    ),
    *(_violation(policy, name) for policy, name in VIOLATIONS.items()),
    DcgmField(
        "DCGM_FI_DEV_FB_FREE",
        'Framebuffer memory free in MiB (sparkdiag_gpu_memory_bytes{state="free"}; on unified '
        'memory sparkdiag_host_memory_bytes{state="available"}).',
        _framebuffer("free"),
    ),
    DcgmField(
        "DCGM_FI_DEV_FB_USED",
        'Framebuffer memory used in MiB (sparkdiag_gpu_memory_bytes{state="used"}; on unified '
        "memory host MemTotal - MemAvailable).",
        _framebuffer("used"),
    ),
    DcgmField(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        'Corrected ECC errors, aggregate (sparkdiag_gpu_ecc_errors_total{type="corrected"}).',
        lambda g, _s: g.ecc_errors.get("corrected"),
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        'Uncorrected ECC errors, aggregate (sparkdiag_gpu_ecc_errors_total{type="uncorrected"}).',
        lambda g, _s: g.ecc_errors.get("uncorrected"),
        counter=True,
    ),
    *(
        DcgmField(
            f"DCGM_FI_DEV_NVLINK_{name}_COUNT_TOTAL",
            f"NVLink {kind} errors summed over the links "
            f'(sum of sparkdiag_gpu_nvlink_errors_total{{type="{kind}"}}).',
            _nvlink_errors(kind),
            counter=True,
        )
        for name, kind in (
            ("CRC_FLIT_ERROR", "crc_flit"),
            ("CRC_DATA_ERROR", "crc_data"),
            ("REPLAY_ERROR", "replay"),
            ("RECOVERY_ERROR", "recovery"),
        )
    ),
    DcgmField(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        'Rows remapped for uncorrectable errors (sparkdiag_gpu_remapped_rows{type="uncorrected"}).',
        lambda g, _s: g.remapped_rows.get("uncorrected"),
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        'Rows remapped for correctable errors (sparkdiag_gpu_remapped_rows{type="corrected"}).',
        lambda g, _s: g.remapped_rows.get("corrected"),
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        'Whether a row remapping failed, 0/1 (sparkdiag_gpu_remapped_rows{type="failure"}).',
        lambda g, _s: g.remapped_rows.get("failure"),
    ),
    DcgmField(
        "DCGM_FI_PROF_SM_ACTIVE",
        'Ratio of time an SM has a warp resident (GPM; sparkdiag_gpu_activity_ratio{engine="sm"}).',
        lambda g, _s: g.activity_ratio.get("sm"),
    ),
    DcgmField(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "Resident warps over the maximum (GPM; sparkdiag_gpu_sm_occupancy_ratio).",
        lambda g, _s: g.sm_occupancy_ratio,
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of time a tensor pipe is active (GPM; "
        'sparkdiag_gpu_activity_ratio{engine="tensor"}).',
        lambda g, _s: g.activity_ratio.get("tensor"),
    ),
    DcgmField(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        'Ratio of DRAM bandwidth used (GPM; sparkdiag_gpu_activity_ratio{engine="dram"}).',
        lambda g, _s: g.activity_ratio.get("dram"),
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "PCIe bytes per second sent, from GPM between polls, else NVML's 20 ms window "
        '(sparkdiag_gpu_pcie_throughput_bytes_per_second{direction="tx"}).',
        lambda g, _s: g.pcie_throughput_bytes_per_second.get("tx"),
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "PCIe bytes per second received, from GPM between polls, else NVML's 20 ms window "
        '(sparkdiag_gpu_pcie_throughput_bytes_per_second{direction="rx"}).',
        lambda g, _s: g.pcie_throughput_bytes_per_second.get("rx"),
    ),
)
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"


def pod_uid(g: GpuSample, excluded: frozenset[int]) -> str:
    """The pod uid of the GPU's compute processes when they all run in one pod, else ""."""
    if g.processes is None:
        return ""
    pods = {
        p.identity.pod_uid
        for p in g.processes
        if p.identity is not None and p.identity.pod_uid and p.pid not in excluded
    }
    return next(iter(pods)) if len(pods) == 1 else ""


def dcgm_labels(g: GpuSample, hostname: str, pod: str = "") -> dict[str, str]:
    """The labels dcgm-exporter gives a GPU's series; ``Hostname``, the driver version and
    ``pod_uid`` only where known (dcgm-exporter too leaves an empty one out)."""
    ident = g.identity
    labels = {
        "gpu": str(ident.index),
        "UUID": ident.uuid,
        "pci_bus_id": ident.pci_bus_id,
        "device": f"nvidia{ident.index}",
        "modelName": ident.name,
    }
    if hostname:
        labels["Hostname"] = hostname
    if ident.driver_version:
        labels["DCGM_FI_DRIVER_VERSION"] = ident.driver_version
    if pod:
        labels["pod_uid"] = pod
    return labels


class DcgmCollector(FromSnapshot):
    """dcgm-exporter's fields for every GPU that answers; ``hostname`` is its ``Hostname``."""

    def __init__(self, snapshot: SnapshotProvider, hostname: str) -> None:
        super().__init__(snapshot)
        self.hostname = hostname

    def families(self, snap: Snapshot) -> Iterator[Metric]:
        labelled = [
            (g, dcgm_labels(g, self.hostname, pod_uid(g, snap.excluded_pids)))
            for g in snap.gpus
            if g.up
        ]
        for field in FIELDS:
            family = Metric(field.name, field.help, "unknown" if field.counter else "gauge")
            for g, labels in labelled:
                value = field.read(g, snap)
                if value is not None:
                    family.add_sample(field.name, labels, value)
            yield family

        # The XID of the last event since the daemon started, with its code as ``err_code``
        # (dcgm-exporter's err_msg text is left out); kept for a GPU that was lost after it, as
        # sparkdiag's own XID series are. None before the first XID.
        xid = Metric(
            XID_ERRORS,
            "XID of the last XID event since sparkdiag started (err_code; "
            "sparkdiag_gpu_xid_errors_total counts them).",
            "gauge",
        )
        for g in snap.gpus:
            code = snap.xid.last_code.get(g.identity.index)
            if code is not None:
                labels = {**dcgm_labels(g, self.hostname), "err_code": str(code)}
                xid.add_sample(XID_ERRORS, labels, float(code))
        yield xid
