"""The soak's text: per GPU a header, one verdict line per kernel and int4 ratio, and why it
stopped, in one line."""

from __future__ import annotations

from sparkdiag import terminal
from sparkdiag.probe.worker.contract import throughput_unit
from sparkdiag.soak.model import GpuSoak, SoakReport
from sparkdiag.soak.verdict import FALL_FRACTION, Sensor, Verdict

SENSOR_WORDS = {"memory": "memory", "gpu": "GPU"}
NO_MEMORY_SENSOR = (
    "this GPU reports no memory temperature (GB10's LPDDR5X has no sensor): the temperatures "
    "below are the GPU's"
)


def celsius(value: float | None, sensor: Sensor | str | None) -> str:
    """``61 °C memory``; empty without a value."""
    if value is None:
        return ""
    return f"{value:.0f} °C {SENSOR_WORDS.get(sensor or '', sensor or '')}".rstrip()


def unit(dtype: str) -> str:
    if "/" in dtype:
        return ""  # a ratio
    return throughput_unit(dtype)


def figure(value: float | None) -> str:
    """Three significant digits below 100 (CPU and decode figures are small)."""
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 100 else f"{value:.3g}"


def fraction(value: float) -> str:
    """Two decimals, three where two would round a fall up to the threshold (0.897: not 0.90)."""
    text = f"{value:.2f}"
    return f"{value:.3f}" if value < FALL_FRACTION and float(text) >= FALL_FRACTION else text


def verdict_text(v: Verdict, sensor: Sensor | None) -> str:
    """``held 0.98 of cold up to 61 °C memory``, ``fell to 0.84 of cold at 87 °C memory after
    124 s``, or why there is no verdict."""
    if v.status == "held":
        assert v.lowest_fraction is not None
        where = (
            f"up to {celsius(v.max_celsius, sensor)}"
            if v.max_celsius is not None
            else "(no temperature reading)"
        )
        return f"held {v.lowest_fraction:.2f} of cold {where}"
    if v.status == "fell":
        assert v.fell_fraction is not None
        at = f" at {celsius(v.fell_celsius, sensor)}" if v.fell_celsius is not None else ""
        after = f" after {v.fell_elapsed:.0f} s" if v.fell_elapsed is not None else ""
        tail = "" if v.fell_celsius is not None else " (no temperature reading)"
        return f"fell to {fraction(v.fell_fraction)} of cold{at}{after}{tail}"
    return v.note or v.status


# How a soak that stopped early says why (anything not named here stopped on an error).
_STOPPED_WHY = {
    "threshold": "near a thermal limit",
    "hw_thermal_slowdown": "hardware thermal slowdown",
    "hw_slowdown": "hardware slowdown",
}


def stopped_line(g: GpuSoak) -> str:
    """Why the soak stopped, in one line."""
    n = len(g.windows)
    ran = f" after {g.elapsed_seconds:.0f} s of load" if g.elapsed_seconds else ""
    windows = f"{n} window{'s' if n != 1 else ''}"
    why = f": {g.reason}" if g.reason else ""
    if g.stopped == "completed":
        return f"stopped: completed{ran}, {windows}"
    if g.stopped == "interrupted":
        return f"stopped: interrupted{why}{ran}; the record holds the {windows} measured"
    if g.stopped == "skipped":
        return f"not soaked{why} (--probe.when always soaks a busy GPU anyway)"
    if g.stopped == "unsupported":
        return f"not soaked{why}"
    what = _STOPPED_WHY.get(g.stopped, "error")
    return f"stopped: {what}{why}{ran}, {windows}"


def header(g: GpuSoak) -> str:
    who = g.target.label if g.target.label != "cpu" else "CPU"
    name = f" {g.name}" if g.name and g.name not in (who, g.device) else ""
    uuid = f" ({g.uuid})" if g.uuid else ""
    v = g.verdict
    temps = ""
    if v.min_celsius is not None and v.max_celsius is not None:
        word = SENSOR_WORDS[v.sensor or "gpu"]
        temps = f"; {word} {v.min_celsius:.0f} -> {v.max_celsius:.0f} °C"
    return f"{who}{name}{uuid}{temps}"


def _row(v: Verdict, sensor: Sensor | None) -> list[str]:
    at = celsius(v.hottest_celsius, sensor) if v.hottest_celsius is not None else ""
    fraction = v.hottest_fraction
    hottest = figure(v.hottest) + (f" ({fraction:.2f})" if fraction is not None else "")
    return [v.label, figure(v.cold), hottest, unit(v.dtype), at, verdict_text(v, sensor)]


HEADER: tuple[str, ...] = ("kernel", "cold", "hottest", "unit", "hottest at", "verdict")
NO_TEMPERATURE_HEADER: tuple[str, ...] = ("kernel", "cold", "last", "unit", "verdict")


def gpu_text(g: GpuSoak, width: int | None = None) -> str:
    """One GPU's header, its verdict table within ``width`` columns (the terminal's by default)
    and why it stopped."""
    width = terminal.width() if width is None else width
    lines = terminal.wrap(header(g), width, "", "    ")
    v = g.verdict
    if v.sensor == "gpu":
        lines += terminal.wrap(NO_MEMORY_SENSOR, width, "  ")
    measured = [k for k in v.kernels if k.status != "unsupported"]
    if measured or v.ratios:
        rows = [_row(k, v.sensor) for k in measured] + [_row(r, v.sensor) for r in v.ratios]
        head, right, which = HEADER, {1, 2, 4}, "hottest: the figure at the hottest window"
        if not any(row[4] for row in rows):  # no temperature read (a CPU soak): the last window
            head, right, which = (
                NO_TEMPERATURE_HEADER,
                {1, 2},
                "last: the figure at the last window",
            )
            rows = [row[:4] + row[5:] for row in rows]
        lines += terminal.table(head, rows, width, right=right, indent="  ", free=True)
        judged = any(k.status in ("held", "fell") for k in measured)  # not a CPU smoke soak
        rule = f"; a kernel below {FALL_FRACTION:g} of cold fell" if judged else ""
        lines += terminal.wrap(f"{which} (its fraction of cold){rule}", width, "  ")
    for k in v.kernels:
        if k.status == "error":
            lines += terminal.wrap(f"FAILED {k.label}: {k.note}", width, "  ", "    ")
    unsupported = [k for k in v.kernels if k.status == "unsupported"]
    if unsupported:
        reasons = sorted({k.note or "unsupported" for k in unsupported})
        names = ", ".join(dict.fromkeys(k.dtype for k in unsupported))
        lines += terminal.wrap(f"not measured: {names} ({'; '.join(reasons)})", width, "  ")
    lines += terminal.wrap(stopped_line(g), width, "  ")
    return "\n".join(lines) + "\n"


def text(report: SoakReport, width: int | None = None) -> str:
    """The whole report: every GPU's verdict and why it stopped."""
    return "\n".join(gpu_text(g, width) for g in report.gpus)
