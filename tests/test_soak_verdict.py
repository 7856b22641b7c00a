"""The soak's verdict as a pure function over synthetic windows: held, fell at a temperature, the
GPU temperature where the memory has no sensor, and the cases with nothing to judge; the text
that says so; and the records written from it (JSON, CSV rows, state entries)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkdiag.soak.model import CSV_COLUMNS, csv_rows, record_json, state_entry
from sparkdiag.soak.render import NO_MEMORY_SENSOR, fraction, gpu_text, stopped_line, verdict_text
from sparkdiag.soak.verdict import judge, pick_sensor
from tests.support.soak import DECODE, gpu_soak, heating, report, window


def kernel(windows: list, dtype: str, sensor=None):  # type: ignore[no-untyped-def]
    verdict = judge(windows, sensor)
    (found,) = [v for v in verdict.kernels if v.dtype == dtype]
    return verdict, found


def test_held_reports_the_lowest_fraction_and_the_hottest_memory() -> None:
    windows = heating(
        int4=[6.4, 6.35, 6.3, 6.27], bf16=[4.0, 4.0, 3.98, 3.97], memory=[40, 50, 58, 61]
    )
    verdict, int4 = kernel(windows, "int4")
    assert verdict.sensor == "memory"
    assert (verdict.min_celsius, verdict.max_celsius) == (40, 61)
    assert int4.status == "held" and int4.cold == 6.4
    assert int4.hottest == 6.27 and int4.hottest_celsius == 61
    assert int4.lowest_fraction == pytest.approx(6.27 / 6.4)
    assert int4.fell_celsius is None and not verdict.degraded
    assert verdict_text(int4, verdict.sensor) == "held 0.98 of cold up to 61 °C memory"


def test_fell_at_the_first_window_below_nine_tenths_of_cold() -> None:
    # int4 collapses as memory passes 85 °C; bf16 holds; the hottest window is not the first
    # below 0.9, and a window that recovers does not undo the fall
    windows = heating(
        int4=[6.4, 6.3, 5.9, 5.5, 4.2, 5.9],
        bf16=[4.0, 4.0, 3.95, 3.9, 3.88, 3.9],
        memory=[45, 70, 82, 86, 91, 88],
    )
    verdict, int4 = kernel(windows, "int4")
    assert int4.status == "fell"
    assert int4.fell_celsius == 86 and int4.fell_elapsed == 15.0
    assert int4.fell_fraction == pytest.approx(5.5 / 6.4)
    assert int4.hottest == 4.2 and int4.hottest_celsius == 91
    assert int4.lowest_fraction == pytest.approx(4.2 / 6.4)
    assert [v.dtype for v in verdict.degraded] == ["int4"]
    _, bf16 = kernel(windows, "bf16")
    assert bf16.status == "held"
    assert verdict_text(int4, "memory") == "fell to 0.86 of cold at 86 °C memory after 15 s"
    # the int4/bf16 ratio falls too; it is judged the same way but never counts as degraded
    (ratio,) = verdict.ratios
    assert ratio.dtype == "int4/bf16" and ratio.kind == "ratio" and ratio.status == "fell"


def test_exactly_nine_tenths_still_holds() -> None:
    windows = heating(int4=[10.0, 9.0], bf16=[4.0, 4.0], memory=[40, 80])
    _, int4 = kernel(windows, "int4")
    assert int4.status == "held" and int4.lowest_fraction == pytest.approx(0.9)


def test_gpu_temperature_when_the_memory_has_no_sensor() -> None:
    # GB10: no memory temperature at all; the GPU's is used, and the text says so
    windows = heating(
        int4=[3.0, 2.95, 2.5], bf16=[1.5, 1.5, 1.5], memory=[None] * 3, gpu=[38, 55, 71]
    )
    assert pick_sensor(windows) == "gpu"
    verdict, int4 = kernel(windows, "int4")
    assert verdict.sensor == "gpu" and int4.fell_celsius == 71
    assert verdict_text(int4, verdict.sensor) == "fell to 0.83 of cold at 71 °C GPU after 10 s"
    text = " ".join(gpu_text(gpu_soak(windows)).split())  # the words, as wrapped to any width
    assert NO_MEMORY_SENSOR in text and "GPU 38 -> 71 °C" in text


def test_without_any_temperature_the_table_shows_the_last_window_not_a_hottest() -> None:
    """A CPU soak reads no temperature: its "hottest" window is the last one, and a "hottest at"
    column stood empty (the newcomer review). The table says "last" and has no such column;
    with a temperature both are back."""
    windows = heating(int4=[6.4, 6.0, 6.2], bf16=[4.0, 4.1, 3.9], memory=[None] * 3)
    soak = gpu_soak(windows, index=None)
    soak = replace(soak, verdict=judge(windows, thermal=False))
    head = next(line for line in gpu_text(soak, 100).splitlines() if "kernel" in line).split()
    assert head == ["kernel", "cold", "last", "unit", "verdict"]
    assert "last: the figure at the last window (its fraction of cold)" in gpu_text(soak, 100)
    hot = heating(int4=[6.4, 6.0], bf16=[4.0, 4.0], memory=[40, 80])
    text = gpu_text(gpu_soak(hot), 100)
    assert "hottest at" in text and "80 °C memory" in text and " last " not in text


def test_memory_wins_over_gpu_and_the_load_period_fills_a_silent_measurement() -> None:
    windows = heating(int4=[6.4, 6.4], bf16=[4.0, 4.0], memory=[40, None], gpu=[35, 60])
    windows[1] = window(1, {"int4": 6.4, "bf16": 4.0}, memory=None, gpu=60, load_memory=66)
    verdict, int4 = kernel(windows, "int4")
    assert verdict.sensor == "memory"
    assert int4.hottest_celsius == 66 and verdict.max_celsius == 66


def test_no_temperature_at_all_judges_by_time() -> None:
    windows = heating(int4=[1.0, 0.99, 0.5], bf16=[1.0, 1.0, 1.0], memory=[None] * 3)
    verdict, int4 = kernel(windows, "int4")
    assert verdict.sensor is None and int4.hottest == 0.5  # the latest window
    assert verdict_text(int4, None) == "fell to 0.50 of cold after 10 s (no temperature reading)"
    _, bf16 = kernel(windows, "bf16")
    assert verdict_text(bf16, None) == "held 1.00 of cold (no temperature reading)"


def test_nothing_to_judge() -> None:
    # interrupted during the cold window: no cold figure; right after it: no load window
    no_cold = [window(1, {"int4": 6.0}, memory=60)]
    assert kernel(no_cold, "int4")[1].status == "no-cold"
    no_load = [window(0, {"int4": 6.0}, memory=40)]
    _, int4 = kernel(no_load, "int4")
    assert int4.status == "no-load" and int4.cold == 6.0
    assert verdict_text(int4, "memory") == "no window under load"
    unsupported = [window(0, {"nvfp4": None}), window(1, {"nvfp4": None})]
    verdict, nvfp4 = kernel(unsupported, "nvfp4")
    assert nvfp4.status == "unsupported" and nvfp4.note == "nvfp4 is not here"
    assert verdict.judged == () and verdict.degraded == ()


def test_windows_out_of_order_are_judged_in_order() -> None:
    windows = heating(int4=[6.4, 5.0, 6.4], bf16=[4.0] * 3, memory=[40, 90, 60])
    _, int4 = kernel(list(reversed(windows)), "int4")
    assert int4.cold == 6.4 and int4.fell_celsius == 90


@pytest.mark.parametrize(
    ("stopped", "reason", "expected"),
    [
        ("completed", None, "stopped: completed after 10 s of load, 3 windows"),
        (
            "threshold",
            "memory 90 °C within 5 °C of its maximum operating temperature 95 °C",
            "stopped: near a thermal limit: memory 90 °C within 5 °C",
        ),
        (
            "hw_thermal_slowdown",
            "hardware thermal slowdown (clock event reasons 0x40)",
            "stopped: hardware thermal slowdown: hardware thermal slowdown (clock event",
        ),
        (
            "interrupted",
            "SIGINT received",
            "stopped: interrupted: SIGINT received after 10 s of load; the record holds the 3 "
            "windows measured",
        ),
        ("error", "soak failed: CUDA out of memory", "stopped: error: soak failed"),
        ("skipped", "GPU busy: pid 42", "not soaked: GPU busy: pid 42 (--probe.when always"),
    ],
)
def test_one_line_says_why_it_stopped(stopped: str, reason: str | None, expected: str) -> None:
    windows = heating(int4=[6.4, 6.3, 6.2], bf16=[4.0] * 3, memory=[40, 50, 60])
    line = stopped_line(gpu_soak(windows, stopped, reason))
    assert line.startswith(expected) and "\n" not in line


def test_records_carry_every_window_and_kernel() -> None:
    windows = heating(int4=[6.4, 5.5], bf16=[4.0, 3.9], memory=[45, 86], gpu=[40, 70])
    soak = gpu_soak(windows)
    body = record_json(report(soak))
    (gpu,) = body["gpus"]
    assert body["schema"] == "sparkdiag-soak/1" and gpu["sensor"] == "memory"
    assert [v["status"] for v in gpu["verdicts"]] == ["fell", "held"]
    assert gpu["verdicts"][0]["fell_celsius"] == 86
    assert len(gpu["windows"]) == 2 and gpu["windows"][1]["ratios"]["int4/bf16"] > 1
    rows = [dict(zip(CSV_COLUMNS, row, strict=True)) for row in csv_rows(report(soak))]
    assert len(rows) == 4  # two windows, two kernels
    hot_int4 = rows[2]
    assert (hot_int4["dtype"], hot_int4["shape"], hot_int4["phase"]) == ("int4", DECODE, "load")
    assert hot_int4["of_cold"] == pytest.approx(5.5 / 6.4)
    assert hot_int4["memory_temperature_celsius"] == 86
    assert hot_int4["gpu_temperature_celsius"] == 70
    assert hot_int4["sm_clock_mhz"] == pytest.approx(1980) and hot_int4["power_watts"] == 450
    entry = state_entry(soak, 1.7e9, 300.0)
    assert entry.gpu == "0" and entry.uuid.startswith("GPU-") and entry.sensor == "memory"
    assert [k.label for k in entry.degraded] == [f"int4 {DECODE}"]


def test_a_fall_never_reads_as_the_threshold() -> None:
    assert fraction(0.897) == "0.897" and fraction(0.9) == "0.90" and fraction(0.84) == "0.84"
    windows = heating(int4=[1.0, 0.897], bf16=[1.0, 1.0], memory=[40, 80])
    _, int4 = kernel(windows, "int4")
    assert verdict_text(int4, "memory").startswith("fell to 0.897 of cold at 80 °C")


def test_a_cpu_soak_ran_without_a_thermal_verdict() -> None:
    """A CPU measures its own noise, not heat (issue 21: 7 of 7 CPU smoke soaks "fell" to
    0.34-0.90 of cold): without ``thermal`` every kernel and ratio measured under load ran, with
    the range of its fractions of cold, and none is degraded."""
    windows = heating(int4=[6.4, 2.2, 7.0, 5.1], bf16=[4.0, 1.4, 4.2, 3.9], memory=[None] * 4)
    assert judge(windows).degraded  # judged as a GPU, the noise would read as a fall
    verdict = judge(windows, thermal=False)
    assert verdict.thermal is False and verdict.degraded == () and verdict.judged == ()
    int4 = next(v for v in verdict.kernels if v.dtype == "int4")
    assert int4.status == "ran" and int4.fell_fraction is None and int4.cold == 6.4
    assert int4.lowest_fraction == pytest.approx(2.2 / 6.4)
    assert verdict_text(int4, None) == "ran at 0.34-1.09 of cold (a CPU soak: no thermal verdict)"
    steady = judge(
        heating(int4=[6.4, 6.4, 6.4], bf16=[4.0, 4.0, 4.0], memory=[None] * 3), thermal=False
    )
    assert verdict_text(steady.kernels[0], None).startswith("ran at 1.00 of cold (")
    assert {r.status for r in verdict.ratios} == {"ran"}
    soak = gpu_soak(windows, index=None)
    entry = state_entry(replace(soak, verdict=verdict), 1.7e9, 10.0)
    assert entry.is_cpu and entry.degraded == () and {k.status for k in entry.kernels} == {"ran"}


def test_a_wrong_result_in_a_window_is_an_error_and_fails_the_soak() -> None:
    """A kernel whose result was wrong under load read "unsupported" ("not measured: bf16
    (wrong result: ...)") and the soak exited 0 (found in a review)."""
    from sparkdiag.commands.soak import exit_status
    from sparkdiag.errors import Exit
    from sparkdiag.probe.document import KernelResult

    windows = heating([6.0, 5.9, 5.8], [3.0, 3.0, 3.0], [40, 60, 80])
    wrong = KernelResult(
        "bf16", DECODE, "decode", 0, "error", "wrong result: max rel error 0.3", None
    )
    windows[2] = replace(windows[2], results=(windows[2].results[0], wrong))
    g = gpu_soak(windows)
    bf16 = next(k for k in g.verdict.kernels if k.dtype == "bf16")
    assert bf16.status == "error" and bf16.note == "window 2: wrong result: max rel error 0.3"
    assert bf16.points  # the windows that measured it are kept
    assert exit_status((g,), interrupted=False, files_ok=True) == Exit.FAILED
    assert f"FAILED bf16 {DECODE}: window 2: wrong result" in gpu_text(g, 100)
    assert "not measured: bf16" not in gpu_text(g, 100)
    assert state_entry(g, 1.7e9, 60.0).failed[0].label == f"bf16 {DECODE}"
