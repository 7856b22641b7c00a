"""NVMe drives from the snapshot: identity and temperatures (sysfs), health (the SMART log read by
smartctl or nvme-cli on a slower tier): ``sparkdiag_nvme_*``.

A value the drive or the tools do not report has no sample. The serial number is never exported.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from sparkdiag.exporter.base import FromSnapshot
from sparkdiag.exporter.families import CounterMetricFamily, GaugeMetricFamily, Metric
from sparkdiag.snapshot import NvmeHealth, Snapshot

DEVICE = ["device"]

# health field -> (metric, help, counter); each one series per drive
_HEALTH: tuple[tuple[str, str, str, bool], ...] = (
    ("critical_warning", "sparkdiag_nvme_critical_warning",
     "The SMART critical-warning bitmask: 0 healthy; bit 0 spare low, 1 temperature, 2 "
     "reliability degraded, 3 read-only, 4 volatile backup failed, 5 PMR unreliable.", False),
    ("media_errors", "sparkdiag_nvme_media_errors",
     "Unrecovered data-integrity errors (media and data integrity errors) over the drive's "
     "life.", True),
    ("error_log_entries", "sparkdiag_nvme_error_log_entries",
     "Error information log entries over the drive's life (any failed command).", True),
    ("percentage_used_ratio", "sparkdiag_nvme_percentage_used_ratio",
     "Endurance used as the drive estimates it (may exceed 1).", False),
    ("available_spare_ratio", "sparkdiag_nvme_available_spare_ratio",
     "Spare capacity left, 0..1.", False),
    ("available_spare_threshold_ratio", "sparkdiag_nvme_available_spare_threshold_ratio",
     "The spare level under which the drive sets critical-warning bit 0.", False),
    ("unsafe_shutdowns", "sparkdiag_nvme_unsafe_shutdowns",
     "Power losses without a shutdown notification, over the drive's life.", True),
    ("power_on_seconds", "sparkdiag_nvme_power_on_seconds",
     "Powered-on time over the drive's life (the log counts hours).", True),
    ("written_bytes", "sparkdiag_nvme_written_bytes",
     "Bytes the host wrote to the drive over its life (the log counts units of 512,000).", True),
)  # fmt: skip


class NvmeCollector(FromSnapshot):
    def families(self, snap: Snapshot) -> Iterator[Metric]:
        if not snap.nvme:
            return
        info = GaugeMetricFamily(
            "sparkdiag_nvme_info",
            "Always 1: the NVMe controller's model, firmware and PCI address (no serial).",
            labels=["device", "model", "firmware", "pci_address"],
        )
        temperature = GaugeMetricFamily(
            "sparkdiag_nvme_temperature_celsius",
            "Drive temperatures: composite (what the drive throttles on) and its sensors.",
            labels=["device", "sensor"],
        )
        threshold = GaugeMetricFamily(
            "sparkdiag_nvme_temperature_threshold_celsius",
            "The drive's own composite-temperature thresholds: warning (it throttles above) "
            "and critical.",
            labels=["device", "threshold"],
        )
        throttle = CounterMetricFamily(
            "sparkdiag_nvme_thermal_throttle_seconds",
            "Time the composite temperature spent at or above the warning and the critical "
            "threshold over the drive's life (the log counts minutes).",
            labels=["device", "level"],
        )
        managed_count = CounterMetricFamily(
            "sparkdiag_nvme_thermal_management_transitions",
            "Times the drive entered its own thermal management level 1 (light throttling) "
            "or 2 (heavy).",
            labels=["device", "level"],
        )
        managed_seconds = CounterMetricFamily(
            "sparkdiag_nvme_thermal_management_seconds",
            "Seconds the drive spent in its thermal management level 1 or 2.",
            labels=["device", "level"],
        )
        age = GaugeMetricFamily(
            "sparkdiag_nvme_smart_log_age_seconds",
            "How long ago the drive's SMART log was read: by this daemon's tools (up to a "
            "minute), or by sparkdiag nvme-log (--nvme.log-dir); past --nvme.log-max-age the "
            "log's series are left out and this stays.",
            labels=DEVICE,
        )
        health = {
            field: (CounterMetricFamily if counter else GaugeMetricFamily)(
                name, text, labels=DEVICE
            )
            for field, name, text, counter in _HEALTH
        }
        for drive in snap.nvme:
            info.add_metric([drive.name, drive.model, drive.firmware, drive.pci_address], 1.0)
            for sensor, value in sorted(drive.temperature_celsius.items(), key=_sensor_order):
                temperature.add_metric([drive.name, sensor], value)
            _add_by_key(threshold, drive.name, drive.threshold_celsius)
            if drive.health_read_at is not None:
                age.add_metric([drive.name], max(0.0, snap.timestamp - drive.health_read_at))
            log = drive.health
            if log is None:
                continue
            _add_health(health, drive.name, log)
            for level, seconds in (
                ("warning", log.warning_temperature_seconds),
                ("critical", log.critical_temperature_seconds),
            ):
                if seconds is not None:
                    throttle.add_metric([drive.name, level], seconds)
            _add_by_key(managed_count, drive.name, log.thermal_transitions)
            _add_by_key(managed_seconds, drive.name, log.thermal_seconds)
        yield from (
            info,
            temperature,
            threshold,
            age,
            *health.values(),
            throttle,
            managed_count,
            managed_seconds,
        )


def _sensor_order(item: tuple[str, float]) -> tuple[int, str]:
    sensor = item[0]
    return (0, "") if sensor == "composite" else (1, sensor.zfill(4))


def _add_by_key(
    family: GaugeMetricFamily | CounterMetricFamily, device: str, values: Mapping[str, float]
) -> None:
    """One sample per key of ``values``, in key order, labelled ``[device, key]``."""
    for key, value in sorted(values.items()):
        family.add_metric([device, key], value)


def _add_health(
    families: dict[str, GaugeMetricFamily | CounterMetricFamily], device: str, log: NvmeHealth
) -> None:
    for field, family in families.items():
        value = getattr(log, field)
        if value is not None:
            family.add_metric([device], float(value))
