"""NVMe controllers: identity and temperatures from sysfs, health from smartctl or nvme-cli.

sysfs (``--path.sysfs``), no tools and no root needed::

    /sys/class/nvme/nvme0/{model,firmware_rev,transport,address}
    /sys/class/nvme/nvme0/device -> ../../../0000:3d:00.0        (the PCI function)
    /sys/class/nvme/nvme0/hwmon2/temp1_input      37850          (m°C; temp1 is "Composite")
    /sys/class/nvme/nvme0/hwmon2/temp2_input      ...            ("Sensor 1", ...)
    /sys/class/nvme/nvme0/hwmon2/temp1_max        81850          (over-temperature threshold,
                                                                   WCTEMP unless changed)
    /sys/class/nvme/nvme0/hwmon2/temp1_crit       84850          (CCTEMP)

Same readings as ``sensors nvme-pci-*`` and ``cat /sys/class/nvme/nvme0/model``. Kernels before
5.6 hang the hwmon device under the PCI function (``device/hwmon/hwmonN``); both are read. The
serial number is never read. The health log (:mod:`sparkdiag.sources.host.nvme_tools`) costs a
subprocess: :class:`NvmeSource` refreshes it on a slower interval in a thread of its own, so a
poll never waits for it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import replace
from pathlib import Path

from sparkdiag.snapshot import NvmeController
from sparkdiag.sources.host.blockdev import controller_pci
from sparkdiag.sources.host.nvme_tools import HealthReader, HealthReading
from sparkdiag.sources.host.sysfs import read_attr

log = logging.getLogger(__name__)

_CONTROLLER = re.compile(r"^nvme\d+$")
_TEMP_INPUT = re.compile(r"^temp(\d+)_input$")
_SENSOR_LABEL = re.compile(r"^Sensor (\d+)$")
HEALTH_INTERVAL = 60.0  # seconds between health-log reads (the log changes by the minute)
# How long the first read waits for the tools: smartctl -a answers an NVMe drive in tens of
# milliseconds; a drive that hangs (the DGX Spark's did under a heavy gdsio load) must not hold
# the daemon's start or check (each tool is killed after TOOL_TIMEOUT anyway).
FIRST_WAIT = 3.0


def _millidegrees(path: Path) -> float | None:
    text = read_attr(path)
    if text is None or not text.lstrip("-").isdigit():
        return None
    value = int(text) / 1000.0
    return value if -60 < value < 250 else None  # -273 °C or 65 °C * 1000: not a reading


def _hwmon_dirs(controller_dir: Path) -> list[Path]:
    found = []
    for parent in (controller_dir, controller_dir / "device" / "hwmon"):
        try:
            found += sorted(p for p in parent.iterdir() if p.name.startswith("hwmon"))
        except OSError:
            continue
    return found


def read_temperatures(controller_dir: Path) -> tuple[dict[str, float], dict[str, float]]:
    """Sensor -> °C (``composite``, ``1``, ``2``...) and ``warning``/``critical`` thresholds,
    from the controller's hwmon directory; empty where it has none."""
    temperatures: dict[str, float] = {}
    thresholds: dict[str, float] = {}
    for hwmon in _hwmon_dirs(controller_dir):
        try:
            inputs = sorted(p.name for p in hwmon.iterdir() if _TEMP_INPUT.match(p.name))
        except OSError:
            continue
        for name in inputs:
            index = int(_TEMP_INPUT.match(name).group(1))  # type: ignore[union-attr]
            label = read_attr(hwmon / f"temp{index}_label") or ""
            numbered = _SENSOR_LABEL.match(label)
            if label.lower() == "composite" or (not label and index == 1):
                sensor = "composite"
            elif numbered:
                sensor = numbered.group(1)
            else:
                sensor = str(index - 1) if not label else label.lower().replace(" ", "_")
            value = _millidegrees(hwmon / name)
            if value is not None:
                temperatures.setdefault(sensor, value)
            if sensor == "composite":
                for threshold, suffix in (("warning", "max"), ("critical", "crit")):
                    limit = _millidegrees(hwmon / f"temp{index}_{suffix}")
                    if limit is not None and limit > 0:
                        thresholds.setdefault(threshold, limit)
        if temperatures:
            break
    return temperatures, thresholds


