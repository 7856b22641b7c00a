"""Render check results: a table for people, a JSON document for scripts, and the exit code."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import click

from sparkdiag import terminal
from sparkdiag.check.model import (
    SEE,
    STATUSES,
    CheckResult,
    Status,
    gpu_unchecked,
    run_exit_code,
    run_status,
)

SCHEMA = "sparkdiag-check/1"
COLOURS = {"pass": "green", "warn": "yellow", "fail": "red", "skip": "bright_black"}
HEADERS = ("STATUS", "CHECK", "GPU", "FINDING")
GAP = "  "
VERDICTS = {
    "pass": "fit to benchmark",
    "skip": "nothing judged: every check was skipped",
    "warn": "fit to benchmark with care: read the warnings",
    "fail": "not fit to benchmark: fix the failures first",
}


def summary(results: Sequence[CheckResult], duration: float) -> str:
    """The counts, the time taken and the verdict: ``12 pass, 2 warn, ... in 4.2 s: ...``."""
    counts = Counter(r.status for r in results)
    parts = ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES)
    status = run_status(results)
    if not gpu_unchecked(results):
        return f"{parts} in {duration:.1f} s: {VERDICTS[status]}"
    gpus = next(r for r in results if r.name == "gpus")
    why = f"see {gpus.data[SEE]}" if SEE in gpus.data else gpus.finding
    unchecked = f"no GPU was checked ({why})"
    if status == "skip":
        return f"{parts} in {duration:.1f} s: nothing judged: {unchecked}"
    return f"{parts} in {duration:.1f} s: {VERDICTS[status]}; {unchecked}"


def _style(text: str, status: Status, colour: bool) -> str:
    return click.style(text, fg=COLOURS[status], bold=status == "fail") if colour else text


def gpu_list(indices: Sequence[str]) -> str:
    """``["0", "1", "2", "5"]`` -> ``"0-2,5"``; non-numeric entries are listed as they are."""
    if not all(i.isdigit() for i in indices):
        return ",".join(indices)
    numbers = sorted(int(i) for i in indices)
    spans: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(spans)


def collapse(results: Sequence[CheckResult]) -> list[CheckResult]:
    """The rows skipped by reference to another row (``data["see"]``: the GPU rows of a machine
    without a GPU point at ``nvml``), as one row after the row they name: "20 GPU checks, not
    run without a GPU (see nvml): gpus, versions, idle, ...", instead of twenty rows that
    repeat the same reason. ``--json`` keeps every row."""
    names = {r.name for r in results}
    referring: dict[str, list[CheckResult]] = {}
    for r in results:
        ref = r.data.get(SEE)
        if r.status == "skip" and r.gpu is None and isinstance(ref, str) and ref in names:
            referring.setdefault(ref, []).append(r)
    referring = {ref: rows for ref, rows in referring.items() if len(rows) > 1}
    gathered = {id(r) for rows in referring.values() for r in rows}
    out: list[CheckResult] = []
    for r in results:
        if id(r) in gathered:
            continue
        out.append(r)
        rows = referring.get(r.name)
        if rows:
            listed = ", ".join(row.name for row in rows)
            out.append(
                CheckResult(
                    f"{len(rows)} GPU checks",
                    "skip",
                    f"not run without a GPU (see {r.name}): {listed}",
                )
            )
    return out


def merge(results: Sequence[CheckResult]) -> list[tuple[CheckResult, str]]:
    """Consecutive per-GPU results that say the same thing, as one row: (result, GPU column)."""
    rows: list[tuple[CheckResult, list[str]]] = []
    for result in results:
        if rows and result.gpu is not None:
            last, gpus = rows[-1]
            same = (last.name, last.status, last.finding, last.action)
            if last.gpu is not None and same == (
                result.name,
                result.status,
                result.finding,
                result.action,
            ):
                gpus.append(result.gpu)
                continue
        rows.append((result, [] if result.gpu is None else [result.gpu]))
    return [(result, gpu_list(gpus) if gpus else "-") for result, gpus in rows]


def table(
    results: Sequence[CheckResult], duration: float, colour: bool = False, width: int | None = None
) -> str:
    """The results as an aligned table within ``width`` columns (the terminal's by default):
    each finding wraps under itself, each action on its own lines under its finding; per-GPU
    rows that say the same thing on several GPUs are shown once (GPU column "0-7")."""
    width = terminal.width() if width is None else width
    merged = merge(collapse(results))
    rows = [(r.status.upper(), r.name, gpus, r.finding) for r, gpus in merged]
    widths = [max(len(HEADERS[i]), *(len(row[i]) for row in rows)) for i in range(3)]
    indent = sum(widths) + len(GAP) * 3
    # too narrow for a finding column: each finding goes on its own lines under its row, all of
    # it (found in a review: its first word stayed after the row, past the terminal's edge)
    under = width - indent < terminal.MIN_TEXT
    if under:
        indent = 4
    lines = [
        GAP.join(h.ljust(w) for h, w in zip(HEADERS[:3], widths, strict=True)) + GAP + HEADERS[3]
    ]
    for (result, _), row in zip(merged, rows, strict=True):
        status = _style(row[0].ljust(widths[0]), result.status, colour)
        cells = [status, row[1].ljust(widths[1]), row[2].ljust(widths[2]), ""]
        if under:
            lines.append(GAP.join([*cells[:2], row[2]]))
            lines += terminal.wrap(row[3], width, " " * indent)
        else:
            lines += terminal.hang(GAP.join(cells), row[3], width, indent)
        if result.action and result.status != "pass":
            lines += terminal.wrap(result.action, width, " " * indent + "→ ")
    lines.append("")
    lines += terminal.wrap(summary(results, duration), width)
    return "\n".join(lines) + "\n"


def document(results: Sequence[CheckResult], duration: float, quick: bool) -> dict[str, Any]:
    """The JSON document (schema ``sparkdiag-check/1``): ``status`` is the run's
    (:func:`run_status`: ``skip`` when nothing was judged, as on a machine without a GPU),
    ``judged`` false then; every row is listed, those skipped by reference with ``data.see``."""
    status = run_status(results)
    counts = Counter(r.status for r in results)
    return {
        "schema": SCHEMA,
        "status": status,
        "judged": status != "skip",
        "exit_code": run_exit_code(results),
        "duration_seconds": round(duration, 3),
        "quick": quick,
        "counts": {s: counts.get(s, 0) for s in STATUSES},
        "checks": [r.as_json() for r in results],
    }


def render_json(results: Sequence[CheckResult], duration: float, quick: bool) -> str:
    return json.dumps(document(results, duration, quick), indent=2, default=str) + "\n"
