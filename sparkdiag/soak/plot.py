"""The soak's PNGs (``--plot DIR`` or ``--plot PREFIX``), two per GPU:

- ``PREFIX-time.png``: each kernel's delivered throughput as a fraction of its cold rate against
  the seconds of load, one line per dtype (a panel per shape), with the memory and GPU
  temperatures on a second axis;
- ``PREFIX-temperature.png``: the same fractions against the memory temperature (the GPU's where
  the GPU has no memory sensor), one line per dtype.

The line at 0.9 is where a kernel counts as fallen. With several GPUs each file name carries the
GPU (``PREFIX-gpu0-time.png``). matplotlib is an optional extra (:mod:`sparkdiag.plotting`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sparkdiag.plotting import is_folder as is_folder  # shared with watch's --plot
from sparkdiag.plotting import pyplot, twin_legend
from sparkdiag.soak.model import GpuSoak, SoakReport
from sparkdiag.soak.render import SENSOR_WORDS, figure, stopped_line, unit
from sparkdiag.soak.verdict import FALL_FRACTION, Point, Verdict

KIND_TITLES = {"decode": "decode (M=1, memory-bound)", "llm": "LLM shape", "compute": "compute"}
COLOURS = {
    "int4": "tab:red",
    "bf16": "tab:blue",
    "fp16": "tab:green",
    "fp8": "tab:purple",
    "nvfp4": "tab:orange",
    "int8": "tab:brown",
    "tf32": "tab:gray",
}


def prefix_for(target: str | Path) -> Path:
    """``--plot`` as a file prefix: a directory (existing, or given with a trailing slash) gets
    ``soak`` in it; a ``.png`` suffix is dropped."""
    path = Path(target)
    if is_folder(target):
        return path / "soak"
    return path.with_suffix("") if path.suffix.lower() == ".png" else path


def plot(report: SoakReport, target: str | Path) -> list[Path]:
    """Write the PNGs; returns their paths. PlotUnavailable without matplotlib, OSError when a
    file cannot be written. A directory (``DIR/``) that is missing is created, its parent never,
    nor the folder of a prefix (a typo must not make a chain of folders)."""
    plt = pyplot()
    prefix = prefix_for(target)
    if is_folder(target):
        prefix.parent.mkdir(exist_ok=True)
    written: list[Path] = []
    gpus = [g for g in report.gpus if g.windows]
    for g in gpus:
        stem = f"{prefix.name}-gpu{g.gpu_label}" if len(gpus) > 1 else prefix.name
        for what, draw in (("time", _time), ("temperature", _temperature)):
            path = prefix.with_name(f"{stem}-{what}.png")
            fig = draw(plt, g)
            try:
                fig.savefig(path, dpi=110)
            finally:
                plt.close(fig)
            written.append(path)
    return written


def _panels(g: GpuSoak) -> list[tuple[str, list[Verdict]]]:
    kinds: dict[str, list[Verdict]] = {}
    for v in g.verdict.kernels:
        if v.cold is not None and v.points:
            kinds.setdefault(v.kind, []).append(v)
    return list(kinds.items())


def _title(g: GpuSoak, what: str) -> str:
    who = "CPU" if g.gpu_label == "cpu" else f"GPU {g.gpu_label} {g.name}".rstrip()
    return f"sparkdiag soak: {who}, {what}\n{stopped_line(g)}"


def _label(v: Verdict) -> str:
    return f"{v.dtype} (cold {figure(v.cold)} {unit(v.dtype)})"


def _threshold(ax: Any) -> None:
    ax.axhline(FALL_FRACTION, color="black", lw=0.8, ls=":", label=f"{FALL_FRACTION:g} of cold")
    ax.set_ylabel("delivered / cold")
    ax.grid(alpha=0.3)


def _fractions(
    ax: Any,
    kind: str,
    verdicts: Sequence[Verdict],
    x_of: Callable[[Point], float | None],
    lw: float,
) -> None:
    """One panel: each kernel's fraction of its cold rate against ``x_of`` its points (those
    that have an x), the 0.9 line and the kernel kind and shape as the title."""
    for v in verdicts:
        assert v.cold is not None
        points = [(x, p.value / v.cold) for p in v.points if (x := x_of(p)) is not None]
        ax.plot(
            [x for x, _ in points],
            [y for _, y in points],
            marker=".",
            lw=lw,
            color=COLOURS.get(v.dtype),
            label=_label(v),
        )
    _threshold(ax)
    shape = verdicts[0].shape if verdicts else ""
    ax.set_title(f"{KIND_TITLES.get(kind, kind)} {shape}", fontsize=9)


def _time(plt: Any, g: GpuSoak) -> Any:
    panels = _panels(g) or [("", [])]
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(11, 3.6 * len(panels)), sharex=True, squeeze=False
    )
    fig.suptitle(_title(g, "throughput against time"), fontsize=10)
    for ax, (kind, verdicts) in zip(axes[:, 0], panels, strict=True):
        _fractions(ax, kind, verdicts, lambda p: p.elapsed_seconds, lw=1.2)
        series = [
            (sensor, colour, _temperatures(g, sensor))
            for sensor, colour in (("memory", "tab:orange"), ("gpu", "tab:red"))
        ]
        if not any(points for _s, _c, points in series):
            ax.legend(fontsize=7, loc="lower left")
            continue
        temp = ax.twinx()
        for sensor, colour, points in series:
            if points:
                temp.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    color=colour,
                    lw=1,
                    ls="--",
                    alpha=0.7,
                    label=f"{SENSOR_WORDS[sensor]} °C",
                )
        temp.set_ylabel("°C")
        twin_legend(ax, temp, loc="lower left")
    axes[-1, 0].set_xlabel("seconds of load (0: the cold window before it)")
    fig.tight_layout()
    return fig


def _temperatures(g: GpuSoak, sensor: str) -> list[tuple[float, float]]:
    """(seconds, °C) of every window that read ``sensor``."""
    pairs = ((w.elapsed_seconds, w.conditions.temperatures().get(sensor)) for w in g.windows)
    return [(t, c) for t, c in pairs if c is not None]


def _temperature(plt: Any, g: GpuSoak) -> Any:
    panels = _panels(g) or [("", [])]
    sensor = g.verdict.sensor
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.6 * len(panels)), squeeze=False)
    word = SENSOR_WORDS.get(sensor or "", "")
    what = f"throughput against {word} temperature" if word else "no temperature was read"
    fig.suptitle(_title(g, what), fontsize=10)
    for ax, (kind, verdicts) in zip(axes[:, 0], panels, strict=True):
        _fractions(ax, kind, verdicts, lambda p: p.celsius, lw=1)
        if sensor is None:
            ax.text(
                0.5,
                0.5,
                "no temperature was read (CPU run or no NVML)",
                transform=ax.transAxes,
                ha="center",
            )
        ax.legend(fontsize=7, loc="lower left")
    note = " (no memory sensor: the GPU's)" if sensor == "gpu" else ""
    axes[-1, 0].set_xlabel(f"{word} temperature °C{note}")
    fig.tight_layout()
    return fig
