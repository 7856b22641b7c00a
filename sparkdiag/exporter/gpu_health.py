"""What the driver and the bus say of a GPU's health, beside its telemetry: the NVIDIA GPU
functions on the PCI bus (to compare with NVML's count), the driver's recovery action, the
NVLink fabric registration, and XID incidents by severity tier.

Enumerated states are state sets (one series per value, 1 for the current one), as
``sparkdiag_gpu_clock_event_active`` is; each exists only where the driver reports it.
"""

from __future__ import annotations

from collections.abc import Iterator

from sparkdiag.exporter.base import GPU_LABELS, FromSnapshot, gpu_labels
from sparkdiag.exporter.families import CounterMetricFamily, GaugeMetricFamily, Metric
from sparkdiag.snapshot import Snapshot
from sparkdiag.sources.nvml.queries import FABRIC_HEALTH, FABRIC_STATES, RECOVERY_ACTIONS
from sparkdiag.sources.nvml.xid import TIERS


class GpuHealthCollector(FromSnapshot):
    def families(self, snap: Snapshot) -> Iterator[Metric]:
        if snap.gpu_pci_devices is not None:
            pci = GaugeMetricFamily(
                "sparkdiag_gpu_pci_devices",
                "NVIDIA GPU functions on the PCI bus (vendor 0x10de, class 0x0300 or 0x0302) as "
                "sysfs lists them, whatever NVML says.",
            )
            pci.add_metric([], len(snap.gpu_pci_devices))
            yield pci

        up = [g for g in snap.gpus if g.up]
        recovery = GaugeMetricFamily(
            "sparkdiag_gpu_recovery_action",
            "The recovery action the driver asks for (1 for the current one): none, gpu_reset, "
            "node_reboot, drain_p2p, drain_and_reset, recover_imex_domain, bus_reset, "
            "system_reboot, unknown.",
            labels=[*GPU_LABELS, "action"],
        )
        fabric = GaugeMetricFamily(
            "sparkdiag_gpu_fabric_state",
            "NVLink fabric registration state with the fabric manager (1 for the current one).",
            labels=[*GPU_LABELS, "state"],
        )
        failed = GaugeMetricFamily(
            "sparkdiag_gpu_fabric_registration_failed",
            "1 when the fabric registration completed with an error, 0 when it succeeded; "
            "absent until it completes.",
            labels=GPU_LABELS,
        )
        health = GaugeMetricFamily(
            "sparkdiag_gpu_fabric_health",
            "NVLink fabric health summary (1 for the current one), where the driver reports it.",
            labels=[*GPU_LABELS, "health"],
        )
        for g in up:
            labels = gpu_labels(g.identity)
            if g.recovery_action is not None:
                actions = list(RECOVERY_ACTIONS.values())
                if g.recovery_action not in actions:
                    actions.append(g.recovery_action)
                for action in actions:
                    recovery.add_metric([*labels, action], int(action == g.recovery_action))
            if g.fabric is not None:
                for state in FABRIC_STATES.values():
                    fabric.add_metric([*labels, state], int(state == g.fabric.state))
                if g.fabric.state == "completed":
                    failed.add_metric(labels, int(g.fabric.status != "SUCCESS"))
                if g.fabric.health is not None:
                    for value in FABRIC_HEALTH.values():
                        health.add_metric([*labels, value], int(value == g.fabric.health))
        yield recovery
        yield fabric
        yield failed
        yield health

        incidents = CounterMetricFamily(
            "sparkdiag_gpu_xid_incidents",
            "XID incidents since the daemon started, by severity tier of NVIDIA's XID catalog: "
            "XIDs of one tier less than 3 minutes apart are one incident.",
            labels=[*GPU_LABELS, "severity"],
        )
        if snap.nvml_up:
            for g in snap.gpus:
                if g.up and g.xid_events_supported is False:
                    continue  # no XID events from NVML here: nothing is counted, no 0
                for tier in TIERS:
                    count = snap.xid.incidents.get((g.identity.index, tier), 0)
                    incidents.add_metric([*gpu_labels(g.identity), tier], count)
        yield incidents
        last = GaugeMetricFamily(
            "sparkdiag_gpu_xid_incident_last_timestamp_seconds",
            "Unix time of the last XID of each severity tier.",
            labels=[*GPU_LABELS, "severity"],
        )
        identity = {g.identity.index: g.identity for g in snap.gpus}
        for (index, tier_name), ts in sorted(snap.xid.incident_last.items()):
            if index in identity:
                last.add_metric([*gpu_labels(identity[index]), tier_name], ts)
        yield last
