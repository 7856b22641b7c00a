"""The timeline PNG of a watch (``--plot FILE`` or ``--plot DIR/``: :func:`path_for`): GPU
utilization and activity, clocks and temperatures, the job's CPU, its I/O and memory pressure,
with the time lost to each cause shaded (the phases: a checkpoint, a compilation, a stretch of
host syncs), each named in the legend with the line of code that took most of its time where
the stacks were sampled. matplotlib is an optional extra: ``pip install 'sparkdiag[plot]'``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkdiag.plotting import INSTALL_HINT as INSTALL_HINT
from sparkdiag.plotting import PlotUnavailable as PlotUnavailable
from sparkdiag.plotting import available as available
from sparkdiag.plotting import is_folder, pyplot, twin_legend
from sparkdiag.plotting import missing_message as missing_message
from sparkdiag.watch.causes import TITLES, Cause
from sparkdiag.watch.diagnose import Diagnosis
from sparkdiag.watch.model import Recording

COLOURS = {
    "co-tenant": "black",
    "data-prep-in-loop": "gold",
    "host-sync": "tab:blue",
    "pageable-copies": "tab:green",
    "recompiling": "darkviolet",
    "logging": "lightcoral",
    "optimizer-step": "teal",
    "collective-wait": "slategray",
    "input-starved": "tab:orange",
    "stalled-kernel": "tab:gray",
    "few-sms": "tab:cyan",
    "cpu-bound-launcher": "tab:purple",
    "checkpoint-stalls": "tab:brown",
    "throttled": "tab:red",
    "memory-pressure": "tab:pink",
    "low-tensor-activity": "tab:olive",
}


def _series(rec: Recording, gpus: tuple[int, ...], attr: str) -> tuple[list[float], list[float]]:
    xs: list[float] = []
    ys: list[float] = []
    for tick in rec.ticks:
        values = [getattr(g, attr) for g in tick.gpus if g.index in gpus]
        present = [v for v in values if v is not None]
        if present:
            xs.append(tick.t)
            ys.append(sum(present) / len(present))
    return xs, ys


def _job(rec: Recording, attr: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
    pairs = [
        (t.t, getattr(t.job, attr) * scale) for t in rec.ticks if getattr(t.job, attr) is not None
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _host(rec: Recording, attr: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
    pairs = [
        (t.t, getattr(t.host, attr) * scale) for t in rec.ticks if getattr(t.host, attr) is not None
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


TITLE_CHARS = 110  # what fits above an 11-inch figure at 10 points


def shorten(text: str, width: int = TITLE_CHARS) -> str:
    """``text`` cut in the middle with an ellipsis when it is longer than ``width`` (a job's
    command line runs off the figure otherwise; its start and end tell it apart)."""
    text = " ".join(text.split())  # a -c script's newlines would stack the title
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return f"{text[:head]}…{text[len(text) - (width - 1 - head) :]}"


IN_FOLDER = "watch.png"  # the file --plot DIR/ writes in DIR


def path_for(target: str | Path) -> Path:
    """The file ``--plot`` writes: ``DIR/watch.png`` for a directory (an existing one, or one
    given with a trailing slash, as soak's ``--plot`` reads it); a name without a suffix gets
    ``.png`` (what matplotlib would have added unsaid); any other name as given."""
    path = Path(target)
    if is_folder(target):
        return path / IN_FOLDER
    return path if path.suffix else path.with_name(f"{path.name}.png")


def plot(rec: Recording, diagnosis: Diagnosis, target: str | Path) -> Path:
    """Write the timeline to :func:`path_for` ``target`` (PNG) and return that path. A directory
    (``DIR/``) that is missing is created, its parent never. Raises PlotUnavailable without
    matplotlib, OSError where the file cannot be written."""
    plt = pyplot()
    path = path_for(target)
    if is_folder(target):
        path.parent.mkdir(exist_ok=True)
    from matplotlib.patches import Patch

    gpus = diagnosis.gpus or tuple(g.index for g in rec.gpus)
    sampled = any(g.index in gpus for tick in rec.ticks for g in tick.gpus)
    if sampled:
        fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
        act, clk, cpu, io = axes
    else:  # nothing sampled on a GPU: no empty GPU panels
        fig, axes = plt.subplots(2, 1, figsize=(11, 5.5), sharex=True)
        cpu, io = axes
    fig.suptitle(f"sparkdiag watch: {shorten(rec.job)}\n{_headline(diagnosis, rec)}", fontsize=10)
    if sampled:
        _gpu_panels(rec, gpus, act, clk)
    _job_panels(rec, cpu, io)
    for start, end, name in diagnosis.spans:
        for ax in axes:
            ax.axvspan(start, end, color=COLOURS.get(name, "gray"), alpha=0.15, lw=0)
    handles = [
        Patch(color=COLOURS[c.name], alpha=0.3, label=legend(c))
        for c in diagnosis.causes
        if c.name in COLOURS
    ]
    top = axes[0]
    top.legend(handles=top.get_legend_handles_labels()[0] + handles, fontsize=7, loc="upper right")
    if sampled:
        cpu.legend(fontsize=7, loc="upper right")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def legend(cause: Cause) -> str:
    """A cause's entry in the legend: its title and, where stacks named one, the line that
    took most of its time (``host sync: train.py:50``)."""
    if not cause.sites:
        return TITLES[cause.name]
    site = cause.sites[0]
    return f"{TITLES[cause.name]}: {shorten(f'{site.file}:{site.line}', 40)}"


def thread_label(rec: Recording) -> str:
    """What the job's busiest-thread series is: a thread of the processes on the GPU where the
    job was seen on one, else of the whole job (the sampler's rule)."""
    on_gpu = any(g.job_on_gpu or g.job_memory_bytes for tick in rec.ticks for g in tick.gpus)
    whose = "of the GPU processes" if on_gpu else "of the job"
    return f"busiest thread {whose} (running or runnable)"


def _gpu_panels(rec: Recording, gpus: tuple[int, ...], act: Any, clk: Any) -> None:

    samples = sorted(
        (t, v) for tick in rec.ticks for g in tick.gpus if g.index in gpus for t, v in g.samples
    )
    if samples:
        act.plot([s[0] for s in samples], [s[1] * 100 for s in samples], lw=0.8,
                 label="utilization (driver samples)")  # fmt: skip
    else:
        xs, ys = _series(rec, gpus, "utilization")
        act.plot(xs, [y * 100 for y in ys], lw=1, label="utilization")
    for attr, label in (("sm_activity", "SM activity"), ("tensor_activity", "tensor activity"),
                        ("dram_activity", "DRAM bandwidth"),
                        ("memory_utilization", "memory utilization (NVML)")):  # fmt: skip
        xs, ys = _series(rec, gpus, attr)
        if xs:
            act.step(xs, [y * 100 for y in ys], where="pre", lw=1, label=label)
    act.set_ylabel("GPU %")
    act.set_ylim(-2, 105)

    xs, ys = _series(rec, gpus, "sm_clock_hz")
    if xs:
        clk.step(xs, [y / 1e6 for y in ys], where="pre", color="tab:blue", label="SM clock")
    clk.set_ylabel("MHz")
    temp = clk.twinx()
    for attr, label, colour in (("temperature", "GPU °C", "tab:red"),
                                ("memory_temperature", "memory °C", "tab:orange")):  # fmt: skip
        xs, ys = _series(rec, gpus, attr)
        if xs:
            temp.plot(xs, ys, color=colour, lw=1, label=label)
    temp.set_ylabel("°C")
    twin_legend(clk, temp)


def _job_panels(rec: Recording, cpu: Any, io: Any) -> None:
    series = [("cpu_cores", "job CPU (cores)"), ("gpu_thread", thread_label(rec))]
    if any(g.job_on_gpu for tick in rec.ticks for g in tick.gpus):
        # the processes not on the GPU: only known where some are
        series.append(("other_cpu_cores", "processes not on the GPU (cores)"))
    for attr, label in series:
        xs, ys = _job(rec, attr)
        if xs:
            cpu.step(xs, ys, where="pre", lw=1, label=label)
    cpu.set_ylabel("cores")

    for attr, label in (("read_bps", "read"), ("write_bps", "written")):
        xs, ys = _job(rec, attr, 1e-6)
        if xs:
            io.step(xs, ys, where="pre", lw=1, label=f"{label} MB/s")
    io.set_ylabel("MB/s")
    psi = io.twinx()
    for attr, label, colour in (("memory_stall", "memory PSI %", "tab:pink"),
                                ("io_stall", "I/O PSI %", "tab:gray")):  # fmt: skip
        xs, ys = _host(rec, attr, 100.0)
        if xs:
            psi.plot(xs, ys, color=colour, lw=1, ls="--", label=label)
    psi.set_ylabel("PSI %")
    twin_legend(io, psi)
    io.set_xlabel("seconds since the start of the watch")


def _headline(diagnosis: Diagnosis, rec: Recording) -> str:
    from sparkdiag.watch.render import headline

    return headline(diagnosis, rec)
