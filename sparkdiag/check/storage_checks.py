"""Storage: the NVMe drives' health and temperature (always), and a directory's read and write
speed against its drive and its baseline (only with ``check --storage DIR``: it writes).

``storage-speed`` runs the storage probe (:mod:`sparkdiag.storage.session`, without recording:
check never teaches a baseline): warn when a figure is under 0.7 of the baseline learned by
``sparkdiag storage`` (or the daemon), or when the directory was refused; fail when the probe
failed or hung. ``nvme-health`` reads the SMART log (smartctl or nvme-cli): fail on any critical
warning bit, warn on media errors, low spare or endurance at 90 %. ``nvme-temperature`` holds the
composite temperature against the drive's own warning (it throttles above) and critical
thresholds.
"""

from __future__ import annotations

from collections.abc import Callable

from sparkdiag.check.model import CheckContext, CheckResult, Status
from sparkdiag.snapshot import NvmeController, NvmeHealth
from sparkdiag.sources.host.nvme_tools import fixture_advice
from sparkdiag.storage.evaluate import SLOW_RATIO, StorageReport
from sparkdiag.storage.render import rate, ratio, seconds

SPEED, HEALTH, TEMPERATURE = "storage-speed", "nvme-health", "nvme-temperature"
NOT_ASKED = "not asked: --storage DIR measures DIR (it writes a test file)"
SPARE_LOW, WORN = 0.2, 0.9  # METRICS.md SparkdiagNvmeWearing: spare under 20 %, used 90 %
WARNING_BITS = (
    (0x01, "spare below its threshold"),
    (0x02, "temperature beyond a threshold"),
    (0x04, "reliability degraded"),
    (0x08, "media read-only"),
    (0x10, "volatile memory backup failed"),
    (0x20, "persistent memory region unreliable"),
)
REPLACE = "back up what is on it now and plan to replace the drive; 'smartctl -a /dev/{name}'"
COOL = (
    "the drive throttles above its warning temperature: give it airflow or a heatsink (a small "
    "M.2 drive in a closed box runs hot under long writes), and keep checkpoints smaller"
)


def check_storage_speed(ctx: CheckContext) -> list[CheckResult]:
    """With ``--storage DIR`` only (it writes a test file): DIR's sequential read and write and
    4 KiB p99 against its drive's link and the baseline ``sparkdiag storage`` learned; under 0.7
    of it, or DIR refused, warns; a probe that fails or hangs fails. Never recorded."""
    probe = ctx.storage
    if probe is None:
        return [CheckResult(SPEED, "skip", NOT_ASKED)]
    if probe.report is None:
        why = probe.error or "not measured"
        if probe.refused:
            return [
                CheckResult(
                    SPEED,
                    "warn",
                    why,
                    "give a directory on a filesystem with room, that sparkdiag may write to",
                )
            ]
        return [CheckResult(SPEED, "fail", why, "look at the drive's health and dmesg")]
    return [_speed(probe.report)]


def _speed(report: StorageReport) -> CheckResult:
    target = report.target
    parts, slow = [], []
    for figure in report.figures:
        text = f"{figure.throughput.direction} {rate(figure.value)}"
        if figure.ratio is not None and figure.baseline is not None:
            text += f" ({ratio(figure.ratio)} of {rate(figure.baseline.bytes_per_second)})"
        parts.append(text)
        if figure.verdict == "slow":
            slow.append(figure.throughput.direction)
    where = f"{target.directory} on {target.device or target.kind}"
    ceiling = f", link {rate(target.ceiling)}" if target.ceiling else ""
    latency = report.document.random_read
    p99 = f", 4 KiB p99 {seconds(latency.p99)}" if latency is not None else ""
    finding = f"{where}: {', '.join(parts)}{ceiling}{p99}"
    data = report.as_json()
    if report.verdict == "cached":  # the figures are the page cache's, not the drive's
        return CheckResult(
            SPEED,
            "warn",
            f"{where}: {report.verdict_reason}",
            "measure a directory on a filesystem that honours O_DIRECT (ext4 without "
            "data=journal, xfs), or judge the drive by its health rows",
            data=data,
        )
    if slow:
        return CheckResult(
            SPEED,
            "warn",
            f"slow {' and '.join(slow)} (under {SLOW_RATIO} of baseline): {finding}",
            "check the drive's temperature and health rows, what else uses it, and its free "
            "space; 'sparkdiag storage DIR' measures it again",
            data=data,
        )
    if report.verdict == "learning":
        return CheckResult(
            SPEED,
            "pass",
            f"{finding} (no baseline yet)",
            "run 'sparkdiag storage DIR' on the healthy machine to learn one",
            data=data,
        )
    return CheckResult(SPEED, "pass", finding, data=data)


