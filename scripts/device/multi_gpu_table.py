"""The table scripts/device/multi_gpu.py prints last (and keeps as summary.txt): one entry per
thing it judged, what it saw, and whether that is what the issue expects; then the NVLink
figures per GPU."""

from __future__ import annotations

import textwrap
from typing import Any

WIDTH = 100
MARK = {True: "ok", False: "NO", None: "--"}


def table(summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    gpus = summary.get("gpus", [])
    names = sorted({str(g.get("name")) for g in gpus})
    counts = {k: sum(1 for r in rows if r["ok"] is k) for k in (True, False, None)}
    lines = [
        f"multi_gpu ({summary.get('mode')}): {len(gpus)} x {', '.join(names) or '?'}, "
        f"{summary.get('seconds', '?')} s of a {summary.get('budget', 0):.0f} s budget; "
        f"{counts[True]} as expected, {counts[False]} not, {counts[None]} not judged",
        "",
    ]
    for row in rows:
        head = f"[{MARK[row['ok']]:>2}] {row['step']:<10} {row['what']}"
        lines += textwrap.wrap(head, WIDTH, subsequent_indent=" " * 16)
        lines += textwrap.wrap(
            str(row["seen"]), WIDTH, initial_indent=" " * 16, subsequent_indent=" " * 16
        )
    nvlink = summary.get("nvlink", {}).get("rows", [])
    if nvlink:
        lines += [
            "",
            "NVLink payload between the reads (GB; nvidia-smi nvlink -gt d and the "
            "daemon's sparkdiag_gpu_nvlink_data_bytes_total)",
            f"{'gpu':>4} {'dir':>3} {'daemon':>10} {'nvidia-smi':>10} {'ratio':>7} {'of ring':>8}",
        ]
        for r in nvlink:
            lines.append(
                f"{r['gpu']:>4} {r['direction']:>3} {_gb(r['daemon_bytes']):>10} "
                f"{_gb(r['nvidia_smi_bytes']):>10} {_num(r['daemon_over_smi'], 4):>7} "
                f"{_num(r['over_expected'], 2):>8}"
            )
    return "\n".join(lines) + "\n"


def _gb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.3f}"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
