"""An NVMe drive's SMART / health log, from smartmontools or nvme-cli, or from their recorded JSON.

``smartctl --json -a /dev/nvme0`` (smartmontools 7.0 or newer) and ``nvme smart-log -o json
/dev/nvme0`` (nvme-cli) both read log page 02h; the kernel's sysfs has no such file, and reading
it takes root (or CAP_SYS_ADMIN). Their JSON differs:

- critical warning: ``critical_warning`` in both;
- composite temperature: ``temperature`` (smartctl °C, nvme-cli kelvin; nvme-cli 2.7 alone
  ``Temperature``); sensors 1..8: ``temperature_sensors`` [°C, ...] (smartctl),
  ``temperature_sensor_N`` (nvme-cli, kelvin);
- spare, its threshold, endurance used: ``available_spare``, ``available_spare_threshold``,
  ``percentage_used`` (smartctl), ``avail_spare``, ``spare_thresh``, ``percent_used`` (nvme-cli),
  in per cent;
- time at or above the warning and critical temperatures: ``warning_temp_time``,
  ``critical_comp_time`` in both, in minutes;
- the drive's thermal management: ``thermal_mgmt_temperature_N_transition_count`` and
  ``..._total_time`` (smartctl 7.5 and newer), ``thm_tempN_trans_count``, ``thm_tempN_total_time``
  (nvme-cli), in seconds;
- thresholds: ``nvme_composite_temperature_threshold`` (smartctl ``-a``; nvme-cli has them in
  ``nvme id-ctrl``, which is not run: hwmon gives them).

nvme-cli prints temperatures in kelvin (``src/nvme-print-json.c``), as a JSON number in every
release from 0.8 to 3.0-rc1 (never a string, never with a unit); a value of 200 or more is read
as kelvin, anything lower as °C (no drive runs at 200 °C or at -73 °C). nvme-cli 2.7's clean-up
of its JSON keys renamed the composite temperature ``Temperature`` and, in its detailed output
(``-H``), the critical warning's ``value`` ``Value``; 2.7.1 reverted both (commit 565b322b8,
"Revert field name changes"). Both spellings are read: a drive read with 2.7 had no composite
temperature. nvme-cli 2.x prints the log's 128-bit counters (data units, power-on hours, unsafe
shutdowns, media errors, error-log entries ...) as JSON strings of decimal digits
(``"media_errors": "12"``, ``obj_add_uint128``); older ones printed numbers. Both are read
(:func:`_number`): taking only numbers passed 12 media errors as healthy. A fixture directory
(``--nvme.fixture DIR``) holds ``nvme0.smartctl.json`` or ``nvme0.nvme-cli.json`` per controller:
the tools' output as recorded, read instead of running them. A log directory (``--nvme.log-dir
DIR``) holds the same files, written by ``sparkdiag nvme-log`` as root (:func:`write_logs`, the
systemd timer ``sparkdiag-nvme-log.timer``) for a daemon that may not run the tools itself: read
like a fixture, each with its age, and left out once older than ``--nvme.log-max-age``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sparkdiag.errors import UsageError
from sparkdiag.jsonvalues import as_float, as_int, as_map
from sparkdiag.snapshot import NvmeHealth
from sparkdiag.sources.files import MIB, read_limited

log = logging.getLogger(__name__)

TOOL_TIMEOUT = 10.0  # seconds; smartctl -a on an NVMe drive answers in tens of milliseconds
_MAX_JSON = 4 * MIB
_KELVIN_FROM = 200
_DATA_UNIT = 512 * 1000
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # one "data unit" of the log is 1000 sectors of 512 bytes
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")  # nvme-cli 2.x's 128-bit counters: "12", "10054124"


@dataclass(frozen=True)
class HealthReading:
    """What one read of one controller gave: the log, the thresholds and sensors it carries
    (``"warning"``/``"critical"`` and ``"composite"``/``"1"``...), or why nothing (``note``)."""

    health: NvmeHealth | None
    thresholds: Mapping[str, float]
    temperatures: Mapping[str, float]
    note: str | None = None
    read_at: float | None = None  # when the drive was read (time.time()); None: a fixture


def _none(note: str) -> HealthReading:
    return HealthReading(None, {}, {}, note)


def _celsius(value: Any) -> float | None:
    number = as_float(value)
    if number is None or number == 0:
        return None  # 0 K: the drive reports no such sensor
    celsius = number - 273.0 if number >= _KELVIN_FROM else number
    return celsius if -100 <= celsius <= 300 else None  # 1e300 is no reading


def _number(value: Any) -> float | None:
    """A number of the log: a JSON number, or a string of decimal digits (``"12"``, ``"1.5"``:
    nvme-cli 2.x's 128-bit counters); None for anything else (``"-3"``, ``"0x1f"``, ``"nan"``,
    a bool), as :func:`as_float` has it."""
    if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        return as_float(float(value))
    return as_float(value)


def _counted(pairs: Mapping[str, Any]) -> dict[str, float]:
    return {level: v for level, raw in pairs.items() if (v := _number(raw)) is not None}


def parse_smartctl(doc: Any, source: str = "smartctl") -> HealthReading:
    """``smartctl --json -a /dev/nvmeN`` as a reading; its own error messages become the note."""
    root = as_map(doc)
    smart = as_map(root.get("nvme_smart_health_information_log"))
    if not smart:
        messages = (
            [
                str(as_map(m).get("string", ""))
                for m in root.get("smartctl", {}).get("messages", [])
                if isinstance(m, Mapping)
            ]
            if isinstance(root.get("smartctl"), Mapping)
            else []
        )
        why = "; ".join(m for m in messages if m) or "no NVMe health log in its answer"
        return _none(f"smartctl: {why}")
    sensors = smart.get("temperature_sensors")
    temperatures = {"composite": t} if (t := _celsius(smart.get("temperature"))) is not None else {}
    for index, raw in enumerate(sensors if isinstance(sensors, list) else []):
        if (value := _celsius(raw)) is not None:
            temperatures[str(index + 1)] = value
    limits = as_map(root.get("nvme_composite_temperature_threshold"))
    thresholds = {k: v for k in ("warning", "critical") if (v := _celsius(limits.get(k)))}
    health = _health(smart, SMARTCTL_KEYS, source, as_int(smart.get("critical_warning")))
    return HealthReading(health, thresholds, temperatures)


# Each NvmeHealth field: the factor to base units (percent to ratio, hours and minutes to seconds,
# data units of 512,000 bytes to bytes), smartctl's key and nvme-cli's key
_FIELDS = (
    ("media_errors", 1.0, "media_errors", "media_errors"),
    ("error_log_entries", 1.0, "num_err_log_entries", "num_err_log_entries"),
    ("percentage_used_ratio", 0.01, "percentage_used", "percent_used"),
    ("available_spare_ratio", 0.01, "available_spare", "avail_spare"),
    ("available_spare_threshold_ratio", 0.01, "available_spare_threshold", "spare_thresh"),
    ("unsafe_shutdowns", 1.0, "unsafe_shutdowns", "unsafe_shutdowns"),
    ("power_on_seconds", 3600.0, "power_on_hours", "power_on_hours"),
    ("written_bytes", _DATA_UNIT, "data_units_written", "data_units_written"),
    ("warning_temperature_seconds", 60.0, "warning_temp_time", "warning_temp_time"),
    ("critical_temperature_seconds", 60.0, "critical_comp_time", "critical_comp_time"),
)
# What the log's fields can hold (NVMe base specification, SMART / Health log): the warning
# and the endurance used are one byte each, the spare and its threshold a per cent of 0-100,
# the rest counters that are never negative. A value outside is no reading: a critical warning
# of -1 failed the drive with every bit named, and 1e308 % of its endurance was printed whole
_RANGES = {
    "percentage_used_ratio": (0.0, 2.55),
    "available_spare_ratio": (0.0, 1.0),
    "available_spare_threshold_ratio": (0.0, 1.0),
}
_CRITICAL_WARNING_MAX = 0xFF
SMARTCTL_KEYS = {field: key for field, _, key, _ in _FIELDS} | {
    "transitions": "thermal_mgmt_temperature_{n}_transition_count",
    "thermal_seconds": "thermal_mgmt_temperature_{n}_total_time",
}
NVME_CLI_KEYS = {field: key for field, _, _, key in _FIELDS} | {
    "transitions": "thm_temp{n}_trans_count",
    "thermal_seconds": "thm_temp{n}_total_time",
}


def _health(
    smart: Mapping[str, Any], keys: Mapping[str, str], source: str, warning: int | None
) -> NvmeHealth:
    """The log's fields in base units, each read under the tool's own key."""
    values: dict[str, Any] = {}
    for name, factor, *_keys in _FIELDS:
        number = _number(smart.get(keys[name]))
        low, high = _RANGES.get(name, (0.0, float("inf")))
        inside = number is not None and low <= number * factor <= high
        values[name] = number * factor if inside and number is not None else None
    if warning is not None and not 0 <= warning <= _CRITICAL_WARNING_MAX:
        warning = None
    levels = {
        kind: _counted({n: smart.get(keys[kind].format(n=n)) for n in ("1", "2")})
        for kind in ("transitions", "thermal_seconds")
    }
    return NvmeHealth(
        critical_warning=warning,
        thermal_transitions=levels["transitions"],
        thermal_seconds=levels["thermal_seconds"],
        source=source,
        **values,
    )


def _spelled(smart: Mapping[str, Any], key: str) -> Any:
    """``smart[key]``, else under nvme-cli 2.7's spelling of it (a capital first letter)."""
    return smart[key] if key in smart else smart.get(key[:1].upper() + key[1:])