def _each_drive(
    name: str, judge: Callable[[CheckContext, NvmeController], CheckResult], doc: str
) -> Callable[[CheckContext], list[CheckResult]]:
    """A check of every NVMe drive the snapshot has (skip when none, or none was read); ``doc``
    is its docstring (docs/check.md's row)."""

    def check(ctx: CheckContext) -> list[CheckResult]:
        drives = ctx.snapshot.nvme
        if drives is None:
            return [CheckResult(name, "skip", "NVMe drives were not read")]
        if not drives:
            return [CheckResult(name, "skip", "no NVMe drive in sysfs")]
        return [judge(ctx, drive) for drive in drives]

    check.__doc__ = doc
    return check


def _health(ctx: CheckContext, drive: NvmeController) -> CheckResult:
    name = f"{drive.name} {drive.model}".strip()
    log = drive.health
    if log is None:
        why = drive.health_note or "no tool"
        timer = ctx.nvme_logs
        return CheckResult(
            HEALTH,
            "skip",
            f"{name}: SMART log not read ({why})",
            fixture_advice(drive.health_note, drive.name)
            or (
                f"the root timer leaves the SMART logs in {timer}: add --nvme.log-dir {timer} "
                "to read them (or run this as root)"
                if timer is not None
                else "install smartmontools (or nvme-cli) and run as root to read it"
            ),
        )
    data = _health_data(log)
    problems = []
    if log.media_errors:
        problems.append(f"{log.media_errors:.0f} media errors")
    spare, floor = log.available_spare_ratio, log.available_spare_threshold_ratio
    if spare is not None and (spare < SPARE_LOW or (floor is not None and spare <= floor)):
        problems.append(f"spare {spare:.0%} left")
    if log.percentage_used_ratio is not None and log.percentage_used_ratio >= WORN:
        problems.append(f"{log.percentage_used_ratio:.0%} of its endurance used")
    summary = _summary(log)
    status: Status
    bits = log.critical_warning or 0
    if bits:
        said = ", ".join(text for bit, text in WARNING_BITS if bits & bit) or f"0x{bits:02x}"
        status, finding = "fail", f"critical warning 0x{bits:02x} ({said})"
    elif problems:
        status, finding = "warn", f"{', '.join(problems)} ({summary})"
    else:
        return CheckResult(HEALTH, "pass", f"{name}: {summary}", data=data)
    return CheckResult(
        HEALTH, status, f"{name}: {finding}", REPLACE.format(name=drive.name), data=data
    )


def _summary(log: NvmeHealth) -> str:
    parts = []
    if log.percentage_used_ratio is not None:
        parts.append(f"{log.percentage_used_ratio:.0%} used")
    if log.available_spare_ratio is not None:
        parts.append(f"spare {log.available_spare_ratio:.0%}")
    if log.media_errors is not None:
        parts.append(f"{log.media_errors:.0f} media errors")
    if log.unsafe_shutdowns is not None:
        parts.append(f"{log.unsafe_shutdowns:.0f} unsafe shutdowns")
    return ", ".join(parts) + f" (from {log.source})"


# The health log's figures a row's data carries (check --json)
HEALTH_DATA = (
    "critical_warning",
    "media_errors",
    "percentage_used_ratio",
    "available_spare_ratio",
    "unsafe_shutdowns",
    "error_log_entries",
    "warning_temperature_seconds",
    "source",
)


def _health_data(log: NvmeHealth) -> dict[str, object]:
    return {name: getattr(log, name) for name in HEALTH_DATA}


def _temperature(_ctx: CheckContext, drive: NvmeController) -> CheckResult:
    name = f"{drive.name} {drive.model}".strip()
    now = drive.temperature_celsius.get("composite")
    warn, crit = (drive.threshold_celsius.get(k) for k in ("warning", "critical"))
    data = {"composite_celsius": now, "warning_celsius": warn, "critical_celsius": crit}
    if now is None:
        return CheckResult(TEMPERATURE, "skip", f"{name}: no composite temperature", data=data)
    limits = ", ".join(f"{k} {v:.0f} °C" for k, v in (("warning", warn), ("critical", crit)) if v)
    finding = f"{name}: {now:.0f} °C" + (f" ({limits})" if limits else "")
    hot_minutes = drive.health.warning_temperature_seconds if drive.health else None
    if hot_minutes:
        finding += f"; {hot_minutes / 60:.0f} min above warning over its life"
    if crit is not None and now >= crit:
        return CheckResult(
            TEMPERATURE, "fail", f"{finding}: at its critical temperature", COOL, data=data
        )
    if warn is not None and now >= warn:
        return CheckResult(TEMPERATURE, "warn", f"{finding}: throttling", COOL, data=data)
    return CheckResult(TEMPERATURE, "pass", finding, data=data)


check_nvme_health = _each_drive(
    HEALTH,
    _health,
    "Per NVMe drive, its SMART log (smartctl or nvme-cli, as root): any critical-warning bit "
    "fails; media errors, spare under 20 % or 90 % of the endurance used warn; a log that "
    "cannot be read skips, saying why.",
)
check_nvme_temperature = _each_drive(
    TEMPERATURE,
    _temperature,
    "Per NVMe drive, its composite temperature against its own thresholds: at or above the "
    "warning one warns (the drive throttles), at or above the critical one fails.",
)
