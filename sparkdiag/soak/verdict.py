"""The verdict of a soak: per kernel, its cold rate, its hottest rate, and the temperature at which
it first fell below :data:`FALL_FRACTION` of cold, or that it held.

Pure functions over the worker's windows (:class:`~sparkdiag.probe.document.SoakWindow`), so that
every outcome can be tested on synthetic windows. A window's temperature is the hottest sample of
its measurement (the sustained load before it when the measurement has none). The memory
temperature is used where the GPU has one; where it has none (GB10: its LPDDR5X has no sensor,
NVML reads 0, which the worker reports as absent) the GPU temperature is used, and the verdict
says so (``sensor``).

A soak of a CPU (``--device cpu``, a smoke test) measures the CPU's run-to-run noise, not heat:
it has no thermal verdict (``thermal=False``). Its kernels are ``ran``, never ``fell``, and say
the range of their fractions of cold, so that a CPU never reports a slowdown nor warns about
cooling.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # annotations only: the document module loads the worker's tables
    from sparkdiag.probe.document import SoakWindow

FALL_FRACTION = 0.9  # a kernel "fell" in the first window below this fraction of its cold rate

Sensor = Literal["memory", "gpu"]
Status = Literal["held", "fell", "ran", "no-cold", "no-load", "unsupported", "error"]
NO_THERMAL = "a CPU soak: no thermal verdict"


@dataclass(frozen=True)
class Point:
    """One window of one series: when, what it delivered, how hot it was."""

    elapsed_seconds: float
    value: float
    celsius: float | None


@dataclass(frozen=True)
class KernelFigures:
    """What a kernel's verdict and its kept state (:class:`sparkdiag.soak.state.KernelState`)
    share: the fields below (see :class:`Verdict`), its label, and its hottest delivered figure
    over its cold one."""

    dtype: str
    shape: str
    kind: str
    status: str
    cold: float | None = None
    hottest: float | None = None
    hottest_celsius: float | None = None
    lowest_fraction: float | None = None
    fell_fraction: float | None = None
    fell_celsius: float | None = None

    @property
    def label(self) -> str:
        return f"{self.dtype} {self.shape}"

    @property
    def hottest_fraction(self) -> float | None:
        if self.cold is None or self.hottest is None:
            return None
        return self.hottest / self.cold


@dataclass(frozen=True)
class Verdict(KernelFigures):
    """One kernel (``int4`` at ``1x8192x8192``, kind ``decode``) or one int4 ratio (``int4/bf16``,
    shape ``decode``, kind ``ratio``) over the soak.

    status: held (never below FALL_FRACTION of cold under load), fell, ran (measured under load
        on a CPU: no thermal verdict), no-cold (no cold measurement to compare with), no-load
        (no window under load), unsupported (never measured), error (a window's result was
        wrong, or the kernel failed: ``note`` says how; its other windows' figures are kept)
    cold: delivered in the cold window (TFLOPS, or TOPS for integer dtypes; a plain number for a
        ratio)
    hottest: delivered in the hottest window that measured it, at ``hottest_celsius``
    lowest_fraction: the lowest delivered / cold over the windows under load
    fell_fraction, fell_celsius, fell_elapsed: the first window under load below FALL_FRACTION
        of cold: its fraction, temperature and seconds since the load started
    max_celsius: the hottest temperature it was measured at
    note: why there is no verdict (unsupported: the worker's reason)
    points: every window that measured it, in order
    """

    status: Status  # narrower than KernelFigures' (a state file may hold others)
    fell_elapsed: float | None = None
    max_celsius: float | None = None
    note: str | None = None
    points: tuple[Point, ...] = ()

    @property
    def degraded(self) -> bool:
        return self.status == "fell"


@dataclass(frozen=True)
class SoakVerdict:
    """Every series of one GPU's soak, judged on one sensor (None: no temperature was read)."""

    sensor: Sensor | None
    kernels: tuple[Verdict, ...]
    ratios: tuple[Verdict, ...]
    min_celsius: float | None = None
    max_celsius: float | None = None
    thermal: bool = True  # False: a CPU soak, whose kernels ran without a verdict

    @property
    def degraded(self) -> tuple[Verdict, ...]:
        """The kernels that fell below FALL_FRACTION of cold."""
        return tuple(v for v in self.kernels if v.degraded)

    @property
    def judged(self) -> tuple[Verdict, ...]:
        """The kernels with a verdict (held or fell)."""
        return tuple(v for v in self.kernels if v.status in ("held", "fell"))


def pick_sensor(windows: Iterable[SoakWindow]) -> Sensor | None:
    """``memory`` when any window read a memory temperature, else ``gpu`` when any read the GPU's,
    else None (a CPU run, or no NVML)."""
    seen: set[str] = set()
    for window in windows:
        for conditions in (window.conditions, window.load_conditions):
            if conditions is not None:
                seen |= conditions.temperatures().keys()
    if "memory" in seen:
        return "memory"
    return "gpu" if "gpu" in seen else None


def window_celsius(window: SoakWindow, sensor: Sensor | None) -> float | None:
    """The window's temperature on ``sensor``: the hottest sample of its measurement, else of the
    load period before it."""
    if sensor is None:
        return None
    value = window.conditions.temperatures().get(sensor)
    if value is None and window.load_conditions is not None:
        value = window.load_conditions.temperatures().get(sensor)
    return value


def judge(
    windows: Sequence[SoakWindow], sensor: Sensor | None = None, thermal: bool = True
) -> SoakVerdict:
    """The verdict of every kernel and int4 ratio over ``windows`` (in the order measured).

    ``sensor`` defaults to :func:`pick_sensor`. The cold rate is the window before the load
    (phase ``cold``); the hottest rate is the window with the highest temperature that measured
    the kernel (the latest one without temperatures); a kernel fell at the first window under
    load below FALL_FRACTION of its cold rate. Without ``thermal`` (a CPU soak) a kernel measured
    under load ``ran``: the same figures, no verdict.
    """
    ordered = sorted(windows, key=lambda w: (w.index, w.elapsed_seconds))
    if sensor is None:
        sensor = pick_sensor(ordered)
    temps = [window_celsius(w, sensor) for w in ordered]
    present = [t for t in temps if t is not None]
    kernels: dict[tuple[str, str, str], list[tuple[SoakWindow, float | None]]] = {}
    reasons: dict[tuple[str, str, str], str | None] = {}
    # a wrong result (or a failed kernel) in any window: read as "unsupported" before, and the
    # soak exited 0 (found in a review); a wrong result under heat is what a soak is for
    failed: dict[tuple[str, str, str], str] = {}
    for window in ordered:
        for result in window.results:
            if result.beta:
                continue
            key = (result.dtype, result.shape, result.kind)
            kernels.setdefault(key, []).append((window, result.delivered))
            if result.delivered is None:
                reasons.setdefault(key, result.reason or result.status)
            if result.status == "error":
                failed.setdefault(key, f"window {window.index}: {result.reason or 'failed'}")
    ratios: dict[tuple[str, str, str], list[tuple[SoakWindow, float | None]]] = {}
    for window in ordered:
        for name, value in window.ratios.items():
            ratios.setdefault((name, "decode", "ratio"), []).append((window, value))
    by_window = dict(zip((id(w) for w in ordered), temps, strict=True))
    return SoakVerdict(
        sensor=sensor,
        kernels=tuple(
            _failed(_series(key, values, by_window, reasons.get(key), thermal), failed.get(key))
            for key, values in kernels.items()
        ),
        ratios=tuple(
            _series(key, values, by_window, None, thermal) for key, values in ratios.items()
        ),
        min_celsius=min(present) if present else None,
        max_celsius=max(present) if present else None,
        thermal=thermal,
    )


def _failed(verdict: Verdict, why: str | None) -> Verdict:
    """``verdict`` as an error where a window's result was wrong or failed (``why``)."""
    return verdict if why is None else replace(verdict, status="error", note=why)


def _series(
    key: tuple[str, str, str],
    values: list[tuple[SoakWindow, float | None]],
    celsius: dict[int, float | None],
    reason: str | None,
    thermal: bool = True,
) -> Verdict:
    dtype, shape, kind = key
    points = tuple(
        Point(w.elapsed_seconds, v, celsius[id(w)]) for w, v in values if v is not None and v > 0
    )
    if not points:
        return Verdict(dtype, shape, kind, "unsupported", note=reason)
    hottest = max(
        points,
        key=lambda p: (p.celsius if p.celsius is not None else float("-inf"), p.elapsed_seconds),
    )
    temps = [p.celsius for p in points if p.celsius is not None]
    base = Verdict(
        dtype,
        shape,
        kind,
        "no-cold",
        hottest=hottest.value,
        hottest_celsius=hottest.celsius,
        max_celsius=max(temps) if temps else None,
        note="no cold measurement",
        points=points,
    )
    cold_values = [v for w, v in values if w.phase == "cold" and v is not None and v > 0]
    if not cold_values:
        return base
    cold = cold_values[0]
    loaded = [(w, v) for w, v in values if w.phase != "cold" and v is not None and v > 0]
    if not loaded:
        return replace(base, status="no-load", cold=cold, note="no window under load")
    fractions = [(w, v / cold) for w, v in loaded]
    lowest = min(f for _, f in fractions)
    if not thermal:
        highest = max(f for _, f in fractions)
        return replace(
            base,
            status="ran",
            cold=cold,
            lowest_fraction=lowest,
            note=f"ran at {_span(lowest, highest)} of cold ({NO_THERMAL})",
        )
    fell = next(((w, f) for w, f in fractions if f < FALL_FRACTION), None)
    if fell is None:
        return replace(base, status="held", cold=cold, lowest_fraction=lowest, note=None)
    window, fraction = fell
    return replace(
        base,
        status="fell",
        cold=cold,
        lowest_fraction=lowest,
        fell_fraction=fraction,
        fell_celsius=celsius[id(window)],
        fell_elapsed=window.elapsed_seconds,
        note=None,
    )


def _span(low: float, high: float) -> str:
    """``0.34-1.09``, or one figure where both print the same."""
    a, b = f"{low:.2f}", f"{high:.2f}"
    return a if a == b else f"{a}-{b}"