def parse_nvme_cli(doc: Any, source: str = "nvme-cli") -> HealthReading:
    """``nvme smart-log -o json /dev/nvmeN`` as a reading (temperatures in kelvin)."""
    smart = as_map(doc)
    if "critical_warning" not in smart:
        return _none("nvme-cli: no health log in its answer")
    warning = smart.get("critical_warning")
    if isinstance(warning, Mapping):  # nvme-cli -H or --verbose: {"value": 0, ...}
        warning = _spelled(warning, "value")
    composite = _celsius(_spelled(smart, "temperature"))
    temperatures = {"composite": composite} if composite is not None else {}
    for index in range(1, 9):
        if (value := _celsius(smart.get(f"temperature_sensor_{index}"))) is not None:
            temperatures[str(index)] = value
    health = _health(smart, NVME_CLI_KEYS, source, as_int(warning))
    return HealthReading(health, {}, temperatures)


HealthReader = Callable[[str], HealthReading]


class NvmeFixtureError(UsageError, ValueError):
    """A ``--nvme.fixture`` that cannot be read from: not a directory (exit 2, as a missing
    ``--nvml-fixture`` or ``--probe.fixture`` is); the message names the path and why."""

    flag = "--nvme.fixture"


# The files a controller's log may be recorded in, in the order read: the tool's name in each.
RECORDED: tuple[tuple[str, str, Callable[[Any, str], HealthReading]], ...] = (
    ("smartctl", ".smartctl.json", parse_smartctl),
    ("nvme-cli", ".nvme-cli.json", parse_nvme_cli),
)
TIMER = "sparkdiag-nvme-log.timer"  # systemd/: runs `sparkdiag nvme-log` as root
TIMER_DIR = Path("/run/sparkdiag-nvme")  # where it writes (nvme-log's default --nvme.log-dir)
FUTURE_SLACK = 60.0  # seconds a file may seem to be written ahead of the clock
NO_LOG_FILE = "no nvme-log file for "  # how log_dir_reader's note for a drive without one begins


