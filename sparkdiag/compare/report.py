"""The report of ``sparkdiag compare``: the terminal table, the failure text, the JSON document."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from sparkdiag import terminal
from sparkdiag.compare.causes import explain
from sparkdiag.compare.model import (
    IDENTITY_KEYS,
    SCHEMA,
    Comparison,
    Row,
    Side,
)


def to_dict(result: Comparison, max_gap: float) -> dict[str, Any]:
    """The --json document (schema sparkdiag-compare/1)."""
    worst = result.worst_row
    complete = not result.failures
    return {
        "schema": SCHEMA,
        "verdict": result.verdict(max_gap),
        "exit_code": result.exit_code(max_gap),
        "max_gap": max_gap,
        "worst_gap": result.worst_gap if complete else None,
        "worst": None if worst is None or not complete else worst.key,
        "diagnosis": explain(result, max_gap),
        "rounds": result.rounds,
        "warmup_rounds": result.warmup_rounds,
        "interrupted": result.interrupted,
        "worker_args": list(result.worker_args),
        "container_args": list(result.container_args),
        "native": side_dict(result.native),
        "container": side_dict(result.container),
        "differences": [
            {"component": d.component, "native": d.native, "container": d.container}
            for d in result.differences
        ],
        "rows": [row_dict(r, max_gap) for r in result.rows] if complete else [],
        "cycles": [
            {
                "label": c.label,
                "warmup": c.warmup,
                "round": c.round,
                "side": c.side,
                "result": c.result,
                "reason": c.reason,
                "returncode": c.returncode,
                "wall_seconds": c.wall_seconds,
                "figures": dict(c.figures),
            }
            for c in result.cycles
        ],
        "failures": [
            {
                "side": f.side,
                "kind": f.kind,
                "message": f.message,
                "detail": f.detail,
                "cycle": f.label,
                "stderr_tail": f.stderr_tail,
            }
            for f in result.failures
        ],
    }


def side_dict(side: Side) -> dict[str, Any]:
    return {
        "command": list(side.command),
        "software": dict(side.software),
        "conditions": dict(side.conditions),
    }


def row_dict(row: Row, max_gap: float) -> dict[str, Any]:
    return {
        "dtype": row.dtype,
        "shape": row.shape,
        "kind": row.kind,
        "beta": row.beta,
        "unit": row.unit,
        "native_median": row.native_median,
        "container_median": row.container_median,
        "ratio": row.ratio,
        "ratio_min": row.ratio_min,
        "ratio_max": row.ratio_max,
        "gap": row.gap,
        "verdict": row.verdict(max_gap),
        "noisy": row.noisy(max_gap),
        "native": list(row.native),
        "container": list(row.container),
        "native_status": row.native_status,
        "container_status": row.container_status,
        "note": row.note(),
    }


def _num(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f} %"


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)


def render(result: Comparison, max_gap: float, width: int | None = None) -> str:
    """The human report: figures, software identities, conditions, worst gap and why; within
    ``width`` columns (the terminal's by default)."""
    width = terminal.width() if width is None else width

    def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
        return terminal.table(header, rows, width, right=right)

    def para(text: str, indent: str = "", hanging: str = "    ") -> list[str]:
        return terminal.wrap(text, width, indent, hanging)

    out = [
        *para(
            f"sparkdiag compare: {result.rounds} measured round(s) after "
            f"{result.warmup_rounds} warm-up round(s), native and container alternately"
        ),
        *para(shlex.join(result.native.command), "native:    ", " " * 11),
        *para(f"{shlex.join(result.container.command)} -", "container: ", " " * 11),
        "",
    ]
    rows = []
    notes = []
    for row in result.rows:
        spread = (
            f"{row.ratio_min:.3f}-{row.ratio_max:.3f}"
            if row.ratio_min is not None and row.ratio_max is not None
            else "n/a"
        )
        verdict = row.verdict(max_gap)
        if verdict == "slower":
            verdict = "SLOWER"
        if row.noisy(max_gap):
            verdict += " (noisy)"
        kind = row.kind + (f" beta={row.beta}" if row.beta else "")
        rows.append(
            [
                row.dtype,
                row.shape,
                kind,
                row.unit,
                _num(row.native_median),
                _num(row.container_median),
                "n/a" if row.ratio is None else f"{row.ratio:.3f}",
                spread,
                _pct(row.gap),
                verdict,
            ]
        )
        note = row.note()
        if note:
            notes += para(note, f"  {row.key}: ")
    header = ["dtype", "shape", "kind", "unit", "native", "container", "ratio", "spread", "gap"]
    out += _table([*header, "verdict"], rows, right={4, 5, 6, 8})
    if notes:
        out += ["", "notes:", *notes]

    differing = {d.component for d in result.differences}
    ident_rows = []
    for key in IDENTITY_KEYS:
        a, b = result.native.software.get(key), result.container.software.get(key)
        same = key not in differing and a == b and a is not None
        ident_rows.append(
            [key, _shown(a), "same" if same else _shown(b), "*" if key in differing else ""]
        )
    out += [""]
    out += _table(["software", "native", "container", ""], ident_rows, right=set())
    if differing:
        libs = [d.component for d in result.library_differences]
        line = "differ (*): " + ", ".join(d.component for d in result.differences)
        if libs:
            line += f"; different libraries ({', '.join(libs)}) can explain a gap by themselves"
        out += para(line)
    else:
        out += para("same software on both sides: a gap comes from the environment")

    n_cond, c_cond = result.native.conditions, result.container.conditions
    if any(v is not None for v in (*n_cond.values(), *c_cond.values())):

        def clock(value: Any) -> str:
            return "-" if value is None else f"{float(value) / 1e6:.0f} MHz"

        def temp(value: Any) -> str:
            return "-" if value is None else f"{float(value):.0f} °C"

        cond_rows = [
            [
                "max GPU temperature",
                temp(n_cond.get("max_gpu_temperature_celsius")),
                temp(c_cond.get("max_gpu_temperature_celsius")),
            ],
            [
                "mean SM clock",
                clock(n_cond.get("mean_sm_clock_hertz")),
                clock(c_cond.get("mean_sm_clock_hertz")),
            ],
            [
                "clock event reasons",
                _shown(n_cond.get("clock_event_reasons")),
                _shown(c_cond.get("clock_event_reasons")),
            ],
        ]
        out += [""]
        out += _table(["conditions", "native", "container"], cond_rows, right=set())

    out.append("")
    worst = result.worst_row
    verdict = result.verdict(max_gap)
    if verdict in ("failed", "not-comparable") and worst is not None:
        what = "a kernel failed" if verdict == "failed" else "the sides ran on different GPUs"
        out += para(f"worst gap: {_pct(result.worst_gap)} ({worst.key}), not judged: {what}")
    elif worst is None:
        out += para("worst gap: n/a (no kernel measured on both sides)")
    elif verdict == "gap":
        out += para(
            f"worst gap: {_pct(result.worst_gap)} ({worst.key}) exceeds --max-gap "
            f"{max_gap * 100:g} %: the container is SLOWER"
        )
    else:
        out += para(
            f"worst gap: {_pct(result.worst_gap)} ({worst.key}) within --max-gap "
            f"{max_gap * 100:g} %: OK"
        )
    out += para(explain(result, max_gap), "why: ", "     ")
    return "\n".join(out)


def render_failure(result: Comparison, width: int | None = None) -> str:
    """What failed, where, why, and what to do; the last lines of that side's stderr (as it
    wrote them, each cut at 200 characters)."""
    width = terminal.width() if width is None else width
    out = []
    for failure in result.failures:
        out += terminal.wrap(
            f"sparkdiag compare: the {failure.side} side failed ({failure.label}): "
            f"{failure.message}",
            width,
            "",
            "    ",
        )
        command = result.container.command if failure.side == "container" else None
        command = command or result.native.command
        suffix = " -" if failure.side == "container" else ""
        out += terminal.wrap(f"{shlex.join(command)}{suffix}", width, "  command: ", " " * 11)
        if failure.detail:
            out += terminal.wrap(failure.detail, width, "  runner: ", " " * 10)
        tail = [line for line in failure.stderr_tail.splitlines() if line.strip()][-8:]
        if tail:
            out.append("  last lines of its standard error:")
            out += [f"    | {line[:200]}" for line in tail]
    out.append("exit status 3: no comparison was made")
    return "\n".join(out)
