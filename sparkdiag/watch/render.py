"""The diagnosis as text for a terminal, and as JSON for scripts (``--json``)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from sparkdiag import terminal
from sparkdiag.watch.causes import TITLES, meaning
from sparkdiag.watch.diagnose import MIN_WINDOW_SECONDS, MIN_WINDOW_TICKS, Diagnosis
from sparkdiag.watch.findings import REPORT_MIN
from sparkdiag.watch.model import Recording, Tick

JSON_SCHEMA = "sparkdiag-watch/1"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.0f} %"


def status(tick: Tick, ticks: int) -> str:
    """The live status line while watching: time watched, ticks, each GPU's utilization and
    whether the job is on it, the job's CPU: ``watching 12 s, 24 samples · GPU 0 87 % busy, the
    job on it · job CPU 1.3 cores``."""
    parts = [f"watching {tick.t:.0f} s, {ticks} sample{'s' if ticks != 1 else ''}"]
    for g in tick.gpus:
        on = "the job on it" if g.job_on_gpu or g.job_memory_bytes else "the job not on it"
        parts.append(f"GPU {g.index} {_pct(g.utilization)} busy, {on}")
    if not tick.gpus:
        parts.append("no GPU sampled")
    if tick.job.cpu_cores is not None:
        parts.append(f"job CPU {tick.job.cpu_cores:.1f} cores")
    return " · ".join(parts)


def headline(diagnosis: Diagnosis, rec: Recording | None = None) -> str:
    """The diagnosis in one line; with the recording, a watch without a GPU that could not read
    memory pressure either says that nothing was assessed."""
    if diagnosis.verdict == "healthy" and (diagnosis.unattributed or 0.0) >= REPORT_MIN:
        return (
            f"no cause found, but {_pct(diagnosis.unattributed)} of the time the GPU would "
            "otherwise have worked was lost and not attributed"
        )
    if diagnosis.verdict == "healthy":
        return "healthy: no cause of lost GPU time found"
    if diagnosis.verdict == "too-short":
        start, end = diagnosis.window
        return (
            f"too short to diagnose: the job was active on the GPU for {end - start:.1f} s; "
            f"at least {MIN_WINDOW_SECONDS:g} s and {MIN_WINDOW_TICKS} ticks are needed"
        )
    if diagnosis.verdict == "gpu-unused":
        if diagnosis.causes:
            return "the job never touched its GPU: only the host was assessed (below)"
        return "the job never touched its GPU: nothing to diagnose"
    if diagnosis.verdict == "no-gpu":
        if rec is not None and all(t.host.memory_stall is None for t in rec.ticks):
            if not rec.stacks:
                return "no GPU sampled and no memory pressure (PSI) read: nothing could be assessed"
            return "no GPU sampled, no memory pressure (PSI) read: no wait of ranks found either"
        return "no GPU sampled: only memory pressure and ranks' waits were assessed, none found"
    first = diagnosis.causes[0]
    return f"{TITLES[first.name]} ({_pct(first.share)} {meaning(first.name, first.lost)})"


def text(rec: Recording, diagnosis: Diagnosis, width: int | None = None) -> str:
    """A report of a few lines per cause: the share lost, the evidence, what to try; within
    ``width`` columns (the terminal's by default)."""
    width = terminal.width() if width is None else width

    def _wrap(text: str, indent: str) -> list[str]:
        return terminal.wrap(text, width, indent)

    gpus = ", ".join(f"GPU {g.index} ({g.name})" for g in rec.gpus if g.index in diagnosis.gpus)
    where = f" on {gpus}" if gpus else ", no GPU sampled" if not rec.gpus else ""
    exit_status = "" if rec.exit_status is None else f", exit status {rec.exit_status}"
    duration = rec.ticks[-1].t if rec.ticks else 0.0
    lines = terminal.wrap(
        f"sparkdiag watch: {rec.job}{exit_status}; watched {duration:.1f} s ({rec.ended_by})"
        f"{where}",
        width, "", "    ",
    )  # fmt: skip
    start, end = diagnosis.window
    if diagnosis.gpu_busy is not None:
        tensor = (
            "" if diagnosis.tensor_activity is None
            else f", tensor pipes {_pct(diagnosis.tensor_activity)} when busy"
        )  # fmt: skip
        lines += _wrap(
            f"active window {start:.1f}-{end:.1f} s: GPU busy {_pct(diagnosis.gpu_busy)}{tensor}",
            "",
        )
        if rec.stack_sampler:  # what the lines named come from (no GPU: nothing to name)
            lines += _wrap(f"Python stacks: {rec.stack_sampler}", "")
    lines += ["", *terminal.wrap(f"diagnosis: {headline(diagnosis, rec)}", width, "", "  ")]
    for cause in diagnosis.causes:
        lines.append("")
        lines += _wrap(
            meaning(cause.name, cause.lost), f"  {TITLES[cause.name]:<26} {_pct(cause.share):>6} "
        )
        for item in cause.evidence:
            lines += _wrap(item, "    - ")
        for action in cause.actions:
            lines += _wrap(action, "    try: ")
    for action in diagnosis.healthy_actions:
        lines += _wrap(action, "  ")
    if diagnosis.notes:
        lines += ["", "notes:"]
        for note in diagnosis.notes:
            lines += _wrap(note, "  - ")
    if diagnosis.skipped:
        lines += ["", "not assessed here:"]
        for item in diagnosis.skipped:
            lines += _wrap(item, "  - ")
    return "\n".join(lines) + "\n"


def document(rec: Recording, diagnosis: Diagnosis) -> dict[str, Any]:
    """The JSON document: the job, how the watch ended, the GPUs watched, how the job's stacks
    were sampled ("" when they were not), and the diagnosis (``diagnosed_gpus``: the indices of
    those the job ran on; each cause with the ``sites`` and top ``stacks`` of the job's code
    that took its time, and a co-tenant's ``tenants``)."""
    found = asdict(diagnosis)
    found["diagnosed_gpus"] = found.pop("gpus")
    return {
        "schema": JSON_SCHEMA,
        "job": rec.job,
        "exit_status": rec.exit_status,
        "ended_by": rec.ended_by,
        "duration_seconds": rec.ticks[-1].t if rec.ticks else 0.0,
        "interval_seconds": rec.interval,
        "ticks": len(rec.ticks),
        "stack_sampler": rec.stack_sampler,
        "gpus": [asdict(g) for g in rec.gpus],
        "headline": headline(diagnosis, rec),
        **found,
    }


def to_json(rec: Recording, diagnosis: Diagnosis) -> str:
    return json.dumps(document(rec, diagnosis), indent=1) + "\n"