def _recorded(
    path: Path, parse: Callable[[Any, str], HealthReading], what: str
) -> HealthReading | None:
    """A recorded file's reading, None where there is no such file; one that cannot be read,
    is not JSON or holds no health log gives none, and its note names the file (``what``:
    "fixture", "nvme-log file")."""
    try:
        raw = read_limited(path, _MAX_JSON)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _none(f"{what} {path}: {exc.strerror or exc}")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        return _none(f"{what} {path} is not JSON: {exc}")
    reading = parse(doc, "fixture")
    if reading.health is None:  # JSON without a health log: the file is named too
        return _none(f"{what} {path}: {reading.note}")
    return reading


def fixture_reader(directory: Path) -> HealthReader:
    """Readings from recorded tool output: ``DIR/nvme0.smartctl.json``, else
    ``DIR/nvme0.nvme-cli.json``; a controller with neither has no health log. Raises
    :class:`NvmeFixtureError` when ``directory`` is not a directory."""
    if not directory.is_dir():
        why = "is not a directory" if directory.exists() else "does not exist"
        raise NvmeFixtureError(f"NVMe fixture directory {directory} {why}")

    def read(controller: str) -> HealthReading:
        for _tool, suffix, parse in RECORDED:
            reading = _recorded(directory / f"{controller}{suffix}", parse, "fixture")
            if reading is not None:
                return reading
        return _none(f"no fixture for {controller} in {directory}")

    return read