def read_controller(sysfs: Path, name: str) -> NvmeController | None:
    """One controller from ``SYSFS/class/nvme/NAME``; None when it is not there."""
    directory = sysfs / "class" / "nvme" / name
    if not directory.exists():
        return None
    temperatures, thresholds = read_temperatures(directory)
    return NvmeController(
        name=name,
        model=read_attr(directory / "model") or "",
        firmware=read_attr(directory / "firmware_rev") or "",
        pci_address=controller_pci(sysfs, name) or "",
        transport=read_attr(directory / "transport") or "",
        temperature_celsius=temperatures,
        threshold_celsius=thresholds,
    )


def controller_names(sysfs: Path) -> list[str]:
    """``nvme0``, ``nvme1``... as ``ls /sys/class/nvme`` lists them, in numeric order."""
    try:
        names = [p.name for p in (sysfs / "class" / "nvme").iterdir() if _CONTROLLER.match(p.name)]
    except OSError:
        return []
    return sorted(names, key=lambda n: int(n[4:]))


def with_health(controller: NvmeController, reading: HealthReading | None) -> NvmeController:
    """The controller with the log's health; its thresholds and sensors fill what hwmon lacks
    (hwmon wins: it is read every poll, the log once a minute)."""
    if reading is None:
        return replace(controller, health_note="SMART log not read yet (the tool still runs)")
    return replace(
        controller,
        temperature_celsius={**reading.temperatures, **controller.temperature_celsius},
        threshold_celsius={**controller.threshold_celsius, **reading.thresholds},
        health=reading.health,
        health_note=reading.note,
        health_read_at=reading.read_at,
    )


class NvmeSource:
    """Every NVMe controller under ``sysfs``; the health log from ``reader`` (None: no tool,
    ``skipped`` says why), read again at most every ``interval`` seconds in a thread of its own,
    so that a poll never waits on a tool; the first read waits up to :data:`FIRST_WAIT` seconds
    for it, ``wait`` until it is done."""

    def __init__(
        self,
        sysfs: Path,
        reader: HealthReader | None,
        skipped: str = "",
        interval: float = HEALTH_INTERVAL,
    ) -> None:
        self.sysfs = sysfs
        self.reader = reader
        self.skipped = skipped
        self.interval = interval
        self._lock = threading.Lock()
        self._readings: dict[str, HealthReading] = {}
        self._read_at = float("-inf")
        self._refreshing: threading.Thread | None = None

    def read(self, wait: bool = False) -> tuple[NvmeController, ...]:
        """Controllers as sysfs shows them now, with the latest health log of each."""
        controllers = [
            c for n in controller_names(self.sysfs) if (c := read_controller(self.sysfs, n))
        ]
        if self.reader is None:
            note = f"SMART health skipped: {self.skipped}" if self.skipped else None
            return tuple(replace(c, health_note=note) for c in controllers)
        names = tuple(c.name for c in controllers)
        first = self._read_at == float("-inf")
        self._refresh_later(names)
        if wait or first:  # the first read (dump, check) waits, but not for a hung drive
            with self._lock:
                running = self._refreshing
            if running is not None:
                running.join(timeout=None if wait else FIRST_WAIT)
        with self._lock:
            readings = dict(self._readings)
        return tuple(with_health(c, readings.get(c.name)) for c in controllers)

    def _refresh_later(self, names: tuple[str, ...]) -> None:
        with self._lock:
            stale = time.monotonic() - self._read_at >= self.interval
            busy = self._refreshing is not None and self._refreshing.is_alive()
            if not stale or busy or not names:
                return
            self._read_at = time.monotonic()
            self._refreshing = threading.Thread(
                target=self._refresh, args=(names,), name="nvme-health", daemon=True
            )
            self._refreshing.start()

    def _refresh(self, names: tuple[str, ...]) -> None:
        assert self.reader is not None
        readings = {}
        for name in names:
            try:
                readings[name] = self.reader(name)
            except Exception as exc:  # a tool's surprise must not end the poller's thread
                log.warning("reading the health log of %s failed: %s", name, exc)
        with self._lock:
            for name, reading in readings.items():
                old = self._readings.get(name)
                if reading.note and (old is None or old.note != reading.note):
                    log.info("%s: SMART health not read: %s", name, reading.note)
            self._readings = readings
            self._read_at = time.monotonic()