def log_dir_reader(
    directory: Path, max_age: float, clock: Callable[[], float] = time.time
) -> HealthReader:
    """Readings from the files ``sparkdiag nvme-log`` writes (:func:`write_logs`), each with
    when it was written (``read_at``, the file's modification time); a file older than
    ``max_age`` seconds gives no health log, and its note says how old. A directory that is not
    there yet is no error: the timer may not have run since boot."""

    def read(controller: str) -> HealthReading:
        for _tool, suffix, parse in RECORDED:
            path = directory / f"{controller}{suffix}"
            try:
                written = path.stat().st_mtime
            except FileNotFoundError:
                continue
            except OSError as exc:
                return _none(f"nvme-log file {path}: {exc.strerror or exc}")
            age = clock() - written
            if age > max_age or age < -FUTURE_SLACK:  # a clock stepped back: not to be trusted
                when = f"{age:.0f} s old" if age > 0 else f"dated {-age:.0f} s ahead of the clock"
                note = f"nvme-log file {path} is {when} (--nvme.log-max-age {max_age:g})"
                return replace(_none(note), read_at=written)
            reading = _recorded(path, parse, "nvme-log file")
            if reading is not None:  # else removed since (its drive not read this time)
                return replace(reading, read_at=written)
        return _none(f"{NO_LOG_FILE}{controller} in {directory}")

    return read


def timer_logs(rootfs: Path, given: Path | None) -> Path | None:
    """The root timer's directory under ``rootfs`` where it is there and no ``--nvme.log-dir``
    was ``given``: a command run as you, which may not run the tools, can read the logs there."""
    if given is not None:
        return None
    found = rootfs / TIMER_DIR.relative_to("/")
    return found if found.is_dir() else None


def fixture_advice(note: str | None, controller: str = "NAME") -> str | None:
    """What to do about a health log a ``--nvme.fixture`` or ``--nvme.log-dir`` did not give
    (its ``note`` from :func:`fixture_reader` or :func:`log_dir_reader`), or None for a note
    that is neither's: check's nvme-health row advised installing smartmontools for a fixture
    file that was not JSON (the hostile review)."""
    if note is None:
        return None
    if note.startswith("no fixture for "):
        return (
            f"add {controller}.smartctl.json (smartctl --json -a /dev/{controller}) or "
            f"{controller}.nvme-cli.json (nvme smart-log /dev/{controller} -o json) to the "
            "--nvme.fixture directory, or leave --nvme.fixture out to read the drive"
        )
    if note.startswith("fixture "):
        return (
            f"fix or record again the fixture file named (smartctl --json -a /dev/{controller}, "
            f"or nvme smart-log /dev/{controller} -o json), or leave --nvme.fixture out to read "
            "the drive"
        )
    if note.startswith((NO_LOG_FILE, "nvme-log file ")):
        return (
            f"start the root timer that writes it (install smartmontools, then systemctl "
            f"enable --now {TIMER}; docs/deploy.md), or run sparkdiag nvme-log --nvme.log-dir "
            "DIR as root; journalctl -u sparkdiag-nvme-log says why it did not"
        )
    return None


def _run(argv: list[str]) -> tuple[Any, str | None]:
    """The JSON a tool printed (whatever its exit status: smartctl's is a bitmask that also
    flags a failing drive), or why there is none."""
    try:
        done = subprocess.run(
            argv, capture_output=True, timeout=TOOL_TIMEOUT, check=False, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer within {TOOL_TIMEOUT:g} s"
    except OSError as exc:
        return None, f"cannot run {argv[0]}: {exc.strerror or exc}"
    try:
        return json.loads(done.stdout[:_MAX_JSON].decode("utf-8", "replace")), None
    except ValueError:
        said = _ANSI.sub("", done.stderr.decode("utf-8", "replace")).strip().splitlines()
        return None, f"{os.path.basename(argv[0])} exited {done.returncode}" + (
            f": {said[0][:200]}" if said else ""  # nvme-cli: the error, then its usage text
        )


NO_TOOL = "neither smartctl (smartmontools) nor nvme (nvme-cli) is installed"


def own_sysfs(sysfs: Path) -> bool:
    """Whether ``sysfs`` is this machine's /sys: the tools open this machine's /dev/nvmeN, not
    the drives a sysfs tree from elsewhere lists."""
    try:
        return sysfs.resolve() == Path("/sys").resolve()
    except (OSError, RuntimeError):
        return False


def installed_tools() -> tuple[str | None, str | None]:
    """The paths of smartctl and nvme where installed (on PATH), else None each."""
    import shutil  # loads bz2 and lzma: only where the tools may run

    return shutil.which("smartctl"), shutil.which("nvme")


def tool_reader(
    rootfs: Path = Path("/"), sysfs: Path = Path("/sys")
) -> tuple[HealthReader | None, str]:
    """A reader that runs smartctl (preferred: it also gives the temperature thresholds) or
    nvme-cli, and what it uses; None and why when neither is installed, or when ``sysfs`` is
    not the machine's own (the drives it lists are not the ones the tools would open). Device
    nodes are ``ROOT/dev/nvmeN``."""
    if not own_sysfs(sysfs):
        return None, f"--path.sysfs {sysfs} is not /sys (give --nvme.fixture DIR instead)"
    smartctl, nvme = installed_tools()
    if smartctl is None and nvme is None:
        return None, NO_TOOL

    def read(controller: str) -> HealthReading:
        return read_with_tools(smartctl, nvme, str(rootfs / "dev" / controller))[0]

    return read, " and ".join(n for n, p in (("smartctl", smartctl), ("nvme-cli", nvme)) if p)


def files_then_tools(files: HealthReader, tools: HealthReader) -> HealthReader:
    """A daemon run as root (a drop-in, as alerts.md once advised) with ``--nvme.log-dir`` on
    the unit's ExecStart: a drive the timer has written no file for is read by the tools, as
    before the directory came (else its SMART series went with no alert; found in a review)."""

    def read(controller: str) -> HealthReading:
        reading = files(controller)
        if reading.note is not None and reading.note.startswith(NO_LOG_FILE):
            return tools(controller)
        return reading

    return read


def read_with_tools(
    smartctl: str | None, nvme: str | None, node: str
) -> tuple[HealthReading, tuple[str, Any] | None]:
    """The device node's health log from smartctl, else nvme-cli, with the tool's JSON and
    its name where it gave one (what :func:`write_logs` keeps); the reading is stamped with
    when it was read."""
    notes = []
    for tool, path, argv, parse in (
        ("smartctl", smartctl, [smartctl or "", "--json", "-a", node], parse_smartctl),
        ("nvme-cli", nvme, [nvme or "", "smart-log", node, "-o", "json"], parse_nvme_cli),
    ):
        if path is None:
            continue
        doc, why = _run(argv)
        reading = parse(doc, tool) if why is None else _none(f"{tool}: {why}")
        if reading.health is not None:
            return replace(reading, read_at=time.time()), (tool, doc)
        notes.append(reading.note or "")
    return _none("; ".join(n for n in notes if n)), None
